//! The read replica: reads that may lag go to it while it answers, and to the primary
//! while it does not (`AppState::read`); a background check measures its lag.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::Duration;

use sqlx::PgPool;

/// How long a read waits for a replica connection before the replica counts as down.
pub const REPLICA_ACQUIRE_TIMEOUT: Duration = Duration::from_millis(250);
/// How often each process measures the replica's lag (and whether it answers).
pub const REPLICA_CHECK_EVERY: Duration = Duration::from_millis(250);

/// A streaming replica taking the reads that may lag, watched by a background check:
/// while it does not answer, reads go to the primary (`AppState::read`).
pub struct Replica {
    pool: PgPool,
    primary: PgPool,
    up: AtomicBool,
    /// Replay lag at the last check, in milliseconds and bytes of WAL (-1: unknown).
    lag_ms: AtomicI64,
    lag_bytes: AtomicI64,
}

impl Replica {
    /// The replica behind `pool` (lazily connected, its acquire timeout
    /// [`REPLICA_ACQUIRE_TIMEOUT`]), whose lag is read from `primary`; down until its check
    /// ([`Replica::spawn_check`]) finds it answering.
    pub fn new(pool: PgPool, primary: PgPool) -> Self {
        Self {
            pool,
            primary,
            up: AtomicBool::new(false),
            lag_ms: AtomicI64::new(-1),
            lag_bytes: AtomicI64::new(-1),
        }
    }

    /// The replica's own pool (whatever its check last found: see [`Replica::is_up`]).
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// After a read got no replica connection within the wait: whether the replica looks
    /// out of reach rather than busy. A busy replica's pool is full of connections in use;
    /// one that cannot be reached has dropped them and is trying to connect again.
    pub fn looks_gone(&self) -> bool {
        self.pool.size() < self.pool.options().get_max_connections()
    }

    /// Whether reads go to the replica now.
    pub fn is_up(&self) -> bool {
        self.up.load(Ordering::Relaxed)
    }

    /// Replay lag at the last check: milliseconds behind the primary's last commit, and
    /// bytes of WAL not yet replayed. `None` while the replica does not answer.
    pub fn lag(&self) -> Option<(i64, i64)> {
        let (ms, bytes) = (
            self.lag_ms.load(Ordering::Relaxed),
            self.lag_bytes.load(Ordering::Relaxed),
        );
        (self.is_up() && ms >= 0).then_some((ms, bytes))
    }

    /// Measures the lag every [`REPLICA_CHECK_EVERY`]; a replica that fails to answer
    /// within [`REPLICA_ACQUIRE_TIMEOUT`] is marked down until it answers again.
    pub fn spawn_check(self: &Arc<Self>) {
        let replica = self.clone();
        tokio::spawn(async move {
            let mut every = tokio::time::interval(REPLICA_CHECK_EVERY);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                every.tick().await;
                let measured =
                    crate::pg::cut_off(REPLICA_ACQUIRE_TIMEOUT * 2, replica.measure()).await;
                let up = matches!(measured, Ok(Ok(_)));
                if let Ok(Ok((ms, bytes))) = measured {
                    replica.lag_ms.store(ms, Ordering::Relaxed);
                    replica.lag_bytes.store(bytes, Ordering::Relaxed);
                }
                replica.set_up(up);
            }
        });
    }

    /// Takes the replica out at once, after a read on it found it gone; its check puts
    /// it back once it answers again.
    pub fn mark_down(&self) {
        self.set_up(false);
    }

    fn set_up(&self, up: bool) {
        if self.up.swap(up, Ordering::Relaxed) != up {
            if up {
                tracing::info!("the read replica answers; reads go to it");
            } else {
                tracing::warn!("the read replica does not answer; reads go to the primary");
            }
        }
    }

    /// Checks the replica answers, then reads from the primary how far its replicas'
    /// replay is behind (`pg_stat_replication`, which needs a superuser or `pg_monitor`):
    /// (milliseconds, bytes), the worst replica's. Caught up and quiet reads as 0 ms.
    async fn measure(&self) -> sqlx::Result<(i64, i64)> {
        sqlx::query!("select 1 as one")
            .fetch_one(&self.pool)
            .await?;
        let lag = sqlx::query!(
            r#"select max(extract(epoch from replay_lag) * 1000)::bigint as ms,
                      max(pg_wal_lsn_diff(pg_current_wal_lsn(), replay_lsn))::bigint as bytes
                 from pg_stat_replication"#,
        )
        .fetch_one(&self.primary)
        .await?;
        Ok((lag.ms.unwrap_or(0), lag.bytes.unwrap_or(0).max(0)))
    }
}
