//! Payments: each checkout hold's one Stripe PaymentIntent, authorized when the shopper
//! pays and captured only after the order has committed. A charge cannot happen twice
//! and cannot stand without an order:
//!
//! - **one intent per hold.** The `payments` row (keyed by the hold) is claimed before
//!   the provider is asked to make the intent, so two requests never make two intents to
//!   confirm; the amount is the hold's total, from the server's prices;
//! - **one finisher at a time.** Every path that moves a payment on (paying, the
//!   shopper's confirmation, the provider's webhook, the reconciler) holds the Redis
//!   lease `payment:{intent}` (`SET NX PX`, renewed while it works, released only by its
//!   owner). A second one meets it and is answered 409 "being processed". Without Redis
//!   nothing is finished (503): the lease is what keeps a cancellation and an order apart;
//! - **the database and the provider as the guards that need no lease:** one payment per
//!   hold and one order per payment (unique keys), each step recorded once by a
//!   conditional update, and an intent captures once (a second capture is refused);
//! - **state from the provider, not from messages:** a finisher reads the intent before
//!   it acts, so events arriving twice, late or out of order change nothing;
//! - **capture after the order:** the order commits, the payment is linked to it, then
//!   captured. A finisher that stops anywhere leaves a row the reconciler
//!   ([`finish`]) picks up: an authorization with an order is captured, one whose hold is
//!   over without an order is cancelled (the shopper is not charged), a capture without
//!   an order, or for a cancelled order, is refunded.
//!
//! The provider's idempotency keys are sent (Stripe honours them) but not relied on: a
//! provider that ignores them (localstripe does) may make a second intent for a retried
//! creation, which nobody confirms, so it never charges.

pub mod audit;
mod db;
pub mod finish;
pub mod flow;
pub mod stripe;
pub mod webhook;

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use uuid::Uuid;

use crate::config::Settings;
use crate::holds::Confirmer;
use crate::locking::Redis;
use crate::orders::{PaymentSummary, text_column};

pub use db::{all as all_payments, for_order};
pub use stripe::{CallError, Stripe};

/// Where an intent stands: the provider's own status names, and `creating` while the
/// provider is being asked for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Creating,
    RequiresPaymentMethod,
    RequiresConfirmation,
    /// 3-D Secure: the shopper's bank asks them to confirm (Stripe.js, with the client
    /// secret).
    RequiresAction,
    /// The provider is still working on it (also: a call to it went unanswered, and it
    /// is asked before anything else is done).
    Processing,
    /// Authorized: the amount is held on the card, to capture.
    RequiresCapture,
    /// Captured: the shopper was charged.
    Succeeded,
    /// Cancelled: the authorization (if any) was released; nothing was charged.
    Canceled,
}

impl Status {
    pub const ALL: [Self; 8] = [
        Self::Creating,
        Self::RequiresPaymentMethod,
        Self::RequiresConfirmation,
        Self::RequiresAction,
        Self::Processing,
        Self::RequiresCapture,
        Self::Succeeded,
        Self::Canceled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Creating => "creating",
            Self::RequiresPaymentMethod => "requires_payment_method",
            Self::RequiresConfirmation => "requires_confirmation",
            Self::RequiresAction => "requires_action",
            Self::Processing => "processing",
            Self::RequiresCapture => "requires_capture",
            Self::Succeeded => "succeeded",
            Self::Canceled => "canceled",
        }
    }

    /// Authorized or captured: an order may be placed for it.
    pub fn is_paid(self) -> bool {
        matches!(self, Self::RequiresCapture | Self::Succeeded)
    }

    /// Not final as recorded: the provider is asked before acting on it.
    pub fn is_unsure(self) -> bool {
        matches!(
            self,
            Self::Processing | Self::RequiresAction | Self::RequiresConfirmation
        )
    }
}

text_column!(Status);

/// A hold's payment (a `payments` row).
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Payment {
    pub hold_id: Uuid,
    pub payment_intent: Option<String>,
    pub client_secret: Option<String>,
    pub amount_cents: i64,
    pub currency: String,
    pub status: Status,
    pub order_id: Option<Uuid>,
    pub attempt: i32,
    pub decline_code: Option<String>,
    pub decline_message: Option<String>,
    pub extended: bool,
    pub captured_cents: Option<i64>,
    pub refund_id: Option<String>,
    pub refunded_cents: Option<i64>,
    pub settled: bool,
}

impl Payment {
    /// The intent's id (every row but one being created has it).
    pub fn intent(&self) -> &str {
        self.payment_intent.as_deref().unwrap_or_default()
    }

    /// As an order's JSON carries it.
    pub fn summary(&self) -> PaymentSummary {
        PaymentSummary {
            status: if self.refund_id.is_some() {
                "refunded".into()
            } else {
                self.status.as_str().into()
            },
            amount_cents: self.amount_cents,
            currency: self.currency.clone(),
            payment_intent: self.payment_intent.clone(),
            refunded_cents: self.refunded_cents,
        }
    }
}

/// Payments of this process: the provider, and what finishing a payment needs.
pub struct Payments {
    db: PgPool,
    redis: Redis,
    pub stripe: Stripe,
    confirmer: Arc<Confirmer>,
    pub currency: String,
    pub publishable_key: String,
    webhook_secret: String,
    /// Where Stripe.js is loaded from.
    pub js_url: String,
    extension: Duration,
    reconcile_after: Duration,
    /// How long one request's payment work may take: a few provider calls.
    work_limit: Duration,
}

/// How long a finisher's lease lasts without renewal (renewed every third while it works).
const LEASE_TTL: Duration = Duration::from_secs(6);

/// A creation claim older than this was left by a finisher that stopped: taken over.
const CREATION_STALE: Duration = Duration::from_secs(30);

impl Payments {
    /// The payments of a process with `settings`; `None` when payments are off.
    pub fn new(
        settings: &Settings,
        db: PgPool,
        redis: Redis,
        confirmer: Arc<Confirmer>,
    ) -> anyhow::Result<Option<Self>> {
        let missing = |what: &str| anyhow::anyhow!("STOCKADE_PAYMENTS=stripe needs {what}");
        let Some(stripe) = Stripe::of(settings)? else {
            return Ok(None);
        };
        let js_url = if settings.stripe_api_base == "https://api.stripe.com" {
            "https://js.stripe.com/v3/".to_string()
        } else {
            format!("{}/js.stripe.com/v3/", settings.stripe_api_base)
        };
        Ok(Some(Self {
            db,
            redis,
            stripe,
            confirmer,
            currency: settings.currency.clone(),
            publishable_key: settings
                .stripe_publishable_key
                .clone()
                .ok_or_else(|| missing("STOCKADE_STRIPE_PUBLISHABLE_KEY"))?,
            webhook_secret: settings
                .stripe_webhook_secret
                .as_deref()
                .ok_or_else(|| missing("STOCKADE_STRIPE_WEBHOOK_SECRET"))?
                .to_string(),
            js_url,
            extension: settings.payment_extension,
            reconcile_after: settings.payment_reconcile_after,
            work_limit: settings.stripe_timeout * 4 + settings.request_budget,
        }))
    }

    /// How long one request's payment work may take (its provider calls, each bounded by
    /// `STOCKADE_STRIPE_TIMEOUT_MS`, and the order).
    pub fn work_limit(&self) -> Duration {
        self.work_limit
    }

    /// The origin Stripe.js and its frames come from, for the pages' CSP.
    pub fn script_origin(&self) -> &str {
        let rest = self.js_url.split_once("://").map_or("", |(_, r)| r);
        let end = self.js_url.len() - rest.len() + rest.find('/').unwrap_or(rest.len());
        &self.js_url[..end]
    }

    /// Runs `work` holding the lease on `intent`'s payment; `Busy` when another finisher
    /// holds it, `NoLease` when Redis does not answer.
    async fn leased<T>(
        &self,
        intent: &str,
        work: impl Future<Output = T>,
    ) -> Result<T, flow::PayError> {
        let name = format!("payment:{intent}");
        match self.redis.acquire_key(&name, LEASE_TTL).await {
            crate::locking::KeyLease::Granted(lease) => {
                let out = self.redis.while_held(Some(&lease), LEASE_TTL, work).await;
                self.redis.release(&lease).await;
                Ok(out)
            }
            crate::locking::KeyLease::Busy => Err(flow::PayError::Busy),
            crate::locking::KeyLease::Degraded => Err(flow::PayError::NoLease),
        }
    }
}
