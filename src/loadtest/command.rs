//! `stockade check`: its options, and the full or the quick check they choose.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use sqlx::PgPool;

use super::check::{self, RedisTarget};
use super::quick;

/// `stockade check` options.
#[derive(Debug, Clone, Args)]
pub struct CheckArgs {
    /// PostgreSQL to check.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: String,
    /// Redis whose lease keys to look for.
    #[arg(long, env = "REDIS_URL", hide_env_values = true)]
    pub redis_url: Option<String>,
    #[arg(long, default_value = "stockade:")]
    pub redis_prefix: String,
    /// A client log of a run (client-log-*.jsonl) for the checks that need one (I3–I5).
    #[arg(long)]
    pub client_log: Option<PathBuf>,
    /// The incremental check a live shop can run every minute: the ledger since the last
    /// checkpoint and the orders since the last quick check (I1–I3, I6's live part, I7).
    #[arg(long, conflicts_with = "client_log")]
    pub quick: bool,
}

/// Runs `stockade check`; returns whether every invariant held.
pub async fn check_command(args: CheckArgs) -> anyhow::Result<bool> {
    let db = PgPool::connect(&args.database_url)
        .await
        .context("DATABASE_URL")?;
    if args.quick {
        let retention = crate::config::Settings::from_env()
            .unwrap_or_default()
            .event_retention_days;
        let run = quick::quick_check(&db, check::default_stale_after(), retention).await?;
        let passed = check::print(&run.verdicts);
        println!("quick check: {}", run.covered);
        return Ok(passed);
    }
    let started = chrono::Utc::now();
    let log = match &args.client_log {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read {}", path.display()))?;
            let mut entries = Vec::new();
            for (i, line) in text
                .lines()
                .enumerate()
                .filter(|(_, l)| !l.trim().is_empty())
            {
                entries.push(serde_json::from_str(line).with_context(|| {
                    format!("{}:{}: not a client log entry", path.display(), i + 1)
                })?);
            }
            Some(entries)
        }
        None => None,
    };
    let redis = args.redis_url.map(|url| RedisTarget {
        url,
        prefix: args.redis_prefix,
    });
    let verdicts = check::check(
        &db,
        log.as_deref(),
        redis.as_ref(),
        check::default_stale_after(),
    )
    .await?;
    // I9 reads the payment provider's records, when the shop takes payments.
    let mut verdicts = verdicts;
    let settings = crate::config::Settings::from_env().unwrap_or_default();
    if let Some(stripe) = crate::payments::Stripe::of(&settings)? {
        let window = settings.payment_reconcile_after * 6;
        let rows = crate::payments::audit::i9_rows(&db, &stripe, window).await?;
        verdicts.push(check::verdict("I9", rows));
    }
    let covered = match &log {
        Some(log) => format!(
            "the whole database and a client log of {} requests",
            log.len()
        ),
        None => "the whole database".to_string(),
    };
    // For the dashboard; a database that cannot take it (a replica, an older schema) is
    // still checked.
    let passed = verdicts.iter().all(|v| v.pass);
    if let Err(e) = crate::verdicts::record(&db, "full", started, passed, &verdicts, &covered).await
    {
        eprintln!("stockade: the verdict was not recorded for the dashboard: {e:#}");
    }
    Ok(check::print(&verdicts))
}
