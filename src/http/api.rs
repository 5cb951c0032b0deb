//! The JSON API under `/api/v1`. Errors are RFC 9457 problem documents (rendered by the
//! middleware); the contract is in DESIGN.md section 6.

use actix_web::http::header;
use actix_web::{HttpRequest, HttpResponse, web};
use serde::Serialize;
use uuid::Uuid;

use super::AppState;
use super::middleware::problem_response;
use crate::catalog::{self, ProductView, Sku};
use crate::error::AppError;
use crate::idempotency::{IdempotencyKey, Scope};
use crate::orders::{self, OrderRequest, Placement};

/// Header that marks a response replayed from an idempotency record.
pub const REPLAYED_HEADER: &str = "Idempotency-Replayed";

#[derive(Serialize)]
struct ProductJson {
    sku: String,
    name: String,
    description: String,
    price_cents: i64,
    available: i32,
}

impl From<ProductView> for ProductJson {
    fn from(p: ProductView) -> Self {
        Self {
            sku: p.sku,
            name: p.name,
            description: p.description,
            price_cents: p.price_cents,
            available: p.available.max(0),
        }
    }
}

pub async fn get_products(state: web::Data<AppState>) -> Result<HttpResponse, AppError> {
    let products: Vec<ProductJson> = catalog::db::list_products(&state.db)
        .await?
        .into_iter()
        .map(ProductJson::from)
        .collect();
    Ok(HttpResponse::Ok().json(products))
}

pub async fn get_product(
    state: web::Data<AppState>,
    path: web::Path<String>,
) -> Result<HttpResponse, AppError> {
    let not_found = || AppError::not_found(format!("No product with SKU {path:?}."));
    let sku = Sku::parse(&path).map_err(|_| not_found())?;
    let product = catalog::db::find_product(&state.db, &sku)
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
    let key = idempotency_key(&req)?;
    let request = OrderRequest::from_json(&body, state.settings.max_line_quantity)?;
    let placement = orders::place_order(state.order_deps(), Scope::Api, &key, &request).await?;
    Ok(match placement {
        Placement::Placed { order, replayed } => {
            let mut res = HttpResponse::Created();
            res.insert_header((header::LOCATION, format!("/api/v1/orders/{}", order.id)));
            if replayed {
                res.insert_header((REPLAYED_HEADER, "true"));
            }
            res.json(order)
        }
        Placement::Insufficient {
            shortages,
            replayed,
        } => {
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
            let mut res = problem_response(
                &req,
                actix_web::http::StatusCode::CONFLICT,
                &format!("Not enough stock. {detail}."),
                Some(serde_json::json!({ "shortages": shortages })),
            );
            if replayed {
                res.headers_mut().insert(
                    header::HeaderName::from_static("idempotency-replayed"),
                    header::HeaderValue::from_static("true"),
                );
            }
            res
        }
    })
}

pub async fn get_order(
    state: web::Data<AppState>,
    path: web::Path<String>,
) -> Result<HttpResponse, AppError> {
    let not_found = || AppError::not_found(format!("No order with id {path:?}."));
    let id = Uuid::parse_str(&path).map_err(|_| not_found())?;
    let order = orders::db::find_order(&state.db, id)
        .await?
        .ok_or_else(not_found)?;
    Ok(HttpResponse::Ok().json(order))
}
