//! Fault scenarios: each puts one fault into a running shop — a stalled or killed server,
//! a database or Redis that stops answering, restarts, or is overloaded — and checks what
//! the clients were told (one answer per key, every answer within the request budget)
//! and what the database holds (the invariants).

use std::time::{Duration, Instant};

use futures_util::future::join_all;
use stockade::config::Settings;
use stockade::local::{LocalPostgres, create_database};

use super::proxy::{FaultProxy, Mode};
use super::sale::{SKU, Sale, SaleReport};
use crate::helpers::{
    TestApp, serve_app, servers, spawn_app_with, spawn_app_with_own_redis_and, test_settings,
};

/// Production-sized budgets, a little tighter so scenarios stay short: every request
/// answers within two seconds.
pub(super) fn tight(s: Settings) -> Settings {
    Settings {
        request_budget: Duration::from_secs(2),
        // Twice production's, as tests share two cores with each other.
        db_acquire_timeout: Duration::from_millis(1_000),
        statement_timeout: Duration::from_millis(800),
        tx_timeout: Duration::from_millis(1_000),
        lease_wait: Duration::from_millis(700),
        lease_ttl: Duration::from_millis(1_000),
        redis_timeout: Duration::from_millis(250),
        ..s
    }
}

/// [`tight`] for a `stockade serve` process.
pub(super) fn tight_env() -> Vec<(&'static str, String)> {
    let s = tight(Settings::default());
    let ms = |d: Duration| d.as_millis().to_string();
    vec![
        ("STOCKADE_REQUEST_BUDGET_MS", ms(s.request_budget)),
        ("STOCKADE_DB_ACQUIRE_TIMEOUT_MS", ms(s.db_acquire_timeout)),
        ("STOCKADE_STATEMENT_TIMEOUT_MS", ms(s.statement_timeout)),
        ("STOCKADE_TX_TIMEOUT_MS", ms(s.tx_timeout)),
        ("STOCKADE_LEASE_WAIT_MS", ms(s.lease_wait)),
        ("STOCKADE_LEASE_TTL_MS", ms(s.lease_ttl)),
        ("STOCKADE_REDIS_TIMEOUT_MS", ms(s.redis_timeout)),
    ]
}

/// Longest a client waits for any answer: the budget, plus time to send and receive.
const ANSWER_WITHIN: Duration = Duration::from_millis(3_000);

fn sale(targets: &[String], buyers: usize) -> Sale<'_> {
    Sale {
        targets,
        buyers,
        pace: Duration::from_millis(40),
        give_up: Duration::from_secs(25),
        timeout: Duration::from_secs(10),
    }
}

/// After a sale through faults: one answer per key, each within the budget, and a
/// database that agrees with the buyers.
async fn assert_sale_survived(report: &SaleReport, app: &TestApp, initial: i32) {
    report.assert_one_answer_per_key();
    let worst = report.worst_latency();
    assert!(
        worst <= ANSWER_WITHIN,
        "an answer took {worst:?} ({:?})",
        report.statuses()
    );
    report.assert_matches(app, initial).await;
}

/// Orders one unit under `key`: the status, how long the answer took, the response.
async fn post(app: &TestApp, key: &str) -> (u16, Duration, reqwest::Response) {
    let started = Instant::now();
    let res = app.post_order(key, &[(SKU, 1)]).await;
    (res.status().as_u16(), started.elapsed(), res)
}

async fn order_id(res: reqwest::Response) -> String {
    let body: serde_json::Value = res.json().await.unwrap();
    body["id"].as_str().expect("an order id").to_string()
}

/// [`super::behind_database_proxy`], with 100 units of [`SKU`].
async fn behind_database_proxy(settings: Settings) -> (TestApp, FaultProxy) {
    let (app, proxy) = super::behind_database_proxy(settings).await;
    app.add_product(SKU, "Drop", 5_000, 100).await;
    (app, proxy)
}

#[tokio::test]
async fn a_process_that_wakes_after_its_key_was_taken_over_answers_with_the_order_that_exists() {
    // The retry's process treats an in-flight key as dead after its 4 s stale window.
    let settings = tight(test_settings().await);
    let retrying = spawn_app_with(settings.clone()).await;
    retrying.add_product(SKU, "Drop", 5_000, 10).await;
    // The first process stalls for 6 s after taking the lease, before its transaction.
    let stalled = spawn_app_with(Settings {
        fault_pause_after_lease: Duration::from_secs(6),
        request_budget: Duration::from_secs(30),
        ..settings
    })
    .await;

    let first = tokio::spawn({
        let (client, url) = (stalled.client.clone(), stalled.address.clone());
        async move { crate::helpers::post_order_to(&client, &url, "the-key", &[(SKU, 1)]).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The client gives up on the stalled process and retries the key elsewhere until it
    // is taken over.
    let deadline = Instant::now() + Duration::from_secs(10);
    let retried = loop {
        let (status, _, res) = post(&retrying, "the-key").await;
        match status {
            201 => break order_id(res).await,
            409 | 503 if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(250)).await
            }
            other => panic!("retry answered {other}: {}", res.text().await.unwrap()),
        }
    };

    let res = first.await.unwrap();
    assert_eq!(
        res.status().as_u16(),
        201,
        "the woken request answers with the order (never 422 for the same request)"
    );
    assert_eq!(
        res.headers()
            .get("idempotency-replayed")
            .map(|v| v.to_str().unwrap()),
        Some("true")
    );
    assert_eq!(order_id(res).await, retried, "one key, one order");
    assert_eq!(retrying.count("select count(*) from orders").await, 1);
    assert_eq!(retrying.stock(SKU).await.0, 9);
    retrying.assert_invariants().await;
}

/// `stockade_db_{pool}_{name}` of `app`'s `/metrics`: `pool` is `pool` (the process's)
/// or `leader_pool` (the group-commit leaders' own).
async fn pool_gauge(app: &TestApp, pool: &str, name: &str) -> u32 {
    gauge(&app.metrics().await, &format!("stockade_db_{pool}_{name}"))
}

/// Connections of `pool` (see [`pool_gauge`]) taken from it, in a call or in their ping on
/// release (both gauges from one reading).
async fn in_use(app: &TestApp, pool: &str) -> u32 {
    let metrics = app.metrics().await;
    let open = gauge(&metrics, &format!("stockade_db_{pool}_connections"));
    // (The app reads the two one after the other: a connection that came back between
    // them can count as idle and not yet as open.)
    open.saturating_sub(gauge(&metrics, &format!("stockade_db_{pool}_idle")))
}

/// Gauge `metric` in the text of a `/metrics` reading.
fn gauge(metrics: &str, metric: &str) -> u32 {
    let metric = format!("{metric} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&metric)?.parse().ok())
        .unwrap_or_else(|| panic!("{metric}is exported"))
}

#[tokio::test]
async fn requests_in_flight_when_the_database_network_dies_answer_503_within_the_budget() {
    // No event dispatch, hold sweeps or drop ticks, whose rounds would wait on the dead
    // network for `pg::ROUND_LIMIT` (a tick: `drops::TICK_LIMIT`, then again): the
    // connections counted below are the requests' alone.
    let (app, proxy) = behind_database_proxy(Settings {
        dispatch_interval: Duration::from_secs(3600),
        sweep_interval: Duration::from_secs(3600),
        drop_tick_interval: Duration::from_secs(3600),
        // Large enough for the group-commit leaders to have a pool of their own.
        db_pool_size: 12,
        ..tight(test_settings().await)
    })
    .await;
    for i in 0..3 {
        assert_eq!(post(&app, &format!("warm-{i}")).await.0, 201);
    }
    // Their batches ran on the leaders' own pool (the test's pool of 8 is split), whose
    // connections the orders below are cut off from.
    assert!(pool_gauge(&app, "leader_pool", "connections").await > 0);
    // Every connection back in its pool: one whose ping on release is in flight when the
    // network dies waits for the network (see `startup::pool_options`); the ones below
    // are cut off mid-call.
    let settled = Instant::now();
    while in_use(&app, "pool").await + in_use(&app, "leader_pool").await > 0 {
        assert!(
            settled.elapsed() < Duration::from_secs(5),
            "the pool never settled"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    proxy.set(Mode::Blackhole);
    let keys: Vec<String> = (0..8).map(|i| format!("cut-{i}")).collect();
    let app_ref = &app;
    let orders = join_all(keys.iter().map(|key| post(app_ref, key)));
    let pages = join_all(["/", "/products/DROP-1", "/api/v1/products/DROP-1"].map(
        |path| async move {
            let app = app_ref;
            let started = Instant::now();
            let res = app.get(path).await;
            (res.status().as_u16(), started.elapsed(), res)
        },
    ));
    let (orders, pages) = tokio::join!(orders, pages);
    for (status, elapsed, res) in orders {
        assert_eq!(status, 503, "an order while the database is unreachable");
        assert!(res.headers().contains_key("retry-after"));
        assert!(
            elapsed <= ANSWER_WITHIN,
            "an order answered after {elapsed:?}"
        );
    }
    for (status, elapsed, _) in pages {
        assert_eq!(status, 503, "a page while the database is unreachable");
        assert!(
            elapsed <= ANSWER_WITHIN,
            "a page answered after {elapsed:?}"
        );
    }

    // The connections those calls were cut off from are closed once their ping on release
    // goes unanswered, rather than held until TCP gives up (minutes): once the requests'
    // own work has been stopped (`checkout::work_limit`: twice the budget) and the ping's
    // limit (the statement timeout) has passed, the pool holds at most the connections
    // being opened for the stale-key purge, which asks for one every second and waits the
    // acquire timeout for it, and for the database probe (`pg::outage`), which asks for
    // one every 250 ms and waits a second.
    // The orders' batches were cut off from the leaders' connections: none of those is
    // held either (an idle one that nobody asks for stays, unpinged, until it is).
    let emptied_within = Duration::from_millis(2 * 2_000 + 800 + 1_500);
    let since = Instant::now();
    loop {
        let open = pool_gauge(&app, "pool", "connections").await;
        let leaders_held = in_use(&app, "leader_pool").await;
        if open <= 2 && leaders_held == 0 {
            break;
        }
        assert!(
            since.elapsed() < emptied_within,
            "{open} connections of the pool and {leaders_held} of the leaders' still held \
             {emptied_within:?} after the cut"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // The network returns: the same keys go through, once each.
    proxy.set(Mode::Pass);
    let deadline = Instant::now() + Duration::from_secs(10);
    for key in &keys {
        loop {
            let (status, ..) = post(&app, key).await;
            if status == 201 {
                break;
            }
            assert!(Instant::now() < deadline, "{key} still answered {status}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    assert_eq!(app.count("select count(*) from orders").await, 11);
    app.assert_invariants().await;
}

#[tokio::test]
async fn orders_stay_fast_on_the_database_guard_while_redis_stops_answering() {
    // Patient with the database, which is not what this test is about.
    let mut settings = Settings {
        db_acquire_timeout: Duration::from_secs(5),
        request_budget: Duration::from_secs(8),
        ..tight(test_settings().await)
    };
    let redis_url = settings.redis_url.as_deref().unwrap().to_string();
    let proxy = FaultProxy::in_front_of(&redis_url);
    settings.redis_url = Some(proxy.url(&redis_url).into());
    let app = spawn_app_with(settings).await;
    app.add_product(SKU, "Drop", 5_000, 1_000).await;
    assert_eq!(post(&app, "before").await.0, 201);

    proxy.set(Mode::Blackhole);
    let mut latencies = Vec::new();
    for round in 0..10 {
        let answers = join_all((0..6).map(|i| {
            let (app, key) = (&app, format!("down-{round}-{i}"));
            async move { post(app, &key).await }
        }))
        .await;
        for (status, elapsed, _) in answers {
            assert_eq!(status, 201);
            latencies.push(elapsed);
        }
    }
    latencies.sort();
    let median = latencies[latencies.len() / 2];
    assert!(
        median < Duration::from_millis(200),
        "orders wait on Redis while it is down: median {median:?}, all {latencies:?}"
    );
    assert!(app.lease_layer_degraded().await);

    // Redis answers again: the breaker closes within a second and leases are back.
    proxy.set(Mode::Pass);
    app.assert_leases_back_within_a_second().await;
    let fence = || async {
        let mut conn = app.redis().await;
        redis::cmd("GET")
            .arg(format!("{}fence", app.settings.redis_prefix))
            .query_async::<Option<i64>>(&mut conn)
            .await
            .unwrap()
            .unwrap_or(0)
    };
    let before = fence().await;
    // Lease scripts held up in the network reach Redis when it heals; the releases sent
    // after them free what they took for nobody (see `faults::redis_pause`).
    let healed = Instant::now();
    while post(&app, "after").await.0 != 201 {
        assert!(
            healed.elapsed() < Duration::from_secs(3),
            "no lease after healing"
        );
    }
    assert!(
        fence().await > before,
        "the order after recovery took a lease"
    );
    app.assert_invariants().await;
}

#[tokio::test]
async fn a_saturated_pool_sheds_within_half_a_second_and_spreads_the_retries() {
    let (app, proxy) = behind_database_proxy(Settings {
        db_pool_size: 1,
        db_acquire_timeout: Duration::from_millis(300),
        ..tight(test_settings().await)
    })
    .await;

    // Each query now takes at least 300 ms, and there is one connection.
    proxy.set(Mode::Delay(Duration::from_millis(150)));
    let answers = join_all((0..24).map(|_| async {
        let started = Instant::now();
        let res = app.get("/api/v1/products/DROP-1").await;
        let retry_after: Option<u64> = res
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok()?.parse().ok());
        (res.status().as_u16(), started.elapsed(), retry_after)
    }))
    .await;
    proxy.set(Mode::Pass);

    let shed: Vec<_> = answers.iter().filter(|(s, ..)| *s == 503).collect();
    assert!(shed.len() >= 10, "too few shed: {answers:?}");
    for (_, elapsed, retry_after) in &shed {
        assert!(
            *elapsed < Duration::from_millis(1_000),
            "shed after {elapsed:?}"
        );
        assert!(retry_after.is_some_and(|s| (1..=3).contains(&s)));
    }
    let spread: std::collections::BTreeSet<_> = shed.iter().map(|(.., r)| *r).collect();
    assert!(
        spread.len() > 1,
        "every shed client was told the same Retry-After: {spread:?}"
    );
}

#[tokio::test]
async fn keys_of_dead_requests_are_freed_within_seconds_and_the_checker_sees_stragglers() {
    let (app, proxy) = behind_database_proxy(tight(test_settings().await)).await;
    let stale = stockade::checkout::stale_after(&app.settings);

    // A record left by a process that died mid-request, one second from going stale.
    sqlx::query!(
        r#"insert into idempotency_keys (scope, key, fingerprint, state, owner, locked_at)
           values ('api', 'orphan', 'x', 'in_flight', gen_random_uuid(),
                   now() - make_interval(secs => $1))"#,
        stale.as_secs_f64() - 1.0
    )
    .execute(&app.db)
    .await
    .unwrap();
    let verdicts = stockade::loadtest::check::check(&app.db, None, None, stale)
        .await
        .unwrap();
    assert!(
        verdicts.iter().all(|v| v.pass),
        "not stale yet: {verdicts:?}"
    );
    let started = Instant::now();
    while app
        .count("select count(*) from idempotency_keys where key = 'orphan'")
        .await
        > 0
    {
        assert!(
            started.elapsed() < Duration::from_secs(4),
            "a dead request's key outlived its stale window by 3 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(post(&app, "orphan").await.0, 201, "the key is free again");

    // A request cut off by its budget frees its key at once: the immediate retry is
    // not told "still in flight".
    proxy.set(Mode::Delay(Duration::from_millis(1_200)));
    let (status, ..) = post(&app, "cut-off").await;
    assert_eq!(status, 503);
    proxy.set(Mode::Pass);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (status, _, res) = post(&app, "cut-off").await;
    assert_eq!(status, 201, "{}", res.text().await.unwrap());

    let verdicts = stockade::loadtest::check::check(&app.db, None, None, stale)
        .await
        .unwrap();
    assert!(verdicts.iter().all(|v| v.pass), "{verdicts:?}");
    app.assert_invariants().await;
}

#[tokio::test]
async fn a_stalled_lease_holder_blocks_its_sku_for_about_the_lease_ttl() {
    let settings = Settings {
        lease_wait: Duration::from_secs(3),
        request_budget: Duration::from_secs(6),
        ..tight(test_settings().await)
    };
    let buyer = spawn_app_with(settings.clone()).await;
    buyer.add_product(SKU, "Drop", 5_000, 10).await;
    // Patient enough to retry under a fresh lease when it wakes.
    let stalled = spawn_app_with(Settings {
        fault_pause_after_lease: Duration::from_secs(3),
        lease_wait: Duration::from_secs(5),
        request_budget: Duration::from_secs(10),
        ..settings.clone()
    })
    .await;

    let first = tokio::spawn({
        let (client, url) = (stalled.client.clone(), stalled.address.clone());
        async move { crate::helpers::post_order_to(&client, &url, "stalls", &[(SKU, 1)]).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (status, elapsed, _) = post(&buyer, "waits").await;
    assert_eq!(status, 201);
    assert!(
        elapsed < settings.lease_ttl + Duration::from_millis(800),
        "the SKU was blocked for {elapsed:?} by a stalled holder"
    );
    // The stalled holder wakes, is fenced off, and retries under a fresh lease.
    assert_eq!(first.await.unwrap().status().as_u16(), 201);
    assert_eq!(buyer.stock(SKU).await.0, 8);
    buyer.assert_invariants().await;
}

#[tokio::test]
async fn a_server_stopped_mid_sale_costs_the_other_about_a_lease_ttl_and_no_key_two_answers() {
    let app = spawn_app_with(tight(test_settings().await)).await;
    app.add_product(SKU, "Drop", 5_000, 50).await;
    let env = tight_env();
    let (stopped, other) = (
        serve_app(&app, &env, &[]).await,
        serve_app(&app, &env, &[]).await,
    );
    let targets = [stopped.address.clone(), other.address.clone()];
    let faults = async {
        tokio::time::sleep(Duration::from_millis(800)).await;
        stopped.pause().unwrap();
        let paused = Instant::now();
        tokio::time::sleep(Duration::from_millis(2_500)).await;
        stopped.resume().unwrap();
        (paused, Instant::now())
    };
    let sale = sale(&targets, 80);
    let (report, (paused, resumed)) = tokio::join!(sale.run(), faults);
    // The other server kept selling while its peer was stopped.
    let sold_meanwhile = report
        .answers()
        .filter(|a| a.target == 1 && a.status == Some(201))
        .filter(|a| a.at > paused + Duration::from_millis(1_500) && a.at < resumed)
        .count();
    assert!(sold_meanwhile > 0, "{:?}", report.statuses());
    report.assert_one_answer_per_key();
    report.assert_matches(&app, 50).await;
}

/// Two servers sell with `strategy`; one is killed with SIGKILL mid-sale.
async fn kill_a_server_mid_sale(strategy: &str) {
    let app = spawn_app_with(tight(test_settings().await)).await;
    app.add_product(SKU, "Drop", 5_000, 50).await;
    let mut env = tight_env();
    env.push(("STOCKADE_ORDER_STRATEGY", strategy.to_string()));
    let (mut killed, other) = (
        serve_app(&app, &env, &[]).await,
        serve_app(&app, &env, &[]).await,
    );
    let targets = [killed.address.clone(), other.address.clone()];
    let faults = async {
        tokio::time::sleep(Duration::from_millis(1_000)).await;
        killed.kill9();
    };
    let sale = sale(&targets, 60);
    let (report, ()) = tokio::join!(sale.run(), faults);
    report.assert_one_answer_per_key();
    report.assert_matches(&app, 50).await;
    // Nothing the killed process held blocks anyone for longer than the stale window.
    let stale = stockade::checkout::stale_after(&tight(Settings::default()));
    tokio::time::sleep(stale + Duration::from_secs(2)).await;
    let verdicts = stockade::loadtest::check::check(&app.db, None, None, stale)
        .await
        .unwrap();
    assert!(verdicts.iter().all(|v| v.pass), "{verdicts:?}");
}

#[tokio::test]
async fn a_server_killed_mid_sale_loses_no_acknowledged_order_and_strands_no_key() {
    kill_a_server_mid_sale("redis-lock").await;
}

#[tokio::test]
async fn a_batch_leader_killed_mid_batch_leaves_no_order_without_its_key_and_no_key_stuck() {
    kill_a_server_mid_sale("batched").await;
}

#[tokio::test]
async fn redis_killed_and_restarted_empty_mid_sale_oversells_nothing() {
    let mut app = spawn_app_with_own_redis_and(tight(test_settings().await)).await;
    app.add_product(SKU, "Drop", 5_000, 40).await;
    let other = serve_app(&app, &tight_env(), &[]).await;
    let targets = [app.address.clone(), other.address.clone()];
    let sale = sale(&targets, 70);
    let run = sale.run();
    let faults = async {
        tokio::time::sleep(Duration::from_millis(900)).await;
        app.stop_redis();
        tokio::time::sleep(Duration::from_millis(900)).await;
        app.restart_redis().await;
    };
    let (report, ()) = tokio::join!(run, faults);
    assert_sale_survived(&report, &app, 40).await;
}

#[tokio::test]
async fn postgres_restarted_mid_sale_loses_no_acknowledged_order() {
    let dir = servers().await.fresh_dir("pg");
    let pg_dir = dir.clone();
    let mut pg =
        tokio::task::spawn_blocking(move || LocalPostgres::start(&pg_dir, None, true, None))
            .await
            .unwrap()
            .unwrap();
    create_database(&pg.url("postgres"), "shop").await.unwrap();
    let settings = Settings {
        database_url: Some(pg.url("shop").into()),
        ..tight(test_settings().await)
    };
    let app = spawn_app_with(settings).await;
    app.add_product(SKU, "Drop", 5_000, 40).await;
    let other = serve_app(&app, &tight_env(), &[]).await;
    let targets = [app.address.clone(), other.address.clone()];
    let sale = sale(&targets, 70);
    let run = sale.run();
    let faults = async {
        tokio::time::sleep(Duration::from_millis(900)).await;
        let port = pg.port;
        pg.stop();
        tokio::time::sleep(Duration::from_millis(700)).await;
        let pg_dir = dir.clone();
        tokio::task::spawn_blocking(move || LocalPostgres::start(&pg_dir, Some(port), true, None))
            .await
            .unwrap()
            .unwrap()
    };
    let (report, _restarted) = tokio::join!(run, faults);
    assert_sale_survived(&report, &app, 40).await;
}
