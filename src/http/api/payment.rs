//! Paying for a hold (`POST /api/v1/holds/{id}/payment`) and the provider's webhook
//! (`POST /webhooks/stripe`). What a payment guarantees is in [`crate::payments`].

use actix_web::{HttpRequest, HttpResponse, web};
use serde::{Deserialize, Serialize};

use super::holds::{HoldAddress, no_hold, own_hold};
use crate::error::AppError;
use crate::holds;
use crate::http::contract::PayErrors;
use crate::http::json;
use crate::http::paths::IdPath;
use crate::http::{AppState, detached};
use crate::payments::webhook::{Handled, Refused};
use crate::payments::{Payment, Payments, Status};

/// Optional: the card to pay with, as Stripe.js made it in the shopper's browser.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PaymentBody {
    /// A PaymentMethod (`pm_…`) or a tokenized card (`card_…`). Without it, the intent is
    /// only made (or read) and its client secret answered.
    #[schema(pattern = "^(pm|card)_[A-Za-z0-9_]{1,250}$", example = "pm_card_visa")]
    payment_method: Option<String>,
}

impl PaymentBody {
    /// The method, if given and well formed.
    fn method(&self) -> Result<Option<&str>, AppError> {
        self.payment_method
            .as_deref()
            .map(crate::payments::flow::check_method)
            .transpose()
            .map_err(AppError::Unprocessable)
    }
}

/// A hold's payment, as the API answers it.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PaymentAnswer {
    /// The PaymentIntent's id (`pi_…`).
    pub payment_intent: String,
    /// For Stripe.js in the shopper's browser (3-D Secure); only the hold's owner gets it.
    pub client_secret: Option<String>,
    /// The hold's total, from the shop's prices.
    pub amount_cents: i64,
    /// ISO 4217, lower case.
    pub currency: String,
    /// `requires_payment_method` (no card yet, or the last was declined),
    /// `requires_action` (3-D Secure: confirm with Stripe.js and the client secret),
    /// `requires_capture` (authorized: confirm the hold), `succeeded` (charged),
    /// `canceled` (released, nothing charged).
    pub status: Status,
}

impl From<Payment> for PaymentAnswer {
    fn from(p: Payment) -> Self {
        Self {
            payment_intent: p.intent().to_string(),
            client_secret: p.client_secret,
            amount_cents: p.amount_cents,
            currency: p.currency,
            status: p.status,
        }
    }
}

/// The shop's payments, or 404 when it takes none.
pub(super) fn payments(state: &AppState) -> Result<std::sync::Arc<Payments>, AppError> {
    state.payments.clone().ok_or_else(|| {
        AppError::not_found(
            "This shop does not take payments (STOCKADE_PAYMENTS is off): confirm holds \
             without paying.",
        )
    })
}

/// Makes, or answers, the one PaymentIntent of a hold the caller placed; with a
/// `payment_method`, also pays with it (the method is set on the intent and confirmed on
/// the server). The amount is the hold's total. Paying again after a decline uses the same
/// intent; paying a paid hold answers its payment as it is. Paying extends the hold once
/// (`STOCKADE_PAYMENT_EXTENSION_SECONDS`), so a slow bank does not lose the stock.
#[utoipa::path(
    post,
    path = "/api/v1/holds/{id}/payment",
    tag = "holds",
    security(("api_key" = [])),
    params(("id" = uuid::Uuid, Path, description = "The hold's id.")),
    request_body(content = PaymentBody, description = "Optional: no body (or only white \
        space) is the same as `{}`. Not `null`."),
    responses(
        (status = 200, description = "The hold's payment: `requires_capture` once the card \
            is authorized, `requires_action` when the shopper's bank asks for 3-D Secure.",
            body = PaymentAnswer),
        PayErrors,
    )
)]
#[tracing::instrument(skip_all)]
pub async fn post_hold_payment(
    req: HttpRequest,
    state: web::Data<AppState>,
    address: IdPath<HoldAddress>,
    body: web::Bytes,
) -> Result<HttpResponse, AppError> {
    let id = own_hold(&req, &state, address).await?;
    let payments = payments(&state)?;
    let body: PaymentBody = json::optional(&req, &body)?.unwrap_or_default();
    let method = body.method()?.map(str::to_string);
    let hold = holds::db::find_hold(&state.db, id)
        .await?
        .ok_or_else(no_hold)?;
    let limit = payments.work_limit();
    let payment = detached(limit, async move {
        match method {
            Some(method) => payments.pay(&hold, &method).await,
            None => payments.start(&hold).await,
        }
    })
    .await??;
    Ok(HttpResponse::Ok().json(PaymentAnswer::from(payment)))
}

/// The provider's events (`Stripe-Signature` verified). 200 once handled (or seen
/// before), 400 for a bad or stale signature, 503 when the provider or Redis did not
/// answer (Stripe sends the event again). Not part of the API's contract: Stripe's.
#[tracing::instrument(skip_all)]
pub async fn post_stripe_webhook(
    req: HttpRequest,
    state: web::Data<AppState>,
    body: web::Bytes,
) -> Result<HttpResponse, AppError> {
    let payments = payments(&state)?;
    let signature = req
        .headers()
        .get("Stripe-Signature")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let now = chrono::Utc::now().timestamp();
    let limit = payments.work_limit();
    let handled = detached(limit, async move {
        payments.webhook(&body, &signature, now).await
    })
    .await?;
    match handled {
        Ok(Handled::Now) => Ok(HttpResponse::Ok().json(serde_json::json!({ "received": true }))),
        Ok(Handled::Again) => {
            Ok(HttpResponse::Ok().json(serde_json::json!({ "received": true, "duplicate": true })))
        }
        Err(Refused::Bad(why)) => Err(AppError::BadRequest(why.into())),
        Err(Refused::Later(e)) => Err(match AppError::from(e) {
            unavailable @ AppError::Unavailable { .. } => unavailable,
            other => AppError::Unavailable {
                message: format!("{other} The event was not handled yet; send it again."),
                retry_after: 2,
            },
        }),
        Err(Refused::Database(e)) => Err(e.into()),
    }
}
