//! Answering from what a key decided: what a request answers when another request decided
//! its key (a twin, or a retry that went ahead while it stalled), a replay with the order
//! or hold as it is now, a sold-out answer kept in Redis, and "not enough stock" stored
//! under the key by one statement.

use sqlx::Postgres;
use sqlx::pool::PoolConnection;

use super::placement::{Deps, Keyed, OrderError, Outcome, read_record, short_record};
use super::sold_out::Answer;
use crate::idempotency::{self, Found, StoredResponse};
use crate::orders::Shortage;

/// A sold-out answer kept in Redis, as an outcome; `None` when there is none.
pub(super) fn from_redis(deps: Deps<'_>, answer: Answer) -> Result<Option<Outcome>, OrderError> {
    match answer {
        Answer::SoldOut {
            shortages,
            replayed,
        } => {
            if replayed {
                deps.metrics.idempotent_replays.inc();
            }
            Ok(Some(Outcome::Insufficient {
                shortages,
                replayed,
            }))
        }
        Answer::KeyReused => Err(OrderError::KeyReused),
        Answer::Elsewhere => Ok(None),
    }
}

/// `placed`, unless it failed in a way that may hide a decision: the transaction may have
/// committed after all (the timeout fired during COMMIT, or the connection broke after
/// it), or a retry elsewhere placed it while this request stalled; then what was done.
/// No connection from the pool within its wait hides nothing (no statement was sent), and
/// reading the key would queue for the pool a second time: it is answered (503) at once.
pub(super) async fn answer_or_settled(
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
pub(super) async fn decided_elsewhere(
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
pub(super) async fn replay(
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
pub(super) async fn store_insufficient(
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
