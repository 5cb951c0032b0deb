//! Placing an order or a hold from a JSON body: the caller, its rate limit, its
//! `Idempotency-Key`, then [`crate::checkout`]; 201 with the result or 409 naming each
//! short SKU.

use actix_web::http::{StatusCode, header};
use actix_web::{HttpRequest, HttpResponse, web};

use crate::checkout::{self, Made, OrderRequest, Outcome, PlacementBody, Shopper, Want};
use crate::clients::Caller;
use crate::drops::registry::RequireError;
use crate::error::AppError;
use crate::http::contract::inputs::{CustomerName, Email, ShippingAddressInput, SkuInput};
use crate::http::json::{Checked, FromBody};
use crate::http::limits::{self, limit_placement};
use crate::http::middleware::{answer_by, problem_response};
use crate::http::{AppState, detached};
use crate::idempotency::{IdempotencyKey, Scope};
use crate::orders::Shortage;

/// The body of an order.
#[derive(utoipa::ToSchema)]
#[schema(example = json!({
    "lines": [{"sku": "KB-ALPINE-75", "quantity": 1}],
    "email": "ada@example.com"
}))]
#[expect(
    dead_code,
    reason = "the contract's shape; `PlacementBody::parse` reads it in its own words"
)]
pub(super) struct OrderBody {
    /// One line per SKU, at most 50 SKUs (`MAX_LINES`). A SKU named twice is one line of
    /// the sum, which must be within the cap too.
    #[schema(min_items = 1, max_items = 50)]
    lines: Vec<LineBody>,
    email: Option<Email>,
    name: Option<CustomerName>,
    /// Where to ship it; stored on the order and shown with it.
    shipping_address: Option<ShippingAddressInput>,
}

/// One line of an order.
#[derive(utoipa::ToSchema)]
#[expect(
    dead_code,
    reason = "the contract's shape; `PlacementBody::parse` reads it"
)]
pub(super) struct LineBody {
    sku: SkuInput,
    /// Units, from 1 to the shop's cap per line (`STOCKADE_MAX_LINE_QUANTITY`); the served
    /// document says the running server's cap as `maximum`.
    #[schema(minimum = 1)]
    quantity: i64,
}

/// The body of a hold: an order's, with a lower cap per SKU.
#[derive(utoipa::ToSchema)]
#[schema(example = json!({"lines": [{"sku": "KB-ALPINE-75", "quantity": 1}]}))]
#[expect(
    dead_code,
    reason = "the contract's shape; `PlacementBody::parse` reads it"
)]
pub(super) struct HoldBody {
    /// One line per SKU, at most 50 SKUs. A SKU named twice is one line of the sum, which
    /// must be within the cap too.
    #[schema(min_items = 1, max_items = 50)]
    lines: Vec<HoldLineBody>,
    email: Option<Email>,
    name: Option<CustomerName>,
}

/// One line of a hold.
#[derive(utoipa::ToSchema)]
#[expect(
    dead_code,
    reason = "the contract's shape; `PlacementBody::parse` reads it"
)]
pub(super) struct HoldLineBody {
    sku: SkuInput,
    /// Units, from 1 to the smaller of the cap per line and the cap per SKU held
    /// (`STOCKADE_HOLD_MAX_PER_SKU`); the served document says it as `maximum`.
    #[schema(minimum = 1)]
    quantity: i64,
}

impl FromBody for PlacementBody {
    fn from_body(value: serde_json::Value) -> Result<Self, AppError> {
        Ok(PlacementBody::parse(&value)?)
    }
}

/// An order or a hold from a JSON body, under the API's keys of each (`Scope::Api`,
/// `Scope::ApiHold`).
pub(super) async fn place(
    req: HttpRequest,
    state: web::Data<AppState>,
    body: Checked<PlacementBody>,
    want: Want,
) -> Result<HttpResponse, AppError> {
    let scope = match want {
        Want::Order => Scope::Api,
        Want::Hold => Scope::ApiHold,
    };
    let caller = limits::caller(&req, &state).await?;
    if want == Want::Order && state.payments.is_some() && !caller.orders_unpaid() {
        return Err(AppError::PaymentRequired {
            message: "This shop takes payment, so orders come from paid holds: place a hold \
                      (POST /api/v1/holds), pay for it (POST /api/v1/holds/{id}/payment), \
                      then confirm it (POST /api/v1/holds/{id}/confirm)."
                .into(),
            details: None,
        });
    }
    limit_placement(&req, &state, Some(&caller)).await?;
    let key = IdempotencyKey::scoped(&caller.owner(), &super::idempotency_key(&req)?);
    let shopper = Shopper::default().address(crate::http::client_addr(&req, &state.settings));
    let shopper = match &caller {
        Caller::Client(client) if client.limit == crate::clients::Limit::Unlimited => {
            shopper.client(&client.id.to_string()).for_many()
        }
        Caller::Client(client) => shopper.client(&client.id.to_string()),
        Caller::Anonymous => shopper,
    };
    let cap = state.settings.max_line_quantity;
    let request = OrderRequest::from_body(body.into_inner()?, cap)?.placed_by(shopper);
    if want == Want::Hold && request.shipping_address().is_some() {
        return Err(AppError::Unprocessable(
            "shipping_address is given when the hold is confirmed \
             (POST /api/v1/holds/{id}/confirm), not when it is placed."
                .into(),
        ));
    }
    // A product in a drop: only with this caller's pass from its queue (a retry under a
    // key that has a record is answered from it). Who the caller is counts only there: a
    // `Drop-Shopper` that is not allowed is refused only for a product in a drop; one that
    // is malformed, always (the contract's pattern refuses it).
    let identity = match crate::http::gate::identity(&req, &caller) {
        Err(malformed @ AppError::BadRequest(_)) => return Err(malformed),
        other => other.map(|(identity, _)| identity),
    };
    let skus = request.skus();
    let allowed = crate::http::gate::may_place(
        &state,
        &skus,
        identity.as_deref(),
        |_| {
            req.headers()
                .get(crate::http::gate::PASS_HEADER)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        },
        (scope, &key),
    )
    .await;
    match (allowed, identity) {
        (Ok(()), _) => {}
        (Err(RequireError::NeedsPass(_)), Err(e)) => return Err(e),
        (Err(refusal), _) => return Err(crate::http::gate::refused(refusal)),
    }
    let answer_by = answer_by(&req, state.settings.request_budget);
    let state = state.into_inner();
    let outcome = detached(crate::checkout::work_limit(&state.settings), async move {
        let deps = state.order_deps(answer_by);
        checkout::place(deps, want, scope, &key, &request).await
    })
    .await??;
    Ok(outcome_response(&req, outcome))
}

/// 201 with the order or hold and its `Location`, or 409 naming each short SKU.
fn outcome_response(req: &HttpRequest, outcome: Outcome) -> HttpResponse {
    let replayed = outcome.replayed();
    let mut res = match outcome {
        Outcome::Made { made, .. } => {
            let location = match &made {
                Made::Order(order) => format!("/api/v1/orders/{}", order.id),
                Made::Hold(hold) => format!("/api/v1/holds/{}", hold.id),
            };
            HttpResponse::Created()
                .insert_header((header::LOCATION, location))
                .json(made)
        }
        Outcome::Insufficient { shortages, .. } => insufficient(req, &shortages),
    };
    if replayed {
        res.headers_mut().insert(
            header::HeaderName::from_static("idempotency-replayed"),
            header::HeaderValue::from_static("true"),
        );
    }
    res
}

pub(super) fn insufficient(req: &HttpRequest, shortages: &[Shortage]) -> HttpResponse {
    let detail = shortages
        .iter()
        .map(|s| {
            format!(
                "{}: {} requested, {} available",
                s.sku, s.requested, s.available
            )
        })
        .collect::<Vec<_>>()
        .join("; ");
    problem_response(
        req,
        StatusCode::CONFLICT,
        &format!("Not enough stock. {detail}."),
        Some(serde_json::json!({ "shortages": shortages })),
    )
}
