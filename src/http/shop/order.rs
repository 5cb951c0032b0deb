//! The order confirmation page (`/orders/{id}`), where checkout ends.

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use askama::Template;
use uuid::Uuid;

use crate::error::AppError;
use crate::http::{AppState, Chrome, html};
use crate::orders::{self, Order};

#[derive(Template)]
#[template(path = "shop/order.html")]
struct OrderPage {
    chrome: Chrome,
    order: Order,
    /// Receipts go out by SMTP, so the page may promise one.
    receipt: bool,
}

pub async fn get_order(
    req: HttpRequest,
    state: web::Data<AppState>,
    path: web::Path<String>,
) -> Result<HttpResponse, AppError> {
    let not_found = || AppError::not_found("We have no order with this number.");
    let id = Uuid::parse_str(&path).map_err(|_| not_found())?;
    let order = orders::db::find_order(&state.db, id)
        .await?
        .ok_or_else(not_found)?;
    html(
        StatusCode::OK,
        &OrderPage {
            chrome: Chrome::new(&req),
            order,
            receipt: state.settings.smtp_url.is_some(),
        },
    )
}
