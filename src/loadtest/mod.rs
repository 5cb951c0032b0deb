//! `stockade loadtest`: flash-sale scenarios against one or many servers, the invariant
//! checker (`stockade check`), and the report.
//!
//! With `--target` URLs it loads those servers (and, given `DATABASE_URL`, sets up stock
//! and checks the invariants afterwards). Without targets it brings its own: PostgreSQL and
//! Redis (local mode, or the given URLs) and `--servers` `stockade serve` processes, once
//! per strategy with `--compare`.

pub mod check;
mod command;
pub mod drop;
pub mod pay;
pub mod quick;
pub mod report;
pub mod run;
pub mod servers;
mod setup;
mod summary;

pub use command::{CheckArgs, check_command};
pub use setup::{own_api_key, setup};

use setup::fresh_database;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Args, ValueEnum};
use sqlx::PgPool;

use self::check::RedisTarget;
use self::report::{Report, StrategyRun};
use self::run::{Live, Plan};
use self::servers::ServerProcess;
use crate::local::{LocalOptions, LocalServices};

/// What the buyers buy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scenario {
    /// One hot SKU with little stock, far more buyers than units.
    FlashSale,
    /// Orders spread over many SKUs, some with several lines.
    Catalogue,
    /// Both at once: every other buyer is in the flash sale.
    Mixed,
    /// A drop through its waiting room: shoppers queue, are let in, buy (needs
    /// DATABASE_URL; see the --queueing and other "Drop scenario" options).
    Drop,
}

/// `stockade loadtest` options.
#[derive(Debug, Clone, Args, serde::Serialize)]
pub struct LoadtestArgs {
    /// Base URL of a server to load, e.g. http://127.0.0.1:8080; repeat for several (buyers
    /// are spread over them). Without any, the load tester starts its own servers.
    #[arg(long = "target")]
    pub targets: Vec<String>,
    #[arg(long, value_enum, default_value = "flash-sale")]
    pub scenario: Scenario,
    /// Units of the hot SKU (and of each catalogue SKU, or of the drop's product) set
    /// before the run [default: 100; 500 for the drop scenario].
    #[arg(long)]
    pub stock: Option<i32>,
    /// Buyers in all (each places one order, or one hold and its confirmation).
    #[arg(long, default_value_t = 2000)]
    pub buyers: u64,
    /// Closed loop: buyers shopping at the same time.
    #[arg(long, default_value_t = 64)]
    pub concurrency: usize,
    /// Open loop: buyers arriving per second, whatever the servers do (overrides
    /// --concurrency); latency counts from each buyer's intended start.
    #[arg(long)]
    pub rate: Option<f64>,
    /// Stop sending new buyers after this many seconds.
    #[arg(long, default_value_t = 60)]
    pub duration: u64,
    /// Units per order line (catalogue lines take 1 to this many).
    #[arg(long, default_value_t = 1)]
    pub quantity: i64,
    /// Share of buyers who time out at once and retry with the same key.
    #[arg(long, default_value_t = 0.1)]
    pub retry_share: f64,
    /// Share of buyers who send their order twice at once with one key.
    #[arg(long, default_value_t = 0.1)]
    pub double_submit_share: f64,
    /// Share of buyers who reuse their key with a changed body (expect 422).
    #[arg(long, default_value_t = 0.02)]
    pub changed_body_share: f64,
    /// Share of buyers who reserve with a hold, then confirm it.
    #[arg(long, default_value_t = 0.1)]
    pub hold_share: f64,
    /// Client timeout per request, in milliseconds.
    #[arg(long, default_value_t = 10_000)]
    pub timeout_ms: u64,
    /// PostgreSQL of the servers under test: for setting stock and checking invariants.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    #[serde(skip)]
    pub database_url: Option<String>,
    /// Redis of the servers under test: for the leftover-lease check.
    #[arg(long, env = "REDIS_URL", hide_env_values = true)]
    #[serde(skip)]
    pub redis_url: Option<String>,
    /// API key to send to --target servers. Without one, the tool makes an unlimited API
    /// client for itself in DATABASE_URL; servers it starts itself always get one.
    #[arg(long, env = "STOCKADE_API_KEY", hide_env_values = true)]
    #[serde(skip)]
    pub api_key: Option<String>,
    /// Redis key prefix of the servers under test.
    #[arg(long, default_value = "stockade:")]
    pub redis_prefix: String,
    /// Leave the stock as it is (no setup through DATABASE_URL).
    #[arg(long)]
    pub no_setup: bool,
    /// Run the scenario once per strategy, on fresh stock, and compare (needs no targets).
    #[arg(long)]
    pub compare: bool,
    /// Strategies to run: the servers' own when loading targets; the list for --compare.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "naive-unsafe,pg-atomic,redis-lock,batched"
    )]
    pub strategies: Vec<String>,
    /// Server processes to start when there are no targets.
    #[arg(long, default_value_t = 2)]
    pub servers: usize,
    /// Folder for report.json, report.html and client-log.jsonl.
    #[arg(long, default_value = "loadtest-report")]
    pub out: PathBuf,
    /// No progress bar (for CI).
    #[arg(long)]
    pub quiet: bool,
    /// Seed for the buyers' choices, for repeatable runs.
    #[arg(long, default_value_t = 2026)]
    pub seed: u64,
    #[command(flatten)]
    pub drop: drop::DropArgs,
    #[command(flatten)]
    pub payment: pay::PaymentArgs,
}

/// The hot SKU of the flash sale.
pub const HOT_SKU: &str = "FLASH-DROP";
/// How many SKUs the catalogue scenario spreads over.
pub const CATALOGUE_SKUS: usize = 20;

impl LoadtestArgs {
    /// The units each SKU of the run starts with.
    pub fn stock(&self) -> i32 {
        self.stock.unwrap_or(match self.scenario {
            Scenario::Drop => 500,
            _ => 100,
        })
    }

    fn plan(&self, targets: Vec<String>, run_id: String, api_key: Option<String>) -> Plan {
        Plan {
            targets,
            scenario: self.scenario,
            hot_sku: match self.scenario {
                Scenario::Drop => drop::DROP_SKU.to_string(),
                _ => HOT_SKU.to_string(),
            },
            catalogue: (1..=CATALOGUE_SKUS).map(|i| format!("LT-{i:04}")).collect(),
            buyers: match self.scenario {
                Scenario::Drop => self.drop.prequeue_shoppers + self.drop.later_shoppers,
                _ => self.buyers,
            },
            concurrency: self.concurrency.max(1),
            rate: self.rate,
            duration: Duration::from_secs(self.duration),
            quantity: self.quantity.max(1),
            retry_share: self.retry_share,
            double_submit_share: self.double_submit_share,
            changed_body_share: self.changed_body_share,
            hold_share: self.hold_share,
            timeout: Duration::from_millis(self.timeout_ms),
            seed: self.seed,
            run_id,
            api_key,
            payments: self.payment.plan(),
        }
    }

    fn validate(&self) -> anyhow::Result<()> {
        let shares = [
            ("--retry-share", self.retry_share),
            ("--double-submit-share", self.double_submit_share),
            ("--changed-body-share", self.changed_body_share),
            ("--hold-share", self.hold_share),
        ];
        for (flag, share) in shares {
            if !(0.0..=1.0).contains(&share) {
                bail!("{flag} must be between 0 and 1 (got {share})");
            }
        }
        if shares.iter().map(|(_, s)| s).sum::<f64>() > 1.0 {
            bail!("the behaviour shares add up to more than 1");
        }
        if self.rate.is_some_and(|r| !(r > 0.0 && r.is_finite())) {
            bail!("--rate must be a positive number of buyers per second");
        }
        if self.stock() < 0 {
            bail!("--stock must not be negative");
        }
        if self.scenario == Scenario::Drop {
            self.drop.validate()?;
        }
        self.payment.validate()?;
        if self.payment.payments
            && !self.targets.is_empty()
            && self.payment.stripe_api_base.is_none()
        {
            bail!(
                "--payments against --target servers needs their provider's address (STOCKADE_STRIPE_API_BASE)"
            );
        }
        if self.compare && !self.targets.is_empty() {
            bail!("--compare starts its own servers; leave out --target");
        }
        Ok(())
    }
}

/// Runs `stockade loadtest`; returns whether every invariant held.
pub async fn loadtest(args: LoadtestArgs) -> anyhow::Result<bool> {
    let report = run_report(&args).await?;
    print!("{}", report::summary(&report));
    report::write(&report, &args.out)?;
    // naive-unsafe's oversell is what it is there to show; any other failure fails the run.
    let all_passed = report
        .runs
        .iter()
        .all(|run| run.passed() || run.failed_as_expected());
    println!("\nreport: {}", args.out.join("report.html").display());
    Ok(all_passed)
}

/// Runs the load test and returns its report, without printing or writing it (beyond the
/// client logs in `args.out`).
pub async fn run_report(args: &LoadtestArgs) -> anyhow::Result<Report> {
    args.validate()?;
    if args.targets.is_empty() {
        self_hosted(args).await
    } else {
        against_targets(args).await
    }
}

async fn against_targets(args: &LoadtestArgs) -> anyhow::Result<Report> {
    let targets: Vec<String> = args
        .targets
        .iter()
        .map(|t| t.trim_end_matches('/').to_string())
        .collect();
    let db = match &args.database_url {
        Some(url) => Some(PgPool::connect(url).await.context("DATABASE_URL")?),
        None => None,
    };
    let redis = args.redis_url.clone().map(|url| RedisTarget {
        url,
        prefix: args.redis_prefix.clone(),
    });
    let label = args
        .strategies
        .first()
        .cloned()
        .filter(|_| args.strategies.len() == 1);
    let api_key = match (&args.api_key, &db) {
        (Some(key), _) => Some(key.clone()),
        (None, Some(db)) => Some(own_api_key(db).await?),
        (None, None) => {
            eprintln!(
                "no --api-key (STOCKADE_API_KEY) and no DATABASE_URL to make one: \
                 orders are sent without a key"
            );
            None
        }
    };
    let runs = runs(
        args,
        &targets,
        db.as_ref(),
        redis.as_ref(),
        label.unwrap_or_else(|| "servers".into()),
        api_key,
    )
    .await?;
    Ok(Report {
        title: format!(
            "Stockade load test: {} against {}",
            scenario_name(args.scenario),
            targets.join(", ")
        ),
        scenario: scenario_name(args.scenario).into(),
        parameters: serde_json::to_value(args)?,
        runs,
    })
}

async fn self_hosted(args: &LoadtestArgs) -> anyhow::Result<Report> {
    let mut args = args.clone();
    let args = &mut args;
    // PostgreSQL and Redis: the given ones, or throwaway local ones.
    let mut local = None;
    let (database_url, redis_url) = match (&args.database_url, &args.redis_url) {
        (Some(db), Some(redis)) => (db.clone(), redis.clone()),
        _ => {
            let dir =
                std::env::temp_dir().join(format!("stockade-loadtest-{}", std::process::id()));
            eprintln!("starting PostgreSQL and Redis in {}", dir.display());
            let options = LocalOptions {
                ephemeral: true,
                ..LocalOptions::default()
            };
            let services = LocalServices::start(&dir, &options).await?;
            let urls = (services.database_url(), services.redis_url());
            local = Some((services, dir));
            urls
        }
    };
    let strategies = if args.compare {
        args.strategies.clone()
    } else {
        vec![args.strategies.last().cloned().unwrap_or_else(|| {
            crate::config::Settings::default()
                .order_strategy
                .as_str()
                .into()
        })]
    };
    let exe = std::env::current_exe().context("cannot find the stockade executable")?;
    let mut runs = Vec::new();
    for strategy in &strategies {
        // Each strategy sells on fresh stock in a database of its own, so one strategy's
        // oversell does not stain the next one's ledger.
        // With one strategy, the given database will do; a comparison needs one each, or
        // the first strategy's oversell would be charged to the next.
        let database_url = match fresh_database(&database_url, strategy).await {
            Ok(url) => url,
            Err(e) if strategies.len() > 1 => {
                bail!("--compare needs to create a database per strategy, and could not: {e:#}")
            }
            Err(_) => database_url.clone(),
        };
        crate::startup::migrate(&crate::config::Settings {
            database_url: Some(database_url.clone().into()),
            ..crate::config::Settings::default()
        })
        .await?;
        let db = PgPool::connect(&database_url).await?;
        let api_key = own_api_key(&db).await?;
        let prefix = format!("loadtest-{}:", uuid::Uuid::new_v4().simple());
        let env = vec![
            ("DATABASE_URL", database_url.clone()),
            ("REDIS_URL", redis_url.clone()),
            ("STOCKADE_REDIS_PREFIX", prefix.clone()),
            ("STOCKADE_LISTEN", "127.0.0.1:0".to_string()),
            ("STOCKADE_ORDER_STRATEGY", strategy.clone()),
            ("STOCKADE_LOG", "warn".to_string()),
            // Every shopper of the drop scenario comes from this one address.
            ("STOCKADE_DROP_PLACES_PER_ADDRESS", "0".to_string()),
        ];
        let mut env = env;
        // Paying: a fresh provider per strategy, as the stock is fresh.
        let provider = match args.payment.payments {
            true => {
                let dir = std::env::temp_dir().join(format!(
                    "stockade-loadtest-{}-localstripe",
                    std::process::id()
                ));
                let (stripe, pay_env) = pay::start_provider(&dir, &mut args.payment)?;
                env.extend(pay_env);
                Some(stripe)
            }
            false => None,
        };
        let flags: &[&str] = if strategy == "naive-unsafe" {
            &["--allow-unsafe"]
        } else {
            &[]
        };
        let mut servers = Vec::new();
        for _ in 0..args.servers.max(1) {
            servers.push(ServerProcess::start(&exe, &env, flags).await?);
        }
        let targets: Vec<String> = servers.iter().map(|s| s.address.clone()).collect();
        if let Some(stripe) = &provider {
            pay::register_webhook(stripe, &targets[0]).await?;
        }
        eprintln!(
            "{strategy}: {} server process(es) at {}",
            servers.len(),
            targets.join(", ")
        );
        let redis = RedisTarget {
            url: redis_url.clone(),
            prefix,
        };
        let run = self::runs(
            args,
            &targets,
            Some(&db),
            Some(&redis),
            strategy.clone(),
            Some(api_key),
        )
        .await;
        for server in &mut servers {
            server.stop();
        }
        drop(provider);
        db.close().await;
        runs.extend(run?);
    }
    if let Some((services, dir)) = local {
        tokio::task::spawn_blocking(move || services.stop()).await?;
        let _ = std::fs::remove_dir_all(dir);
    }
    let title = if args.compare {
        format!(
            "Stockade strategies compared: {}",
            scenario_name(args.scenario)
        )
    } else {
        format!("Stockade load test: {}", scenario_name(args.scenario))
    };
    Ok(Report {
        title,
        scenario: scenario_name(args.scenario).into(),
        parameters: serde_json::to_value(args)?,
        runs,
    })
}

fn scenario_name(s: Scenario) -> &'static str {
    match s {
        Scenario::FlashSale => "flash-sale",
        Scenario::Catalogue => "catalogue",
        Scenario::Mixed => "mixed",
        Scenario::Drop => "drop",
    }
}

/// The runs against one set of servers: one, or the drop scenario's one per method.
async fn runs(
    args: &LoadtestArgs,
    targets: &[String],
    db: Option<&PgPool>,
    redis: Option<&RedisTarget>,
    strategy: String,
    api_key: Option<String>,
) -> anyhow::Result<Vec<StrategyRun>> {
    if args.scenario != Scenario::Drop {
        return Ok(vec![
            one_run(args, targets, db, redis, strategy, api_key, None).await?,
        ]);
    }
    let db = db.context(
        "the drop scenario schedules its drop and reads its admissions through DATABASE_URL; \
         give --database-url (the servers' database)",
    )?;
    let mut runs = Vec::new();
    for method in args.drop.validate()? {
        let label = format!("{strategy} {}", method.as_str());
        runs.push(one_run(args, targets, Some(db), redis, label, None, Some(method)).await?);
    }
    Ok(runs)
}

/// Setup, run with progress, checks.
async fn one_run(
    args: &LoadtestArgs,
    targets: &[String],
    db: Option<&PgPool>,
    redis: Option<&RedisTarget>,
    strategy: String,
    api_key: Option<String>,
    drop: Option<crate::drops::Queueing>,
) -> anyhow::Result<StrategyRun> {
    if let Some(db) = db.filter(|_| !args.no_setup && drop.is_none()) {
        setup(db, redis, args).await?;
    }
    let run_id = format!("lt-{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let plan = args.plan(targets.to_vec(), run_id, api_key);
    let live = Arc::new(Live::default());
    let progress = (!args.quiet).then(|| progress_bar(&plan, live.clone(), strategy.clone()));
    let (result, drop) = match (drop, db) {
        (Some(method), Some(db)) => {
            match self::drop::run(args, &plan, db, redis, method, live).await {
                Ok((result, section)) => (Ok(result), Some(section)),
                Err(e) => (Err(e), None),
            }
        }
        _ => (
            run::run(&plan, live)
                .await
                .map(|ran| summary::summarise(&plan, ran)),
            None,
        ),
    };
    if let Some((bar, task)) = progress {
        task.abort();
        bar.finish_and_clear();
    }
    let result = result?;
    std::fs::create_dir_all(&args.out)?;
    let log_path = args
        .out
        .join(format!("client-log-{}.jsonl", strategy.replace(' ', "-")));
    let mut log = String::new();
    for entry in &result.log {
        log.push_str(&serde_json::to_string(entry)?);
        log.push('\n');
    }
    std::fs::write(&log_path, log)?;

    let (verdicts, balances) = match db {
        Some(db) => {
            // Let the last releases and sweeps land before judging the quiet state.
            tokio::time::sleep(Duration::from_millis(300)).await;
            let verdicts =
                check::check(db, Some(&result.log), redis, check::default_stale_after()).await?;
            println!(
                "\ninvariants after {strategy} ({} requests):",
                result.requests
            );
            check::print(&verdicts);
            (verdicts, check::balances(db).await?)
        }
        None => {
            eprintln!("no DATABASE_URL: invariants not checked");
            (Vec::new(), Vec::new())
        }
    };
    // Charges against orders, once the reconciler has settled them, and I9.
    let mut verdicts = verdicts;
    let payments = match db.filter(|_| args.payment.payments) {
        Some(db) => {
            let (tally, i9) = pay::after_run(db, &args.payment).await?;
            check::print(std::slice::from_ref(&i9));
            verdicts.push(i9);
            Some(tally)
        }
        None => None,
    };
    Ok(StrategyRun {
        strategy,
        result,
        verdicts,
        balances,
        drop,
        payments,
    })
}

fn progress_bar(
    plan: &Plan,
    live: Arc<Live>,
    strategy: String,
) -> (indicatif::ProgressBar, tokio::task::JoinHandle<()>) {
    let bar = indicatif::ProgressBar::new(plan.buyers);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{prefix:>12} [{elapsed_precise}] {bar:30.green/white} {pos}/{len} buyers {msg}",
        )
        .expect("valid template")
        .progress_chars("█▉ "),
    );
    bar.set_prefix(strategy);
    let shown = bar.clone();
    let started = std::time::Instant::now();
    let task = tokio::spawn(async move {
        loop {
            let requests = live.requests.load(Ordering::Relaxed);
            let created = live.created.load(Ordering::Relaxed);
            let secs = started.elapsed().as_secs_f64().max(1e-3);
            shown.set_position(
                live.requests
                    .load(Ordering::Relaxed)
                    .min(shown.length().unwrap_or(u64::MAX)),
            );
            shown.set_message(format!(
                "| {:.0} orders/s | created {created} · sold out {} · other {} | {requests} requests | stock left {}",
                created as f64 / secs,
                live.sold_out.load(Ordering::Relaxed),
                live.other.load(Ordering::Relaxed),
                live.available.load(Ordering::Relaxed),
            ));
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    (bar, task)
}
