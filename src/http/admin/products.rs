//! Products: the list with its search, the new-product form, a product's page (with its
//! stock forms, handled in [`super::stock`]) and its edit form.

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use askama::Template;
use serde::Deserialize;

use super::once::{DoneQuery, done_notice, new_form_key};
use super::{PAGE, Page, page_chrome};
use crate::admin::Admin;
use crate::catalog::manage::ProductRow;
use crate::catalog::manage::{self, ProductFields};
use crate::catalog::{self, Sku};
use crate::error::AppError;
use crate::http::paths::{SkuPath, no_product};
use crate::http::{AppState, Chrome, csrf, html, see_other};
use crate::inventory::db as stock;

#[derive(Template)]
#[template(path = "admin/products.html")]
struct ProductsPage {
    chrome: Chrome,
    products: Vec<ProductRow>,
    q: String,
    page: i64,
    pages: i64,
}

#[derive(Deserialize)]
pub struct ListQuery {
    q: Option<String>,
    page: Option<i64>,
}

pub async fn get_products(
    req: HttpRequest,
    admin: Admin,
    state: web::Data<AppState>,
    query: web::Query<ListQuery>,
) -> Result<HttpResponse, AppError> {
    let q = query.q.clone().unwrap_or_default().trim().to_string();
    crate::text::single_line("The search", &q)?;
    let page = Page::of(query.page, PAGE);
    let (products, total) = manage::search(&state.db, &q, page.size, page.offset()).await?;
    let page = ProductsPage {
        chrome: page_chrome(&req, &admin),
        products,
        q,
        page: page.number,
        pages: page.count(total),
    };
    html(StatusCode::OK, &page)
}

#[derive(Template)]
#[template(path = "admin/product.html")]
pub(super) struct ProductPage {
    pub(super) chrome: Chrome,
    pub(super) product: ProductRow,
    pub(super) is_new: bool,
    /// A message for the person, and whether it is bad news.
    pub(super) notice: Option<(String, bool)>,
    /// Another admin's or a shopper's change moved stock under this form.
    pub(super) moved: Option<i32>,
    /// Fresh idempotency keys for the "add units" and "set the count" forms.
    pub(super) restock_key: String,
    pub(super) adjust_key: String,
}

impl ProductPage {
    /// `product`'s page, its stock forms with fresh keys, nothing to say yet.
    pub(super) fn new(chrome: Chrome, product: ProductRow) -> Self {
        Self {
            chrome,
            product,
            is_new: false,
            notice: None,
            moved: None,
            restock_key: new_form_key(),
            adjust_key: new_form_key(),
        }
    }

    /// The new-product form, filled with `product`.
    fn new_product(chrome: Chrome, product: ProductRow) -> Self {
        Self {
            is_new: true,
            ..Self::new(chrome, product)
        }
    }

    /// With a message for the person (`bad`: it is bad news, a refusal).
    pub(super) fn saying(self, message: String, bad: bool) -> Self {
        Self {
            notice: Some((message, bad)),
            ..self
        }
    }
}

/// The product the address names, with its SKU as parsed (the row was found by it, so it
/// is the stored one); 404 for a malformed or unknown SKU.
pub(super) async fn load_product(
    state: &AppState,
    sku: Sku,
) -> Result<(Sku, ProductRow), AppError> {
    let product = manage::find(&state.db, &sku)
        .await?
        .ok_or_else(|| no_product(sku.as_str()))?;
    Ok((sku, product))
}

pub async fn get_new_product(req: HttpRequest, admin: Admin) -> Result<HttpResponse, AppError> {
    let empty = ProductRow {
        sku: String::new(),
        name: String::new(),
        description: String::new(),
        price_cents: 0,
        active: true,
        purchase_limit: None,
        category: None,
        image: None,
        on_hand: 0,
        reserved: 0,
    };
    let page = ProductPage::new_product(page_chrome(&req, &admin), empty);
    html(StatusCode::OK, &page)
}

#[derive(Deserialize)]
pub struct ProductForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    sku: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    description: String,
    #[serde(default)]
    price: String,
    #[serde(default)]
    on_hand: String,
    #[serde(default)]
    purchase_limit: String,
    #[serde(default)]
    category: String,
    active: Option<String>,
}

/// `"12.50"` or `"12"` → 1250 cents.
fn parse_price(raw: &str) -> Result<i64, String> {
    let raw = raw.trim().trim_start_matches('$');
    let bad = || format!("{raw:?} is not a price: use a number like 12.50");
    let (whole, cents) = raw.split_once('.').unwrap_or((raw, ""));
    if whole.is_empty()
        || !whole.bytes().all(|b| b.is_ascii_digit())
        || cents.len() > 2
        || !cents.bytes().all(|b| b.is_ascii_digit())
    {
        return Err(bad());
    }
    let whole: i64 = whole.parse().map_err(|_| bad())?;
    let cents: i64 = format!("{cents:0<2}").parse().map_err(|_| bad())?;
    whole
        .checked_mul(100)
        .and_then(|w| w.checked_add(cents))
        .filter(|c| *c <= 100_000_000)
        .ok_or_else(|| "prices go up to $1,000,000.00".into())
}

/// A purchase limit as typed: empty for none, else 1 to 1,000,000 per customer.
fn parse_limit(raw: &str) -> Result<Option<i32>, String> {
    let raw = raw.trim();
    if raw.is_empty() {
        return Ok(None);
    }
    match raw.parse::<i64>() {
        Ok(n) if (1..=1_000_000).contains(&n) => Ok(Some(n as i32)),
        _ => Err(format!(
            "{raw:?} is not a purchase limit: leave it empty for none, or give a whole number from 1 to 1,000,000"
        )),
    }
}

/// A category as typed: empty for none.
fn parse_category(raw: &str) -> Result<Option<String>, String> {
    match raw.trim() {
        "" => Ok(None),
        c => catalog::browse::parse_category(c)
            .map(Some)
            .map_err(|e| e.0),
    }
}

/// Checks a product form.
fn check_product(form: &ProductForm) -> Result<ProductFields, String> {
    crate::text::single_line("the name", &form.name).map_err(|e| e.to_string())?;
    crate::text::multi_line("the description", &form.description).map_err(|e| e.to_string())?;
    crate::text::single_line("the price", &form.price).map_err(|e| e.to_string())?;
    let name = form.name.trim().to_string();
    if name.is_empty() || name.chars().count() > 200 {
        return Err("a name is 1 to 200 characters".into());
    }
    let description = form.description.trim().to_string();
    if description.chars().count() > 5000 {
        return Err("a description is at most 5000 characters".into());
    }
    Ok(ProductFields {
        name,
        description,
        price_cents: parse_price(&form.price)?,
        active: form.active.is_some(),
        purchase_limit: parse_limit(&form.purchase_limit)?,
        category: parse_category(&form.category)?,
    })
}

fn form_product(form: &ProductForm) -> ProductRow {
    ProductRow {
        sku: form.sku.trim().to_uppercase(),
        name: form.name.clone(),
        description: form.description.clone(),
        price_cents: parse_price(&form.price).unwrap_or(0),
        active: form.active.is_some(),
        on_hand: form.on_hand.trim().parse().unwrap_or(0),
        reserved: 0,
        purchase_limit: parse_limit(&form.purchase_limit).ok().flatten(),
        category: Some(form.category.trim().to_string()).filter(|c| !c.is_empty()),
        image: None,
    }
}

pub async fn post_products(
    req: HttpRequest,
    admin: Admin,
    state: web::Data<AppState>,
    form: web::Form<ProductForm>,
) -> Result<HttpResponse, AppError> {
    csrf::check_admin(&admin, &form.csrf)?;
    let refuse = |message: String| {
        let page = ProductPage::new_product(page_chrome(&req, &admin), form_product(&form))
            .saying(crate::error::sentence(&message), true);
        html(StatusCode::UNPROCESSABLE_ENTITY, &page)
    };
    let sku = match Sku::parse(&form.sku) {
        Ok(sku) => sku,
        Err(e) => return refuse(e.to_string()),
    };
    let fields = match check_product(&form) {
        Ok(fields) => fields,
        Err(message) => return refuse(message),
    };
    let on_hand: i32 = match form.on_hand.trim().parse() {
        Ok(n) if (0..=10_000_000).contains(&n) => n,
        _ => return refuse("the opening stock is a whole number from 0 to 10,000,000".into()),
    };
    let mut tx = state.db.begin().await?;
    let created = manage::insert(&mut tx, &sku, &fields).await?;
    if !created {
        return refuse(format!("there is already a product with SKU {sku}"));
    }
    stock::create_stock(&mut tx, &sku, on_hand, &admin.username).await?;
    tx.commit().await?;
    state.catalog.forget(&sku);
    Ok(see_other(&format!("/admin/products/{sku}")))
}

/// A product, with its stock forms; after one of them, `?done=<key>` shows what it did.
pub async fn get_product(
    req: HttpRequest,
    admin: Admin,
    state: web::Data<AppState>,
    address: SkuPath,
    query: web::Query<DoneQuery>,
) -> Result<HttpResponse, AppError> {
    let sku = address.sku()?;
    let (sku, product) = load_product(&state, sku).await?;
    let page = format!("/admin/products/{sku}");
    let notice = done_notice(&state, &admin, &page, query.done.as_deref()).await?;
    let mut page = ProductPage::new(page_chrome(&req, &admin), product);
    if let Some(notice) = notice {
        page = page.saying(notice, false);
    }
    html(StatusCode::OK, &page)
}

pub async fn post_product(
    req: HttpRequest,
    admin: Admin,
    state: web::Data<AppState>,
    address: SkuPath,
    form: web::Form<ProductForm>,
) -> Result<HttpResponse, AppError> {
    csrf::check_admin(&admin, &form.csrf)?;
    let sku = address.sku()?;
    let (sku, mut product) = load_product(&state, sku).await?;
    match check_product(&form) {
        Err(message) => {
            product.name = form.name.clone();
            product.description = form.description.clone();
            product.category = Some(form.category.clone());
            let page = ProductPage::new(page_chrome(&req, &admin), product)
                .saying(crate::error::sentence(&message), true);
            html(StatusCode::UNPROCESSABLE_ENTITY, &page)
        }
        Ok(fields) => {
            manage::update(&state.db, &sku, &fields).await?;
            state.catalog.forget(&sku);
            Ok(see_other(&format!("/admin/products/{sku}")))
        }
    }
}
