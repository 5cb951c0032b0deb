//! The test harness. One PostgreSQL and one Redis are started per test run (on free ports,
//! in a temporary folder, by the same code as local mode) and stopped when the test binary
//! exits. Every test gets its own database, cloned from a migrated template, and its own
//! Redis key prefix, so tests run in parallel without sharing state.

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use actix_web::dev::ServerHandle;
use sqlx::PgPool;
use stockade::config::{LogFormat, Settings};
use stockade::local::{LocalPostgres, LocalRedis, create_database};
use stockade::startup::{Application, MIGRATOR};
use tokio::sync::OnceCell;
use uuid::Uuid;

/// The servers of this test run.
pub struct Servers {
    /// `postgres://user:password@host:port/` — append a database name.
    pub pg_base: String,
    pub redis_url: String,
    pub root: PathBuf,
}

mod browser;
pub mod processes;

pub use browser::browser;

const TEMPLATE_DB: &str = "stockade_template";

static SERVERS: OnceCell<Servers> = OnceCell::const_new();
/// Owned processes, stopped at exit (statics are never dropped).
static PROCESSES: Mutex<Option<(LocalPostgres, LocalRedis)>> = Mutex::new(None);
/// Serialises `create database ... template`, which refuses concurrent use of the template.
static CREATE_DB: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

extern "C" fn stop_servers_at_exit() {
    let mut root = None;
    if let Ok(mut guard) = PROCESSES.lock()
        && let Some((mut pg, mut redis)) = guard.take()
    {
        redis.stop();
        pg.stop();
        root = pg.data_dir.parent().map(PathBuf::from);
    }
    // Then chromedriver, its browsers, and anything a test left running.
    processes::reap();
    if let Some(root) = root {
        let _ = std::fs::remove_dir_all(root);
    }
}

pub async fn servers() -> &'static Servers {
    SERVERS
        .get_or_init(|| async {
            stockade::install_tls_provider();
            let root = std::env::temp_dir().join(format!("stockade-tests-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&root);
            std::fs::create_dir_all(&root).unwrap();
            let (pg_dir, redis_dir) = (root.join("postgres"), root.join("redis"));
            let (pg, redis) = tokio::task::spawn_blocking(move || {
                let pg = LocalPostgres::start(&pg_dir, None, true, None).expect("start PostgreSQL");
                let redis = LocalRedis::start(&redis_dir, None).expect("start Redis");
                (pg, redis)
            })
            .await
            .unwrap();
            let servers = Servers {
                pg_base: pg.url(""),
                redis_url: redis.url(),
                root,
            };
            *PROCESSES.lock().unwrap() = Some((pg, redis));
            // SAFETY: registers a plain `extern "C"` function with no preconditions.
            unsafe { libc::atexit(stop_servers_at_exit) };

            create_database(&servers.url("postgres"), TEMPLATE_DB)
                .await
                .unwrap();
            let pool = PgPool::connect(&servers.url(TEMPLATE_DB)).await.unwrap();
            MIGRATOR.run(&pool).await.expect("migrations apply");
            pool.close().await;
            servers
        })
        .await
}

impl Servers {
    /// A new, unique folder path under the run's root, named `{prefix}-{uuid}` (not created).
    pub fn fresh_dir(&self, prefix: &str) -> PathBuf {
        self.root
            .join(format!("{prefix}-{}", Uuid::new_v4().simple()))
    }

    pub fn url(&self, database: &str) -> String {
        format!("{}{database}", self.pg_base)
    }
}

/// A fresh database cloned from the migrated template; returns its URL.
pub async fn fresh_database() -> String {
    let servers = servers().await;
    let name = format!("test_{}", Uuid::new_v4().simple());
    let _serial = CREATE_DB.lock().await;
    let conn = sqlx::PgPool::connect(&servers.url("postgres"))
        .await
        .unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        r#"create database "{name}" template "{TEMPLATE_DB}""#
    )))
    .execute(&conn)
    .await
    .unwrap();
    conn.close().await;
    drop(conn);
    servers.url(&name)
}

/// Settings for a test server: port 0, its own database and Redis prefix.
pub async fn test_settings() -> Settings {
    let servers = servers().await;
    let log = std::env::var("TEST_LOG").ok();
    Settings {
        listen: "127.0.0.1:0".parse().unwrap(),
        database_url: Some(fresh_database().await.into()),
        redis_url: Some(servers.redis_url.clone().into()),
        redis_prefix: format!("test:{}:", Uuid::new_v4().simple()),
        workers: 2,
        db_pool_size: 8,
        // Patient: tests run in parallel on a small machine, and most count exact
        // outcomes; the fault tests set the production budgets themselves.
        request_budget: Duration::from_secs(10),
        db_acquire_timeout: Duration::from_secs(5),
        lease_wait: Duration::from_secs(2),
        // Pages show the database as it is; the cache has a test of its own.
        page_cache: Duration::ZERO,
        // `/metrics` is off the public port unless a token is set; tests read it with one.
        metrics_token: Some(METRICS_TOKEN.into()),
        // Most tests send anonymous API orders, many of them fast from one address;
        // `clients.rs` tests keys, the default (off) and the limits.
        api_anonymous_orders: true,
        rate_limit_per_minute: UNLIMITED_RATE,
        rate_limit_burst: UNLIMITED_RATE,
        // Likewise their holds: many shoppers' from one address (`hoarding.rs` tests the
        // cap per address; the cap per shopper stays as shipped).
        hold_max_per_sku_per_address: UNLIMITED_HOLDS,
        // And their drop queues: many shoppers from 127.0.0.1 (`drops.rs` tests the cap).
        drop_places_per_address: 0,
        // Webhook receivers in tests listen on 127.0.0.1, and events go out quickly (but an
        // idle dispatcher, one per test app, costs the shared machine little).
        webhook_allow_private: true,
        dispatch_interval: Duration::from_millis(200),
        delivery_backoff: Duration::from_millis(50),
        log_format: LogFormat::Pretty,
        log_filter: log.clone().unwrap_or_else(|| "off".into()),
        ..Settings::default()
    }
}

/// The bearer token test servers serve `/metrics` to (see [`TestApp::metrics`]).
pub const METRICS_TOKEN: &str = "test-metrics-token-0123456789";
/// A rate limit no test reaches by accident.
pub const UNLIMITED_RATE: u32 = 1_000_000;
/// A cap on one address's holds no test reaches by accident.
pub const UNLIMITED_HOLDS: i32 = 1_000_000;

pub const ADMIN_USER: &str = "ada";
pub const ADMIN_PASSWORD: &str = "correct horse battery staple";

/// A running application and a client for it.
pub struct TestApp {
    pub address: String,
    /// `http://127.0.0.1:port` of the metrics listener, when `metrics_listen` is set.
    pub metrics_address: Option<String>,
    pub db: PgPool,
    pub settings: Settings,
    /// A client that keeps cookies and does not follow redirects.
    pub client: reqwest::Client,
    handle: ServerHandle,
    thread: Option<std::thread::JoinHandle<()>>,
    own_redis: Option<LocalRedis>,
}

/// Starts the application in this process with default test settings.
pub async fn spawn_app() -> TestApp {
    spawn_app_with(test_settings().await).await
}

/// Starts the application with `settings` on its own thread and runtime, exactly as
/// `stockade serve` builds it.
pub async fn spawn_app_with(settings: Settings) -> TestApp {
    if let Ok(filter) = std::env::var("TEST_LOG") {
        stockade::telemetry::init(LogFormat::Pretty, &filter);
    }
    let (tx, rx) = tokio::sync::oneshot::channel();
    let app_settings = settings.clone();
    let thread = std::thread::spawn(move || {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async move {
            let app = Application::build(app_settings).await.expect("app builds");
            tx.send((app.port(), app.metrics_port(), app.handle())).ok();
            app.run_until_stopped().await.unwrap();
        });
    });
    let (port, metrics_port, handle) = rx.await.expect("app started");
    let db = PgPool::connect(settings.database_url.as_deref().unwrap())
        .await
        .unwrap();
    TestApp {
        address: format!("http://127.0.0.1:{port}"),
        metrics_address: metrics_port.map(|p| format!("http://127.0.0.1:{p}")),
        db,
        settings,
        client: client(),
        handle,
        thread: Some(thread),
        own_redis: None,
    }
}

/// Starts the application with a Redis server of its own, which the test may stop.
pub async fn spawn_app_with_own_redis() -> TestApp {
    spawn_app_with_own_redis_and(test_settings().await).await
}

/// [`spawn_app_with_own_redis`] with `settings` (whose Redis URL it replaces).
pub async fn spawn_app_with_own_redis_and(mut settings: Settings) -> TestApp {
    let dir = servers().await.fresh_dir("redis");
    let redis = tokio::task::spawn_blocking(move || LocalRedis::start(&dir, None).unwrap())
        .await
        .unwrap();
    settings.redis_url = Some(redis.url().into());
    let mut app = spawn_app_with(settings).await;
    app.own_redis = Some(redis);
    app
}

/// The storefront CSRF token a page embeds (its `csrf-token` meta element).
pub fn csrf_in(html: &str) -> String {
    let marker = r#"<meta name="csrf-token" content=""#;
    let start = html.find(marker).expect("pages carry the token") + marker.len();
    html[start..start + 64].to_string()
}

/// Stops at every redirect, so tests see where it points, but for the one a browser takes
/// after every form: to the page that answers it (`/shown/…`, Post/Redirect/Get), whose
/// status and page the test then sees as a browser would.
pub fn redirects() -> reqwest::redirect::Policy {
    reqwest::redirect::Policy::custom(
        |attempt| match attempt.url().path().starts_with("/shown/") {
            true => attempt.follow(),
            false => attempt.stop(),
        },
    )
}

pub fn client() -> reqwest::Client {
    stockade::install_tls_provider();
    reqwest::Client::builder()
        .redirect(redirects())
        .cookie_store(true)
        .timeout(Duration::from_secs(30))
        // Under the servers' keep-alive (actix's 5 s): a connection idle longer may be
        // closed by the server just as a request reuses it (an incomplete message).
        .pool_idle_timeout(Duration::from_secs(2))
        .build()
        .unwrap()
}

impl TestApp {
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.address)
    }

    pub async fn get(&self, path: &str) -> reqwest::Response {
        self.client.get(self.url(path)).send().await.unwrap()
    }

    pub async fn get_text(&self, path: &str) -> (u16, String) {
        let res = self.get(path).await;
        let status = res.status().as_u16();
        (status, res.text().await.unwrap())
    }

    /// The storefront CSRF token of this client (its cookie, as pages embed it).
    pub async fn csrf(&self) -> String {
        let (_, html) = self.get_text("/").await;
        csrf_in(&html)
    }

    /// Creates the test admin ([`ADMIN_USER`]), unless it exists.
    pub async fn create_admin(&self) {
        match stockade::admin::create_admin(&self.db, ADMIN_USER, ADMIN_PASSWORD).await {
            Ok(()) | Err(stockade::admin::AccountError::Exists(_)) => {}
            Err(e) => panic!("{e}"),
        }
    }

    /// Places a hold of `lines` under `key` through the API; the hold's JSON.
    pub async fn place_hold(&self, key: &str, lines: &[(&str, i64)]) -> serde_json::Value {
        let res = post_lines(&self.client, &self.url("/api/v1/holds"), key, lines).await;
        assert_eq!(res.status().as_u16(), 201, "hold {key} placed");
        res.json().await.unwrap()
    }

    /// Creates admin `ada` (once) and logs this client in; returns the session's CSRF token.
    pub async fn login_admin(&self) -> String {
        self.create_admin().await;
        let res = self.login(ADMIN_USER, ADMIN_PASSWORD).await;
        assert_eq!(res.status().as_u16(), 303, "login works");
        self.admin_csrf().await
    }

    /// POSTs the login form.
    pub async fn login(&self, username: &str, password: &str) -> reqwest::Response {
        let csrf = self.csrf().await;
        self.client
            .post(self.url("/admin/login"))
            .form(&[
                ("csrf", csrf.as_str()),
                ("username", username),
                ("password", password),
            ])
            .send()
            .await
            .unwrap()
    }

    /// The CSRF token of this client's admin session (from the logout form).
    pub async fn admin_csrf(&self) -> String {
        let (status, html) = self.get_text("/admin").await;
        assert_eq!(status, 200, "logged in");
        let marker = r#"action="/admin/logout" class="logout">"#;
        let form = &html[html.find(marker).expect("logout form")..];
        let marker = r#"name="csrf" value=""#;
        let start = form.find(marker).unwrap() + marker.len();
        form[start..start + 64].to_string()
    }

    /// POSTs an admin form (`pairs` carry its `csrf`).
    pub async fn admin_post(&self, path: &str, pairs: &[(&str, &str)]) -> reqwest::Response {
        self.client
            .post(self.url(path))
            .form(pairs)
            .send()
            .await
            .unwrap()
    }

    /// Adds the demo catalogue to this test's database.
    pub async fn seed_demo(&self) {
        stockade::seed::seed_demo(&self.db).await.unwrap();
    }

    /// Adds one product with `on_hand` units.
    pub async fn add_product(&self, sku: &str, name: &str, price_cents: i64, on_hand: i32) {
        let mut tx = self.db.begin().await.unwrap();
        sqlx::query!(
            "insert into products (sku, name, price_cents) values ($1, $2, $3)",
            sku,
            name,
            price_cents
        )
        .execute(&mut *tx)
        .await
        .unwrap();
        let sku = stockade::catalog::Sku::parse(sku).unwrap();
        stockade::inventory::db::create_stock(&mut tx, &sku, on_hand, "test")
            .await
            .unwrap();
        tx.commit().await.unwrap();
    }

    /// Stops this app's own Redis (see [`spawn_app_with_own_redis`]).
    pub fn stop_redis(&mut self) {
        self.own_redis
            .as_mut()
            .expect("app has its own Redis")
            .stop();
    }

    /// Starts this app's own Redis again, empty, on the same port.
    pub async fn restart_redis(&mut self) {
        let old = self.own_redis.take().expect("app has its own Redis");
        let (dir, port) = (old.wanted.clone(), old.port);
        drop(old);
        let redis =
            tokio::task::spawn_blocking(move || LocalRedis::start(&dir, Some(port)).unwrap())
                .await
                .unwrap();
        self.own_redis = Some(redis);
    }

    /// A direct Redis connection to this app's server.
    pub async fn redis(&self) -> redis::aio::MultiplexedConnection {
        redis::Client::open(self.settings.redis_url.as_deref().unwrap().to_string())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap()
    }

    /// Lease keys left in Redis under this app's prefix.
    pub async fn leftover_leases(&self) -> Vec<String> {
        let url = self.settings.redis_url.as_deref().unwrap();
        stockade::locking::Redis::connect_lazy(url, &self.settings.redis_prefix)
            .unwrap()
            .held_leases()
            .await
            .unwrap()
    }

    /// Waits until no lease is held under this app's prefix; panics, naming them, if some
    /// still are after `within` (a release may come just after an answer).
    pub async fn wait_for_no_leases(&self, within: Duration) {
        let since = std::time::Instant::now();
        loop {
            let left = self.leftover_leases().await;
            if left.is_empty() {
                return;
            }
            assert!(
                since.elapsed() < within,
                "leases still held after {within:?}: {left:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The app's `/metrics`, read with the test token.
    pub async fn metrics(&self) -> String {
        let res = self
            .client
            .get(self.url("/metrics"))
            .bearer_auth(METRICS_TOKEN)
            .send()
            .await
            .unwrap();
        assert_eq!(
            res.status().as_u16(),
            200,
            "metrics are served with the token"
        );
        res.text().await.unwrap()
    }

    /// Whether the app says its lease layer is degraded (`/metrics`).
    pub async fn lease_layer_degraded(&self) -> bool {
        self.metrics()
            .await
            .lines()
            .any(|l| l == "stockade_lease_layer_degraded 1")
    }

    /// Waits for the lease layer's breaker to close, failing if it takes a second.
    pub async fn assert_leases_back_within_a_second(&self) {
        let since = std::time::Instant::now();
        while self.lease_layer_degraded().await {
            assert!(
                since.elapsed() < Duration::from_secs(1),
                "the breaker is still open a second after Redis came back"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// POSTs an API order of `lines` under `key`.
    pub async fn post_order(&self, key: &str, lines: &[(&str, i64)]) -> reqwest::Response {
        post_order_to(&self.client, &self.address, key, lines).await
    }

    /// Stock of `sku`: `(on_hand, reserved)`.
    pub async fn stock(&self, sku: &str) -> (i32, i32) {
        let row = sqlx::query!("select on_hand, reserved from stock where sku = $1", sku)
            .fetch_one(&self.db)
            .await
            .unwrap();
        (row.on_hand, row.reserved)
    }

    /// Runs the hold sweeper over this app's database once, as a process's sweeper would;
    /// how many holds it released.
    pub async fn sweep_holds(&self) -> usize {
        let redis = stockade::locking::Redis::connect_lazy(
            self.settings.redis_url.as_deref().unwrap(),
            &self.settings.redis_prefix,
        )
        .unwrap();
        stockade::holds::sweep(&self.db, &redis, 100).await.unwrap()
    }

    /// Waits until `sql` counts at least one row; panics, saying so, after 30 s.
    pub async fn wait_for_a_row(&self, sql: &'static str) {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while self.count(sql).await == 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "no row within 30 s: {sql}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    pub async fn count(&self, sql: &'static str) -> i64 {
        // Runtime: the statement is the caller's.
        sqlx::query_scalar(sql).fetch_one(&self.db).await.unwrap()
    }

    /// Checks invariants I1–I3 (see the README) on this app's database.
    pub async fn assert_invariants(&self) {
        let mismatches = stockade::inventory::db::ledger_mismatches(&self.db)
            .await
            .unwrap();
        assert!(
            mismatches.is_empty(),
            "I1: ledger disagrees with stock: {mismatches:?}"
        );
        // Units sold per SKU by orders equal the ledger's order movements.
        let disagreements: Vec<(String, i64, i64)> = sqlx::query!(
            r#"select s.sku,
                      coalesce((select sum(l.quantity) from order_lines l where l.sku = s.sku), 0)::bigint as "sold!",
                      coalesce((select -sum(m.delta) from stock_movements m
                                 where m.sku = s.sku and m.reason = 'order'), 0)::bigint as "ledger!"
                 from stock s"#,
        )
        .fetch_all(&self.db)
        .await
        .unwrap()
        .into_iter()
        .map(|r| (r.sku, r.sold, r.ledger))
        .filter(|(_, sold, ledger)| sold != ledger)
        .collect();
        assert!(
            disagreements.is_empty(),
            "I1: orders vs ledger: {disagreements:?}"
        );
        let negative = self
            .count("select count(*) from stock where on_hand < 0 or reserved < 0")
            .await;
        assert_eq!(negative, 0, "I2: negative stock");
        let doubled = self
            .count("select count(*) from (select 1 from orders group by idempotency_scope, idempotency_key having count(*) > 1) d")
            .await;
        assert_eq!(doubled, 0, "I3: two orders for one key");
    }
}

/// POSTs an API order to `base`.
pub async fn post_order_to(
    client: &reqwest::Client,
    base: &str,
    key: &str,
    lines: &[(&str, i64)],
) -> reqwest::Response {
    post_lines(client, &format!("{base}/api/v1/orders"), key, lines).await
}

/// POSTs `{"lines": [...]}` under `key` to `url` (orders and holds take the same body).
pub async fn post_lines(
    client: &reqwest::Client,
    url: &str,
    key: &str,
    lines: &[(&str, i64)],
) -> reqwest::Response {
    let lines: Vec<serde_json::Value> = lines
        .iter()
        .map(|(sku, q)| serde_json::json!({"sku": sku, "quantity": q}))
        .collect();
    client
        .post(url)
        .header("Idempotency-Key", key)
        .json(&serde_json::json!({ "lines": lines }))
        .send()
        .await
        .unwrap()
}

impl Drop for TestApp {
    fn drop(&mut self) {
        let handle = self.handle.clone();
        // The server runs on its own runtime; wait for it from a plain thread.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(handle.stop(false));
        })
        .join();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

pub use stockade::loadtest::servers::ServerProcess;

/// Runs `stockade serve` (the built binary) with exactly `env` (plus `PATH`).
pub async fn serve(env: &[(&str, String)], args: &[&str]) -> ServerProcess {
    let mut env = env.to_vec();
    env.push((
        "STOCKADE_LOG",
        std::env::var("TEST_LOG").unwrap_or_else(|_| "warn".into()),
    ));
    // The environment is exactly `env`: the run's mark goes in by hand.
    env.push((processes::MARK, processes::run_mark().to_string()));
    ServerProcess::start(
        std::path::Path::new(env!("CARGO_BIN_EXE_stockade")),
        &env,
        args,
    )
    .await
    .unwrap()
}

/// A `stockade serve` process serving `app`'s database and Redis prefix.
pub async fn serve_app(app: &TestApp, extra: &[(&str, String)], args: &[&str]) -> ServerProcess {
    let s = &app.settings;
    let mut env = vec![
        (
            "DATABASE_URL",
            s.database_url.as_deref().unwrap().to_string(),
        ),
        ("REDIS_URL", s.redis_url.as_deref().unwrap().to_string()),
        ("STOCKADE_REDIS_PREFIX", s.redis_prefix.clone()),
        ("STOCKADE_LISTEN", "127.0.0.1:0".into()),
        ("STOCKADE_WORKERS", "2".into()),
        ("STOCKADE_DB_POOL_SIZE", "8".into()),
        // Patient, as in `test_settings`; `extra` may set the production budgets.
        ("STOCKADE_REQUEST_BUDGET_MS", "10000".into()),
        ("STOCKADE_DB_ACQUIRE_TIMEOUT_MS", "5000".into()),
        ("STOCKADE_LEASE_WAIT_MS", "2000".into()),
        ("STOCKADE_PAGE_CACHE_MS", "0".into()),
        // As in `test_settings`; `extra` may turn them back.
        ("STOCKADE_API_ANONYMOUS_ORDERS", "true".into()),
        ("STOCKADE_RATE_LIMIT_PER_MINUTE", UNLIMITED_RATE.to_string()),
        ("STOCKADE_RATE_LIMIT_BURST", UNLIMITED_RATE.to_string()),
        (
            "STOCKADE_HOLD_MAX_PER_SKU_PER_ADDRESS",
            UNLIMITED_HOLDS.to_string(),
        ),
        ("STOCKADE_DROP_PLACES_PER_ADDRESS", "0".into()),
        ("STOCKADE_METRICS_TOKEN", METRICS_TOKEN.into()),
        // As in `test_settings`.
        ("STOCKADE_WEBHOOK_ALLOW_PRIVATE", "true".into()),
        ("STOCKADE_DISPATCH_INTERVAL_MS", "200".into()),
        ("STOCKADE_DELIVERY_BACKOFF_MS", "50".into()),
    ];
    env.extend(extra.iter().cloned());
    serve(&env, args).await
}

/// Where screenshots go: `docs/` of the repository.
pub fn docs_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("docs")
}

/// The value of the form field `name` (`name="…" value="…"`) in `html`.
pub fn hidden(html: &str, name: &str) -> String {
    let marker = format!(r#"name="{name}" value=""#);
    let start = html
        .find(&marker)
        .unwrap_or_else(|| panic!("no {name} in {html}"))
        + marker.len();
    html[start..start + html[start..].find('"').unwrap()].to_string()
}
