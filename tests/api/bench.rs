//! `stockade bench` end to end: its own durable PostgreSQL and Redis, a server process,
//! pgbench, the checker, and the report; the build's `default` strategy, and shoppers
//! through the storefront's pages, and checkouts paid through a provider it starts.

#[test]
fn a_quick_bench_measures_the_app_its_storefront_and_pgbench_and_passes_the_checker() {
    let out = tempfile::tempdir().unwrap();
    let started = std::time::Instant::now();
    let run = crate::helpers::processes::stockade_command()
        .args(["bench", "--quick", "--quiet", "--strategies", "default"])
        // One measured second a workload: what is checked here is that each runs, is
        // measured beside pgbench and passes the checker, not how fast it is.
        .args(["--duration", "1", "--warmup", "0.2"])
        .args([
            "--workloads",
            "hot-sku,hold-hot,confirm,cart,storefront,paid-checkout,sold-out,refused",
            "--out",
        ])
        .arg(out.path())
        .env_remove("DATABASE_URL")
        .env_remove("REDIS_URL")
        .env("STOCKADE_LOG", "error")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("PASS I1"), "{stdout}");
    assert!(!stdout.contains("FAIL"), "{stdout}");

    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.path().join("bench.json")).unwrap()).unwrap();
    assert_eq!(report["passed"], true);
    assert_eq!(
        report["postgres"]["fsync"], "on",
        "the bench's PostgreSQL is durable"
    );
    let rows = report["rows"].as_array().unwrap();
    let hot = rows
        .iter()
        .find(|r| r["workload"] == "hot-sku" && r["mode"] == "closed")
        .unwrap();
    assert!(hot["rate"].as_f64().unwrap() > 0.0, "{hot}");
    assert!(hot["pgbench_tps"].as_f64().unwrap() > 0.0, "{hot}");
    // Group commit: a batch of orders shares its transaction. An order on a per-request
    // path commits three times (two reads outside a transaction, then its own); a batch
    // commits twice whatever its size (one read, one write). Under two per order means
    // orders shared batches, even on a loaded machine, where the open loop's slow arrivals
    // make batches of one or two.
    let commits = hot["commits_per_request"].as_f64().unwrap();
    assert!(commits > 0.0 && commits < 2.0, "{hot}");
    // Each order's rows and index entries reach the WAL: well over a kilobyte an order.
    let wal = hot["wal_per_request"].as_f64().unwrap();
    assert!(wal > 1000.0, "{hot}");
    assert_eq!(hot["invariants"], true);
    // `default` is the build's default strategy, served as itself and shown as the default.
    assert_eq!(hot["strategy"], "batched", "{hot}");
    assert_eq!(hot["default_strategy"], true, "{hot}");
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("hot-sku") && l.contains(" default (batched) ")),
        "{stdout}"
    );
    // The storefront's steps and a cart: placed by the app and by pgbench's scripts, and
    // checked.
    for workload in ["hold-hot", "confirm", "cart"] {
        let row = rows
            .iter()
            .find(|r| r["workload"] == workload && r["mode"] == "closed")
            .unwrap();
        assert!(row["rate"].as_f64().unwrap() > 0.0, "{row}");
        assert!(row["pgbench_tps"].as_f64().unwrap() > 0.0, "{row}");
        assert_eq!(row["invariants"], true, "{row}");
    }
    // Paid checkouts through a provider the bench starts, beside the provider alone.
    let paid = rows
        .iter()
        .find(|r| r["workload"] == "paid-checkout" && r["mode"] == "closed")
        .unwrap();
    assert!(paid["rate"].as_f64().unwrap() > 0.0, "{paid}");
    assert!(paid["provider_rate"].as_f64().unwrap() > 0.0, "{paid}");
    assert_eq!(paid["steps"].as_array().unwrap().len(), 5, "{paid}");
    assert_eq!(paid["invariants"], true, "{paid}");
    assert!(
        stdout.contains("paid-checkout ÷ provider (default (batched))"),
        "{stdout}"
    );
    // Shoppers through the pages and forms: checkouts completed, each step measured, the
    // checker run after them, an open loop beside the closed one, and the ratio printed.
    assert!(
        stdout.contains("invariants after storefront with default (batched):"),
        "{stdout}"
    );
    for mode in ["closed", "open"] {
        let row = rows
            .iter()
            .find(|r| r["workload"] == "storefront" && r["mode"] == mode)
            .unwrap_or_else(|| panic!("no {mode} storefront row in {report}"));
        assert!(row["rate"].as_f64().unwrap() > 0.0, "{row}");
        assert!(row["statuses"]["303"].as_u64().unwrap() > 0, "{row}");
        assert_eq!(row["invariants"], true, "{row}");
        let steps: Vec<&str> = row["steps"]
            .as_array()
            .unwrap()
            .iter()
            .inspect(|s| assert!(s["requests"].as_u64().unwrap() > 0, "{row}"))
            .inspect(|s| assert!(s["p99_ms"].as_f64().unwrap() > 0.0, "{row}"))
            .map(|s| s["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            steps,
            [
                "product",
                "add-to-cart",
                "cart",
                "checkout",
                "checkout-page",
                "place-order"
            ]
        );
    }
    let storefront_line = stdout
        .lines()
        .find(|l| l.starts_with("storefront    default (batched) "))
        .unwrap_or_else(|| panic!("no storefront line in {stdout}"));
    assert!(storefront_line.ends_with("PASS"), "{storefront_line}");
    let checkouts_per_s: f64 = storefront_line
        .split_whitespace()
        .nth(3)
        .and_then(|rate| rate.parse().ok())
        .unwrap_or_else(|| panic!("no rate in {storefront_line}"));
    assert!(checkouts_per_s > 0.0, "{storefront_line}");
    assert!(
        stdout.contains("storefront steps, p50 / p99 ms"),
        "{stdout}"
    );
    let derived = report["derived"].as_array().unwrap();
    let ratio = derived
        .iter()
        .find(|d| d["name"] == "storefront ÷ hot SKU (default (batched))")
        .unwrap_or_else(|| panic!("no storefront ratio in {stdout}"));
    assert!(ratio["value"].as_f64().unwrap() > 0.0, "{ratio}");
    assert!(
        derived
            .iter()
            .any(|d| d["name"] == "open loop: storefront place-order, default (batched)"),
        "{stdout}"
    );
    let sold_out = rows.iter().find(|r| r["workload"] == "sold-out").unwrap();
    assert!(sold_out["rate"].as_f64().unwrap() > 0.0, "{sold_out}");
    // Orders refused before any work: the ceiling, every answer a 422, no pgbench.
    let refused = rows.iter().find(|r| r["workload"] == "refused").unwrap();
    assert!(refused["rate"].as_f64().unwrap() > 0.0, "{refused}");
    // (The first orders of a fresh process look their API key up in the database, and may
    // be shed with 503 on a loaded machine: most answers, not all, are 422.)
    let answered = refused["statuses"]["422"].as_u64().unwrap();
    assert!(
        answered * 10 >= refused["requests"].as_u64().unwrap() * 9,
        "{refused}"
    );
    assert!(refused["pgbench_tps"].is_null(), "{refused}");
    assert!(
        rows.iter()
            .any(|r| r["mode"] == "open" && r["workload"] == "hot-sku"),
        "the hot SKU's open-loop line is there"
    );
    // pgbench runs the same open loop on the same server, for its own p99.
    let pgbench_open = report["pgbench"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| !p["offered_rate"].is_null())
        .expect("an open-loop pgbench run");
    assert!(
        pgbench_open["p99_ms"].as_f64().unwrap() > 0.0,
        "{pgbench_open}"
    );
    assert!(
        pgbench_open["wal_per_transaction"].as_f64().unwrap() > 1000.0,
        "{pgbench_open}"
    );
    assert!(out.path().join("bench.html").is_file());
    eprintln!("bench took {:?}", started.elapsed());
}

#[tokio::test]
async fn a_soak_writes_a_row_a_minute_with_latency_memory_and_table_sizes() {
    let servers = crate::helpers::servers().await;
    let out = tempfile::tempdir().unwrap();
    let mut soak = tokio::process::Command::from(crate::helpers::processes::stockade_command());
    soak.args(["bench", "--quick", "--quiet", "--soak", "3"])
        // Minutes of two seconds: what is checked is what each row holds.
        .args([
            "--soak-minute-seconds",
            "2",
            "--duration",
            "2",
            "--warmup",
            "0.2",
        ])
        .arg("--out")
        .arg(out.path())
        .env("DATABASE_URL", servers.url("postgres"))
        .env("REDIS_URL", &servers.redis_url)
        .env("STOCKADE_LOG", "error");
    let run = soak.output().await.unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(stdout.contains("soak hot-sku (3 minutes)"), "{stdout}");

    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.path().join("bench.json")).unwrap()).unwrap();
    assert_eq!(report["passed"], true, "invariants after the soak");
    let peak = &report["rows"][0];
    assert_eq!(
        (&peak["workload"], &peak["strategy"], &peak["mode"]),
        (
            &serde_json::json!("hot-sku"),
            &serde_json::json!("batched"),
            &serde_json::json!("closed")
        ),
        "the peak, measured first under the default strategy: {peak}"
    );
    let rows = report["soak"].as_array().unwrap();
    let minutes: Vec<u64> = rows.iter().map(|r| r["minute"].as_u64().unwrap()).collect();
    assert_eq!(minutes, [1, 2, 3]);
    let offered = 0.8 * peak["rate"].as_f64().unwrap();
    let mut orders_before = 0;
    for row in rows {
        assert!(
            (row["offered_rate"].as_f64().unwrap() - offered).abs() < 1.0,
            "80 % of the peak: {row}"
        );
        assert!(row["orders_per_s"].as_f64().unwrap() > 0.0, "{row}");
        let (p50, p99) = (
            row["p50_ms"].as_f64().unwrap(),
            row["p99_ms"].as_f64().unwrap(),
        );
        assert!(p50 > 0.0 && p99 >= p50, "{row}");
        assert!(
            row["rss_mb"].as_f64().unwrap() > 5.0,
            "the server's memory: {row}"
        );
        assert!(row["wal_mb"].as_f64().unwrap() > 0.0, "{row}");
        let table = |name: &str| {
            row["tables"]
                .as_array()
                .unwrap()
                .iter()
                .find(|t| t["name"] == name)
                .unwrap_or_else(|| panic!("no {name} in {row}"))
                .clone()
        };
        assert!(row["stock_kb"].as_f64().unwrap() > 0.0, "{row}");
        assert!(table("stock")["table_mb"].as_f64().unwrap() > 0.0);
        // Orders only grow: the sizes are read at each minute's end.
        let orders = table("orders")["live_tuples"].as_i64().unwrap();
        assert!(orders > orders_before, "orders grew: {row}");
        orders_before = orders;
    }
    let verdict = &report["soak_verdicts"][0];
    assert_eq!(verdict["minutes"], 3);
    let growth = verdict["p99_growth"].as_f64().unwrap();
    let (first, last) = (
        rows[0]["p99_ms"].as_f64().unwrap(),
        rows[2]["p99_ms"].as_f64().unwrap(),
    );
    assert!((growth - last / first).abs() < 1e-6, "{verdict}");
}
