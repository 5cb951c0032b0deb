//! The `stockade` command line. `main.rs` parses [`Cli`] and calls [`Cli::run`].

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::{Args, Parser, Subcommand};

mod backup;
mod drop;

use crate::bench::{self, BenchArgs};
use crate::config::{OrderStrategy, Settings};
use crate::loadtest::{self, CheckArgs, LoadtestArgs};
use crate::local::{LocalOptions, LocalServices};
use crate::startup::{self, Application, connect_database};
use crate::telemetry;
use crate::{admin, seed};

/// Stockade: inventory and checkout reservations that never oversell.
#[derive(Debug, Parser)]
#[command(name = "stockade", version, about)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve the storefront. Without DATABASE_URL and REDIS_URL, starts its own PostgreSQL
    /// and Redis under the data folder (local mode).
    Serve(ServeArgs),
    /// Apply the database migrations to DATABASE_URL.
    Migrate,
    /// Add the demo catalogue to DATABASE_URL (existing products are kept).
    Seed,
    /// Manage admin accounts.
    #[command(subcommand)]
    Admin(AdminCommand),
    /// Manage API clients and their keys (in DATABASE_URL).
    #[command(subcommand)]
    ApiKey(ApiKeyCommand),
    /// Load servers with virtual buyers, check the invariants, write a report.
    Loadtest(Box<LoadtestArgs>),
    /// Check the invariants (I1–I9; I9 with payments on) of a database, optionally against a
    /// run's client log.
    Check(CheckArgs),
    /// Measure each workload and strategy against pgbench on the same durable PostgreSQL.
    Bench(Box<BenchArgs>),
    /// Start the scaled-out topology on this machine (development and tests): HAProxy,
    /// several app processes, PgBouncer, a PostgreSQL primary and streaming replica, a
    /// Redis master and replica with three Sentinels.
    Cluster(ClusterArgs),
    /// Take, list and restore the pgBackRest backups of `serve --backups` or
    /// `cluster --backups`.
    #[command(subcommand)]
    Backup(backup::BackupCommand),
    /// Schedule, list, pause, resume and end drops (in DATABASE_URL).
    #[command(subcommand)]
    Drop(drop::DropCommand),
}

#[derive(Debug, Args)]
struct ClusterArgs {
    /// How many `stockade serve` processes run behind HAProxy.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..=32))]
    apps: u16,
    /// HAProxy's port (a free one when not given).
    #[arg(long)]
    port: Option<u16>,
    /// Where the servers keep their files.
    #[arg(long, default_value = "./.stockade/cluster")]
    data_dir: PathBuf,
    /// PostgreSQL servers, each run by Patroni (one leads, the others replicate; a
    /// commit is acknowledged once a second one has it, when there is a second).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..=9))]
    postgres_nodes: u16,
    /// Server connections PgBouncer keeps to the leader, shared equally by the apps.
    #[arg(long, default_value_t = 48, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pgbouncer_pool: u32,
    /// Archive the leader's WAL to, and keep pgBackRest backups in, this folder (a full
    /// backup is taken at start when it has none); see `stockade backup`.
    #[arg(long)]
    backups: Option<PathBuf>,
    /// Once everything is up, write what was started to this file as JSON (the shop's and
    /// the database's URLs, and each process's name, role, pid and ports), for scripts
    /// that fault the cluster.
    #[arg(long)]
    state_file: Option<PathBuf>,
    /// Route each PostgreSQL node's traffic with etcd and the other nodes through a proxy
    /// of its own (listed in the state file as `link-pgN`): stopping one (SIGSTOP, or
    /// SIGKILL) partitions that node, for fault tests.
    #[arg(long)]
    fault_links: bool,
}

#[derive(Debug, Subcommand)]
enum AdminCommand {
    /// Create an admin in DATABASE_URL; prints a generated password unless one is given.
    Create(AccountArgs),
    /// Set an admin's password (ending their sessions); prints a generated one unless given.
    SetPassword(AccountArgs),
    /// Clear failed-login records in DATABASE_URL, lifting login throttling: with
    /// --username, that account's from every address; without, all of them.
    Unlock(UnlockArgs),
}

#[derive(Debug, Args)]
struct UnlockArgs {
    /// Only this admin's failed logins (the per-address records stay).
    #[arg(long)]
    username: Option<String>,
}

#[derive(Debug, Subcommand)]
enum ApiKeyCommand {
    /// Make an API client; prints its key, alone on the last line (shown only now).
    Create(CreateKeyArgs),
    /// List API clients (never their keys).
    List,
    /// Revoke an API client's key; its orders stay.
    Revoke(RevokeKeyArgs),
}

#[derive(Debug, Args)]
struct CreateKeyArgs {
    /// Who the client is, e.g. "partner-app" (1 to 100 characters, unique among live ones).
    #[arg(long)]
    name: String,
    /// Orders and holds per minute for this client, instead of STOCKADE_RATE_LIMIT_PER_MINUTE.
    #[arg(long, conflicts_with = "unlimited", value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    rate_limit: Option<u32>,
    /// No rate limit at all (for load tools and trusted back-ends).
    #[arg(long)]
    unlimited: bool,
    /// May place orders without a payment step when the shop takes payments
    /// (STOCKADE_PAYMENTS=stripe): for load tools, and back-ends invoiced elsewhere.
    #[arg(long)]
    unpaid_orders: bool,
}

#[derive(Debug, Args)]
#[group(required = true, multiple = false)]
struct RevokeKeyArgs {
    /// The live client with this name.
    #[arg(long)]
    name: Option<String>,
    /// The client with this id.
    #[arg(long)]
    id: Option<i64>,
}

#[derive(Debug, Args)]
struct AccountArgs {
    /// 3 to 32 lowercase letters, digits, dots, dashes or underscores.
    #[arg(long)]
    username: String,
    /// Read the password from the first line of standard input instead of generating one.
    #[arg(long)]
    password_stdin: bool,
}

#[derive(Debug, Args)]
struct ServeArgs {
    /// Address and port to listen on (overrides STOCKADE_LISTEN).
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// Local mode's data folder (overrides STOCKADE_DATA_DIR).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Order strategy (overrides STOCKADE_ORDER_STRATEGY).
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(["redis-lock", "pg-atomic", "batched", "naive-unsafe"]))]
    strategy: Option<String>,
    /// Allow the naive-unsafe strategy, which oversells on purpose.
    #[arg(long)]
    allow_unsafe: bool,
    /// Local mode: archive PostgreSQL's WAL to, and keep pgBackRest backups in, this
    /// folder (a full backup is taken at start when it has none); see `stockade backup`.
    #[arg(long)]
    backups: Option<PathBuf>,
}

impl Cli {
    pub fn run(self) -> ExitCode {
        let settings = match Settings::from_env() {
            Ok(s) => s,
            Err(e) => {
                eprintln!("stockade: configuration error: {e}");
                return ExitCode::from(2);
            }
        };
        telemetry::init(settings.log_format, &settings.log_filter);
        // What the commands list for an operator shows times in the shop's zone, as pages do.
        crate::clock::set_zone(settings.time_zone);
        let runtime = match tokio::runtime::Runtime::new() {
            Ok(rt) => rt,
            Err(e) => {
                eprintln!("stockade: cannot start the async runtime: {e}");
                return ExitCode::FAILURE;
            }
        };
        let result = runtime.block_on(async {
            match self.command {
                Command::Serve(args) => serve(settings, args).await,
                Command::Migrate => migrate(settings).await,
                Command::Seed => seed(settings).await,
                Command::Admin(command) => admin_command(settings, command).await,
                Command::ApiKey(command) => api_key_command(settings, command).await,
                Command::Loadtest(args) => {
                    verdict(until_interrupted(loadtest::loadtest(*args)).await)
                }
                Command::Check(args) => verdict(loadtest::check_command(args).await),
                Command::Bench(args) => verdict(until_interrupted(bench::bench(*args)).await),
                Command::Cluster(args) => cluster(settings, args).await,
                Command::Backup(command) => backup::run(command).await,
                Command::Drop(command) => drop::run(settings, command).await,
            }
        });
        match result {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) if e.is::<InvariantsFailed>() => {
                eprintln!("stockade: some invariants FAILED (see above)");
                ExitCode::from(3)
            }
            Err(e) => {
                eprintln!("stockade: {e:#}");
                ExitCode::FAILURE
            }
        }
    }
}

/// Runs `work` until it ends or the process is asked to stop (Ctrl-C, SIGTERM); then
/// drops it, which stops every server it started.
async fn until_interrupted<T>(work: impl Future<Output = anyhow::Result<T>>) -> anyhow::Result<T> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    tokio::select! {
        out = work => out,
        _ = tokio::signal::ctrl_c() => anyhow::bail!("interrupted; the servers it started are stopped"),
        _ = term.recv() => anyhow::bail!("terminated; the servers it started are stopped"),
    }
}

/// Some invariant failed (exit status 3); the details were printed.
#[derive(Debug, thiserror::Error)]
#[error("invariants failed")]
struct InvariantsFailed;

fn verdict(passed: anyhow::Result<bool>) -> anyhow::Result<()> {
    match passed? {
        true => Ok(()),
        false => Err(InvariantsFailed.into()),
    }
}

async fn serve(mut settings: Settings, args: ServeArgs) -> anyhow::Result<()> {
    if let Some(listen) = args.listen {
        settings.listen = listen;
    }
    if let Some(dir) = args.data_dir {
        settings.data_dir = dir;
    }
    if let Some(strategy) = args.strategy {
        settings.order_strategy = strategy
            .parse::<OrderStrategy>()
            .map_err(anyhow::Error::msg)?;
    }
    if settings.order_strategy == OrderStrategy::NaiveUnsafe && !args.allow_unsafe {
        bail!(
            "the naive-unsafe order strategy oversells on purpose; \
             pass --allow-unsafe to start it anyway"
        );
    }

    if args.backups.is_some() && !settings.local_mode() {
        bail!(
            "--backups sets up local mode's PostgreSQL; with DATABASE_URL set, set up \
             pgBackRest on that server (README, \"Backups\")"
        );
    }

    let mut shutdown = std::pin::pin!(shutdown_signal());
    let local = if settings.local_mode() {
        let options = LocalOptions {
            pg_port: settings.local_pg_port,
            redis_port: settings.local_redis_port,
            ephemeral: false,
            backups: args.backups.clone(),
        };
        tracing::info!(dir = %settings.data_dir.display(), "local mode: starting PostgreSQL and Redis");
        let local = tokio::select! {
            local = LocalServices::start(&settings.data_dir, &options) => local?,
            () = &mut shutdown => return Ok(()),
        };
        settings.database_url = Some(local.database_url().into());
        settings.redis_url = Some(local.redis_url().into());
        // Receipts land in a folder the admin shows, unless SMTP is set up.
        if settings.mail_dir.is_none() {
            settings.mail_dir = Some(settings.data_dir.join("mail"));
        }
        Some(local)
    } else {
        None
    };

    // Payments in local mode without a provider set up: localstripe, with test cards.
    let stripe = match local {
        Some(_) => crate::local::LocalStripe::for_local_mode(&mut settings).await?,
        None => None,
    };

    let backups = args.backups.filter(|_| local.is_some());
    let result = run_server(
        settings,
        local.is_some(),
        backups,
        stripe.as_ref(),
        shutdown,
    )
    .await;
    drop(stripe);
    if let Some(local) = local {
        tracing::info!("stopping PostgreSQL and Redis");
        tokio::task::spawn_blocking(move || local.stop()).await?;
    }
    result
}

async fn run_server(
    settings: Settings,
    local_mode: bool,
    backups: Option<PathBuf>,
    stripe: Option<&crate::local::LocalStripe>,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let listen = settings.listen;
    let webhook_secret = settings.stripe_webhook_secret.clone();
    let metrics_ip = settings.metrics_listen.map(|a| a.ip());
    let (database_url, redis_url) = (settings.database_url.clone(), settings.redis_url.clone());
    let app = Application::build(settings).await?;
    if local_mode {
        let products = sqlx::query_scalar!(r#"select count(*) as "count!" from products"#)
            .fetch_one(app.db())
            .await?;
        if products == 0 {
            let added = seed::seed_demo(app.db()).await?;
            tracing::info!(added, "seeded the demo catalogue");
        }
    }
    // Local mode makes the first admin itself and shows the password this once.
    let mut first_admin = None;
    if local_mode && admin::count_admins(app.db()).await? == 0 {
        let password = admin::generate_password();
        admin::create_admin(app.db(), "admin", &password).await?;
        first_admin = Some(password);
    }
    let base = format!("http://{}:{}", listen.ip(), app.port());
    let metrics = app.metrics_port().map(|port| {
        format!(
            "http://{}:{port}/metrics",
            metrics_ip.unwrap_or(listen.ip())
        )
    });
    println!("Stockade is running.");
    println!("  Storefront:  {base}/");
    match first_admin {
        Some(password) => {
            println!("  Admin:       {base}/admin  (user admin, password {password})");
            println!("               The password is shown only now; change it with");
            println!("               `stockade admin set-password --username admin`.");
        }
        None => println!("  Admin:       {base}/admin"),
    }
    println!("  API:         {base}/api/v1/products");
    println!("  Health:      {base}/readyz");
    if let Some(metrics) = metrics {
        println!("  Metrics:     {metrics}");
    }
    if local_mode {
        println!(
            "  PostgreSQL:  {}",
            database_url.as_deref().unwrap_or_default()
        );
        println!(
            "  Redis:       {}",
            redis_url.as_deref().unwrap_or_default()
        );
    }
    if let (Some(stripe), Some(secret)) = (stripe, webhook_secret) {
        print!("{}", stripe.serve(&base, &secret).await?);
    }
    if let Some(dir) = backups {
        println!(
            "  Backups:     {}  (pgBackRest, WAL archived; `stockade backup list --backups …`)",
            dir.display()
        );
    }
    println!("Press Ctrl-C to stop.");
    let handle = app.handle();
    let server = tokio::spawn(app.run_until_stopped());
    tokio::select! {
        () = shutdown => {
            tracing::info!("shutting down: finishing requests in flight");
            handle.stop(true).await;
        }
        result = server => {
            result??;
            return Ok(());
        }
    }
    Ok(())
}

/// Resolves on SIGINT (Ctrl-C) or SIGTERM.
async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}

/// Settings of this process that the app processes of `stockade cluster` inherit; the
/// cluster sets where they listen and what they connect to itself.
const CLUSTER_SETS: &[&str] = &[
    "DATABASE_URL",
    "REDIS_URL",
    "STOCKADE_LISTEN",
    "STOCKADE_DATA_DIR",
    "STOCKADE_LOCAL_PG_PORT",
    "STOCKADE_LOCAL_REDIS_PORT",
    "STOCKADE_DATABASE_PGBOUNCER",
    "STOCKADE_DATABASE_REPLICA_URL",
    "STOCKADE_REDIS_SENTINELS",
    "STOCKADE_REDIS_MASTER",
    "STOCKADE_REDIS_PASSWORD",
];

async fn cluster(settings: Settings, args: ClusterArgs) -> anyhow::Result<()> {
    use crate::cluster::{Cluster, ClusterOptions};
    let app_env = std::env::vars()
        .filter(|(k, _)| k.starts_with("STOCKADE_") && !CLUSTER_SETS.contains(&k.as_str()))
        .collect();
    let options = ClusterOptions {
        dir: args.data_dir,
        apps: usize::from(args.apps),
        exe: std::env::current_exe()?,
        app_env,
        port: args.port,
        postgres_nodes: usize::from(args.postgres_nodes),
        pgbouncer_pool: args.pgbouncer_pool,
        ephemeral: false,
        fault_links: args.fault_links,
        backups: args.backups,
        settings,
    };
    let cluster = until_interrupted(Cluster::start(options)).await?;
    if let Some(file) = &args.state_file {
        let state = serde_json::to_string_pretty(&cluster.state().await)?;
        crate::cluster::write_state_file(file, &state)
            .with_context(|| format!("cannot write the state file {}", file.display()))?;
    }
    print!("{}", cluster.describe());
    println!("Press Ctrl-C to stop.");
    shutdown_signal().await;
    println!("stopping the cluster");
    tokio::task::spawn_blocking(move || cluster.stop()).await?;
    Ok(())
}

async fn admin_command(settings: Settings, command: AdminCommand) -> anyhow::Result<()> {
    startup::migrate(&settings).await?;
    let db = connect_database(&settings).await?;
    let (args, create) = match command {
        AdminCommand::Create(args) => (args, true),
        AdminCommand::SetPassword(args) => (args, false),
        AdminCommand::Unlock(args) => {
            let username = args.username.map(|u| u.trim().to_lowercase());
            let cleared = admin::unlock(&db, username.as_deref()).await?;
            match username {
                Some(name) => println!("cleared {cleared} failed-login records of {name}"),
                None => println!("cleared all {cleared} failed-login records"),
            }
            return Ok(());
        }
    };
    let (password, generated) = if args.password_stdin {
        let mut line = String::new();
        std::io::stdin().read_line(&mut line)?;
        (line.trim_end_matches(['\r', '\n']).to_string(), false)
    } else {
        (admin::generate_password(), true)
    };
    if create {
        admin::create_admin(&db, &args.username, &password).await?;
        println!("created admin {}", args.username);
    } else {
        admin::set_password(&db, &args.username, &password).await?;
        println!(
            "set the password of {} (their sessions have ended)",
            args.username
        );
    }
    if generated {
        println!("password: {password}");
    }
    Ok(())
}

async fn api_key_command(settings: Settings, command: ApiKeyCommand) -> anyhow::Result<()> {
    use crate::clients::{self, Limit};
    startup::migrate(&settings).await?;
    let db = connect_database(&settings).await?;
    match command {
        ApiKeyCommand::Create(args) => {
            let limit = match (args.unlimited, args.rate_limit) {
                (true, _) => Limit::Unlimited,
                (false, Some(n)) => Limit::PerMinute(n),
                (false, None) => Limit::Default,
            };
            let (client, key) = clients::create(&db, &args.name, limit).await?;
            if args.unpaid_orders {
                clients::allow_unpaid_orders(&db, client.id).await?;
            }
            println!(
                "created API client {} (id {}, rate limit {}{})",
                client.name,
                client.id,
                client.limit(),
                if args.unpaid_orders {
                    ", orders without payment"
                } else {
                    ""
                }
            );
            println!("Its key is shown only now; send it as `Authorization: Bearer <key>`:");
            println!("{key}");
        }
        ApiKeyCommand::List => {
            println!(
                "{:>6}  {:<24} {:<14} {:<12} {:<22} state",
                "id", "name", "key", "rate limit", "created"
            );
            for c in clients::list(&db).await? {
                println!(
                    "{:>6}  {:<24} {:<14} {:<12} {:<22} {}",
                    c.id,
                    c.name,
                    format!("{}…", c.key_prefix),
                    c.limit().to_string(),
                    crate::clock::date_time(c.created_at),
                    if c.is_revoked() { "revoked" } else { "live" }
                );
            }
        }
        ApiKeyCommand::Revoke(args) => {
            let id = match (args.id, args.name) {
                (Some(id), _) => {
                    if !clients::revoke(&db, id).await? {
                        bail!("there is no live API client with id {id}");
                    }
                    id
                }
                (None, Some(name)) => clients::revoke_by_name(&db, &name).await?,
                (None, None) => bail!("give --name or --id"),
            };
            println!(
                "revoked API client {id}; its key stops working within {} s",
                clients::CACHE_FOR.as_secs()
            );
        }
    }
    Ok(())
}

async fn migrate(settings: Settings) -> anyhow::Result<()> {
    startup::migrate(&settings).await?;
    println!("migrations applied");
    Ok(())
}

async fn seed(settings: Settings) -> anyhow::Result<()> {
    startup::migrate(&settings).await?;
    let db = connect_database(&settings).await?;
    let added = seed::seed_demo(&db).await?;
    println!("added {added} demo products");
    Ok(())
}
