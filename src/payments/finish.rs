//! Finishing payments nobody finished: the provider's webhook and the reconciler that
//! runs in every process. Both read the intent from the provider and act on where the
//! payment, its hold and its order stand:
//!
//! | intent             | order              | hold                 | done                 |
//! |--------------------|--------------------|----------------------|----------------------|
//! | authorized         | placed             |                      | captured             |
//! | authorized         | cancelled          |                      | cancelled (released) |
//! | authorized         | none               | over                 | cancelled (released) |
//! | captured           | placed             |                      | recorded; settled    |
//! | captured           | cancelled, or none | over                 | refunded             |
//! | cancelled          | placed             |                      | order cancelled      |
//! | not paid           | none               | over                 | cancelled            |
//! | anything else      |                    | live                 | looked at again later |
//!
//! A hold is over when it was released or expired (or purged). While it is live, the
//! shopper may still pay and confirm; the reconciler looks again after it ends.

use std::time::Duration;

use chrono::Utc;
use uuid::Uuid;

use super::flow::PayError;
use super::stripe::CallError;
use super::{Payment, Payments, Status, db};
use crate::holds::{Hold, HoldState};
use crate::orders::OrderStatus;

/// Payments one reconciler pass claims at most.
const BATCH: i64 = 20;

impl Payments {
    /// Moves hold `hold`'s payment on, as far as where it stands allows (see the module
    /// documentation). `Busy` when another finisher holds it.
    #[tracing::instrument(skip_all, fields(hold = %hold))]
    pub async fn finish(&self, hold: Uuid) -> Result<(), PayError> {
        // A settled payment was finished from the provider's own state already (an
        // admin's cancel unsettles it first).
        let Some(payment) = db::find(&self.db, hold).await?.filter(|p| !p.settled) else {
            return Ok(());
        };
        if payment.status == Status::Creating {
            // Its maker stopped before the provider answered (or is still waiting).
            let found = crate::holds::db::find_hold(&self.db, hold).await?;
            if found.as_ref().is_none_or(is_over) {
                db::drop_creation(&self.db, hold).await?;
            }
            return Ok(());
        }
        // While the hold is live without an order it is the shopper's turn: there is
        // nothing to finish (unless a finisher stopped mid-way: "processing"), and taking
        // the lease would only make the shopper's next step wait for it.
        if payment.status != Status::Processing && payment.order_id.is_none() {
            let found = crate::holds::db::find_hold(&self.db, hold).await?;
            if found.is_some_and(|h| !is_over(&h) && h.order_id.is_none()) {
                return Ok(());
            }
        }
        let intent = payment.intent().to_string();
        self.leased(&intent, self.finish_leased(hold)).await?
    }

    async fn finish_leased(&self, hold: Uuid) -> Result<(), PayError> {
        let payment = self.reread(hold).await?;
        let found = crate::holds::db::find_hold(&self.db, hold).await?;
        let payment = match self.refresh(payment).await {
            // The provider does not know the intent (a test provider that started empty):
            // nothing can be charged on it. Without an order it is settled as cancelled;
            // with one it is left, and said.
            Err(PayError::Provider(CallError::Refused { status: 404, .. }))
                if found.as_ref().is_none_or(|h| h.order_id.is_none()) =>
            {
                tracing::warn!(%hold, "the provider does not know this payment's intent; settled as cancelled");
                db::record(&self.db, hold, Status::Canceled, self.reconcile_after).await?;
                return Ok(());
            }
            other => other?,
        };
        let order_id = payment.order_id.or(found.as_ref().and_then(|h| h.order_id));
        let order = match order_id {
            Some(id) => crate::orders::db::find_order(&self.db, id).await?,
            None => None,
        };
        let placed = order.as_ref().map(|o| o.status == OrderStatus::Placed);
        let over = found.as_ref().is_none_or(is_over);
        match (payment.status, placed) {
            (Status::RequiresCapture, Some(true)) => {
                let order = order_id.expect("an order was found");
                self.after_order(&payment, order).await?;
            }
            (Status::RequiresCapture, Some(false)) => self.release(&payment).await?,
            (Status::RequiresCapture, None) if over => self.release(&payment).await?,
            (Status::Succeeded, Some(true)) => {
                let order = order_id.expect("an order was found");
                self.after_order(&payment, order).await?;
                db::settle(&self.db, hold).await?;
            }
            (Status::Succeeded, Some(false)) => self.refund(&payment, order_id).await?,
            (Status::Succeeded, None) if over => self.refund(&payment, None).await?,
            (Status::Canceled, Some(true)) => {
                let order = order_id.expect("an order was found");
                tracing::warn!(%order, "an order stood on a cancelled payment; cancelling it");
                crate::orders::cancel(&self.db, order, "payments", "the payment was cancelled")
                    .await?;
                db::settle(&self.db, hold).await?;
            }
            (Status::Canceled, _) => db::settle(&self.db, hold).await?,
            (_, None) if over => self.release(&payment).await?,
            _ => {
                // The shopper's turn: look again once the hold has ended.
                let ends = found.map_or(Duration::ZERO, |h| {
                    (h.expires_at - Utc::now()).to_std().unwrap_or_default()
                });
                db::record(&self.db, hold, payment.status, ends + self.reconcile_after).await?;
            }
        }
        Ok(())
    }

    /// Refunds a captured payment that has no order standing, keyed by the order (or, for
    /// a capture without one, the hold).
    async fn refund(&self, payment: &Payment, order: Option<Uuid>) -> Result<(), PayError> {
        if payment.refund_id.is_some() {
            return Ok(());
        }
        let key = order.unwrap_or(payment.hold_id);
        match self.stripe.refund(payment.intent(), key).await {
            Ok(refund) => {
                db::captured(&self.db, payment.hold_id).await?;
                db::refunded(&self.db, payment.hold_id, &refund.id, refund.amount).await?;
            }
            Err(e) => {
                tracing::warn!(intent = payment.intent(), error = %e, "refund failed; the reconciler tries again");
                // A refund the provider refused may have been made by an earlier try.
                if let Ok(refunds) = self.stripe.refunds_of(payment.intent()).await
                    && let Some(refund) = refunds.first()
                {
                    db::captured(&self.db, payment.hold_id).await?;
                    db::refunded(&self.db, payment.hold_id, &refund.id, refund.amount).await?;
                }
            }
        }
        Ok(())
    }

    /// An admin cancelled order `order` (which put its payment up for a look in the same
    /// transaction): its payment is refunded, or its authorization released, now if it
    /// can be, else by the reconciler. What is known of it afterwards, for the admin.
    pub async fn order_cancelled(&self, order: Uuid) -> sqlx::Result<Option<&'static str>> {
        let Some(payment) = db::for_order(&self.db, order).await? else {
            return Ok(None);
        };
        // The reconciler may be finishing it already (the cancel put it up for a look):
        // then this waits a little for it, to say what happened.
        let mut pause = Duration::from_millis(50);
        for _ in 0..8 {
            match self.finish(payment.hold_id).await {
                Err(PayError::Busy) => {
                    tokio::time::sleep(pause).await;
                    pause *= 2;
                }
                Ok(()) => break,
                Err(e) => {
                    tracing::warn!(%order, error = %e, "the refund waits for the reconciler");
                    break;
                }
            }
        }
        let payment = self.reread(payment.hold_id).await.ok();
        Ok(Some(match payment {
            Some(p) if p.refund_id.is_some() => "Its payment was refunded.",
            Some(p) if p.status == Status::Canceled => {
                "Its card authorization was released; nothing was charged."
            }
            _ => {
                "Its payment is refunded as soon as the payment provider answers (it has \
                 not confirmed the refund yet)."
            }
        }))
    }

    /// One reconciler pass: finishes the payments due a look; returns how many it claimed.
    pub async fn reconcile_once(&self) -> sqlx::Result<usize> {
        let due = db::claim_due(&self.db, BATCH, self.reconcile_after).await?;
        for hold in &due {
            match self.finish(*hold).await {
                Ok(()) | Err(PayError::Busy) => {}
                Err(e) => tracing::warn!(%hold, error = %e, "a payment stays for the next pass"),
            }
        }
        Ok(due.len())
    }
}

/// Runs the reconciler until the process ends: a pass every `interval`, another at once
/// while a pass finds a full batch.
pub fn spawn_reconciler(payments: std::sync::Arc<Payments>, interval: Duration) {
    tokio::spawn(async move {
        loop {
            match payments.reconcile_once().await {
                Ok(n) if n as i64 >= BATCH => continue,
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "payment reconciler pass failed"),
            }
            tokio::time::sleep(interval).await;
        }
    });
}

/// Whether the shopper can no longer confirm `hold` (released, expired, or past its time).
fn is_over(hold: &Hold) -> bool {
    match hold.state {
        HoldState::Active => hold.expires_at <= Utc::now(),
        HoldState::Confirmed => false,
        HoldState::Released | HoldState::Expired => true,
    }
}
