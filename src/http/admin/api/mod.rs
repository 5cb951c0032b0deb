//! The admin JSON API (`/api/v1/admin/…`), every area's in one place: the dashboard's
//! numbers, a product's settings, stock changes (applied once per `Idempotency-Key`), and
//! webhook endpoints and deliveries, and drops ([`drops`]). Browser clients send the session's CSRF token in
//! `X-CSRF-Token`.

pub mod drops;

use std::time::Duration;

use actix_web::http::{StatusCode, header};
use actix_web::{HttpRequest, HttpResponse, web};
use serde::{Deserialize, Serialize};
use sqlx::PgConnection;

use super::AdminWrite;
use super::dashboard::{Dashboard, dashboard};
use super::once::{InTransaction, admin_key, apply_once};
use super::webhooks::{
    DELIVERIES_SHOWN, DeliveriesQuery, DeliveryAddress, EndpointAddress, check_new, status_filter,
};
use crate::admin::Admin;
use crate::catalog::{self, Sku, manage};
use crate::error::AppError;
use crate::events::db::{self, Delivery, Endpoint};
use crate::events::sign;
use crate::http::AppState;
use crate::http::contract::inputs::{
    DeliveryStatus, EndpointDescription, EventTypeName, ProductSettingsPatch, Reason, SkuInput,
    WebhookUrl,
};
use crate::http::contract::{
    AdminActionErrors, AdminCreateErrors, AdminEditErrors, AdminListErrors, AdminReadErrors,
    AdminStockErrors,
};
use crate::http::json::{Body, FromBody, Json};
use crate::http::paths::{IdPath, SkuPath, no_product};
use crate::idempotency::{Once, Scope, StoredResponse};
use crate::inventory::change::{self, Change, Refused};

/// The dashboard's numbers: stock, orders, holds, events.
#[utoipa::path(
    get,
    path = "/api/v1/admin/dashboard",
    tag = "admin",
    security(("admin_session" = [])),
    responses(
        (status = 200, description = "The dashboard.", body = Dashboard),
        AdminReadErrors,
    )
)]
pub async fn get_dashboard_json(
    _admin: Admin,
    state: web::Data<AppState>,
) -> Result<HttpResponse, AppError> {
    Ok(HttpResponse::Ok()
        .insert_header((header::CACHE_CONTROL, "no-store"))
        .json(dashboard(&state).await?))
}

/// Units received into stock.
#[derive(Debug, Deserialize, Serialize, utoipa::ToSchema)]
pub struct RestockBody {
    #[schema(minimum = 1, maximum = 10_000_000)]
    units: i64,
    #[schema(value_type = Reason)]
    reason: String,
}

/// A stock count: `on_hand` becomes the count, if it still is `expected_on_hand`.
#[derive(Debug, Deserialize, Serialize, utoipa::ToSchema)]
pub struct AdjustBody {
    /// The count read before (any that fits in 32 bits; 409 unless it still is).
    #[schema(minimum = 0, maximum = 2_147_483_647)]
    expected_on_hand: i64,
    #[schema(minimum = 0, maximum = 10_000_000)]
    on_hand: i64,
    #[schema(value_type = Reason)]
    reason: String,
}

/// What `PATCH /api/v1/admin/products/{sku}` changes: each member sent is set (`null`
/// clears it), each left out is kept. Both are checked before either is written.
pub struct ProductPatch {
    limit: Option<Option<i32>>,
    category: Option<Option<String>>,
}

impl FromBody for ProductPatch {
    fn from_body(body: serde_json::Value) -> Result<Self, AppError> {
        let fields = body
            .as_object()
            .ok_or_else(|| AppError::Unprocessable("The body must be a JSON object.".into()))?;
        const FIELDS: [&str; 2] = ["purchase_limit", "category"];
        if let Some(other) = fields.keys().find(|k| !FIELDS.contains(&k.as_str())) {
            return Err(AppError::Unprocessable(format!(
                "{other:?} cannot be changed here; only \"purchase_limit\" and \"category\" can."
            )));
        }
        if fields.is_empty() {
            return Err(AppError::Unprocessable(
                "Send {\"purchase_limit\": n} (or null for no limit) and/or {\"category\": \"…\"} \
                 (or null for none)."
                    .into(),
            ));
        }
        let limit = match fields.get("purchase_limit") {
            None => None,
            Some(serde_json::Value::Null) => Some(None),
            Some(value) => Some(Some(
                value
                    .as_i64()
                    .filter(|n| (1..=1_000_000).contains(n))
                    .map(|n| n as i32)
                    .ok_or_else(|| {
                        AppError::Unprocessable(
                            "purchase_limit is a whole number from 1 to 1,000,000, or null.".into(),
                        )
                    })?,
            )),
        };
        let category = match fields.get("category") {
            None => None,
            Some(serde_json::Value::Null) => Some(None),
            Some(serde_json::Value::String(c)) => {
                Some(Some(catalog::browse::parse_category(c).map_err(|e| {
                    AppError::Unprocessable(crate::error::sentence(&e.0))
                })?))
            }
            Some(_) => {
                return Err(AppError::Unprocessable(
                    "category is a text of 1 to 40 characters, or null.".into(),
                ));
            }
        };
        Ok(Self { limit, category })
    }
}

/// A product's settings, as `PATCH /api/v1/admin/products/{sku}` leaves them.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ProductSettings {
    sku: Sku,
    /// At most this many per customer; `null` when there is no limit.
    purchase_limit: Option<i32>,
    /// The shelf it sits on; `null` when none.
    category: Option<String>,
}

/// A product's units on hand after a stock change.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct StockLevel {
    sku: Sku,
    on_hand: i32,
}

impl StockLevel {
    /// The answer stored under the change's `Idempotency-Key` (and replayed from it).
    fn stored(&self) -> StoredResponse {
        let body = serde_json::to_value(self).expect("a stock level is plain JSON");
        StoredResponse { status: 200, body }
    }
}

/// A webhook endpoint just created, with its signing secret (shown this once only).
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct NewEndpoint {
    #[serde(flatten)]
    endpoint: Endpoint,
    /// The secret its deliveries are signed with (Standard Webhooks, `whsec_…`).
    secret: String,
}

/// A delivery queued to be sent again.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Resent {
    id: i64,
    /// `pending`.
    status: &'static str,
}

/// The `X-CSRF-Token` header every admin API write carries (the session's token).
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Header)]
#[expect(
    dead_code,
    reason = "the contract's words for the header; `AdminWrite` reads it"
)]
pub(super) struct CsrfHeader {
    /// The admin session's CSRF token (shown on the admin pages).
    #[param(rename = "X-CSRF-Token")]
    csrf_token: String,
}

/// The admin API's answer to a stock change under an `Idempotency-Key`: the stored JSON,
/// the first time and (marked replayed) for every retry.
fn api_answer(once: Once) -> Result<HttpResponse, AppError> {
    let (stored, replayed) = match once {
        Once::Applied(stored) => (stored, false),
        Once::Replayed(stored) => (stored, true),
        Once::Mismatch => {
            return Err(AppError::Unprocessable(
                "This Idempotency-Key was already used for a different request.".into(),
            ));
        }
        Once::InFlight => {
            return Err(AppError::Conflict {
                message: "A request with this Idempotency-Key is still being processed.".into(),
                retry_after: Some(1),
                details: None,
            });
        }
    };
    let status = StatusCode::from_u16(stored.status).unwrap_or(StatusCode::OK);
    let mut res = HttpResponse::build(status);
    if replayed {
        res.insert_header((crate::http::api::REPLAYED_HEADER, "true"));
    }
    Ok(res.json(stored.body))
}

/// `PATCH /api/v1/admin/products/{sku}`: `{"purchase_limit": n}` sets the most units one
/// customer may buy (`null` removes the limit). Answers the product's new settings.
#[utoipa::path(
    patch,
    path = "/api/v1/admin/products/{sku}",
    tag = "admin",
    security(("admin_session" = [])),
    params(("sku" = SkuInput, Path, description = "The product's SKU."), CsrfHeader),
    request_body(content = ProductSettingsPatch, description = "`{\"purchase_limit\": n | \
        null}` and/or `{\"category\": \"…\" | null}`."),
    responses(
        (status = 200, description = "The product's settings now.", body = ProductSettings),
        AdminEditErrors,
    )
)]
pub async fn patch_api_product(
    _admin: AdminWrite,
    state: web::Data<AppState>,
    address: SkuPath,
    Body(patch): Body<ProductPatch>,
) -> Result<HttpResponse, AppError> {
    let sku = address.sku()?;
    let ProductPatch { limit, category } = patch;
    let not_found = || AppError::not_found(format!("No product with SKU {sku}."));
    let mut tx = state.db.begin().await?;
    if let Some(limit) = limit
        && !catalog::db::set_purchase_limit(&mut *tx, &sku, limit).await?
    {
        return Err(not_found());
    }
    if let Some(category) = &category
        && !catalog::db::set_category(&mut *tx, &sku, category.as_deref()).await?
    {
        return Err(not_found());
    }
    tx.commit().await?;
    let settings = manage::settings(&state.db, &sku)
        .await?
        .ok_or_else(not_found)?;
    state.catalog.forget(&sku);
    Ok(HttpResponse::Ok().json(ProductSettings {
        sku,
        purchase_limit: settings.purchase_limit,
        category: settings.category,
    }))
}

/// Adds units to a product's stock (a ledger row), once per `Idempotency-Key`.
#[utoipa::path(
    post,
    path = "/api/v1/admin/stock/{sku}/restock",
    tag = "admin",
    security(("admin_session" = [])),
    params(("sku" = SkuInput, Path, description = "The product's SKU."), CsrfHeader,
        crate::http::api::IdempotencyKeyHeader),
    request_body = RestockBody,
    responses(
        (status = 200, description = "The stock after the restock.", body = StockLevel,
            headers(("Idempotency-Replayed" = String,
                description = "`true` when this answers an earlier request with the key."))),
        AdminStockErrors,
    )
)]
pub async fn post_api_restock(
    req: HttpRequest,
    AdminWrite(admin): AdminWrite,
    state: web::Data<AppState>,
    address: SkuPath,
    Json(body): Json<RestockBody>,
) -> Result<HttpResponse, AppError> {
    let sku = address.sku()?;
    let sku = existing(&state, sku).await?;
    let change = Change::restock(Some(body.units), "units")?;
    let reason = change::reason(&body.reason)?;
    apply_change(&req, &admin, &state, sku, change, reason).await
}

/// Sets a product's on-hand count (a ledger row for the difference), once per
/// `Idempotency-Key`; 409 when the stock moved since `expected_on_hand` was read.
#[utoipa::path(
    post,
    path = "/api/v1/admin/stock/{sku}/adjust",
    tag = "admin",
    security(("admin_session" = [])),
    params(("sku" = SkuInput, Path, description = "The product's SKU."), CsrfHeader,
        crate::http::api::IdempotencyKeyHeader),
    request_body = AdjustBody,
    responses(
        (status = 200, description = "The stock after the count.", body = StockLevel,
            headers(("Idempotency-Replayed" = String,
                description = "`true` when this answers an earlier request with the key."))),
        AdminStockErrors,
    )
)]
pub async fn post_api_adjust(
    req: HttpRequest,
    AdminWrite(admin): AdminWrite,
    state: web::Data<AppState>,
    address: SkuPath,
    Json(body): Json<AdjustBody>,
) -> Result<HttpResponse, AppError> {
    let sku = address.sku()?;
    let sku = existing(&state, sku).await?;
    let change = Change::adjust(
        (Some(body.expected_on_hand), "expected_on_hand"),
        (Some(body.on_hand), "on_hand"),
    )?;
    let reason = change::reason(&body.reason)?;
    apply_change(&req, &admin, &state, sku, change, reason).await
}

/// Applies a stock change once per `Idempotency-Key`: the stock after it, or the refusal
/// (422 past what a count can hold, 409 when stock moved or holds keep the units).
async fn apply_change(
    req: &HttpRequest,
    admin: &Admin,
    state: &AppState,
    sku: Sku,
    change: Change,
    reason: String,
) -> Result<HttpResponse, AppError> {
    let fingerprint = change.fingerprint(&sku, &reason);
    let key = admin_key(admin, &crate::http::api::idempotency_key(req)?)?;
    let actor = admin.username.clone();
    let changed = sku.clone();
    let once = apply_once(
        state,
        Scope::Admin,
        key,
        &fingerprint,
        Duration::ZERO,
        InTransaction(
            async move |tx: &mut PgConnection| -> Result<StoredResponse, AppError> {
                let sku = changed;
                let refusal = match change.apply(tx, &sku, &reason, &actor).await? {
                    Ok(on_hand) => return Ok(StockLevel { sku, on_hand }.stored()),
                    Err(refusal) => refusal,
                };
                let message = refusal.sentence(change);
                Err(match refusal {
                    Refused::TooMuch { .. } => AppError::Unprocessable(message),
                    Refused::Moved { on_hand } => AppError::Conflict {
                        message,
                        retry_after: None,
                        details: Some(serde_json::json!({"on_hand": on_hand})),
                    },
                    Refused::BelowReserved { reserved } => AppError::Conflict {
                        message,
                        retry_after: None,
                        details: Some(serde_json::json!({"reserved": reserved})),
                    },
                })
            },
        ),
    )
    .await??;
    state.stock_changed(&sku).await;
    api_answer(once)
}

// ---------------------------------------------------------------- webhooks

/// Every webhook endpoint.
#[utoipa::path(
    get,
    path = "/api/v1/admin/webhooks",
    tag = "admin",
    security(("admin_session" = [])),
    responses(
        (status = 200, description = "The endpoints.", body = [Endpoint]),
        AdminReadErrors,
    )
)]
pub async fn get_api_webhooks(
    _admin: Admin,
    state: web::Data<AppState>,
) -> Result<HttpResponse, AppError> {
    Ok(HttpResponse::Ok().json(db::endpoints(&state.db).await?))
}

/// A new webhook endpoint.
#[derive(Deserialize, utoipa::ToSchema)]
pub struct NewEndpointBody {
    #[schema(value_type = WebhookUrl)]
    url: String,
    #[schema(value_type = Vec<EventTypeName>, min_items = 1)]
    event_types: Vec<String>,
    #[serde(default)]
    #[schema(value_type = EndpointDescription)]
    description: String,
}

impl FromBody for NewEndpointBody {
    fn from_body(value: serde_json::Value) -> Result<Self, AppError> {
        let shape = r#"{"url": "https://…", "event_types": ["order.placed", …]}"#;
        crate::http::json::shaped(value, shape)
    }
}

/// 201 with the endpoint and its `secret` (the only time it is shown).
#[utoipa::path(
    post,
    path = "/api/v1/admin/webhooks",
    tag = "admin",
    security(("admin_session" = [])),
    params(CsrfHeader),
    request_body = NewEndpointBody,
    responses(
        (status = 201, description = "The endpoint, with its `secret`.", body = NewEndpoint),
        AdminCreateErrors,
    )
)]
pub async fn post_api_webhooks(
    AdminWrite(admin): AdminWrite,
    state: web::Data<AppState>,
    Body(body): Body<NewEndpointBody>,
) -> Result<HttpResponse, AppError> {
    let new = check_new(&state, &body.url, &body.event_types, &body.description)
        .await
        .map_err(AppError::Unprocessable)?;
    let secret = sign::new_secret();
    let endpoint =
        db::insert_endpoint(&state.db, &new.url, &new.types, &new.description, &secret).await?;
    tracing::info!(admin = %admin.username, endpoint = %endpoint.id, "webhook endpoint created");
    Ok(HttpResponse::Created()
        .insert_header((header::CACHE_CONTROL, "no-store"))
        .json(NewEndpoint { endpoint, secret }))
}

/// Deletes a webhook endpoint.
#[utoipa::path(
    delete,
    path = "/api/v1/admin/webhooks/{id}",
    tag = "admin",
    security(("admin_session" = [])),
    params(("id" = String, Path, description = "The endpoint's id."), CsrfHeader),
    responses(
        (status = 204, description = "Deleted."),
        AdminActionErrors,
    )
)]
pub async fn delete_api_webhook(
    _admin: AdminWrite,
    state: web::Data<AppState>,
    address: IdPath<EndpointAddress>,
) -> Result<HttpResponse, AppError> {
    let id = address.id()?;
    if !db::delete_endpoint(&state.db, id).await? {
        return Err(AppError::not_found("No such webhook endpoint."));
    }
    Ok(HttpResponse::NoContent().finish())
}

/// The latest webhook deliveries, newest first.
#[utoipa::path(
    get,
    path = "/api/v1/admin/webhooks/deliveries",
    tag = "admin",
    security(("admin_session" = [])),
    params(("status" = Option<DeliveryStatus>, Query)),
    responses(
        (status = 200, description = "The deliveries.", body = [Delivery]),
        AdminListErrors,
    )
)]
pub async fn get_api_deliveries(
    _admin: Admin,
    state: web::Data<AppState>,
    query: web::Query<DeliveriesQuery>,
) -> Result<HttpResponse, AppError> {
    let status = status_filter(query.status.as_deref())?;
    let deliveries = db::deliveries(&state.db, status, DELIVERIES_SHOWN).await?;
    Ok(HttpResponse::Ok()
        .insert_header((header::CACHE_CONTROL, "no-store"))
        .json(deliveries))
}

/// 202: queued to be sent again at once, attempts counted from zero.
#[utoipa::path(
    post,
    path = "/api/v1/admin/webhooks/deliveries/{id}/resend",
    tag = "admin",
    security(("admin_session" = [])),
    params(("id" = String, Path, description = "The delivery's id."), CsrfHeader),
    responses(
        (status = 202, description = "Queued to be sent again.", body = Resent),
        AdminActionErrors,
    )
)]
pub async fn post_api_resend_delivery(
    _admin: AdminWrite,
    state: web::Data<AppState>,
    address: IdPath<DeliveryAddress>,
) -> Result<HttpResponse, AppError> {
    let id = address.id()?;
    if !db::resend(&state.db, id).await? {
        return Err(AppError::not_found("No such delivery."));
    }
    Ok(HttpResponse::Accepted().json(Resent {
        id,
        status: "pending",
    }))
}

/// `sku`, of a product that exists; 404 otherwise.
async fn existing(state: &AppState, sku: Sku) -> Result<Sku, AppError> {
    catalog::db::find_product(&state.db, &sku)
        .await?
        .ok_or_else(|| no_product(sku.as_str()))?;
    Ok(sku)
}

#[cfg(test)]
mod tests {
    use crate::http::contract::inputs::tests::{TEXTS, agrees};
    use crate::http::contract::inputs::{one_of, plain_line};

    // The document's patterns for what this module's helpers check (beside them, which
    // the document's module cannot see).
    #[test]
    fn the_reason_and_status_patterns_are_their_parsers() {
        let mut samples: Vec<String> = TEXTS.iter().map(|s| s.to_string()).collect();
        for n in [499, 500, 501] {
            samples.push("x".repeat(n));
            samples.push(format!("  {}\u{a0}", "x".repeat(n)));
        }
        let samples: Vec<&str> = samples.iter().map(String::as_str).collect();
        agrees(
            &plain_line(1, 500),
            |s| crate::inventory::change::reason(s).is_ok(),
            &samples,
        );
        agrees(
            &one_of(["pending", "sent", "failed"], true),
            |s| super::status_filter(Some(s)).is_ok(),
            &["", " ", "sent", "\tfailed ", "Sent", "pendingx", "all"],
        );
    }
}
