//! Drops: the queue, admission, passes, and what a drop's product refuses without one.
//! `gate.rs` what needs a pass and who holds one, `queue.rs` places, pacing and fairness
//! across servers and faults, `admin.rs` the admin's drops; the shared setup is here.

mod admin;
mod gate;
mod queue;

use std::collections::HashMap;
use std::time::Duration;

use chrono::Utc;
use serde_json::Value;
use stockade::clients::{self, Limit};
use stockade::drops::{self, Drop, NewDrop, Queueing};
use uuid::Uuid;

use crate::helpers::{
    TestApp, serve_app, spawn_app, spawn_app_with, spawn_app_with_own_redis, test_settings,
};

/// A drop of `sku` opening `opens_in` from now, joinable `prequeue` before, binding the
/// product by the time this returns.
async fn schedule(
    app: &TestApp,
    sku: &str,
    opens_in: Duration,
    prequeue: Duration,
    queueing: Queueing,
    per_minute: i32,
    max_active: Option<i32>,
) -> Drop {
    let new = NewDrop {
        sku: sku.into(),
        opens_at: Utc::now() + chrono::Duration::from_std(opens_in).unwrap(),
        prequeue_seconds: prequeue.as_secs() as i32,
        queueing,
        admit_per_minute: per_minute,
        max_active,
        session_seconds: 120,
    };
    let drop = drops::db::create(&app.db, &new).await.unwrap();
    let binds_in = (drop.binds_at - Utc::now()).to_std().unwrap_or_default();
    tokio::time::sleep(binds_in + Duration::from_millis(50)).await;
    drop
}

/// `sku`, 5 units, sold in a first-come drop (100 let in a second) opening in 4 s, its
/// queue open for a minute before.
async fn sold_in_a_drop_soon(app: &TestApp, sku: &str) -> Drop {
    app.add_product(sku, sku, 1000, 5).await;
    let (opens_in, prequeue) = (Duration::from_secs(4), Duration::from_secs(60));
    schedule(app, sku, opens_in, prequeue, Queueing::Fifo, 6000, None).await
}

async fn sleep_until(at: chrono::DateTime<Utc>) {
    if let Ok(left) = (at - Utc::now()).to_std() {
        tokio::time::sleep(left + Duration::from_millis(50)).await;
    }
}

/// An API client's key (`unlimited`: one acting for many buyers).
async fn key(app: &TestApp, unlimited: bool) -> String {
    client(app, unlimited).await.1
}

/// An API client's id and key.
async fn client(app: &TestApp, unlimited: bool) -> (i64, String) {
    let limit = if unlimited {
        Limit::Unlimited
    } else {
        Limit::Default
    };
    let (row, key) = clients::create(&app.db, &format!("c-{}", Uuid::new_v4().simple()), limit)
        .await
        .unwrap();
    (row.id, key)
}

/// Who is asking: a key, and for a client acting for many buyers, the buyer.
#[derive(Clone)]
struct Buyer {
    key: String,
    shopper: Option<String>,
}

impl Buyer {
    fn request(&self, rb: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        let rb = rb.bearer_auth(&self.key);
        match &self.shopper {
            Some(s) => rb.header("Drop-Shopper", s),
            None => rb,
        }
    }

    async fn join(&self, base: &str, drop: Uuid) -> (u16, Value) {
        let res = self
            .request(helpers_client().post(format!("{base}/api/v1/drops/{drop}/queue")))
            .send()
            .await
            .unwrap();
        (res.status().as_u16(), res.json().await.unwrap())
    }

    async fn poll(&self, base: &str, drop: Uuid, ticket: &str) -> (u16, Value) {
        let res = self
            .request(helpers_client().get(format!("{base}/api/v1/drops/{drop}/queue/{ticket}")))
            .send()
            .await
            .unwrap();
        (res.status().as_u16(), res.json().await.unwrap())
    }

    /// Polls until admitted (or `within` passes); the pass.
    async fn wait_for_pass(
        &self,
        base: &str,
        drop: Uuid,
        ticket: &str,
        within: Duration,
    ) -> String {
        let until = std::time::Instant::now() + within;
        loop {
            let (status, body) = self.poll(base, drop, ticket).await;
            assert_eq!(status, 200, "{body}");
            if body["state"] == "admitted" {
                return body["pass"].as_str().unwrap().to_string();
            }
            assert!(
                std::time::Instant::now() < until,
                "not admitted in time: {body}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn place(&self, base: &str, what: &str, sku: &str, pass: Option<&str>) -> (u16, Value) {
        let mut rb = self
            .request(helpers_client().post(format!("{base}/api/v1/{what}")))
            .header("Idempotency-Key", Uuid::new_v4().to_string())
            .json(&serde_json::json!({"lines": [{"sku": sku, "quantity": 1}]}));
        if let Some(pass) = pass {
            rb = rb.header("Drop-Pass", pass);
        }
        let res = rb.send().await.unwrap();
        (
            res.status().as_u16(),
            res.json().await.unwrap_or(Value::Null),
        )
    }
}

/// One client for every request of these tests (building one costs milliseconds).
fn helpers_client() -> reqwest::Client {
    static CLIENT: std::sync::LazyLock<reqwest::Client> =
        std::sync::LazyLock::new(crate::helpers::client);
    CLIENT.clone()
}

/// I8's verdict on `app`'s database.
async fn i8(app: &TestApp) -> stockade::loadtest::check::Verdict {
    let verdicts = stockade::loadtest::check::check(&app.db, None, None, Duration::from_secs(60))
        .await
        .unwrap();
    verdicts
        .into_iter()
        .find(|v| v.id == "I8")
        .expect("I8 is checked")
}
