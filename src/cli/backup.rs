//! `stockade backup`: take, list and restore local mode's pgBackRest backups.

use std::path::PathBuf;

use anyhow::Context;
use chrono::{DateTime, Utc};
use clap::{Args, Subcommand};

use crate::local::backups::{ARCHIVE_TIMEOUT_S, BackupSet, Kind, Repo};

#[derive(Debug, Subcommand)]
pub enum BackupCommand {
    /// Take a backup now, of the server started with `--backups DIR` (it must be running).
    Take(TakeArgs),
    /// List the backups in DIR, oldest first.
    List(RepoArgs),
    /// Rebuild a data folder from the backups in DIR, as of a moment (default: as far as
    /// the archive goes). The folder then starts with `stockade serve --data-dir`.
    Restore(RestoreArgs),
}

#[derive(Debug, Args)]
pub struct RepoArgs {
    /// The backup folder given to `stockade serve --backups` or `stockade cluster --backups`.
    #[arg(long)]
    backups: PathBuf,
}

#[derive(Debug, Args)]
pub struct TakeArgs {
    #[command(flatten)]
    repo: RepoArgs,
    /// full: every file; diff: what changed since the last full backup; incr: since the
    /// last backup of any kind.
    #[arg(long = "type", value_enum, default_value = "full")]
    kind: Kind,
}

#[derive(Debug, Args)]
pub struct RestoreArgs {
    #[command(flatten)]
    repo: RepoArgs,
    /// The new data folder (its `postgres/` must not exist yet).
    #[arg(long)]
    data_dir: PathBuf,
    /// The moment to restore to, RFC 3339 (e.g. 2026-12-04T09:30:00Z): every transaction
    /// committed by then is in the result, none committed after it.
    #[arg(long, value_parser = parse_moment)]
    to: Option<DateTime<Utc>>,
}

fn parse_moment(text: &str) -> Result<DateTime<Utc>, String> {
    DateTime::parse_from_rfc3339(text)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|_| {
            format!("{text:?} is not an RFC 3339 time such as 2026-12-04T09:30:00Z or 2026-12-04T10:30:00+01:00")
        })
}

pub async fn run(command: BackupCommand) -> anyhow::Result<()> {
    tokio::task::spawn_blocking(move || run_blocking(command))
        .await
        .context("the backup command stopped")?
}

fn run_blocking(command: BackupCommand) -> anyhow::Result<()> {
    match command {
        BackupCommand::Take(args) => {
            let repo = Repo::existing(&args.repo.backups)?;
            let set = repo.take(args.kind)?;
            println!("took backup {}", describe(&set));
        }
        BackupCommand::List(args) => {
            let repo = Repo::existing(&args.backups)?;
            let sets = repo.list()?;
            if sets.is_empty() {
                println!("no backups in {}", repo.dir().display());
            }
            for set in &sets {
                println!("{}", describe(set));
            }
            if let Some(first) = sets.first() {
                println!(
                    "Restorable to any moment from {} on, up to the WAL archived last \
                     (at most {ARCHIVE_TIMEOUT_S} s behind a running server).",
                    first.stopped.to_rfc3339()
                );
            }
        }
        BackupCommand::Restore(args) => {
            let repo = Repo::existing(&args.repo.backups)?;
            let stopped = repo.restore(&args.data_dir, args.to)?;
            match args.to {
                Some(to) => println!("restored as of {}", to.to_rfc3339()),
                None => println!("restored to the end of the archive"),
            }
            for line in stopped {
                println!("  {line}");
            }
            println!(
                "Start it with: stockade serve --data-dir {}",
                args.data_dir.display()
            );
        }
    }
    Ok(())
}

fn describe(set: &BackupSet) -> String {
    format!(
        "{}  {}  {} → {} ({} s)  database {:.1} MB, stored {:.1} MB",
        set.label,
        set.kind,
        set.started.to_rfc3339(),
        set.stopped.to_rfc3339(),
        (set.stopped - set.started).num_seconds(),
        set.database_bytes as f64 / 1e6,
        set.stored_bytes as f64 / 1e6,
    )
}
