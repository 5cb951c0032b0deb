//! The cart: a cookie of `(SKU, quantity)` pairs, the cart page, and its add and update
//! forms. The cart page's "Checkout" button starts checkout ([`super::checkout`]).

use actix_web::cookie::{Cookie, SameSite};
use actix_web::http::{StatusCode, header};
use actix_web::{HttpRequest, HttpResponse, web};
use askama::Template;
use serde::Deserialize;

use crate::catalog::{Sku, format_cents};
use crate::checkout::{MAX_LINES, Quantity};
use crate::error::AppError;
use crate::http::{AppState, Chrome, csrf, html};
use crate::idempotency::IdempotencyKey;
use crate::orders::{self, Shortage};

/// Most units of one product a cart line may carry.
const MAX_CART_QUANTITY: i32 = 10_000;

/// Name of the cart cookie (its name: [`crate::http::cookie_name`]).
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
        req.cookie(crate::http::cookie_name(req, CART_COOKIE))
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

    pub(super) fn cookie(&self, req: &HttpRequest) -> Cookie<'static> {
        let mut cookie = crate::http::cookie(req, CART_COOKIE, self.encode(), SameSite::Lax);
        if self.lines.is_empty() {
            cookie.make_removal();
        }
        cookie
    }
}

pub(super) fn max_quantity(state: &AppState) -> i32 {
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
    let (sku, limit) = parse_known_sku(&state, &form.sku).await?;
    let mut cart = Cart::from_request(&req);
    let quantity = form_quantity(&form.quantity, max_quantity(&state))?;
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
    // No more than its purchase limit in one cart: the line then says so.
    cart.set(sku, limit.map_or(total.get(), |l| total.get().min(l)));
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
        raw => form_quantity(raw, max_quantity(&state))?.get(),
    };
    let limit = limit_of(&state, &sku).await?;
    cart.set(sku, limit.map_or(quantity, |l| quantity.min(l)));
    Ok(HttpResponse::SeeOther()
        .insert_header((header::LOCATION, "/cart"))
        .cookie(cart.cookie(&req))
        .finish())
}

/// A form's quantity: digits only, by the grammar every number from a form or an address
/// follows ([`crate::text::whole_number`]; `+1` is refused here as the API refuses it),
/// then from 1 to the cap.
fn form_quantity(raw: &str, max: i32) -> Result<Quantity, AppError> {
    let n = crate::text::whole_number(raw).ok_or_else(|| {
        AppError::Unprocessable(format!(
            "The quantity must be a whole number written in digits, like 2 (got {}).",
            crate::text::quoted(raw.trim())
        ))
    })?;
    Ok(Quantity::new(n, max)?)
}

/// The purchase limit of product `sku`, if it has one.
async fn limit_of(state: &AppState, sku: &Sku) -> Result<Option<i32>, AppError> {
    let products = orders::db::products_for(&state.db, std::slice::from_ref(sku)).await?;
    Ok(products.first().and_then(|p| p.purchase_limit))
}

/// The SKU of a product the shop has, and its purchase limit (read once, with the product).
async fn parse_known_sku(state: &AppState, raw: &str) -> Result<(Sku, Option<i32>), AppError> {
    let sku = Sku::parse(raw).map_err(|e| AppError::Unprocessable(e.to_string()))?;
    let product = crate::catalog::db::find_product(&state.db, &sku)
        .await?
        .ok_or_else(|| AppError::not_found(format!("We have no product with SKU {sku}.")))?;
    Ok((sku, product.purchase_limit))
}

/// A cart line as the cart and checkout pages show it.
pub struct CartLine {
    pub sku: String,
    pub name: String,
    pub quantity: i32,
    pub price_cents: i64,
    pub available: i32,
    /// At most this many per customer.
    pub limit: Option<i32>,
}

impl CartLine {
    /// The line holds as many as one customer may buy (or more, when the limit was lowered
    /// since): the message at the line.
    pub fn at_limit(&self) -> Option<i32> {
        self.limit.filter(|l| self.quantity >= *l)
    }

    /// More than one customer may buy: checkout would refuse it.
    pub fn over_limit(&self) -> bool {
        self.limit.is_some_and(|l| self.quantity > l)
    }

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
                limit: p.purchase_limit,
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

impl CartPage {
    /// A product of this cart by its name (its SKU, if the cart does not have it).
    fn name_of(&self, sku: &str) -> String {
        self.lines
            .iter()
            .find(|l| l.sku == sku)
            .map_or_else(|| sku.to_string(), CartLine::display_name)
    }
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

/// The cart page again, answered 409: checkout could not take its lines (`message` says
/// why, `shortages` names each short SKU).
pub(super) async fn cart_conflict(
    req: &HttpRequest,
    state: &AppState,
    message: String,
    shortages: Vec<Shortage>,
) -> Result<HttpResponse, AppError> {
    let page = cart_page(req, state, Some(message), shortages).await?;
    html(StatusCode::CONFLICT, &page)
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
