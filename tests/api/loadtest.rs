//! The load tester and the invariant checker.

use std::time::Duration;

use clap::Parser;
use stockade::loadtest::check::{RedisTarget, Verdict, check, default_stale_after};
use stockade::loadtest::run::LogEntry;
use stockade::loadtest::{LoadtestArgs, run_report};

use crate::helpers::{
    TestApp, fresh_database, serve_app, spawn_app, spawn_app_with, test_settings,
};

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: LoadtestArgs,
}

/// Load-test arguments as the command line would give them, against `app`'s servers.
pub(crate) fn args(app: &TestApp, targets: &[String], extra: &[&str]) -> LoadtestArgs {
    let out = std::env::temp_dir().join(format!("stockade-lt-{}", uuid::Uuid::new_v4().simple()));
    let mut argv = vec!["loadtest".to_string()];
    for t in targets {
        argv.extend(["--target".into(), t.clone()]);
    }
    argv.extend([
        "--database-url".into(),
        app.settings.database_url.as_deref().unwrap().to_string(),
        "--redis-url".into(),
        app.settings.redis_url.as_deref().unwrap().to_string(),
        "--redis-prefix".into(),
        app.settings.redis_prefix.clone(),
        "--out".into(),
        out.display().to_string(),
        "--quiet".into(),
    ]);
    argv.extend(extra.iter().map(|s| s.to_string()));
    Cli::parse_from(argv).args
}

fn failed(verdicts: &[Verdict]) -> Vec<&'static str> {
    verdicts.iter().filter(|v| !v.pass).map(|v| v.id).collect()
}

#[tokio::test]
async fn the_load_tool_sends_the_api_key_it_is_given() {
    let app = spawn_app().await;
    let keyed = [
        ("STOCKADE_API_ANONYMOUS_ORDERS", "false".to_string()),
        ("STOCKADE_RATE_LIMIT_PER_MINUTE", "60".to_string()),
        ("STOCKADE_RATE_LIMIT_BURST", "20".to_string()),
    ];
    let server = serve_app(&app, &keyed, &[]).await;
    let (client, key) =
        stockade::clients::create(&app.db, "given", stockade::clients::Limit::Unlimited)
            .await
            .unwrap();
    let args = args(
        &app,
        std::slice::from_ref(&server.address),
        &[
            "--stock",
            "5",
            "--buyers",
            "40",
            "--concurrency",
            "8",
            "--api-key",
            &key,
        ],
    );
    let report = run_report(&args).await.unwrap();
    let run = &report.runs[0];
    assert!(run.passed(), "{:#?}", run.verdicts);
    // Forty buyers from one address, past the default burst: none limited, all its own.
    assert_eq!(
        run.result.orders_acknowledged, 5,
        "{:?}",
        run.result.outcomes
    );
    // Every order (placed directly, or by confirming a hold) is the given client's.
    let caller = stockade::clients::Caller::Client(stockade::clients::ApiClient {
        id: client.id,
        name: client.name.clone(),
        limit: client.limit(),
        unpaid_orders: client.unpaid_orders,
    });
    let ids = sqlx::query_scalar!("select id from orders")
        .fetch_all(&app.db)
        .await
        .unwrap();
    assert_eq!(ids.len(), 5);
    for id in ids {
        assert!(
            stockade::clients::owns_order(&app.db, &caller, id)
                .await
                .unwrap(),
            "order {id} is the given client's"
        );
    }
    assert_eq!(
        app.count("select count(*) from api_clients").await,
        1,
        "no client of its own when given a key"
    );
}

#[tokio::test]
async fn a_flash_sale_with_retries_and_double_submits_passes_every_invariant() {
    let app = spawn_app().await;
    // Keys required: the tool makes itself a client in the servers' database.
    let keyed = [("STOCKADE_API_ANONYMOUS_ORDERS", "false".to_string())];
    let servers = [
        serve_app(&app, &keyed, &[]).await,
        serve_app(&app, &keyed, &[]).await,
    ];
    let targets: Vec<String> = servers.iter().map(|s| s.address.clone()).collect();
    let args = args(
        &app,
        &targets,
        &[
            "--stock",
            "20",
            "--buyers",
            "400",
            "--concurrency",
            "48",
            "--retry-share",
            "0.2",
            "--double-submit-share",
            "0.2",
            "--changed-body-share",
            "0.05",
            "--hold-share",
            "0.1",
        ],
    );
    let report = run_report(&args).await.unwrap();
    let run = &report.runs[0];
    assert!(run.passed(), "{:#?}", run.verdicts);
    assert_eq!(run.verdicts.len(), 8, "I1–I8 all checked");
    assert_eq!(
        run.result.orders_acknowledged, 20,
        "{:?}",
        run.result.outcomes
    );
    assert_eq!(run.oversold(), 0);
    for outcome in ["created", "sold-out", "rejected"] {
        assert!(
            run.result.outcomes.contains_key(outcome),
            "{:?}",
            run.result.outcomes
        );
    }
    // Retries and double submits happened: more requests than buyers.
    assert!(run.result.requests > 400);
    assert_eq!(app.stock("FLASH-DROP").await, (0, 0));

    stockade::loadtest::report::write(&report, &args.out).unwrap();
    let html = std::fs::read_to_string(args.out.join("report.html")).unwrap();
    assert!(html.contains("<svg") && html.contains("Units available during the run"));
    assert!(
        html.contains("<b>I1</b>") && html.contains(">PASS<"),
        "the verdicts are in the page"
    );
    assert!(!html.contains("<script"), "the report needs no scripts");
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(args.out.join("report.json")).unwrap()).unwrap();
    assert_eq!(json["runs"][0]["result"]["orders_acknowledged"], 20);
}

#[tokio::test]
async fn a_sale_set_up_right_after_a_sell_out_sells_its_whole_stock() {
    let app = spawn_app().await;
    let server = serve_app(&app, &[], &[]).await;
    let targets = std::slice::from_ref(&server.address);
    let sale = ["--stock", "5", "--buyers", "40", "--concurrency", "8"];
    let first = run_report(&args(&app, targets, &sale)).await.unwrap();
    assert_eq!(first.runs[0].result.orders_acknowledged, 5);
    // The sell-out left the SKU hinted sold out in Redis; here for a minute, so the test
    // does not race the hint's few seconds.
    let hint = format!("{}soldout:FLASH-DROP", app.settings.redis_prefix);
    let _: () = redis::cmd("SET")
        .arg(&hint)
        .arg(1)
        .arg("PX")
        .arg(60_000)
        .query_async(&mut app.redis().await)
        .await
        .unwrap();

    // The next run's setup restocks the SKU and clears the hint, as an admin restock does:
    // its buyers get the new stock, not "sold out".
    let second = run_report(&args(&app, targets, &sale)).await.unwrap();
    let run = &second.runs[0];
    assert!(run.passed(), "{:#?}", run.verdicts);
    assert_eq!(
        run.result.orders_acknowledged, 5,
        "{:?}",
        run.result.outcomes
    );
}

#[tokio::test]
async fn the_checker_fails_a_naive_flash_sale_on_oversell() {
    let app = spawn_app().await;
    let extra = [("STOCKADE_ORDER_STRATEGY", "naive-unsafe".to_string())];
    let servers = [
        serve_app(&app, &extra, &["--allow-unsafe"]).await,
        serve_app(&app, &extra, &["--allow-unsafe"]).await,
    ];
    let targets: Vec<String> = servers.iter().map(|s| s.address.clone()).collect();
    let args = args(
        &app,
        &targets,
        &[
            "--stock",
            "20",
            "--buyers",
            "400",
            "--concurrency",
            "64",
            "--hold-share",
            "0",
        ],
    );
    let report = run_report(&args).await.unwrap();
    let run = &report.runs[0];
    assert!(!run.passed());
    assert!(failed(&run.verdicts).contains(&"I2"), "{:#?}", run.verdicts);
    assert!(run.oversold() > 0);
    let i2 = run.verdicts.iter().find(|v| v.id == "I2").unwrap();
    assert!(
        i2.rows[0].contains("FLASH-DROP: oversold by"),
        "{:?}",
        i2.rows
    );
}

#[tokio::test]
async fn open_loop_keeps_the_offered_rate_and_times_from_the_intended_start() {
    let app = spawn_app().await;
    let args = args(
        &app,
        std::slice::from_ref(&app.address),
        &[
            "--rate",
            "100",
            "--buyers",
            "150",
            "--stock",
            "1000",
            "--retry-share",
            "0",
            "--double-submit-share",
            "0",
        ],
    );
    let report = run_report(&args).await.unwrap();
    let r = &report.runs[0].result;
    assert_eq!(r.offered_rate, Some(100.0));
    println!(
        "open loop: offered {:.1}/s, achieved {:.1}/s",
        100.0, r.achieved_rate
    );
    assert!(
        (70.0..=130.0).contains(&r.achieved_rate),
        "achieved {}",
        r.achieved_rate
    );
    // Buyer i was due at i × 10 ms; its first request's latency counts from then, not from
    // when it was sent.
    let mut first_seen = std::collections::BTreeSet::new();
    for entry in r.log.iter().filter(|e| first_seen.insert(e.buyer)) {
        let due_ms = entry.buyer as f64 * 10.0;
        assert!(entry.latency_ms + 1.0 >= entry.at_ms - due_ms, "{entry:?}");
    }
    assert!(report.runs[0].passed(), "{:#?}", report.runs[0].verdicts);
}

fn entry(kind: &str, key: &str, status: u16, outcome: &str, id: Option<String>) -> LogEntry {
    LogEntry {
        at_ms: 0.0,
        buyer: 0,
        behaviour: "normal".into(),
        kind: kind.into(),
        key: key.into(),
        status,
        outcome: outcome.into(),
        id,
        latency_ms: 1.0,
        target: 0,
    }
}

#[tokio::test]
async fn the_checker_names_each_kind_of_violation() {
    // This process does not sweep: the expired hold below must still be there when checked.
    let mut settings = test_settings().await;
    settings.sweep_interval = std::time::Duration::from_secs(3600);
    let app = spawn_app_with(settings).await;
    app.add_product("CHK-1", "Checked", 100, 5).await;
    let redis = RedisTarget {
        url: app.settings.redis_url.as_deref().unwrap().to_string(),
        prefix: app.settings.redis_prefix.clone(),
    };
    // A clean state passes: once the order's lease is released (which may come just
    // after its answer).
    let placed = app.post_order("fine", &[("CHK-1", 1)]).await;
    let placed: serde_json::Value = placed.json().await.unwrap();
    app.wait_for_no_leases(std::time::Duration::from_secs(10))
        .await;
    let order_id = placed["id"].as_str().unwrap().to_string();
    let good_log = vec![entry(
        "order",
        "fine",
        201,
        "created",
        Some(order_id.clone()),
    )];
    let verdicts = check(
        &app.db,
        Some(&good_log),
        Some(&redis),
        default_stale_after(),
    )
    .await
    .unwrap();
    assert!(failed(&verdicts).is_empty(), "{verdicts:#?}");

    // I3, I4, I5 from the client log alone.
    let bad_log = vec![
        entry("order", "fine", 201, "created", Some(order_id.clone())),
        entry(
            "order",
            "fine",
            201,
            "created",
            Some(uuid::Uuid::new_v4().to_string()),
        ),
        entry(
            "order",
            "ghost",
            201,
            "created",
            Some(uuid::Uuid::new_v4().to_string()),
        ),
        entry("order", "refused", 409, "sold-out", None),
    ];
    // An order exists for the key the client was refused on.
    sqlx::query!(
        "update orders set idempotency_key = 'refused' where id = $1",
        order_id.parse::<uuid::Uuid>().unwrap()
    )
    .execute(&app.db)
    .await
    .unwrap();
    let verdicts = check(&app.db, Some(&bad_log), None, default_stale_after())
        .await
        .unwrap();
    assert_eq!(failed(&verdicts), ["I3", "I4", "I5"], "{verdicts:#?}");

    // I6: an expired hold still active, a lease left behind, an idle transaction, a key
    // in flight for an hour. The transaction first: it counts once idle for seconds.
    let mut idle = app.db.begin().await.unwrap();
    sqlx::query("select 1").execute(&mut *idle).await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(2_500)).await;
    sqlx::query!(
        "insert into holds (id, state, expires_at, idempotency_scope, idempotency_key) \
         values (gen_random_uuid(), 'active', now() - interval '1 minute', 't', 'stale')"
    )
    .execute(&app.db)
    .await
    .unwrap();
    let mut conn = app.redis().await;
    let _: () = redis::cmd("SET")
        .arg(format!("{}lease:CHK-1", app.settings.redis_prefix))
        .arg("someone")
        .query_async(&mut conn)
        .await
        .unwrap();
    // In flight for longer than the check trusts a claim, but not long enough for this
    // app's own purge of dead claims (every second, past its stale window) to take it
    // before the check reads it.
    sqlx::query!("insert into idempotency_keys (scope, key, fingerprint, state, owner, locked_at) \
         values ('api', 'abandoned', 'f', 'in_flight', gen_random_uuid(), now() - interval '3 seconds')")
    .execute(&app.db)
    .await
    .unwrap();
    let trusted = std::time::Duration::from_secs(1);
    assert!(trusted < stockade::checkout::stale_after(&app.settings));
    let verdicts = check(&app.db, None, Some(&redis), trusted).await.unwrap();
    let i6 = verdicts.iter().find(|v| v.id == "I6").unwrap();
    assert!(!i6.pass);
    let rows = i6.rows.join("\n");
    assert!(rows.contains("expired but still active"), "{rows}");
    assert!(rows.contains("lease key"), "{rows}");
    assert!(rows.contains("idle in transaction"), "{rows}");
    assert!(
        rows.contains("idempotency key api/abandoned in flight since"),
        "{rows}"
    );
    idle.rollback().await.unwrap();

    // I1 and I2: stock changed behind the ledger's back, and more sold than supplied.
    sqlx::query!("update stock set on_hand = on_hand + 7 where sku = 'CHK-1'")
        .execute(&app.db)
        .await
        .unwrap();
    sqlx::query!(
        "insert into order_lines (order_id, sku, quantity, unit_price_cents) \
         select id, 'CHK-1', 9, 100 from orders limit 1 on conflict (order_id, sku) \
         do update set quantity = 9"
    )
    .execute(&app.db)
    .await
    .unwrap();
    let verdicts = check(&app.db, None, None, default_stale_after())
        .await
        .unwrap();
    let failing = failed(&verdicts);
    assert!(
        failing.contains(&"I1") && failing.contains(&"I2"),
        "{verdicts:#?}"
    );
    let i2 = verdicts.iter().find(|v| v.id == "I2").unwrap();
    assert!(i2.rows[0].contains("CHK-1: oversold by 4"), "{:?}", i2.rows);
}

/// The verdict on `id`.
fn verdict<'a>(verdicts: &'a [Verdict], id: &str) -> &'a Verdict {
    verdicts.iter().find(|v| v.id == id).unwrap()
}

#[tokio::test]
async fn the_checker_fails_a_key_given_contradicting_answers_but_not_transient_ones() {
    let db = sqlx::PgPool::connect(&fresh_database().await)
        .await
        .unwrap();
    let (x, y) = (
        Some(uuid::Uuid::new_v4().to_string()),
        Some(uuid::Uuid::new_v4().to_string()),
    );
    // Retried through in-flight, busy and silence to one answer, replayed alike; a changed
    // body refused under a used key; one sold-out answer given twice.
    let clean = vec![
        entry("order", "retried", 409, "in-flight", None),
        entry("order", "retried", 503, "busy", None),
        entry("order", "retried", 0, "no-answer", None),
        entry("order", "retried", 201, "created", x.clone()),
        entry("order", "retried", 201, "created", x.clone()),
        entry("order-changed", "retried", 422, "rejected", None),
        entry("order", "late", 409, "sold-out", None),
        entry("order", "late", 409, "sold-out", None),
    ];
    let verdicts = check(&db, Some(&clean), None, default_stale_after())
        .await
        .unwrap();
    assert!(verdict(&verdicts, "I3").pass, "{verdicts:#?}");

    let contradicting = vec![
        entry("order", "reused", 201, "created", x.clone()),
        entry("order", "reused", 422, "rejected", None),
        entry("order", "two-ids", 201, "created", x.clone()),
        entry("order", "two-ids", 201, "created", y.clone()),
        entry("order", "sold", 409, "sold-out", None),
        entry("order", "sold", 201, "created", x.clone()),
        entry("hold", "held", 201, "created", x.clone()),
        entry("hold", "held", 404, "rejected", None),
    ];
    let verdicts = check(&db, Some(&contradicting), None, default_stale_after())
        .await
        .unwrap();
    let i3 = verdict(&verdicts, "I3");
    assert!(!i3.pass);
    let (x, y) = (x.unwrap(), y.unwrap());
    let mut two_ids = [x.clone(), y];
    two_ids.sort();
    assert_eq!(
        i3.rows,
        [
            format!("hold key held: answered 201 {x} and 404 rejected"),
            format!("order key reused: answered 201 {x} and 422 rejected"),
            format!("order key sold: answered 201 {x} and 409 sold-out"),
            format!(
                "order key two-ids: answered 201 {} and 201 {}",
                two_ids[0], two_ids[1]
            ),
        ]
    );
}

#[tokio::test]
async fn the_quiet_check_fails_only_on_in_flight_keys_older_than_the_stale_window() {
    let db = sqlx::PgPool::connect(&fresh_database().await)
        .await
        .unwrap();
    let insert = |key: &'static str, state: &'static str, age_ms: i32| {
        let db = db.clone();
        async move {
            sqlx::query!(
                "insert into idempotency_keys \
                   (scope, key, fingerprint, state, owner, response_status, locked_at) \
                 values ('api', $1, 'f', $2, gen_random_uuid(), \
                         case when $2 = 'completed' then 201 end, \
                         now() - make_interval(secs => $3::int / 1000.0))",
                key,
                state,
                age_ms
            )
            .execute(&db)
            .await
            .unwrap();
        }
    };
    // A request still working, and an old one that completed.
    insert("working", "in_flight", 1_000).await;
    insert("done", "completed", 3_600_000).await;
    let i6 = |stale_after: Duration| {
        let db = db.clone();
        async move {
            let verdicts = check(&db, None, None, stale_after).await.unwrap();
            verdict(&verdicts, "I6").clone()
        }
    };
    assert!(i6(default_stale_after()).await.pass);
    // The window is the caller's: a shorter one makes the working key stale.
    let short = i6(Duration::from_millis(500)).await;
    assert!(!short.pass);
    assert!(
        short.rows[0].starts_with("idempotency key api/working in flight since"),
        "{:?}",
        short.rows
    );

    insert("died", "in_flight", 3_600_000).await;
    let i6 = i6(default_stale_after()).await;
    assert_eq!(i6.violations, 1, "{:?}", i6.rows);
    assert!(i6.rows[0].contains("api/died"), "{:?}", i6.rows);
}

#[tokio::test]
async fn stockade_check_exits_non_zero_on_a_broken_database() {
    let url = fresh_database().await;
    let db = sqlx::PgPool::connect(&url).await.unwrap();
    let run = || {
        crate::helpers::processes::clean_stockade_command()
            .arg("check")
            .env("DATABASE_URL", &url)
            .output()
            .unwrap()
    };
    let ok = run();
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stdout)
    );
    assert!(String::from_utf8_lossy(&ok.stdout).contains("PASS I1"));
    sqlx::query!("insert into products (sku, name, price_cents) values ('BRK-1', 'Broken', 1)")
        .execute(&db)
        .await
        .unwrap();
    sqlx::query!("insert into stock (sku, on_hand) values ('BRK-1', 3)")
        .execute(&db)
        .await
        .unwrap();
    let broken = run();
    assert_eq!(broken.status.code(), Some(3));
    let stdout = String::from_utf8_lossy(&broken.stdout);
    assert!(stdout.contains("FAIL I1"), "{stdout}");
    assert!(
        stdout.contains("BRK-1: on_hand 3 but the ledger sums to 0"),
        "{stdout}"
    );
}

#[tokio::test]
async fn the_loadtest_command_runs_against_targets_and_writes_its_report() {
    let app = spawn_app().await;
    let out = std::env::temp_dir().join(format!("stockade-cli-{}", uuid::Uuid::new_v4().simple()));
    let output = crate::helpers::processes::clean_stockade_command()
        .args([
            "loadtest",
            "--target",
            &app.address,
            "--scenario",
            "mixed",
            "--stock",
            "30",
        ])
        .args([
            "--buyers",
            "60",
            "--concurrency",
            "8",
            "--quiet",
            "--quantity",
            "2",
        ])
        .arg("--out")
        .arg(&out)
        .env(
            "DATABASE_URL",
            app.settings.database_url.as_deref().unwrap(),
        )
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        stdout.contains("PASS I1") && stdout.contains("strategy"),
        "{stdout}"
    );
    assert!(out.join("report.html").exists() && out.join("report.json").exists());
    assert!(out.join("client-log-servers.jsonl").exists());
    // The catalogue SKUs were created with their stock, and sold from.
    let sold = app
        .count("select count(*) from order_lines where sku like 'LT-%'")
        .await;
    assert!(sold > 0);
}

#[tokio::test]
async fn the_drop_scenario_queues_admits_and_sells_fairly_and_refuses_every_misuse() {
    let app = spawn_app().await;
    // Every shopper comes from 127.0.0.1: no cap on places per address.
    let open = [("STOCKADE_DROP_PLACES_PER_ADDRESS", "0".to_string())];
    let servers = [
        serve_app(&app, &open, &[]).await,
        serve_app(&app, &open, &[]).await,
    ];
    let targets: Vec<String> = servers.iter().map(|s| s.address.clone()).collect();
    let args = args(
        &app,
        &targets,
        &[
            "--scenario",
            "drop",
            "--queueing",
            "fifo,lottery",
            "--stock",
            "100",
            "--prequeue-seconds",
            "3",
            "--prequeue-shoppers",
            "160",
            "--later-shoppers",
            "40",
            "--join-rate",
            "40",
            "--admit-per-minute",
            "4800",
            "--misbehave-share",
            "0.2",
            "--duration",
            "40",
        ],
    );
    let report = run_report(&args).await.unwrap();
    assert_eq!(report.runs.len(), 2, "one run per queueing method");
    for run in &report.runs {
        assert!(run.passed(), "{}: {:#?}", run.strategy, run.verdicts);
        assert!(
            run.verdicts
                .iter()
                .any(|v| v.id == "I8" && v.pass && v.not_applicable.is_none()),
            "I8 checked"
        );
        let drop = run.drop.as_ref().expect("a drop section");
        let summary = stockade::loadtest::drop::summary(&run.strategy, drop);
        // The stock sold to admitted shoppers only, each place held once, every misuse
        // (no pass, a borrowed pass) tried and refused.
        assert_eq!(drop.orders, 100, "{summary}");
        assert_eq!(run.oversold(), 0);
        assert_eq!((drop.shoppers, drop.joined), (200, 200), "{summary}");
        assert_eq!(drop.admitted_twice, 0, "{summary}");
        assert!(drop.misuse_tried >= 10, "{summary}");
        assert_eq!(drop.misuse_accepted, 0, "{summary}");
        assert!(drop.admitted >= 100 && drop.recorded >= 100, "{summary}");
        let fairness = &drop.fairness;
        let kendall = fairness.kendall.as_ref().expect("a Kendall τ");
        match drop.queueing {
            stockade::drops::Queueing::Fifo => {
                // Arrival order kept: only joins answered within moments of each other
                // may swap (at most 1 % of pairs).
                assert!(kendall.tau_b > 0.9, "{summary}");
                assert!(kendall.discordant_pairs * 100 <= kendall.pairs, "{summary}");
                assert!(fairness.independence.is_none());
            }
            stockade::drops::Queueing::Lottery => {
                // Over ≥ 100 pre-queued shoppers τ's deviation is under 0.07: |τ| < 0.35
                // is five of them; the independence test's p-value is uniform on 0–1
                // for a fair draw, and 1e-6 is not reached by chance.
                assert!(fairness.n >= 100, "{summary}");
                assert!(kendall.tau_b.abs() < 0.35, "{summary}");
                let test = fairness.independence.as_ref().expect("a chi-square test");
                assert!(test.p_value > 1e-6, "{summary}");
            }
        }
    }
}
