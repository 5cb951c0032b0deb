//! `stockade drop create|list|pause|resume|end`: drops from scripts, on DATABASE_URL.
//! Every running server picks a change up within [`crate::drops::registry::REFRESH`].

use clap::{Args, Subcommand};
use uuid::Uuid;

use crate::config::Settings;
use crate::drops::db::{self, Change, DropError};
use crate::drops::{self, NewDrop, Queueing};

#[derive(Debug, Subcommand)]
pub enum DropCommand {
    /// Schedule a drop; prints its id alone on the last line.
    Create(CreateArgs),
    /// The latest drops, newest first.
    List,
    /// Let nobody in until resumed (passes given keep working).
    Pause(IdArg),
    /// Let shoppers in again.
    Resume(IdArg),
    /// Close the queue; the product sells as usual again.
    End(IdArg),
}

#[derive(Debug, Args)]
pub struct CreateArgs {
    /// The product's SKU.
    #[arg(long)]
    sku: String,
    /// When it goes on sale: RFC 3339 (2026-12-24T18:00:00Z) or +SECONDS from now.
    #[arg(long)]
    opens_at: String,
    /// Joining opens this many seconds before the opening.
    #[arg(long, default_value_t = 0)]
    prequeue_seconds: i32,
    /// fifo (first come, first served) or lottery (the pre-queue in a random order).
    #[arg(long, value_parser = ["fifo", "lottery"])]
    queueing: String,
    /// Shoppers let in per minute.
    #[arg(long)]
    admit_per_minute: i32,
    /// Most shoppers let in at once.
    #[arg(long)]
    max_active: Option<i32>,
    /// How long a shopper let in may buy, in seconds.
    #[arg(long, default_value_t = drops::DEFAULT_SESSION_SECONDS)]
    session_seconds: i32,
}

#[derive(Debug, Args)]
pub struct IdArg {
    /// The drop's id.
    id: Uuid,
}

pub async fn run(settings: Settings, command: DropCommand) -> anyhow::Result<()> {
    crate::startup::migrate(&settings).await?;
    let db = crate::startup::connect_database(&settings).await?;
    let change = |c: Change, id: Uuid| {
        let db = db.clone();
        async move {
            let changed = db::change(&db, id, c, "cli").await.map_err(plain)?;
            let now = db::get(&db, id)
                .await?
                .map(|d| d.status.as_str())
                .unwrap_or("?");
            if changed {
                println!("drop {id} is {now}");
            } else {
                println!("drop {id} was {now} already; nothing changed");
            }
            anyhow::Ok(())
        }
    };
    match command {
        DropCommand::Create(a) => {
            let new = NewDrop {
                sku: crate::catalog::Sku::parse(&a.sku)
                    .map_err(|e| anyhow::anyhow!("{e}"))?
                    .to_string(),
                opens_at: drops::parse_opens_at(&a.opens_at, chrono::Utc::now())
                    .map_err(|e| anyhow::anyhow!("--opens-at: {e}"))?,
                prequeue_seconds: a.prequeue_seconds,
                queueing: Queueing::parse(&a.queueing).expect("clap checked it"),
                admit_per_minute: a.admit_per_minute,
                max_active: a.max_active,
                session_seconds: a.session_seconds,
            };
            let drop = db::create(&db, &new).await.map_err(plain)?;
            println!(
                "drop of {} scheduled: opens {}, queue from {}, {} per minute; it binds the product from {}",
                drop.sku,
                drop.opens_at
                    .to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                drop.prequeue_at()
                    .to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                drop.admit_per_minute,
                drop.binds_at
                    .to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            );
            println!("{}", drop.id);
        }
        DropCommand::List => {
            println!(
                "{:<36}  {:<16} {:<25} {:<8} {:>8}  status",
                "id", "sku", "opens", "queueing", "per min"
            );
            for d in db::recent(&db, 50).await? {
                println!(
                    "{:<36}  {:<16} {:<25} {:<8} {:>8}  {}",
                    d.id,
                    d.sku,
                    crate::clock::date_time_seconds(d.opens_at),
                    d.queueing.as_str(),
                    d.admit_per_minute,
                    d.status.as_str()
                );
            }
        }
        DropCommand::Pause(a) => change(Change::Pause, a.id).await?,
        DropCommand::Resume(a) => change(Change::Resume, a.id).await?,
        DropCommand::End(a) => change(Change::End, a.id).await?,
    }
    Ok(())
}

/// A drop error as one line (database errors keep their cause).
fn plain(e: DropError) -> anyhow::Error {
    match e {
        DropError::Database(e) => e.into(),
        other => anyhow::anyhow!("{other}"),
    }
}
