//! The admin pages and the admin JSON API, behind a login.
//!
//! Every admin route is listed once, in [`routes`]; [`register`] wraps each in the
//! [`require_admin`] middleware, so none can be added without the guard, and the route
//! inventory test walks the same list. Anonymous requests are sent to the login page
//! (pages) or answered 401 (API). Every POST carries the session's CSRF token.
//!
//! The handlers sit in one module per area of the admin, beside their templates:
//! [`login`], [`dashboard`], [`products`] (and their [`pictures`]), [`stock`] (restock,
//! adjust, the ledger), [`orders`], [`holds`], [`clients`] (API clients) and [`webhooks`].
//! Every `/api/v1/admin/…` handler is in [`api`], whatever its area: the JSON API reads as
//! one contract, and the pages' modules share only their checks with it.
//!
//! Every stock change (the stock forms and the stock API) is applied once per idempotency
//! key ([`once`]): forms carry a key made when they are rendered, and answer 303 to a page
//! that shows the result (`?done=<key>`), so a refresh, a double click or a resubmit from
//! the back button replays that answer instead of changing stock again.

pub(crate) mod api;
mod clients;
mod dashboard;
mod drops;
mod holds;
mod login;
mod once;
mod orders;
mod pictures;
mod products;
mod stock;
mod webhooks;

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::Method;
use actix_web::middleware::{Next, from_fn};
use actix_web::{FromRequest, HttpMessage, HttpRequest, web};

use super::{AppState, Chrome, csrf};
use crate::admin::{self, Admin};
use crate::error::AppError;

/// The admin session cookie (its name: [`super::cookie_name`]).
pub const SESSION_COOKIE: &str = super::ADMIN_SESSION_COOKIE;
/// Rows per page in admin lists.
const PAGE: i64 = 25;
/// Pages beyond this are shown as this one.
const MAX_PAGE: i64 = 1_000_000;

/// One page of an admin list: the page asked for (`?page=`, from 1; out of range is
/// clamped) of `size` rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Page {
    number: i64,
    size: i64,
}

impl Page {
    fn of(asked: Option<i64>, size: i64) -> Self {
        Self {
            number: asked.unwrap_or(1).clamp(1, MAX_PAGE),
            size,
        }
    }

    /// Rows before this page.
    fn offset(&self) -> i64 {
        (self.number - 1) * self.size
    }

    /// How many pages `total` rows fill (an empty list has one, empty page).
    fn count(&self, total: i64) -> i64 {
        ((total + self.size - 1) / self.size).max(1)
    }
}

/// Every route that needs an admin, in one place: `(method, path, handler)`.
pub fn routes() -> Vec<(Method, &'static str, actix_web::Route)> {
    vec![
        (
            Method::GET,
            "/admin",
            super::get().to(dashboard::get_dashboard),
        ),
        (
            Method::GET,
            "/admin/products",
            super::get().to(products::get_products),
        ),
        (
            Method::POST,
            "/admin/products",
            web::post().to(products::post_products),
        ),
        (
            Method::GET,
            "/admin/products/new",
            super::get().to(products::get_new_product),
        ),
        (
            Method::GET,
            "/admin/products/{sku}",
            super::get().to(products::get_product),
        ),
        (
            Method::POST,
            "/admin/products/{sku}",
            web::post().to(products::post_product),
        ),
        (
            Method::GET,
            "/admin/products/{sku}/thumb",
            super::get().to(pictures::get_product_thumb),
        ),
        (
            Method::POST,
            "/admin/products/{sku}/image",
            web::post().to(pictures::post_product_image),
        ),
        (
            Method::POST,
            "/admin/products/{sku}/restock",
            web::post().to(stock::post_restock),
        ),
        (
            Method::POST,
            "/admin/products/{sku}/adjust",
            web::post().to(stock::post_adjust),
        ),
        (
            Method::GET,
            "/admin/products/{sku}/ledger",
            super::get().to(stock::get_ledger),
        ),
        (
            Method::GET,
            "/admin/orders",
            super::get().to(orders::get_orders),
        ),
        (
            Method::GET,
            "/admin/orders/{id}",
            super::get().to(orders::get_order),
        ),
        (
            Method::POST,
            "/admin/orders/{id}/cancel",
            web::post().to(orders::post_cancel),
        ),
        (
            Method::GET,
            "/admin/holds",
            super::get().to(holds::get_holds),
        ),
        (
            Method::POST,
            "/admin/holds/{id}/release",
            web::post().to(holds::post_release_hold),
        ),
        (
            Method::GET,
            "/admin/drops",
            super::get().to(drops::get_drops),
        ),
        (
            Method::POST,
            "/admin/drops",
            web::post().to(drops::post_drops),
        ),
        (
            Method::GET,
            "/admin/drops/{id}",
            super::get().to(drops::get_drop),
        ),
        (
            Method::POST,
            "/admin/drops/{id}/{action}",
            web::post().to(drops::post_drop_change),
        ),
        (
            Method::GET,
            "/api/v1/admin/drops",
            super::get().to(api::drops::get_api_drops),
        ),
        (
            Method::POST,
            "/api/v1/admin/drops",
            web::post().to(api::drops::post_api_drops),
        ),
        (
            Method::GET,
            "/api/v1/admin/drops/{id}",
            super::get().to(api::drops::get_api_drop),
        ),
        (
            Method::POST,
            "/api/v1/admin/drops/{id}/{action}",
            web::post().to(api::drops::post_api_drop_change),
        ),
        (
            Method::GET,
            "/admin/api-clients",
            super::get().to(clients::get_api_clients),
        ),
        (
            Method::POST,
            "/admin/api-clients",
            web::post().to(clients::post_api_clients),
        ),
        (
            Method::POST,
            "/admin/api-clients/{id}/revoke",
            web::post().to(clients::post_revoke_api_client),
        ),
        (
            Method::GET,
            "/admin/webhooks",
            super::get().to(webhooks::get_webhooks),
        ),
        (
            Method::POST,
            "/admin/webhooks",
            web::post().to(webhooks::post_webhooks),
        ),
        (
            Method::POST,
            "/admin/webhooks/{id}/delete",
            web::post().to(webhooks::post_delete_webhook),
        ),
        (
            Method::GET,
            "/admin/deliveries",
            super::get().to(webhooks::get_deliveries),
        ),
        (
            Method::POST,
            "/admin/deliveries/{id}/resend",
            web::post().to(webhooks::post_resend_delivery),
        ),
        (
            Method::GET,
            "/api/v1/admin/webhooks",
            super::get().to(api::get_api_webhooks),
        ),
        (
            Method::POST,
            "/api/v1/admin/webhooks",
            web::post().to(api::post_api_webhooks),
        ),
        (
            Method::GET,
            "/api/v1/admin/webhooks/deliveries",
            super::get().to(api::get_api_deliveries),
        ),
        (
            Method::POST,
            "/api/v1/admin/webhooks/deliveries/{id}/resend",
            web::post().to(api::post_api_resend_delivery),
        ),
        (
            Method::DELETE,
            "/api/v1/admin/webhooks/{id}",
            web::delete().to(api::delete_api_webhook),
        ),
        (
            Method::GET,
            "/api/v1/admin/dashboard",
            super::get().to(api::get_dashboard_json),
        ),
        (
            Method::PATCH,
            "/api/v1/admin/products/{sku}",
            web::patch().to(api::patch_api_product),
        ),
        (
            Method::POST,
            "/api/v1/admin/stock/{sku}/restock",
            web::post().to(api::post_api_restock),
        ),
        (
            Method::POST,
            "/api/v1/admin/stock/{sku}/adjust",
            web::post().to(api::post_api_adjust),
        ),
    ]
}

/// The method and path of every guarded route (for the route inventory test).
pub fn inventory() -> Vec<(Method, &'static str)> {
    routes().into_iter().map(|(m, p, _)| (m, p)).collect()
}

/// Registers the login pages and every guarded route, each behind [`require_admin`].
pub fn register(cfg: &mut web::ServiceConfig) {
    let open = vec![
        (
            Method::GET,
            "/admin/login",
            super::get().to(login::get_login),
        ),
        (
            Method::POST,
            "/admin/login",
            web::post().to(login::post_login),
        ),
        (
            Method::POST,
            "/admin/logout",
            web::post().to(login::post_logout),
        ),
    ];
    let mut open = super::resources(open);
    let mut guarded = super::resources(routes());
    // One scope per prefix (see [`super::routes`]), each path in the order listed (so
    // `/products/new` wins over `{sku}`); every admin path is under one of them.
    for prefix in PREFIXES {
        let scope = super::add_under(web::scope(prefix), prefix, &mut open, |r| r);
        let scope = super::add_under(scope, prefix, &mut guarded, |r| {
            r.wrap(from_fn(require_admin))
        });
        cfg.service(scope);
    }
}

/// The path prefixes of the admin's routes, one route scope each.
const PREFIXES: [&str; 2] = ["/admin", "/api/v1/admin"];

/// Lets a request through only with a live admin session, which it leaves in the request
/// for the [`Admin`] extractor.
pub async fn require_admin(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let state = req
        .app_data::<web::Data<AppState>>()
        .cloned()
        .expect("app state is registered");
    let token = req
        .cookie(super::cookie_name(req.request(), SESSION_COOKIE))
        .map(|c| c.value().to_string());
    let admin = match token {
        Some(token) => match admin::session(&state.db, &token).await {
            Ok(admin) => admin,
            Err(e) => return Ok(req.error_response(AppError::from(e)).map_into_right_body()),
        },
        None => None,
    };
    let refusal = match admin {
        Some(admin) => {
            req.extensions_mut().insert(admin);
            return Ok(next.call(req).await?.map_into_left_body());
        }
        None if crate::http::is_api(req.path()) => {
            AppError::Unauthorized("Log in as an admin first.".into())
        }
        None => AppError::LoginRequired {
            next: match req.method() {
                &Method::GET => req.uri().to_string(),
                _ => "/admin".to_string(),
            },
        },
    };
    // Answered as a response (not an `Err`), so the outer middleware renders it.
    Ok(req.error_response(refusal).map_into_right_body())
}

impl FromRequest for Admin {
    type Error = AppError;
    type Future = std::future::Ready<Result<Self, AppError>>;

    fn from_request(req: &HttpRequest, _: &mut actix_web::dev::Payload) -> Self::Future {
        std::future::ready(
            req.extensions()
                .get::<Admin>()
                .cloned()
                .ok_or_else(|| AppError::Unauthorized("Log in as an admin first.".into())),
        )
    }
}

fn page_chrome(req: &HttpRequest, admin: &Admin) -> Chrome {
    let mut chrome = Chrome::new(req);
    chrome.admin = Some(admin.username.clone());
    chrome.admin_csrf = admin.csrf.clone();
    chrome
}

/// An admin API write: the session's admin, whose request carries the session's CSRF
/// token (`X-CSRF-Token`). Taken before the body, it refuses a forged request (403) before
/// anything of its body is read: such a request learns nothing, not even how its body is
/// wrong.
pub struct AdminWrite(pub Admin);

impl FromRequest for AdminWrite {
    type Error = AppError;
    type Future = std::future::Ready<Result<Self, AppError>>;

    fn from_request(req: &HttpRequest, payload: &mut actix_web::dev::Payload) -> Self::Future {
        let checked = Admin::from_request(req, payload)
            .into_inner()
            .and_then(|admin| check_api_csrf(req, &admin).map(|()| AdminWrite(admin)));
        std::future::ready(checked)
    }
}

/// The admin API's CSRF token, sent as a header by browser clients of the API.
fn check_api_csrf(req: &HttpRequest, admin: &Admin) -> Result<(), AppError> {
    let token = req
        .headers()
        .get("x-csrf-token")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    csrf::check_admin(admin, token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_admin_route_is_under_one_of_the_scoped_prefixes() {
        let mut all = crate::http::resources(routes());
        for prefix in PREFIXES {
            crate::http::take_under(&mut all, prefix);
        }
        let outside: Vec<&str> = all.iter().map(|(p, _, _)| *p).collect();
        assert!(
            outside.is_empty(),
            "not under a scope, so not served: {outside:?}"
        );
    }

    #[test]
    fn a_page_skips_the_rows_before_it_and_counts_partial_pages() {
        let third = Page::of(Some(3), 25);
        assert_eq!(third.offset(), 50);
        assert_eq!(third.count(0), 1);
        assert_eq!(third.count(25), 1);
        assert_eq!(third.count(26), 2);
        assert_eq!(third.count(75), 3);
    }

    #[test]
    fn pages_out_of_range_are_clamped() {
        assert_eq!(Page::of(None, 25).number, 1);
        assert_eq!(Page::of(Some(0), 25).number, 1);
        assert_eq!(Page::of(Some(-7), 25).offset(), 0);
        assert_eq!(Page::of(Some(i64::MAX), 50).number, MAX_PAGE);
    }
}
