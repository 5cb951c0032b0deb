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
//! Workloads (`workload.rs`): `hot-sku` (every order for one SKU), `hold-hot` (every hold
//! for it: the checkout button), `confirm` (confirmations of holds placed beforehand:
//! "Place order"), `cart`, `storefront` (shoppers through the shop's pages and forms,
//! product page to "Place order": `storefront.rs`), `uniform` (orders spread over many
//! SKUs), `sold-out` (every answer is 409), `product-page` (GET /products/{sku} of a random
//! SKU, with the page cache off), `search` (the catalogue searched for a word, cache off)
//! and `refused` (orders refused before any database or Redis work: the app's own ceiling
//! for an order request, the limit no strategy can pass on this machine).
//!
//! The files: `args.rs` the options and the plan (`default` resolved to the build's
//! strategy), `workload.rs` what each workload sends and seeds, `load.rs` the request
//! loops, `storefront.rs` the shoppers' flow and loops, `db.rs` what is read of the
//! database server, `pgbench.rs` its scripts and runs, `report.rs` the table and the
//! files, `derived.rs` the comparisons below the table; this one runs them in order.

mod args;
mod db;
mod derived;
pub mod load;
mod paid;
pub mod pgbench;
mod phases;
mod plot;
mod progress;
pub mod report;
pub mod rows;
pub mod soak;
mod storefront;
mod workload;

pub use args::{BenchArgs, Plan, Strategy};
pub use workload::*;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use sqlx::PgPool;

use self::db::{
    commit_count, drop_database, per_request, postgres_info, statement_count, wait_for_no_sessions,
    wal_position, wal_since,
};
use self::derived::derived_lines;
use self::load::{Live, Load};
use self::progress::Progress;
use self::report::BenchReport;
use self::rows::Row;
use crate::loadtest::check::{self, RedisTarget};
use crate::loadtest::servers::ServerProcess;
use crate::local::{LocalOptions, LocalServices};

/// Connections of the open loop (over all servers): at the rates it runs, each is due
/// again some 150–250 ms after its last request, longer than most answers take.
const OPEN_LOOP_CONNECTIONS: usize = 512;

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
/// (1 GB, `min_wal_size`); local mode's `max_wal_size` and `checkpoint_timeout` (see
/// `local::postgres`) keep a checkpoint from starting in the middle of a measurement.
/// pgbench runs on the same cluster, so both sides of every ratio have the same WAL.
async fn recycled_wal(database_url: &str) -> anyhow::Result<()> {
    let db = PgPool::connect(database_url).await?;
    for setting in [
        "alter system set min_wal_size = '1GB'",
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
        if let Some(minutes) = plan.soak_minutes {
            let report = self.soak_all(&admin, postgres, minutes).await;
            admin.close().await;
            return report;
        }
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
            soak: Vec::new(),
            soak_verdicts: Vec::new(),
            passed,
        })
    }

    /// `--soak`: each workload in turn under the first strategy.
    async fn soak_all(
        &self,
        admin: &PgPool,
        postgres: rows::PostgresInfo,
        minutes: u64,
    ) -> anyhow::Result<BenchReport> {
        let strategy = &self.plan.strategies[0];
        let minute = Duration::from_secs(self.plan.soak_minute_s);
        let (mut rows, mut soak, mut soak_verdicts) = (Vec::new(), Vec::new(), Vec::new());
        for &workload in &self.plan.workloads {
            let soaked = self
                .soak(admin, workload, strategy, minutes, minute)
                .await?;
            let mut peak = soaked.peak;
            peak.verdicts = soaked.verdicts;
            rows.push(peak);
            soak.extend(soaked.rows);
            soak_verdicts.extend(soaked.verdict);
        }
        let passed = rows.iter().all(|r| r.invariants != Some(false));
        Ok(BenchReport {
            title: format!("Stockade bench: a {minutes}-minute soak"),
            postgres,
            parameters: self.plan.clone(),
            rows,
            pgbench: Vec::new(),
            derived: Vec::new(),
            soak,
            soak_verdicts,
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
        let migrated = crate::children::mark_tokio(
            tokio::process::Command::new(&self.plan.server_exe)
                .arg("migrate")
                .env_clear()
                .env("PATH", std::env::var("PATH").unwrap_or_default()),
        )
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
        seed(&db, workload, self.plan.skus, self.plan.confirm_holds()).await?;
        let api_key =
            match crate::clients::create(&db, "bench", crate::clients::Limit::Unlimited).await {
                Ok((client, key)) => {
                    crate::clients::allow_unpaid_orders(&db, client.id).await?;
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
    /// The hot SKU under `batched` also gets the open-loop line, and so does the storefront
    /// under every strategy.
    async fn app_run(
        &self,
        admin: &PgPool,
        workload: Workload,
        strategy: &Strategy,
        statements: bool,
    ) -> anyhow::Result<Vec<Row>> {
        let plan = self.plan;
        let (name, url, api_key) = self.database(workload, &strategy.name).await?;
        let prefix = format!("bench-{}:", uuid::Uuid::new_v4().simple());
        let mut env = self.server_env(&url, &prefix, workload, strategy);
        // A paid checkout pays through a fresh provider of its own.
        let provider_dir = self.out.join(format!("localstripe-{}", strategy.name));
        let provider = match workload {
            Workload::PaidCheckout => {
                let (stripe, settings) = paid::provider(&provider_dir)?;
                env.extend(settings);
                Some(stripe)
            }
            _ => None,
        };
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
        let targets: Vec<String> = servers.iter().map(|s| s.address.clone()).collect();
        // Every request of the server's life counts: commits are counted over all of it.
        let (mut closed_row, open, answered) = match workload.work(plan.skus, plan.confirm_holds())
        {
            Some(work) => {
                let load = Load {
                    targets,
                    work,
                    timeout: Duration::from_secs(10),
                    api_key,
                };
                self.requests(admin, &load, workload, &strategy.name).await
            }
            None => match &provider {
                Some(stripe) => {
                    let measured = paid::measure(
                        self,
                        &targets,
                        &strategy.name,
                        api_key,
                        stripe,
                        &provider_dir,
                    )
                    .await;
                    match measured {
                        Ok((row, begun)) => (row, None, begun),
                        Err(e) => {
                            stop_all(servers).await;
                            return Err(e.context("the paid checkout"));
                        }
                    }
                }
                None => storefront::measure(self, admin, &targets, &strategy.name).await,
            },
        };
        stop_all(servers).await;
        drop(provider);
        let _ = std::fs::remove_dir_all(&provider_dir);

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
            let (workload, strategy) = (workload.name(), strategy.label());
            println!("\ninvariants after {workload} with {strategy}:");
            check::print(&verdicts);
            Some(verdicts)
        } else {
            None
        };
        drop_database(admin, &name).await;
        let mut rows: Vec<Row> = std::iter::once(closed_row).chain(open).collect();
        for row in &mut rows {
            row.default_strategy = strategy.default;
            row.invariants = verdicts.as_ref().map(|v| v.iter().all(|v| v.pass));
            row.verdicts = verdicts.clone().unwrap_or_default();
        }
        Ok(rows)
    }

    /// The environment of a server for `workload` under `strategy` on database `url`.
    fn server_env(
        &self,
        url: &str,
        prefix: &str,
        workload: Workload,
        strategy: &Strategy,
    ) -> Vec<(&str, String)> {
        let mut env = vec![
            ("DATABASE_URL", url.to_string()),
            ("REDIS_URL", self.redis_url.clone()),
            ("STOCKADE_REDIS_PREFIX", prefix.to_string()),
            ("STOCKADE_LISTEN", "127.0.0.1:0".to_string()),
            ("STOCKADE_ORDER_STRATEGY", strategy.name.clone()),
            ("STOCKADE_LOG", "error".to_string()),
        ];
        env.extend(workload.server_settings());
        env.extend(
            self.plan
                .settings
                .iter()
                .map(|(k, v)| (k.as_str(), v.clone())),
        );
        env
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
        let duration = Duration::from_secs(self.plan.pgbench_seconds());
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
            self.plan.pgbench_seconds(),
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

async fn stop_all(servers: Vec<ServerProcess>) {
    let _ = tokio::task::spawn_blocking(move || {
        for mut server in servers {
            server.stop();
        }
    })
    .await;
}
