//! The catalogue as JSON: public, and read from where reads may lag.

use actix_web::http::header;
use actix_web::{HttpRequest, HttpResponse, web};
use serde::Serialize;

use crate::catalog::{ProductView, Sku};
use crate::error::AppError;
use crate::http::AppState;
use crate::http::contract::inputs::{CategoryFilter, PageNumber, SearchWords, SkuInput, SortOrder};
use crate::http::contract::{LookupErrors, SearchErrors};
use crate::http::paths::SkuPath;

/// A product as the API shows it.
#[derive(Serialize, utoipa::ToSchema)]
#[schema(as = Product)]
struct ProductJson {
    sku: Sku,
    name: String,
    description: String,
    price_cents: i64,
    /// Units that can be ordered now: on hand less those held in checkouts.
    #[schema(minimum = 0)]
    available: i32,
    /// At most this many per customer; `null` when there is no limit.
    purchase_limit: Option<i32>,
    category: Option<String>,
    /// The picture's address (`null`: none); `…/thumb` for the thumbnail.
    image_url: Option<String>,
}

impl From<ProductView> for ProductJson {
    fn from(p: ProductView) -> Self {
        let image_url = p
            .image_version()
            .map(|v| format!("/products/{}/image?v={v}", p.sku));
        Self {
            image_url,
            sku: p.sku,
            name: p.name,
            description: p.description,
            price_cents: p.price_cents,
            available: p.available.max(0),
            purchase_limit: p.purchase_limit,
            category: p.category,
        }
    }
}

/// Products per page when the API is asked for a `page`.
const API_PER_PAGE: i64 = 100;

/// The product list: every active product by name, or with `?q=`, `?category=`, `?sort=`
/// a search; `?page=` pages it ([`API_PER_PAGE`] a page). The body stays the plain array
/// clients rely on; `X-Total-Count` says how many match, and `Link: <…>; rel="next"`
/// points to the next page when there is one.
#[utoipa::path(
    get,
    path = "/api/v1/products",
    tag = "products",
    params(
        ("q" = Option<SearchWords>, Query),
        ("category" = Option<CategoryFilter>, Query),
        ("sort" = Option<SortOrder>, Query),
        ("page" = Option<PageNumber>, Query),
    ),
    responses(
        (status = 200, description = "The matching products, by name or as sorted.",
            body = [ProductJson],
            headers(
                ("X-Total-Count" = i64, description = "How many products match."),
                ("Link" = String,
                    description = "`<…>; rel=\"next\"`: the next page, while there is one \
                        (with `page` only)."),
            )),
        SearchErrors,
    )
)]
#[tracing::instrument(skip_all)]
pub async fn get_products(
    req: HttpRequest,
    state: web::Data<AppState>,
    query: web::Query<crate::http::params::BrowseParams>,
) -> Result<HttpResponse, AppError> {
    let browse = query.parse()?;
    // Without `?page=` the whole list, as before paging existed.
    let per_page = match query.page {
        Some(_) => API_PER_PAGE,
        None => i64::MAX,
    };
    let listing = state
        .read(async |db| Ok(state.catalog.browse(db, &browse, per_page).await?))
        .await?;
    let mut res = HttpResponse::Ok();
    res.insert_header(("X-Total-Count", listing.total));
    if query.page.is_some() && browse.page * per_page < listing.total {
        let next = crate::http::params::BrowseParams::url_for(
            req.path(),
            &crate::catalog::browse::Browse {
                page: browse.page + 1,
                ..browse.clone()
            },
        );
        res.insert_header((header::LINK, format!("<{next}>; rel=\"next\"")));
    }
    let products: Vec<ProductJson> = listing
        .products
        .into_iter()
        .map(ProductJson::from)
        .collect();
    Ok(res.json(products))
}

/// One product by SKU (any case).
#[utoipa::path(
    get,
    path = "/api/v1/products/{sku}",
    tag = "products",
    params(("sku" = SkuInput, Path, description = "The product's SKU (any case).")),
    responses(
        (status = 200, description = "The product.", body = ProductJson),
        LookupErrors,
    )
)]
pub async fn get_product(
    state: web::Data<AppState>,
    address: SkuPath,
) -> Result<HttpResponse, AppError> {
    let product = state.read_product(&address.sku()?).await?;
    Ok(HttpResponse::Ok().json(ProductJson::from(product)))
}
