//! A drop's queue across a Redis failover: shoppers joined before the Redis master dies
//! keep their places, are let in once each after Sentinel promotes the replica, and buy
//! with their passes; no answer on the way is anything but the queue's own or a 503.

use std::time::{Duration, Instant};

use chrono::Utc;
use sqlx::PgPool;
use stockade::cluster::Cluster;
use stockade::drops::{self, NewDrop, Queueing};

pub const SKU: &str = "DROP-HA";
pub const SHOPPERS: usize = 40;

/// A drop's shoppers, each with its ticket.
pub struct Queued {
    pub drop: drops::Drop,
    key: String,
    tickets: Vec<String>,
}

fn client() -> reqwest::Client {
    stockade::install_tls_provider();
    reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

/// A first-come drop of `SKU` (one unit per shopper, ten let in a second) and [`SHOPPERS`]
/// shoppers in its queue, joined through HAProxy (one unlimited client naming each); the
/// drop opens `opens_in` after the last has joined (it is moved there once they have: on
/// a busy machine the joins alone can take longer than `opens_in`, and a drop that opened
/// meanwhile would let the first ones in before the last had their places).
pub async fn queue(cluster: &Cluster, primary: &PgPool, opens_in: Duration) -> Queued {
    let mut tx = primary.begin().await.unwrap();
    sqlx::query(
        "insert into products (sku, name, price_cents) values ($1, 'Drop: HA Edition', 5000)",
    )
    .bind(SKU)
    .execute(&mut *tx)
    .await
    .unwrap();
    let sku = stockade::catalog::Sku::parse(SKU).unwrap();
    stockade::inventory::db::create_stock(&mut tx, &sku, SHOPPERS as i32, "test")
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let drop = drops::db::create(
        primary,
        &NewDrop {
            sku: SKU.into(),
            opens_at: Utc::now() + chrono::Duration::minutes(5),
            prequeue_seconds: 600,
            queueing: Queueing::Fifo,
            admit_per_minute: 600,
            max_active: None,
            session_seconds: 600,
        },
    )
    .await
    .unwrap();
    let (_, key) = stockade::clients::create(
        primary,
        "drop shoppers",
        stockade::clients::Limit::Unlimited,
    )
    .await
    .unwrap();
    let mut tickets = Vec::new();
    for i in 0..SHOPPERS {
        let res = client()
            .post(format!("{}/api/v1/drops/{}/queue", cluster.url(), drop.id))
            .bearer_auth(&key)
            .header("Drop-Shopper", format!("s{i}"))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status().as_u16(), 201);
        let body: serde_json::Value = res.json().await.unwrap();
        assert_eq!(body["position"], i + 1, "{body}");
        tickets.push(body["ticket"].as_str().unwrap().to_string());
    }
    let drop = sqlx::query_scalar::<_, chrono::DateTime<Utc>>(
        "update drops set opens_at = now() + $2 where id = $1 returning opens_at",
    )
    .bind(drop.id)
    .bind(opens_in)
    .fetch_one(primary)
    .await
    .map(|opens_at| drops::Drop { opens_at, ..drop })
    .unwrap();
    Queued { drop, key, tickets }
}

impl Queued {
    /// Polls every ticket through HAProxy (`shop`) until each is let in (within `within`), through
    /// whatever happens to Redis meanwhile; each shopper's pass. Every answer must be the
    /// ticket's (200) or "the queue cannot be reached" (503): never an unknown ticket, never
    /// a 500.
    pub async fn wait_for_passes(&self, shop: &str, within: Duration) -> Vec<String> {
        let deadline = Instant::now() + within;
        let mut passes: Vec<Option<String>> = vec![None; self.tickets.len()];
        let mut unavailable = 0;
        while passes.iter().any(Option::is_none) {
            assert!(
                Instant::now() < deadline,
                "{} of {} let in within {within:?}",
                passes.iter().flatten().count(),
                passes.len()
            );
            for (i, ticket) in self.tickets.iter().enumerate() {
                if passes[i].is_some() {
                    continue;
                }
                let url = format!("{shop}/api/v1/drops/{}/queue/{ticket}", self.drop.id);
                let Ok(res) = client()
                    .get(url)
                    .bearer_auth(&self.key)
                    .header("Drop-Shopper", format!("s{i}"))
                    .send()
                    .await
                else {
                    continue;
                };
                let status = res.status().as_u16();
                let body: serde_json::Value = res.json().await.unwrap_or_default();
                match status {
                    200 => {
                        assert_eq!(body["ticket"], ticket.as_str(), "{body}");
                        passes[i] = body["pass"].as_str().map(str::to_string);
                    }
                    503 => unavailable += 1,
                    _ => panic!("shopper s{i}: {status} {body}"),
                }
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        eprintln!(
            "drop across the failover: every shopper let in; {unavailable} polls answered 503"
        );
        passes.into_iter().flatten().collect()
    }

    /// Each shopper orders one unit with their pass: every unit sells, each to one of them;
    /// each was let in under their one ticket, once.
    pub async fn buy_and_check(&self, cluster: &Cluster, primary: &PgPool, passes: &[String]) {
        for (i, pass) in passes.iter().enumerate() {
            let res = client()
                .post(format!("{}/api/v1/orders", cluster.url()))
                .bearer_auth(&self.key)
                .header("Drop-Shopper", format!("s{i}"))
                .header("Drop-Pass", pass)
                .header("Idempotency-Key", format!("drop-ha-{i}"))
                .json(&serde_json::json!({"lines": [{"sku": SKU, "quantity": 1}]}))
                .send()
                .await
                .unwrap();
            assert_eq!(res.status().as_u16(), 201, "shopper s{i}");
        }
        let admitted: Vec<(String, String)> =
            sqlx::query_as("select identity, ticket::text from drop_admissions where drop_id = $1")
                .bind(self.drop.id)
                .fetch_all(primary)
                .await
                .unwrap();
        assert_eq!(admitted.len(), SHOPPERS, "one admission each: {admitted:?}");
        for (identity, ticket) in &admitted {
            let i: usize = identity.rsplit("/s").next().unwrap().parse().unwrap();
            assert_eq!(
                ticket, &self.tickets[i],
                "{identity} let in under its own ticket"
            );
        }
        let verdicts =
            stockade::loadtest::check::check(primary, None, None, Duration::from_secs(60))
                .await
                .unwrap();
        let i8 = verdicts.iter().find(|v| v.id == "I8").expect("I8 checked");
        assert!(i8.pass, "{i8:?}");
    }
}
