//! The shopping flow in pages: cart, checkout, order confirmation.
//!
//! The cart lives in a cookie. Its "Checkout" button carries the lines and a fresh
//! idempotency key, and places a hold: the stock is the shopper's while they fill in their
//! details, with a countdown. Placing the order confirms the hold; the hold id makes that
//! idempotent, so submitting twice, refreshing the POST, or going back and submitting again
//! all show the same single order. The key is this browser's alone (see [`browser`]),
//! and checkouts count against the address's rate limit, like anonymous API orders.

use std::time::{Duration, Instant};

use actix_web::cookie::{Cookie, SameSite};
use actix_web::http::{StatusCode, header};
use actix_web::{HttpRequest, HttpResponse, web};
use askama::Template;
use serde::Deserialize;
use uuid::Uuid;

use super::{AppState, Chrome, csrf, detached, html, see_other};
use crate::catalog::{Sku, format_cents};
use crate::checkout::{self, HoldOutcome, MAX_LINES, OrderError, OrderRequest, Quantity, Shopper};
use crate::error::AppError;
use crate::holds::{self, Hold, HoldError};
use crate::idempotency::{IdempotencyKey, Scope};
use crate::orders::{self, Order, Shortage};

/// Most units of one product a cart line may carry.
const MAX_CART_QUANTITY: i32 = 10_000;

/// Name of the cart cookie (its name: [`super::cookie_name`]).
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
                // A cookie is client input: quantities beyond any order's reach are dropped.
                let n: i32 = n
                    .parse()
                    .ok()
                    .filter(|n| (1..=MAX_CART_QUANTITY).contains(n))?;
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
        req.cookie(super::cookie_name(req, CART_COOKIE))
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

    fn cookie(&self, req: &HttpRequest) -> Cookie<'static> {
        let mut cookie = super::cookie(req, CART_COOKIE, self.encode(), SameSite::Lax);
        if self.lines.is_empty() {
            cookie.make_removal();
        }
        cookie
    }
}

fn max_quantity(state: &AppState) -> i32 {
    state.settings.max_line_quantity
}

#[derive(Deserialize)]
pub struct CartForm {
    #[serde(default)]
    csrf: String,
    sku: String,
    quantity: String,
}

/// Adds units of a product to the cart, then shows the cart.
pub async fn post_cart_add(
    req: HttpRequest,
    state: web::Data<AppState>,
    form: web::Form<CartForm>,
) -> Result<HttpResponse, AppError> {
    csrf::check_storefront(&req, &form.csrf)?;
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
        .cookie(cart.cookie(&req))
        .finish())
}

/// Changes the quantity of a cart line; 0 removes it.
pub async fn post_cart_update(
    req: HttpRequest,
    state: web::Data<AppState>,
    form: web::Form<CartForm>,
) -> Result<HttpResponse, AppError> {
    csrf::check_storefront(&req, &form.csrf)?;
    let sku = Sku::parse(&form.sku).map_err(|e| AppError::Unprocessable(e.to_string()))?;
    let mut cart = Cart::from_request(&req);
    let quantity = match form.quantity.trim() {
        "0" => 0,
        raw => Quantity::parse(raw, max_quantity(&state))?.get(),
    };
    cart.set(sku, quantity);
    Ok(HttpResponse::SeeOther()
        .insert_header((header::LOCATION, "/cart"))
        .cookie(cart.cookie(&req))
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
    /// The name as shown: numbers and their units kept on one line.
    pub fn display_name(&self) -> String {
        crate::text::keep_units_together(&self.name)
    }

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
    /// A fresh idempotency key for the "Checkout" form.
    key: String,
    encoded_lines: String,
    error: Option<String>,
    shortages: Vec<Shortage>,
}

async fn cart_page(
    req: &HttpRequest,
    state: &AppState,
    error: Option<String>,
    shortages: Vec<Shortage>,
) -> Result<CartPage, AppError> {
    let cart = Cart::from_request(req);
    let lines = cart_lines(state, &cart).await?;
    Ok(CartPage {
        chrome: Chrome::new(req),
        total: total(&lines),
        lines,
        max_quantity: max_quantity(state),
        key: IdempotencyKey::generate().as_str().to_string(),
        encoded_lines: cart.encode(),
        error,
        shortages,
    })
}

pub async fn get_cart(
    req: HttpRequest,
    state: web::Data<AppState>,
) -> Result<HttpResponse, AppError> {
    html(
        StatusCode::OK,
        &cart_page(&req, &state, None, Vec::new()).await?,
    )
}

/// `/checkout` itself is the cart's "Checkout" button; a GET just goes to the cart.
pub async fn get_checkout() -> HttpResponse {
    see_other("/cart")
}

#[derive(Deserialize)]
pub struct StartCheckoutForm {
    #[serde(default)]
    csrf: String,
    key: String,
    lines: String,
}

/// Starts checkout: places a hold on the cart's lines, so the stock is the shopper's while
/// they fill in the form. Pressing the button twice places one hold.
#[tracing::instrument(skip_all)]
pub async fn post_checkout(
    req: HttpRequest,
    state: web::Data<AppState>,
    form: web::Form<StartCheckoutForm>,
) -> Result<HttpResponse, AppError> {
    csrf::check_storefront(&req, &form.csrf)?;
    super::limits::limit_placement(&req, &state, None).await?;
    let key = IdempotencyKey::parse(&form.key).map_err(|_| {
        AppError::BadRequest("This checkout form is damaged; please start checkout again.".into())
    })?;
    let key = IdempotencyKey::scoped(&browser(&req), &key);
    let cart = Cart::decode(&form.lines);
    if cart.lines.is_empty() {
        return Err(AppError::Unprocessable(
            "This checkout form has no products in it; please start checkout again.".into(),
        ));
    }
    let lines = cart
        .lines
        .iter()
        .map(|(s, n)| (s.clone(), i64::from(*n)))
        .collect();
    // The browser by its CSRF cookie (checked above), and its address.
    let shopper = Shopper::default()
        .browser(&form.csrf)
        .address(super::client_addr(&req, &state.settings));
    let request = OrderRequest::new(lines, None, None, max_quantity(&state))?.placed_by(shopper);

    // A second press of the same button waits for the first and goes where it went; a
    // first press that died is taken over once its record goes stale.
    let shared = state.clone().into_inner();
    let placement = detached(async move {
        let deadline =
            Instant::now() + checkout::stale_after(&shared.settings) + Duration::from_secs(1);
        let mut pause = Duration::from_millis(20);
        loop {
            match checkout::place_hold(shared.order_deps(), Scope::Page, &key, &request).await {
                Err(OrderError::InFlight) if Instant::now() < deadline => {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(500));
                }
                other => return other,
            }
        }
    })
    .await?;
    let placement = match placement {
        // Over a product's limit per customer: back on the cart, saying so.
        Err(OrderError::OverLimit(message)) => {
            let page = cart_page(&req, &state, Some(message), Vec::new()).await?;
            return html(StatusCode::CONFLICT, &page);
        }
        other => other?,
    };
    match placement {
        HoldOutcome::Held { hold, .. } => Ok(see_other(&format!("/checkout/{}", hold.id))),
        HoldOutcome::Insufficient { shortages, .. } => {
            let message = "Some products are no longer available in the quantity you chose.";
            let page = cart_page(&req, &state, Some(message.into()), shortages).await?;
            html(StatusCode::CONFLICT, &page)
        }
    }
}

/// The key space of this browser's checkout forms: a digest of its CSRF cookie (checked
/// equal to the form's token just before). The form's key is random already; this makes a
/// key that leaked (a shared screenshot, a log) useless from any other browser.
fn browser(req: &HttpRequest) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(csrf::token(req).as_bytes());
    format!("b{}", &hex::encode(digest)[..32])
}

#[derive(Template)]
#[template(path = "shop/checkout.html")]
struct CheckoutPage {
    chrome: Chrome,
    hold: Hold,
    name: String,
    email: String,
    error: Option<String>,
    shortages: Vec<Shortage>,
}

fn parse_hold_id(raw: &str) -> Result<Uuid, AppError> {
    Uuid::parse_str(raw).map_err(|_| AppError::not_found("We have no checkout with this number."))
}

async fn find_hold(state: &AppState, id: Uuid) -> Result<Hold, AppError> {
    holds::db::find_hold(&state.db, id)
        .await?
        .ok_or_else(|| AppError::not_found("We have no checkout with this number."))
}

pub async fn get_checkout_hold(
    req: HttpRequest,
    state: web::Data<AppState>,
    path: web::Path<String>,
) -> Result<HttpResponse, AppError> {
    let hold = find_hold(&state, parse_hold_id(&path)?).await?;
    if let Some(order_id) = hold.order_id {
        return Ok(see_other(&format!("/orders/{order_id}")));
    }
    let page = CheckoutPage {
        chrome: Chrome::new(&req),
        name: hold.customer_name.clone().unwrap_or_default(),
        email: hold.email.clone().unwrap_or_default(),
        hold,
        error: None,
        shortages: Vec::new(),
    };
    html(StatusCode::OK, &page)
}

#[derive(Deserialize)]
pub struct ConfirmForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    email: String,
}

/// Places the order: the hold becomes an order once, however often this is sent.
#[tracing::instrument(skip_all)]
pub async fn post_checkout_confirm(
    req: HttpRequest,
    state: web::Data<AppState>,
    path: web::Path<String>,
    form: web::Form<ConfirmForm>,
) -> Result<HttpResponse, AppError> {
    csrf::check_storefront(&req, &form.csrf)?;
    let id = parse_hold_id(&path)?;
    let again = |status, error: &str, shortages| {
        checkout_again(
            &req,
            &state,
            id,
            &form,
            status,
            error.to_string(),
            shortages,
        )
    };
    if form.name.trim().is_empty() {
        return again(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Please tell us your name.",
            vec![],
        )
        .await;
    }
    if form.email.trim().is_empty() {
        return again(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Please give an email address, so we can reach you about your order.",
            vec![],
        )
        .await;
    }
    let contact = match OrderRequest::check_contact(Some(&form.email), Some(&form.name)) {
        Ok(contact) => contact,
        Err(e) => {
            let message = crate::error::sentence(&e.0);
            return again(StatusCode::UNPROCESSABLE_ENTITY, &message, vec![]).await;
        }
    };
    let db = state.db.clone();
    let confirmed =
        detached(async move { holds::confirm(&db, id, contact.name(), contact.email()).await })
            .await?;
    match confirmed {
        Ok(confirmed) => Ok(HttpResponse::SeeOther()
            .insert_header((header::LOCATION, format!("/orders/{}", confirmed.order.id)))
            .cookie(Cart::default().cookie(&req))
            .finish()),
        Err(HoldError::Insufficient(shortages)) => {
            let message = "Your reservation expired, and meanwhile these products sold out.";
            again(StatusCode::CONFLICT, message, shortages).await
        }
        Err(HoldError::NotFound) => {
            Err(AppError::not_found("We have no checkout with this number."))
        }
        Err(HoldError::Released) => {
            let message = "You cancelled this checkout. Start again from your cart.";
            again(StatusCode::CONFLICT, message, vec![]).await
        }
        Err(e) => Err(e.into()),
    }
}

/// The checkout page again, with what went wrong.
async fn checkout_again(
    req: &HttpRequest,
    state: &AppState,
    id: Uuid,
    form: &ConfirmForm,
    status: StatusCode,
    error: String,
    shortages: Vec<Shortage>,
) -> Result<HttpResponse, AppError> {
    let page = CheckoutPage {
        chrome: Chrome::new(req),
        hold: find_hold(state, id).await?,
        name: form.name.clone(),
        email: form.email.clone(),
        error: Some(error),
        shortages,
    };
    html(status, &page)
}

/// A form that carries nothing but its CSRF token.
#[derive(Deserialize)]
pub struct TokenForm {
    #[serde(default)]
    pub csrf: String,
}

/// Leaves checkout: the held stock goes back on sale at once.
pub async fn post_checkout_cancel(
    req: HttpRequest,
    state: web::Data<AppState>,
    path: web::Path<String>,
    form: web::Form<TokenForm>,
) -> Result<HttpResponse, AppError> {
    csrf::check_storefront(&req, &form.csrf)?;
    let id = parse_hold_id(&path)?;
    let shared = state.into_inner();
    let released =
        detached(
            async move { holds::release(&shared.db, Some(&shared.redis), id, "shopper").await },
        )
        .await?;
    match released {
        Ok(_) => Ok(see_other("/cart")),
        Err(HoldError::AlreadyConfirmed(order_id)) => Ok(see_other(&format!("/orders/{order_id}"))),
        Err(e) => Err(e.into()),
    }
}

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
        let cart = Cart::decode("A-1~2|garbage|B 2~1|C-3~-1|D-4~x|E-5~3|F-6~2147483647");
        assert_eq!(cart.encode(), "A-1~2|E-5~3");
    }
}
