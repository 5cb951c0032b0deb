//! The words every step of a placement speaks, at the bottom of `checkout/`: what is
//! wanted ([`Want`]: an order or a hold), what was made ([`Made`]), what a key decided
//! ([`Outcome`]) and how its record keeps that ([`made_record`], [`short_record`],
//! [`read_record`]), the key a request is placed under ([`Keyed`]), what placing needs
//! ([`Deps`]) and the errors that are not stored ([`OrderError`]).

use std::time::{Duration, Instant};

use serde::Serialize;
use sqlx::PgPool;
use uuid::Uuid;

use super::request::OrderRequest;
use crate::catalog::cache::CatalogCache;
use crate::config::Settings;
use crate::events::Event;
use crate::holds::Hold;
use crate::idempotency::{self, Fingerprint, Found, IdempotencyKey, Scope, StoredResponse};
use crate::locking::Redis;
use crate::metrics::Metrics;
use crate::orders::{Order, Shortage};

/// How many times a write refused for a stale fence (or a batch that raced a key) is
/// tried again, under a fresh lease.
pub const MAX_ATTEMPTS: usize = 5;

/// What a shopper's request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Want {
    /// An order: stock sold now (`on_hand −= q`).
    Order,
    /// A checkout hold: stock set aside until it expires (`reserved += q`).
    Hold,
}

/// What a placement made: the order, or the hold. Serialised as the API shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Made {
    Order(Order),
    Hold(Hold),
}

impl Made {
    pub fn id(&self) -> Uuid {
        match self {
            Self::Order(order) => order.id,
            Self::Hold(hold) => hold.id,
        }
    }

    /// The event told to the outside world when it is made.
    pub fn event(&self) -> Event {
        match self {
            Self::Order(order) => Event::order_placed(order),
            Self::Hold(hold) => Event::hold_placed(hold),
        }
    }
}

/// What a key decided; stored under it and replayed for retries.
#[derive(Debug, Clone)]
pub enum Outcome {
    /// The order or hold exists.
    Made { made: Made, replayed: bool },
    /// Not enough stock for these SKUs; nothing was written.
    Insufficient {
        shortages: Vec<Shortage>,
        replayed: bool,
    },
}

impl Outcome {
    pub fn replayed(&self) -> bool {
        match self {
            Self::Made { replayed, .. } | Self::Insufficient { replayed, .. } => *replayed,
        }
    }
}

/// The record kept under a key for what it made. (Its status is the one the JSON API
/// answers with, so that every record in the table reads the same way.)
pub fn made_record(made: &Made) -> StoredResponse {
    let body = serde_json::to_value(made).expect("orders and holds serialise");
    StoredResponse { status: 201, body }
}

/// The record kept under a key for "not enough stock".
pub fn short_record(shortages: &[Shortage]) -> StoredResponse {
    let body = serde_json::json!({ "shortages": shortages });
    StoredResponse { status: 409, body }
}

/// What a record says, read back by its shape: shortages, or the `want` it made.
pub fn read_record(want: Want, body: serde_json::Value) -> serde_json::Result<Outcome> {
    #[derive(serde::Deserialize)]
    struct Short {
        shortages: Vec<Shortage>,
    }
    if body.get("shortages").is_some() {
        let Short { shortages } = serde_json::from_value(body)?;
        return Ok(Outcome::Insufficient {
            shortages,
            replayed: true,
        });
    }
    let made = match want {
        Want::Order => Made::Order(serde_json::from_value(body)?),
        Want::Hold => Made::Hold(serde_json::from_value(body)?),
    };
    Ok(Outcome::Made {
        made,
        replayed: true,
    })
}

/// The key a request is placed under, what it wants, and what its record must match.
pub struct Keyed<'a> {
    pub want: Want,
    pub scope: Scope,
    pub key: &'a IdempotencyKey,
    pub fingerprint: Fingerprint,
    pub stale_after: Duration,
}

impl<'a> Keyed<'a> {
    pub fn new(
        settings: &Settings,
        want: Want,
        scope: Scope,
        key: &'a IdempotencyKey,
        request: &OrderRequest,
    ) -> Self {
        Self {
            want,
            scope,
            key,
            fingerprint: request.fingerprint(),
            stale_after: stale_after(settings),
        }
    }

    pub async fn lookup(&self, db: &PgPool) -> sqlx::Result<Found> {
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

/// How long an in-flight idempotency record is trusted before a retry may take it over:
/// longer than any request can still be working on it (its budget). A process stopped
/// for longer finds its claim gone on waking and answers with what the key holds then.
pub fn stale_after(s: &Settings) -> Duration {
    s.request_budget + s.fault_pause_after_lease + Duration::from_secs(2)
}

/// What every step of a placement reads and writes through.
#[derive(Clone, Copy)]
pub struct Deps<'a> {
    pub db: &'a PgPool,
    pub redis: &'a Redis,
    pub settings: &'a Settings,
    pub metrics: &'a Metrics,
    /// Forgotten for a SKU this process sells out, so its pages say so at once.
    pub catalog: &'a CatalogCache,
    /// When the request's client is answered whatever happens (its budget runs out): no
    /// transaction starts for it after this. A commit sent before may still finish; its
    /// key then replays the order.
    pub answer_by: Instant,
}

/// Outcomes that are not stored: the client may retry with the same key.
#[derive(Debug, thiserror::Error)]
pub enum OrderError {
    #[error("no product with SKU {}", .0.join(", "))]
    UnknownSkus(Vec<String>),
    #[error("{0}")]
    OverCap(String),
    /// The shopper already has what a product's purchase limit allows (409, not stored:
    /// it changes when one of their holds is released).
    #[error("{0}")]
    OverLimit(String),
    #[error("this idempotency key was already used for a different request")]
    KeyReused,
    #[error("a request with this idempotency key is still being processed; retry shortly")]
    InFlight,
    #[error("these products are in high demand right now; please retry in a moment")]
    Busy,
    /// A batch failed for a passing database reason ([`crate::pg::transient_cause`] says
    /// which, for every order of the batch alike): not stored, retry.
    #[error("{0}")]
    Transient(&'static str),
    /// The request ran out of time with its outcome unknown (a commit may have been sent
    /// and not answered): only the key can tell.
    #[error(
        "we could not confirm the order in time; retry with the same Idempotency-Key to find out whether it was placed"
    )]
    TimedOut,
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

impl OrderError {
    /// The metric label of a request that ended with this error.
    pub fn outcome(&self) -> &'static str {
        match self {
            Self::UnknownSkus(_) | Self::OverCap(_) => "invalid",
            Self::OverLimit(_) => "over_limit",
            Self::KeyReused => "key_reused",
            Self::InFlight => "in_flight",
            // Shed for want of a connection, as a 503 says.
            Self::Busy
            | Self::Transient(_)
            | Self::TimedOut
            | Self::Database(sqlx::Error::PoolTimedOut) => "busy",
            Self::Database(_) => "error",
        }
    }

    /// The same failure again, for each job of a failed batch (each request then checks
    /// whether its key was decided after all, as a single request would).
    pub fn copied(&self) -> Self {
        match self {
            Self::UnknownSkus(skus) => Self::UnknownSkus(skus.clone()),
            Self::TimedOut => Self::TimedOut,
            // Kept as it is: it proves the batch sent nothing, so each job answers at once.
            Self::Database(sqlx::Error::PoolTimedOut) => Self::Database(sqlx::Error::PoolTimedOut),
            // Its cause, not "high demand": a blocked table is not a crowd.
            Self::Database(e) if crate::pg::is_transient(e) => {
                Self::Transient(crate::pg::transient_cause(e))
            }
            Self::Database(e) => {
                Self::Database(sqlx::Error::Protocol(format!("batch failed: {e}")))
            }
            _ => Self::Busy,
        }
    }
}

#[cfg(test)]
mod tests {
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

    fn made(outcome: Outcome) -> Made {
        match outcome {
            Outcome::Made { made, .. } => made,
            Outcome::Insufficient { .. } => panic!("read back as shortages"),
        }
    }

    #[test]
    fn a_record_is_read_back_by_its_shape_as_what_was_decided() {
        let at = chrono::DateTime::from_timestamp_micros(1_700_000_000_123_456).unwrap();
        let order = Made::Order(Order {
            id: Uuid::new_v4(),
            number: 1001,
            status: OrderStatus::Placed,
            lines: vec![line()],
            total_cents: 300,
            email: Some("a@b.co".into()),
            customer_name: None,
            shipping_address: None,
            created_at: at,
            payment: None,
        });
        assert_eq!(
            made(read_record(Want::Order, made_record(&order).body).unwrap()),
            order
        );
        let hold = Made::Hold(Hold {
            id: Uuid::new_v4(),
            state: HoldState::Active,
            expires_at: at,
            lines: vec![line()],
            total_cents: 300,
            email: None,
            customer_name: Some("Ada".into()),
            order_id: None,
        });
        assert_eq!(
            made(read_record(Want::Hold, made_record(&hold).body).unwrap()),
            hold
        );
        // An order's record is not a hold's.
        assert!(read_record(Want::Hold, made_record(&order).body).is_err());
        let short = vec![Shortage {
            sku: "A-1".into(),
            requested: 3,
            available: 1,
        }];
        for want in [Want::Order, Want::Hold] {
            match read_record(want, short_record(&short).body).unwrap() {
                Outcome::Insufficient { shortages, .. } => assert_eq!(shortages, short),
                Outcome::Made { .. } => panic!("shortages read back as {want:?}"),
            }
        }
    }
}
