//! The scaled-out topology (`stockade cluster`) losing parts during flash sales: every
//! sale goes through HAProxy to three app processes behind PgBouncer, with PostgreSQL run
//! by three Patroni nodes, Redis found through Sentinel and reads on the replicas, and is
//! checked with the invariant checker and the client log. One cluster serves every phase,
//! in turn.

mod drop;
mod failover;

use std::time::{Duration, Instant};

use clap::Parser;
use sqlx::PgPool;
use stockade::cluster::{Cluster, ClusterOptions};
use stockade::config::Settings;
use stockade::loadtest::report::StrategyRun;
use stockade::loadtest::{HOT_SKU, LoadtestArgs, run_report};
use stockade::locking::FENCE_EPOCH;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: LoadtestArgs,
}

async fn start_cluster(dir: &std::path::Path) -> Cluster {
    let env = [
        ("STOCKADE_LOG", "warn"),
        ("STOCKADE_WORKERS", "2"),
        ("STOCKADE_API_ANONYMOUS_ORDERS", "true"),
        ("STOCKADE_RATE_LIMIT_PER_MINUTE", "1000000"),
        ("STOCKADE_RATE_LIMIT_BURST", "1000000"),
    ];
    Cluster::start(ClusterOptions {
        dir: dir.to_path_buf(),
        apps: 3,
        exe: env!("CARGO_BIN_EXE_stockade").into(),
        app_env: env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        port: None,
        postgres_nodes: 3,
        // A small server pool: three apps share twelve connections to the leader.
        pgbouncer_pool: 12,
        ephemeral: true,
        fault_links: true,
        backups: Some(dir.join("backups")),
        settings: Settings::default(),
    })
    .await
    .expect("start the cluster")
}

/// A flash sale of `stock` units through HAProxy; `redis_port` is where leftover leases
/// are looked for at the end (the master by then).
fn sale(cluster: &Cluster, stock: i32, buyers: u64, redis_port: u16, seed: u64) -> LoadtestArgs {
    let out = std::env::temp_dir().join(format!("stockade-lt-{}", uuid::Uuid::new_v4().simple()));
    let argv = [
        "loadtest".to_string(),
        "--target".into(),
        cluster.url(),
        "--database-url".into(),
        cluster.primary_url(),
        "--redis-url".into(),
        cluster.redis_url(redis_port),
        "--out".into(),
        out.display().to_string(),
        "--quiet".into(),
        "--stock".into(),
        stock.to_string(),
        "--buyers".into(),
        buyers.to_string(),
        "--concurrency".into(),
        "24".into(),
        "--duration".into(),
        "30".into(),
        "--hold-share".into(),
        "0".into(),
        "--seed".into(),
        seed.to_string(),
    ];
    Cli::parse_from(argv).args
}

/// The run passed I1–I6 and the database sold exactly the stock (the loadtest sets the
/// SKU to `stock` units first, so none left on hand or reserved is all of it, and I2 says
/// no more). Every unit was acknowledged to a buyer, unless `killed_app`: a process killed
/// mid-request cannot send the answers of orders it committed, and a buyer whose retries
/// all reached it before HAProxy noticed has none (its key replays the order later).
fn assert_sold_exactly(run: &StrategyRun, stock: i32, phase: &str, killed_app: bool) {
    assert!(run.passed(), "{phase}: {:#?}", run.verdicts);
    let hot = run
        .balances
        .iter()
        .find(|b| b.sku == HOT_SKU)
        .expect("the sale's SKU");
    assert_eq!(
        (hot.on_hand, hot.reserved),
        (0, 0),
        "{phase}: the database sold all {stock} units: {hot:?}"
    );
    let acknowledged = run.result.units_acknowledged;
    if killed_app {
        assert!(
            (1..=i64::from(stock)).contains(&acknowledged),
            "{phase}: {acknowledged} units acknowledged of {stock}: {:?}",
            run.result.outcomes
        );
        eprintln!(
            "{phase}: {} of {stock} units sold without an answer reaching the buyer",
            i64::from(stock) - acknowledged
        );
    } else {
        assert_eq!(
            acknowledged,
            i64::from(stock),
            "{phase}: every unit sold once, none twice: {:?}",
            run.result.outcomes
        );
    }
}

/// Whether the catalogue page and the product API both answer a search for `q` (each one
/// new, so it reaches the database, not the page cache).
async fn catalogue_answers(client: &reqwest::Client, base: &str, q: &str) -> bool {
    let page = client.get(format!("{base}/?q={q}")).send().await;
    let api = client
        .get(format!("{base}/api/v1/products?q={q}"))
        .send()
        .await;
    page.is_ok_and(|r| r.status() == 200) && api.is_ok_and(|r| r.status() == 200)
}

async fn max_fence(db: &PgPool) -> i64 {
    sqlx::query_scalar("select coalesce(max(last_fence), 0)::bigint from stock")
        .fetch_one(db)
        .await
        .unwrap()
}

/// Whether orders through HAProxy, one after another for up to 20 s (each app process
/// learns of the new master when its breaker next probes the Sentinels), come to write
/// a product's stock row with a fence of at least `fence`.
async fn ordered_under_new_leases(cluster: &Cluster, primary: &PgPool, fence: i64) -> bool {
    let mut tx = primary.begin().await.unwrap();
    sqlx::query("insert into products (sku, name, price_cents) values ('AFTER-1', 'After', 100)")
        .execute(&mut *tx)
        .await
        .unwrap();
    let sku = stockade::catalog::Sku::parse("AFTER-1").unwrap();
    stockade::inventory::db::create_stock(&mut tx, &sku, 1_000, "test")
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    for i in 0.. {
        let res = crate::helpers::post_order_to(
            &client,
            &cluster.url(),
            &format!("after-{i}"),
            &[("AFTER-1", 1)],
        )
        .await;
        // 503 is a passing answer here (a retry may come at any time); anything else fails.
        let status = res.status().as_u16();
        assert!(
            [201, 503].contains(&status),
            "{status}: {}",
            res.text().await.unwrap()
        );
        let written: i64 = sqlx::query_scalar("select last_fence from stock where sku = 'AFTER-1'")
            .fetch_one(primary)
            .await
            .unwrap();
        if written >= fence {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    unreachable!("the loop returns")
}

/// The fence counter on the Redis server at `port` (0 when it cannot be read).
async fn fence_counter(cluster: &Cluster, port: u16) -> i64 {
    let Ok(client) = redis::Client::open(cluster.redis_url(port)) else {
        return 0;
    };
    let Ok(Ok(mut conn)) = tokio::time::timeout(
        Duration::from_millis(300),
        client.get_multiplexed_async_connection(),
    )
    .await
    else {
        return 0;
    };
    redis::cmd("GET")
        .arg("stockade:fence")
        .query_async::<Option<i64>>(&mut conn)
        .await
        .ok()
        .flatten()
        .unwrap_or(0)
}

/// (ms, bytes) the replica's replay is behind the primary, as the primary sees it.
async fn replica_lag(primary: &PgPool) -> (i64, i64) {
    let (ms, bytes): (Option<i64>, Option<i64>) = sqlx::query_as(
        r#"select max(extract(epoch from replay_lag) * 1000)::bigint,
                  max(pg_wal_lsn_diff(pg_current_wal_lsn(), replay_lsn))::bigint
             from pg_stat_replication"#,
    )
    .fetch_one(primary)
    .await
    .unwrap();
    (ms.unwrap_or(0), bytes.unwrap_or(0))
}

/// What `stockade cluster --state-file` writes describes what runs: each process alive
/// under its pid, the shop and the database answering at their URLs, and the PostgreSQL
/// nodes by their Patroni names, one of them the leader.
/// The audit's forged request through HAProxy: a form sent with a foreign `Origin` and a
/// `X-Forwarded-Host` naming that origin. HAProxy sets the forwarding headers itself, so
/// the app compares the origin with the host really asked for (403), and the same form
/// from the shop's own origin is taken whatever host it claims; a page asked for with
/// `X-Forwarded-Proto: https` over plain http sets no `Secure` cookie.
async fn forged_forwarding_headers_are_not_believed(cluster: &Cluster) {
    let shop = cluster.url();
    let client = crate::helpers::client();
    let html = client
        .get(format!("{shop}/"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let csrf = crate::helpers::csrf_in(&html);
    let send = |origin: &str| {
        client
            .post(format!("{shop}/cart/add"))
            .header("origin", origin)
            .header("x-forwarded-host", "evil.example")
            .header("content-type", "application/x-www-form-urlencoded")
            .body(format!("sku={HOT_SKU}&quantity=1&csrf={csrf}"))
            .send()
    };
    let forged = send("http://evil.example").await.unwrap();
    assert_eq!(
        forged.status().as_u16(),
        403,
        "a forged origin passed through HAProxy"
    );
    let own = send(&shop).await.unwrap();
    assert_ne!(
        own.status().as_u16(),
        403,
        "the shop's own form was refused"
    );
    let page = crate::helpers::client()
        .get(format!("{shop}/"))
        .header("x-forwarded-proto", "https")
        .send()
        .await
        .unwrap();
    let cookies: Vec<String> = page
        .headers()
        .get_all("set-cookie")
        .iter()
        .map(|c| c.to_str().unwrap_or("").to_ascii_lowercase())
        .collect();
    assert!(!cookies.is_empty(), "a first visit sets its cookie");
    assert!(
        cookies.iter().all(|c| !c.contains("secure")),
        "a Secure cookie over plain http on a forged X-Forwarded-Proto: {cookies:?}"
    );
}

/// `command` run as another local user (`nobody`) when this is root; its output.
fn as_another_user(mut command: std::process::Command) -> String {
    use std::os::unix::process::CommandExt;
    if nix::unistd::geteuid().is_root() {
        let nobody = nix::unistd::User::from_name("nobody").unwrap().unwrap();
        command.uid(nobody.uid.as_raw()).gid(nobody.gid.as_raw());
    }
    let out = command.output().unwrap();
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The audit's commands from another local user: Patroni's `PATCH /config` is 401 without
/// the REST password (and 200 with it), a Sentinel refuses `SENTINEL SET` without the
/// password (NOAUTH), and etcd will not read out the leader key without a user.
fn control_planes_refuse_other_users(cluster: &Cluster) {
    let url = format!("{}/config", cluster.postgres.nodes[0].patroni_url());
    let patch = |credentials: Option<String>| {
        let mut curl = std::process::Command::new("curl");
        curl.args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "-X", "PATCH"])
            .args([
                "-H",
                "Content-Type: application/json",
                "-d",
                r#"{"loop_wait": 2}"#,
            ]);
        if let Some(credentials) = credentials {
            curl.args(["-u", &credentials]);
        }
        curl.arg(&url);
        as_another_user(curl)
    };
    assert_eq!(patch(None), "401", "Patroni took PATCH /config from anyone");
    let credentials = format!(
        "{}:{}",
        stockade::cluster::patroni::REST_USER,
        cluster.postgres.rest_password()
    );
    assert_eq!(
        patch(Some(credentials)),
        "200",
        "the REST password was refused"
    );
    let mut set = std::process::Command::new("redis-cli");
    set.args(["-p", &cluster.sentinels[0].port.to_string()])
        .args([
            "SENTINEL",
            "SET",
            "stockade",
            "down-after-milliseconds",
            "60000",
        ]);
    let answer = as_another_user(set);
    assert!(
        answer.contains("NOAUTH"),
        "a Sentinel took SENTINEL SET: {answer}"
    );
    // base64 of "/service/stockade/leader"
    let mut range = std::process::Command::new("curl");
    range
        .args([
            "-s",
            "-X",
            "POST",
            "-d",
            r#"{"key": "L3NlcnZpY2Uvc3RvY2thZGUvbGVhZGVy"}"#,
        ])
        .arg(format!(
            "http://127.0.0.1:{}/v3/kv/range",
            cluster.postgres.etcd.port
        ));
    let answer = as_another_user(range);
    assert!(
        answer.contains("error") && !answer.contains("\"kvs\""),
        "etcd gave out the leader key: {answer}"
    );
}

async fn check_state(cluster: &Cluster, dir: &std::path::Path) {
    let state = cluster.state().await;
    // Written readable by this user only, replacing (never writing through) a link that
    // was there.
    use std::os::unix::fs::PermissionsExt;
    let (file, elsewhere) = (dir.join("state.json"), dir.join("elsewhere.json"));
    std::fs::write(&elsewhere, "untouched").unwrap();
    std::os::unix::fs::symlink(&elsewhere, &file).unwrap();
    stockade::cluster::write_state_file(&file, &state.to_string()).unwrap();
    let written: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(written, state);
    let mode = std::fs::symlink_metadata(&file)
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "{mode:o}");
    assert_eq!(std::fs::read_to_string(&elsewhere).unwrap(), "untouched");
    // Each Sentinel's configuration, which it has rewritten by now (it records its id),
    // holds the Redis password: its owner's to read only.
    for i in 1..=stockade::cluster::SENTINELS {
        let conf = dir.join(format!("sentinel-{i}")).join("sentinel.conf");
        let conf = std::fs::read_to_string(dir.join(format!("sentinel-{i}")).join("LOCATION"))
            .map(|moved| std::path::PathBuf::from(moved.trim()).join("sentinel.conf"))
            .unwrap_or(conf);
        let text = std::fs::read_to_string(&conf).unwrap();
        assert!(text.contains("sentinel myid"), "not rewritten yet: {text}");
        let mode = std::fs::metadata(&conf).unwrap().permissions().mode();
        assert_eq!(mode & 0o077, 0, "{} is {mode:o}", conf.display());
    }
    control_planes_refuse_other_users(cluster);
    // The app's user cannot open PgBouncer's admin console.
    let console = cluster
        .pgbouncer_url()
        .replace(&format!("/{}", stockade::local::PG_DATABASE), "/pgbouncer");
    assert!(
        sqlx::PgPool::connect(&console).await.is_err(),
        "the app's user opened PgBouncer's admin console"
    );
    let processes = state["processes"].as_array().unwrap();
    for p in processes {
        let pid = p["pid"].as_i64().unwrap_or_else(|| panic!("a pid: {p}"));
        let alive = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), None);
        assert!(alive.is_ok(), "{p} runs");
    }
    let nodes: Vec<_> = processes
        .iter()
        .filter(|p| {
            p["role"]
                .as_str()
                .is_some_and(|r| r.starts_with("postgres-"))
        })
        .collect();
    let names: Vec<_> = nodes.iter().map(|n| n["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["pg1", "pg2", "pg3"], "{state:#}");
    let leaders = nodes
        .iter()
        .filter(|n| n["role"] == "postgres-leader")
        .count();
    assert_eq!(leaders, 1, "{state:#}");
    let client = reqwest::Client::new();
    for node in &nodes {
        // Its Patroni answers at `patroni_url`, with the role the state gives it, and
        // knows the three members by the names the state uses.
        let url = node["patroni_url"].as_str().unwrap();
        let get = |path: &str| {
            let request = client.get(format!("{url}{path}"));
            async move {
                let res = request.send().await.unwrap();
                res.json::<serde_json::Value>().await.unwrap()
            }
        };
        let status = get("/patroni").await;
        let role = if node["role"] == "postgres-leader" {
            "master"
        } else {
            "replica"
        };
        assert_eq!(status["role"], role, "{node}: {status:#}");
        let members = get("/cluster").await;
        let mut known: Vec<_> = members["members"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["name"].as_str().unwrap().to_string())
            .collect();
        known.sort();
        assert_eq!(known, ["pg1", "pg2", "pg3"], "{members:#}");
        let data = std::path::Path::new(node["data_dir"].as_str().unwrap());
        assert!(data.join("PG_VERSION").is_file(), "{node}");
    }
    let shop = state["shop_url"].as_str().unwrap();
    let res = client.get(format!("{shop}/readyz")).send().await.unwrap();
    assert_eq!(res.status(), 200);
    let db = PgPool::connect(state["database_url"].as_str().unwrap())
        .await
        .unwrap();
    let writable: bool = sqlx::query_scalar("select not pg_is_in_recovery()")
        .fetch_one(&db)
        .await
        .unwrap();
    assert!(writable, "database_url reaches the leader");
    db.close().await;
}

// Two workers for the sales' buyers (each a task of its own), apart from the test's own
// future and its checks; the leader-loss phases give their sale a runtime of its own too
// (`failover::lose_the_leader`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flash_sale_through_haproxy_survives_losing_a_redis_master_an_app_the_replicas_pgbouncer_and_the_database_leader()
 {
    let started = Instant::now();
    let dir = std::env::temp_dir().join(format!("stockade-cluster-{}", uuid::Uuid::new_v4()));
    let mut cluster = start_cluster(&dir).await;
    eprintln!("cluster up in {:.1} s", started.elapsed().as_secs_f64());
    check_state(&cluster, &dir).await;
    forged_forwarding_headers_are_not_believed(&cluster).await;
    let primary = PgPool::connect(&cluster.primary_url()).await.unwrap();
    let standby = cluster.redis[1].port;

    // 1. The Redis master dies mid-sale: Sentinel promotes the replica, orders go on under
    //    the database guard meanwhile, and leases resume on the new master with its fence
    //    counter raised past every fence the database has seen.
    // Enough stock that the sale outlasts the failover on a fast machine too: the last
    //    check needs orders after leases are back.
    //    A drop's queue meanwhile: its shoppers queued now, its opening just after the
    //    kill; they are let in across the failover and buy with their passes afterwards.
    let stock = 800;
    let args = sale(&cluster, stock, 2_400, standby, 1);
    let queued = drop::queue(&cluster, &primary, Duration::from_millis(2_500)).await;
    let shop = cluster.url();
    let sale_started = Instant::now();
    let (report, (killed_at, fence_before, leases_back), passes) = tokio::join!(
        run_report(&args),
        async {
            tokio::time::sleep(Duration::from_millis(1_500)).await;
            let fence_before = max_fence(&primary).await;
            let killed_at = Instant::now();
            cluster.redis[0].kill9();
            // Leases are usable again once the promoted replica's counter has been raised.
            let mut leases_back = None;
            while killed_at.elapsed() < Duration::from_secs(20) {
                if fence_counter(&cluster, standby).await > fence_before + FENCE_EPOCH / 2 {
                    leases_back = Some(killed_at.elapsed());
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            (killed_at, fence_before, leases_back)
        },
        queued.wait_for_passes(&shop, Duration::from_secs(60)),
    );
    let run = &report.unwrap().runs[0];
    assert_sold_exactly(run, stock, "Redis master killed", false);
    queued.buy_and_check(&cluster, &primary, &passes).await;
    assert_eq!(cluster.current_master_port().await.unwrap(), standby);
    let leases_back = leases_back.expect("the new master's fence counter was raised");
    // The sale may sell out before leases are back (group commit sells fast): orders
    // placed now, of a product of their own, must write under the new master's leases.
    assert!(
        ordered_under_new_leases(&cluster, &primary, fence_before + FENCE_EPOCH).await,
        "orders after the failover wrote under leases of the new master"
    );
    // Orders were acknowledged while the master was gone, before leases came back.
    let kill_ms = killed_at.duration_since(sale_started).as_secs_f64() * 1e3;
    let back_ms = kill_ms + leases_back.as_secs_f64() * 1e3;
    let created_in = |from: f64, to: f64| {
        run.result
            .log
            .iter()
            .filter(|e| e.status == 201 && e.at_ms >= from && e.at_ms < to)
            .count()
    };
    let during = created_in(kill_ms, back_ms);
    let before = created_in(0.0, kill_ms);
    eprintln!(
        "Redis master killed at {kill_ms:.0} ms: leases in use again after {:.2} s; \
         {before} orders before ({:.0}/s), {during} while without leases ({:.0}/s); \
         outcomes {:?}",
        leases_back.as_secs_f64(),
        before as f64 / (kill_ms / 1e3),
        during as f64 / leases_back.as_secs_f64(),
        run.result.outcomes
    );
    if run.result.orders_acknowledged > before as u64 + during as u64 {
        // The sale outlasted the failover: some orders came after it too.
        assert!(during > 0, "orders kept flowing while Redis failed over");
    }

    // 2. An app process dies mid-sale: HAProxy sends its requests elsewhere, and clients
    //    retrying the same key get one order.
    let stock = 300;
    let args = sale(&cluster, stock, 1_500, standby, 2);
    let selling = std::sync::atomic::AtomicBool::new(true);
    let sale_run = async {
        let report = run_report(&args).await;
        selling.store(false, std::sync::atomic::Ordering::Relaxed);
        report
    };
    // Meanwhile the replica's lag is sampled, as the dashboard shows it.
    let lag_samples = async {
        let mut samples = Vec::new();
        while selling.load(std::sync::atomic::Ordering::Relaxed) {
            samples.push(replica_lag(&primary).await);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        samples
    };
    let (report, (), lags) = tokio::join!(
        sale_run,
        async {
            tokio::time::sleep(Duration::from_millis(1_000)).await;
            cluster.apps[0].kill9();
        },
        lag_samples
    );
    let run = &report.unwrap().runs[0];
    assert_sold_exactly(run, stock, "app killed", true);
    eprintln!("app killed: outcomes {:?}", run.result.outcomes);
    let mut lag_ms: Vec<i64> = lags.iter().map(|(ms, _)| *ms).collect();
    lag_ms.sort_unstable();
    eprintln!(
        "replica lag during the sale: median {} ms, max {} ms, max {} bytes ({} samples)",
        lag_ms.get(lag_ms.len() / 2).unwrap_or(&0),
        lag_ms.last().unwrap_or(&0),
        lags.iter().map(|(_, b)| *b).max().unwrap_or(0),
        lags.len()
    );

    // 3. The replicas stop: the catalogue and the product API answer from the leader,
    //    without a failed read, while they shut down and after.
    stockade::install_tls_provider();
    let client = reqwest::Client::new();
    let base = cluster.url();
    // The app killed above can stay in HAProxy's rotation for a check or two.
    let settled_by = Instant::now() + Duration::from_secs(10);
    while !catalogue_answers(&client, &base, "").await {
        assert!(Instant::now() < settled_by, "the catalogue answers before");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let replica = PgPool::connect(&cluster.replica_url()).await.unwrap();
    let in_recovery: bool = sqlx::query_scalar("select pg_is_in_recovery()")
        .fetch_one(&replica)
        .await
        .unwrap();
    assert!(in_recovery, "HAProxy's read port reaches a standby");
    replica.close().await;
    let leader = cluster.postgres.leader().await.expect("a leader");
    let replicas: Vec<usize> = (0..cluster.postgres.nodes.len())
        .filter(|&i| i != leader)
        .collect();
    let mut app_sessions = 0;
    for &i in &replicas {
        let node = PgPool::connect(&cluster.postgres.superuser_url(i, "postgres"))
            .await
            .unwrap();
        let n: i64 = sqlx::query_scalar(
            "select count(*) from pg_stat_activity where application_name = 'stockade'",
        )
        .fetch_one(&node)
        .await
        .unwrap();
        app_sessions += n;
        node.close().await;
    }
    assert!(app_sessions > 0, "the apps read from the replicas");
    // A reader on its own thread reads from before the stop until 3 s after it: a read
    // that finds the replica gone before its process's check does is read again on the
    // primary, so none fails, not even during the shutdown.
    // (Its own client, on its own runtime: this one is blocked while the replica stops.)
    let (stopped_tx, stopped_rx) = std::sync::mpsc::channel::<Instant>();
    let reader = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(5))
            .build()
            .unwrap();
        runtime.block_on(async {
            let began = Instant::now();
            let (mut reads, mut failed, mut stopped) = (0, Vec::new(), None);
            while stopped.is_none_or(|at: Instant| at.elapsed() < Duration::from_secs(3))
                && began.elapsed() < Duration::from_secs(60)
            {
                stopped = stopped.or_else(|| stopped_rx.try_recv().ok());
                if !catalogue_answers(&client, &base, &format!("gone{reads}")).await {
                    failed.push(match stopped {
                        Some(at) => format!("{} ms after the stop", at.elapsed().as_millis()),
                        None => "before the stop returned".to_string(),
                    });
                }
                reads += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            (reads, failed)
        })
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    for &i in &replicas {
        cluster.postgres.nodes[i].daemon.stop();
    }
    stopped_tx.send(Instant::now()).unwrap();
    let (reads, failed) = tokio::task::spawn_blocking(move || reader.join().unwrap())
        .await
        .unwrap();
    assert!(
        failed.is_empty(),
        "{} of {reads} reads failed: {failed:?}",
        failed.len()
    );
    eprintln!("replicas stopped: all {reads} catalogue reads answered");
    // They come back, and stream from the leader again.
    for &i in &replicas {
        cluster.postgres.nodes[i].daemon.restart().unwrap();
    }
    for &i in &replicas {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !cluster.postgres.nodes[i].answers("/replica").await {
            assert!(Instant::now() < deadline, "pg{} is a replica again", i + 1);
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    cluster
        .postgres
        .wait_for(Duration::from_secs(60), "/sync")
        .await
        .expect("a synchronous standby again");

    // 4. PgBouncer restarts mid-sale: orders stop for a moment and resume, nothing is
    //    oversold or doubled.
    let stock = 300;
    let args = sale(&cluster, stock, 1_500, standby, 3);
    let (report, ()) = tokio::join!(run_report(&args), async {
        tokio::time::sleep(Duration::from_millis(1_000)).await;
        cluster.pgbouncer.restart().expect("PgBouncer starts again");
    });
    let run = &report.unwrap().runs[0];
    assert_sold_exactly(run, stock, "PgBouncer restarted", false);
    eprintln!("PgBouncer restarted: outcomes {:?}", run.result.outcomes);

    // 5. With `--backups`, the leader archived its WAL all along, and a full backup was
    //    taken at start. (Archiving fails until the start has made pgBackRest's stanza,
    //    and PostgreSQL retries meanwhile: no failure may come after that.)
    let (archived, last_failed): (i64, Option<chrono::DateTime<chrono::Utc>>) =
        sqlx::query_as("select archived_count, last_failed_time from pg_stat_archiver")
            .fetch_one(&primary)
            .await
            .unwrap();
    let repo = stockade::local::backups::Repo::open(&dir.join("backups")).unwrap();
    let backups = tokio::task::spawn_blocking(move || repo.list())
        .await
        .unwrap()
        .unwrap();
    let first_full = backups
        .iter()
        .find(|b| b.kind == "full")
        .unwrap_or_else(|| panic!("a full backup: {backups:?}"));
    assert!(
        archived > 0 && last_failed.is_none_or(|at| at < first_full.started),
        "archived {archived}, last failure {last_failed:?}, first backup {first_full:?}"
    );

    primary.close().await;

    // 6–8. The PostgreSQL leader is lost mid-sale: its postmaster, its whole node, its
    //      network. Orders resume on the next leader; none acknowledged is lost.
    use failover::{Fault, lose_the_leader};
    lose_the_leader(&mut cluster, Fault::Postmaster, standby, 25, 4).await;
    lose_the_leader(&mut cluster, Fault::Node, standby, 45, 5).await;
    lose_the_leader(&mut cluster, Fault::Partition, standby, 45, 6).await;

    // 9. Backups go on under whichever node leads: pgBackRest finds it.
    let repo = stockade::local::backups::Repo::open(&dir.join("backups")).unwrap();
    let taken =
        tokio::task::spawn_blocking(move || repo.take(stockade::local::backups::Kind::Incr))
            .await
            .unwrap()
            .expect("an incremental backup from the new leader");
    eprintln!("backup after the failovers: {}", taken.label);

    tokio::task::spawn_blocking(move || cluster.stop())
        .await
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    eprintln!("all phases in {:.1} s", started.elapsed().as_secs_f64());
}
