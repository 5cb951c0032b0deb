//! Sold-out answers without a database write: what they mean, and their copy into
//! PostgreSQL. (How Redis keeps them, and why a twin request can never be answered
//! differently, is in [`crate::locking::decisions`].)
//!
//! A request for a SKU this process saw sold out reads its key in PostgreSQL (a decided
//! key is answered from there, as always) and then asks Redis to store "not enough
//! stock" under it, which Redis does only while the SKU still carries the sold-out hint.
//! Stock coming back clears the hint, so the next request goes to PostgreSQL again.
//!
//! The answer is durable in Redis at once and in PostgreSQL within a second: every
//! process copies the answers waiting in Redis into `idempotency_keys` every
//! [`DRAIN_EVERY`]. While Redis is unreachable none of this runs and sold-out answers are
//! stored in PostgreSQL, one commit each. Should Redis lose its data, the answers it had
//! not yet handed over (about a second's worth) are lost with it; a retry of such a key
//! is then treated as a new request.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use sqlx::PgPool;

use super::placement::{OrderError, Outcome};
use super::request::OrderRequest;
use crate::catalog::Sku;
use crate::idempotency::{self, Fingerprint, IdempotencyKey, Scope, StoredResponse};
use crate::locking::Redis;
use crate::locking::decisions::{Decided, IN_POSTGRES};
use crate::metrics::Metrics;
use crate::orders::Shortage;

/// How long an answer stays in Redis: long past its copy into PostgreSQL.
pub const KEEP: Duration = Duration::from_secs(300);
/// How often each process copies answers from Redis into PostgreSQL.
pub const DRAIN_EVERY: Duration = Duration::from_secs(1);
/// Most answers copied by one statement.
const DRAIN_BATCH: usize = 1000;

/// A sold-out answer as Redis keeps it (and as it is copied into PostgreSQL).
#[derive(Debug, Serialize, Deserialize)]
struct Record {
    scope: String,
    key: String,
    fingerprint: String,
    shortages: Vec<Shortage>,
}

/// What a request for a SKU believed sold out is answered.
#[derive(Debug)]
pub enum Answer {
    /// 409: not enough stock (`replayed` when the key had this answer already).
    SoldOut {
        shortages: Vec<Shortage>,
        replayed: bool,
    },
    /// The key's answer is for a different request (422).
    KeyReused,
    /// Decide in PostgreSQL: the SKU is no longer hinted, the key is being decided
    /// there, or Redis did not answer.
    Elsewhere,
}

impl Answer {
    /// The answer as an outcome (a replayed one counted in `metrics`); `None` when Redis
    /// has none: decide in PostgreSQL.
    pub(super) fn outcome(self, metrics: &Metrics) -> Result<Option<Outcome>, OrderError> {
        match self {
            Self::SoldOut {
                shortages,
                replayed,
            } => {
                if replayed {
                    metrics.idempotent_replays.inc();
                }
                Ok(Some(Outcome::Insufficient {
                    shortages,
                    replayed,
                }))
            }
            Self::KeyReused => Err(OrderError::KeyReused),
            Self::Elsewhere => Ok(None),
        }
    }
}

/// One request to answer: its key, what its record must match, and the units of the
/// sold-out SKU it asked for.
pub struct Asking<'a> {
    pub scope: Scope,
    pub key: &'a IdempotencyKey,
    pub fingerprint: &'a Fingerprint,
    pub requested: i32,
}

/// Answers each request for `sku` from Redis if `sku` is still hinted sold out; `None`
/// when it is not (or Redis did not answer): decide them in PostgreSQL. The caller has
/// found no record of these keys in PostgreSQL.
pub async fn answer_many(redis: &Redis, sku: &Sku, asking: &[Asking<'_>]) -> Option<Vec<Answer>> {
    let records: Vec<Record> = asking
        .iter()
        .map(|a| Record {
            scope: a.scope.as_str().to_string(),
            key: a.key.as_str().to_string(),
            fingerprint: a.fingerprint.as_str().to_string(),
            shortages: vec![Shortage {
                sku: sku.to_string(),
                requested: a.requested,
                available: 0,
            }],
        })
        .collect();
    let texts: Vec<(&str, &str, String)> = records
        .iter()
        .map(|r| {
            let text = serde_json::to_string(r).expect("records serialise");
            (r.scope.as_str(), r.key.as_str(), text)
        })
        .collect();
    let Decided::SoldOut(found) = redis.decide_sold_out(sku, &texts, KEEP).await? else {
        return None;
    };
    Some(
        records
            .into_iter()
            .zip(asking)
            .zip(found)
            .map(|((record, asking), found)| match found {
                None => Answer::SoldOut {
                    shortages: record.shortages,
                    replayed: false,
                },
                Some(stored) => replay(&stored, asking.fingerprint),
            })
            .collect(),
    )
}

/// [`answer_many`] for one request, by the first of its SKUs this process saw sold out.
pub async fn answer(
    redis: &Redis,
    scope: Scope,
    key: &IdempotencyKey,
    fingerprint: &Fingerprint,
    request: &OrderRequest,
) -> Answer {
    let Some(line) = request
        .lines()
        .iter()
        .find(|l| redis.believes_sold_out(std::slice::from_ref(&l.sku)))
    else {
        return Answer::Elsewhere;
    };
    let asking = Asking {
        scope,
        key,
        fingerprint,
        requested: line.quantity.get(),
    };
    answer_many(redis, &line.sku, std::slice::from_ref(&asking))
        .await
        .and_then(|mut answers| answers.pop())
        .unwrap_or(Answer::Elsewhere)
}

/// The answer a stored record gives a request with `fingerprint`; `pg` means "decided in
/// PostgreSQL".
pub fn replay(stored: &str, fingerprint: &Fingerprint) -> Answer {
    if stored == IN_POSTGRES {
        return Answer::Elsewhere;
    }
    match serde_json::from_str::<Record>(stored) {
        Ok(record) if record.fingerprint == fingerprint.as_str() => Answer::SoldOut {
            shortages: record.shortages,
            replayed: true,
        },
        Ok(_) => Answer::KeyReused,
        Err(e) => {
            tracing::warn!(error = %e, "unreadable sold-out answer in Redis");
            Answer::Elsewhere
        }
    }
}

/// Copies every sold-out answer waiting in Redis into PostgreSQL; returns how many were
/// new there. Answers whose copy failed go back to the list.
pub async fn drain(db: &PgPool, redis: &Redis) -> sqlx::Result<u64> {
    let mut copied = 0;
    loop {
        let Some(texts) = redis.take_drained(DRAIN_BATCH).await else {
            return Ok(copied);
        };
        if texts.is_empty() {
            return Ok(copied);
        }
        let records: Vec<Record> = texts
            .iter()
            .filter_map(|t| serde_json::from_str(t).ok())
            .collect();
        let decisions: Vec<idempotency::Decision<'_>> = records
            .iter()
            .map(|r| idempotency::Decision {
                scope: &r.scope,
                key: &r.key,
                fingerprint: &r.fingerprint,
                response: StoredResponse {
                    status: 409,
                    body: serde_json::json!({ "shortages": r.shortages }),
                },
            })
            .collect();
        // Bounded, so that a database behind a dead network gets its answers back in
        // the list rather than holding them (and a connection) until TCP gives up.
        let store = idempotency::store_decided(db, &decisions);
        match crate::pg::bounded(crate::pg::ROUND_LIMIT, store).await {
            Ok(n) => copied += n,
            Err(e) => {
                redis.requeue(&texts).await;
                return Err(e);
            }
        }
        if texts.len() < DRAIN_BATCH {
            return Ok(copied);
        }
    }
}

/// Runs [`drain`] every [`DRAIN_EVERY`] for the life of the process.
pub fn spawn_drain(db: PgPool, redis: Redis) {
    tokio::spawn(async move {
        let mut every = tokio::time::interval(DRAIN_EVERY);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            if let Err(e) = drain(&db, &redis).await {
                tracing::warn!(error = %e, "copying sold-out answers into PostgreSQL failed");
            }
        }
    });
}
