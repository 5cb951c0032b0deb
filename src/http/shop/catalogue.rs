//! The catalogue page (`/`): search, categories, sort, pages. The API's product list reads
//! the same query parameters ([`BrowseParams`]).

use actix_web::{HttpRequest, web};
use askama::Template;
use askama_web::WebTemplate;

use crate::catalog::ProductView;
use crate::catalog::browse::{Browse, PER_PAGE, Sort};
use crate::error::AppError;
use crate::http::params::BrowseParams;
use crate::http::{AppState, Chrome};

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
    let (listing, categories) = state
        .read(async |db| {
            let listing = state.catalog.browse(db, &browse, PER_PAGE).await?;
            Ok((
                listing,
                state.catalog.categories(db, &browse.search()).await?,
            ))
        })
        .await?;
    Ok(CataloguePage {
        chrome: Chrome::new(&req),
        products: listing.products,
        pages: ((listing.total + PER_PAGE - 1) / PER_PAGE).max(1),
        total: listing.total,
        browse,
        categories,
    })
}
