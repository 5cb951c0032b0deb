//! The shopper's side of a payment: starting it (the hold's one intent), paying (a card
//! set on the intent and confirmed, on the server) and confirming the hold into an order
//! once the payment is authorized, then capturing it.

use uuid::Uuid;

use super::stripe::CallError;
use super::{CREATION_STALE, Payment, Payments, Status, db};
use crate::holds::{self, Confirmation, Confirmed, Hold, HoldError, HoldState};

/// `method` if it is a payment method as Stripe.js gives one (a PaymentMethod, `pm_…`,
/// or a tokenized card's id, `card_…`); else why not, as a sentence.
pub fn check_method(method: &str) -> Result<&str, String> {
    let rest = method
        .strip_prefix("pm_")
        .or_else(|| method.strip_prefix("card_"));
    match rest {
        Some(rest)
            if (1..=250).contains(&rest.len())
                && rest.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') =>
        {
            Ok(method)
        }
        _ => Err(
            "payment_method must be a Stripe PaymentMethod id (pm_…) or a card \
                  token's card id (card_…), as Stripe.js gives it."
                .into(),
        ),
    }
}

/// Why a payment step did not happen (the API and the pages word each one).
#[derive(Debug, thiserror::Error)]
pub enum PayError {
    #[error("no such reservation")]
    NotFound,
    /// The hold is over (expired or cancelled); nothing was charged.
    #[error("the reservation is over")]
    HoldOver(HoldState),
    /// The hold costs nothing: it is confirmed without paying.
    #[error("the reservation costs nothing")]
    Free,
    /// Another finisher holds the payment's lease.
    #[error("this payment is being processed")]
    Busy,
    /// Redis did not answer: no payment is finished without its lease.
    #[error("payments cannot be coordinated right now")]
    NoLease,
    /// The card was declined; the hold is kept.
    #[error("the card was declined")]
    Declined { code: String, message: String },
    /// The provider would not take this payment method.
    #[error("{0}")]
    BadMethod(String),
    /// Confirming a hold whose payment is not authorized: where it stands.
    #[error("the reservation is not paid")]
    NotPaid(Option<Payment>),
    /// The payment was cancelled (nothing charged); the hold cannot be paid again.
    #[error("the payment was cancelled")]
    Cancelled,
    /// The provider did not answer, or not as expected; nothing more is known.
    #[error("{0}")]
    Provider(CallError),
    /// Confirming the hold itself failed (and the payment was released where that
    /// means the shopper must not be charged).
    #[error(transparent)]
    Hold(HoldError),
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

impl From<HoldError> for PayError {
    fn from(e: HoldError) -> Self {
        match e {
            HoldError::NotFound => Self::NotFound,
            e => Self::Hold(e),
        }
    }
}

impl Payments {
    /// Hold `hold`'s payment, its intent made at the provider if it was not yet.
    #[tracing::instrument(skip_all, fields(hold = %hold.id))]
    pub async fn start(&self, hold: &Hold) -> Result<Payment, PayError> {
        if let Some(payment) = db::find(&self.db, hold.id).await?
            && payment.status != Status::Creating
        {
            return Ok(payment);
        }
        if hold.total_cents == 0 {
            return Err(PayError::Free);
        }
        if !hold.is_active() {
            return Err(PayError::HoldOver(over(hold)));
        }
        if !db::claim_creation(
            &self.db,
            hold.id,
            hold.total_cents,
            &self.currency,
            CREATION_STALE,
        )
        .await?
        {
            return Err(PayError::Busy);
        }
        match self
            .stripe
            .create_intent(hold.id, 0, hold.total_cents, &self.currency)
            .await
        {
            Ok(intent) => db::created(
                &self.db,
                hold.id,
                &intent.id,
                intent.client_secret.as_deref(),
                intent.status,
                self.reconcile_after,
            )
            .await?
            .ok_or(PayError::NotFound),
            Err(e) => {
                // Made or not, nobody will confirm it: the next try makes one again.
                db::drop_creation(&self.db, hold.id).await?;
                Err(PayError::Provider(e))
            }
        }
    }

    /// Pays for hold `hold` with `method` (`pm_…`, `card_…`): sets it on the intent and
    /// confirms it. Starting to pay extends the hold once. Paying a paid hold answers its
    /// payment as it is.
    #[tracing::instrument(skip_all, fields(hold = %hold.id))]
    pub async fn pay(&self, hold: &Hold, method: &str) -> Result<Payment, PayError> {
        let payment = self.start(hold).await?;
        let intent = payment.intent().to_string();
        self.leased(&intent, self.pay_leased(hold.id, &intent, method))
            .await?
    }

    async fn pay_leased(
        &self,
        hold: Uuid,
        intent: &str,
        method: &str,
    ) -> Result<Payment, PayError> {
        let mut payment = self.reread(hold).await?;
        if payment.status.is_unsure() {
            payment = self.refresh(payment).await?;
        }
        match payment.status {
            status if status.is_paid() => return Ok(payment),
            Status::Canceled => return Err(PayError::Cancelled),
            _ => {}
        }
        if payment.status == Status::RequiresPaymentMethod && payment.decline_code.is_some() {
            return self.replace_declined(&payment, method).await;
        }
        self.charge(hold, intent, method, payment.attempt).await
    }

    /// Pays with `method` on a new intent, for a hold whose last card was declined. A
    /// declined intent is not confirmed again (localstripe cannot; on Stripe a new one
    /// is as good): it is cancelled (nothing was charged on it) and the new one takes its
    /// place, under a lease of its own taken before anyone can read it.
    async fn replace_declined(&self, payment: &Payment, method: &str) -> Result<Payment, PayError> {
        let hold = payment.hold_id;
        let fresh = self
            .stripe
            .create_intent(
                hold,
                payment.attempt,
                payment.amount_cents,
                &payment.currency,
            )
            .await
            .map_err(PayError::Provider)?;
        self.leased(&fresh.id, async {
            if !db::replace_intent(
                &self.db,
                hold,
                payment.intent(),
                &fresh.id,
                fresh.client_secret.as_deref(),
            )
            .await?
            {
                // Moved on meanwhile (a finisher whose lease lapsed): nobody confirms the
                // new intent, so it never charges.
                return self.reread(hold).await;
            }
            if let Err(e) = self.stripe.cancel(payment.intent()).await {
                tracing::info!(intent = payment.intent(), error = %e, "a declined intent stays uncancelled; it cannot charge");
            }
            self.charge(hold, &fresh.id, method, payment.attempt).await
        })
        .await?
    }

    /// Sets `method` on `intent` and confirms it: the `attempt`-th card for hold `hold`.
    async fn charge(
        &self,
        hold: Uuid,
        intent: &str,
        method: &str,
        attempt: i32,
    ) -> Result<Payment, PayError> {
        let method_key = format!("{intent}-method-{attempt}");
        if let Err(e) = self.stripe.set_method(intent, method, &method_key).await {
            return Err(match e {
                CallError::Refused { message, .. } => PayError::BadMethod(message),
                CallError::Declined { code, message } => PayError::Declined { code, message },
                unanswered => PayError::Provider(unanswered),
            });
        }
        if !db::begin_charge(&self.db, hold, self.extension, self.reconcile_after).await? {
            let state = holds::db::find_hold(&self.db, hold)
                .await?
                .map_or(HoldState::Expired, |h| over(&h));
            return Err(PayError::HoldOver(state));
        }
        let confirm_key = format!("{intent}-confirm-{attempt}");
        let payment = match self.stripe.confirm(intent, &confirm_key).await {
            Ok(confirmed) => {
                db::shoppers_turn(&self.db, hold, confirmed.status, self.reconcile_after).await?
            }
            Err(CallError::Declined { code, message }) => {
                db::declined(&self.db, hold, &code, &message, self.reconcile_after).await?;
                return Err(PayError::Declined { code, message });
            }
            // Confirmed already (by an earlier try whose answer was lost): read it.
            Err(e) if e.is_refused() => None,
            // The provider does not know the method after all.
            Err(CallError::Refused { message, .. }) => return Err(PayError::BadMethod(message)),
            // It may have been confirmed: the row says "processing", so the next step asks
            // the provider first.
            Err(e) => return Err(PayError::Provider(e)),
        };
        let payment = match payment {
            Some(payment) => payment,
            None => self.reread(hold).await?,
        };
        if payment.status.is_unsure() || payment.status == Status::RequiresPaymentMethod {
            return self.refresh(payment).await;
        }
        Ok(payment)
    }

    /// Confirms hold `hold` into an order, for a shopper whose payment is authorized,
    /// then captures the payment. As [`holds::Confirmer::confirm`] otherwise: confirming
    /// again answers the same order. When the order cannot be placed (the hold expired
    /// and its stock is gone, or it was cancelled), the authorization is released.
    #[tracing::instrument(skip_all, fields(hold = %asked.hold))]
    pub async fn confirm(&self, asked: Confirmation<'_>) -> Result<Confirmed, PayError> {
        let hold = asked.hold;
        let found = holds::db::find_hold(&self.db, hold)
            .await?
            .ok_or(PayError::NotFound)?;
        let payment = db::find(&self.db, hold).await?;
        let Some(payment) = payment.filter(|p| p.status != Status::Creating) else {
            // Nothing to pay (a free hold), or an order placed before payments were on:
            // the confirmation as it always was.
            if found.total_cents == 0 || found.order_id.is_some() {
                return self.confirm_hold(asked).await;
            }
            return Err(PayError::NotPaid(None));
        };
        let intent = payment.intent().to_string();
        self.leased(&intent, async {
            // Stopped between the order and its capture, this is finished by the
            // reconciler within its window.
            let mut payment = db::due_within(&self.db, hold, self.reconcile_after)
                .await?
                .ok_or(PayError::NotFound)?;
            if payment.status.is_unsure() {
                payment = self.refresh(payment).await?;
            }
            if payment.status == Status::Canceled {
                return Err(PayError::Cancelled);
            }
            if !payment.status.is_paid() {
                return Err(PayError::NotPaid(Some(payment)));
            }
            match self.confirm_hold(asked).await {
                Ok(mut confirmed) => {
                    let paid = self.after_order(&payment, confirmed.order.id).await?;
                    confirmed.order.payment = Some(Box::new(paid.summary()));
                    Ok(confirmed)
                }
                Err(PayError::Hold(e @ (HoldError::Insufficient(_) | HoldError::Released))) => {
                    // No order: the shopper must not be charged.
                    self.release(&payment).await?;
                    Err(PayError::Hold(e))
                }
                Err(e) => Err(e),
            }
        })
        .await?
    }

    async fn confirm_hold(&self, asked: Confirmation<'_>) -> Result<Confirmed, PayError> {
        Ok(self.confirmer.confirm(asked).await?)
    }

    /// The order `order` was placed for `payment`: capture it, then link them and record
    /// the capture in one write; answers the payment as it became. An order whose payment
    /// was cancelled meanwhile (a finisher whose lease lapsed: the capture is refused) must
    /// not stand unpaid: it is cancelled, and its stock goes back.
    pub(super) async fn after_order(
        &self,
        payment: &Payment,
        order: Uuid,
    ) -> Result<Payment, PayError> {
        let captured = match payment.status {
            Status::Succeeded => true,
            Status::RequiresCapture => self.capture(payment).await?,
            _ => false,
        };
        match db::paid_for(&self.db, payment.hold_id, order, captured).await? {
            Some(paid) => Ok(paid),
            None => {
                tracing::warn!(%order, "the order's payment was cancelled meanwhile; cancelling the order");
                crate::orders::cancel(&self.db, order, "payments", "the payment was cancelled")
                    .await?;
                Err(PayError::Cancelled)
            }
        }
    }

    /// Captures an authorized payment whose order exists: `true` once the provider says it
    /// is captured. A capture the provider refused or did not answer is asked about, and
    /// what it says recorded (else it is left to the reconciler).
    async fn capture(&self, payment: &Payment) -> Result<bool, PayError> {
        let status = match self.stripe.capture(payment.intent()).await {
            Ok(intent) => intent.status,
            Err(e) => {
                tracing::warn!(intent = payment.intent(), error = %e, "capture failed; asking the provider");
                match self.stripe.retrieve(payment.intent()).await {
                    Ok(intent) => intent.status,
                    Err(_) => return Ok(false),
                }
            }
        };
        if status == Status::Succeeded {
            return Ok(true);
        }
        if status != payment.status {
            db::record(&self.db, payment.hold_id, status, self.reconcile_after).await?;
        }
        Ok(false)
    }

    /// Cancels an intent that will not be captured (the authorization is released).
    pub(super) async fn release(&self, payment: &Payment) -> Result<(), PayError> {
        let status = match self.stripe.cancel(payment.intent()).await {
            Ok(intent) => intent.status,
            Err(e) => {
                tracing::warn!(intent = payment.intent(), error = %e, "cancel failed; asking the provider");
                match self.stripe.retrieve(payment.intent()).await {
                    Ok(intent) => intent.status,
                    // Unknown: the reconciler asks again.
                    Err(_) => Status::Processing,
                }
            }
        };
        db::record(&self.db, payment.hold_id, status, self.reconcile_after).await?;
        Ok(())
    }

    /// What a shopper whose order could not be placed is told about their card: only
    /// what is known (the cancel may not have been answered yet).
    pub async fn not_charged(&self, hold: Uuid) -> Result<&'static str, sqlx::Error> {
        Ok(match db::find(&self.db, hold).await?.map(|p| p.status) {
            Some(Status::Canceled) => " Your card was not charged: the payment was cancelled.",
            Some(Status::Succeeded) => {
                " Your card was charged before this was found, so the charge is being refunded."
            }
            Some(s) if s.is_paid() || s.is_unsure() => {
                " Your card was not charged; the hold on its amount is being released."
            }
            _ => " Your card was not charged.",
        })
    }

    /// The payment row again (under the lease, so as the last finisher left it).
    pub(super) async fn reread(&self, hold: Uuid) -> Result<Payment, PayError> {
        db::find(&self.db, hold).await?.ok_or(PayError::NotFound)
    }

    /// The payment with its status as the provider has it now.
    pub(super) async fn refresh(&self, payment: Payment) -> Result<Payment, PayError> {
        let intent = self
            .stripe
            .retrieve(payment.intent())
            .await
            .map_err(PayError::Provider)?;
        if intent.status != payment.status {
            db::record(
                &self.db,
                payment.hold_id,
                intent.status,
                self.reconcile_after,
            )
            .await?;
        }
        self.reread(payment.hold_id).await
    }
}

/// How a hold that is not live ended (a live one past its time is expired).
fn over(hold: &Hold) -> HoldState {
    match hold.state {
        HoldState::Active => HoldState::Expired,
        state => state,
    }
}
