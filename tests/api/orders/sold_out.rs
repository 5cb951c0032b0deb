//! Sold-out answers: kept in Redis, replayed, copied into PostgreSQL; never answered from
//! Redis alone for a key decided in PostgreSQL.

use std::time::{Duration, Instant};

use stockade::config::{OrderStrategy, Settings};

use crate::helpers::{spawn_app, spawn_app_with, test_settings};

/// Sold-out answers under `strategy`: kept in Redis (no write per answer), replayed for
/// retries before and after stock comes back, copied into PostgreSQL within seconds; a
/// key decided in PostgreSQL is never answered from Redis.
async fn sold_out_answers_come_from_redis(strategy: OrderStrategy) {
    let app = spawn_app_with(Settings {
        order_strategy: strategy,
        ..test_settings().await
    })
    .await;
    app.add_product("GONE-1", "Gone", 1_000, 1).await;
    let bought = app.post_order("buyer", &[("GONE-1", 1)]).await;
    assert_eq!(bought.status().as_u16(), 201);
    let bought: serde_json::Value = bought.json().await.unwrap();
    // The first refusal may come from PostgreSQL; it teaches the process the SKU is gone.
    assert_eq!(
        app.post_order("learn", &[("GONE-1", 1)]).await.status(),
        409
    );

    let res = app.post_order("fresh", &[("GONE-1", 1)]).await;
    assert_eq!(res.status().as_u16(), 409);
    let body: serde_json::Value = res.json().await.unwrap();
    assert_eq!(
        body["shortages"],
        serde_json::json!([{"sku": "GONE-1", "requested": 1, "available": 0}])
    );
    let mut redis = app.redis().await;
    let kept: Option<String> = redis::cmd("GET")
        .arg(format!(
            "{}decision:api:anon:fresh",
            app.settings.redis_prefix
        ))
        .query_async(&mut redis)
        .await
        .unwrap();
    let kept = kept.expect("the answer is kept in Redis");
    assert!(kept.contains("GONE-1"), "{kept}");

    // The retry replays it; another request under the key is refused.
    let retry = app.post_order("fresh", &[("GONE-1", 1)]).await;
    assert_eq!(retry.status().as_u16(), 409);
    assert_eq!(retry.headers()["idempotency-replayed"], "true");
    assert_eq!(
        app.post_order("fresh", &[("GONE-1", 2)]).await.status(),
        422
    );
    // The buyer's retry gets its order, not "sold out".
    let again = app.post_order("buyer", &[("GONE-1", 1)]).await;
    assert_eq!(again.status().as_u16(), 201);
    let again: serde_json::Value = again.json().await.unwrap();
    assert_eq!(again["id"], bought["id"]);

    // Stock comes back: new keys buy it, the refused key keeps its answer.
    let csrf = app.login_admin().await;
    let restocked = app
        .client
        .post(app.url("/api/v1/admin/stock/GONE-1/restock"))
        .header("Idempotency-Key", "restock-1")
        .header("X-CSRF-Token", csrf)
        .json(&serde_json::json!({"units": 5, "reason": "delivery"}))
        .send()
        .await
        .unwrap();
    assert_eq!(restocked.status().as_u16(), 200);
    assert_eq!(
        app.post_order("after", &[("GONE-1", 1)]).await.status(),
        201
    );
    let retry = app.post_order("fresh", &[("GONE-1", 1)]).await;
    assert_eq!(retry.status().as_u16(), 409);
    assert_eq!(retry.headers()["idempotency-replayed"], "true");

    // Within a few seconds the answer is in PostgreSQL too.
    let since = Instant::now();
    loop {
        let status: Option<i16> = sqlx::query_scalar!(
            r#"select response_status as "status!" from idempotency_keys
                where scope = 'api' and key = 'anon:fresh'"#,
        )
        .fetch_optional(&app.db)
        .await
        .unwrap();
        if status == Some(409) {
            break;
        }
        assert!(
            since.elapsed() < Duration::from_secs(5),
            "the sold-out answer never reached PostgreSQL"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(app.count("select count(*) from orders").await, 2);

    // A copy whose commit went unacknowledged comes back, beside a key answered twice:
    // the key copied already keeps its record, the twice-answered one is stored once.
    let again = kept.replace("anon:fresh", "anon:unseen");
    let process = stockade::locking::Redis::connect_lazy(
        app.settings.redis_url.as_deref().unwrap(),
        &app.settings.redis_prefix,
    )
    .unwrap();
    process.requeue(&[kept.clone(), again.clone(), again]).await;
    // This copy, or the app's own (it copies every second), whichever takes them first.
    let copied = stockade::checkout::sold_out::drain(&app.db, &process)
        .await
        .unwrap();
    assert!(copied <= 1, "the key copied already was stored again");
    let since = Instant::now();
    while app
        .count("select count(*) from idempotency_keys where key = 'anon:unseen'")
        .await
        == 0
    {
        assert!(
            since.elapsed() < Duration::from_secs(5),
            "a copy holding a key already copied, or one key twice, never stored the others"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        app.count(
            "select count(*) from idempotency_keys
              where key in ('anon:fresh', 'anon:unseen') and response_status = 409"
        )
        .await,
        2
    );
    app.assert_invariants().await;
}

/// The version the app checks at start is read from the server (which `SET … NX GET`
/// needs to be 7.0 or later).
#[tokio::test]
async fn the_redis_version_is_read_from_the_server() {
    let app = spawn_app().await;
    let redis = stockade::locking::Redis::connect_lazy(
        app.settings.redis_url.as_deref().unwrap(),
        &app.settings.redis_prefix,
    )
    .unwrap();
    let mut conn = app.redis().await;
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query_async(&mut conn)
        .await
        .unwrap();
    let reported = info
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .unwrap()
        .trim()
        .to_string();
    let (major, minor) = redis.version().await.expect("Redis answered");
    assert!(
        reported.starts_with(&format!("{major}.{minor}.")),
        "read {major}.{minor}, the server says {reported}"
    );
    assert!(major >= 7, "the tests' Redis is {reported}");
}

/// A lot as large as `STOCKADE_BATCH_MAX` allows is stored whole by one Redis call.
#[tokio::test]
async fn a_lot_of_thousands_of_sold_out_answers_is_stored_in_one_call() {
    let app = spawn_app().await;
    // A prefix of its own, so the app's copier leaves these answers alone.
    let redis = stockade::locking::Redis::connect_lazy(
        app.settings.redis_url.as_deref().unwrap(),
        &format!("{}lot:", app.settings.redis_prefix),
    )
    .unwrap();
    let sku = stockade::catalog::Sku::parse("GONE-LOT").unwrap();
    redis.hint_sold_out(&sku).await;
    let answers: Vec<(String, String)> = (0..9_000)
        .map(|i| (format!("lot:{i}"), format!("answer {i}")))
        .collect();
    let answers: Vec<(&str, &str, String)> = answers
        .iter()
        .map(|(key, record)| ("api", key.as_str(), record.clone()))
        .collect();
    let decided = redis
        .decide_sold_out(&sku, &answers, Duration::from_secs(60))
        .await;
    let stored_now = match decided {
        Some(stockade::locking::decisions::Decided::SoldOut(found)) => {
            found.iter().filter(|f| f.is_none()).count()
        }
        other => panic!("the lot was not stored: {other:?}"),
    };
    assert_eq!(stored_now, 9_000, "every answer stored now");
    let waiting = redis.take_drained(10_000).await.unwrap();
    assert_eq!(waiting.len(), 9_000, "every answer waits for its copy");
    assert_eq!(waiting[8_999], "answer 8999");
}

#[tokio::test]
async fn sold_out_answers_under_batched_come_from_redis() {
    sold_out_answers_come_from_redis(OrderStrategy::Batched).await;
}

#[tokio::test]
async fn sold_out_answers_under_redis_lock_come_from_redis() {
    sold_out_answers_come_from_redis(OrderStrategy::RedisLock).await;
}
