//! Checkout holds: placing one, reading it, confirming it into an order, releasing it.

use actix_web::http::header;
use actix_web::{HttpRequest, HttpResponse, web};
use uuid::Uuid;

use super::place::{HoldBody, insufficient, place};
use super::{IdempotencyKeyHeader, REPLAYED_HEADER};
use crate::checkout::{OrderRequest, PlacementBody};
use crate::clients;
use crate::error::AppError;
use crate::holds;
use crate::http::contract::{ConfirmErrors, OwnLookupErrors, PlaceErrors, ReleaseErrors};
use crate::http::json::{self, Checked};
use crate::http::limits;
use crate::http::middleware::answer_by;
use crate::http::paths::{IdPath, Names};
use crate::http::{AppState, detached};
use crate::payments::flow::PayError;

/// Places a checkout hold: the stock is reserved until it expires, is confirmed into an
/// order, or is released. Same body, headers and idempotency as an order.
#[utoipa::path(
    post,
    path = "/api/v1/holds",
    tag = "holds",
    security(("api_key" = [])),
    params(IdempotencyKeyHeader, crate::http::contract::ShopperHeader, crate::http::contract::PassHeader),
    request_body = HoldBody,
    responses(
        (status = 201, description = "The hold, placed (or replayed).",
            body = crate::holds::Hold,
            links(
                ("GetHold" = (operation_id = "get_hold",
                    parameters(("id" = "$response.body#/id")))),
                ("ConfirmHold" = (operation_id = "post_hold_confirm",
                    parameters(("id" = "$response.body#/id")))),
                ("ReleaseHold" = (operation_id = "delete_hold",
                    parameters(("id" = "$response.body#/id")))),
            ),
            headers(
                ("Location" = String, description = "`/api/v1/holds/{id}`."),
                ("Idempotency-Replayed" = String,
                    description = "`true` when this answers an earlier request with the key."),
            )),
        PlaceErrors,
    )
)]
#[tracing::instrument(skip_all)]
pub async fn post_holds(
    req: HttpRequest,
    state: web::Data<AppState>,
    body: Checked<PlacementBody>,
) -> Result<HttpResponse, AppError> {
    place(req, state, body, crate::checkout::Want::Hold).await
}

/// A hold's address in the API: `/api/v1/holds/{id}…`, taken after the caller is known.
pub struct HoldAddress;

impl Names for HoldAddress {
    type Id = Uuid;

    fn missing(_: &str) -> AppError {
        no_hold()
    }
}

pub(super) fn no_hold() -> AppError {
    // The id is not repeated: the caller has it, and a message is no place for its text.
    AppError::not_found("No such reservation: no hold with this id was placed by this caller.")
}

/// The id of a hold the caller placed; 404 for any other (whether or not it exists).
pub(super) async fn own_hold(
    req: &HttpRequest,
    state: &AppState,
    address: IdPath<HoldAddress>,
) -> Result<Uuid, AppError> {
    let caller = limits::caller(req, state).await?;
    let id = address.id()?;
    if !clients::owns_hold(&state.db, &caller, id).await? {
        return Err(no_hold());
    }
    Ok(id)
}

/// A hold the caller placed, and its state.
#[utoipa::path(
    get,
    path = "/api/v1/holds/{id}",
    tag = "holds",
    security(("api_key" = [])),
    params(("id" = Uuid, Path, description = "The hold's id.")),
    responses(
        (status = 200, description = "The hold.", body = crate::holds::Hold),
        OwnLookupErrors,
    )
)]
pub async fn get_hold(
    req: HttpRequest,
    state: web::Data<AppState>,
    address: IdPath<HoldAddress>,
) -> Result<HttpResponse, AppError> {
    let id = own_hold(&req, &state, address).await?;
    let hold = holds::db::find_hold(&state.db, id)
        .await?
        .ok_or_else(no_hold)?;
    Ok(HttpResponse::Ok().json(hold))
}

/// Optional details for confirming a hold.
#[derive(Debug, Default, serde::Deserialize, utoipa::ToSchema)]
pub struct ConfirmBody {
    #[schema(value_type = Option<crate::http::contract::inputs::Email>)]
    email: Option<String>,
    #[schema(value_type = Option<crate::http::contract::inputs::CustomerName>)]
    name: Option<String>,
    /// Where to ship the order; stored on it and shown with it.
    #[schema(value_type = Option<crate::http::contract::inputs::ShippingAddressInput>)]
    shipping_address: Option<crate::address::AddressInput>,
}

/// Confirms a hold the caller placed into an order; confirming again answers the same
/// order. After expiry the order is placed from free stock if there is enough (else 409),
/// as a new order: a product in a drop then needs a `Drop-Pass` however old the hold;
/// a hold purged after `STOCKADE_HOLD_RETENTION_DAYS` answers 404. When the shop takes
/// payments, only a hold whose payment is authorized (`POST /api/v1/holds/{id}/payment`)
/// is confirmed, else 402 says what is missing; the payment is captured once the order
/// has committed, and released if the order cannot be placed.
#[utoipa::path(
    post,
    path = "/api/v1/holds/{id}/confirm",
    tag = "holds",
    security(("api_key" = [])),
    params(
        ("id" = Uuid, Path, description = "The hold's id."),
        crate::http::contract::ShopperHeader,
        crate::http::contract::PassHeader,
    ),
    // Optional (`required: false`, set in `openapi::document`), but never `null`.
    request_body(content = ConfirmBody, description = "Optional: no body (or only white \
        space) is the same as `{}`. Not `null`."),
    responses(
        (status = 201, description = "The order the hold became.",
            body = crate::orders::Order,
            links(("GetOrder" = (operation_id = "get_order",
                parameters(("id" = "$response.body#/id"))))),
            headers(
                ("Location" = String, description = "`/api/v1/orders/{id}`."),
                ("Idempotency-Replayed" = String,
                    description = "`true` when the hold was confirmed before."),
            )),
        ConfirmErrors,
    )
)]
#[tracing::instrument(skip_all)]
pub async fn post_hold_confirm(
    req: HttpRequest,
    state: web::Data<AppState>,
    address: IdPath<HoldAddress>,
    body: web::Bytes,
) -> Result<HttpResponse, AppError> {
    // Whose the hold is, is asked with the confirmation (under `batched`, in its lot's
    // read), not by a read of its own.
    let caller = limits::caller(&req, &state).await?;
    let id = address.id()?;
    let owner = caller.hold_owner();
    // The body is optional; when present it is JSON by the rule every body follows.
    let body: ConfirmBody = json::optional(&req, &body)?.unwrap_or_default();
    let details = OrderRequest::check_contact(
        body.email.as_deref(),
        body.name.as_deref(),
        body.shipping_address.as_ref(),
    )?;
    // A hold placed before its product's drop bound it: only with this caller's pass (a
    // `Drop-Shopper` this caller may not send names nobody, and no pass is theirs).
    // A malformed `Drop-Shopper` is refused whatever the hold holds, as the contract says.
    let identity = match crate::http::gate::identity(&req, &caller) {
        Ok((identity, _)) => identity,
        Err(malformed @ AppError::BadRequest(_)) => return Err(malformed),
        Err(_) => String::new(),
    };
    if let Err(refusal) = crate::http::gate::may_confirm(&state, id, &identity, |_| {
        req.headers()
            .get(crate::http::gate::PASS_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    })
    .await
    {
        // Another client's hold is not found, whichever check would refuse it first (its
        // refusal would say what it holds and which drop). Read only on a refusal.
        if !clients::owns_hold(&state.db, &caller, id).await? {
            return Err(no_hold());
        }
        return Err(crate::http::gate::refused(refusal));
    }
    // With payments on, what is said about the hold's payment is for its owner only.
    if state.payments.is_some() && !clients::owns_hold(&state.db, &caller, id).await? {
        return Err(no_hold());
    }
    let answer_by = answer_by(&req, state.settings.request_budget);
    let shared = state.clone().into_inner();
    let confirmed = detached(state.confirm_limit(), async move {
        let asked = holds::Confirmation {
            hold: id,
            owner: Some(&owner),
            contact: details.contact(),
            answer_by,
        };
        shared.confirm_hold(asked).await
    })
    .await?;
    match confirmed {
        Ok(confirmed) => {
            let mut res = HttpResponse::Created();
            res.insert_header((
                header::LOCATION,
                format!("/api/v1/orders/{}", confirmed.order.id),
            ));
            if confirmed.replayed {
                res.insert_header((REPLAYED_HEADER, "true"));
            }
            Ok(res.json(confirmed.order))
        }
        Err(PayError::Hold(holds::HoldError::Insufficient(shortages))) => {
            Ok(insufficient(&req, &shortages))
        }
        Err(PayError::NotFound) => Err(no_hold()),
        Err(e) => Err(e.into()),
    }
}

/// Releases a hold the caller placed: its stock is offered again at once. Releasing again
/// is a no-op.
#[utoipa::path(
    delete,
    path = "/api/v1/holds/{id}",
    tag = "holds",
    security(("api_key" = [])),
    params(("id" = Uuid, Path, description = "The hold's id.")),
    responses(
        (status = 204, description = "Released (or it was already)."),
        ReleaseErrors,
    )
)]
pub async fn delete_hold(
    req: HttpRequest,
    state: web::Data<AppState>,
    address: IdPath<HoldAddress>,
) -> Result<HttpResponse, AppError> {
    let id = own_hold(&req, &state, address).await?;
    let state = state.into_inner();
    detached(crate::checkout::work_limit(&state.settings), async move {
        holds::release(&state.db, Some(&state.redis), id, "api").await
    })
    .await??;
    Ok(HttpResponse::NoContent().finish())
}
