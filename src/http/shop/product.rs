//! A product's page (`/products/{sku}`) and its pictures.

use actix_web::http::header;
use actix_web::{HttpRequest, HttpResponse, web};
use askama::Template;
use askama_web::WebTemplate;

use crate::catalog::{ProductView, images};
use crate::error::AppError;
use crate::http::paths::SkuPath;
use crate::http::{AppState, Chrome};

#[derive(Template, WebTemplate)]
#[template(path = "catalog/product.html")]
pub struct ProductPage {
    chrome: Chrome,
    product: ProductView,
    max_quantity: i32,
    /// The drop the product is in, as this shopper sees it.
    drop: Option<super::drop::DropBox>,
}

impl ProductPage {
    /// Whether the "Add to cart" form is shown: always, unless the product is in a drop
    /// this shopper holds no pass of.
    fn may_add(&self) -> bool {
        self.drop.as_ref().is_none_or(|d| d.may_buy())
    }

    /// The product's drop has not opened yet: nothing is on sale, so no stock is shown.
    fn before_opening(&self) -> bool {
        self.drop.as_ref().is_some_and(|d| d.seconds_to_opening > 0)
    }
}

#[tracing::instrument(skip_all, fields(sku = req.match_info().get("sku").unwrap_or_default()))]
pub async fn get_product(
    req: HttpRequest,
    state: web::Data<AppState>,
    address: SkuPath,
) -> Result<ProductPage, AppError> {
    let sku = address.sku()?;
    let product = state.read_product(&sku).await?;
    Ok(ProductPage {
        drop: super::drop::drop_box(&req, &state, sku.as_str()).await?,
        chrome: Chrome::new(&req),
        product,
        max_quantity: state.settings.max_line_quantity,
    })
}

/// A product's picture (`/products/{sku}/image`).
#[tracing::instrument(skip_all, fields(sku = req.match_info().get("sku").unwrap_or_default()))]
pub async fn get_product_image(
    req: HttpRequest,
    state: web::Data<AppState>,
    address: SkuPath,
) -> Result<HttpResponse, AppError> {
    let shown = images::Shown::OnSale;
    picture(&req, &state, address, images::Size::Full, shown).await
}

/// A product's thumbnail (`/products/{sku}/thumb`), for the catalogue.
#[tracing::instrument(skip_all, fields(sku = req.match_info().get("sku").unwrap_or_default()))]
pub async fn get_product_thumb(
    req: HttpRequest,
    state: web::Data<AppState>,
    address: SkuPath,
) -> Result<HttpResponse, AppError> {
    let shown = images::Shown::OnSale;
    picture(&req, &state, address, images::Size::Thumb, shown).await
}

/// The stored bytes with their ETag; 304 when the client already has them. Pages link
/// with `?v=` (the picture's version), so a replaced picture is a new address: one asked
/// for by its current version is kept a year, any other an hour.
pub(crate) async fn picture(
    req: &HttpRequest,
    state: &AppState,
    address: SkuPath,
    size: images::Size,
    shown: images::Shown,
) -> Result<HttpResponse, AppError> {
    let not_found = || {
        let raw = req.match_info().get("sku").unwrap_or_default();
        AppError::not_found(format!(
            "No picture for a product with SKU {}.",
            crate::text::quoted(raw)
        ))
    };
    let sku = address.sku().map_err(|_| not_found())?;
    let stored = images::find(&state.db, &sku, size, shown)
        .await?
        .ok_or_else(not_found)?;
    let fresh = req
        .headers()
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| images::matches(v, &stored.etag));
    let mut res = match fresh {
        true => HttpResponse::NotModified(),
        false => HttpResponse::Ok(),
    };
    let cache = crate::http::assets::cache_control(req, images::version(&stored.etag));
    res.insert_header((header::ETAG, stored.etag))
        .insert_header((header::CACHE_CONTROL, cache));
    Ok(match fresh {
        true => res.finish(),
        false => res.content_type(stored.content_type).body(stored.bytes),
    })
}
