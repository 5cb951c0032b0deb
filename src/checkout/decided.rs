//! What a key decides, and answering from it: the [`Outcome`] of a placement, as its
//! record keeps it and as a replay returns it (with the order or hold as it is now); what
//! a request answers when another request decided its key (a twin, or a retry that went
//! ahead while it stalled); and "not enough stock", stored under the key by one statement.

use serde::Serialize;
use sqlx::pool::PoolConnection;
use sqlx::{PgPool, Postgres};

use super::kind::Kind;
use super::sold_out::Answer;
use super::{HoldOutcome, OrderDeps, OrderError, OrderOutcome, OrderRequest, stale_after};
use crate::config::Settings;
use crate::holds::Hold;
use crate::idempotency::{self, Fingerprint, Found, IdempotencyKey, Scope, StoredResponse};
use crate::orders::{Order, Shortage};

/// What a placement of kind `K` decided; stored under the key and replayed for retries.
#[derive(Debug, Clone)]
pub(super) enum Outcome<K> {
    /// `K` was made: the order, or the hold.
    Made { made: K, replayed: bool },
    /// Not enough stock for these SKUs; nothing was written.
    Insufficient {
        shortages: Vec<Shortage>,
        replayed: bool,
    },
}

impl From<Outcome<Order>> for OrderOutcome {
    fn from(o: Outcome<Order>) -> Self {
        match o {
            Outcome::Made { made, replayed } => Self::Placed {
                order: made,
                replayed,
            },
            Outcome::Insufficient {
                shortages,
                replayed,
            } => Self::Insufficient {
                shortages,
                replayed,
            },
        }
    }
}

impl From<Outcome<Hold>> for HoldOutcome {
    fn from(o: Outcome<Hold>) -> Self {
        match o {
            Outcome::Made { made, replayed } => Self::Held {
                hold: made,
                replayed,
            },
            Outcome::Insufficient {
                shortages,
                replayed,
            } => Self::Insufficient {
                shortages,
                replayed,
            },
        }
    }
}

/// An outcome as its key's record keeps it: the made thing as the API shows it, or the
/// shortages. Which one a record holds is read from its body's shape.
#[derive(serde::Deserialize)]
#[serde(untagged)]
pub(super) enum Stored<K> {
    Insufficient { shortages: Vec<Shortage> },
    Made(K),
}

impl<K: Serialize> Stored<K> {
    /// The record kept under the key. (Its status is the one the JSON API answers with,
    /// so that every record in the table reads the same way.)
    pub(super) fn made(made: &K) -> StoredResponse {
        let body = serde_json::to_value(made).expect("orders and holds serialise");
        StoredResponse { status: 201, body }
    }

    pub(super) fn insufficient(shortages: &[Shortage]) -> StoredResponse {
        let body = serde_json::json!({ "shortages": shortages });
        StoredResponse { status: 409, body }
    }
}

/// The key a request is placed under, with what its record must match.
pub(super) struct Keyed<'a> {
    pub(super) scope: Scope,
    pub(super) key: &'a IdempotencyKey,
    pub(super) fingerprint: Fingerprint,
    pub(super) stale_after: std::time::Duration,
}

impl<'a> Keyed<'a> {
    pub(super) fn new(
        settings: &Settings,
        scope: Scope,
        key: &'a IdempotencyKey,
        request: &OrderRequest,
    ) -> Self {
        Self {
            scope,
            key,
            fingerprint: request.fingerprint(),
            stale_after: stale_after(settings),
        }
    }

    pub(super) async fn lookup(&self, db: &PgPool) -> sqlx::Result<Found> {
        idempotency::lookup(
            db,
            self.scope,
            self.key,
            &self.fingerprint,
            self.stale_after,
        )
        .await
    }
}

/// A sold-out answer kept in Redis, as an outcome; `None` when there is none.
pub(super) fn from_redis<K>(
    deps: OrderDeps<'_>,
    answer: Answer,
) -> Result<Option<Outcome<K>>, OrderError> {
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
pub(super) async fn answer_or_settled<K: Kind>(
    deps: OrderDeps<'_>,
    keyed: &Keyed<'_>,
    placed: Result<Outcome<K>, OrderError>,
) -> Result<Outcome<K>, OrderError> {
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
        return replay(deps, stored).await;
    }
    Err(error)
}

/// The answer for a request that found its key decided by another request — a retry
/// that went ahead while this one stalled, or a concurrent twin: what that request
/// decided, or 409 while it is still deciding. Never "key reused" for the same request.
pub(super) async fn decided_elsewhere<K: Kind>(
    deps: OrderDeps<'_>,
    keyed: &Keyed<'_>,
    found: Found,
) -> Result<Outcome<K>, OrderError> {
    match found {
        Found::Completed(stored) => {
            deps.metrics.idempotent_replays.inc();
            replay(deps, stored).await
        }
        Found::Mismatch => Err(OrderError::KeyReused),
        Found::InFlight | Found::Stale(_) => Err(OrderError::InFlight),
        // The record is gone (purged) but the key's order or hold is there: that is it.
        Found::Absent => {
            let (scope, key) = (keyed.scope.as_str(), keyed.key.as_str());
            let made = match K::for_key(deps.db, scope, key).await? {
                Some(id) => K::find(deps.db, id).await?,
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
pub(super) async fn replay<K: Kind>(
    deps: OrderDeps<'_>,
    stored: StoredResponse,
) -> Result<Outcome<K>, OrderError> {
    let corrupt = |e: serde_json::Error| OrderError::Database(sqlx::Error::Decode(Box::new(e)));
    match serde_json::from_value(stored.body).map_err(corrupt)? {
        Stored::Made(made) => {
            let now = K::find(deps.db, K::id(&made)).await?;
            Ok(Outcome::Made {
                made: now.unwrap_or(made),
                replayed: true,
            })
        }
        Stored::Insufficient { shortages } => Ok(Outcome::Insufficient {
            shortages,
            replayed: true,
        }),
    }
}

/// Stores "not enough stock" under the key (one statement, one commit) and answers it;
/// if another request decided the key first, its answer. `conn`, the request's own
/// connection if it has one, goes back to the pool before that answer is read: a replay
/// takes a connection of its own, and holding one while waiting for another lets a burst
/// of twins drain the pool.
pub(super) async fn store_insufficient<K: Kind>(
    deps: OrderDeps<'_>,
    keyed: &Keyed<'_>,
    shortages: Vec<Shortage>,
    conn: Option<PoolConnection<Postgres>>,
) -> Result<Outcome<K>, OrderError> {
    let stored = Stored::<K>::insufficient(&shortages);
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

#[cfg(test)]
mod tests {
    use uuid::Uuid;

    use super::*;
    use crate::catalog::Sku;
    use crate::holds::HoldState;
    use crate::orders::{OrderLine, OrderStatus};

    fn line() -> OrderLine {
        OrderLine {
            sku: Sku::parse("A-1").unwrap(),
            name: "A thing".into(),
            quantity: 2,
            unit_price_cents: 150,
        }
    }

    #[test]
    fn a_record_is_read_back_by_its_shape_as_what_was_decided() {
        let at = chrono::DateTime::from_timestamp_micros(1_700_000_000_123_456).unwrap();
        let order = Order {
            id: Uuid::new_v4(),
            status: OrderStatus::Placed,
            lines: vec![line()],
            total_cents: 300,
            email: Some("a@b.co".into()),
            customer_name: None,
            created_at: at,
        };
        match serde_json::from_value(Stored::made(&order).body).unwrap() {
            Stored::Made(read) => assert_eq!(read, order),
            Stored::<Order>::Insufficient { .. } => panic!("an order read back as shortages"),
        }
        let hold = Hold {
            id: Uuid::new_v4(),
            state: HoldState::Active,
            expires_at: at,
            lines: vec![line()],
            total_cents: 300,
            email: None,
            customer_name: Some("Ada".into()),
            order_id: None,
        };
        match serde_json::from_value(Stored::made(&hold).body).unwrap() {
            Stored::Made(read) => assert_eq!(read, hold),
            Stored::<Hold>::Insufficient { .. } => panic!("a hold read back as shortages"),
        }
        let short = vec![Shortage {
            sku: "A-1".into(),
            requested: 3,
            available: 1,
        }];
        match serde_json::from_value(Stored::<Order>::insufficient(&short).body).unwrap() {
            Stored::<Order>::Insufficient { shortages } => assert_eq!(shortages, short),
            Stored::Made(_) => panic!("shortages read back as an order"),
        }
        match serde_json::from_value(Stored::<Hold>::insufficient(&short).body).unwrap() {
            Stored::<Hold>::Insufficient { shortages } => assert_eq!(shortages, short),
            Stored::Made(_) => panic!("shortages read back as a hold"),
        }
    }
}
