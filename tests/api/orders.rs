//! Orders under concurrency, across server processes, with retries and faults.

use std::time::{Duration, Instant};

use futures_util::future::join_all;
use rand::seq::SliceRandom;
use stockade::catalog::Sku;
use stockade::config::{OrderStrategy, Settings};

use crate::helpers::{
    ServerProcess, TestApp, post_order_to, serve_app, spawn_app, spawn_app_with,
    spawn_app_with_own_redis, test_settings,
};

/// What a hot-SKU race ended with.
#[derive(Debug)]
struct Race {
    created: usize,
    conflicts: usize,
    other: Vec<u16>,
    orders: i64,
    on_hand: i32,
    wall: Duration,
    peak_rss_kib: Vec<u64>,
}

/// `buyers` concurrent buyers of one unit of a SKU with `stock` units, spread over two
/// `stockade serve` processes sharing one database and Redis.
async fn hot_sku_race(strategy: &str, stock: i32, buyers: usize) -> (TestApp, Race) {
    let app = spawn_app().await;
    app.add_product("HOT-1", "Hot thing", 4_900, stock).await;
    // A generous lease wait: on a loaded machine a buyer must not give up (503) before the
    // sold-out answer reaches it; what is measured here is what is sold.
    let extra = [
        ("STOCKADE_ORDER_STRATEGY", strategy.to_string()),
        ("STOCKADE_LEASE_WAIT_MS", "10000".to_string()),
        ("STOCKADE_REQUEST_BUDGET_MS", "30000".to_string()),
        ("STOCKADE_DB_ACQUIRE_TIMEOUT_MS", "10000".to_string()),
    ];
    let args: &[&str] = if strategy == "naive-unsafe" {
        &["--allow-unsafe"]
    } else {
        &[]
    };
    let servers = [
        serve_app(&app, &extra, args).await,
        serve_app(&app, &extra, args).await,
    ];
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(buyers)
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let started = Instant::now();
    let answers = join_all((0..buyers).map(|i| {
        let (client, base) = (client.clone(), servers[i % 2].address.clone());
        async move {
            post_order_to(&client, &base, &format!("buyer-{i}"), &[("HOT-1", 1)])
                .await
                .status()
                .as_u16()
        }
    }))
    .await;
    let wall = started.elapsed();
    let race = Race {
        created: answers.iter().filter(|s| **s == 201).count(),
        conflicts: answers.iter().filter(|s| **s == 409).count(),
        other: answers
            .into_iter()
            .filter(|s| *s != 201 && *s != 409)
            .collect(),
        orders: app.count("select count(*) from orders").await,
        on_hand: app.stock("HOT-1").await.0,
        wall,
        peak_rss_kib: servers
            .iter()
            .filter_map(ServerProcess::peak_rss_kib)
            .collect(),
    };
    println!(
        "{strategy}: {buyers} buyers in {:.0} ms ({:.0} requests/s), {} orders, peak RSS {:?} KiB",
        race.wall.as_secs_f64() * 1e3,
        buyers as f64 / race.wall.as_secs_f64(),
        race.orders,
        race.peak_rss_kib
    );
    (app, race)
}

async fn assert_hot_sku_never_oversells(strategy: &str) {
    let (app, race) = hot_sku_race(strategy, 10, 200).await;
    assert_eq!(race.created, 10, "{strategy}: {race:?}");
    assert_eq!(race.conflicts, 190, "{strategy}: {race:?}");
    assert!(race.other.is_empty(), "{strategy}: {race:?}");
    assert_eq!(race.orders, 10);
    assert_eq!(race.on_hand, 0);
    app.assert_invariants().await;
    assert!(
        app.leftover_leases().await.is_empty(),
        "no lease key left behind"
    );
}

#[tokio::test]
async fn hot_sku_with_redis_leases_sells_exactly_its_stock_across_two_processes() {
    assert_hot_sku_never_oversells("redis-lock").await;
}

#[tokio::test]
async fn hot_sku_with_the_database_guard_alone_sells_exactly_its_stock() {
    assert_hot_sku_never_oversells("pg-atomic").await;
}

#[tokio::test]
async fn hot_sku_batched_sells_exactly_its_stock_across_two_processes() {
    assert_hot_sku_never_oversells("batched").await;
}

#[tokio::test]
async fn a_batch_gives_each_request_its_own_answer() {
    let app = spawn_app_with(Settings {
        order_strategy: OrderStrategy::Batched,
        // Long enough that the requests below meet in one batch.
        batch_wait: Duration::from_millis(400),
        ..test_settings().await
    })
    .await;
    app.add_product("BATCH-1", "Batched", 1_000, 4).await;
    let earlier = app.post_order("replayed", &[("BATCH-1", 1)]).await;
    assert_eq!(earlier.status().as_u16(), 201);
    let earlier: serde_json::Value = earlier.json().await.unwrap();
    // A key used for another request, and one whose first request is still running.
    sqlx::query!(r#"insert into idempotency_keys (scope, key, fingerprint, state, owner, response_status, response_body, completed_at)
           values ('api', 'anon:mismatch', 'another request', 'completed', gen_random_uuid(), 409, '{}', now())"#)
    .execute(&app.db)
    .await
    .unwrap();
    let same_request = stockade::checkout::OrderRequest::new(
        vec![(Sku::parse("BATCH-1").unwrap(), 1)],
        None,
        None,
        10,
    )
    .unwrap()
    .fingerprint();
    sqlx::query!(
        r#"insert into idempotency_keys (scope, key, fingerprint, state, owner)
           values ('api', 'anon:busy', $1, 'in_flight', gen_random_uuid())"#,
        same_request.as_str()
    )
    .execute(&app.db)
    .await
    .unwrap();

    // Six new keys (one sent twice) for the three units left, and the three old keys.
    let keys = [
        "new-1", "new-2", "new-3", "new-4", "new-5", "twin", "twin", "replayed", "mismatch", "busy",
    ];
    let app_ref = &app;
    let answers = join_all(keys.iter().map(|key| async move {
        let res = app_ref.post_order(key, &[("BATCH-1", 1)]).await;
        let status = res.status().as_u16();
        let retry_after = res.headers().contains_key("retry-after");
        let body: serde_json::Value = res.json().await.unwrap();
        (*key, status, retry_after, body)
    }))
    .await;
    let answer = |key: &str| {
        answers
            .iter()
            .filter(|(k, ..)| *k == key)
            .map(|(_, status, retry_after, body)| (*status, *retry_after, body.clone()))
            .collect::<Vec<_>>()
    };
    let new_keys = ["new-1", "new-2", "new-3", "new-4", "new-5", "twin"];
    let placed: Vec<&str> = new_keys
        .iter()
        .copied()
        .filter(|k| answer(k)[0].0 == 201)
        .collect();
    assert_eq!(placed.len(), 3, "three units, three orders: {answers:?}");
    for key in new_keys.iter().filter(|k| !placed.contains(k)) {
        let (status, _, body) = &answer(key)[0];
        assert_eq!(*status, 409, "{key}: {body}");
        assert_eq!(body["shortages"][0]["available"], 0, "{key}: {body}");
    }
    let twin = answer("twin");
    assert_eq!(twin[0].0, twin[1].0, "one key, one answer: {twin:?}");
    assert_eq!(
        twin[0].2["id"], twin[1].2["id"],
        "one key, one answer: {twin:?}"
    );
    let replayed = &answer("replayed")[0];
    assert_eq!((replayed.0, &replayed.2["id"]), (201, &earlier["id"]));
    assert_eq!(answer("mismatch")[0].0, 422);
    let busy = &answer("busy")[0];
    assert_eq!((busy.0, busy.1), (409, true), "{busy:?}");
    assert!(busy.2.get("shortages").is_none(), "{busy:?}");

    assert_eq!(app.count("select count(*) from orders").await, 4);
    assert_eq!(app.stock("BATCH-1").await.0, 0);
    app.assert_invariants().await;
    // The new orders met in few transactions.
    let metrics = app.metrics().await;
    let metric = |name: &str| -> f64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
            .unwrap_or_else(|| panic!("{name} missing: {metrics}"))
    };
    let (batches, batched) = (
        metric("stockade_batch_size_count"),
        metric("stockade_batch_size_sum"),
    );
    assert!(
        batched / batches > 1.5,
        "{batched} orders in {batches} batches"
    );
}

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

#[tokio::test]
async fn a_batch_whose_key_is_recorded_elsewhere_meanwhile_starts_again_without_it() {
    let app = spawn_app_with(Settings {
        order_strategy: OrderStrategy::Batched,
        ..test_settings().await
    })
    .await;
    app.add_product("RACE-1", "Raced", 1_000, 10).await;
    let fingerprint = stockade::checkout::OrderRequest::new(
        vec![(Sku::parse("RACE-1").unwrap(), 1)],
        None,
        None,
        10,
    )
    .unwrap()
    .fingerprint();
    // Another process is deciding the key: its record is written but not yet committed.
    let mut elsewhere = app.db.begin().await.unwrap();
    sqlx::query!(r#"insert into idempotency_keys
                  (scope, key, fingerprint, state, owner, response_status, response_body, completed_at)
           values ('api', 'anon:raced', $1, 'completed', gen_random_uuid(), 409,
                   '{"shortages": [{"sku": "RACE-1", "requested": 1, "available": 0}]}', now())"#, fingerprint.as_str())
    .execute(&mut *elsewhere)
    .await
    .unwrap();

    let app_ref = &app;
    let (raced, other) = tokio::join!(
        async move {
            let res = app_ref.post_order("raced", &[("RACE-1", 1)]).await;
            let replayed = res.headers().contains_key("idempotency-replayed");
            (
                res.status().as_u16(),
                replayed,
                res.json::<serde_json::Value>().await.unwrap(),
            )
        },
        async move {
            // The batch waits on the other record; it commits a moment later.
            tokio::time::sleep(Duration::from_millis(300)).await;
            elsewhere.commit().await.unwrap();
            app_ref
                .post_order("after", &[("RACE-1", 1)])
                .await
                .status()
                .as_u16()
        }
    );
    assert_eq!(other, 201);
    // The key's answer is the one recorded elsewhere, not a second decision.
    assert_eq!((raced.0, raced.1), (409, true), "{raced:?}");
    assert_eq!(raced.2["shortages"][0]["available"], 0);
    assert_eq!(
        app.count("select count(*) from orders where idempotency_key = 'anon:raced'")
            .await,
        0
    );
    assert_eq!(
        app.stock("RACE-1").await.0,
        9,
        "only the other order took a unit"
    );
    app.assert_invariants().await;
}

#[tokio::test]
async fn a_batch_spans_skus_and_an_order_whose_sku_is_leased_elsewhere_waits_alone() {
    let app = spawn_app_with(Settings {
        order_strategy: OrderStrategy::Batched,
        batch_wait: Duration::from_millis(300),
        lease_wait: Duration::from_millis(1500),
        ..test_settings().await
    })
    .await;
    for sku in ["WIDE-1", "WIDE-2", "WIDE-3", "WIDE-4"] {
        app.add_product(sku, sku, 500, 2).await;
    }
    // Another process holds WIDE-4's lease for 0.8 s.
    let mut redis = app.redis().await;
    let lease = format!("{}lease:WIDE-4", app.settings.redis_prefix);
    let _: () = redis::cmd("SET")
        .arg(&lease)
        .arg("someone-else")
        .arg("PX")
        .arg(800)
        .query_async(&mut redis)
        .await
        .unwrap();

    let started = Instant::now();
    let orders = [
        ("w1", "WIDE-1"),
        ("w2", "WIDE-2"),
        ("w3", "WIDE-3"),
        ("w3b", "WIDE-3"),
        ("w3c", "WIDE-3"),
        ("w4", "WIDE-4"),
    ];
    let app_ref = &app;
    let answers = join_all(orders.iter().map(|(key, sku)| async move {
        let res = app_ref.post_order(key, &[(sku, 1)]).await;
        (*key, res.status().as_u16(), started.elapsed())
    }))
    .await;
    let of = |key: &str| *answers.iter().find(|(k, ..)| *k == key).unwrap();
    for key in ["w1", "w2", "w4"] {
        assert_eq!(of(key).1, 201, "{answers:?}");
    }
    // Two units of WIDE-3: two of its three orders, in one batch with the others.
    let wide3: Vec<u16> = ["w3", "w3b", "w3c"].iter().map(|k| of(k).1).collect();
    assert_eq!(wide3.iter().filter(|s| **s == 201).count(), 2, "{wide3:?}");
    assert_eq!(wide3.iter().filter(|s| **s == 409).count(), 1, "{wide3:?}");
    // The others did not wait for WIDE-4's lease; WIDE-4's order did.
    assert!(of("w1").2 < Duration::from_millis(700), "{answers:?}");
    assert!(of("w4").2 >= Duration::from_millis(600), "{answers:?}");
    let metrics = app.metrics().await;
    let batches: f64 = metrics
        .lines()
        .find_map(|l| {
            l.strip_prefix("stockade_batch_size_count")?
                .trim()
                .parse()
                .ok()
        })
        .unwrap();
    assert_eq!(
        batches, 2.0,
        "one batch for five orders of three SKUs, one for WIDE-4"
    );

    // A lease held past the wait: that SKU's order gives up with 503, nothing written.
    let _: () = redis::cmd("SET")
        .arg(&lease)
        .arg("someone-else")
        .arg("PX")
        .arg(5_000)
        .query_async(&mut redis)
        .await
        .unwrap();
    let (late, other) = tokio::join!(
        app.post_order("w4-late", &[("WIDE-4", 1)]),
        app.post_order("w1-again", &[("WIDE-1", 1)])
    );
    assert_eq!(other.status().as_u16(), 201);
    assert_eq!(late.status().as_u16(), 503);
    assert!(late.headers().contains_key("retry-after"));
    assert_eq!(app.stock("WIDE-4").await.0, 1);
    assert_eq!(app.count("select count(*) from orders").await, 6);
    app.assert_invariants().await;
}

#[tokio::test]
async fn naive_read_then_write_oversells_the_same_race() {
    // Proves the race above can fail: the same buyers against read-check-write.
    let (app, race) = hot_sku_race("naive-unsafe", 10, 200).await;
    assert!(
        race.created > 10,
        "naive-unsafe was expected to oversell: {race:?}"
    );
    assert_eq!(race.orders as usize, race.created);
    // The ledger records every sale; the stock row lost updates, so they disagree.
    let mismatches = stockade::inventory::db::ledger_mismatches(&app.db)
        .await
        .unwrap();
    assert_eq!(mismatches.len(), 1, "{mismatches:?}");
}

#[tokio::test]
async fn naive_unsafe_refuses_to_start_without_allow_unsafe() {
    let app = spawn_app().await;
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_stockade"))
        .arg("serve")
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap())
        .env(
            "DATABASE_URL",
            app.settings.database_url.as_deref().unwrap(),
        )
        .env("REDIS_URL", app.settings.redis_url.as_deref().unwrap())
        .env("STOCKADE_ORDER_STRATEGY", "naive-unsafe")
        .env("STOCKADE_LISTEN", "127.0.0.1:0")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--allow-unsafe"));
}

#[tokio::test]
async fn naive_unsafe_shows_a_red_banner_on_every_page() {
    let mut settings = test_settings().await;
    settings.order_strategy = OrderStrategy::NaiveUnsafe;
    let app = spawn_app_with(settings).await;
    app.add_product("BAN-1", "Bannered", 100, 1).await;
    for path in ["/", "/products/BAN-1", "/cart", "/no-such-page"] {
        let (_, html) = app.get_text(path).await;
        assert!(html.contains("unsafe-banner"), "{path}");
    }
    let safe = spawn_app().await;
    let (_, html) = safe.get_text("/").await;
    assert!(!html.contains("unsafe-banner"));
}

#[tokio::test]
async fn multi_sku_orders_in_random_line_order_never_deadlock() {
    let app = spawn_app().await;
    let skus = ["MULTI-A", "MULTI-B", "MULTI-C", "MULTI-D"];
    for sku in skus {
        app.add_product(sku, sku, 1_000, 40).await;
    }
    let patient = [
        ("STOCKADE_LEASE_WAIT_MS", "10000".to_string()),
        ("STOCKADE_REQUEST_BUDGET_MS", "30000".to_string()),
        ("STOCKADE_DB_ACQUIRE_TIMEOUT_MS", "10000".to_string()),
    ];
    let servers = [
        serve_app(&app, &patient, &[]).await,
        serve_app(&app, &patient, &[]).await,
    ];
    stockade::install_tls_provider();
    let client = reqwest::Client::new();
    let answers = join_all((0..120).map(|i| {
        let (client, base) = (client.clone(), servers[i % 2].address.clone());
        let mut lines: Vec<(&str, i64)> = skus.iter().map(|s| (*s, 1 + (i % 2) as i64)).collect();
        lines.shuffle(&mut rand::rng());
        lines.truncate(2 + i % 3);
        async move {
            let res = post_order_to(&client, &base, &format!("multi-{i}"), &lines).await;
            res.status().as_u16()
        }
    }))
    .await;
    let unexpected: Vec<u16> = answers
        .iter()
        .copied()
        .filter(|s| *s != 201 && *s != 409)
        .collect();
    assert!(unexpected.is_empty(), "no 5xx, no deadlock: {unexpected:?}");
    let created = answers.iter().filter(|s| **s == 201).count() as i64;
    assert_eq!(app.count("select count(*) from orders").await, created);
    assert!(created > 0);
    app.assert_invariants().await;
    for sku in skus {
        let (on_hand, _) = app.stock(sku).await;
        let sold = sqlx::query_scalar!(
            r#"select coalesce(sum(quantity), 0)::bigint as "sold!" from order_lines where sku = $1"#,
            sku,
        )
        .fetch_one(&app.db)
        .await
        .unwrap();
        assert_eq!(i64::from(on_hand) + sold, 40, "{sku}");
    }
    assert!(app.leftover_leases().await.is_empty());
}

#[tokio::test]
async fn one_key_sent_twenty_times_at_once_makes_one_order() {
    let app = spawn_app().await;
    app.add_product("KEY-1", "Keyed", 2_500, 50).await;
    let answers = join_all((0..20).map(|_| async {
        let res = app.post_order("the-one-key", &[("KEY-1", 2)]).await;
        let status = res.status().as_u16();
        let retry_after = res.headers().contains_key("retry-after");
        let body: serde_json::Value = res.json().await.unwrap();
        (status, retry_after, body)
    }))
    .await;
    let orders = app.count("select count(*) from orders").await;
    assert_eq!(orders, 1);
    let id = sqlx::query_scalar!(r#"select id::text as "id!" from orders"#)
        .fetch_one(&app.db)
        .await
        .unwrap();
    for (status, retry_after, body) in &answers {
        match status {
            201 => assert_eq!(body["id"], id.as_str()),
            409 => assert!(*retry_after, "in-flight answers say when to retry"),
            other => panic!("unexpected {other}: {body}"),
        }
    }
    assert_eq!(app.stock("KEY-1").await.0, 48, "stock taken once");

    let res = app.post_order("the-one-key", &[("KEY-1", 2)]).await;
    assert_eq!(res.status().as_u16(), 201);
    assert_eq!(res.headers()["idempotency-replayed"], "true");
    let body: serde_json::Value = res.json().await.unwrap();
    assert_eq!(body["id"], id.as_str());
    app.assert_invariants().await;
}

#[tokio::test]
async fn the_same_key_with_another_body_is_refused_and_changes_nothing() {
    let app = spawn_app().await;
    app.add_product("KEY-2", "Keyed", 2_500, 50).await;
    let first = app.post_order("reused", &[("KEY-2", 1)]).await;
    assert_eq!(first.status().as_u16(), 201);
    let first: serde_json::Value = first.json().await.unwrap();

    let res = app.post_order("reused", &[("KEY-2", 3)]).await;
    assert_eq!(res.status().as_u16(), 422);
    let problem: serde_json::Value = res.json().await.unwrap();
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("different request")
    );

    assert_eq!(app.count("select count(*) from orders").await, 1);
    assert_eq!(app.stock("KEY-2").await.0, 49);
    let order: serde_json::Value = app
        .get(&format!("/api/v1/orders/{}", first["id"].as_str().unwrap()))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(order, first, "the first order is unchanged");
}

#[tokio::test]
async fn not_enough_stock_is_decided_once_and_replayed() {
    let app = spawn_app().await;
    app.add_product("SHORT-1", "Short", 1_000, 2).await;
    app.add_product("SHORT-2", "Plenty", 1_000, 50).await;
    let res = app
        .post_order("short", &[("SHORT-2", 1), ("SHORT-1", 3)])
        .await;
    assert_eq!(res.status().as_u16(), 409);
    assert_eq!(res.headers()["content-type"], "application/problem+json");
    let problem: serde_json::Value = res.json().await.unwrap();
    assert_eq!(
        problem["shortages"],
        serde_json::json!([{"sku": "SHORT-1", "requested": 3, "available": 2}])
    );
    assert!(problem["detail"].as_str().unwrap().contains("SHORT-1"));
    assert_eq!(app.stock("SHORT-1").await.0, 2);
    assert_eq!(app.stock("SHORT-2").await.0, 50, "nothing half-written");

    // Stock arrives, but the key's answer was decided: the retry gets the same 409.
    sqlx::query!("update stock set on_hand = 10 where sku = 'SHORT-1'")
        .execute(&app.db)
        .await
        .unwrap();
    let res = app
        .post_order("short", &[("SHORT-2", 1), ("SHORT-1", 3)])
        .await;
    assert_eq!(res.status().as_u16(), 409);
    assert_eq!(res.headers()["idempotency-replayed"], "true");
    assert_eq!(app.count("select count(*) from orders").await, 0);
}

#[tokio::test]
async fn a_late_lease_holder_can_neither_release_nor_outwrite_its_successor() {
    let app = spawn_app().await;
    app.add_product("FENCE-1", "Fenced", 1_000, 5).await;
    let redis = stockade::locking::Redis::connect_lazy(
        app.settings.redis_url.as_deref().unwrap(),
        &app.settings.redis_prefix,
    )
    .unwrap();
    let sku = stockade::catalog::Sku::parse("FENCE-1").unwrap();
    let grant = |r: stockade::locking::Acquire| match r {
        stockade::locking::Acquire::Granted(lease) => lease,
        other => panic!("expected a lease, got {other:?}"),
    };
    let skus = [sku.clone()];
    let late = grant(
        redis
            .acquire(&skus, Duration::from_millis(100), Duration::ZERO)
            .await,
    );
    // While held, nobody else gets it.
    assert!(matches!(
        redis
            .acquire(&skus, Duration::from_secs(5), Duration::from_millis(20))
            .await,
        stockade::locking::Acquire::Busy
    ));
    tokio::time::sleep(Duration::from_millis(150)).await;
    let next = grant(
        redis
            .acquire(&skus, Duration::from_secs(5), Duration::ZERO)
            .await,
    );
    assert!(next.fence > late.fence, "fencing tokens increase");

    // The successor writes; the late holder's write is refused by the stock row.
    let take = |fence: i64| {
        let (db, sku) = (app.db.clone(), sku.clone());
        async move {
            let mut tx = db.begin().await.unwrap();
            let r = stockade::inventory::db::take_stock(&mut tx, &sku, 1, Some(fence), "t", "test")
                .await
                .unwrap();
            tx.commit().await.unwrap();
            r
        }
    };
    assert_eq!(
        take(next.fence).await,
        stockade::inventory::db::Take::Taken { left: 4 }
    );
    assert_eq!(
        take(late.fence).await,
        stockade::inventory::db::Take::StaleFence {
            last_fence: next.fence
        }
    );
    assert_eq!(app.stock("FENCE-1").await.0, 4);

    // The late release leaves the successor's lease in place; the successor's own works.
    assert_eq!(redis.release(&late).await, 0);
    assert_eq!(app.leftover_leases().await.len(), 1);
    assert_eq!(redis.release(&next).await, 1);
    assert!(app.leftover_leases().await.is_empty());
}

#[tokio::test]
async fn a_stalled_holder_whose_lease_expired_is_fenced_off_and_retries() {
    // Process A stalls after taking its lease, longer than the lease lives.
    let mut slow = test_settings().await;
    slow.lease_ttl = Duration::from_millis(300);
    slow.tx_timeout = Duration::from_millis(250);
    slow.statement_timeout = Duration::from_millis(250);
    slow.fault_pause_after_lease = Duration::from_millis(1_500);
    let app_a = spawn_app_with(slow.clone()).await;
    app_a.add_product("STALL-1", "Stalled", 1_000, 2).await;
    // Process B shares the database and Redis, and does not stall.
    let mut fast = slow.clone();
    fast.fault_pause_after_lease = Duration::ZERO;
    fast.listen = "127.0.0.1:0".parse().unwrap();
    let app_b = spawn_app_with(fast).await;

    let a = app_a.post_order("stalled", &[("STALL-1", 1)]);
    let b = async {
        tokio::time::sleep(Duration::from_millis(400)).await;
        app_b.post_order("prompt", &[("STALL-1", 1)]).await
    };
    let (a, b) = tokio::join!(a, b);
    assert_eq!(b.status().as_u16(), 201, "B bought while A stalled");
    assert_eq!(a.status().as_u16(), 201, "A retried under a fresh lease");
    assert_eq!(app_a.stock("STALL-1").await.0, 0);
    assert_eq!(app_a.count("select count(*) from orders").await, 2);
    app_a.assert_invariants().await;
    let metrics = app_a.metrics().await;
    assert!(
        metrics.contains("stockade_stale_fence_refusals_total 1"),
        "A's first write was refused: {metrics}"
    );
}

/// One concurrent buyer of one `DOWN-1` per key in `range`; their statuses.
async fn buy(app: &TestApp, range: std::ops::Range<usize>) -> Vec<u16> {
    join_all(range.map(|i| async move {
        app.post_order(&format!("down-{i}"), &[("DOWN-1", 1)])
            .await
            .status()
            .as_u16()
    }))
    .await
}

#[tokio::test]
async fn orders_continue_on_the_database_guard_while_redis_is_down() {
    let mut app = spawn_app_with_own_redis().await;
    app.add_product("DOWN-1", "Downtime", 1_000, 30).await;
    let before = buy(&app, 0..20).await;
    assert!(before.iter().all(|s| *s == 201), "{before:?}");

    app.stop_redis();
    let during = buy(&app, 20..60).await;
    assert_eq!(
        during.iter().filter(|s| **s == 201).count(),
        10,
        "{during:?}"
    );
    assert_eq!(
        during.iter().filter(|s| **s == 409).count(),
        30,
        "{during:?}"
    );
    assert_eq!(app.stock("DOWN-1").await.0, 0);
    let ready: serde_json::Value = app.get("/readyz").await.json().await.unwrap();
    assert_eq!(ready["order_guard"], "degraded");
    assert!(app.lease_layer_degraded().await);

    // Redis returns (empty): the breaker closes within a second, and leases are used
    // again, without a restart.
    app.restart_redis().await;
    app.assert_leases_back_within_a_second().await;
    sqlx::query!("update stock set on_hand = 5 where sku = 'DOWN-1'")
        .execute(&app.db)
        .await
        .unwrap();
    sqlx::query!("insert into stock_movements (sku, delta, reason, actor) values ('DOWN-1', 5, 'restock', 'test')")
    .execute(&app.db)
    .await
    .unwrap();
    let after = buy(&app, 60..70).await;
    assert_eq!(after.iter().filter(|s| **s == 201).count(), 5, "{after:?}");
    let mut conn = app.redis().await;
    let fence: Option<i64> = redis::cmd("GET")
        .arg(format!("{}fence", app.settings.redis_prefix))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(
        fence.is_some_and(|f| f >= 5),
        "the restarted Redis issued leases: {fence:?}"
    );
    let metrics = app.metrics().await;
    assert!(
        metrics.contains("stockade_lease_layer_degraded 0"),
        "{metrics}"
    );
    app.assert_invariants().await;
    assert_eq!(app.count("select count(*) from orders").await, 35);
}

#[tokio::test]
async fn orders_holds_and_their_events_get_time_ordered_ids() {
    let app = spawn_app().await;
    app.add_product("V7-1", "Ordered", 1_000, 100).await;
    let mut ids = Vec::new();
    for key in ["v7-a", "v7-b", "v7-c"] {
        let res = app.post_order(key, &[("V7-1", 1)]).await;
        assert_eq!(res.status().as_u16(), 201);
        let body: serde_json::Value = res.json().await.unwrap();
        ids.push(body["id"].as_str().unwrap().parse::<uuid::Uuid>().unwrap());
    }
    let hold = app.place_hold("v7-hold", &[("V7-1", 1)]).await;
    ids.push(hold["id"].as_str().unwrap().parse().unwrap());
    assert!(ids.iter().all(|id| id.get_version_num() == 7), "{ids:?}");
    // Ordered by their milliseconds (within one millisecond the rest is random).
    let millis = |ids: &[uuid::Uuid]| -> Vec<u64> {
        ids.iter()
            .map(|id| {
                let (secs, nanos) = id.get_timestamp().unwrap().to_unix();
                secs * 1_000 + u64::from(nanos) / 1_000_000
            })
            .collect()
    };
    let made = millis(&ids);
    assert!(
        made.windows(2).all(|w| w[0] <= w[1]),
        "made in order: {made:?}"
    );
    let events: Vec<uuid::Uuid> = sqlx::query_scalar("select id from events order by seq")
        .fetch_all(&app.db)
        .await
        .unwrap();
    assert!(events.len() >= 4, "{events:?}");
    assert!(
        events.iter().all(|id| id.get_version_num() == 7),
        "{events:?}"
    );
    let written = millis(&events);
    assert!(
        written.windows(2).all(|w| w[0] <= w[1]),
        "written in order: {written:?}"
    );
}
