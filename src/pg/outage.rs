//! Whether the primary database is out of reach, as a probe finds it.
//!
//! While PostgreSQL is gone (a failover, a restart), every request that needs it would open
//! a connection of its own and fail: hundreds of logins a second, each with a SCRAM
//! exchange, at the very moment a new primary, or the PgBouncer in front of it, needs the
//! CPU to come back. Instead one probe per process finds the outage, and until a probe
//! reaches the database again requests are answered 503 at once, having done nothing.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sqlx::PgPool;

/// The most one probe waits: for a connection from the pool, and for its answer. A probe
/// that waited this long proves nothing (the pool may just be busy): the verdict stays.
const PROBE_LIMIT: Duration = Duration::from_millis(1_000);

/// The verdict of the last conclusive probe.
#[derive(Debug, Default)]
pub struct Outage {
    down: AtomicBool,
}

impl Outage {
    /// Whether the last conclusive probe found the database out of reach.
    pub fn is_down(&self) -> bool {
        self.down.load(Ordering::Relaxed)
    }

    /// Probes `db` every `every` (`STOCKADE_DB_PROBE_MS`), for as long as the process
    /// runs; never when it is zero.
    pub fn spawn(self: &Arc<Self>, db: PgPool, every: Duration) {
        if every.is_zero() {
            return;
        }
        let outage = self.clone();
        tokio::spawn(async move {
            loop {
                outage.probe(&db).await;
                tokio::time::sleep(every).await;
            }
        });
    }

    /// One probe: `select 1`, on a connection from the pool while the database was
    /// reachable, and on a new connection of its own while it is not, or when the pooled
    /// probe found it out of reach (a pooled connection may just have died with its server
    /// process) or got no answer in time (the pool retries a refused connection quietly
    /// until its wait runs out, so a pool that gives nothing may be busy or may face a
    /// stopped server). Out of reach (a refused or dropped connection, a server shutting
    /// down, PgBouncer without a server) sets the verdict; an answer clears it; no answer
    /// in time (a busy server, a slow network) leaves it as it was.
    async fn probe(&self, db: &PgPool) {
        let answer = if self.is_down() {
            fresh(db).await
        } else {
            match pooled(db).await {
                Some(Err(e)) if super::is_unreachable(&e) => fresh(db).await,
                None | Some(Err(sqlx::Error::PoolTimedOut)) => fresh(db).await,
                other => other,
            }
        };
        let Some(answer) = answer else {
            return;
        };
        let down = match answer {
            Ok(()) => false,
            Err(e) if super::is_unreachable(&e) => {
                if !self.is_down() {
                    tracing::warn!(error = %e, "the database is out of reach; answering 503 until it is back");
                }
                true
            }
            Err(_) => return,
        };
        if self.down.swap(down, Ordering::Relaxed) && !down {
            tracing::warn!("the database is reachable again");
        }
    }
}

/// `select 1` on a connection from the pool; `None` when it took too long. (A connection
/// given up mid-call is pinged by the pool on its release, and closed if it does not
/// answer; a slow probe does not mark the network suspect.)
async fn pooled(db: &PgPool) -> Option<sqlx::Result<()>> {
    let work = async {
        let mut conn = db.acquire().await?;
        sqlx::query("select 1").execute(&mut *conn).await.map(drop)
    };
    tokio::time::timeout(PROBE_LIMIT, work).await.ok()
}

/// `select 1` on a new connection, closed after; `None` when it took too long.
async fn fresh(db: &PgPool) -> Option<sqlx::Result<()>> {
    use sqlx::{ConnectOptions, Connection};
    let options = db.connect_options();
    let attempt = async {
        let mut conn = options.connect().await?;
        sqlx::query("select 1").execute(&mut conn).await?;
        conn.close().await
    };
    tokio::time::timeout(PROBE_LIMIT, attempt).await.ok()
}
