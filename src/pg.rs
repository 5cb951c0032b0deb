//! PostgreSQL's answers that callers at every layer ask about: which failures a retry may
//! not meet. Below the domain modules, so that they and [`crate::error`] can both ask. Also whether
//! the database's network is suspect: a call was cut off by its time limit lately.

use std::future::Future;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::time::error::Elapsed;

pub mod outage;
pub mod replica;

/// Database failures that load or a passing fault causes, and a retry may not meet: no
/// free connection, a timeout, a lock or serialisation conflict, the server out of reach.
pub fn is_transient(e: &sqlx::Error) -> bool {
    is_unreachable(e)
        || match e {
            sqlx::Error::PoolTimedOut => true,
            sqlx::Error::Database(db) => match db.code().as_deref() {
                // query_canceled (statement timeout), lock_not_available,
                // serialization_failure, deadlock_detected, too_many_connections,
                // idle-in-transaction timeout
                Some("57014" | "55P03" | "40001" | "40P01" | "53300" | "25P03") => true,
                Some("08P01") => pgbouncer_is_full(db.message()),
                _ => false,
            },
            _ => false,
        }
}

/// Failures that mean the server is out of reach (stopped, restarting, or the network
/// gone), not that the statement failed: a dropped connection, the server shutting down
/// or starting up, a connection exception, or PgBouncer with no server to give (as in a
/// failover). (No connection within the pool's wait is not among them: that is as often
/// a busy server as a gone one.)
pub fn is_unreachable(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::PoolClosed | sqlx::Error::Io(_) => true,
        sqlx::Error::Database(db) => match db.code().as_deref() {
            // admin_shutdown, crash_shutdown, cannot_connect_now; connection_exception,
            // sqlclient_unable_to_establish_sqlconnection, connection_does_not_exist,
            // sqlserver_rejected_establishment_of_sqlconnection, connection_failure;
            // read_only_sql_transaction: a write reached a node that is (or became) a
            // standby, as during a failover; the primary is elsewhere or on its way
            Some(
                "57P01" | "57P02" | "57P03" | "08000" | "08001" | "08003" | "08004" | "08006"
                | "25006",
            ) => true,
            Some("08P01") => pgbouncer_has_no_server(db.message()),
            _ => false,
        },
        _ => false,
    }
}

/// What a transient failure ([`is_transient`]) says happened, in a sentence a shopper can
/// read: only what the failure shows. A lock or statement that ran out of time says the
/// database was held up, not that the shop is busy (a lock held by someone else looks the
/// same from here as a crowd); no connection to be had, or PgBouncer full, says busy; a
/// conflict with another request says so; a server out of reach says so.
pub fn transient_cause(e: &sqlx::Error) -> &'static str {
    let code = match e {
        sqlx::Error::Database(db) => db.code().map(|c| c.into_owned()),
        _ => None,
    };
    match code.as_deref() {
        _ if is_unreachable(e) => {
            "The database cannot be reached right now; please try again in a moment."
        }
        // lock_not_available, query_canceled (statement timeout), idle-in-transaction
        // timeout
        Some("55P03" | "57014" | "25P03") => {
            "The database did not get to this in time (it is held up); please try again \
             in a moment."
        }
        // serialization_failure, deadlock_detected
        Some("40001" | "40P01") => {
            "This met another request for the same stock at the database; please try again."
        }
        _ => "We are very busy right now; please try again in a moment.",
    }
}

/// PgBouncer answers everything with `08P01`: these messages say it has no PostgreSQL
/// server to give (its logins to the server fail, or its server connection broke), not
/// that it is full (`max_client_conn`, `query_wait_timeout`: busy, not gone) nor that the
/// client broke the protocol.
fn pgbouncer_has_no_server(message: &str) -> bool {
    [
        "server login has been failing",
        "cannot connect to server",
        "server conn crashed",
    ]
    .iter()
    .any(|m| message.contains(m))
}

/// PgBouncer full: no client slot, or no server connection within `query_wait_timeout`.
fn pgbouncer_is_full(message: &str) -> bool {
    ["no more connections allowed", "query_wait_timeout"]
        .iter()
        .any(|m| message.contains(m))
}

/// Until when (milliseconds on [`clock`]) a released connection is pinged with a time
/// limit before it goes back to the pool; 0: not suspect.
static SUSPECT_UNTIL_MS: AtomicU64 = AtomicU64::new(0);

/// The most a background round (event dispatch, the hold sweeper, the purges) may take
/// before it is given up and run again next time: far above what one takes, it only
/// bounds a round stuck on a network that stopped answering.
pub const ROUND_LIMIT: Duration = Duration::from_secs(30);

/// How long after a database call was cut off released connections stay suspect.
pub const SUSPECT_FOR: Duration = Duration::from_secs(10);

fn clock() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_millis() as u64 + 1
}

/// Marks the database's network suspect for [`SUSPECT_FOR`]: a call was cut off, so the
/// connection it held may sit behind a network that stopped answering. (Process-wide: a
/// false alarm costs only a few pings.)
pub fn mark_suspect() {
    SUSPECT_UNTIL_MS.fetch_max(clock() + SUSPECT_FOR.as_millis() as u64, Ordering::Relaxed);
}

/// Whether a call was cut off (or a ping went unanswered) within [`SUSPECT_FOR`].
pub fn suspect() -> bool {
    SUSPECT_UNTIL_MS.load(Ordering::Relaxed) > clock()
}

/// `tokio::time::timeout` for work that may hold a database connection: when the time is
/// up the network is marked suspect *before* the work, and the connection with it, is
/// dropped, so the connection's release already pings it with a time limit. So it is
/// when this future is itself dropped unfinished (a request whose client went away).
pub async fn cut_off<F: Future>(limit: Duration, work: F) -> Result<F::Output, Elapsed> {
    let mut work = std::pin::pin!(work);
    // Declared after `work`, so dropped before it.
    let unfinished = MarkIfDropped;
    let out = tokio::time::timeout(limit, &mut work).await;
    std::mem::forget(unfinished);
    if out.is_err() {
        mark_suspect();
    }
    out
}

/// [`cut_off`] for a database call: running out of time is an error like the others
/// (an I/O "timed out", which [`is_unreachable`] counts as the server out of reach).
pub async fn bounded<T>(
    limit: Duration,
    call: impl Future<Output = sqlx::Result<T>>,
) -> sqlx::Result<T> {
    cut_off(limit, call)
        .await
        .unwrap_or_else(|_| Err(sqlx::Error::Io(std::io::ErrorKind::TimedOut.into())))
}

/// Marks the network suspect when dropped: [`cut_off`]'s work was abandoned mid-way.
struct MarkIfDropped;

impl Drop for MarkIfDropped {
    fn drop(&mut self) {
        mark_suspect();
    }
}

/// One connection to `url` within 30 s, or an error saying where to none was made: for
/// the tools that set servers up (local mode, the cluster, the load tester), whose
/// connects would otherwise wait as long as the server, or a proxy in front of it, lets
/// them.
pub async fn connect(url: &str) -> anyhow::Result<sqlx::PgConnection> {
    use anyhow::Context;
    use sqlx::Connection;
    const WITHIN: Duration = Duration::from_secs(30);
    let place = url
        .rsplit_once('@')
        .map_or(url, |(_, place)| place)
        .to_string();
    tokio::time::timeout(WITHIN, sqlx::PgConnection::connect(url))
        .await
        .with_context(|| format!("PostgreSQL at {place} did not accept a connection within 30 s"))?
        .with_context(|| format!("cannot connect to PostgreSQL at {place}"))
}
