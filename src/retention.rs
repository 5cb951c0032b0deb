//! Retention: what each table that grows with traffic keeps, and the purge that holds it
//! to that.
//!
//! | table | purged | kept for |
//! |---|---|---|
//! | `idempotency_keys` | completed records | `STOCKADE_IDEMPOTENCY_TTL_HOURS` (in-flight ones of dead requests: [`crate::idempotency::purge_stale`], every second) |
//! | `holds`, `hold_lines` | released and expired holds whose key's record is gone | `STOCKADE_HOLD_RETENTION_DAYS`, at least the idempotency TTL |
//! | `events`, `deliveries` | routed events with no pending delivery | `STOCKADE_EVENT_RETENTION_DAYS` |
//! | `login_failures` | every row | one day (the longest window they are counted over) |
//! | `admin_sessions` | expired sessions | until they expire |
//! | `check_runs` | every row | 30 days ([`crate::verdicts::RUNS_KEPT`]) |
//!
//! Orders, their lines, confirmed holds and the stock ledger are the shop's records and
//! are never purged.
//!
//! Every process runs [`purge`] at start and every [`EVERY`]. Each table goes in batches of
//! [`BATCH`] rows, oldest first, under `for update skip locked`: a statement is short and
//! holds few locks, and processes purging side by side each take different rows. Each
//! batch, not the whole round, has [`crate::pg::ROUND_LIMIT`], so a backlog of millions
//! drains over several batches rather than being cut off in one.

use std::future::Future;
use std::time::Duration;

use sqlx::PgPool;

use crate::config::Settings;

/// Rows deleted per statement.
pub const BATCH: i64 = 1_000;

/// How often each process purges.
pub const EVERY: Duration = Duration::from_secs(600);

/// How long each kind of row is kept.
#[derive(Clone, Copy, Debug)]
pub struct Windows {
    pub idempotency: Duration,
    pub holds: Duration,
    pub events: Duration,
}

impl Windows {
    pub fn of(settings: &Settings) -> Self {
        Self {
            idempotency: settings.idempotency_ttl(),
            holds: settings.hold_retention(),
            events: settings.event_retention(),
        }
    }
}

/// How many rows one round of [`purge`] deleted, per table.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Purged {
    pub idempotency_keys: u64,
    pub holds: u64,
    pub events: u64,
    pub login_failures: u64,
    pub admin_sessions: u64,
    pub check_runs: u64,
}

/// One round: every table's purge, each to the end of what it may delete. A table whose
/// purge fails is logged and left for the next round; the others still run.
pub async fn purge(db: &PgPool, windows: Windows) -> Purged {
    Purged {
        idempotency_keys: drain("idempotency keys", |n| {
            crate::idempotency::purge(db, windows.idempotency, n)
        })
        .await,
        holds: drain("finished holds", |n| {
            crate::holds::db::purge(db, windows.holds, n)
        })
        .await,
        events: drain("delivered events", |n| {
            crate::events::db::purge(db, windows.events, n)
        })
        .await,
        login_failures: drain("login failures", |n| {
            crate::admin::purge_login_failures(db, n)
        })
        .await,
        admin_sessions: drain("expired admin sessions", |n| {
            crate::admin::purge_sessions(db, n)
        })
        .await,
        check_runs: drain("check verdicts", |n| crate::verdicts::purge_runs(db, n)).await,
    }
}

/// Starts the purge in this process: now, then every [`EVERY`].
pub fn spawn(db: PgPool, windows: Windows) {
    tokio::spawn(async move {
        let mut every = tokio::time::interval(EVERY);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            purge(&db, windows).await;
        }
    });
}

/// Runs `batch` (delete up to `n` rows, return how many went) until a batch comes back
/// short; returns the total, logged under `what`.
async fn drain<F, Fut>(what: &str, mut batch: F) -> u64
where
    F: FnMut(i64) -> Fut,
    Fut: Future<Output = sqlx::Result<u64>>,
{
    let mut purged = 0;
    loop {
        match crate::pg::bounded(crate::pg::ROUND_LIMIT, batch(BATCH)).await {
            Ok(n) => {
                purged += n;
                if n < BATCH as u64 {
                    break;
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, table = what, "purge failed; the next round goes on");
                break;
            }
        }
    }
    if purged > 0 {
        tracing::info!(purged, table = what, "purged");
    }
    purged
}
