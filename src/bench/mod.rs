//! `stockade bench`: how far the app is from the database beneath it, measured in one run
//! on one machine.
//!
//! It starts a durable PostgreSQL (fsync and synchronous commit on) and Redis of its own
//! (or uses DATABASE_URL and REDIS_URL), then for each workload and strategy: a fresh
//! database, seeded through the ledger; one or more `stockade serve` processes; a warm-up;
//! a closed-loop HTTP load for `--duration` seconds; the commits the database made per
//! request; the invariant checker. Then `pgbench` runs the minimal SQL of the same work on
//! the same server ([`pgbench`]), and every app rate is shown as a share of pgbench's.
//!
//! Workloads: `hot-sku` (every order for one SKU), `uniform` (orders spread over many
//! SKUs), `sold-out` (every answer is 409), `product-page` (GET /products/{sku}) and
//! `refused` (orders refused before any database or Redis work: the app's own ceiling for
//! an order request, the limit no strategy can pass on this machine).

pub mod load;
pub mod pgbench;
pub mod report;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::{Args, ValueEnum};
use sqlx::PgPool;

use self::load::{Connections, Live, Load, Measured, Schedule, Work};
use self::report::{BenchReport, Derived, PostgresInfo, Row};
use crate::loadtest::check::{self, RedisTarget};
use crate::loadtest::servers::ServerProcess;
use crate::local::{LocalOptions, LocalServices};

/// Connections of the open loop (over all servers): at the rates it runs, each is due
/// again some 150–250 ms after its last request, longer than most answers take.
const OPEN_LOOP_CONNECTIONS: usize = 512;

/// What the requests do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Workload {
    /// Orders of one unit of one SKU whose stock never runs out.
    HotSku,
    /// Holds of one unit of that SKU (what the storefront's "Checkout" button places),
    /// through `POST /api/v1/holds`.
    HoldHot,
    /// Confirmations of holds of that SKU placed beforehand ("Place order"), each once,
    /// through `POST /api/v1/holds/{id}/confirm`.
    Confirm,
    /// Orders of one unit of a SKU picked uniformly from `--skus`.
    Uniform,
    /// Orders for a SKU with no stock: every answer is 409.
    SoldOut,
    /// GET /products/{sku}, the HTML page.
    ProductPage,
    /// Orders of quantity 0, refused (422) before any database or Redis work: HTTP, the API
    /// key, JSON and validation alone.
    Refused,
}

impl Workload {
    pub fn name(self) -> &'static str {
        match self {
            Self::HotSku => "hot-sku",
            Self::HoldHot => "hold-hot",
            Self::Confirm => "confirm",
            Self::Uniform => "uniform",
            Self::SoldOut => "sold-out",
            Self::ProductPage => "product-page",
            Self::Refused => "refused",
        }
    }

    /// Whether requests place orders (and so depend on the strategy and get checked).
    pub fn orders(self) -> bool {
        matches!(
            self,
            Self::HotSku | Self::HoldHot | Self::Confirm | Self::Uniform | Self::SoldOut
        )
    }

    /// The status every answer should have.
    pub fn expected_status(self) -> u16 {
        match self {
            Self::HotSku | Self::HoldHot | Self::Confirm | Self::Uniform => 201,
            Self::SoldOut => 409,
            Self::ProductPage => 200,
            Self::Refused => 422,
        }
    }
}

/// Holds the `confirm` workload's database starts with: more than a run confirms.
pub const CONFIRM_HOLDS: i64 = 300_000;

/// The id of the `n`th hold seeded for `confirm` (1-based), as the seed's SQL makes it.
pub fn bench_hold(n: i64) -> uuid::Uuid {
    uuid::Uuid::from_u128(n as u128)
}

/// Where orders are posted.
const ORDERS: &str = "/api/v1/orders";

/// The hot SKU (also the product page's and the holds').
pub const HOT_SKU: &str = "BENCH-HOT";
/// The SKU with no stock.
pub const SOLD_OUT_SKU: &str = "BENCH-SOLD";
/// Units of the hot SKU: more than any run can sell.
pub const HOT_STOCK: i32 = 10_000_000;
/// Units of each uniform SKU.
pub const UNIFORM_STOCK: i32 = 1_000_000;
/// The uniform SKUs' names in SQL, from pgbench's `:n` (see [`uniform_sku`]).
pub const UNIFORM_SKU_SQL: &str = "('BENCH-' || lpad(:n::text, 5, '0'))";

/// The `n`th uniform SKU (1-based).
pub fn uniform_sku(n: usize) -> String {
    format!("BENCH-{n:05}")
}

/// `stockade bench` options.
#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// Workloads to run, in order.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "hot-sku,uniform,sold-out,product-page,refused"
    )]
    pub workloads: Vec<Workload>,
    /// Order strategies to compare (the product page runs once, under the first).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "redis-lock,pg-atomic,batched",
        value_parser = clap::builder::PossibleValuesParser::new(["redis-lock", "pg-atomic", "batched"])
    )]
    pub strategies: Vec<String>,
    /// Concurrent request loops (closed loop) [default: 64; --quick: 16].
    #[arg(long)]
    pub connections: Option<usize>,
    /// Seconds of measured load per workload and strategy [default: 15; --quick: 3].
    #[arg(long)]
    pub duration: Option<u64>,
    /// Seconds of unmeasured load before each measurement [default: 2; --quick: 0.5].
    #[arg(long)]
    pub warmup: Option<f64>,
    /// SKUs of the uniform workload [default: 10000; --quick: 1000].
    #[arg(long)]
    pub skus: Option<usize>,
    /// CI-sized: a few seconds per workload, fewer connections and SKUs.
    #[arg(long)]
    pub quick: bool,
    /// Open-loop rate (requests/s) of the extra hot-sku `batched` line [default: 80 % of
    /// the closed-loop rate measured for it].
    #[arg(long)]
    pub rate: Option<f64>,
    /// `stockade serve` processes per strategy (connections are spread over them).
    #[arg(long, default_value_t = 1)]
    pub servers: usize,
    /// pgbench clients (`-c`).
    #[arg(long, default_value_t = 16)]
    pub pgbench_clients: usize,
    /// Folder for bench.json, bench.html and the pgbench scripts.
    #[arg(long, default_value = "bench-report")]
    pub out: PathBuf,
    /// No progress bars.
    #[arg(long)]
    pub quiet: bool,
    /// PostgreSQL to use instead of starting one (databases are created beside it).
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,
    /// Redis to use instead of starting one.
    #[arg(long, env = "REDIS_URL", hide_env_values = true)]
    pub redis_url: Option<String>,
    /// Serve with this `stockade` executable instead of this one (to measure another
    /// build, e.g. the previous release, on the same footing).
    #[arg(long)]
    pub server_exe: Option<PathBuf>,
    /// A setting for the served app, `NAME=value` (repeatable), e.g.
    /// `--set STOCKADE_BATCH_WAIT_US=500`.
    #[arg(long = "set", value_parser = setting)]
    pub settings: Vec<(String, String)>,
}

fn setting(raw: &str) -> Result<(String, String), String> {
    match raw.split_once('=') {
        Some((name, value)) if name.starts_with("STOCKADE_") => {
            Ok((name.to_string(), value.to_string()))
        }
        _ => Err("expected STOCKADE_NAME=value".into()),
    }
}

/// The options with `--quick` and the defaults applied.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Plan {
    pub workloads: Vec<Workload>,
    pub strategies: Vec<String>,
    pub connections: usize,
    pub duration_s: u64,
    pub warmup_s: f64,
    pub skus: usize,
    pub open_loop_rate: Option<f64>,
    pub servers: usize,
    pub pgbench_clients: usize,
    pub quick: bool,
    /// The executable serving the app.
    pub server_exe: PathBuf,
    /// Extra settings for the served app.
    pub settings: Vec<(String, String)>,
    #[serde(skip)]
    pub quiet: bool,
}

impl BenchArgs {
    fn plan(&self) -> anyhow::Result<Plan> {
        let quick = self.quick;
        let plan = Plan {
            workloads: self.workloads.clone(),
            strategies: self.strategies.clone(),
            connections: self.connections.unwrap_or(if quick { 16 } else { 64 }),
            duration_s: self.duration.unwrap_or(if quick { 3 } else { 15 }),
            warmup_s: self.warmup.unwrap_or(if quick { 0.5 } else { 2.0 }),
            skus: self.skus.unwrap_or(if quick { 1_000 } else { 10_000 }),
            open_loop_rate: self.rate,
            servers: self.servers.max(1),
            pgbench_clients: self.pgbench_clients.max(1),
            quick,
            server_exe: match &self.server_exe {
                Some(exe) => exe.clone(),
                None => std::env::current_exe().context("cannot find the stockade executable")?,
            },
            settings: self.settings.clone(),
            quiet: self.quiet,
        };
        if plan.workloads.is_empty() || plan.strategies.is_empty() {
            bail!("--workloads and --strategies must name at least one each");
        }
        if plan.connections == 0 || plan.duration_s == 0 {
            bail!("--connections and --duration must be positive");
        }
        if !(1..=99_999).contains(&plan.skus) {
            bail!("--skus must be between 1 and 99999");
        }
        if !(plan.warmup_s >= 0.0 && plan.warmup_s.is_finite()) {
            bail!("--warmup must be a number of seconds");
        }
        if plan
            .open_loop_rate
            .is_some_and(|r| !(r > 0.0 && r.is_finite()))
        {
            bail!("--rate must be a positive number of requests per second");
        }
        Ok(plan)
    }
}

/// Runs `stockade bench`; returns whether every invariant held.
pub async fn bench(args: BenchArgs) -> anyhow::Result<bool> {
    let plan = args.plan()?;
    let pgbench = pgbench::find()?;
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("cannot create {}", args.out.display()))?;

    // PostgreSQL and Redis: the given ones, or durable local ones in a temporary folder.
    let mut local = None;
    let (database_url, redis_url) = match (&args.database_url, &args.redis_url) {
        (Some(db), Some(redis)) => (db.clone(), redis.clone()),
        _ => {
            let dir = std::env::temp_dir().join(format!("stockade-bench-{}", std::process::id()));
            eprintln!(
                "starting a durable PostgreSQL and Redis in {}",
                dir.display()
            );
            let options = LocalOptions {
                ephemeral: false,
                ..LocalOptions::default()
            };
            let started = LocalServices::start(&dir, &options).await;
            let services = match started {
                Ok(services) => services,
                Err(e) => {
                    let _ = std::fs::remove_dir_all(&dir);
                    return Err(e);
                }
            };
            let urls = (services.database_url(), services.redis_url());
            if let Err(e) = recycled_wal(&urls.0).await {
                tokio::task::spawn_blocking(move || services.stop()).await?;
                let _ = std::fs::remove_dir_all(&dir);
                return Err(e.context("cannot prepare the bench's WAL"));
            }
            local = Some((services, dir));
            urls
        }
    };
    let bench = Bench {
        plan: &plan,
        pgbench,
        out: args.out.clone(),
        database_url,
        redis_url,
    };
    let result = bench.run().await;
    if let Some((services, dir)) = local {
        tokio::task::spawn_blocking(move || services.stop()).await?;
        let _ = std::fs::remove_dir_all(dir);
    }
    let report = result?;
    print!("{}", report::summary(&report));
    report::write(&report, &args.out)?;
    println!("\nreport: {}", args.out.join("bench.html").display());
    Ok(report.passed)
}

/// Gives the bench's fresh cluster what a server that has run a while has: WAL segments
/// written once and recycled, ready for the next ones.
///
/// A fresh cluster has none, so every 16 MB of WAL a new segment file is made while the
/// commit that needs it waits: created, extended, and fsynced together with its folder
/// (which makes the file system flush what was written since its last commit). At a
/// flash sale's rate of WAL that is one every second or two. A server in service does
/// not do this: its checkpoints rename old segments into the next ones, already allocated
/// on disk. Here: 2 GB of WAL written and checkpointed twice leaves 64 such segments
/// (1 GB, `min_wal_size`), and `max_wal_size` = 4 GB keeps a checkpoint from starting in
/// the middle of a measurement. pgbench runs on the same cluster, so both sides of every
/// ratio have the same WAL.
async fn recycled_wal(database_url: &str) -> anyhow::Result<()> {
    let db = PgPool::connect(database_url).await?;
    for setting in [
        "alter system set min_wal_size = '1GB'",
        "alter system set max_wal_size = '4GB'",
        "select pg_reload_conf()",
    ] {
        // Runtime: statements about the server, not the application's tables.
        sqlx::query(setting).execute(&db).await?;
    }
    for _ in 0..2 {
        sqlx::query(
            "select count(pg_logical_emit_message(false, 'stockade-bench',
                                                   repeat('0', 16 * 1024 * 1024)))
               from generate_series(1, 64)",
        )
        .execute(&db)
        .await?;
        sqlx::query("checkpoint").execute(&db).await?;
    }
    db.close().await;
    Ok(())
}

/// One bench run's fixed parts.
struct Bench<'a> {
    plan: &'a Plan,
    pgbench: PathBuf,
    out: PathBuf,
    /// The database to create the bench's databases beside (and to read statistics from).
    database_url: String,
    redis_url: String,
}

impl Bench<'_> {
    async fn run(&self) -> anyhow::Result<BenchReport> {
        let plan = self.plan;
        let admin = PgPool::connect(&self.database_url)
            .await
            .context("cannot connect to PostgreSQL")?;
        let postgres = postgres_info(&admin).await?;
        eprintln!(
            "PostgreSQL {} (fsync {}, synchronous_commit {}); pgbench: {}",
            postgres.version,
            postgres.fsync,
            postgres.synchronous_commit,
            self.pgbench.display()
        );
        let statements = statement_count(&admin, "postgres").await.is_some();
        let mut rows = Vec::new();
        let mut pgbench_runs = Vec::new();
        for &workload in &plan.workloads {
            let strategies = if workload.orders() {
                plan.strategies.clone()
            } else {
                plan.strategies[..1].to_vec()
            };
            let first = rows.len();
            for strategy in &strategies {
                rows.extend(self.app_run(&admin, workload, strategy, statements).await?);
            }
            let Some(pg) = self.pgbench_run(&admin, workload, None).await? else {
                continue;
            };
            for row in &mut rows[first..] {
                row.pgbench_tps = Some(pg.tps);
                row.ratio_to_pgbench = (pg.tps > 0.0).then(|| row.rate / pg.tps);
            }
            // The app's open-loop line gets pgbench's own: the same share of its own peak.
            let measured = &rows[first..];
            let open_share = measured.iter().find(|r| r.mode == "open").and_then(|open| {
                let closed = measured
                    .iter()
                    .find(|c| c.mode == "closed" && c.strategy == open.strategy)?;
                Some(open.offered_rate? / closed.rate)
            });
            let open = match open_share {
                Some(share) if pg.tps > 0.0 => {
                    self.pgbench_run(&admin, workload, Some(share * pg.tps))
                        .await?
                }
                _ => None,
            };
            pgbench_runs.push(pg);
            pgbench_runs.extend(open);
        }
        admin.close().await;
        let derived = derived_lines(&rows, &pgbench_runs);
        let passed = rows.iter().all(|r| r.invariants != Some(false));
        Ok(BenchReport {
            title: "Stockade bench: the app against the database beneath it".into(),
            postgres,
            parameters: plan.clone(),
            rows,
            pgbench: pgbench_runs,
            derived,
            passed,
        })
    }

    /// A fresh database for `label`, migrated and seeded for `workload`, with an unlimited
    /// API client for the bench's orders; its name, URL and the client's key (none when
    /// the serving build predates API clients).
    async fn database(
        &self,
        workload: Workload,
        label: &str,
    ) -> anyhow::Result<(String, String, Option<String>)> {
        let name = format!(
            "bench_{}_{}_{}",
            workload.name(),
            label,
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        )
        .replace('-', "_");
        let mut url = reqwest::Url::parse(&self.database_url).context("DATABASE_URL")?;
        url.set_path(&format!("/{name}"));
        crate::local::create_database(&self.database_url, &name).await?;
        let url = url.to_string();
        // Migrated by the build that will serve it, which may be another one.
        let migrated = tokio::process::Command::new(&self.plan.server_exe)
            .arg("migrate")
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("DATABASE_URL", &url)
            .env("STOCKADE_LOG", "error")
            .status()
            .await
            .with_context(|| format!("cannot run {}", self.plan.server_exe.display()))?;
        if !migrated.success() {
            bail!(
                "{} migrate failed ({migrated})",
                self.plan.server_exe.display()
            );
        }
        let db = PgPool::connect(&url).await?;
        seed(&db, workload, self.plan.skus).await?;
        let api_key =
            match crate::clients::create(&db, "bench", crate::clients::Limit::Unlimited).await {
                Ok((client, key)) => {
                    // The seeded holds are the client's, as if it had placed them.
                    sqlx::query("update holds set idempotency_key = $1 || ':' || idempotency_key")
                        .bind(client.id.to_string())
                        .execute(&db)
                        .await?;
                    Some(key)
                }
                // An older build (--server-exe) migrated no api_clients table, and takes
                // orders without a key.
                Err(crate::clients::ClientError::Database(sqlx::Error::Database(e)))
                    if e.code().as_deref() == Some("42P01") =>
                {
                    None
                }
                Err(e) => {
                    return Err(anyhow::Error::new(e).context("cannot make the bench's API client"));
                }
            };
        db.close().await;
        Ok((name, url, api_key))
    }

    /// Serves `workload` with `strategy`, loads it, counts commits, checks the invariants.
    /// The hot SKU under `batched` also gets the open-loop line.
    async fn app_run(
        &self,
        admin: &PgPool,
        workload: Workload,
        strategy: &str,
        statements: bool,
    ) -> anyhow::Result<Vec<Row>> {
        let plan = self.plan;
        let (name, url, api_key) = self.database(workload, strategy).await?;
        let prefix = format!("bench-{}:", uuid::Uuid::new_v4().simple());
        let mut env = vec![
            ("DATABASE_URL", url.clone()),
            ("REDIS_URL", self.redis_url.clone()),
            ("STOCKADE_REDIS_PREFIX", prefix.clone()),
            ("STOCKADE_LISTEN", "127.0.0.1:0".to_string()),
            ("STOCKADE_ORDER_STRATEGY", strategy.to_string()),
            ("STOCKADE_LOG", "error".to_string()),
        ];
        env.extend(plan.settings.iter().map(|(k, v)| (k.as_str(), v.clone())));
        let commits_before = commit_count(admin, &name).await?;
        let statements_before = if statements {
            statement_count(admin, &name).await
        } else {
            None
        };
        let mut servers = Vec::new();
        for _ in 0..plan.servers {
            servers.push(ServerProcess::start(&plan.server_exe, &env, &[]).await?);
        }
        let load = Load {
            targets: servers.iter().map(|s| s.address.clone()).collect(),
            work: match workload {
                Workload::HotSku => Work::Order {
                    path: ORDERS,
                    skus: Arc::new(vec![HOT_SKU.to_string()]),
                    quantity: 1,
                },
                Workload::HoldHot => Work::Order {
                    path: "/api/v1/holds",
                    skus: Arc::new(vec![HOT_SKU.to_string()]),
                    quantity: 1,
                },
                Workload::Confirm => Work::Confirm {
                    paths: Arc::new(
                        (1..=CONFIRM_HOLDS)
                            .map(|n| format!("/api/v1/holds/{}/confirm", bench_hold(n)))
                            .collect(),
                    ),
                    next: Arc::default(),
                },
                Workload::Uniform => Work::Order {
                    path: ORDERS,
                    skus: Arc::new((1..=plan.skus).map(uniform_sku).collect()),
                    quantity: 1,
                },
                Workload::SoldOut => Work::Order {
                    path: ORDERS,
                    skus: Arc::new(vec![SOLD_OUT_SKU.to_string()]),
                    quantity: 1,
                },
                Workload::Refused => Work::Order {
                    path: ORDERS,
                    skus: Arc::new(vec![HOT_SKU.to_string()]),
                    quantity: 0,
                },
                Workload::ProductPage => Work::Page {
                    path: format!("/products/{HOT_SKU}"),
                },
            },
            timeout: Duration::from_secs(10),
            api_key,
        };
        let label = format!("{} · {strategy}", workload.name());
        let closed = self
            .phases(admin, &load, plan.connections, Schedule::Closed, label)
            .await;
        // Every request of the server's life counts: commits are counted over all of it.
        let mut answered = closed.requests();
        let mut closed_row = closed.row(workload, strategy, None);
        let open = if workload == Workload::HotSku && strategy == "batched" {
            let rate = plan.open_loop_rate.unwrap_or(0.8 * closed_row.rate);
            // Connections kept open between requests, and a warm-up at the same rate.
            let label = format!("hot-sku · batched · open loop {rate:.0}/s");
            let schedule = Schedule::Open { rate };
            let open = self
                .phases(admin, &load, OPEN_LOOP_CONNECTIONS, schedule, label)
                .await;
            answered += open.requests();
            Some(open.row(workload, strategy, Some(rate)))
        } else {
            None
        };
        stop_all(servers).await;

        // Backends report their counts when they exit: wait for the servers' to be gone.
        wait_for_no_sessions(admin, &name).await;
        let commits = commit_count(admin, &name).await? - commits_before;
        let statements = match (statements_before, statement_count(admin, &name).await) {
            (Some(before), Some(after)) => Some(after - before),
            _ => None,
        };
        closed_row.commits_per_request = per_request(Some(commits), answered);
        closed_row.statements_per_request = per_request(statements, answered);

        let verdicts = if workload.orders() {
            let db = PgPool::connect(&url).await?;
            let redis = RedisTarget {
                url: self.redis_url.clone(),
                prefix,
            };
            let verdicts = check::check(&db, None, Some(&redis), check::default_stale_after())
                .await
                .map_err(|e| e.context("invariant check"));
            db.close().await;
            let verdicts = verdicts?;
            println!("\ninvariants after {} with {strategy}:", workload.name());
            check::print(&verdicts);
            Some(verdicts)
        } else {
            None
        };
        drop_database(admin, &name).await;
        let mut rows: Vec<Row> = std::iter::once(closed_row).chain(open).collect();
        for row in &mut rows {
            row.invariants = verdicts.as_ref().map(|v| v.iter().all(|v| v.pass));
            row.verdicts = verdicts.clone().unwrap_or_default();
        }
        Ok(rows)
    }

    /// A warm-up, then the measured phase, on `connections` connections kept from one to
    /// the other; the WAL written during the measured phase alone.
    async fn phases(
        &self,
        admin: &PgPool,
        load: &Load,
        connections: usize,
        schedule: Schedule,
        label: String,
    ) -> Phases {
        let mut connections = Connections::new(load, connections);
        let warmup = Duration::from_secs_f64(self.plan.warmup_s);
        let warm = connections
            .run(load, schedule, warmup, 1, Arc::default())
            .await;
        let duration = Duration::from_secs(self.plan.duration_s);
        let live = Arc::new(Live::default());
        let progress = self.progress(label, duration, live.clone());
        let wal_before = wal_position(admin).await;
        let measured = connections.run(load, schedule, duration, 2, live).await;
        let wal = wal_since(admin, wal_before).await;
        progress.finish();
        Phases {
            warm,
            measured,
            wal,
        }
    }

    /// pgbench with the minimal SQL of `workload`, on a fresh database of its own (none
    /// for a workload that writes and reads nothing).
    /// With `open_loop_rate`, pgbench schedules its transactions at that rate instead, and
    /// the result carries their latency from scheduled start.
    async fn pgbench_run(
        &self,
        admin: &PgPool,
        workload: Workload,
        open_loop_rate: Option<f64>,
    ) -> anyhow::Result<Option<pgbench::PgbenchResult>> {
        let Some((script_name, text)) = pgbench::script(workload, self.plan.skus) else {
            return Ok(None);
        };
        let script = self.out.join(format!("pgbench-{script_name}.sql"));
        std::fs::write(&script, text)?;
        let (name, url, _) = self.database(workload, "pgbench").await?;
        let live = Arc::new(Live::default());
        let duration = Duration::from_secs(self.plan.duration_s);
        let label = match open_loop_rate {
            Some(rate) => format!("pgbench · {script_name} · open loop {rate:.0}/s"),
            None => format!("pgbench · {script_name}"),
        };
        let progress = self.progress(label, duration, live);
        let logs = self.out.join("pgbench-open-loop-log");
        let wal_before = wal_position(admin).await;
        let result = pgbench::run(
            &self.pgbench,
            &url,
            &script_name,
            &script,
            self.plan.pgbench_clients,
            self.plan.duration_s,
            open_loop_rate.map(|rate| (rate, logs.as_path())),
        )
        .await;
        let _ = std::fs::remove_dir_all(&logs);
        progress.finish();
        wait_for_no_sessions(admin, &name).await;
        let wal = wal_since(admin, wal_before).await;
        drop_database(admin, &name).await;
        let mut result = result?;
        result.wal_per_transaction = per_request(wal, result.transactions + result.failed);
        match (result.offered_rate, result.p99_ms) {
            (Some(rate), Some(p99)) => eprintln!(
                "pgbench {script_name}, open loop at {rate:.0}/s: {:.0} transactions/s, \
                 p99 {p99:.1} ms from scheduled start ({} failed)",
                result.tps, result.failed
            ),
            _ => eprintln!(
                "pgbench {script_name}: {:.0} transactions/s ({} failed)",
                result.tps, result.failed
            ),
        }
        Ok(Some(result))
    }

    fn progress(&self, label: String, duration: Duration, live: Arc<Live>) -> Progress {
        Progress::start(self.plan.quiet, label, duration, live)
    }
}

/// A progress bar over a phase's duration, showing answers and their rate.
struct Progress {
    bar: Option<indicatif::ProgressBar>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Progress {
    fn start(quiet: bool, label: String, duration: Duration, live: Arc<Live>) -> Self {
        if quiet {
            return Self {
                bar: None,
                task: None,
            };
        }
        let bar = indicatif::ProgressBar::new(duration.as_millis() as u64);
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{prefix:>44} [{elapsed_precise}] {bar:30.green/white} {msg}",
            )
            .expect("valid template")
            .progress_chars("█▉ "),
        );
        bar.set_prefix(label);
        let shown = bar.clone();
        let started = Instant::now();
        let task = tokio::spawn(async move {
            loop {
                let elapsed = started.elapsed();
                let answers = live.answers.load(Ordering::Relaxed);
                shown.set_position((elapsed.as_millis() as u64).min(duration.as_millis() as u64));
                if answers > 0 {
                    shown.set_message(format!(
                        "{answers} answers · {:.0}/s",
                        answers as f64 / elapsed.as_secs_f64().max(1e-3)
                    ));
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        Self {
            bar: Some(bar),
            task: Some(task),
        }
    }

    fn finish(self) {
        if let Some(task) = self.task {
            task.abort();
        }
        if let Some(bar) = self.bar {
            bar.finish_and_clear();
        }
    }
}

async fn stop_all(servers: Vec<ServerProcess>) {
    let _ = tokio::task::spawn_blocking(move || {
        for mut server in servers {
            server.stop();
        }
    })
    .await;
}

/// Products and stock for `workload`, each with its `initial` ledger row (as
/// `inventory::db::create_stock` writes it), set-based so 10,000 SKUs take one commit.
async fn seed(db: &PgPool, workload: Workload, skus: usize) -> anyhow::Result<()> {
    let (names, units): (Vec<String>, i32) = match workload {
        Workload::HotSku
        | Workload::HoldHot
        | Workload::Confirm
        | Workload::ProductPage
        | Workload::Refused => (vec![HOT_SKU.into()], HOT_STOCK),
        Workload::Uniform => ((1..=skus).map(uniform_sku).collect(), UNIFORM_STOCK),
        Workload::SoldOut => (vec![SOLD_OUT_SKU.into()], 0),
    };
    let mut tx = db.begin().await?;
    sqlx::query!(
        r#"insert into products (sku, name, price_cents)
           select sku, 'Bench item ' || sku, $2 from unnest($1::text[]) sku"#,
        &names,
        pgbench::PRICE_CENTS,
    )
    .execute(&mut *tx)
    .await?;
    sqlx::query!(
        "insert into stock (sku, on_hand) select sku, $2 from unnest($1::text[]) sku",
        &names,
        units,
    )
    .execute(&mut *tx)
    .await?;
    sqlx::query!(
        r#"insert into stock_movements (sku, delta, reason, actor)
           select sku, $2, 'initial', 'bench' from unnest($1::text[]) sku"#,
        &names,
        units,
    )
    .execute(&mut *tx)
    .await?;
    if workload == Workload::Confirm {
        seed_holds(&mut tx).await?;
    }
    tx.commit().await?;
    Ok(())
}

/// [`CONFIRM_HOLDS`] active holds of one unit of the hot SKU ([`bench_hold`] names them),
/// with their lines, their stock reserved and a ledger row each, as placing them writes.
async fn seed_holds(tx: &mut sqlx::PgConnection) -> anyhow::Result<()> {
    let (n, sku, price) = (CONFIRM_HOLDS, HOT_SKU, pgbench::PRICE_CENTS);
    sqlx::query!(
        r#"insert into holds (id, state, expires_at, idempotency_scope, idempotency_key)
           select lpad(to_hex(n), 32, '0')::uuid, 'active', now() + interval '1 day',
                  'api-hold', 'bench-hold-' || n
             from generate_series(1, $1::bigint) as n"#,
        n,
    )
    .execute(&mut *tx)
    .await?;
    sqlx::query!(
        r#"insert into hold_lines (hold_id, sku, quantity, unit_price_cents)
           select lpad(to_hex(n), 32, '0')::uuid, $2, 1, $3
             from generate_series(1, $1::bigint) as n"#,
        n,
        sku,
        price,
    )
    .execute(&mut *tx)
    .await?;
    sqlx::query!(
        r#"insert into stock_movements (sku, delta, reserved_delta, reason, reference, actor)
           select $2, 0, 1, 'hold', lpad(to_hex(n), 32, '0')::uuid::text, 'api-hold'
             from generate_series(1, $1::bigint) as n"#,
        n,
        sku,
    )
    .execute(&mut *tx)
    .await?;
    sqlx::query!(
        "update stock set reserved = reserved + $1::bigint::int where sku = $2",
        n,
        sku,
    )
    .execute(&mut *tx)
    .await?;
    // pgbench's script confirms the holds in turn.
    sqlx::query!("create sequence pgbench_confirm")
        .execute(&mut *tx)
        .await?;
    Ok(())
}

/// Transactions committed in database `name` so far.
async fn commit_count(admin: &PgPool, name: &str) -> anyhow::Result<i64> {
    Ok(sqlx::query_scalar!(
        r#"select coalesce(xact_commit, 0)::bigint as "commits!"
             from pg_stat_database where datname = $1"#,
        name,
    )
    .fetch_optional(admin)
    .await?
    .unwrap_or(0))
}

/// A load's warm-up and its measured phase, with the bytes of WAL written during the latter.
struct Phases {
    warm: Measured,
    measured: Measured,
    wal: Option<i64>,
}

impl Phases {
    /// Requests sent in both phases.
    fn requests(&self) -> u64 {
        self.warm.requests() + self.measured.requests()
    }

    /// The measured phase's row (`rate`: the open loop's schedule, `None` for closed).
    fn row(&self, workload: Workload, strategy: &str, rate: Option<f64>) -> Row {
        let kind = if rate.is_some() { "open" } else { "closed" };
        let mut row = Row::of(workload, strategy, kind, rate, &self.measured);
        row.wal_per_request = per_request(self.wal, self.measured.requests());
        row
    }
}

/// The cluster's WAL insert position in bytes (`None` if it cannot be read). WAL is the
/// cluster's, not one database's: on the bench's own cluster only the phase being measured
/// writes; on a shared server, whatever else runs there counts too.
async fn wal_position(admin: &PgPool) -> Option<i64> {
    sqlx::query_scalar!(
        r#"select (pg_current_wal_insert_lsn() - '0/0'::pg_lsn)::bigint as "bytes!""#
    )
    .fetch_one(admin)
    .await
    .ok()
}

/// Bytes of WAL written since `before`.
async fn wal_since(admin: &PgPool, before: Option<i64>) -> Option<i64> {
    Some(wal_position(admin).await? - before?)
}

/// `total` over `requests`, when there were any.
fn per_request(total: Option<i64>, requests: u64) -> Option<f64> {
    total
        .filter(|_| requests > 0)
        .map(|t| t as f64 / requests as f64)
}

/// Statements executed in database `name` so far, when `pg_stat_statements` is there.
async fn statement_count(admin: &PgPool, name: &str) -> Option<i64> {
    // Runtime, not `query_scalar!`: the view exists only where the extension is installed,
    // which the database the macros are checked against need not have.
    sqlx::query_scalar(
        r#"select coalesce(sum(s.calls), 0)::bigint
             from pg_stat_statements s join pg_database d on d.oid = s.dbid
            where d.datname = $1"#,
    )
    .bind(name)
    .fetch_one(admin)
    .await
    .ok()
}

/// Waits (up to 10 s) until no session is connected to database `name`.
async fn wait_for_no_sessions(admin: &PgPool, name: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        let sessions = sqlx::query_scalar!(
            r#"select count(*) as "sessions!" from pg_stat_activity where datname = $1"#,
            name,
        )
        .fetch_one(admin)
        .await;
        if sessions.is_ok_and(|n| n == 0) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Drops a bench database; a failure only leaves it behind.
async fn drop_database(admin: &PgPool, name: &str) {
    // Identifiers cannot be bound; `name` is generated above.
    let sql = format!(r#"drop database if exists "{name}" with (force)"#);
    if let Err(e) = sqlx::query(sqlx::AssertSqlSafe(sql)).execute(admin).await {
        eprintln!("could not drop database {name}: {e}");
    }
}

async fn postgres_info(admin: &PgPool) -> anyhow::Result<PostgresInfo> {
    let show = |setting: &'static str| async move {
        sqlx::query_scalar!(r#"select current_setting($1) as "setting!""#, setting)
            .fetch_one(admin)
            .await
    };
    Ok(PostgresInfo {
        version: show("server_version").await?,
        fsync: show("fsync").await?,
        synchronous_commit: show("synchronous_commit").await?,
    })
}

/// The comparisons the table does not show at a glance.
fn derived_lines(rows: &[Row], pgbench: &[pgbench::PgbenchResult]) -> Vec<Derived> {
    let rate = |workload: Workload, strategy: &str| {
        rows.iter()
            .find(|r| r.workload == workload && r.strategy == strategy && r.mode == "closed")
            .map(|r| r.rate)
    };
    let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    };
    // The refused workload runs once, under the first strategy: its rate is the ceiling of
    // every strategy's order requests.
    let ceiling = rows
        .iter()
        .find(|r| r.workload == Workload::Refused && r.mode == "closed")
        .map(|r| r.rate);
    let mut lines = Vec::new();
    if let Some(value) = ratio(
        rate(Workload::HotSku, "batched"),
        rate(Workload::HotSku, "redis-lock"),
    ) {
        lines.push(Derived::ratio(
            "hot SKU: batched ÷ redis-lock",
            value,
            "orders/s with group commit over orders/s with a lease per order",
        ));
    }
    let mut strategies: Vec<&str> = Vec::new();
    for row in rows {
        if !strategies.contains(&row.strategy.as_str()) {
            strategies.push(&row.strategy);
        }
    }
    for strategy in strategies {
        if let Some(value) = ratio(
            rate(Workload::HoldHot, strategy),
            rate(Workload::HotSku, strategy),
        ) {
            lines.push(Derived::ratio(
                &format!("hold-hot ÷ hot SKU ({strategy})"),
                value,
                "holds/s (the checkout button) over orders/s of the same SKU",
            ));
        }
        if let Some(value) = ratio(
            rate(Workload::Confirm, strategy),
            rate(Workload::HotSku, strategy),
        ) {
            lines.push(Derived::ratio(
                &format!("confirm ÷ hot SKU ({strategy})"),
                value,
                "confirmations/s (\"Place order\") over orders/s of the same SKU",
            ));
        }
        if let Some(value) = ratio(
            rate(Workload::SoldOut, strategy),
            rate(Workload::HotSku, strategy),
        ) {
            lines.push(Derived::ratio(
                &format!("sold-out ÷ hot SKU ({strategy})"),
                value,
                "409 answers/s over orders/s: what refusing costs next to selling",
            ));
        }
        if let Some(value) = ratio(rate(Workload::SoldOut, strategy), ceiling) {
            lines.push(Derived::ratio(
                &format!("sold-out ÷ refused ({strategy})"),
                value,
                "409 answers/s over requests refused before any database or Redis work \
                 (the app's ceiling for an order request on this machine)",
            ));
        }
        if let Some(value) = ratio(ceiling, rate(Workload::HotSku, strategy)) {
            lines.push(Derived::ratio(
                &format!("refused ÷ hot SKU ({strategy})"),
                value,
                "the most any sold-out ÷ hot SKU ratio can reach here: a sold-out answer \
                 cannot be cheaper than a request refused with no work at all",
            ));
        }
    }
    if let Some(row) = rows
        .iter()
        .find(|r| r.workload == Workload::ProductPage && r.ratio_to_pgbench.is_some())
    {
        lines.push(Derived::ratio(
            "product page ÷ pgbench select",
            row.ratio_to_pgbench.unwrap_or_default(),
            "HTML pages/s over the page's query alone",
        ));
    }
    for row in rows.iter().filter(|r| r.mode == "open") {
        lines.push(Derived {
            name: format!(
                "open loop: hot SKU, {} at {:.0}/s",
                row.strategy,
                row.offered_rate.unwrap_or_default()
            ),
            value: row.p99_ms,
            shown: format!("p99 {:.1} ms", row.p99_ms),
            detail: "latency from each request's scheduled start, at 80 % of the closed-loop \
                     rate unless --rate says otherwise"
                .into(),
        });
        let own = pgbench
            .iter()
            .find(|p| p.script == "order-hot-sku" && p.offered_rate.is_some());
        if let Some((pg, pg_p99)) = own.and_then(|p| Some((p, p.p99_ms?)))
            && pg_p99 > 0.0
        {
            lines.push(Derived {
                name: format!("open loop p99: hot SKU, {} ÷ pgbench", row.strategy),
                value: row.p99_ms / pg_p99,
                shown: format!("{:.2}×", row.p99_ms / pg_p99),
                detail: format!(
                    "each at the same share of its own closed-loop peak: the app {:.1} ms at \
                     {:.0}/s, pgbench {pg_p99:.1} ms at {:.0}/s on the same server and disk",
                    row.p99_ms,
                    row.offered_rate.unwrap_or_default(),
                    pg.offered_rate.unwrap_or_default()
                ),
            });
        }
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: BenchArgs,
    }

    #[test]
    fn quick_shortens_what_was_not_given_and_keeps_what_was() {
        let plan = Cli::parse_from(["bench", "--quick", "--connections", "8"])
            .args
            .plan()
            .unwrap();
        assert_eq!(
            (plan.duration_s, plan.connections, plan.skus),
            (3, 8, 1_000)
        );
        let plan = Cli::parse_from(["bench"]).args.plan().unwrap();
        assert_eq!(
            (plan.duration_s, plan.connections, plan.skus),
            (15, 64, 10_000)
        );
        assert_eq!(plan.workloads.len(), 5);
        assert_eq!(plan.strategies, ["redis-lock", "pg-atomic", "batched"]);
    }

    #[test]
    fn each_strategy_gets_its_sold_out_lines_against_orders_and_the_ceiling() {
        let measured = |status: u16| load::Measured {
            seconds: 1.0,
            statuses: [(status, 10)].into(),
            latency: hdrhistogram::Histogram::new(3).unwrap(),
        };
        let mut rows = Vec::new();
        for workload in [Workload::HotSku, Workload::SoldOut] {
            for strategy in ["redis-lock", "batched"] {
                let m = measured(workload.expected_status());
                rows.push(Row::of(workload, strategy, "closed", None, &m));
            }
        }
        let names: Vec<String> = derived_lines(&rows, &[])
            .into_iter()
            .map(|d| d.name)
            .collect();
        assert_eq!(
            names,
            [
                "hot SKU: batched ÷ redis-lock",
                "sold-out ÷ hot SKU (redis-lock)",
                "sold-out ÷ hot SKU (batched)"
            ]
        );

        // The refused workload runs under the first strategy and serves every strategy.
        let refused = measured(Workload::Refused.expected_status());
        rows.push(Row::of(
            Workload::Refused,
            "redis-lock",
            "closed",
            None,
            &refused,
        ));
        let names: Vec<String> = derived_lines(&rows, &[])
            .into_iter()
            .map(|d| d.name)
            .collect();
        assert_eq!(
            names,
            [
                "hot SKU: batched ÷ redis-lock",
                "sold-out ÷ hot SKU (redis-lock)",
                "sold-out ÷ refused (redis-lock)",
                "refused ÷ hot SKU (redis-lock)",
                "sold-out ÷ hot SKU (batched)",
                "sold-out ÷ refused (batched)",
                "refused ÷ hot SKU (batched)"
            ]
        );
    }

    #[test]
    fn uniform_skus_in_rust_and_in_pgbench_sql_agree() {
        assert_eq!(uniform_sku(7), "BENCH-00007");
        assert!(UNIFORM_SKU_SQL.contains("lpad(:n::text, 5, '0')"));
        assert!(crate::catalog::Sku::parse(&uniform_sku(99_999)).is_ok());
    }
}
