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

#[derive(Serialize)]
struct ProductJson {
    sku: String,
    name: String,
    description: String,
    price_cents: i64,
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

#[tracing::instrument(skip_all)]
pub async fn post_orders(
    req: HttpRequest,
    state: web::Data<AppState>,
    body: web::Json<serde_json::Value>,
) -> Result<HttpResponse, AppError> {
    place(req, state, body, Scope::Api).await
}

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
#[derive(Debug, Default, serde::Deserialize)]
pub struct ConfirmBody {
    email: Option<String>,
    name: Option<String>,
}

#[tracing::instrument(skip_all)]
pub async fn post_hold_confirm(
    req: HttpRequest,
    state: web::Data<AppState>,
    path: web::Path<String>,
    body: web::Bytes,
) -> Result<HttpResponse, AppError> {
    let id = own_hold(&req, &state, &path).await?;
    // The body is optional; when present it must be a JSON object.
    let body: ConfirmBody = if body.iter().all(u8::is_ascii_whitespace) {
        ConfirmBody::default()
    } else {
        serde_json::from_slice(&body)
            .map_err(|e| AppError::BadRequest(format!("The body is not valid JSON: {e}")))?
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
