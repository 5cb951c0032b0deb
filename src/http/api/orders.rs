//! Orders: placing one (`POST /api/v1/orders`) and reading it back.

use actix_web::{HttpRequest, HttpResponse, web};
use uuid::Uuid;

use super::IdempotencyKeyHeader;
use super::place::{OrderBody, place};
use crate::checkout::PlacementBody;
use crate::clients;
use crate::error::AppError;
use crate::http::AppState;
use crate::http::contract::{OwnLookupErrors, PlaceErrors};
use crate::http::json::Checked;
use crate::http::limits;
use crate::http::paths::{IdPath, Names};
use crate::orders;

/// Places an order: every line or none, never more than is in stock. A retry with the same
/// `Idempotency-Key` and body answers the first response again (`Idempotency-Replayed`).
#[utoipa::path(
    post,
    path = "/api/v1/orders",
    tag = "orders",
    security(("api_key" = [])),
    params(IdempotencyKeyHeader, crate::http::contract::ShopperHeader, crate::http::contract::PassHeader),
    request_body = OrderBody,
    responses(
        (status = 201, description = "The order, placed (or replayed).",
            body = crate::orders::Order,
            links(("GetOrder" = (operation_id = "get_order",
                parameters(("id" = "$response.body#/id"))))),
            headers(
                ("Location" = String, description = "`/api/v1/orders/{id}`."),
                ("Idempotency-Replayed" = String,
                    description = "`true` when this answers an earlier request with the key."),
            )),
        PlaceErrors,
    )
)]
#[tracing::instrument(skip_all)]
pub async fn post_orders(
    req: HttpRequest,
    state: web::Data<AppState>,
    body: Checked<PlacementBody>,
) -> Result<HttpResponse, AppError> {
    place(req, state, body, crate::checkout::Want::Order).await
}

/// The order, to the caller that placed it (others get 404: the id alone reveals nothing).
#[utoipa::path(
    get,
    path = "/api/v1/orders/{id}",
    tag = "orders",
    security(("api_key" = [])),
    params(("id" = Uuid, Path, description = "The order's id.")),
    responses(
        (status = 200, description = "The order.", body = crate::orders::Order),
        OwnLookupErrors,
    )
)]
pub async fn get_order(
    req: HttpRequest,
    state: web::Data<AppState>,
    address: IdPath<OrderAddress>,
) -> Result<HttpResponse, AppError> {
    let caller = limits::caller(&req, &state).await?;
    let not_found = || OrderAddress::missing("");
    let id = address.id()?;
    if !clients::owns_order(&state.db, &caller, id).await? {
        return Err(not_found());
    }
    let mut order = orders::db::find_order(&state.db, id)
        .await?
        .ok_or_else(not_found)?;
    if state.payments.is_some() {
        let payment = crate::payments::for_order(&state.db, id).await?;
        order.payment = payment.map(|p| Box::new(p.summary()));
    }
    Ok(HttpResponse::Ok().json(order))
}

/// An order's address in the API: `/api/v1/orders/{id}`, taken after the caller is known.
pub struct OrderAddress;

impl Names for OrderAddress {
    type Id = Uuid;

    // The id is not repeated: the caller has it, and a message is no place for its text.
    fn missing(_: &str) -> AppError {
        AppError::not_found("No order with this id was placed by this caller.")
    }
}
