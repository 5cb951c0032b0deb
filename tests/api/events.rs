//! Events out: every committed change has its event and no rolled-back one does; webhooks
//! arrive signed as documented, survive a receiver that is down and a dispatcher killed
//! mid-send; receipts reach a mail folder and an SMTP server; private addresses are
//! refused.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use futures_util::future::join_all;
use hmac::{KeyInit as _, Mac as _};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;
use uuid::Uuid;

use crate::helpers::{TestApp, serve_app, spawn_app, spawn_app_with, test_settings};

/// One request a [`Receiver`] got.
#[derive(Debug, Clone)]
struct Received {
    headers: HashMap<String, String>,
    body: Vec<u8>,
}

impl Received {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap()
    }
}

/// A webhook receiver: a plain HTTP/1.1 server on 127.0.0.1 that records every request
/// and answers with `status` (0: never answers, like a receiver that hangs).
struct Receiver {
    addr: SocketAddr,
    got: Arc<Mutex<Vec<Received>>>,
    status: Arc<AtomicU16>,
    task: tokio::task::JoinHandle<()>,
}

impl Receiver {
    async fn start() -> Self {
        Self::on("127.0.0.1:0".parse().unwrap()).await
    }

    async fn on(addr: SocketAddr) -> Self {
        let listener = TcpListener::bind(addr).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let got = Arc::new(Mutex::new(Vec::new()));
        let status = Arc::new(AtomicU16::new(200));
        let (g, s) = (got.clone(), status.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let (g, s) = (g.clone(), s.clone());
                tokio::spawn(async move {
                    let mut stream = BufReader::new(stream);
                    let mut headers = HashMap::new();
                    let mut line = String::new();
                    stream.read_line(&mut line).await.ok();
                    loop {
                        line.clear();
                        if stream.read_line(&mut line).await.unwrap_or(0) == 0 {
                            return;
                        }
                        let l = line.trim_end();
                        if l.is_empty() {
                            break;
                        }
                        if let Some((k, v)) = l.split_once(':') {
                            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
                        }
                    }
                    let len: usize = headers
                        .get("content-length")
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(0);
                    let mut body = vec![0; len];
                    stream.read_exact(&mut body).await.ok();
                    g.lock().unwrap().push(Received { headers, body });
                    let code = s.load(Ordering::SeqCst);
                    if code == 0 {
                        tokio::time::sleep(Duration::from_secs(3_600)).await;
                        return;
                    }
                    let answer = format!(
                        "HTTP/1.1 {code} X\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok"
                    );
                    stream.get_mut().write_all(answer.as_bytes()).await.ok();
                    stream.get_mut().shutdown().await.ok();
                });
            }
        });
        Self {
            addr,
            got,
            status,
            task,
        }
    }

    fn url(&self) -> String {
        format!("http://{}/hooks", self.addr)
    }

    fn got(&self) -> Vec<Received> {
        self.got.lock().unwrap().clone()
    }

    /// Stops listening: connections to its port are refused.
    fn stop(&self) {
        self.task.abort();
    }

    /// Waits until it got a request whose body satisfies `matches`.
    async fn wait_for(&self, limit: Duration, matches: impl Fn(&Value) -> bool) -> Received {
        let started = Instant::now();
        loop {
            if let Some(r) = self.got().into_iter().find(|r| matches(&r.json())) {
                return r;
            }
            assert!(
                started.elapsed() < limit,
                "no matching webhook within {limit:?}; got {:?}",
                self.got()
                    .iter()
                    .map(|r| String::from_utf8_lossy(&r.body).to_string())
                    .collect::<Vec<_>>()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Makes an endpoint for `url` and `types` straight in the database; returns its secret.
async fn endpoint(app: &TestApp, url: &str, types: &[&str]) -> String {
    let types: Vec<_> = types
        .iter()
        .map(|t| stockade::events::EventType::parse(t).unwrap())
        .collect();
    let secret = stockade::events::sign::new_secret();
    stockade::events::db::insert_endpoint(&app.db, url, &types, "test", &secret)
        .await
        .unwrap();
    secret
}

/// Verifies a Standard Webhooks signature as a receiver would, from the README's
/// description alone: HMAC-SHA256 keyed with the base64 after `whsec_`, over
/// `"{webhook-id}.{webhook-timestamp}.{body}"`, base64, after `v1,`.
fn verify_as_a_receiver(secret: &str, got: &Received) -> bool {
    let b64 = base64::engine::general_purpose::STANDARD;
    let key = b64.decode(secret.strip_prefix("whsec_").unwrap()).unwrap();
    let id = &got.headers["webhook-id"];
    let timestamp = &got.headers["webhook-timestamp"];
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(&key).unwrap();
    mac.update(format!("{id}.{timestamp}.").as_bytes());
    mac.update(&got.body);
    let expected = format!("v1,{}", b64.encode(mac.finalize().into_bytes()));
    got.headers["webhook-signature"]
        .split(' ')
        .any(|s| s == expected)
}

/// POSTs an API order with an email.
async fn order_with_email(app: &TestApp, key: &str, sku: &str, email: &str) -> reqwest::Response {
    app.client
        .post(app.url("/api/v1/orders"))
        .header("Idempotency-Key", key)
        .json(&json!({ "lines": [{"sku": sku, "quantity": 1}], "email": email, "name": "Ada Lovelace" }))
        .send()
        .await
        .unwrap()
}

async fn order_id(res: reqwest::Response) -> String {
    assert_eq!(res.status().as_u16(), 201);
    let body: Value = res.json().await.unwrap();
    body["id"].as_str().unwrap().to_string()
}

async fn events_of(app: &TestApp, kind: &str) -> Vec<Value> {
    sqlx::query_scalar!(
        "select payload from events where type = $1 order by seq",
        kind
    )
    .fetch_all(&app.db)
    .await
    .unwrap()
}

/// Waits until `sql` (one bigint) is `expected`.
async fn eventually(app: &TestApp, sql: &'static str, expected: i64, limit: Duration) {
    let started = Instant::now();
    loop {
        let n = app.count(sql).await;
        if n == expected {
            return;
        }
        assert!(started.elapsed() < limit, "{sql}: {n}, expected {expected}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

#[tokio::test]
async fn a_placed_order_reaches_its_webhook_signed_as_the_readme_documents() {
    let app = spawn_app().await;
    app.add_product("EV-1", "Event lamp", 1_250, 10).await;
    let receiver = Receiver::start().await;
    let secret = endpoint(&app, &receiver.url(), &["order.placed"]).await;

    let id = order_id(app.post_order("ev-signed", &[("EV-1", 2)]).await).await;
    let got = receiver
        .wait_for(Duration::from_secs(10), |b| {
            b["data"]["order_id"] == id.as_str()
        })
        .await;

    assert!(verify_as_a_receiver(&secret, &got), "signature: {got:?}");
    assert!(stockade::events::sign::verify(
        &secret,
        &got.headers["webhook-id"],
        got.headers["webhook-timestamp"].parse().unwrap(),
        &got.body,
        &got.headers["webhook-signature"],
    ));
    // Another secret does not verify: the check can fail.
    assert!(!verify_as_a_receiver(
        &stockade::events::sign::new_secret(),
        &got
    ));
    let body = got.json();
    assert_eq!(body["type"], "order.placed");
    assert_eq!(body["id"], got.headers["webhook-id"].as_str());
    assert_eq!(body["data"]["lines"][0]["sku"], "EV-1");
    assert_eq!(body["data"]["total_cents"], 2_500);
    let stamp: i64 = got.headers["webhook-timestamp"].parse().unwrap();
    assert!((chrono::Utc::now().timestamp() - stamp).abs() < 60);

    eventually(
        &app,
        "select count(*) from deliveries where status = 'sent' and last_status = 200",
        1,
        Duration::from_secs(5),
    )
    .await;
    // One event of the subscribed type, one request.
    assert_eq!(receiver.got().len(), 1);
}

#[tokio::test]
async fn a_receiver_that_is_down_gets_the_event_once_it_is_back() {
    let app = spawn_app().await;
    app.add_product("EV-2", "Event mug", 900, 10).await;
    let receiver = Receiver::start().await;
    let addr = receiver.addr;
    endpoint(&app, &receiver.url(), &["order.placed"]).await;
    receiver.stop();
    tokio::time::sleep(Duration::from_millis(50)).await;

    let id = order_id(app.post_order("ev-down", &[("EV-2", 1)]).await).await;
    // Refused connections are counted as attempts and retried.
    eventually(
        &app,
        "select count(*) from deliveries where status = 'pending' and attempts >= 2 and last_error is not null",
        1,
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(
        app.count("select count(*) from deliveries where status = 'sent'")
            .await,
        0
    );

    let back = Receiver::on(addr).await;
    back.wait_for(Duration::from_secs(15), |b| {
        b["data"]["order_id"] == id.as_str()
    })
    .await;
    eventually(
        &app,
        "select count(*) from deliveries where status = 'sent'",
        1,
        Duration::from_secs(5),
    )
    .await;
}

#[tokio::test]
async fn a_delivery_that_keeps_failing_is_marked_failed_and_resent_on_request() {
    let mut settings = test_settings().await;
    settings.delivery_max_attempts = 3;
    let app = spawn_app_with(settings).await;
    app.add_product("EV-3", "Event pen", 300, 10).await;
    let receiver = Receiver::start().await;
    receiver.status.store(500, Ordering::SeqCst);
    endpoint(&app, &receiver.url(), &["order.placed"]).await;
    order_id(app.post_order("ev-fail", &[("EV-3", 1)]).await).await;
    eventually(
        &app,
        "select count(*) from deliveries where status = 'failed' and attempts = 3 and last_status = 500",
        1,
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(receiver.got().len(), 3, "three attempts, then no more");

    // The admin's resend: from the page, with the session's CSRF token.
    let csrf = app.login_admin().await;
    let (status, html) = app.get_text("/admin/deliveries?status=failed").await;
    assert_eq!(status, 200);
    assert!(html.contains("HTTP 500"), "{html}");
    let id: i64 = app.count("select id from deliveries").await;
    receiver.status.store(204, Ordering::SeqCst);
    let res = app
        .admin_post(
            &format!("/admin/deliveries/{id}/resend"),
            &[("csrf", &csrf)],
        )
        .await;
    assert_eq!(res.status().as_u16(), 303);
    eventually(
        &app,
        "select count(*) from deliveries where status = 'sent' and last_status = 204",
        1,
        Duration::from_secs(10),
    )
    .await;
    let res = app
        .admin_post("/admin/deliveries/999999/resend", &[("csrf", &csrf)])
        .await;
    assert_eq!(res.status().as_u16(), 404);
    let (status, _) = app.get_text("/admin/deliveries?status=lost").await;
    assert_eq!(status, 400);
}

#[tokio::test]
async fn an_order_rolled_back_leaves_no_event_even_after_its_stock_trigger_fired() {
    let app = spawn_app().await;
    app.add_product("EV-A", "First", 100, 1).await;
    app.add_product("EV-B", "Second", 100, 0).await;
    // EV-A's unit is taken (its row's trigger writes stock.sold_out), then EV-B is short
    // and the whole transaction rolls back.
    let res = app
        .post_order("ev-rollback", &[("EV-A", 1), ("EV-B", 1)])
        .await;
    assert_eq!(res.status().as_u16(), 409);
    assert_eq!(app.count("select count(*) from events").await, 0);
    assert_eq!(app.stock("EV-A").await, (1, 0));

    // The same sale alone commits, with both events.
    let id = order_id(app.post_order("ev-commit", &[("EV-A", 1)]).await).await;
    let placed = events_of(&app, "order.placed").await;
    assert_eq!(placed.len(), 1);
    assert_eq!(placed[0]["order_id"], id.as_str());
    let sold_out = events_of(&app, "stock.sold_out").await;
    assert_eq!(sold_out.len(), 1);
    assert_eq!(sold_out[0]["sku"], "EV-A");
}

#[tokio::test]
async fn holds_cancels_and_stock_changes_are_each_announced_once() {
    let app = spawn_app().await;
    app.add_product("EV-H", "Held thing", 500, 8).await;
    // hold.placed, then hold.confirmed with its order.placed.
    let res = crate::helpers::post_lines(
        &app.client,
        &app.url("/api/v1/holds"),
        "ev-hold",
        &[("EV-H", 2)],
    )
    .await;
    assert_eq!(res.status().as_u16(), 201);
    let hold: Value = res.json().await.unwrap();
    let hold_id = hold["id"].as_str().unwrap().to_string();
    let res = app
        .client
        .post(app.url(&format!("/api/v1/holds/{hold_id}/confirm")))
        .send()
        .await
        .unwrap();
    let confirmed_id = order_id(res).await;
    // Another hold, released.
    let res = crate::helpers::post_lines(
        &app.client,
        &app.url("/api/v1/holds"),
        "ev-hold-2",
        &[("EV-H", 1)],
    )
    .await;
    let other: Value = res.json().await.unwrap();
    let other_id = other["id"].as_str().unwrap().to_string();
    let res = app
        .client
        .delete(app.url(&format!("/api/v1/holds/{other_id}")))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 204);
    // 8 − 2 sold = 6 available; selling 2 more crosses the threshold of 5 once.
    order_id(app.post_order("ev-low-1", &[("EV-H", 1)]).await).await;
    order_id(app.post_order("ev-low-2", &[("EV-H", 1)]).await).await;
    order_id(app.post_order("ev-low-3", &[("EV-H", 1)]).await).await;
    // The admin cancels the first order and restocks.
    let uuid = Uuid::parse_str(&confirmed_id).unwrap();
    stockade::orders::cancel(&app.db, uuid, "ada", "customer asked")
        .await
        .unwrap();
    stockade::orders::cancel(&app.db, uuid, "ada", "again")
        .await
        .unwrap();
    let mut tx = app.db.begin().await.unwrap();
    let sku = stockade::catalog::Sku::parse("EV-H").unwrap();
    stockade::inventory::db::restock(&mut tx, &sku, 10, "delivery", "ada")
        .await
        .unwrap();
    tx.commit().await.unwrap();

    let placed = events_of(&app, "hold.placed").await;
    assert_eq!(placed.len(), 2);
    assert_eq!(placed[0]["hold_id"], hold_id.as_str());
    let confirmed = events_of(&app, "hold.confirmed").await;
    assert_eq!(
        confirmed,
        vec![json!({"hold_id": hold_id, "order_id": confirmed_id})]
    );
    assert_eq!(events_of(&app, "hold.released").await.len(), 1);
    assert_eq!(events_of(&app, "order.placed").await.len(), 4);
    let cancelled = events_of(&app, "order.cancelled").await;
    assert_eq!(cancelled.len(), 1, "a second cancel changes nothing");
    assert_eq!(cancelled[0]["order_id"], confirmed_id.as_str());
    let low = events_of(&app, "stock.low").await;
    assert_eq!(low.len(), 1, "{low:?}");
    assert_eq!(low[0]["available"], 4);
    let adjusted = events_of(&app, "stock.adjusted").await;
    assert_eq!(adjusted.len(), 1);
    assert_eq!(adjusted[0]["delta"], 10);
    assert_eq!(events_of(&app, "stock.sold_out").await.len(), 0);
}

#[tokio::test]
async fn an_expired_hold_is_announced_by_the_sweeper() {
    let mut settings = test_settings().await;
    settings.hold_ttl = Duration::from_secs(1);
    settings.sweep_interval = Duration::from_millis(100);
    let app = spawn_app_with(settings).await;
    app.add_product("EV-X", "Expiring", 500, 3).await;
    let res = crate::helpers::post_lines(
        &app.client,
        &app.url("/api/v1/holds"),
        "ev-expire",
        &[("EV-X", 1)],
    )
    .await;
    let hold: Value = res.json().await.unwrap();
    eventually(
        &app,
        "select count(*) from events where type = 'hold.expired'",
        1,
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(
        events_of(&app, "hold.expired").await[0]["hold_id"],
        hold["id"]
    );
}

#[tokio::test]
async fn batched_orders_write_one_event_each_and_the_last_unit_one_sold_out() {
    let mut settings = test_settings().await;
    settings.order_strategy = stockade::config::OrderStrategy::Batched;
    let app = spawn_app_with(settings).await;
    app.add_product("EV-BATCH", "Batched", 100, 30).await;
    let answers = join_all((0..45).map(|i| {
        let app = &app;
        async move {
            app.post_order(&format!("ev-batch-{i}"), &[("EV-BATCH", 1)])
                .await
                .status()
                .as_u16()
        }
    }))
    .await;
    let placed = answers.iter().filter(|s| **s == 201).count();
    assert_eq!(placed, 30, "{answers:?}");
    let events = app
        .count("select count(*) from events where type = 'order.placed'")
        .await;
    assert_eq!(events, 30);
    // Each order has exactly one event, and each event an order.
    let matched = app
        .count(
            "select count(*) from orders o join events e on e.type = 'order.placed' \
             and e.payload->>'order_id' = o.id::text",
        )
        .await;
    assert_eq!(matched, 30);
    assert_eq!(events_of(&app, "stock.sold_out").await.len(), 1);
    // A batch may take the stock from above the low band straight to zero.
    assert!(events_of(&app, "stock.low").await.len() <= 1);
}

/// How the `order.placed` event of order `id` was routed: `Some(true)` written routed by
/// its own insert (routed at the instant it was created, in the same transaction),
/// `Some(false)` routed later by a dispatcher, `None` not routed yet.
async fn routed_on_insert(app: &TestApp, id: &str) -> Option<bool> {
    sqlx::query_scalar!(
        r#"select routed_at = created_at as "same" from events
            where type = 'order.placed' and payload->>'order_id' = $1"#,
        id
    )
    .fetch_one(&app.db)
    .await
    .unwrap()
}

#[tokio::test]
async fn an_event_nothing_can_want_is_written_routed_and_one_an_endpoint_wants_is_routed_to_it() {
    for strategy in [
        stockade::config::OrderStrategy::RedisLock,
        stockade::config::OrderStrategy::Batched,
    ] {
        let mut settings = test_settings().await;
        settings.order_strategy = strategy;
        let app = spawn_app_with(settings).await;
        app.add_product("EV-QUIET", "Quiet", 100, 10).await;

        // No endpoint, no email: nothing to route to, so no dispatcher rewrites the row.
        let quiet = order_id(app.post_order("ev-quiet", &[("EV-QUIET", 1)]).await).await;
        assert_eq!(
            routed_on_insert(&app, &quiet).await,
            Some(true),
            "{strategy:?}"
        );
        // An email may become a receipt: left to the dispatchers, who know about mail.
        let mailed =
            order_id(order_with_email(&app, "ev-mailed", "EV-QUIET", "ada@example.com").await)
                .await;
        assert_ne!(
            routed_on_insert(&app, &mailed).await,
            Some(true),
            "{strategy:?}"
        );

        // Once an endpoint subscribes, its type's events wait for a dispatcher, which
        // routes them to it.
        let receiver = Receiver::start().await;
        endpoint(&app, &receiver.url(), &["order.placed"]).await;
        let wanted = order_id(app.post_order("ev-wanted", &[("EV-QUIET", 1)]).await).await;
        assert_ne!(
            routed_on_insert(&app, &wanted).await,
            Some(true),
            "{strategy:?}"
        );
        receiver
            .wait_for(Duration::from_secs(10), |b| {
                b["data"]["order_id"] == wanted.as_str()
            })
            .await;
        assert_eq!(routed_on_insert(&app, &wanted).await, Some(false));
        // The order placed before the endpoint existed is not sent to it.
        assert!(
            receiver
                .got()
                .iter()
                .all(|g| g.json()["data"]["order_id"] != quiet.as_str()),
            "{strategy:?}"
        );
    }
}

#[tokio::test]
async fn a_dispatcher_killed_mid_send_is_replaced_and_the_event_still_arrives() {
    // This process's own dispatcher stays idle: the `serve` children send.
    let mut settings = test_settings().await;
    settings.dispatch_interval = Duration::from_secs(3_600);
    let app = spawn_app_with(settings).await;
    app.add_product("EV-K", "Killed", 100, 5).await;
    let receiver = Receiver::start().await;
    receiver.status.store(0, Ordering::SeqCst); // hangs: the send is in flight
    endpoint(&app, &receiver.url(), &["order.placed"]).await;
    let slow = [("STOCKADE_WEBHOOK_TIMEOUT_MS", "1500".to_string())];
    let mut first = serve_app(&app, &slow, &[]).await;

    let res =
        crate::helpers::post_order_to(&app.client, &first.address, "ev-kill", &[("EV-K", 1)]).await;
    let id = order_id(res).await;
    receiver
        .wait_for(Duration::from_secs(10), |b| {
            b["data"]["order_id"] == id.as_str()
        })
        .await;
    first.kill9();
    receiver.status.store(200, Ordering::SeqCst);
    assert_eq!(
        app.count("select count(*) from deliveries where status = 'sent'")
            .await,
        0
    );

    let _second = serve_app(&app, &slow, &[]).await;
    eventually(
        &app,
        "select count(*) from deliveries where status = 'sent' and attempts = 2",
        1,
        Duration::from_secs(15),
    )
    .await;
    let got = receiver.got();
    assert_eq!(got.len(), 2, "sent again after the kill");
    assert_eq!(
        got[0].headers["webhook-id"], got[1].headers["webhook-id"],
        "the same event id both times, so the receiver can drop the repeat"
    );
}

#[tokio::test]
async fn a_receipt_is_written_to_the_mail_folder_and_listed_for_the_admin() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = test_settings().await;
    settings.mail_dir = Some(dir.path().to_path_buf());
    let app = spawn_app_with(settings).await;
    app.add_product("EV-M", "Mailed mug", 1_999, 5).await;
    let id = order_id(order_with_email(&app, "ev-mail", "EV-M", "ada@example.com").await).await;
    // An order without an email gets no receipt.
    order_id(app.post_order("ev-mail-none", &[("EV-M", 1)]).await).await;
    eventually(
        &app,
        "select count(*) from deliveries where channel = 'mail' and status = 'sent'",
        1,
        Duration::from_secs(10),
    )
    .await;
    let event_id: Uuid =
        sqlx::query_scalar!("select event_id from deliveries where channel = 'mail'")
            .fetch_one(&app.db)
            .await
            .unwrap();
    let eml = std::fs::read_to_string(dir.path().join(format!("{event_id}.eml"))).unwrap();
    let number: i64 = sqlx::query_scalar("select number from orders where id = $1::uuid")
        .bind(&id)
        .fetch_one(&app.db)
        .await
        .unwrap();
    let reference = format!("#{number}");
    assert!(
        eml.contains("To: \"Ada Lovelace\" <ada@example.com>"),
        "{eml}"
    );
    assert!(
        eml.contains(&format!("Subject: Your order {reference}")),
        "{eml}"
    );
    assert!(eml.contains("multipart/alternative"), "{eml}");
    assert!(
        eml.contains("text/plain") && eml.contains("text/html"),
        "{eml}"
    );
    assert!(
        eml.contains(&format!("{}@localhost>", event_id.simple())),
        "{eml}"
    );
    // The text part is quoted-printable: soft line breaks end in "=".
    let text = eml.replace("=\r\n", "").replace("=\n", "");
    assert!(
        text.contains(&format!("{}/orders/{id}", app.address)),
        "{eml}"
    );
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);

    app.login_admin().await;
    let (status, html) = app.get_text("/admin/webhooks").await;
    assert_eq!(status, 200);
    assert!(html.contains("ada@example.com"), "{html}");
    assert!(html.contains("written to"), "{html}");
    // No SMTP: the confirmation page promises no receipt.
    let (_, page) = app.get_text(&format!("/orders/{id}")).await;
    assert!(!page.contains("receipt"), "{page}");
}

/// A minimal SMTP server: accepts every message and keeps its DATA.
async fn smtp_sink() -> (SocketAddr, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let got = Arc::new(Mutex::new(Vec::new()));
    let kept = got.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let kept = kept.clone();
            tokio::spawn(async move {
                let (read, mut write) = stream.into_split();
                let mut lines = BufReader::new(read).lines();
                write.write_all(b"220 sink ESMTP\r\n").await.ok();
                while let Ok(Some(line)) = lines.next_line().await {
                    let verb = line.get(..4).unwrap_or("").to_ascii_uppercase();
                    let reply: &[u8] = match verb.as_str() {
                        "EHLO" | "HELO" => b"250 sink\r\n",
                        "DATA" => {
                            write.write_all(b"354 go on\r\n").await.ok();
                            let mut data = String::new();
                            while let Ok(Some(l)) = lines.next_line().await {
                                if l == "." {
                                    break;
                                }
                                data.push_str(&l);
                                data.push('\n');
                            }
                            kept.lock().unwrap().push(data);
                            b"250 queued\r\n"
                        }
                        "QUIT" => {
                            write.write_all(b"221 bye\r\n").await.ok();
                            return;
                        }
                        _ => b"250 ok\r\n",
                    };
                    write.write_all(reply).await.ok();
                }
            });
        }
    });
    (addr, got)
}

#[tokio::test]
async fn a_receipt_goes_out_through_smtp_and_the_confirmation_page_says_so() {
    let (addr, got) = smtp_sink().await;
    let mut settings = test_settings().await;
    settings.smtp_url = Some(format!("smtp://{addr}").into());
    let app = spawn_app_with(settings).await;
    app.add_product("EV-S", "Sent by SMTP", 4_200, 5).await;
    let id = order_id(order_with_email(&app, "ev-smtp", "EV-S", "grace@example.com").await).await;
    eventually(
        &app,
        "select count(*) from deliveries where channel = 'mail' and status = 'sent'",
        1,
        Duration::from_secs(10),
    )
    .await;
    let data = got.lock().unwrap().clone();
    assert_eq!(data.len(), 1);
    assert!(data[0].contains("grace@example.com"), "{}", data[0]);
    assert!(data[0].contains("Sent by SMTP"), "{}", data[0]);
    let (_, page) = app.get_text(&format!("/orders/{id}")).await;
    assert!(page.contains("A receipt is on its way to"), "{page}");
}

#[tokio::test]
async fn webhook_urls_on_private_addresses_are_refused_when_not_allowed() {
    let mut settings = test_settings().await;
    settings.webhook_allow_private = false;
    let app = spawn_app_with(settings).await;
    let csrf = app.login_admin().await;
    let create = |url: &str, types: Value| {
        app.client
            .post(app.url("/api/v1/admin/webhooks"))
            .header("x-csrf-token", &csrf)
            .json(&json!({ "url": url, "event_types": types }))
            .send()
    };
    for url in [
        "http://127.0.0.1:9/hooks",
        "http://localhost/hooks",
        "http://10.0.0.7/hooks",
        "http://169.254.169.254/latest/meta-data",
        "http://[::1]/hooks",
        "http://[fd00::1]/hooks",
    ] {
        let res = create(url, json!(["order.placed"])).await.unwrap();
        assert_eq!(res.status().as_u16(), 422, "{url}");
        let body: Value = res.json().await.unwrap();
        assert!(
            body["detail"]
                .as_str()
                .unwrap_or_default()
                .contains("private"),
            "{url}: {body}"
        );
    }
    for (url, types) in [
        ("ftp://example.com/x", json!(["order.placed"])),
        ("https://example.com/x", json!(["order.shipped"])),
        ("https://example.com/x", json!([])),
    ] {
        let res = create(url, types).await.unwrap();
        assert_eq!(res.status().as_u16(), 422, "{url}");
    }
    let res = app
        .client
        .post(app.url("/api/v1/admin/webhooks"))
        .header("x-csrf-token", &csrf)
        .json(&json!({ "address": "https://example.com/x" }))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 422);
    let body: Value = res.json().await.unwrap();
    assert!(body["detail"].as_str().unwrap().contains("url"), "{body}");
    assert_eq!(app.count("select count(*) from webhook_endpoints").await, 0);

    // An endpoint already pointing inside (added before, or its name moved there) is
    // refused again at delivery time, and nothing reaches it.
    let receiver = Receiver::start().await;
    endpoint(&app, &receiver.url(), &["order.placed"]).await;
    app.add_product("EV-P", "Private", 100, 5).await;
    order_id(app.post_order("ev-private", &[("EV-P", 1)]).await).await;
    eventually(
        &app,
        "select count(*) from deliveries where status = 'failed' and last_error like '%private%'",
        1,
        Duration::from_secs(10),
    )
    .await;
    assert!(receiver.got().is_empty());
}

#[tokio::test]
async fn admins_make_list_and_delete_endpoints_and_see_the_secret_once() {
    let app = spawn_app().await;
    let csrf = app.login_admin().await;
    let receiver = Receiver::start().await;
    let url = receiver.url();
    let key = crate::webhooks::form_key(&app).await;
    let res = app
        .admin_post(
            "/admin/webhooks",
            &[
                ("csrf", &csrf),
                ("key", &key),
                ("url", &url),
                ("event_types", "order.placed"),
                ("event_types", "stock.sold_out"),
                ("description", "fulfilment"),
            ],
        )
        .await;
    assert_eq!(res.status().as_u16(), 303);
    let (_, html) = app
        .get_text(res.headers()["location"].to_str().unwrap())
        .await;
    let marker = r#"<code id="new-secret">"#;
    let start = html.find(marker).expect("secret shown") + marker.len();
    let secret = &html[start..start + html[start..].find('<').unwrap()];
    assert!(secret.starts_with("whsec_"));
    let (_, listed) = app.get_text("/admin/webhooks").await;
    assert!(listed.contains(&url) && listed.contains("stock.sold_out"));
    assert!(!listed.contains(secret), "the secret is shown only once");

    let res = app
        .admin_post(
            "/admin/webhooks",
            &[
                ("csrf", &csrf),
                ("key", &crate::webhooks::form_key(&app).await),
                ("url", "gopher://x"),
                ("event_types", "order.placed"),
            ],
        )
        .await;
    assert_eq!(res.status().as_u16(), 422);
    let page = res.text().await.unwrap();
    assert!(page.contains("nly http and https"), "{page}");

    // The API lists it without the secret, and deletes it.
    let res = app.get("/api/v1/admin/webhooks").await;
    let list: Value = res.json().await.unwrap();
    assert_eq!(list.as_array().unwrap().len(), 1);
    assert!(list[0].get("secret").is_none());
    let id = list[0]["id"].as_str().unwrap();
    let delete = |id: String| {
        app.client
            .delete(app.url(&format!("/api/v1/admin/webhooks/{id}")))
            .header("x-csrf-token", &csrf)
            .send()
    };
    assert_eq!(delete(id.to_string()).await.unwrap().status().as_u16(), 204);
    assert_eq!(delete(id.to_string()).await.unwrap().status().as_u16(), 404);
    assert_eq!(delete("nope".into()).await.unwrap().status().as_u16(), 404);
    assert_eq!(app.count("select count(*) from webhook_endpoints").await, 0);
    // Without a session the API refuses.
    let res = reqwest::get(app.url("/api/v1/admin/webhooks"))
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 401);
}

#[tokio::test]
async fn the_metrics_and_dashboard_show_the_outbox() {
    let app = spawn_app().await;
    app.add_product("EV-D", "Dashboard", 100, 5).await;
    let receiver = Receiver::start().await;
    endpoint(&app, &receiver.url(), &["order.placed"]).await;
    order_id(app.post_order("ev-dash", &[("EV-D", 1)]).await).await;
    eventually(
        &app,
        "select count(*) from deliveries where status = 'sent'",
        1,
        Duration::from_secs(10),
    )
    .await;
    let metrics = app.metrics().await;
    assert!(
        metrics.contains("stockade_event_deliveries_total{outcome=\"sent\"} 1"),
        "{metrics}"
    );
    assert!(metrics.contains("stockade_events_pending"), "{metrics}");
    assert!(
        metrics.contains("stockade_event_delivery_latency_seconds_count 1"),
        "{metrics}"
    );
    app.login_admin().await;
    let res = app.get("/api/v1/admin/dashboard").await;
    let d: Value = res.json().await.unwrap();
    assert_eq!(d["events"]["sent"], 1, "{d}");
    assert_eq!(d["events"]["failed"], 0, "{d}");
    let (_, html) = app.get_text("/admin").await;
    assert!(html.contains(r#"id="events-sent">1<"#), "{html}");
}

#[tokio::test]
async fn the_checker_finds_an_order_without_its_event_and_an_event_without_its_order() {
    use stockade::loadtest::check::{check, default_stale_after};
    let app = spawn_app().await;
    app.add_product("EV-C", "Checked", 100, 5).await;
    let first = order_id(app.post_order("ev-check-1", &[("EV-C", 1)]).await).await;
    order_id(app.post_order("ev-check-2", &[("EV-C", 1)]).await).await;
    let i7 = |verdicts: Vec<stockade::loadtest::check::Verdict>| {
        verdicts.into_iter().find(|v| v.id == "I7").unwrap()
    };
    let clean = i7(check(&app.db, None, None, default_stale_after())
        .await
        .unwrap());
    assert!(clean.pass, "{clean:?}");

    // The first order loses its event; an event appears for an order that never was.
    sqlx::query!("delete from events where payload->>'order_id' = $1", &first)
        .execute(&app.db)
        .await
        .unwrap();
    let ghost = Uuid::new_v4();
    sqlx::query!(
        "insert into events (type, payload) values ('order.placed', $1)",
        json!({ "order_id": ghost })
    )
    .execute(&app.db)
    .await
    .unwrap();
    let broken = i7(check(&app.db, None, None, default_stale_after())
        .await
        .unwrap());
    assert!(!broken.pass);
    assert_eq!(broken.violations, 2, "{:?}", broken.rows);
    let rows = broken.rows.join("\n");
    assert!(
        rows.contains(&format!("order {first} has 0 order.placed events")),
        "{rows}"
    );
    assert!(
        rows.contains(&format!("for order {ghost}, which does not exist")),
        "{rows}"
    );
}

#[tokio::test]
async fn three_dispatchers_in_three_processes_send_each_event_exactly_once_when_nothing_fails() {
    // Patient leases and sends: on a busy machine a slow send must not pass its lease
    // (which would send it again, as it should, but this test is about nothing failing).
    let mut settings = test_settings().await;
    settings.webhook_timeout = Duration::from_secs(20);
    let app = spawn_app_with(settings).await;
    for sku in ["EV-3A", "EV-3B", "EV-3C"] {
        app.add_product(sku, "Three processes", 100, 500).await;
    }
    let receiver = Receiver::start().await;
    endpoint(&app, &receiver.url(), &["order.placed"]).await;
    let patient = [
        ("STOCKADE_WEBHOOK_TIMEOUT_MS", "20000".to_string()),
        ("STOCKADE_LEASE_WAIT_MS", "5000".to_string()),
    ];
    let (one, two) = tokio::join!(
        serve_app(&app, &patient, &[]),
        serve_app(&app, &patient, &[])
    );
    let targets = [
        app.address.clone(),
        one.address.clone(),
        two.address.clone(),
    ];
    join_all((0..60).map(|i| {
        let (client, base) = (&app.client, &targets[i % 3]);
        let sku = ["EV-3A", "EV-3B", "EV-3C"][i % 3];
        async move {
            // A 503 (busy) writes nothing; the orders made are counted below.
            crate::helpers::post_order_to(client, base, &format!("ev-3p-{i}"), &[(sku, 1)]).await
        }
    }))
    .await;
    let orders = app.count("select count(*) from orders").await;
    assert!(orders >= 20, "{orders} orders");
    let started = Instant::now();
    while app
        .count("select count(*) from deliveries where status = 'sent'")
        .await
        < orders
    {
        assert!(started.elapsed() < Duration::from_secs(60), "not all sent");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let got = receiver.got();
    let ids: std::collections::BTreeSet<&String> =
        got.iter().map(|r| &r.headers["webhook-id"]).collect();
    assert_eq!(ids.len() as i64, orders, "every event arrived");
    assert_eq!(got.len() as i64, orders, "and none twice");
    assert_eq!(
        app.count("select count(*) from deliveries where attempts <> 1")
            .await,
        0
    );
}
