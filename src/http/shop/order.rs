//! The order confirmation page (`/orders/{id}`), where checkout ends.

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use askama::Template;

use crate::error::AppError;
use crate::http::paths::{IdPath, Names};
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
    address: IdPath<OrderAddress>,
) -> Result<HttpResponse, AppError> {
    let id = address.id()?;
    let not_found = || OrderAddress::missing("");
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

/// An order's page: `/orders/{id}`.
pub struct OrderAddress;

impl Names for OrderAddress {
    type Id = uuid::Uuid;

    fn missing(_: &str) -> AppError {
        AppError::not_found("We have no order with this number.")
    }
}
