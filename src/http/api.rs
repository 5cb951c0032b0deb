//! The JSON API under `/api/v1`. Errors are RFC 9457 problem documents (rendered by the
//! middleware); the README's "HTTP surface" lists the contract.
//!
//! Products are public. Orders and holds belong to their caller ([`limits::caller`]): its
//! idempotency keys are its own (stored as `<owner>:<key>`), and it reads, confirms and
//! releases only what it placed; anything else is answered 404, as if it did not exist.

use actix_web::http::{StatusCode, header};
use actix_web::{HttpRequest, HttpResponse, web};
use serde::Serialize;
use uuid::Uuid;

use super::limits::{self, limit_placement};
use super::middleware::problem_response;
use super::openapi::{
    BadRequest, Conflict, Forbidden, NotFound, RequestTimeout, TooLarge, TooManyRequests,
    Unauthorized, Unavailable, Unprocessable, UnsupportedMediaType,
};
use super::{AppState, detached};
use crate::catalog::{ProductView, Sku};
use crate::checkout::{self, HoldOutcome, OrderOutcome, OrderRequest, Shopper};
use crate::clients::{self, Caller};
use crate::error::AppError;
use crate::holds;
use crate::idempotency::{IdempotencyKey, Scope};
use crate::orders::{self, Shortage};

/// Header that marks a response replayed from an idempotency record.
pub const REPLAYED_HEADER: &str = "Idempotency-Replayed";

/// A product as the API shows it.
#[derive(Serialize, utoipa::ToSchema)]
#[schema(as = Product)]
struct ProductJson {
    sku: String,
    name: String,
    description: String,
    price_cents: i64,
    /// Units that can be ordered now: on hand less those held in checkouts.
    #[schema(minimum = 0)]
    available: i32,
    /// At most this many per customer; `null` when there is no limit.
    purchase_limit: Option<i32>,
    category: Option<String>,
    /// The picture's address (`null`: none); `…/thumb` for the thumbnail.
    image_url: Option<String>,
}

impl From<ProductView> for ProductJson {
    fn from(p: ProductView) -> Self {
        let image_url = p
            .image_version()
            .map(|v| format!("/products/{}/image?v={v}", p.sku));
        Self {
            image_url,
            sku: p.sku,
            name: p.name,
            description: p.description,
            price_cents: p.price_cents,
            available: p.available.max(0),
            purchase_limit: p.purchase_limit,
            category: p.category,
        }
    }
}

/// Products per page when the API is asked for a `page`.
const API_PER_PAGE: i64 = 100;

/// The product list: every active product by name, or with `?q=`, `?category=`, `?sort=`
/// a search; `?page=` pages it ([`API_PER_PAGE`] a page). The body stays the plain array
/// clients rely on; `X-Total-Count` says how many match, and `Link: <…>; rel="next"`
/// points to the next page when there is one.
#[utoipa::path(
    get,
    path = "/api/v1/products",
    tag = "products",
    params(
        ("q" = Option<String>, Query, max_length = 100,
            description = "Search words (name and description, prefix match); one line."),
        ("category" = Option<String>, Query, max_length = 40,
            description = "Only this category (as the admin named it)."),
        ("sort" = Option<String>, Query,
            pattern = "^(relevance|name|price-low|price-high|newest)?$",
            description = "`relevance` (the default), `name`, `price-low`, `price-high` or \
                `newest`."),
        ("page" = Option<String>, Query, pattern = "^\\s*[0-9]*\\s*$",
            description = "Pages of 100, from 1 to 10000 (else 422); without it (or empty), \
                every match."),
    ),
    responses(
        (status = 200, description = "The matching products, by name or as sorted.",
            body = [ProductJson],
            headers(
                ("X-Total-Count" = i64, description = "How many products match."),
                ("Link" = String,
                    description = "`<…>; rel=\"next\"`: the next page, while there is one \
                        (with `page` only)."),
            )),
        (status = 400, response = BadRequest),
        (status = 422, response = Unprocessable),
        (status = 503, response = Unavailable),
    )
)]
#[tracing::instrument(skip_all)]
pub async fn get_products(
    req: HttpRequest,
    state: web::Data<AppState>,
    query: web::Query<super::pages::BrowseParams>,
) -> Result<HttpResponse, AppError> {
    let browse = query.parse()?;
    // Without `?page=` the whole list, as before paging existed.
    let per_page = match query.page {
        Some(_) => API_PER_PAGE,
        None => i64::MAX,
    };
    let listing = state
        .catalog
        .browse(state.read_pool(), &browse, per_page)
        .await?;
    let mut res = HttpResponse::Ok();
    res.insert_header(("X-Total-Count", listing.total));
    if query.page.is_some() && browse.page * per_page < listing.total {
        let next = super::pages::BrowseParams::url_for(
            req.path(),
            &crate::catalog::browse::Browse {
                page: browse.page + 1,
                ..browse.clone()
            },
        );
        res.insert_header((header::LINK, format!("<{next}>; rel=\"next\"")));
    }
    let products: Vec<ProductJson> = listing
        .products
        .into_iter()
        .map(ProductJson::from)
        .collect();
    Ok(res.json(products))
}

/// One product by SKU (any case).
#[utoipa::path(
    get,
    path = "/api/v1/products/{sku}",
    tag = "products",
    params(("sku" = String, Path, example = "KB-ALPINE-75",
        description = "The product's SKU (any case).")),
    responses(
        (status = 200, description = "The product.", body = ProductJson),
        (status = 404, response = NotFound),
        (status = 503, response = Unavailable),
    )
)]
pub async fn get_product(
    state: web::Data<AppState>,
    path: web::Path<String>,
) -> Result<HttpResponse, AppError> {
    let not_found = || AppError::not_found(format!("No product with SKU {path:?}."));
    let sku = Sku::parse(&path).map_err(|_| not_found())?;
    let product = state
        .catalog
        .product(state.read_pool(), &sku)
        .await?
        .ok_or_else(not_found)?;
    Ok(HttpResponse::Ok().json(ProductJson::from(product)))
}

/// The body of an order or a hold.
#[derive(utoipa::ToSchema)]
#[schema(example = json!({
    "lines": [{"sku": "KB-ALPINE-75", "quantity": 1}],
    "email": "ada@example.com"
}))]
#[allow(dead_code)] // read as JSON by `OrderRequest::from_json`; this is its shape
struct OrderBody {
    /// One line per SKU.
    #[schema(min_items = 1)]
    lines: Vec<LineBody>,
    /// Where the receipt goes.
    #[schema(max_length = 254)]
    email: Option<String>,
    /// The customer's name; one line.
    #[schema(max_length = 200)]
    name: Option<String>,
}

/// One line of an order or a hold.
#[derive(utoipa::ToSchema)]
#[allow(dead_code)]
struct LineBody {
    /// The product's SKU (any case).
    #[schema(example = "KB-ALPINE-75")]
    sku: String,
    /// Units, from 1 to the shop's cap per line (`STOCKADE_MAX_LINE_QUANTITY`, 10 unless set).
    #[schema(minimum = 1)]
    quantity: i64,
}

/// The `Idempotency-Key` request header, as the contract describes it.
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Header)]
#[allow(dead_code)]
pub(crate) struct IdempotencyKeyHeader {
    /// A unique value per order (printable ASCII, up to 255 characters); send the same value
    /// when retrying it. Scoped to the API client.
    #[param(
        rename = "Idempotency-Key",
        min_length = 1,
        max_length = 255,
        pattern = "^[\\x20-\\x7e]+$",
        example = "order-2026-0001"
    )]
    idempotency_key: String,
}

/// The `Idempotency-Key` header, required on every POST that creates something.
pub fn idempotency_key(req: &HttpRequest) -> Result<IdempotencyKey, AppError> {
    let value = req.headers().get("Idempotency-Key").ok_or_else(|| {
        AppError::BadRequest(
            "The Idempotency-Key header is required: send a unique value per order, \
             and the same value when you retry it."
                .into(),
        )
    })?;
    let text = value.to_str().map_err(|_| {
        AppError::BadRequest(
            "The Idempotency-Key may contain only printable ASCII characters.".into(),
        )
    })?;
    IdempotencyKey::parse(text)
        .map_err(|e| AppError::BadRequest(crate::error::sentence(&e.to_string())))
}

/// Places an order: every line or none, never more than is in stock. A retry with the same
/// `Idempotency-Key` and body answers the first response again (`Idempotency-Replayed`).
#[utoipa::path(
    post,
    path = "/api/v1/orders",
    tag = "orders",
    security(("api_key" = [])),
    params(IdempotencyKeyHeader),
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
        (status = 400, response = BadRequest),
        (status = 401, response = Unauthorized),
        (status = 403, response = Forbidden),
        (status = 408, response = RequestTimeout),
        (status = 409, response = Conflict),
        (status = 413, response = TooLarge),
        (status = 415, response = UnsupportedMediaType),
        (status = 422, response = Unprocessable),
        (status = 429, response = TooManyRequests),
        (status = 503, response = Unavailable),
    )
)]
#[tracing::instrument(skip_all)]
pub async fn post_orders(
    req: HttpRequest,
    state: web::Data<AppState>,
    body: web::Json<serde_json::Value>,
) -> Result<HttpResponse, AppError> {
    place(req, state, body, Scope::Api).await
}

/// Places a checkout hold: the stock is reserved until it expires, is confirmed into an
/// order, or is released. Same body, headers and idempotency as an order.
#[utoipa::path(
    post,
    path = "/api/v1/holds",
    tag = "holds",
    security(("api_key" = [])),
    params(IdempotencyKeyHeader),
    request_body = OrderBody,
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
        (status = 400, response = BadRequest),
        (status = 401, response = Unauthorized),
        (status = 403, response = Forbidden),
        (status = 408, response = RequestTimeout),
        (status = 409, response = Conflict),
        (status = 413, response = TooLarge),
        (status = 415, response = UnsupportedMediaType),
        (status = 422, response = Unprocessable),
        (status = 429, response = TooManyRequests),
        (status = 503, response = Unavailable),
    )
)]
#[tracing::instrument(skip_all)]
pub async fn post_holds(
    req: HttpRequest,
    state: web::Data<AppState>,
    body: web::Json<serde_json::Value>,
) -> Result<HttpResponse, AppError> {
    place(req, state, body, Scope::ApiHold).await
}

/// An order (`Scope::Api`) or a hold (`Scope::ApiHold`) from a JSON body.
async fn place(
    req: HttpRequest,
    state: web::Data<AppState>,
    body: web::Json<serde_json::Value>,
    scope: Scope,
) -> Result<HttpResponse, AppError> {
    let caller = limits::caller(&req, &state).await?;
    limit_placement(&req, &state, Some(&caller)).await?;
    let key = IdempotencyKey::scoped(&caller.owner(), &idempotency_key(&req)?);
    let shopper = Shopper::default().address(super::client_addr(&req, &state.settings));
    let shopper = match &caller {
        Caller::Client(client) => shopper.client(&client.id.to_string()),
        Caller::Anonymous => shopper,
    };
    let request =
        OrderRequest::from_json(&body, state.settings.max_line_quantity)?.placed_by(shopper);
    let state = state.into_inner();
    let placement = detached(async move {
        let deps = state.order_deps();
        match scope {
            Scope::ApiHold => checkout::place_hold(deps, scope, &key, &request)
                .await
                .map(Placement::Hold),
            _ => checkout::place_order(deps, scope, &key, &request)
                .await
                .map(Placement::Order),
        }
    })
    .await??;
    Ok(placement_response(&req, placement))
}

/// What `place` decided, an order's outcome or a hold's.
enum Placement {
    Order(OrderOutcome),
    Hold(HoldOutcome),
}

/// 201 with the order or hold and its `Location`, or 409 naming each short SKU.
fn placement_response(req: &HttpRequest, placement: Placement) -> HttpResponse {
    let (mut res, replayed) = match placement {
        Placement::Order(OrderOutcome::Placed { order, replayed }) => (
            HttpResponse::Created()
                .insert_header((header::LOCATION, format!("/api/v1/orders/{}", order.id)))
                .json(order),
            replayed,
        ),
        Placement::Hold(HoldOutcome::Held { hold, replayed }) => (
            HttpResponse::Created()
                .insert_header((header::LOCATION, format!("/api/v1/holds/{}", hold.id)))
                .json(hold),
            replayed,
        ),
        Placement::Order(OrderOutcome::Insufficient {
            shortages,
            replayed,
        })
        | Placement::Hold(HoldOutcome::Insufficient {
            shortages,
            replayed,
        }) => (insufficient(req, &shortages), replayed),
    };
    if replayed {
        res.headers_mut().insert(
            header::HeaderName::from_static("idempotency-replayed"),
            header::HeaderValue::from_static("true"),
        );
    }
    res
}

fn insufficient(req: &HttpRequest, shortages: &[Shortage]) -> HttpResponse {
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

fn no_hold(path: &str) -> AppError {
    AppError::not_found(format!("No such reservation: no hold with id {path:?}."))
}

/// The id of a hold the caller placed; 404 for any other (whether or not it exists).
async fn own_hold(req: &HttpRequest, state: &AppState, path: &str) -> Result<Uuid, AppError> {
    let caller = limits::caller(req, state).await?;
    let id = Uuid::parse_str(path).map_err(|_| no_hold(path))?;
    if !clients::owns_hold(&state.db, &caller, id).await? {
        return Err(no_hold(path));
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
        (status = 401, response = Unauthorized),
        (status = 404, response = NotFound),
        (status = 503, response = Unavailable),
    )
)]
pub async fn get_hold(
    req: HttpRequest,
    state: web::Data<AppState>,
    path: web::Path<String>,
) -> Result<HttpResponse, AppError> {
    let id = own_hold(&req, &state, &path).await?;
    let hold = holds::db::find_hold(&state.db, id)
        .await?
        .ok_or_else(|| no_hold(&path))?;
    Ok(HttpResponse::Ok().json(hold))
}

/// Optional details for confirming a hold.
#[derive(Debug, Default, serde::Deserialize, utoipa::ToSchema)]
pub struct ConfirmBody {
    /// Where the receipt goes.
    #[schema(max_length = 254)]
    email: Option<String>,
    /// The customer's name; one line.
    #[schema(max_length = 200)]
    name: Option<String>,
}

/// Confirms a hold the caller placed into an order; confirming again answers the same
/// order. After expiry the order is placed from free stock if there is enough (else 409).
#[utoipa::path(
    post,
    path = "/api/v1/holds/{id}/confirm",
    tag = "holds",
    security(("api_key" = [])),
    params(("id" = Uuid, Path, description = "The hold's id.")),
    request_body(content = Option<ConfirmBody>, description = "Optional; may be empty."),
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
        (status = 400, response = BadRequest),
        (status = 401, response = Unauthorized),
        (status = 403, response = Forbidden),
        (status = 404, response = NotFound),
        (status = 408, response = RequestTimeout),
        (status = 409, response = Conflict),
        (status = 413, response = TooLarge),
        (status = 422, response = Unprocessable),
        (status = 503, response = Unavailable),
    )
)]
#[tracing::instrument(skip_all)]
pub async fn post_hold_confirm(
    req: HttpRequest,
    state: web::Data<AppState>,
    path: web::Path<String>,
    body: web::Bytes,
) -> Result<HttpResponse, AppError> {
    let id = own_hold(&req, &state, &path).await?;
    // The body is optional; when present it must be a JSON object (serde alone would also
    // take an array of the fields' values).
    let body: ConfirmBody = if body.iter().all(u8::is_ascii_whitespace) {
        ConfirmBody::default()
    } else {
        let value: serde_json::Value = serde_json::from_slice(&body)
            .map_err(|e| AppError::BadRequest(format!("The body is not valid JSON: {e}")))?;
        if !value.is_object() {
            return Err(AppError::Unprocessable(
                "The body must be a JSON object: {\"email\": …, \"name\": …}, or empty.".into(),
            ));
        }
        serde_json::from_value(value).map_err(|e| {
            AppError::Unprocessable(format!(
                "The body does not fit {{\"email\", \"name\"}}: {e}"
            ))
        })?
    };
    let details = OrderRequest::check_contact(body.email.as_deref(), body.name.as_deref())?;
    let db = state.db.clone();
    let confirmed =
        detached(async move { holds::confirm(&db, id, details.name(), details.email()).await })
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
        Err(holds::HoldError::Insufficient(shortages)) => Ok(insufficient(&req, &shortages)),
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
        (status = 401, response = Unauthorized),
        (status = 403, response = Forbidden),
        (status = 404, response = NotFound),
        (status = 409, response = Conflict),
        (status = 503, response = Unavailable),
    )
)]
pub async fn delete_hold(
    req: HttpRequest,
    state: web::Data<AppState>,
    path: web::Path<String>,
) -> Result<HttpResponse, AppError> {
    let id = own_hold(&req, &state, &path).await?;
    let state = state.into_inner();
    detached(async move { holds::release(&state.db, Some(&state.redis), id, "api").await })
        .await??;
    Ok(HttpResponse::NoContent().finish())
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
        (status = 401, response = Unauthorized),
        (status = 404, response = NotFound),
        (status = 503, response = Unavailable),
    )
)]
pub async fn get_order(
    req: HttpRequest,
    state: web::Data<AppState>,
    path: web::Path<String>,
) -> Result<HttpResponse, AppError> {
    let caller = limits::caller(&req, &state).await?;
    let not_found = || AppError::not_found(format!("No order with id {path:?}."));
    let id = Uuid::parse_str(&path).map_err(|_| not_found())?;
    if !clients::owns_order(&state.db, &caller, id).await? {
        return Err(not_found());
    }
    let order = orders::db::find_order(&state.db, id)
        .await?
        .ok_or_else(not_found)?;
    Ok(HttpResponse::Ok().json(order))
}
