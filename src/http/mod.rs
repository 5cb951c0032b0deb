//! Everything that speaks HTTP. [`routes`] lists every route of the application in one
//! place; handlers sit in the module of their area beside their template structs. Nothing
//! below this module knows about actix-web.

mod assets;
mod health;
pub mod middleware;
mod pages;

use std::sync::Arc;

use actix_web::{HttpRequest, web};
use sqlx::PgPool;

use crate::config::{OrderStrategy, Settings};
use crate::locking::Redis;

/// Shared by every request; built once in [`crate::startup::Application::build`].
pub struct AppState {
    pub db: PgPool,
    pub redis: Redis,
    pub settings: Arc<Settings>,
}

/// Every route of the application.
pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/", web::get().to(pages::get_catalogue))
        .route("/products/{sku}", web::get().to(pages::get_product))
        .route("/healthz", web::get().to(health::get_healthz))
        .route("/readyz", web::get().to(health::get_readyz))
        .route("/static/{file}", web::get().to(assets::get_asset));
}

/// What every page's frame (header, banner, footer) needs; `base.html` reads it.
#[derive(Debug, Clone, Default)]
pub struct Chrome {
    /// The oversell-demonstration strategy is on: show the red banner.
    pub unsafe_banner: bool,
}

impl Chrome {
    pub fn new(req: &HttpRequest) -> Self {
        let strategy = req
            .app_data::<web::Data<AppState>>()
            .map(|s| s.settings.order_strategy);
        Self {
            unsafe_banner: strategy == Some(OrderStrategy::NaiveUnsafe),
        }
    }
}
