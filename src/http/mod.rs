//! Everything that speaks HTTP. [`routes`] lists every route of the application in one
//! place; handlers sit in the module of their area beside their template structs. Nothing
//! below this module knows about actix-web.

pub mod admin;
pub mod api;
mod assets;
mod body;
mod client;
pub mod contract;
pub mod csrf;
pub mod gate;
mod head;
mod health;
pub mod json;
pub mod limits;
pub mod middleware;
mod multipart;
pub mod openapi;
pub mod params;
pub mod paths;
mod routing;
pub mod shop;
pub mod shown;

use std::sync::Arc;
use std::time::Duration;

pub use client::{asked_for, client_addr};
pub use head::HeadDeadline;
pub(crate) use routing::get;
pub use routing::{
    Grouped, add_under, method_not_allowed, resource, resources, routes, take_under,
};

/// The address of the listener a request came in on: each listener's app carries its own.
#[derive(Debug, Clone, Copy)]
pub struct Listener(pub std::net::SocketAddr);

use actix_web::http::Method;
use actix_web::{HttpRequest, web};
use sqlx::PgPool;

use crate::checkout::OrderDeps;
use crate::config::{OrderStrategy, Settings};
use crate::error::AppError;
use crate::locking::Redis;
use crate::metrics::Metrics;

/// Shared by every request; built once in [`crate::startup::Application::build`].
pub struct AppState {
    pub db: PgPool,
    /// The group-commit leaders' own pool (`startup::Leaders`); `None` while they share
    /// [`AppState::db`].
    pub leaders: Option<PgPool>,
    pub redis: Redis,
    pub settings: Arc<Settings>,
    pub metrics: Arc<Metrics>,
    /// The `batched` strategy's queue and its leader.
    pub batcher: Arc<crate::checkout::Batcher>,
    /// Hold confirmations: in lots under `batched`, each on its own otherwise.
    pub confirmer: Arc<crate::holds::Confirmer>,
    /// What the storefront pages read, kept for a moment.
    pub catalog: Arc<crate::catalog::cache::CatalogCache>,
    /// The bound address of the metrics listener (`STOCKADE_METRICS_LISTEN`), if any.
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// Rate limits on placing orders and holds.
    pub limiter: Arc<crate::ratelimit::RateLimiter>,
    /// API keys looked up lately.
    pub api_keys: Arc<crate::clients::KeyCache>,
    /// The live drops, for deciding which holds and orders need a pass.
    pub drops: Arc<crate::drops::Registry>,
    /// The streaming replica for reads that may lag (`STOCKADE_DATABASE_REPLICA_URL`).
    pub replica: Option<Arc<crate::pg::replica::Replica>>,
    /// Whether the primary is out of reach, as this process's probe last found it.
    pub outage: Arc<crate::pg::outage::Outage>,
    /// Taking payment (`STOCKADE_PAYMENTS`); `None` when it is off.
    pub payments: Option<Arc<crate::payments::Payments>>,
}

impl AppState {
    /// Runs `read` where reads that may lag go (catalogue, product pages, product API, the
    /// dashboard): the replica while its check finds it answering, else the primary. A
    /// read that finds the replica gone before its check does (a dropped connection, the
    /// server shutting down, or no connection within the wait while the replica's pool is
    /// not full, so it is out of reach rather than busy) takes it out at once and runs
    /// again on the primary. A busy replica's timeout stays a 503: its reads are not moved
    /// onto the primary, which orders need. Stock decisions, orders, holds, idempotency
    /// records and admin writes use [`AppState::db`].
    pub async fn read<T>(
        &self,
        read: impl AsyncFn(&PgPool) -> Result<T, AppError>,
    ) -> Result<T, AppError> {
        let Some(replica) = self.replica.as_ref().filter(|r| r.is_up()) else {
            return read(&self.db).await;
        };
        match read(replica.pool()).await {
            Err(AppError::Database(e))
                if crate::pg::is_unreachable(&e)
                    || matches!(e, sqlx::Error::PoolTimedOut) && replica.looks_gone() =>
            {
                tracing::debug!(error = %e, "the replica is gone; reading the primary");
                replica.mark_down();
                read(&self.db).await
            }
            answer => answer,
        }
    }

    /// The product on sale with `sku`, read where reads that may lag go ([`Self::read`]);
    /// 404 when there is none.
    pub async fn read_product(
        &self,
        sku: &crate::catalog::Sku,
    ) -> Result<crate::catalog::ProductView, AppError> {
        self.read(async |db| Ok(self.catalog.product(db, sku).await?))
            .await?
            .ok_or_else(|| paths::no_product(sku.as_str()))
    }

    /// Confirms a hold into an order: through its payment when the shop takes payments
    /// (only a paid hold becomes an order, and its payment is captured), else as it is.
    pub async fn confirm_hold(
        &self,
        asked: crate::holds::Confirmation<'_>,
    ) -> Result<crate::holds::Confirmed, crate::payments::flow::PayError> {
        match &self.payments {
            Some(payments) => payments.confirm(asked).await,
            None => Ok(self.confirmer.confirm(asked).await?),
        }
    }

    /// How long a confirmation may take: an order's, and the payment's provider calls.
    pub fn confirm_limit(&self) -> Duration {
        let order = crate::checkout::work_limit(&self.settings);
        self.payments
            .as_ref()
            .map_or(order, |p| order.max(p.work_limit()))
    }

    /// Whether `req` came in on the metrics listener.
    pub fn on_metrics_listener(&self, req: &HttpRequest) -> bool {
        req.app_data::<Listener>()
            .is_some_and(|on| self.metrics_addr == Some(on.0))
    }

    /// After this process changed `sku`'s stock outside an order: its pages and its
    /// sold-out hint are forgotten, so returned units are offered at once.
    pub async fn stock_changed(&self, sku: &crate::catalog::Sku) {
        self.catalog.forget(sku);
        self.redis.clear_sold_out(sku).await;
    }

    /// What placing an order or hold needs, for a request to be answered by `answer_by`
    /// ([`middleware::answer_by`]).
    pub fn order_deps(&self, answer_by: std::time::Instant) -> OrderDeps<'_> {
        OrderDeps {
            steps: crate::checkout::Deps {
                answer_by,
                db: &self.db,
                redis: &self.redis,
                settings: &self.settings,
                metrics: &self.metrics,
                catalog: &self.catalog,
            },
            batcher: &self.batcher,
        }
    }
}

/// The admin session's cookie (named here with the others, for [`cookie_name`]).
pub const ADMIN_SESSION_COOKIE: &str = "stockade_admin";

/// The name of cookie `name` (one of [`csrf::CSRF_COOKIE`], [`shop::CART_COOKIE`],
/// [`ADMIN_SESSION_COOKIE`]): with `STOCKADE_SECURE_COOKIES`, the `__Host-` prefixed one,
/// which browsers accept only with Secure, Path=/ and no Domain, so no subdomain or
/// plain-http page can set or shadow it. Reading and writing both go through here.
pub fn cookie_name(req: &HttpRequest, name: &'static str) -> &'static str {
    let prefixed = req
        .app_data::<web::Data<AppState>>()
        .is_some_and(|s| s.settings.secure_cookies);
    match (prefixed, name) {
        (false, _) => name,
        (true, csrf::CSRF_COOKIE) => "__Host-csrf",
        (true, shop::CART_COOKIE) => "__Host-cart",
        (true, ADMIN_SESSION_COOKIE) => "__Host-stockade_admin",
        (true, other) => other,
    }
}

/// A cookie named by [`cookie_name`]: Path=/, HttpOnly, SameSite as given, and Secure
/// with `STOCKADE_SECURE_COOKIES` or over https (a TLS listener, or a trusted proxy's
/// `X-Forwarded-Proto`).
pub fn cookie(
    req: &HttpRequest,
    name: &'static str,
    value: String,
    same_site: actix_web::cookie::SameSite,
) -> actix_web::cookie::Cookie<'static> {
    named_cookie(req, cookie_name(req, name).to_string(), value, same_site)
}

/// [`cookie`] for a name not among the fixed ones (a drop's ticket and pass), never
/// `__Host-` prefixed.
pub fn named_cookie(
    req: &HttpRequest,
    name: String,
    value: String,
    same_site: actix_web::cookie::SameSite,
) -> actix_web::cookie::Cookie<'static> {
    let settings = req
        .app_data::<web::Data<AppState>>()
        .map(|s| s.settings.clone());
    // "Over https" as [`asked_for`] decides it: a client's own X-Forwarded-Proto does not
    // count.
    let secure = settings.as_ref().is_some_and(|s| s.secure_cookies)
        || asked_for(req, settings.as_deref()).scheme == "https";
    actix_web::cookie::Cookie::build(name, value)
        .path("/")
        .http_only(true)
        .same_site(same_site)
        .secure(secure)
        .finish()
}

/// Whether `path` is the JSON API's: its callers are programs, its answers and errors are
/// JSON, and it renders no forms (so it sets no storefront cookie).
pub fn is_api(path: &str) -> bool {
    path.starts_with("/api/")
}

/// Whether `path` is a provider's webhook: a program's too (JSON, no cookie), but not
/// part of the API's contract.
pub fn is_webhook(path: &str) -> bool {
    path.starts_with("/webhooks/")
}

/// Runs `work` as a task of its own, so it runs to the end (committing or cleaning up
/// its idempotency key and leases) even when the client goes away and the handler is
/// dropped. The work is boxed before it is spawned: the handler's own future then holds
/// a pointer, not the whole order flow, and stays cheap to move.
///
/// It is stopped after [`crate::checkout::work_limit`] (`limit`): what it still waits for
/// then is a database behind a network that stopped answering, whose connection would
/// otherwise stay out of the pool until TCP gave up. Stopped there, it is a request
/// whose process died at that point, which keys and leases are built to survive (see
/// the checkout module).
pub fn detached<T: 'static>(
    limit: Duration,
    work: impl Future<Output = T> + 'static,
) -> impl Future<Output = Result<T, crate::error::AppError>> {
    let task = actix_web::rt::spawn(crate::pg::cut_off(limit, Box::pin(work)));
    async move {
        match task.await {
            Ok(Ok(done)) => Ok(done),
            Ok(Err(_)) => Err(crate::error::AppError::over_budget()),
            Err(e) => Err(crate::error::AppError::Internal(anyhow::anyhow!(
                "request task failed: {e}"
            ))),
        }
    }
}

/// Renders a page with a status of its own choosing.
pub fn html(
    status: actix_web::http::StatusCode,
    page: &impl askama::Template,
) -> Result<actix_web::HttpResponse, crate::error::AppError> {
    let body = page
        .render()
        .map_err(|e| crate::error::AppError::Internal(e.into()))?;
    Ok(actix_web::HttpResponse::build(status)
        .content_type("text/html; charset=utf-8")
        .body(body))
}

/// 303 See Other: after a POST, the browser GETs `location`.
pub fn see_other(location: &str) -> actix_web::HttpResponse {
    actix_web::HttpResponse::SeeOther()
        .insert_header((actix_web::http::header::LOCATION, location))
        .finish()
}

/// What every page's frame (header, banner, footer) needs; `base.html` reads it.
#[derive(Debug, Clone, Default)]
pub struct Chrome {
    /// The oversell-demonstration strategy is on: show the red banner.
    pub unsafe_banner: bool,
    /// Units in the shopper's cart, shown in the header.
    pub cart_units: i32,
    /// The storefront CSRF token every form carries.
    pub csrf: String,
    /// The logged-in admin, on admin pages.
    pub admin: Option<String>,
    /// The admin session's CSRF token, on admin pages.
    pub admin_csrf: String,
}

impl Chrome {
    /// A static file's address, with its version ([`assets::url`]).
    pub fn asset(&self, file: &str) -> String {
        assets::url(file)
    }

    pub fn new(req: &HttpRequest) -> Self {
        let strategy = req
            .app_data::<web::Data<AppState>>()
            .map(|s| s.settings.order_strategy);
        Self {
            unsafe_banner: strategy == Some(OrderStrategy::NaiveUnsafe),
            cart_units: shop::Cart::from_request(req).units(),
            csrf: csrf::token(req),
            admin: None,
            admin_csrf: String::new(),
        }
    }
}
