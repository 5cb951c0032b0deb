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

/// How often the probe runs.
pub const PROBE_EVERY: Duration = Duration::from_millis(250);
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

    /// Probes `db` every [`PROBE_EVERY`], for as long as the process runs.
    pub fn spawn(self: &Arc<Self>, db: PgPool) {
        let outage = self.clone();
        tokio::spawn(async move {
            loop {
                outage.probe(&db).await;
                tokio::time::sleep(PROBE_EVERY).await;
            }
        });
    }

    /// One probe: `select 1`, on a connection from the pool while the database was
    /// reachable, confirmed on a new connection of its own when that finds it out of
    /// reach (a pooled connection may just have died with its server process), and only
    /// on a new one while it is not. Out of reach (a refused or dropped connection, a
    /// server shutting down or refusing logins) sets the verdict; an answer clears it; no
    /// connection or no answer in time (a busy pool, a slow network) leaves it as it was.
    async fn probe(&self, db: &PgPool) {
        let answer = if self.is_down() {
            fresh(db).await
        } else {
            match pooled(db).await {
                Some(Err(e)) if super::is_unreachable(&e) => fresh(db).await,
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

/// `select 1` on a connection from the pool; `None` when it took too long.
async fn pooled(db: &PgPool) -> Option<sqlx::Result<()>> {
    // Waiting for a connection holds none: it may simply be given up.
    let mut conn = match tokio::time::timeout(PROBE_LIMIT, db.acquire()).await.ok()? {
        Ok(conn) => conn,
        Err(e) => return Some(Err(e)),
    };
    let select = sqlx::query("select 1").execute(&mut *conn);
    Some(super::cut_off(PROBE_LIMIT, select).await.ok()?.map(drop))
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
