//! Drops: the queue, admission, passes, and what a drop's product refuses without one.

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

#[tokio::test]
async fn a_drops_product_refuses_holds_and_orders_without_a_valid_pass_and_sells_with_one() {
    let app = spawn_app().await;
    app.add_product("DROP-A", "Drop A", 1000, 20).await;
    app.add_product("PLAIN-A", "Plain A", 1000, 20).await;
    let drop = schedule(
        &app,
        "DROP-A",
        Duration::from_secs(6),
        Duration::from_secs(60),
        Queueing::Fifo,
        6000,
        None,
    )
    .await;
    let (ada_id, ada_key) = client(&app, false).await;
    let ada = Buyer {
        key: ada_key,
        shopper: None,
    };
    let bob = Buyer {
        key: key(&app, false).await,
        shopper: None,
    };
    let base = &app.address;

    // Bound: no hold or order of the drop's product without a pass; other products sell.
    for what in ["orders", "holds"] {
        let (status, body) = ada.place(base, what, "DROP-A", None).await;
        assert_eq!(status, 403, "{body}");
        assert_eq!(body["queue"], format!("/api/v1/drops/{}/queue", drop.id));
        assert!(
            body["detail"].as_str().unwrap().contains("sold in a drop"),
            "{body}"
        );
    }
    assert_eq!(ada.place(base, "orders", "PLAIN-A", None).await.0, 201);
    // A cart with both products is refused whole.
    let cart = ada
        .request(helpers_client().post(format!("{base}/api/v1/orders")))
        .header("Idempotency-Key", Uuid::new_v4().to_string())
        .json(&serde_json::json!({"lines": [{"sku": "PLAIN-A", "quantity": 1}, {"sku": "DROP-A", "quantity": 1}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(cart.status(), 403);

    // Joining (in the pre-queue) gives a ticket; joining again, the same one.
    let (status, joined) = ada.join(base, drop.id).await;
    assert_eq!(status, 201, "{joined}");
    assert_eq!(joined["state"], "waiting");
    assert_eq!(joined["position"], 1);
    let ticket = joined["ticket"].as_str().unwrap().to_string();
    assert_eq!(ada.join(base, drop.id).await.1["ticket"], ticket.as_str());
    // Bob cannot read Ada's ticket.
    assert_eq!(bob.poll(base, drop.id, &ticket).await.0, 404);

    let pass = ada
        .wait_for_pass(base, drop.id, &ticket, Duration::from_secs(10))
        .await;
    // Another client's request with Ada's pass, a forged pass, a pass for another drop:
    // refused, and nothing changes.
    let before = app.stock("DROP-A").await;
    assert_eq!(
        bob.place(base, "orders", "DROP-A", Some(&pass)).await.0,
        403
    );
    // (Its last hex digit changed: to 1 if it was 0, else to 0.)
    let last = if pass.ends_with('0') { '1' } else { '0' };
    let forged = format!("{}{last}", &pass[..pass.len() - 1]);
    assert_eq!(
        ada.place(base, "orders", "DROP-A", Some(&forged)).await.0,
        403
    );
    // A pass signed with the drop's own key but expired (the test reads the key).
    let expired = drops::pass::sign(
        &drop.secret,
        drop.id,
        Uuid::parse_str(&ticket).unwrap(),
        Utc::now() - chrono::Duration::seconds(1),
        &ada_id.to_string(),
    );
    let (status, body) = ada.place(base, "orders", "DROP-A", Some(&expired)).await;
    assert_eq!(status, 403);
    assert!(
        body["detail"].as_str().unwrap().contains("expired"),
        "{body}"
    );
    assert_eq!(app.stock("DROP-A").await, before);

    // With the pass: an order and a hold.
    let (status, order) = ada.place(base, "orders", "DROP-A", Some(&pass)).await;
    assert_eq!(status, 201, "{order}");
    assert_eq!(ada.place(base, "holds", "DROP-A", Some(&pass)).await.0, 201);
    assert_eq!(app.stock("DROP-A").await, (19, 1));

    let admitted = app.count("select count(*) from drop_admissions").await;
    assert_eq!(admitted, 1);
    let verdict = i8(&app).await;
    assert!(verdict.pass, "{:?}", verdict.rows);
    // I8 can fail: an order of the product by a key owner nobody admitted.
    sqlx::query("insert into orders (id, total_cents, idempotency_scope, idempotency_key) values ($1, 1000, 'api', 'stranger:k')")
        .bind(Uuid::new_v4())
        .execute(&app.db)
        .await
        .unwrap();
    sqlx::query("insert into order_lines (order_id, sku, quantity, unit_price_cents) select id, 'DROP-A', 1, 1000 from orders where idempotency_key = 'stranger:k'")
        .execute(&app.db)
        .await
        .unwrap();
    let verdict = i8(&app).await;
    assert!(!verdict.pass);
    assert!(verdict.rows[0].contains("stranger"), "{:?}", verdict.rows);
}

#[tokio::test]
async fn before_the_pre_queue_joining_is_refused_with_the_time_it_opens_and_nothing_sells_before_the_opening()
 {
    let app = spawn_app().await;
    app.add_product("DROP-B", "Drop B", 1000, 5).await;
    let drop = schedule(
        &app,
        "DROP-B",
        Duration::from_secs(3600),
        Duration::from_secs(600),
        Queueing::Fifo,
        60,
        None,
    )
    .await;
    let ada = Buyer {
        key: key(&app, false).await,
        shopper: None,
    };
    let (status, body) = ada.join(&app.address, drop.id).await;
    assert_eq!(status, 409, "{body}");
    assert!(
        body["detail"].as_str().unwrap().contains("opens at"),
        "{body}"
    );
    assert!(body["queue_opens_at"].is_string(), "{body}");
    // Unknown drops and tickets are 404s in words.
    let (status, body) = ada.join(&app.address, Uuid::new_v4()).await;
    assert_eq!(status, 404, "{body}");
    let (status, _) = ada.poll(&app.address, drop.id, "not-a-ticket").await;
    assert_eq!(status, 404);
    // Anonymous callers may not join (they share one identity).
    let res = helpers_client()
        .post(app.url(&format!("/api/v1/drops/{}/queue", drop.id)))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 401);
    // A limited client may not act for several buyers.
    let (status, body) = Buyer {
        key: ada.key.clone(),
        shopper: Some("x".into()),
    }
    .join(&app.address, drop.id)
    .await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(app.count("select count(*) from drop_admissions").await, 0);
}

/// The admission times of drop `id`'s tickets, from Redis: ticket → ms.
async fn admitted_at(app: &TestApp, id: Uuid) -> HashMap<String, i64> {
    let mut redis = app.redis().await;
    let key = format!("{}drop:{}:admt", app.settings.redis_prefix, id.simple());
    let pairs: Vec<(String, f64)> = redis::cmd("ZRANGE")
        .arg(&key)
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query_async(&mut redis)
        .await
        .unwrap();
    pairs.into_iter().map(|(t, s)| (t, s as i64)).collect()
}

#[tokio::test]
async fn two_servers_admit_one_queue_in_arrival_order_at_the_drops_rate_without_admitting_anyone_twice()
 {
    let app = spawn_app().await;
    let other = serve_app(&app, &[], &[]).await;
    app.add_product("DROP-C", "Drop C", 1000, 1000).await;
    // 1,200 a minute: 20 a second.
    let drop = schedule(
        &app,
        "DROP-C",
        Duration::from_secs(10),
        Duration::from_secs(60),
        Queueing::Fifo,
        1200,
        None,
    )
    .await;
    let key = key(&app, true).await;
    let bases = [app.address.clone(), other.address.clone()];
    let buyers: Vec<Buyer> = (0..60)
        .map(|i| Buyer {
            key: key.clone(),
            shopper: Some(format!("s{i}")),
        })
        .collect();
    // Joined one after another, through both servers in turn: the arrival order is known.
    let mut tickets = Vec::new();
    for (i, b) in buyers.iter().enumerate() {
        let (status, body) = b.join(&bases[i % 2], drop.id).await;
        assert_eq!(status, 201, "{body}");
        assert_eq!(body["position"], i as u64 + 1, "{body}");
        tickets.push(body["ticket"].as_str().unwrap().to_string());
    }
    sleep_until(drop.opens_at).await;
    // Every shopper polls through both servers until let in.
    let mut passes = Vec::new();
    let polls = buyers.iter().zip(&tickets).enumerate().map(|(i, (b, t))| {
        let base = bases[(i + 1) % 2].clone();
        async move {
            b.wait_for_pass(&base, drop.id, t, Duration::from_secs(30))
                .await
        }
    });
    passes.extend(futures_util::future::join_all(polls).await);
    assert_eq!(passes.len(), 60);

    let at = admitted_at(&app, drop.id).await;
    assert_eq!(at.len(), 60, "each ticket admitted once");
    let times: Vec<i64> = tickets.iter().map(|t| at[t]).collect();
    // FIFO: admission times never go backwards along the arrival order.
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "{times:?}");
    // The rate: by any moment, at most 20/s since the opening (plus one token).
    let opens = drop.opens_at.timestamp_millis();
    for (n, t) in times.iter().enumerate() {
        let allowed = ((t - opens) as f64 / 1000.0 * 20.0).floor() as usize + 1;
        assert!(
            n < allowed,
            "admission {} at +{} ms: the rate allows {allowed}",
            n + 1,
            t - opens
        );
    }
    // And it did not dawdle: 60 at 20/s take about 3 s.
    let span = times.last().unwrap() - opens;
    assert!(span < 6_000, "60 admissions took {span} ms");
    // Each shopper's pass buys through either server.
    for (i, (b, pass)) in buyers.iter().zip(&passes).enumerate() {
        let (status, body) = b.place(&bases[i % 2], "orders", "DROP-C", Some(pass)).await;
        assert_eq!(status, 201, "{body}");
    }
    assert!(i8(&app).await.pass);
}

/// Kendall's τ between the position sequences `a` and `b` of the same items.
fn kendall(a: &[usize], b: &[usize]) -> f64 {
    let n = a.len();
    let mut concordant = 0i64;
    for i in 0..n {
        for j in i + 1..n {
            let s = (a[i] as i64 - a[j] as i64).signum() * (b[i] as i64 - b[j] as i64).signum();
            concordant += s;
        }
    }
    concordant as f64 / (n * (n - 1) / 2) as f64
}

#[tokio::test]
async fn a_lottery_places_the_pre_queue_independently_of_when_each_joined_and_later_arrivals_behind_in_order()
 {
    let app = spawn_app().await;
    app.add_product("DROP-D", "Drop D", 1000, 10).await;
    // One a minute: at the opening nobody is let in for a while, so every place shows.
    // It opens in an hour, for as long as the joins take; then sooner (below).
    let drop = schedule(
        &app,
        "DROP-D",
        Duration::from_secs(3600),
        Duration::from_secs(7200),
        Queueing::Lottery,
        1,
        None,
    )
    .await;
    let key = key(&app, true).await;
    let n = 1000;
    let buyers: Vec<Buyer> = (0..n + 5)
        .map(|i| Buyer {
            key: key.clone(),
            shopper: Some(format!("s{i}")),
        })
        .collect();
    // Joined eight at a time in index order: each joins within eight places of its index.
    use futures_util::StreamExt as _;
    let base = app.address.clone();
    let joined: Vec<(u16, Value)> = futures_util::stream::iter(&buyers[..n])
        .map(|b| b.join(&base, drop.id))
        .buffered(8)
        .collect()
        .await;
    let mut tickets = Vec::new();
    for (status, body) in joined {
        assert_eq!(status, 201, "{body}");
        // The draw is not shown before the opening.
        assert!(body["position"].is_null(), "{body}");
        tickets.push(body["ticket"].as_str().unwrap().to_string());
    }
    // The opening, brought forward: the servers read it again within a second.
    let opens_at: chrono::DateTime<Utc> = sqlx::query_scalar(
        "update drops set opens_at = now() + interval '1 second' where id = $1 returning opens_at",
    )
    .bind(drop.id)
    .fetch_one(&app.db)
    .await
    .unwrap();
    sleep_until(opens_at + chrono::Duration::seconds(1)).await;
    for b in &buyers[n..] {
        let (status, body) = b.join(&app.address, drop.id).await;
        assert_eq!(status, 201, "{body}");
        tickets.push(body["ticket"].as_str().unwrap().to_string());
    }
    let mut places = Vec::new();
    for (b, t) in buyers.iter().zip(&tickets) {
        let (status, body) = b.poll(&app.address, drop.id, t).await;
        assert_eq!(status, 200, "{body}");
        places.push(body["position"].as_u64().unwrap_or(0) as usize);
    }
    // Nobody let in yet (at one a minute, the first token needs a minute): places 1..=1005.
    let mut sorted = places.clone();
    sorted.sort();
    assert_eq!(sorted, (1..=n + 5).collect::<Vec<_>>());
    // Later arrivals: behind the whole pre-queue, in the order they came.
    assert_eq!(&places[n..], &(n + 1..=n + 5).collect::<Vec<_>>()[..]);
    // The pre-queue's places against its join order. For a random order Kendall's τ has a
    // standard deviation of about 0.021; |τ| > 0.15 is seven of them. An order kept by
    // join time (FIFO) gives τ = 1.
    let joined: Vec<usize> = (0..n).collect();
    let tau = kendall(&joined, &places[..n]);
    assert!(tau.abs() < 0.15, "Kendall τ = {tau}");
    // Deciles of join time against deciles of place: 10 × 10 cells of 10 expected; the
    // chi-square statistic (81 degrees of freedom) passes 185 with p < 1e-9 by chance.
    let mut cells = [[0f64; 10]; 10];
    for (i, p) in places[..n].iter().enumerate() {
        cells[i * 10 / n][(p - 1) * 10 / n] += 1.0;
    }
    let chi2: f64 = cells
        .iter()
        .flatten()
        .map(|o| (o - 10.0).powi(2) / 10.0)
        .sum();
    assert!(chi2 < 185.0, "chi-square {chi2}");
}

#[tokio::test]
async fn pausing_stops_admission_resuming_restarts_it_and_selling_out_closes_the_queue_with_its_events()
 {
    let app = spawn_app().await;
    app.add_product("DROP-E", "Drop E", 1000, 2).await;
    let drop = schedule(
        &app,
        "DROP-E",
        Duration::from_secs(6),
        Duration::from_secs(60),
        Queueing::Fifo,
        6000,
        None,
    )
    .await;
    let key = key(&app, true).await;
    let buyers: Vec<Buyer> = (0..4)
        .map(|i| Buyer {
            key: key.clone(),
            shopper: Some(format!("s{i}")),
        })
        .collect();
    let mut tickets = Vec::new();
    for b in &buyers {
        tickets.push(
            b.join(&app.address, drop.id).await.1["ticket"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    }
    // Paused before the opening: nobody is let in after it.
    assert!(
        drops::db::change(&app.db, drop.id, drops::db::Change::Pause, "test")
            .await
            .unwrap()
    );
    assert!(
        !drops::db::change(&app.db, drop.id, drops::db::Change::Pause, "test")
            .await
            .unwrap()
    );
    sleep_until(drop.opens_at + chrono::Duration::seconds(1)).await;
    let (_, body) = buyers[0].poll(&app.address, drop.id, &tickets[0]).await;
    assert_eq!(body["state"], "waiting", "{body}");
    assert_eq!(body["paused"], true, "{body}");
    assert_eq!(admitted_at(&app, drop.id).await.len(), 0);

    drops::db::change(&app.db, drop.id, drops::db::Change::Resume, "test")
        .await
        .unwrap();
    let mut passes = Vec::new();
    for (b, t) in buyers.iter().zip(&tickets).take(2) {
        passes.push(
            b.wait_for_pass(&app.address, drop.id, t, Duration::from_secs(10))
                .await,
        );
    }
    for (b, pass) in buyers.iter().zip(&passes) {
        assert_eq!(
            b.place(&app.address, "orders", "DROP-E", Some(pass))
                .await
                .0,
            201
        );
    }
    // Sold out: the drop ends by itself and everyone still waiting is told.
    let until = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (_, body) = buyers[3].poll(&app.address, drop.id, &tickets[3]).await;
        if body["state"] == "closed" {
            break;
        }
        assert!(std::time::Instant::now() < until, "still {body}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let status: String = sqlx::query_scalar("select status from drops where id = $1")
        .bind(drop.id)
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(status, "sold_out");
    let events: Vec<String> = sqlx::query_scalar(
        "select type from events where type like 'drop.%' and payload->>'drop_id' = $1 order by seq",
    )
    .bind(drop.id.to_string())
    .fetch_all(&app.db)
    .await
    .unwrap();
    assert_eq!(events, ["drop.opened", "drop.sold_out"]);
    // Resuming an ended drop is refused in words.
    let err = drops::db::change(&app.db, drop.id, drops::db::Change::Resume, "test")
        .await
        .unwrap_err();
    assert!(err.to_string().contains("has ended"), "{err}");
    app.assert_invariants().await;
}

#[tokio::test]
async fn with_redis_stopped_nobody_joins_or_is_let_in_while_passes_given_and_the_rest_of_the_shop_keep_selling()
 {
    let mut app = spawn_app_with_own_redis().await;
    app.add_product("DROP-F", "Drop F", 1000, 10).await;
    app.add_product("PLAIN-F", "Plain F", 1000, 10).await;
    let drop = schedule(
        &app,
        "DROP-F",
        Duration::from_secs(5),
        Duration::from_secs(60),
        Queueing::Fifo,
        6000,
        None,
    )
    .await;
    let key = key(&app, true).await;
    let ada = Buyer {
        key: key.clone(),
        shopper: Some("ada".into()),
    };
    let bob = Buyer {
        key: key.clone(),
        shopper: Some("bob".into()),
    };
    let ticket = ada.join(&app.address, drop.id).await.1["ticket"]
        .as_str()
        .unwrap()
        .to_string();
    let pass = ada
        .wait_for_pass(&app.address, drop.id, &ticket, Duration::from_secs(10))
        .await;

    app.stop_redis();
    let (status, body) = bob.join(&app.address, drop.id).await;
    assert_eq!(status, 503, "{body}");
    assert!(
        body["detail"]
            .as_str()
            .unwrap()
            .contains("nobody is let in"),
        "{body}"
    );
    assert_eq!(ada.poll(&app.address, drop.id, &ticket).await.0, 503);
    assert_eq!(
        ada.place(&app.address, "orders", "DROP-F", Some(&pass))
            .await
            .0,
        201
    );
    assert_eq!(
        bob.place(&app.address, "orders", "DROP-F", None).await.0,
        403
    );
    assert_eq!(
        bob.place(&app.address, "orders", "PLAIN-F", None).await.0,
        201
    );

    app.restart_redis().await;
    let until = std::time::Instant::now() + Duration::from_secs(10);
    let ticket = loop {
        let (status, body) = bob.join(&app.address, drop.id).await;
        if status == 201 {
            break body["ticket"].as_str().unwrap().to_string();
        }
        assert!(std::time::Instant::now() < until, "{status} {body}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let pass = bob
        .wait_for_pass(&app.address, drop.id, &ticket, Duration::from_secs(10))
        .await;
    assert_eq!(
        bob.place(&app.address, "orders", "DROP-F", Some(&pass))
            .await
            .0,
        201
    );
    assert!(i8(&app).await.pass);
}

#[tokio::test]
async fn one_address_takes_at_most_its_places_and_joining_twice_keeps_one() {
    let mut settings = test_settings().await;
    settings.drop_places_per_address = 3;
    let app = spawn_app_with(settings).await;
    app.add_product("DROP-G", "Drop G", 1000, 10).await;
    let drop = schedule(
        &app,
        "DROP-G",
        Duration::from_secs(60),
        Duration::from_secs(60),
        Queueing::Fifo,
        60,
        None,
    )
    .await;
    let key = key(&app, true).await;
    for i in 0..3 {
        let b = Buyer {
            key: key.clone(),
            shopper: Some(format!("s{i}")),
        };
        assert_eq!(b.join(&app.address, drop.id).await.0, 201);
        assert_eq!(
            b.join(&app.address, drop.id).await.0,
            201,
            "the same place again"
        );
    }
    let fourth = Buyer {
        key,
        shopper: Some("s3".into()),
    };
    let (status, body) = fourth.join(&app.address, drop.id).await;
    assert_eq!(status, 429, "{body}");
    assert!(
        body["detail"]
            .as_str()
            .unwrap()
            .contains("from your network"),
        "{body}"
    );
}

#[tokio::test]
async fn a_retried_order_is_answered_from_its_key_after_the_pass_is_gone_and_a_new_one_is_refused()
{
    let app = spawn_app().await;
    app.add_product("DROP-R", "Drop R", 1000, 5).await;
    let drop = schedule(
        &app,
        "DROP-R",
        Duration::from_secs(4),
        Duration::from_secs(60),
        Queueing::Fifo,
        6000,
        None,
    )
    .await;
    let buyer = Buyer {
        key: key(&app, true).await,
        shopper: Some("retrier".into()),
    };
    let (status, body) = buyer.join(&app.address, drop.id).await;
    assert_eq!(status, 201, "{body}");
    let ticket = body["ticket"].as_str().unwrap().to_string();
    sleep_until(drop.opens_at).await;
    let pass = buyer
        .wait_for_pass(&app.address, drop.id, &ticket, Duration::from_secs(10))
        .await;
    let order = |pass: Option<String>, key: &'static str| {
        let mut rb = buyer
            .request(helpers_client().post(format!("{}/api/v1/orders", app.address)))
            .header("Idempotency-Key", key)
            .json(&serde_json::json!({"lines": [{"sku": "DROP-R", "quantity": 1}]}));
        if let Some(pass) = pass {
            rb = rb.header("Drop-Pass", pass);
        }
        async move {
            let res = rb.send().await.unwrap();
            let replayed = res.headers().contains_key("idempotency-replayed");
            (
                res.status().as_u16(),
                replayed,
                res.json::<Value>().await.unwrap(),
            )
        }
    };
    let (status, _, first) = order(Some(pass), "k-1").await;
    assert_eq!(status, 201, "{first}");
    // The retry comes after the pass is gone (expired, or a client that lost it): the
    // key's record answers it, the same order, rather than a refusal contradicting it.
    let (status, replayed, again) = order(None, "k-1").await;
    assert_eq!((status, replayed), (201, true), "{again}");
    assert_eq!(again["id"], first["id"]);
    // A new key without a pass is still refused, and changes nothing.
    let (status, _, refused) = order(None, "k-2").await;
    assert_eq!(status, 403, "{refused}");
    assert_eq!(app.count("select count(*) from orders").await, 1);
    assert!(i8(&app).await.pass);
}

#[tokio::test]
async fn a_hold_placed_before_the_drop_bound_its_product_is_confirmed_only_with_a_pass_and_held_units_keep_the_queue_open()
 {
    let app = spawn_app().await;
    app.add_product("DROP-H", "Drop H", 1000, 1).await;
    let ada = Buyer {
        key: key(&app, true).await,
        shopper: Some("ada".into()),
    };
    // The last unit held before any drop: the hold is Ada's, placed without a pass.
    let (status, hold) = ada.place(&app.address, "holds", "DROP-H", None).await;
    assert_eq!(status, 201, "{hold}");
    let hold = hold["id"].as_str().unwrap().to_string();
    let drop = schedule(
        &app,
        "DROP-H",
        Duration::from_secs(4),
        Duration::from_secs(60),
        Queueing::Fifo,
        6000,
        None,
    )
    .await;
    let confirm = |pass: Option<String>| {
        let mut rb = ada
            .request(helpers_client().post(format!("{}/api/v1/holds/{hold}/confirm", app.address)));
        if let Some(pass) = pass {
            rb = rb.header("Drop-Pass", pass);
        }
        async move {
            let res = rb.send().await.unwrap();
            (res.status().as_u16(), res.json::<Value>().await.unwrap())
        }
    };
    // Bound: without a pass the hold does not become an order, and stays as it was.
    let (status, body) = confirm(None).await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(app.count("select count(*) from orders").await, 0);
    // Every unit held, none sold: the drop stays open after the opening (the held unit may
    // come back), and Ada queues for her pass.
    let (status, joined) = ada.join(&app.address, drop.id).await;
    assert_eq!(status, 201, "{joined}");
    sleep_until(drop.opens_at).await;
    let pass = ada
        .wait_for_pass(
            &app.address,
            drop.id,
            joined["ticket"].as_str().unwrap(),
            Duration::from_secs(10),
        )
        .await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    let status: String = sqlx::query_scalar("select status from drops where id = $1")
        .bind(drop.id)
        .fetch_one(&app.db)
        .await
        .unwrap();
    assert_eq!(
        status, "scheduled",
        "a drop whose units are held is not sold out"
    );
    let (status, order) = confirm(Some(pass)).await;
    assert_eq!(status, 201, "{order}");
    // Now every unit is sold: the queue closes.
    let closed = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let status: String = sqlx::query_scalar("select status from drops where id = $1")
            .bind(drop.id)
            .fetch_one(&app.db)
            .await
            .unwrap();
        if status == "sold_out" {
            break;
        }
        assert!(std::time::Instant::now() < closed, "still {status}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(i8(&app).await.pass);
}

#[tokio::test]
async fn a_shopper_let_in_again_under_a_new_ticket_after_redis_lost_the_first_keeps_one_admission()
{
    let app = spawn_app().await;
    app.add_product("DROP-L", "Drop L", 1000, 5).await;
    let drop = schedule(
        &app,
        "DROP-L",
        Duration::from_secs(4),
        Duration::from_secs(60),
        Queueing::Fifo,
        6000,
        None,
    )
    .await;
    let ada = Buyer {
        key: key(&app, true).await,
        shopper: Some("ada".into()),
    };
    let (_, first) = ada.join(&app.address, drop.id).await;
    let first = first["ticket"].as_str().unwrap().to_string();
    sleep_until(drop.opens_at).await;
    let pass = ada
        .wait_for_pass(&app.address, drop.id, &first, Duration::from_secs(10))
        .await;
    // Redis forgets that Ada joined (a failover that lost the write): she joins again,
    // gets a new ticket, and is let in under it.
    let mut redis = app.redis().await;
    let ids = format!("{}drop:{}:ids", app.settings.redis_prefix, drop.id.simple());
    let _: i64 = redis::cmd("DEL")
        .arg(&ids)
        .query_async(&mut redis)
        .await
        .unwrap();
    let (status, second) = ada.join(&app.address, drop.id).await;
    assert_eq!(status, 201, "{second}");
    let second = second["ticket"].as_str().unwrap().to_string();
    assert_ne!(
        second, first,
        "a new ticket: Redis no longer knew the first"
    );
    let again = ada
        .wait_for_pass(&app.address, drop.id, &second, Duration::from_secs(10))
        .await;
    // One admission, the first: the second pass carries its ticket and expiry.
    let admissions: Vec<String> =
        sqlx::query_scalar("select ticket::text from drop_admissions where drop_id = $1")
            .bind(drop.id)
            .fetch_all(&app.db)
            .await
            .unwrap();
    assert_eq!(admissions, vec![first.clone()]);
    let simple = Uuid::parse_str(&first).unwrap().simple().to_string();
    assert!(again.contains(&simple), "{again} carries {simple}");
    assert_eq!(again, pass, "the same pass as before");
}

/// The `key` of the form posting to `action` on an admin `page`.
fn form_key(page: &str, action: &str) -> String {
    let form = &page[page.find(&format!("action=\"{action}\"")).expect(action)..];
    let at = form.find("name=\"key\" value=\"").unwrap() + "name=\"key\" value=\"".len();
    form[at..at + form[at..].find('"').unwrap()].to_string()
}

#[tokio::test]
async fn an_admin_schedules_a_drop_watches_it_live_and_each_button_applies_once() {
    let app = spawn_app().await;
    app.add_product("DROP-M", "Drop M", 1000, 10).await;
    let csrf = app.login_admin().await;
    let schedule = |body: Value| {
        app.client
            .post(app.url("/api/v1/admin/drops"))
            .header("X-CSRF-Token", &csrf)
            .json(&body)
            .send()
    };
    let drop = serde_json::json!({"sku": "DROP-M", "opens_at": "+3600", "prequeue_seconds": 7200,
                                  "queueing": "fifo", "admit_per_minute": 1});
    let res = schedule(drop.clone()).await.unwrap();
    assert_eq!(res.status().as_u16(), 201);
    let id = res.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    // Refused in words, and nothing made: a time that is none, a second live drop.
    let mut bad = drop.clone();
    bad["opens_at"] = "yesterday".into();
    let res = schedule(bad).await.unwrap();
    assert_eq!(res.status().as_u16(), 422);
    assert!(res.text().await.unwrap().contains("is not a time"));
    assert_eq!(schedule(drop).await.unwrap().status().as_u16(), 409);
    assert_eq!(app.count("select count(*) from drops").await, 1);

    // Two shoppers queue; the live figures say so, in the API and on the page.
    let id = Uuid::parse_str(&id).unwrap();
    let key = key(&app, true).await;
    for shopper in ["ada", "bob"] {
        let buyer = Buyer {
            key: key.clone(),
            shopper: Some(shopper.into()),
        };
        assert_eq!(buyer.join(&app.address, id).await.0, 201);
    }
    let live: Value = app
        .client
        .get(app.url(&format!("/api/v1/admin/drops/{id}")))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        (live["waiting"].as_u64(), live["admitted"].as_u64()),
        (Some(2), Some(0)),
        "{live}"
    );
    let page_path = format!("/admin/drops/{id}");
    let page = app
        .client
        .get(app.url(&page_path))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(page.contains("id=\"drop-waiting\">2<"), "{page}");
    assert_eq!(
        page.matches("http-equiv=\"refresh\"").count(),
        page.matches("<noscript><meta http-equiv=\"refresh\"")
            .count(),
        "a refresh only without JavaScript (axe-core counts a meta refresh as critical)"
    );

    // Each button's form, pressed twice, changes the drop once.
    async fn press(app: &TestApp, csrf: &str, id: Uuid, action: &str, page: &str) {
        let key = form_key(page, &format!("/admin/drops/{id}/{action}"));
        let form = [("csrf", csrf.to_string()), ("key", key)];
        let url = app.url(&format!("/admin/drops/{id}/{action}"));
        for _ in 0..2 {
            let res = app.client.post(&url).form(&form).send().await.unwrap();
            assert_eq!(res.status().as_u16(), 303, "{action}");
        }
    }
    let status = || async {
        sqlx::query_scalar::<_, String>("select status from drops where id = $1")
            .bind(id)
            .fetch_one(&app.db)
            .await
            .unwrap()
    };
    press(&app, &csrf, id, "pause", &page).await;
    assert_eq!(status().await, "paused");
    let page = app
        .client
        .get(app.url(&page_path))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    press(&app, &csrf, id, "resume", &page).await;
    assert_eq!(status().await, "scheduled");
    press(&app, &csrf, id, "end", &page).await;
    assert_eq!(status().await, "ended");
    assert_eq!(
        app.count("select count(*) from events where type = 'drop.ended'")
            .await,
        1,
        "one drop.ended, however often the button was pressed"
    );
    // Ended: the queue is closed to a waiting shopper.
    let ada = Buyer {
        key,
        shopper: Some("ada".into()),
    };
    let (status, body) = ada.join(&app.address, id).await;
    assert_eq!(status, 409, "{body}");
}
