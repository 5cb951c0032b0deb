//! Orders: the list with its filters, an order's page and its cancel form (applied once
//! per form).

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use askama::Template;
use serde::Deserialize;
use uuid::Uuid;

use super::once::{Apart, DoneQuery, FormOutcome, apply_form, done_notice, form_key, new_form_key};
use super::{PAGE, Page, page_chrome};
use crate::admin::Admin;
use crate::catalog::Sku;
use crate::error::AppError;
use crate::http::paths::{IdPath, Names};
use crate::http::{AppState, Chrome, csrf, html};
use crate::idempotency::StoredResponse;
use crate::orders::db::{OrderFilter, OrderSummary};
use crate::orders::{self, Cancelled, Order, OrderStatus};

#[derive(Template)]
#[template(path = "admin/orders.html")]
struct OrdersPage {
    chrome: Chrome,
    orders: Vec<OrderSummary>,
    search: String,
    status: String,
    sku: String,
    date: String,
    page: i64,
    pages: i64,
    query: String,
}

#[derive(Deserialize)]
pub struct OrdersQuery {
    q: Option<String>,
    status: Option<String>,
    sku: Option<String>,
    date: Option<String>,
    page: Option<i64>,
}

pub async fn get_orders(
    req: HttpRequest,
    admin: Admin,
    state: web::Data<AppState>,
    query: web::Query<OrdersQuery>,
) -> Result<HttpResponse, AppError> {
    let text = |v: &Option<String>| {
        v.as_deref()
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
    };
    let status = match text(&query.status) {
        Some(raw) => Some(
            OrderStatus::parse(&raw)
                .ok_or_else(|| AppError::Unprocessable("Status is placed or cancelled.".into()))?,
        ),
        None => None,
    };
    let sku = match text(&query.sku) {
        Some(raw) => Some(
            Sku::parse(&raw)
                .map_err(|e| AppError::Unprocessable(e.to_string()))?
                .to_string(),
        ),
        None => None,
    };
    let date =
        match text(&query.date) {
            Some(raw) => Some(chrono::NaiveDate::parse_from_str(&raw, "%Y-%m-%d").map_err(
                |_| AppError::Unprocessable(format!("{raw:?} is not a date like 2026-11-30.")),
            )?),
            None => None,
        };
    let search = text(&query.q).map(|q| q.chars().take(200).collect::<String>());
    let page = Page::of(query.page, PAGE);
    let filter = OrderFilter {
        search: search.clone(),
        status,
        sku: sku.clone(),
        date,
    };
    let (orders, total) =
        orders::reports::list(&state.db, &filter, page.size, page.offset()).await?;
    let query_string = format!(
        "q={}&status={}&sku={}&date={}",
        crate::error::percent_encode(search.as_deref().unwrap_or_default()),
        status.map(OrderStatus::as_str).unwrap_or_default(),
        sku.clone().unwrap_or_default(),
        date.map(|d| d.to_string()).unwrap_or_default()
    );
    let page = OrdersPage {
        chrome: page_chrome(&req, &admin),
        orders,
        search: search.unwrap_or_default(),
        status: status.map(OrderStatus::as_str).unwrap_or_default().into(),
        sku: sku.unwrap_or_default(),
        date: date.map(|d| d.to_string()).unwrap_or_default(),
        page: page.number,
        pages: page.count(total),
        query: query_string,
    };
    html(StatusCode::OK, &page)
}

#[derive(Template)]
#[template(path = "admin/order.html")]
struct OrderPage {
    chrome: Chrome,
    order: Order,
    notice: Option<String>,
    /// A fresh idempotency key for the cancel form.
    cancel_key: String,
}

async fn load_order(state: &AppState, id: Uuid) -> Result<Order, AppError> {
    orders::db::find_order(&state.db, id)
        .await?
        .ok_or_else(|| OrderAddress::missing(&id.to_string()))
}

/// An order's address in the admin: `/admin/orders/{id}…`.
pub struct OrderAddress;

impl Names for OrderAddress {
    type Id = uuid::Uuid;

    fn missing(raw: &str) -> AppError {
        AppError::not_found(format!("No order with id {}.", crate::text::quoted(raw)))
    }
}

/// An order, with its cancel form; after cancelling, `?done=<key>` shows what it did.
pub async fn get_order(
    req: HttpRequest,
    admin: Admin,
    state: web::Data<AppState>,
    address: IdPath<OrderAddress>,
    query: web::Query<DoneQuery>,
) -> Result<HttpResponse, AppError> {
    let id = address.id()?;
    let order = load_order(&state, id).await?;
    let page = format!("/admin/orders/{}", order.id);
    let page = OrderPage {
        chrome: page_chrome(&req, &admin),
        notice: done_notice(&state, &admin, &page, query.done.as_deref()).await?,
        order,
        cancel_key: new_form_key(),
    };
    html(StatusCode::OK, &page)
}

/// The forms that act on one thing (cancel an order, release a hold).
#[derive(Deserialize)]
pub struct ActionForm {
    #[serde(default)]
    pub(super) csrf: String,
    #[serde(default)]
    pub(super) key: String,
}

/// Cancels an order (its units come back through `cancel` ledger rows). Applied once per
/// form; cancelling an order that is already cancelled changes nothing and says so.
pub async fn post_cancel(
    admin: Admin,
    state: web::Data<AppState>,
    address: IdPath<OrderAddress>,
    form: web::Form<ActionForm>,
) -> Result<HttpResponse, AppError> {
    csrf::check_admin(&admin, &form.csrf)?;
    let key = form_key(&form.key)?;
    let id = address.id()?;
    let order = load_order(&state, id).await?;
    let shared = state.clone().into_inner();
    let actor = admin.username.clone();
    apply_form(
        &state,
        &admin,
        &key,
        &("cancel", order.id),
        Apart(async move || -> Result<StoredResponse, AppError> {
            // The cancel commits on its own, and only once per order however often it is
            // asked (it locks the order and checks its status); the key is completed just
            // after, so a retry that finds the key stale and takes it over is told
            // "already cancelled".
            let notice = match orders::cancel(&shared.db, order.id, &actor, "cancelled by an admin")
                .await?
            {
                Some(Cancelled::Now) => {
                    for line in &order.lines {
                        shared.stock_changed(&line.sku).await;
                    }
                    let paid = match &shared.payments {
                        Some(payments) => payments.order_cancelled(order.id).await?,
                        None => None,
                    };
                    match paid {
                        Some(said) => {
                            format!("Order cancelled; its units are back in stock. {said}")
                        }
                        None => "Order cancelled; its units are back in stock.".into(),
                    }
                }
                Some(Cancelled::Already) => {
                    "This order was already cancelled; nothing changed.".into()
                }
                None => return Err(AppError::not_found("No such order.")),
            };
            let outcome = FormOutcome {
                page: format!("/admin/orders/{}", order.id),
                notice,
            };
            Ok(outcome.stored())
        }),
    )
    .await?
}
