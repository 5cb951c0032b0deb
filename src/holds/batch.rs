//! Confirmations, group-committed (under the `batched` strategy): in a drop, every
//! shopper's "Place order" moves units of the same hot SKU from `reserved` to sold, and
//! one stock row takes one commit at a time. So concurrent confirmations of one process
//! queue behind one leader, which confirms a lot of them in one transaction:
//!
//! 1. the lot's holds are locked (`for update`, in id order, so two leaders cannot
//!    deadlock; a confirmation, a release or the sweeper elsewhere waits, or skips them);
//! 2. a hold that is not live (expired, released, confirmed already), or that holds a
//!    product with a purchase limit, drops out of the lot and is confirmed on its own by
//!    [`super::confirm`] — which replays, refuses or counts the limit as always; the
//!    others are live and reserve their units, so confirming them needs no stock check;
//! 3. one statement sells them all: `on_hand −= q, reserved −= q` per SKU (each SKU's
//!    row once), every order, line, ledger row, `order.placed` and `hold.confirmed`
//!    event, and every hold marked confirmed with its order; then one commit.
//!
//! The guarantees of a confirmation on its own hold: each hold changes state once, under
//! its row lock; its order and everything about it commit together; a lot that fails
//! writes nothing and its confirmations run on their own. Nothing starts for a request
//! whose client was answered already (its budget ran out).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use chrono::{DateTime, Utc};
use sqlx::PgPool;
use tokio::sync::oneshot;
use uuid::Uuid;

use super::{Confirmation, Confirmed, HoldError};
use crate::lane::{Lane, Queue};
use crate::orders::{Order, OrderStatus, limits};

/// One confirmation waiting for its lot.
struct Pending {
    hold: Uuid,
    /// The API caller's key prefix the hold must have been placed under (`None`: the
    /// storefront, where the hold's unguessable id is the permission).
    owner: Option<String>,
    contact: crate::orders::Contact,
    answer_by: Instant,
    answer: oneshot::Sender<Lot>,
}

/// What the leader tells a waiting confirmation.
enum Lot {
    Confirmed(Box<Order>),
    /// Not for a lot (see the module documentation): confirm it on its own.
    Alone,
    /// The request's client was answered before the lot began.
    TooLate,
}

/// The confirmations of this process: a queue and, while it is not empty, its leader.
pub struct Confirmer {
    queue: Lane<Pending>,
    /// For confirmations on their own (in their requests).
    db: PgPool,
    /// For lots (in the leader: see `startup::Leaders`).
    leaders: PgPool,
    /// Most confirmations per transaction.
    max: usize,
    /// Where the leader runs (see [`crate::checkout::Batcher`]).
    runtime: tokio::runtime::Handle,
    /// Lots are for the `batched` strategy; under the others each confirmation runs on
    /// its own.
    in_lots: bool,
}

impl Confirmer {
    /// A confirmer whose lots (under `batched`) run on `leaders`' connections, on the
    /// runtime it is made on.
    pub fn new(db: PgPool, leaders: PgPool, settings: &crate::config::Settings) -> Self {
        Self {
            queue: Lane::default(),
            db,
            leaders,
            max: settings.batch_max,
            runtime: tokio::runtime::Handle::current(),
            in_lots: settings.order_strategy == crate::config::OrderStrategy::Batched,
        }
    }

    /// Turns the hold into an order as [`super::confirm`] does, under `batched` sharing a
    /// transaction with the confirmations queued meanwhile; with an owner, only a hold
    /// placed under that API caller's keys (else [`HoldError::NotFound`], whether or not
    /// it exists), checked in the lot's own read.
    pub async fn confirm(
        self: &Arc<Self>,
        asked: Confirmation<'_>,
    ) -> Result<Confirmed, HoldError> {
        if !self.in_lots {
            return self.alone(asked).await;
        }
        let (answer, rx) = oneshot::channel();
        self.enqueue(Pending {
            hold: asked.hold,
            owner: asked.owner.map(str::to_string),
            contact: asked.contact.clone(),
            answer_by: asked.answer_by,
            answer,
        });
        match rx.await {
            Ok(Lot::Confirmed(order)) => Ok(Confirmed {
                order: *order,
                replayed: false,
            }),
            Ok(Lot::TooLate) => Err(HoldError::TimedOut),
            // Not for a lot, or a leader that failed: the confirmation runs on its own.
            Ok(Lot::Alone) | Err(_) => self.alone(asked).await,
        }
    }

    /// A confirmation on its own, in its request.
    async fn alone(&self, asked: Confirmation<'_>) -> Result<Confirmed, HoldError> {
        if let Some(owner) = asked.owner
            && !super::db::owned_by(&self.db, asked.hold, owner).await?
        {
            return Err(HoldError::NotFound);
        }
        super::confirm(&self.db, asked.hold, asked.contact, asked.answer_by).await
    }

    fn enqueue(self: &Arc<Self>, pending: Pending) {
        self.queue.send(pending, |lots| {
            self.runtime.spawn(Arc::clone(self).lead(lots));
        });
    }

    /// Confirms lot after lot while confirmations keep coming, then leaves.
    async fn lead(self: Arc<Self>, mut queued: Queue<Pending>) {
        loop {
            let mut lot = Vec::new();
            queued.take_ready(&mut lot, self.max);
            if lot.is_empty() {
                if self.queue.leave_if_dry(&queued) {
                    return;
                }
                continue;
            }
            // The connection first: what waited for it past its answer stays out of the lot.
            let conn = match self.leaders.acquire().await {
                Ok(conn) => conn,
                Err(e) => {
                    tracing::warn!(error = %e, "no connection for a lot of confirmations; each runs alone");
                    for p in lot {
                        let _ = p.answer.send(Lot::Alone);
                    }
                    continue;
                }
            };
            let now = Instant::now();
            let (late, lot): (Vec<Pending>, Vec<Pending>) = lot
                .into_iter()
                .partition(|p| now >= p.answer_by || p.answer.is_closed());
            for p in late {
                let _ = p.answer.send(Lot::TooLate);
            }
            if lot.is_empty() {
                continue;
            }
            match apply(conn, &lot).await {
                Ok(mut answers) => {
                    for p in lot {
                        let answer = answers
                            .remove(&p.hold)
                            .map_or(Lot::Alone, |o| Lot::Confirmed(Box::new(o)));
                        let _ = p.answer.send(answer);
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "a lot of confirmations failed; each runs alone");
                    for p in lot {
                        let _ = p.answer.send(Lot::Alone);
                    }
                }
            }
        }
    }
}

/// Confirms the lot's live holds of unlimited products in one transaction on `conn`;
/// their orders by hold. The rest are left to confirm on their own.
async fn apply(
    conn: sqlx::pool::PoolConnection<sqlx::Postgres>,
    lot: &[Pending],
) -> sqlx::Result<BTreeMap<Uuid, Order>> {
    let mut tx = sqlx::Transaction::begin(conn, None).await?;
    let mut ids: Vec<Uuid> = lot.iter().map(|p| p.hold).collect();
    ids.sort_unstable();
    ids.dedup();
    let holds = super::db::lock_live(&mut tx, &ids).await?;
    let now = DateTime::from_timestamp_micros(Utc::now().timestamp_micros())
        .expect("now is representable");
    let mut w = super::db::Confirmations::default();
    let mut made = BTreeMap::new();
    for p in lot {
        // The first confirmation of a hold sent twice in one lot is the one.
        if made.contains_key(&p.hold) {
            continue;
        }
        let Some(hold) = holds.iter().find(|h| h.id == p.hold) else {
            continue;
        };
        // Another caller's hold is left to the confirmation on its own, which says 404.
        if let Some(owner) = &p.owner
            && !super::db::owns(owner, &hold.scope, &hold.key)
        {
            continue;
        }
        let email = p.contact.email.as_deref().or(hold.email.as_deref());
        let order = Order {
            id: crate::orders::new_id(),
            number: hold.number,
            status: OrderStatus::Placed,
            total_cents: hold
                .lines
                .iter()
                .map(|l| l.unit_price_cents * i64::from(l.quantity))
                .sum(),
            lines: hold.lines.clone(),
            email: email.map(str::to_string),
            customer_name: p.contact.name.clone().or(hold.customer_name.clone()),
            shipping_address: p.contact.shipping_address.clone().map(Box::new),
            created_at: now,
            payment: None,
        };
        let shopper = limits::with_email(&hold.shopper, email);
        w.add(hold.id, &order, &shopper);
        made.insert(hold.id, order);
    }
    if made.is_empty() {
        tx.rollback().await?;
        return Ok(made);
    }
    if !super::db::confirm_many(&mut tx, &w).await? {
        // A row no longer reserves the units (which locked, live holds rule out):
        // nothing was written, and each confirmation runs on its own.
        tx.rollback().await?;
        return Ok(BTreeMap::new());
    }
    tx.commit().await?;
    Ok(made)
}
