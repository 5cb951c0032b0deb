//! Storefront pages: the catalogue (search, categories, sort, pages), product pages, and
//! product pictures.

use actix_web::http::header;
use actix_web::{HttpRequest, HttpResponse, web};
use askama::Template;
use askama_web::WebTemplate;

use serde::Deserialize;

use super::{AppState, Chrome};
use crate::catalog::browse::{Browse, PER_PAGE, Sort};
use crate::catalog::{ProductView, Sku, images};
use crate::error::{AppError, percent_encode};

/// The catalogue's query parameters as sent, all optional; [`BrowseParams::parse`] checks
/// them (the page and the API read the same ones).
#[derive(Debug, Default, Deserialize)]
pub struct BrowseParams {
    pub q: Option<String>,
    pub category: Option<String>,
    pub sort: Option<String>,
    pub page: Option<String>,
}

impl BrowseParams {
    pub fn parse(&self) -> Result<Browse, AppError> {
        Browse::parse(
            self.q.as_deref(),
            self.category.as_deref(),
            self.sort.as_deref(),
            self.page.as_deref(),
        )
        .map_err(|e| AppError::Unprocessable(crate::error::sentence(&e.0)))
    }

    /// `path` with the query that asks for `browse` (defaults left out).
    pub fn url_for(path: &str, browse: &Browse) -> String {
        let mut params = Vec::new();
        if !browse.q.is_empty() {
            params.push(format!("q={}", percent_encode(&browse.q)));
        }
        if let Some(c) = &browse.category {
            params.push(format!("category={}", percent_encode(c)));
        }
        if browse.sort != Sort::Relevance {
            params.push(format!("sort={}", browse.sort.as_str()));
        }
        if browse.page != 1 {
            params.push(format!("page={}", browse.page));
        }
        match params.is_empty() {
            true => path.to_string(),
            false => format!("{path}?{}", params.join("&")),
        }
    }
}

#[derive(Template, WebTemplate)]
#[template(path = "catalog/index.html")]
pub struct CataloguePage {
    chrome: Chrome,
    products: Vec<ProductView>,
    browse: Browse,
    categories: Vec<(String, i64)>,
    total: i64,
    pages: i64,
}

impl CataloguePage {
    /// This listing with another category (`None`: all), from its first page.
    fn category_url(&self, category: Option<&str>) -> String {
        BrowseParams::url_for(
            "/",
            &Browse {
                category: category.map(str::to_string),
                page: 1,
                ..self.browse.clone()
            },
        )
    }

    fn page_url(&self, page: i64) -> String {
        BrowseParams::url_for(
            "/",
            &Browse {
                page,
                ..self.browse.clone()
            },
        )
    }

    fn sorts(&self) -> [Sort; 5] {
        Sort::ALL
    }

    fn is_category(&self, name: &str) -> bool {
        self.browse.category.as_deref() == Some(name)
    }

    /// A narrowed view: a search or a category.
    fn narrowed(&self) -> bool {
        !self.browse.q.is_empty() || self.browse.category.is_some()
    }
}

#[tracing::instrument(skip_all)]
pub async fn get_catalogue(
    req: HttpRequest,
    state: web::Data<AppState>,
    query: web::Query<BrowseParams>,
) -> Result<CataloguePage, AppError> {
    let browse = query.parse()?;
    let listing = state
        .catalog
        .browse(state.read_pool(), &browse, PER_PAGE)
        .await?;
    let categories = state.catalog.categories(state.read_pool()).await?;
    Ok(CataloguePage {
        chrome: Chrome::new(&req),
        products: listing.products,
        pages: ((listing.total + PER_PAGE - 1) / PER_PAGE).max(1),
        total: listing.total,
        browse,
        categories,
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

/// A product's picture (`/products/{sku}/image`).
#[tracing::instrument(skip_all, fields(sku = %path))]
pub async fn get_product_image(
    req: HttpRequest,
    state: web::Data<AppState>,
    path: web::Path<String>,
) -> Result<HttpResponse, AppError> {
    picture(&req, &state, &path, images::Size::Full).await
}

/// A product's thumbnail (`/products/{sku}/thumb`), for the catalogue.
#[tracing::instrument(skip_all, fields(sku = %path))]
pub async fn get_product_thumb(
    req: HttpRequest,
    state: web::Data<AppState>,
    path: web::Path<String>,
) -> Result<HttpResponse, AppError> {
    picture(&req, &state, &path, images::Size::Thumb).await
}

/// The stored bytes with their ETag; 304 when the client already has them. Pages link
/// with `?v=` (the picture's version), so a replaced picture is a new address and an
/// hour's caching never shows a stale one there.
async fn picture(
    req: &HttpRequest,
    state: &AppState,
    raw: &str,
    size: images::Size,
) -> Result<HttpResponse, AppError> {
    let not_found = || AppError::not_found(format!("No picture for a product with SKU {raw:?}."));
    let sku = Sku::parse(raw).map_err(|_| not_found())?;
    let stored = images::find(&state.db, &sku, size)
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
    res.insert_header((header::ETAG, stored.etag))
        .insert_header((header::CACHE_CONTROL, "public, max-age=3600"));
    Ok(match fresh {
        true => res.finish(),
        false => res.content_type(stored.content_type).body(stored.bytes),
    })
}
