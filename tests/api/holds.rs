//! Checkout holds: reserved under contention, confirmed once, released once.

use std::time::{Duration, Instant};

use futures_util::future::join_all;
use uuid::Uuid;

use crate::helpers::{TestApp, serve_app, spawn_app, spawn_app_with, test_settings};

/// POSTs an API hold.
async fn post_hold(
    client: &reqwest::Client,
    base: &str,
    key: &str,
    lines: &[(&str, i64)],
) -> reqwest::Response {
    crate::helpers::post_lines(client, &format!("{base}/api/v1/holds"), key, lines).await
}

async fn confirm(client: &reqwest::Client, base: &str, hold: &str) -> reqwest::Response {
    client
        .post(format!("{base}/api/v1/holds/{hold}/confirm"))
        .send()
        .await
        .unwrap()
}

/// Waits until `sql` counts `expected`, for up to `limit`.
async fn eventually(app: &TestApp, sql: &'static str, expected: i64, limit: Duration) {
    let started = Instant::now();
    loop {
        let n = app.count(sql).await;
        if n == expected {
            return;
        }
        assert!(started.elapsed() < limit, "{sql}: {n}, expected {expected}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// I6: no active hold past its expiry, no lease left.
async fn assert_quiet(app: &TestApp) {
    let stale = app
        .count("select count(*) from holds where state = 'active' and expires_at < now()")
        .await;
    assert_eq!(stale, 0, "I6: expired holds still active");
    assert!(
        app.leftover_leases().await.is_empty(),
        "I6: lease keys left"
    );
}

#[tokio::test]
async fn three_hundred_shoppers_hold_fifty_units_then_thirty_confirm_and_twenty_expire() {
    let app = spawn_app().await;
    app.add_product("DROP-50", "Fifty of them", 9_900, 50).await;
    // Holds last long enough that none expires while 300 shoppers queue on a busy
    // machine; the twenty that walk away are then made due by hand (below).
    let extra = [
        ("STOCKADE_HOLD_SECONDS", "600".to_string()),
        ("STOCKADE_SWEEP_INTERVAL_MS", "200".to_string()),
        ("STOCKADE_LEASE_WAIT_MS", "10000".to_string()),
        ("STOCKADE_REQUEST_BUDGET_MS", "30000".to_string()),
    ];
    let servers = [
        serve_app(&app, &extra, &[]).await,
        serve_app(&app, &extra, &[]).await,
    ];
    stockade::install_tls_provider();
    let client = reqwest::Client::new();
    let answers = join_all((0..300).map(|i| {
        let (client, base) = (client.clone(), servers[i % 2].address.clone());
        async move {
            let res = post_hold(&client, &base, &format!("shopper-{i}"), &[("DROP-50", 1)]).await;
            let status = res.status().as_u16();
            let body: serde_json::Value = res.json().await.unwrap();
            (status, body)
        }
    }))
    .await;
    let granted: Vec<String> = answers
        .iter()
        .filter(|(s, _)| *s == 201)
        .map(|(_, b)| b["id"].as_str().unwrap().to_string())
        .collect();
    let refused = answers.iter().filter(|(s, _)| *s == 409).count();
    assert_eq!(
        granted.len(),
        50,
        "{:?}",
        answers.iter().map(|a| a.0).collect::<Vec<_>>()
    );
    assert_eq!(refused, 250);
    assert_eq!(app.stock("DROP-50").await, (50, 50), "reserved = 50");
    let product: serde_json::Value = app
        .get("/api/v1/products/DROP-50")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(product["available"], 0);

    // Thirty confirm (through both processes); twenty walk away.
    let confirmed = join_all(granted[..30].iter().enumerate().map(|(i, hold)| {
        let (client, base) = (client.clone(), servers[i % 2].address.clone());
        async move { confirm(&client, &base, hold).await.status().as_u16() }
    }))
    .await;
    assert!(confirmed.iter().all(|s| *s == 201), "{confirmed:?}");

    // The twenty left reach their expiry now; the servers' sweepers release them.
    sqlx::query!("update holds set expires_at = now() where state = 'active'")
        .execute(&app.db)
        .await
        .unwrap();
    eventually(
        &app,
        "select count(*) from holds where state = 'expired'",
        20,
        Duration::from_secs(30),
    )
    .await;
    assert_eq!(app.stock("DROP-50").await, (20, 0));
    assert_eq!(app.count("select count(*) from orders").await, 30);
    assert_eq!(
        app.count("select count(*) from stock_movements where reason = 'expire'")
            .await,
        20,
        "one release row per expired hold"
    );
    app.assert_invariants().await;
    assert_quiet(&app).await;
}

#[tokio::test]
async fn competing_sweepers_release_each_expired_hold_exactly_once() {
    let mut settings = test_settings().await;
    settings.hold_ttl = Duration::from_secs(1);
    settings.sweep_interval = Duration::from_secs(3600); // this process does not sweep
    // Patient: 200 holds queue for two SKUs at once; what is tested is the sweeping.
    settings.lease_wait = Duration::from_secs(10);
    settings.request_budget = Duration::from_secs(30);
    let app = spawn_app_with(settings).await;
    app.add_product("SWEEP-A", "A", 100, 1_000).await;
    app.add_product("SWEEP-B", "B", 100, 1_000).await;
    let app_ref = &app;
    let holds = join_all((0..200).map(|i| async move {
        let app = app_ref;
        let lines: &[(&str, i64)] = if i % 2 == 0 {
            &[("SWEEP-A", 2), ("SWEEP-B", 1)]
        } else {
            &[("SWEEP-B", 3)]
        };
        post_hold(&app.client, &app.address, &format!("sweep-{i}"), lines)
            .await
            .status()
            .as_u16()
    }))
    .await;
    assert!(holds.iter().all(|s| *s == 201), "{holds:?}");
    assert_eq!(app.stock("SWEEP-A").await.1, 200);
    assert_eq!(app.stock("SWEEP-B").await.1, 400);

    // Two server processes sweep every 20 ms, and this test sweeps too, all at once.
    let extra = [("STOCKADE_SWEEP_INTERVAL_MS", "20".to_string())];
    let _a = serve_app(&app, &extra, &[]).await;
    let _b = serve_app(&app, &extra, &[]).await;
    let redis = stockade::locking::Redis::connect_lazy(
        app.settings.redis_url.as_deref().unwrap(),
        &app.settings.redis_prefix,
    )
    .unwrap();
    // Four more sweepers in this process, in small batches, racing through the expiry.
    let mine: usize = join_all((0..4).map(|_| async {
        let mut released = 0;
        let until = Instant::now() + Duration::from_millis(2500);
        while Instant::now() < until {
            released += stockade::holds::sweep(&app.db, &redis, 7).await.unwrap();
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        released
    }))
    .await
    .into_iter()
    .sum();
    eventually(
        &app,
        "select count(*) from holds where state = 'expired'",
        200,
        Duration::from_secs(20),
    )
    .await;
    println!("this test's sweeps released {mine} of 200");

    let twice = app
        .count(
            "select count(*) from (select reference, sku from stock_movements where reason = 'expire' \
             group by reference, sku having count(*) > 1) t",
        )
        .await;
    assert_eq!(twice, 0, "no hold line released twice");
    assert_eq!(
        app.count("select count(*) from stock_movements where reason = 'expire'")
            .await,
        300,
        "one row per hold line"
    );
    assert_eq!(app.stock("SWEEP-A").await, (1_000, 0));
    assert_eq!(app.stock("SWEEP-B").await, (1_000, 0));
    app.assert_invariants().await;
}

#[tokio::test]
async fn confirming_twice_at_once_makes_one_order() {
    let app = spawn_app().await;
    app.add_product("TWICE-1", "Twice", 1_000, 5).await;
    let hold: serde_json::Value = post_hold(&app.client, &app.address, "h", &[("TWICE-1", 2)])
        .await
        .json()
        .await
        .unwrap();
    let id = hold["id"].as_str().unwrap().to_string();
    let answers = join_all((0..10).map(|_| async {
        let res = confirm(&app.client, &app.address, &id).await;
        let status = res.status().as_u16();
        let body: serde_json::Value = res.json().await.unwrap();
        (status, body["id"].as_str().unwrap().to_string())
    }))
    .await;
    assert!(answers.iter().all(|(s, _)| *s == 201), "{answers:?}");
    assert!(
        answers.iter().all(|(_, o)| *o == answers[0].1),
        "{answers:?}"
    );
    assert_eq!(app.count("select count(*) from orders").await, 1);
    assert_eq!(app.stock("TWICE-1").await, (3, 0));
    let hold: serde_json::Value = app
        .get(&format!("/api/v1/holds/{id}"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(hold["state"], "confirmed");
    assert_eq!(hold["order_id"], answers[0].1.as_str());
    app.assert_invariants().await;
}

#[tokio::test]
async fn confirming_after_expiry_orders_from_free_stock_or_says_409() {
    let mut settings = test_settings().await;
    settings.hold_ttl = Duration::from_secs(1);
    settings.sweep_interval = Duration::from_secs(3600);
    let app = spawn_app_with(settings).await;
    app.add_product("LATE-1", "Late but lucky", 1_000, 5).await;
    app.add_product("LATE-2", "Late and unlucky", 1_000, 1)
        .await;
    let hold = |sku: &'static str, key: &'static str| {
        let app = &app;
        async move {
            let body: serde_json::Value = post_hold(&app.client, &app.address, key, &[(sku, 1)])
                .await
                .json()
                .await
                .unwrap();
            body["id"].as_str().unwrap().to_string()
        }
    };
    let lucky = hold("LATE-1", "lucky").await;
    let unlucky = hold("LATE-2", "unlucky").await;
    tokio::time::sleep(Duration::from_millis(1200)).await;

    // Expired but not yet swept, and stock remains: the order goes through.
    let res = confirm(&app.client, &app.address, &lucky).await;
    assert_eq!(res.status().as_u16(), 201);
    assert_eq!(app.stock("LATE-1").await, (4, 0));

    // Expired, swept, and the last unit sold to someone else: 409, nothing written.
    let redis = stockade::locking::Redis::connect_lazy(
        app.settings.redis_url.as_deref().unwrap(),
        &app.settings.redis_prefix,
    )
    .unwrap();
    assert_eq!(
        stockade::holds::sweep(&app.db, &redis, 100).await.unwrap(),
        1
    );
    assert_eq!(
        app.post_order("someone", &[("LATE-2", 1)])
            .await
            .status()
            .as_u16(),
        201
    );
    let res = confirm(&app.client, &app.address, &unlucky).await;
    assert_eq!(res.status().as_u16(), 409);
    let problem: serde_json::Value = res.json().await.unwrap();
    assert_eq!(problem["shortages"][0]["sku"], "LATE-2");
    assert_eq!(app.stock("LATE-2").await, (0, 0));
    assert_eq!(app.count("select count(*) from orders").await, 2);
    app.assert_invariants().await;
}

#[tokio::test]
async fn a_checkout_may_hold_only_so_many_of_one_product() {
    let app = spawn_app().await;
    app.add_product("CAP-1", "Capped", 1_000, 100).await;
    let res = post_hold(&app.client, &app.address, "greedy", &[("CAP-1", 6)]).await;
    assert_eq!(res.status().as_u16(), 422);
    let problem: serde_json::Value = res.json().await.unwrap();
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("at most 5 of CAP-1"),
        "{problem}"
    );
    assert_eq!(app.stock("CAP-1").await, (100, 0));
    let res = post_hold(&app.client, &app.address, "modest", &[("CAP-1", 5)]).await;
    assert_eq!(res.status().as_u16(), 201);
}

#[tokio::test]
async fn releasing_a_hold_returns_its_stock_once() {
    let app = spawn_app().await;
    app.add_product("REL-1", "Released", 1_000, 3).await;
    let hold: serde_json::Value = post_hold(&app.client, &app.address, "r", &[("REL-1", 3)])
        .await
        .json()
        .await
        .unwrap();
    let id = hold["id"].as_str().unwrap();
    assert!(Uuid::parse_str(id).is_ok());
    assert_eq!(
        app.post_order("blocked", &[("REL-1", 1)])
            .await
            .status()
            .as_u16(),
        409
    );

    let deletes = join_all((0..5).map(|_| {
        app.client
            .delete(app.url(&format!("/api/v1/holds/{id}")))
            .send()
    }))
    .await;
    assert!(
        deletes
            .iter()
            .all(|r| r.as_ref().unwrap().status().as_u16() == 204)
    );
    assert_eq!(app.stock("REL-1").await, (3, 0));
    assert_eq!(
        app.count("select count(*) from stock_movements where reason = 'release'")
            .await,
        1
    );
    assert_eq!(
        confirm(&app.client, &app.address, id)
            .await
            .status()
            .as_u16(),
        409
    );
    assert_eq!(
        app.post_order("now-free", &[("REL-1", 1)])
            .await
            .status()
            .as_u16(),
        201
    );
    app.assert_invariants().await;
}

#[tokio::test]
async fn sweeping_ten_thousand_expired_holds_while_shoppers_keep_buying() {
    let mut settings = test_settings().await;
    settings.sweep_interval = Duration::from_secs(3600);
    let app = spawn_app_with(settings).await;
    app.add_product("MASS-1", "Mass", 100, 20_000).await;
    app.add_product("MASS-2", "Mass too", 100, 20_000).await;
    app.add_product("SHOP-1", "Bought meanwhile", 100, 100_000)
        .await;
    // 10,000 expired holds of one unit each, written directly (as if placed an hour ago).
    sqlx::query!(
        r#"with h as (
             insert into holds (id, state, expires_at, idempotency_scope, idempotency_key)
             select gen_random_uuid(), 'active', now() - interval '1 hour', 'bench', g::text
               from generate_series(1, 10000) g
             returning id, idempotency_key::int as n)
           insert into hold_lines (hold_id, sku, quantity, unit_price_cents)
           select id, case when n % 2 = 0 then 'MASS-1' else 'MASS-2' end, 1, 100 from h"#
    )
    .execute(&app.db)
    .await
    .unwrap();
    sqlx::query!(
        r#"insert into stock_movements (sku, delta, reserved_delta, reason, reference, actor)
           select l.sku, 0, l.quantity, 'hold', l.hold_id::text, 'bench' from hold_lines l"#
    )
    .execute(&app.db)
    .await
    .unwrap();
    sqlx::query!("update stock set reserved = 5000 where sku in ('MASS-1', 'MASS-2')")
        .execute(&app.db)
        .await
        .unwrap();

    let shoppers = |label: &'static str, stop: Duration| {
        let app = &app;
        async move {
            let mut latencies = Vec::new();
            let started = Instant::now();
            let mut i = 0;
            while started.elapsed() < stop {
                let t = Instant::now();
                let res = app
                    .post_order(&format!("{label}-{i}"), &[("SHOP-1", 1)])
                    .await;
                assert_eq!(res.status().as_u16(), 201);
                latencies.push(t.elapsed());
                i += 1;
            }
            latencies.sort();
            latencies
        }
    };
    let p = |l: &[Duration], q: f64| l[((l.len() - 1) as f64 * q) as usize].as_secs_f64() * 1e3;

    let quiet = shoppers("quiet", Duration::from_secs(2)).await;
    let redis = stockade::locking::Redis::connect_lazy(
        app.settings.redis_url.as_deref().unwrap(),
        &app.settings.redis_prefix,
    )
    .unwrap();
    let sweep = async {
        let t = Instant::now();
        let n = stockade::holds::sweep(&app.db, &redis, stockade::holds::SWEEP_BATCH)
            .await
            .unwrap();
        (n, t.elapsed())
    };
    let ((released, took), busy) = tokio::join!(sweep, shoppers("busy", Duration::from_secs(2)));
    println!(
        "sweeper released {released} expired holds in {:.0} ms; shoppers' order p50/p99: \
         quiet {:.1}/{:.1} ms ({} orders), during the sweep {:.1}/{:.1} ms ({} orders)",
        took.as_secs_f64() * 1e3,
        p(&quiet, 0.5),
        p(&quiet, 0.99),
        quiet.len(),
        p(&busy, 0.5),
        p(&busy, 0.99),
        busy.len()
    );
    assert_eq!(released, 10_000);
    assert_eq!(app.stock("MASS-1").await, (20_000, 0));
    assert_eq!(app.stock("MASS-2").await, (20_000, 0));
    assert_eq!(
        app.count("select count(*) from stock_movements where reason = 'expire'")
            .await,
        10_000
    );
    app.assert_invariants().await;
}

#[tokio::test]
async fn confirmations_and_releases_racing_across_two_processes_settle_each_hold_once() {
    let app = spawn_app().await;
    app.add_product("RACE-60", "Sixty of them", 2_500, 60).await;
    // Eighty requests at once on two processes whose pools are smaller: on a loaded
    // machine some wait seconds for a connection or a row lock. That is shed with 503 in
    // production; this test is about how the races settle, so it waits.
    let extra = [
        ("STOCKADE_REQUEST_BUDGET_MS", "30000".to_string()),
        ("STOCKADE_DB_ACQUIRE_TIMEOUT_MS", "15000".to_string()),
        ("STOCKADE_STATEMENT_TIMEOUT_MS", "10000".to_string()),
        ("STOCKADE_TX_TIMEOUT_MS", "10000".to_string()),
    ];
    let servers = [
        serve_app(&app, &extra, &[]).await,
        serve_app(&app, &extra, &[]).await,
    ];
    stockade::install_tls_provider();
    let client = reqwest::Client::new();
    let mut holds = Vec::new();
    for i in 0..60 {
        let res = post_hold(
            &client,
            &servers[0].address,
            &format!("r-{i}"),
            &[("RACE-60", 1)],
        )
        .await;
        assert_eq!(res.status().as_u16(), 201);
        let hold: serde_json::Value = res.json().await.unwrap();
        holds.push(hold["id"].as_str().unwrap().to_string());
    }
    // Holds 0–39 are confirmed, 20–59 released, all at once, each through either process:
    // 20–39 race a confirmation against a release.
    let confirms = join_all(holds[..40].iter().enumerate().map(|(i, hold)| {
        let (client, base) = (client.clone(), servers[i % 2].address.clone());
        async move { confirm(&client, &base, hold).await.status().as_u16() }
    }));
    let releases = join_all(holds[20..].iter().enumerate().map(|(i, hold)| {
        let (client, base) = (client.clone(), servers[(i + 1) % 2].address.clone());
        async move {
            let url = format!("{base}/api/v1/holds/{hold}");
            client.delete(url).send().await.unwrap().status().as_u16()
        }
    }));
    let (confirmed, released) = tokio::join!(confirms, releases);
    assert!(
        confirmed.iter().all(|s| [201, 409].contains(s)),
        "{confirmed:?}"
    );
    assert!(
        released.iter().all(|s| [204, 409].contains(s)),
        "{released:?}"
    );
    assert!(confirmed[..20].iter().all(|s| *s == 201), "{confirmed:?}");
    assert!(released[20..].iter().all(|s| *s == 204), "{released:?}");
    // The racing twenty: each one way, never both.
    for i in 20..40 {
        let (c, r) = (confirmed[i], released[i - 20]);
        assert!(
            (c == 201) != (r == 204),
            "hold {i}: confirm {c}, release {r}"
        );
    }
    let placed = confirmed.iter().filter(|s| **s == 201).count() as i64;
    assert_eq!(app.count("select count(*) from orders").await, placed);
    assert_eq!(
        app.count("select count(*) from holds where state = 'confirmed' and order_id is not null")
            .await,
        placed
    );
    assert_eq!(
        app.count("select count(*) from holds where state = 'released'")
            .await,
        60 - placed
    );
    assert_eq!(
        app.count("select count(*) from events where type = 'hold.confirmed'")
            .await,
        placed
    );
    assert_eq!(app.stock("RACE-60").await, (60 - placed as i32, 0));
    app.assert_invariants().await;
    assert_quiet(&app).await;
}
