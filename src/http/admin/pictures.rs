//! A product's picture: the upload form's handler (decoded, resized and stored by
//! [`crate::catalog::images`]), and the thumbnail the product's page shows, which the
//! admin sees while the product is hidden from the shop too.

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};

use super::products::{ProductPage, load_product};
use super::{check_api_csrf, page_chrome};
use crate::admin::Admin;
use crate::catalog::images;
use crate::error::AppError;
use crate::http::paths::SkuPath;
use crate::http::{AppState, csrf, html, see_other};

/// A product's thumbnail, on sale or not (`/admin/products/{sku}/thumb`). Like every
/// admin answer it is `no-store` (`http::middleware`), so a replaced picture shows at once
/// under the same address.
#[tracing::instrument(skip_all, fields(sku = req.match_info().get("sku").unwrap_or_default()))]
pub async fn get_product_thumb(
    req: HttpRequest,
    _admin: Admin,
    state: web::Data<AppState>,
    address: SkuPath,
) -> Result<HttpResponse, AppError> {
    let (size, shown) = (images::Size::Thumb, images::Shown::Any);
    crate::http::shop::product::picture(&req, &state, address, size, shown).await
}

/// Uploads a product's picture (a multipart form: `csrf`, then `image`). A refused file
/// leaves the product as it was and says why on its page.
#[tracing::instrument(skip_all, fields(sku = req.match_info().get("sku").unwrap_or_default()))]
pub async fn post_product_image(
    req: HttpRequest,
    admin: Admin,
    state: web::Data<AppState>,
    address: SkuPath,
    payload: web::Payload,
) -> Result<HttpResponse, AppError> {
    let sku = address.sku()?;
    let (sku, product) = load_product(&state, sku).await?;
    // The file, plus room for the form's other field and part headers.
    let cap = images::MAX_UPLOAD_BYTES + 64 * 1024;
    const TOO_LARGE: &str =
        "The picture is larger than 5 MB; choose a smaller one (it is resized anyway).";
    let parts = match crate::http::multipart::read(&req, payload, cap, TOO_LARGE).await {
        // No form to find the token in: only a caller with the token in its header
        // learns more than that this was refused.
        Err(not_a_form @ AppError::UnsupportedMediaType(_)) => {
            check_api_csrf(&req, &admin)?;
            return Err(not_a_form);
        }
        read => read?,
    };
    let field = |name: &str| parts.iter().find(|p| p.name == name).map(|p| &p.data[..]);
    let csrf = field("csrf")
        .and_then(|t| std::str::from_utf8(t).ok())
        .unwrap_or_default();
    csrf::check_admin(&admin, csrf)?;
    let upload = field("image").unwrap_or_default().to_vec();
    // A file past the limit that fits the body's slack is as much too large as one past
    // the slack: 413, whichever way it arrived.
    if upload.len() > images::MAX_UPLOAD_BYTES {
        return Err(AppError::TooLarge(TOO_LARGE.into()));
    }
    // Decoding and encoding take real CPU time: off the request thread.
    let processed = web::block(move || images::process(&upload))
        .await
        .map_err(|e| AppError::Internal(e.into()))?;
    let processed = match processed {
        Ok(processed) => processed,
        Err(refused) => {
            let message = crate::error::sentence(&format!("picture not changed: {refused}"));
            let page = ProductPage::new(page_chrome(&req, &admin), product).saying(message, true);
            return html(StatusCode::UNPROCESSABLE_ENTITY, &page);
        }
    };
    if !images::save(&state.db, &sku, &processed, &admin.username).await? {
        return Err(AppError::not_found(format!("No product with SKU {sku}.")));
    }
    state.catalog.forget(&sku);
    tracing::info!(bytes = processed.image.len(), "product picture replaced");
    Ok(see_other(&format!("/admin/products/{sku}")))
}
