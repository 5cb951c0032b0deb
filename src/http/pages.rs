//! Storefront pages: the catalogue and product pages.

use actix_web::{HttpRequest, web};
use askama::Template;
use askama_web::WebTemplate;

use super::{AppState, Chrome};
use crate::catalog::{ProductView, Sku};
use crate::error::AppError;

#[derive(Template, WebTemplate)]
#[template(path = "catalog/index.html")]
pub struct CataloguePage {
    chrome: Chrome,
    products: Vec<ProductView>,
}

#[tracing::instrument(skip_all)]
pub async fn get_catalogue(
    req: HttpRequest,
    state: web::Data<AppState>,
) -> Result<CataloguePage, AppError> {
    let products = state.catalog.products(state.read_pool()).await?;
    Ok(CataloguePage {
        chrome: Chrome::new(&req),
        products,
    })
}

#[derive(Template, WebTemplate)]
#[template(path = "catalog/product.html")]
pub struct ProductPage {
    chrome: Chrome,
    product: ProductView,
    max_quantity: i32,
}

#[tracing::instrument(skip_all, fields(sku = %path))]
pub async fn get_product(
    req: HttpRequest,
    state: web::Data<AppState>,
    path: web::Path<String>,
) -> Result<ProductPage, AppError> {
    let not_found = || AppError::not_found(format!("We have no product with SKU {path:?}."));
    let sku = Sku::parse(&path).map_err(|_| not_found())?;
    let product = state
        .catalog
        .product(state.read_pool(), &sku)
        .await?
        .ok_or_else(not_found)?;
    Ok(ProductPage {
        chrome: Chrome::new(&req),
        product,
        max_quantity: state.settings.max_line_quantity,
    })
}
