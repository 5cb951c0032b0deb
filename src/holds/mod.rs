//! Checkout holds: the `holds` rows, and every change of a hold's state. A hold reserves
//! stock for a shopper for a while; it is placed by [`crate::checkout::place_hold`] (the
//! same idempotency, leases and conditional update as an order, with `reserved += q`
//! instead of `on_hand −= q`). Every stock change here goes through
//! [`crate::inventory::db`], with its ledger row.
//!
//! A hold then changes state exactly once, under its row lock:
//! - **confirm** turns it into an order (`reserved −= q, on_hand −= q`, order, ledger, one
//!   commit); confirming again returns the same order. After expiry the order is placed
//!   from free stock if there is enough, else it is refused. Either way the purchase limit
//!   is counted again under the stock rows' locks, for the hold's shopper and the email
//!   given at confirmation, and the order records both: a hold that expired no longer
//!   counts, so its units are a new sale, and a new email is a new identity;
//! - **release** (the shopper cancels) returns the stock at once; again is a no-op;
//!   under `batched`, concurrent confirmations share a transaction ([`Confirmer`], in
//!   `batch.rs`), with the same locks and the same one state change per hold;
//! - the **sweeper**, in every process, claims expired holds with `FOR UPDATE SKIP LOCKED`
//!   in batches and returns their stock, so several processes never release one twice.

mod batch;
pub mod cap;
pub mod db;
pub mod reports;

pub use batch::Confirmer;

/// A hold to confirm into an order, as asked.
#[derive(Debug, Clone, Copy)]
pub struct Confirmation<'a> {
    pub hold: Uuid,
    /// The API caller's key prefix the hold must have been placed under (`None`: the
    /// storefront, where the hold's unguessable id is the permission).
    pub owner: Option<&'a str>,
    /// Who the order is for, and where it goes.
    pub contact: &'a crate::orders::Contact,
    /// When the request's client stops waiting: a lot that begins later skips it.
    pub answer_by: Instant,
}

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use uuid::Uuid;

use crate::catalog::format_cents;
use crate::events::{self, Event};
use crate::inventory::db::{Take, sell_reserved, take_stock, unreserve, unreserve_many};
use crate::locking::Redis;
use crate::orders::{Order, OrderLine, OrderStatus, Shortage, limits, text_column};

/// Where a hold stands (`holds.state`). It leaves `Active` once, under its row lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum HoldState {
    /// Its stock is reserved (until `expires_at`; the sweeper then expires it).
    Active,
    /// It became an order.
    Confirmed,
    /// The shopper cancelled it; its stock went back.
    Released,
    /// It ran out of time; its stock went back.
    Expired,
}

impl HoldState {
    pub const ALL: [Self; 4] = [Self::Active, Self::Confirmed, Self::Released, Self::Expired];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Active => "active",
            Self::Confirmed => "confirmed",
            Self::Released => "released",
            Self::Expired => "expired",
        }
    }

    pub fn is_released(self) -> bool {
        self == Self::Released
    }
}

text_column!(HoldState);

/// A hold as pages and the API show it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Hold {
    pub id: Uuid,
    pub state: HoldState,
    pub expires_at: DateTime<Utc>,
    pub lines: Vec<OrderLine>,
    pub total_cents: i64,
    pub email: Option<String>,
    pub customer_name: Option<String>,
    /// The order a confirmed hold became.
    pub order_id: Option<Uuid>,
}

impl Hold {
    /// Whole seconds left, 0 once expired.
    pub fn seconds_left(&self) -> i64 {
        (self.expires_at - Utc::now()).num_seconds().max(0)
    }

    /// `"9:41"`.
    pub fn time_left(&self) -> String {
        let s = self.seconds_left();
        format!("{}:{:02}", s / 60, s % 60)
    }

    /// The time left as a screen reader says it: whole minutes, rounded up
    /// (`"10 minutes"` from 9:01 to 10:00, `"1 minute"` in the last one).
    pub fn minutes_left(&self) -> String {
        match (self.seconds_left() + 59) / 60 {
            1 => "1 minute".into(),
            m => format!("{m} minutes"),
        }
    }

    pub fn is_active(&self) -> bool {
        self.state == HoldState::Active && self.expires_at > Utc::now()
    }

    pub fn total(&self) -> String {
        format_cents(self.total_cents)
    }
}

/// `hold.placed`, built here so that [`crate::events`] needs nothing of this module.
impl Event {
    /// `hold.placed`: the hold as the API shows it, with `hold_id`.
    pub fn hold_placed(hold: &Hold) -> Self {
        let mut payload = serde_json::to_value(hold).expect("holds serialise");
        payload["hold_id"] = serde_json::json!(hold.id);
        Self {
            kind: events::EventType::HoldPlaced,
            payload,
        }
    }
}

/// Why a hold could not be confirmed or released.
#[derive(Debug, thiserror::Error)]
pub enum HoldError {
    #[error("no such reservation")]
    NotFound,
    #[error("this reservation was cancelled")]
    Released,
    #[error("this reservation has already become an order")]
    AlreadyConfirmed(Uuid),
    /// Confirmed after expiry, and the free stock no longer covers it.
    #[error("the reservation expired and not enough stock is left")]
    Insufficient(Vec<Shortage>),
    /// The order would take the shopper past a product's purchase limit (the message says
    /// which); nothing changed.
    #[error("{0}")]
    OverLimit(String),
    /// The request ran out of time before its transaction could start; nothing was done
    /// for it (another confirmation may have been).
    #[error(
        "we could not confirm the order in time; confirm again to find out whether it was placed"
    )]
    TimedOut,
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

/// A confirmed hold's order; `replayed` when it was confirmed before.
#[derive(Debug, Clone)]
pub struct Confirmed {
    pub order: Order,
    pub replayed: bool,
}

/// Turns hold `id` into an order, with the shopper's details when given; its transaction
/// starts only before `answer_by`, when the request's client is answered whatever happens.
#[tracing::instrument(skip_all, fields(hold = %id))]
pub async fn confirm(
    db: &PgPool,
    id: Uuid,
    contact: &crate::orders::Contact,
    answer_by: Instant,
) -> Result<Confirmed, HoldError> {
    let conn = db.acquire().await?;
    if Instant::now() >= answer_by {
        return Err(HoldError::TimedOut);
    }
    // The transaction owns the connection, so a replay below reads with another only
    // after this one went back to the pool.
    let mut tx = sqlx::Transaction::begin(conn, None).await?;
    let hold = db::lock_hold(&mut tx, id)
        .await?
        .ok_or(HoldError::NotFound)?;
    match hold.state {
        HoldState::Confirmed => {
            tx.rollback().await?;
            let order_id = hold.order_id.expect("confirmed holds have an order");
            let order = crate::orders::db::find_order(db, order_id)
                .await?
                .ok_or(HoldError::NotFound)?;
            return Ok(Confirmed {
                order,
                replayed: true,
            });
        }
        HoldState::Released => return Err(HoldError::Released),
        HoldState::Active | HoldState::Expired => {}
    }

    let order_id = crate::orders::new_id();
    let reference = order_id.to_string();
    let live = db::is_live(&mut tx, id).await?;
    if live {
        // Lines are sorted by SKU, like every other writer of stock rows.
        for line in &hold.lines {
            let sku = &line.sku;
            if !sell_reserved(&mut tx, sku, line.quantity, &reference, "shopper").await? {
                return Err(HoldError::Database(sqlx::Error::Protocol(format!(
                    "hold {id} has fewer than {} units of {sku} reserved",
                    line.quantity
                ))));
            }
        }
    } else {
        // Expired: return what it still reserves, then buy from free stock like a new order.
        if hold.state == HoldState::Active {
            unreserve_lines(&mut tx, &hold, "expire", "shopper").await?;
        }
        let mut shortages = Vec::new();
        for line in &hold.lines {
            let sku = &line.sku;
            if let Take::Short { available } =
                take_stock(&mut tx, sku, line.quantity, None, &reference, "shopper").await?
            {
                shortages.push(Shortage {
                    sku: line.sku.to_string(),
                    requested: line.quantity,
                    available: available.max(0),
                });
            }
        }
        if !shortages.is_empty() {
            // Nothing is kept; the sweeper releases the expired hold on its own schedule.
            tx.rollback().await?;
            return Err(HoldError::Insufficient(shortages));
        }
    }

    // Purchase limits, counted under the stock rows' locks taken above: for whoever
    // placed the hold and the email given now, leaving out this hold's own units (they
    // are the ones being bought).
    let email = contact.email.as_deref().or(hold.email.as_deref());
    let shopper = limits::with_email(&db::shopper_of(&mut tx, id).await?, email);
    let skus: Vec<_> = hold.lines.iter().map(|l| l.sku.clone()).collect();
    let products = crate::orders::db::products_for(&mut *tx, &skus).await?;
    let lines: Vec<(&str, i32)> = hold
        .lines
        .iter()
        .map(|l| (l.sku.as_str(), l.quantity))
        .collect();
    if let Some(refusal) =
        limits::over_limit(&mut tx, &lines, &shopper, &products, Some(id)).await?
    {
        tx.rollback().await?;
        return Err(HoldError::OverLimit(refusal));
    }

    let number = crate::orders::db::draw_number(&mut tx).await?;
    let order = Order {
        id: order_id,
        number,
        status: OrderStatus::Placed,
        lines: hold.lines.clone(),
        total_cents: hold.total_cents,
        email: email.map(str::to_string),
        customer_name: contact.name.clone().or(hold.customer_name.clone()),
        shipping_address: contact.shipping_address.clone().map(Box::new),
        created_at: DateTime::from_timestamp_micros(Utc::now().timestamp_micros())
            .expect("now is representable"),
        payment: None,
    };
    // The order counts against purchase limits for whoever placed the hold, and for the
    // email it was confirmed with.
    let reference = id.to_string();
    crate::orders::db::insert_order(&mut tx, &order, "hold", &reference, &shopper).await?;
    db::set_state(&mut tx, id, HoldState::Confirmed, Some(order_id)).await?;
    events::db::record(&mut tx, Event::order_placed(&order)).await?;
    events::db::record(&mut tx, Event::hold_confirmed(id, order_id)).await?;
    tx.commit().await?;
    Ok(Confirmed {
        order,
        replayed: false,
    })
}

/// What `release` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Released {
    Now,
    /// It was released or expired before; nothing changed.
    Already,
}

/// Cancels hold `id` and returns its stock at once; `redis`, when given, learns that the
/// SKUs are no longer sold out.
#[tracing::instrument(skip_all, fields(hold = %id))]
pub async fn release(
    db: &PgPool,
    redis: Option<&Redis>,
    id: Uuid,
    actor: &str,
) -> Result<Released, HoldError> {
    let mut tx = db.begin().await?;
    let hold = db::lock_hold(&mut tx, id)
        .await?
        .ok_or(HoldError::NotFound)?;
    match hold.state {
        HoldState::Confirmed => {
            return Err(HoldError::AlreadyConfirmed(hold.order_id.unwrap_or(id)));
        }
        HoldState::Released | HoldState::Expired => return Ok(Released::Already),
        HoldState::Active => {}
    }
    unreserve_lines(&mut tx, &hold, "release", actor).await?;
    db::set_state(&mut tx, id, HoldState::Released, None).await?;
    events::db::record(&mut tx, Event::hold_released(id, actor)).await?;
    tx.commit().await?;
    if let Some(redis) = redis {
        for line in &hold.lines {
            redis.clear_sold_out(&line.sku).await;
        }
    }
    Ok(Released::Now)
}

/// Returns what `hold` reserves to sale, line by line in SKU order, with a ledger row each
/// (`reason` is `release` or `expire`).
async fn unreserve_lines(
    conn: &mut sqlx::PgConnection,
    hold: &Hold,
    reason: &str,
    actor: &str,
) -> sqlx::Result<()> {
    let reference = hold.id.to_string();
    for line in &hold.lines {
        unreserve(conn, &line.sku, line.quantity, reason, &reference, actor).await?;
    }
    Ok(())
}

/// Releases up to `batch` expired holds in one transaction; returns how many.
pub async fn sweep_batch(db: &PgPool, redis: &Redis, batch: i64) -> sqlx::Result<usize> {
    let mut tx = db.begin().await?;
    let ids = db::claim_expired(&mut tx, batch).await?;
    if ids.is_empty() {
        tx.rollback().await?;
        return Ok(0);
    }
    let lines = db::lines_of_many(&mut tx, &ids).await?;
    let skus = unreserve_many(&mut tx, &lines, "expire", "sweeper").await?;
    db::expire_many(&mut tx, &ids).await?;
    let expired = ids
        .iter()
        .map(|id| Event::hold_expired(*id).payload)
        .collect();
    events::db::record_many(&mut tx, events::EventType::HoldExpired, expired).await?;
    tx.commit().await?;
    for sku in &skus {
        redis.clear_sold_out(sku).await;
    }
    Ok(ids.len())
}

/// Releases every expired hold, batch after batch; returns how many.
pub async fn sweep(db: &PgPool, redis: &Redis, batch: i64) -> sqlx::Result<usize> {
    let mut total = 0;
    loop {
        let n = sweep_batch(db, redis, batch).await?;
        total += n;
        if (n as i64) < batch {
            return Ok(total);
        }
    }
}

/// Holds released per sweeper transaction.
pub const SWEEP_BATCH: i64 = 500;

/// Runs the sweeper every `interval` for the life of the process, the first time one
/// `interval` after the start (when it runs is then what `interval` says, however long
/// the process takes to get its first connection).
pub fn spawn_sweeper(db: PgPool, redis: Redis, interval: Duration) {
    tokio::spawn(async move {
        let mut every = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            match crate::pg::bounded(crate::pg::ROUND_LIMIT, sweep(&db, &redis, SWEEP_BATCH)).await
            {
                Ok(0) => {}
                Ok(n) => tracing::info!(released = n, "released expired holds"),
                Err(e) => tracing::warn!(error = %e, "hold sweep failed"),
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hold_state_is_stored_and_shown_by_a_name_its_column_allows() {
        let names: Vec<String> = HoldState::ALL.iter().map(|s| s.as_str().into()).collect();
        let allowed = crate::orders::tests::allowed("20261130000003_holds.sql", "state");
        assert_eq!(names, allowed);
        for s in HoldState::ALL {
            assert_eq!(serde_json::to_value(s).unwrap(), s.as_str());
            assert_eq!(s.to_string(), s.as_str());
        }
    }
}
