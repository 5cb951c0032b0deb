//! Answering from what a key decided, the one way out of placing ([`settle`]): what a
//! request answers when another request decided its key (a twin, or a retry that went
//! ahead while it stalled), a replay with the order or hold as it is now, and "not enough
//! stock" stored under the key by one statement.

use sqlx::Postgres;
use sqlx::pool::PoolConnection;

use super::placement::{Deps, Keyed, OrderError, Outcome, read_record, short_record};
use crate::idempotency::{self, Found, StoredResponse};
use crate::orders::Shortage;

/// Where placing a request ended: what it decided, or what decides it. Every path of
/// placing ends in one of these, and [`settle`] answers it.
pub(super) enum Reached {
    /// Decided: made now, or answered already (from Redis, or by the batch's write).
    Outcome(Outcome),
    /// Another request decided the key: what its record says.
    Elsewhere(Found),
    /// Not enough stock, to be stored under the key; with the request's connection, if
    /// it has one.
    Short(Vec<Shortage>, Option<PoolConnection<Postgres>>),
}

/// The one way out of placing: `reached` as the request's answer (a record read, or
/// "not enough stock" stored), then, for a failure that may hide a decision, what the
/// key says was done ([`answer_or_settled`]).
pub(super) async fn settle(
    deps: Deps<'_>,
    keyed: &Keyed<'_>,
    reached: Result<Reached, OrderError>,
) -> Result<Outcome, OrderError> {
    let placed = match reached {
        Ok(Reached::Outcome(outcome)) => Ok(outcome),
        Ok(Reached::Elsewhere(found)) => decided_elsewhere(deps, keyed, found).await,
        Ok(Reached::Short(shortages, conn)) => {
            store_insufficient(deps, keyed, shortages, conn).await
        }
        Err(e) => Err(e),
    };
    answer_or_settled(deps, keyed, placed).await
}

/// `placed`, unless it failed in a way that may hide a decision: the transaction may have
/// committed after all (the timeout fired during COMMIT, or the connection broke after
/// it), or a retry elsewhere placed it while this request stalled; then what was done.
/// No connection from the pool within its wait hides nothing (no statement was sent), and
/// reading the key would queue for the pool a second time: it is answered (503) at once.
async fn answer_or_settled(
    deps: Deps<'_>,
    keyed: &Keyed<'_>,
    placed: Result<Outcome, OrderError>,
) -> Result<Outcome, OrderError> {
    let error = match placed {
        Err(error @ OrderError::Database(sqlx::Error::PoolTimedOut)) => return Err(error),
        Err(
            error @ (OrderError::TimedOut
            | OrderError::Database(_)
            | OrderError::Busy
            | OrderError::Transient(_)),
        ) => error,
        decided => return decided,
    };
    if let Ok(Found::Completed(stored)) = keyed.lookup(deps.db).await {
        return replay(deps, keyed, stored).await;
    }
    Err(error)
}

/// The answer for a request that found its key decided by another request — a retry
/// that went ahead while this one stalled, or a concurrent twin: what that request
/// decided, or 409 while it is still deciding. Never "key reused" for the same request.
async fn decided_elsewhere(
    deps: Deps<'_>,
    keyed: &Keyed<'_>,
    found: Found,
) -> Result<Outcome, OrderError> {
    match found {
        Found::Completed(stored) => {
            deps.metrics.idempotent_replays.inc();
            replay(deps, keyed, stored).await
        }
        Found::Mismatch => Err(OrderError::KeyReused),
        Found::InFlight | Found::Stale(_) => Err(OrderError::InFlight),
        // The record is gone (purged) but the key's order or hold is there: that is it.
        Found::Absent => {
            let (want, scope, key) = (keyed.want, keyed.scope.as_str(), keyed.key.as_str());
            let made = match want.for_key(deps.db, scope, key).await? {
                Some(id) => want.find(deps.db, id).await?,
                None => None,
            };
            let made = made.ok_or(OrderError::InFlight)?;
            deps.metrics.idempotent_replays.inc();
            Ok(Outcome::Made {
                made,
                replayed: true,
            })
        }
    }
}

/// The outcome a stored response recorded, with the order or hold as it is now (it may
/// have been confirmed, cancelled or expired since).
async fn replay(
    deps: Deps<'_>,
    keyed: &Keyed<'_>,
    stored: StoredResponse,
) -> Result<Outcome, OrderError> {
    let corrupt = |e: serde_json::Error| OrderError::Database(sqlx::Error::Decode(Box::new(e)));
    match read_record(keyed.want, stored.body).map_err(corrupt)? {
        Outcome::Made { made, replayed } => {
            let now = keyed.want.find(deps.db, made.id()).await?;
            Ok(Outcome::Made {
                made: now.unwrap_or(made),
                replayed,
            })
        }
        short => Ok(short),
    }
}

/// Stores "not enough stock" under the key (one statement, one commit) and answers it;
/// if another request decided the key first, its answer. `conn`, the request's own
/// connection if it has one, goes back to the pool before that answer is read: a replay
/// takes a connection of its own, and holding one while waiting for another lets a burst
/// of twins drain the pool.
async fn store_insufficient(
    deps: Deps<'_>,
    keyed: &Keyed<'_>,
    shortages: Vec<Shortage>,
    conn: Option<PoolConnection<Postgres>>,
) -> Result<Outcome, OrderError> {
    let stored = short_record(&shortages);
    let k = keyed;
    let mut conn = match conn {
        Some(conn) => conn,
        None => deps.db.acquire().await?,
    };
    let found = idempotency::store(
        &mut conn,
        k.scope,
        k.key,
        &k.fingerprint,
        &stored,
        k.stale_after,
    )
    .await?;
    drop(conn);
    match found {
        None => Ok(Outcome::Insufficient {
            shortages,
            replayed: false,
        }),
        Some(found) => decided_elsewhere(deps, keyed, found).await,
    }
}
