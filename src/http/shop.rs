//! The shopping flow in pages: cart, checkout, order confirmation.
//!
//! The cart lives in a cookie. The checkout form carries its lines and a fresh idempotency
//! key in hidden fields, so submitting it twice, refreshing the POST, or going back and
//! submitting again all name the same order, and the server answers with that one order.

use std::time::{Duration, Instant};

use actix_web::cookie::{Cookie, SameSite};
use actix_web::http::{StatusCode, header};
use actix_web::{HttpRequest, HttpResponse, web};
use askama::Template;
use serde::Deserialize;
use uuid::Uuid;

use super::{AppState, Chrome};
use crate::catalog::{Sku, format_cents};
use crate::error::AppError;
use crate::idempotency::{IdempotencyKey, Scope};
use crate::orders::{
    self, MAX_LINES, Order, OrderError, OrderRequest, Placement, Quantity, Shortage,
};

/// Name of the cart cookie.
pub const CART_COOKIE: &str = "cart";

/// A cart: `(SKU, quantity)` pairs, encoded as `SKU~2|SKU~1` (cookie-safe characters).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Cart {
    pub lines: Vec<(Sku, i32)>,
}

impl Cart {
    /// Reads an encoded cart, skipping entries that do not parse.
    pub fn decode(raw: &str) -> Self {
        let lines = raw
            .split('|')
            .filter_map(|entry| {
                let (sku, n) = entry.split_once('~')?;
                let n: i32 = n.parse().ok().filter(|n| *n > 0)?;
                Some((Sku::parse(sku).ok()?, n))
            })
            .take(MAX_LINES)
            .collect();
        Self { lines }
    }

    pub fn encode(&self) -> String {
        self.lines
            .iter()
            .map(|(sku, n)| format!("{sku}~{n}"))
            .collect::<Vec<_>>()
            .join("|")
    }

    pub fn from_request(req: &HttpRequest) -> Self {
        req.cookie(CART_COOKIE)
            .map(|c| Self::decode(c.value()))
            .unwrap_or_default()
    }

    pub fn units(&self) -> i32 {
        self.lines.iter().map(|(_, n)| n).sum()
    }

    pub fn quantity_of(&self, sku: &Sku) -> i32 {
        self.lines
            .iter()
            .find(|(s, _)| s == sku)
            .map_or(0, |(_, n)| *n)
    }

    /// Sets the quantity of `sku`; 0 removes it.
    pub fn set(&mut self, sku: Sku, quantity: i32) {
        self.lines.retain(|(s, _)| *s != sku);
        if quantity > 0 {
            self.lines.push((sku, quantity));
        }
    }

    fn cookie(&self) -> Cookie<'static> {
        let mut cookie = Cookie::build(CART_COOKIE, self.encode())
            .path("/")
            .http_only(true)
            .same_site(SameSite::Lax)
            .finish();
        if self.lines.is_empty() {
            cookie.make_removal();
        }
        cookie
    }
}

fn see_other(location: &str) -> HttpResponse {
    HttpResponse::SeeOther()
        .insert_header((header::LOCATION, location))
        .finish()
}

fn max_quantity(state: &AppState) -> i32 {
    state.settings.max_line_quantity
}

#[derive(Deserialize)]
pub struct CartForm {
    sku: String,
    quantity: String,
}

/// Adds units of a product to the cart, then shows the cart.
pub async fn post_cart_add(
    req: HttpRequest,
    state: web::Data<AppState>,
    form: web::Form<CartForm>,
) -> Result<HttpResponse, AppError> {
    let sku = parse_known_sku(&state, &form.sku).await?;
    let mut cart = Cart::from_request(&req);
    let quantity = Quantity::parse(&form.quantity, max_quantity(&state))?;
    let total = cart.quantity_of(&sku) + quantity.get();
    let total = Quantity::new(i64::from(total), max_quantity(&state)).map_err(|_| {
        AppError::Unprocessable(format!(
            "You can buy at most {} of one product per order; your cart already has {}.",
            max_quantity(&state),
            cart.quantity_of(&sku)
        ))
    })?;
    if cart.lines.len() >= MAX_LINES && cart.quantity_of(&sku) == 0 {
        return Err(AppError::Unprocessable(format!(
            "A cart holds at most {MAX_LINES} different products."
        )));
    }
    cart.set(sku, total.get());
    Ok(HttpResponse::SeeOther()
        .insert_header((header::LOCATION, "/cart"))
        .cookie(cart.cookie())
        .finish())
}

/// Changes the quantity of a cart line; 0 removes it.
pub async fn post_cart_update(
    req: HttpRequest,
    state: web::Data<AppState>,
    form: web::Form<CartForm>,
) -> Result<HttpResponse, AppError> {
    let sku = Sku::parse(&form.sku).map_err(|e| AppError::Unprocessable(e.to_string()))?;
    let mut cart = Cart::from_request(&req);
    let quantity = match form.quantity.trim() {
        "0" => 0,
        raw => Quantity::parse(raw, max_quantity(&state))?.get(),
    };
    cart.set(sku, quantity);
    Ok(HttpResponse::SeeOther()
        .insert_header((header::LOCATION, "/cart"))
        .cookie(cart.cookie())
        .finish())
}

async fn parse_known_sku(state: &AppState, raw: &str) -> Result<Sku, AppError> {
    let sku = Sku::parse(raw).map_err(|e| AppError::Unprocessable(e.to_string()))?;
    crate::catalog::db::find_product(&state.db, &sku)
        .await?
        .ok_or_else(|| AppError::not_found(format!("We have no product with SKU {sku}.")))?;
    Ok(sku)
}

/// A cart line as the cart and checkout pages show it.
pub struct CartLine {
    pub sku: String,
    pub name: String,
    pub quantity: i32,
    pub price_cents: i64,
    pub available: i32,
}

impl CartLine {
    pub fn price(&self) -> String {
        format_cents(self.price_cents)
    }

    pub fn line_total(&self) -> String {
        format_cents(self.price_cents * i64::from(self.quantity))
    }

    pub fn short(&self) -> bool {
        self.available < self.quantity
    }
}

/// The cart's lines with current names, prices and availability; unknown SKUs dropped.
async fn cart_lines(state: &AppState, cart: &Cart) -> Result<Vec<CartLine>, AppError> {
    let skus: Vec<Sku> = cart.lines.iter().map(|(s, _)| s.clone()).collect();
    let products = orders::db::products_for(&state.db, &skus).await?;
    Ok(cart
        .lines
        .iter()
        .filter_map(|(sku, quantity)| {
            let p = products.iter().find(|p| p.sku == sku.as_str())?;
            Some(CartLine {
                sku: p.sku.clone(),
                name: p.name.clone(),
                quantity: *quantity,
                price_cents: p.price_cents,
                available: p.available.max(0),
            })
        })
        .collect())
}

fn total(lines: &[CartLine]) -> String {
    format_cents(
        lines
            .iter()
            .map(|l| l.price_cents * i64::from(l.quantity))
            .sum(),
    )
}

#[derive(Template)]
#[template(path = "shop/cart.html")]
struct CartPage {
    chrome: Chrome,
    lines: Vec<CartLine>,
    total: String,
    max_quantity: i32,
}

pub async fn get_cart(
    req: HttpRequest,
    state: web::Data<AppState>,
) -> Result<HttpResponse, AppError> {
    let lines = cart_lines(&state, &Cart::from_request(&req)).await?;
    let page = CartPage {
        chrome: Chrome::new(&req),
        total: total(&lines),
        lines,
        max_quantity: max_quantity(&state),
    };
    html(StatusCode::OK, &page)
}

#[derive(Template)]
#[template(path = "shop/checkout.html")]
struct CheckoutPage {
    chrome: Chrome,
    lines: Vec<CartLine>,
    total: String,
    encoded_lines: String,
    key: String,
    name: String,
    email: String,
    error: Option<String>,
    shortages: Vec<Shortage>,
}

impl CheckoutPage {
    fn any_short(&self) -> bool {
        self.lines.iter().any(CartLine::short)
    }
}

async fn checkout_page(
    req: &HttpRequest,
    state: &AppState,
    cart: &Cart,
    form: Option<&CheckoutForm>,
    error: Option<String>,
    shortages: Vec<Shortage>,
) -> Result<CheckoutPage, AppError> {
    let lines = cart_lines(state, cart).await?;
    Ok(CheckoutPage {
        chrome: Chrome::new(req),
        total: total(&lines),
        encoded_lines: cart.encode(),
        lines,
        // Every rendering of the form is a new attempt with a new key.
        key: IdempotencyKey::generate().as_str().to_string(),
        name: form.map(|f| f.name.clone()).unwrap_or_default(),
        email: form.map(|f| f.email.clone()).unwrap_or_default(),
        error,
        shortages,
    })
}

pub async fn get_checkout(
    req: HttpRequest,
    state: web::Data<AppState>,
) -> Result<HttpResponse, AppError> {
    let cart = Cart::from_request(&req);
    if cart.lines.is_empty() {
        return Ok(see_other("/cart"));
    }
    let page = checkout_page(&req, &state, &cart, None, None, Vec::new()).await?;
    html(StatusCode::OK, &page)
}

#[derive(Deserialize)]
pub struct CheckoutForm {
    key: String,
    lines: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    email: String,
}

/// How long a repeated submission waits for the first one to finish.
const WAIT_FOR_FIRST_SUBMISSION: Duration = Duration::from_secs(10);

#[tracing::instrument(skip_all)]
pub async fn post_checkout(
    req: HttpRequest,
    state: web::Data<AppState>,
    form: web::Form<CheckoutForm>,
) -> Result<HttpResponse, AppError> {
    let key = IdempotencyKey::parse(&form.key).map_err(|_| {
        AppError::BadRequest("This checkout form is damaged; please start checkout again.".into())
    })?;
    let cart = Cart::decode(&form.lines);
    if cart.lines.is_empty() {
        return Err(AppError::Unprocessable(
            "This checkout form has no products in it; please start checkout again.".into(),
        ));
    }
    let invalid = |message: String| async {
        let page =
            checkout_page(&req, &state, &cart, Some(&form), Some(message), Vec::new()).await?;
        html(StatusCode::UNPROCESSABLE_ENTITY, &page)
    };
    if form.name.trim().is_empty() {
        return invalid("Please tell us your name.".into()).await;
    }
    if form.email.trim().is_empty() {
        return invalid("Please give an email address for the receipt.".into()).await;
    }
    let lines = cart
        .lines
        .iter()
        .map(|(s, n)| (s.clone(), i64::from(*n)))
        .collect();
    let request = match OrderRequest::new(
        lines,
        Some(&form.email),
        Some(&form.name),
        max_quantity(&state),
    ) {
        Ok(request) => request,
        Err(e) => return invalid(crate::error::sentence(&e.0)).await,
    };

    // A second submission of the same form waits for the first and shows its order.
    let started = Instant::now();
    let placement = loop {
        match orders::place_order(state.order_deps(), Scope::Page, &key, &request).await {
            Err(OrderError::InFlight) if started.elapsed() < WAIT_FOR_FIRST_SUBMISSION => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(OrderError::KeyReused) => {
                return invalid(
                    "This checkout form was already used for a different order. \
                     Please check the order below and submit again."
                        .into(),
                )
                .await;
            }
            other => break other?,
        }
    };
    match placement {
        Placement::Placed { order, .. } => Ok(HttpResponse::SeeOther()
            .insert_header((header::LOCATION, format!("/orders/{}", order.id)))
            .cookie(Cart::default().cookie())
            .finish()),
        Placement::Insufficient { shortages, .. } => {
            let page = checkout_page(
                &req,
                &state,
                &cart,
                Some(&form),
                Some("Some products sold out while you were checking out.".into()),
                shortages,
            )
            .await?;
            html(StatusCode::CONFLICT, &page)
        }
    }
}

#[derive(Template)]
#[template(path = "shop/order.html")]
struct OrderPage {
    chrome: Chrome,
    order: Order,
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
        },
    )
}

/// Renders a page with a status of its own choosing.
fn html(status: StatusCode, page: &impl Template) -> Result<HttpResponse, AppError> {
    let body = page.render().map_err(|e| AppError::Internal(e.into()))?;
    Ok(HttpResponse::build(status)
        .content_type("text/html; charset=utf-8")
        .body(body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn carts_round_trip_through_their_cookie_encoding() {
        let mut cart = Cart::default();
        cart.set(Sku::parse("KB-ALPINE-75").unwrap(), 2);
        cart.set(Sku::parse("MS-DRIFT-WL").unwrap(), 1);
        assert_eq!(cart.encode(), "KB-ALPINE-75~2|MS-DRIFT-WL~1");
        assert_eq!(Cart::decode(&cart.encode()), cart);
        assert_eq!(cart.units(), 3);
        cart.set(Sku::parse("KB-ALPINE-75").unwrap(), 0);
        assert_eq!(cart.encode(), "MS-DRIFT-WL~1");
    }

    #[test]
    fn damaged_cart_entries_are_skipped() {
        let cart = Cart::decode("A-1~2|garbage|B 2~1|C-3~-1|D-4~x|E-5~3");
        assert_eq!(cart.encode(), "A-1~2|E-5~3");
    }
}
