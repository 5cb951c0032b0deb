//! The admin pages and the admin JSON API, behind a login.
//!
//! Every admin route is listed once, in [`routes`]; [`register`] wraps each in the
//! [`require_admin`] middleware, so none can be added without the guard, and the route
//! inventory test walks the same list. Anonymous requests are sent to the login page
//! (pages) or answered 401 (API). Every POST carries the session's CSRF token.
//!
//! Every stock change (the stock forms and the stock API) is applied once per idempotency
//! key, by `apply_once`: forms carry a key made when they are rendered, and answer 303 to
//! a page that shows the result (`?done=<key>`), so a refresh, a double click or a resubmit
//! from the back button replays that answer instead of changing stock again.

use std::time::{Duration, Instant};

use actix_web::body::MessageBody;
use actix_web::cookie::{Cookie, SameSite};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::{Method, StatusCode, header};
use actix_web::middleware::{Next, from_fn};
use actix_web::{FromRequest, HttpMessage, HttpRequest, HttpResponse, web};
use askama::Template;
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use uuid::Uuid;

use super::shop::TokenForm;
use super::{AppState, Chrome, csrf, detached, html, see_other};
use crate::admin::{self, Admin, Attempt, LoginLimits};
use crate::catalog::{self, Sku, format_cents, images};
use crate::error::AppError;
use crate::idempotency::{self, Begin, IdempotencyKey, Scope, StoredResponse};
use crate::inventory::db::{self as stock, Adjusted, Movement};
use crate::orders::db::{OrderFilter, OrderSummary};
use crate::orders::{self, Cancelled, Order};

/// The admin session cookie (its name: [`super::cookie_name`]).
pub const SESSION_COOKIE: &str = "stockade_admin";
/// Rows per page in admin lists.
const PAGE: i64 = 25;
/// Pages beyond this are shown as this one.
const MAX_PAGE: i64 = 1_000_000;

/// Every route that needs an admin, in one place: `(method, path, handler)`.
pub fn routes() -> Vec<(Method, &'static str, actix_web::Route)> {
    vec![
        (Method::GET, "/admin", super::get().to(get_dashboard)),
        (
            Method::GET,
            "/admin/products",
            super::get().to(get_products),
        ),
        (
            Method::POST,
            "/admin/products",
            web::post().to(post_products),
        ),
        (
            Method::GET,
            "/admin/products/new",
            super::get().to(get_new_product),
        ),
        (
            Method::GET,
            "/admin/products/{sku}",
            super::get().to(get_product),
        ),
        (
            Method::POST,
            "/admin/products/{sku}",
            web::post().to(post_product),
        ),
        (
            Method::POST,
            "/admin/products/{sku}/image",
            web::post().to(post_product_image),
        ),
        (
            Method::POST,
            "/admin/products/{sku}/restock",
            web::post().to(post_restock),
        ),
        (
            Method::POST,
            "/admin/products/{sku}/adjust",
            web::post().to(post_adjust),
        ),
        (
            Method::GET,
            "/admin/products/{sku}/ledger",
            super::get().to(get_ledger),
        ),
        (Method::GET, "/admin/orders", super::get().to(get_orders)),
        (
            Method::GET,
            "/admin/orders/{id}",
            super::get().to(get_order),
        ),
        (
            Method::POST,
            "/admin/orders/{id}/cancel",
            web::post().to(post_cancel),
        ),
        (Method::GET, "/admin/holds", super::get().to(get_holds)),
        (
            Method::POST,
            "/admin/holds/{id}/release",
            web::post().to(post_release_hold),
        ),
        (
            Method::GET,
            "/admin/api-clients",
            super::get().to(super::admin_clients::get_api_clients),
        ),
        (
            Method::POST,
            "/admin/api-clients",
            web::post().to(super::admin_clients::post_api_clients),
        ),
        (
            Method::POST,
            "/admin/api-clients/{id}/revoke",
            web::post().to(super::admin_clients::post_revoke_api_client),
        ),
        (
            Method::GET,
            "/admin/webhooks",
            web::get().to(super::admin_webhooks::get_webhooks),
        ),
        (
            Method::POST,
            "/admin/webhooks",
            web::post().to(super::admin_webhooks::post_webhooks),
        ),
        (
            Method::POST,
            "/admin/webhooks/{id}/delete",
            web::post().to(super::admin_webhooks::post_delete_webhook),
        ),
        (
            Method::GET,
            "/admin/deliveries",
            web::get().to(super::admin_webhooks::get_deliveries),
        ),
        (
            Method::POST,
            "/admin/deliveries/{id}/resend",
            web::post().to(super::admin_webhooks::post_resend_delivery),
        ),
        (
            Method::GET,
            "/api/v1/admin/webhooks",
            web::get().to(super::admin_webhooks::get_api_webhooks),
        ),
        (
            Method::POST,
            "/api/v1/admin/webhooks",
            web::post().to(super::admin_webhooks::post_api_webhooks),
        ),
        (
            Method::GET,
            "/api/v1/admin/webhooks/deliveries",
            web::get().to(super::admin_webhooks::get_api_deliveries),
        ),
        (
            Method::POST,
            "/api/v1/admin/webhooks/deliveries/{id}/resend",
            web::post().to(super::admin_webhooks::post_api_resend_delivery),
        ),
        (
            Method::DELETE,
            "/api/v1/admin/webhooks/{id}",
            web::delete().to(super::admin_webhooks::delete_api_webhook),
        ),
        (
            Method::GET,
            "/api/v1/admin/dashboard",
            super::get().to(get_dashboard_json),
        ),
        (
            Method::PATCH,
            "/api/v1/admin/products/{sku}",
            web::patch().to(patch_api_product),
        ),
        (
            Method::POST,
            "/api/v1/admin/stock/{sku}/restock",
            web::post().to(post_api_restock),
        ),
        (
            Method::POST,
            "/api/v1/admin/stock/{sku}/adjust",
            web::post().to(post_api_adjust),
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
        (Method::GET, "/admin/login", super::get().to(get_login)),
        (Method::POST, "/admin/login", web::post().to(post_login)),
        (Method::POST, "/admin/logout", web::post().to(post_logout)),
    ];
    super::register(cfg, open);
    // One resource per path, in the order listed (so `/products/new` wins over `{sku}`).
    for (path, methods, list) in super::resources(routes()) {
        let mut resource = web::resource(path)
            .wrap(from_fn(require_admin))
            .default_service(super::method_not_allowed(methods));
        for route in list {
            resource = resource.route(route);
        }
        cfg.service(resource);
    }
}

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
        None if req.path().starts_with("/api/") => {
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

pub(super) fn page_chrome(req: &HttpRequest, admin: &Admin) -> Chrome {
    let mut chrome = Chrome::new(req);
    chrome.admin = Some(admin.username.clone());
    chrome.admin_csrf = admin.csrf.clone();
    chrome
}

fn session_cookie(req: &HttpRequest, token: &str) -> Cookie<'static> {
    let mut cookie = super::cookie(req, SESSION_COOKIE, token.to_string(), SameSite::Strict);
    cookie.set_max_age(actix_web::cookie::time::Duration::seconds(
        admin::SESSION_LENGTH.as_secs() as i64,
    ));
    cookie
}

// ---------------------------------------------------------------- login and logout

#[derive(Template)]
#[template(path = "admin/login.html")]
struct LoginPage {
    chrome: Chrome,
    next: String,
    username: String,
    error: Option<String>,
}

#[derive(Deserialize)]
pub struct NextQuery {
    next: Option<String>,
}

/// Only local paths are followed after login.
fn safe_next(next: Option<&str>) -> String {
    match next {
        Some(n)
            if n.starts_with("/admin")
                && n.len() <= 512
                && n.bytes().all(|b| b.is_ascii_graphic()) =>
        {
            n.to_string()
        }
        _ => "/admin".to_string(),
    }
}

pub async fn get_login(
    req: HttpRequest,
    query: web::Query<NextQuery>,
) -> Result<HttpResponse, AppError> {
    let page = LoginPage {
        chrome: Chrome::new(&req),
        next: safe_next(query.next.as_deref()),
        username: String::new(),
        error: None,
    };
    html(StatusCode::OK, &page)
}

#[derive(Deserialize)]
pub struct LoginForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    username: String,
    #[serde(default)]
    password: String,
    next: Option<String>,
}

#[tracing::instrument(skip_all)]
pub async fn post_login(
    req: HttpRequest,
    state: web::Data<AppState>,
    form: web::Form<LoginForm>,
) -> Result<HttpResponse, AppError> {
    csrf::check_storefront(&req, &form.csrf)?;
    crate::text::single_line("username", &form.username)?;
    let username = form.username.trim().to_lowercase();
    let client = super::client_addr(&req, &state.settings);
    let s = &state.settings;
    let limits = LoginLimits {
        per_account: s.login_max_failures,
        per_client: s.login_max_failures_per_client,
        window: s.login_window,
    };
    let attempt = match admin::begin_attempt(&state.db, limits, &username, client).await? {
        Attempt::Allowed(attempt) => attempt,
        Attempt::Throttled(retry_after) => {
            tracing::warn!(%client, "login throttled");
            return Err(AppError::TooManyRequests {
                message: "Too many failed logins. Please wait a while before trying again.".into(),
                retry_after,
            });
        }
    };
    let Some(user_id) = admin::authenticate(&state.db, &username, &form.password).await? else {
        tracing::info!(%client, "failed admin login");
        let page = LoginPage {
            chrome: Chrome::new(&req),
            next: safe_next(form.next.as_deref()),
            username: form.username.chars().take(64).collect(),
            error: Some("Wrong username or password.".into()),
        };
        return html(StatusCode::UNAUTHORIZED, &page);
    };
    admin::forgive(&state.db, &attempt).await?;
    // A new session every login: a session id planted before login is worth nothing.
    if let Some(old) = req.cookie(super::cookie_name(&req, SESSION_COOKIE)) {
        admin::end_session(&state.db, old.value()).await?;
    }
    let token = admin::start_session(&state.db, user_id).await?;
    tracing::info!(username, "admin logged in");
    Ok(HttpResponse::SeeOther()
        .insert_header((header::LOCATION, safe_next(form.next.as_deref())))
        .cookie(session_cookie(&req, &token))
        .finish())
}

pub async fn post_logout(
    req: HttpRequest,
    state: web::Data<AppState>,
    form: web::Form<TokenForm>,
) -> Result<HttpResponse, AppError> {
    if let Some(cookie) = req.cookie(super::cookie_name(&req, SESSION_COOKIE)) {
        if let Some(admin) = admin::session(&state.db, cookie.value()).await? {
            csrf::check_admin(&admin, &form.csrf)?;
        }
        admin::end_session(&state.db, cookie.value()).await?;
    }
    let mut gone = super::cookie(&req, SESSION_COOKIE, String::new(), SameSite::Strict);
    gone.make_removal();
    Ok(HttpResponse::SeeOther()
        .insert_header((header::LOCATION, "/admin/login"))
        .cookie(gone)
        .finish())
}

// ---------------------------------------------------------------- dashboard

/// The numbers on the dashboard (also its JSON, polled for live updates).
#[derive(Debug, Clone, Serialize)]
pub struct Dashboard {
    pub on_hand: i64,
    pub reserved: i64,
    pub available: i64,
    pub orders_today: i64,
    pub revenue_today_cents: i64,
    pub revenue_today: String,
    pub active_holds: i64,
    pub low_stock: Vec<StockRow>,
    pub sold_out: Vec<StockRow>,
    pub recent_orders: Vec<RecentOrder>,
    pub strategy: String,
    /// `up`, or `degraded` while Redis is unreachable.
    pub lease_layer: String,
    /// Events out: deliveries pending, sent, failed, and the oldest pending's age.
    pub events: crate::events::db::Stats,
    /// How far the read replica is behind ("no replica", "down", or its lag).
    pub replica: String,
}

#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct StockRow {
    pub sku: String,
    pub name: String,
    pub on_hand: i32,
    pub reserved: i32,
    pub available: i32,
}

#[derive(Debug, Clone, Serialize)]
pub struct RecentOrder {
    pub id: Uuid,
    pub reference: String,
    pub status: String,
    pub total: String,
    pub units: i64,
    pub at: String,
}

async fn dashboard(state: &AppState) -> Result<Dashboard, AppError> {
    let db = state.read_pool();
    let (on_hand, reserved): (i64, i64) = sqlx::query_as(
        "select coalesce(sum(on_hand), 0)::bigint, coalesce(sum(reserved), 0)::bigint from stock",
    )
    .fetch_one(db)
    .await?;
    let (orders_today, revenue): (i64, i64) = sqlx::query_as(
        r#"select count(*), coalesce(sum(total_cents), 0)::bigint from orders
            where status = 'placed' and created_at >= date_trunc('day', now())"#,
    )
    .fetch_one(db)
    .await?;
    let active_holds: i64 = sqlx::query_scalar(
        "select count(*) from holds where state = 'active' and expires_at > now()",
    )
    .fetch_one(db)
    .await?;
    let stock_rows = |condition: &'static str| {
        sqlx::query_as::<_, StockRow>(sqlx::AssertSqlSafe(format!(
            r#"select p.sku, p.name, s.on_hand, s.reserved, s.on_hand - s.reserved as available
                 from stock s join products p on p.sku = s.sku
                where p.active and {condition}
                order by s.on_hand - s.reserved, p.sku limit 12"#
        )))
        .fetch_all(db)
    };
    let low_stock = stock_rows("s.on_hand - s.reserved between 1 and 5").await?;
    let sold_out = stock_rows("s.on_hand - s.reserved <= 0").await?;
    let (recent, _) = orders::db::list_orders(db, &OrderFilter::default(), 8, 0).await?;
    let redis_up = tokio::time::timeout(Duration::from_secs(1), state.redis.ping())
        .await
        .is_ok_and(|r| r.is_ok());
    Ok(Dashboard {
        on_hand,
        reserved,
        available: on_hand - reserved,
        orders_today,
        revenue_today_cents: revenue,
        revenue_today: format_cents(revenue),
        active_holds,
        low_stock,
        sold_out,
        recent_orders: recent.into_iter().map(recent_order).collect(),
        strategy: state.settings.order_strategy.to_string(),
        lease_layer: if redis_up { "up" } else { "degraded" }.into(),
        events: crate::events::db::stats(db).await?,
        replica: match &state.replica {
            None => "none".into(),
            Some(r) => match r.lag() {
                Some((ms, bytes)) => format!("{ms} ms behind ({bytes} bytes of WAL)"),
                None => "down; reads on the primary".into(),
            },
        },
    })
}

fn recent_order(o: OrderSummary) -> RecentOrder {
    RecentOrder {
        reference: o.id.simple().to_string()[..8].to_uppercase(),
        id: o.id,
        status: o.status,
        total: format_cents(o.total_cents),
        units: o.units,
        at: o.created_at.format("%H:%M:%S").to_string(),
    }
}

#[derive(Template)]
#[template(path = "admin/dashboard.html")]
struct DashboardPage {
    chrome: Chrome,
    d: Dashboard,
}

pub async fn get_dashboard(
    req: HttpRequest,
    admin: Admin,
    state: web::Data<AppState>,
) -> Result<HttpResponse, AppError> {
    let page = DashboardPage {
        chrome: page_chrome(&req, &admin),
        d: dashboard(&state).await?,
    };
    html(StatusCode::OK, &page)
}

pub async fn get_dashboard_json(
    _admin: Admin,
    state: web::Data<AppState>,
) -> Result<HttpResponse, AppError> {
    Ok(HttpResponse::Ok()
        .insert_header((header::CACHE_CONTROL, "no-store"))
        .json(dashboard(&state).await?))
}

// ---------------------------------------------------------------- stock changes, applied once

/// How long a second press of a stock form (a double click, a refresh while the first is
/// still running) waits for the first to finish before it is answered 409.
const SECOND_PRESS_WAIT: Duration = Duration::from_secs(2);

/// A stock change that went through, and the transaction it is still open in: the
/// idempotency record is completed in that same transaction, so the change and the record
/// of it commit together or not at all.
struct Changed {
    tx: sqlx::Transaction<'static, sqlx::Postgres>,
    status: u16,
    body: serde_json::Value,
}

/// What claiming a key for a stock change came to.
enum Once {
    /// The change ran now; this answer is stored under the key.
    Applied(StoredResponse),
    /// The change ran before under this key: its stored answer. Nothing ran now.
    Replayed(StoredResponse),
    /// The key was used before for a change with other values. Nothing ran.
    Mismatch,
    /// The key's first request is still running. Nothing ran.
    InFlight,
}

/// An admin's own key space: `{admin id}:{key}`, so two admins never share a key.
fn admin_key(admin: &Admin, key: &IdempotencyKey) -> Result<IdempotencyKey, AppError> {
    IdempotencyKey::parse(&format!("{}:{}", admin.id, key.as_str()))
        .map_err(|_| AppError::BadRequest("The Idempotency-Key is too long.".into()))
}

/// Runs `change` at most once per `key`, by the orders' protocol: the key is claimed, the
/// change runs and the key is completed with its answer in the change's own transaction; a
/// change that fails (`Err`, which is not stored) releases the key so a retry starts
/// afresh. While the key's first request is still running, waits up to `wait` for it.
///
/// The outer error is the machinery's (the database), the inner one the change's. It runs
/// as its own task, so a client that goes away leaves the key completed or released, never
/// stuck in flight.
async fn apply_once<E, F>(
    state: &AppState,
    scope: Scope,
    key: IdempotencyKey,
    fingerprint: &impl Serialize,
    wait: Duration,
    change: F,
) -> Result<Result<Once, E>, AppError>
where
    E: 'static,
    F: AsyncFnOnce(&PgPool) -> Result<Changed, E> + 'static,
{
    let fingerprint = idempotency::Fingerprint::of(fingerprint);
    let stale = crate::checkout::stale_after(&state.settings);
    let db = state.db.clone();
    detached(async move {
        let deadline = Instant::now() + wait;
        let mut pause = Duration::from_millis(20);
        let claim = loop {
            match idempotency::begin(&db, scope, &key, &fingerprint, stale).await? {
                Begin::Started(claim) => break claim,
                Begin::Replay(stored) => return Ok(Ok(Once::Replayed(stored))),
                Begin::Mismatch => return Ok(Ok(Once::Mismatch)),
                Begin::InFlight if Instant::now() < deadline => {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(200));
                }
                Begin::InFlight => return Ok(Ok(Once::InFlight)),
            }
        };
        match change(&db).await {
            Ok(Changed {
                mut tx,
                status,
                body,
            }) => {
                let stored = StoredResponse { status, body };
                if !idempotency::complete(&mut tx, &claim, &stored).await? {
                    tx.rollback().await?;
                    return Err(AppError::conflict(
                        "This request was taken over by a retry.",
                    ));
                }
                tx.commit().await?;
                Ok(Ok(Once::Applied(stored)))
            }
            Err(e) => {
                idempotency::abandon(&db, &claim).await?;
                Ok(Err(e))
            }
        }
    })
    .await?
}

/// What a stock form did, stored under the form's key: the page that shows the result, and
/// the notice it shows there.
#[derive(Debug, Serialize, Deserialize)]
struct FormOutcome {
    page: String,
    notice: String,
}

impl FormOutcome {
    /// A form's change that went through in `tx`, answered by this outcome.
    fn changed(self, tx: sqlx::Transaction<'static, sqlx::Postgres>) -> Changed {
        Changed {
            tx,
            status: StatusCode::SEE_OTHER.as_u16(),
            body: serde_json::to_value(self).expect("a form outcome is plain JSON"),
        }
    }
}

/// A fresh key for a stock form being rendered.
fn new_form_key() -> String {
    IdempotencyKey::generate().as_str().to_string()
}

/// The hidden key a stock form carries (made when the form was rendered).
fn form_key(raw: &str) -> Result<IdempotencyKey, AppError> {
    IdempotencyKey::parse(raw).map_err(|_| {
        AppError::BadRequest(
            "This form is out of date or damaged; reload the page and submit it again.".into(),
        )
    })
}

/// Runs a stock form's change once per form key (and admin), and answers post/redirect/get:
/// 303 to the page that shows the result, the first time and for every replay of the same
/// form (a refresh, a double click, going back and submitting again); 422 when the key
/// comes back with other values; 409 while its first request is still running.
async fn apply_form<E, F>(
    state: &AppState,
    admin: &Admin,
    key: &IdempotencyKey,
    fingerprint: &impl Serialize,
    change: F,
) -> Result<Result<HttpResponse, E>, AppError>
where
    E: 'static,
    F: AsyncFnOnce(&PgPool) -> Result<Changed, E> + 'static,
{
    let scoped = admin_key(admin, key)?;
    let once = apply_once(
        state,
        Scope::AdminForm,
        scoped,
        fingerprint,
        SECOND_PRESS_WAIT,
        change,
    )
    .await?;
    let stored = match once {
        Err(e) => return Ok(Err(e)),
        Ok(Once::Applied(stored) | Once::Replayed(stored)) => stored,
        Ok(Once::Mismatch) => {
            return Err(AppError::Unprocessable(
                "This form was already submitted with other values, so these were not \
                 applied and nothing changed. Open the page again for a fresh form."
                    .into(),
            ));
        }
        Ok(Once::InFlight) => {
            return Err(AppError::Conflict {
                message: "This form was sent twice and the first is still being applied; \
                          nothing was done twice. Reload the page in a moment to see the result."
                    .into(),
                retry_after: Some(1),
                details: None,
            });
        }
    };
    let outcome: FormOutcome =
        serde_json::from_value(stored.body).map_err(|e| AppError::Internal(e.into()))?;
    let done = crate::error::percent_encode(key.as_str());
    Ok(Ok(see_other(&format!("{}?done={done}", outcome.page))))
}

/// `?done=<form key>` on a page a stock form redirected to.
#[derive(Deserialize)]
pub struct DoneQuery {
    done: Option<String>,
}

/// The notice of this admin's stock form `done`, if it was applied and shows on `page`.
async fn done_notice(
    state: &AppState,
    admin: &Admin,
    page: &str,
    done: Option<&str>,
) -> Result<Option<String>, AppError> {
    let Some(key) = done.and_then(|raw| IdempotencyKey::parse(raw).ok()) else {
        return Ok(None);
    };
    let Ok(key) = admin_key(admin, &key) else {
        return Ok(None);
    };
    let stored = idempotency::stored(&state.db, Scope::AdminForm, &key).await?;
    Ok(stored
        .and_then(|s| serde_json::from_value::<FormOutcome>(s.body).ok())
        .filter(|outcome| outcome.page == page)
        .map(|outcome| outcome.notice))
}

// ---------------------------------------------------------------- products

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct ProductRow {
    pub sku: String,
    pub name: String,
    pub description: String,
    pub price_cents: i64,
    pub active: bool,
    pub on_hand: i32,
    pub reserved: i32,
    /// At most this many per customer (none: no limit).
    pub purchase_limit: Option<i32>,
    pub category: Option<String>,
    /// The picture's ETag, when it has one (read on the product page only).
    #[sqlx(default)]
    pub image: Option<String>,
}

impl ProductRow {
    pub fn price(&self) -> String {
        format_cents(self.price_cents)
    }
    pub fn price_input(&self) -> String {
        format!("{}.{:02}", self.price_cents / 100, self.price_cents % 100)
    }
    pub fn available(&self) -> i32 {
        self.on_hand - self.reserved
    }
    pub fn category_input(&self) -> &str {
        self.category.as_deref().unwrap_or_default()
    }
    pub fn limit_input(&self) -> String {
        self.purchase_limit
            .map(|n| n.to_string())
            .unwrap_or_default()
    }
}

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
    let page = query.page.unwrap_or(1).clamp(1, MAX_PAGE);
    let pattern = format!(
        "%{}%",
        q.replace('\\', "\\\\")
            .replace('%', "\\%")
            .replace('_', "\\_")
    );
    let products: Vec<ProductRow> = sqlx::query_as(
        r#"select p.sku, p.name, p.description, p.price_cents, p.active, s.on_hand, s.reserved,
                  p.purchase_limit, p.category
             from products p join stock s on s.sku = p.sku
            where p.sku ilike $1 or p.name ilike $1
            order by p.sku limit $2 offset $3"#,
    )
    .bind(&pattern)
    .bind(PAGE)
    .bind((page - 1) * PAGE)
    .fetch_all(&state.db)
    .await?;
    let total: i64 = sqlx::query_scalar(
        "select count(*) from products p where p.sku ilike $1 or p.name ilike $1",
    )
    .bind(&pattern)
    .fetch_one(&state.db)
    .await?;
    let page = ProductsPage {
        chrome: page_chrome(&req, &admin),
        products,
        q,
        page,
        pages: ((total + PAGE - 1) / PAGE).max(1),
    };
    html(StatusCode::OK, &page)
}

#[derive(Template)]
#[template(path = "admin/product.html")]
struct ProductPage {
    chrome: Chrome,
    product: ProductRow,
    is_new: bool,
    /// A message for the person, and whether it is bad news.
    notice: Option<(String, bool)>,
    /// Another admin's or a shopper's change moved stock under this form.
    moved: Option<i32>,
    /// Fresh idempotency keys for the "add units" and "set the count" forms.
    restock_key: String,
    adjust_key: String,
}

async fn load_product(state: &AppState, raw: &str) -> Result<ProductRow, AppError> {
    let not_found = || AppError::not_found(format!("No product with SKU {raw:?}."));
    let sku = Sku::parse(raw).map_err(|_| not_found())?;
    sqlx::query_as(
        r#"select p.sku, p.name, p.description, p.price_cents, p.active, s.on_hand, s.reserved,
                  p.purchase_limit, p.category, i.image_etag as image
             from products p join stock s on s.sku = p.sku
             left join product_images i on i.sku = p.sku
            where p.sku = $1"#,
    )
    .bind(sku.as_str())
    .fetch_optional(&state.db)
    .await?
    .ok_or_else(not_found)
}

pub async fn get_new_product(req: HttpRequest, admin: Admin) -> Result<HttpResponse, AppError> {
    let page = ProductPage {
        chrome: page_chrome(&req, &admin),
        product: ProductRow {
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
        },
        is_new: true,
        notice: None,
        moved: None,
        restock_key: new_form_key(),
        adjust_key: new_form_key(),
    };
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

/// A product form's fields, checked.
struct ProductFields {
    name: String,
    description: String,
    price_cents: i64,
    purchase_limit: Option<i32>,
    category: Option<String>,
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
        let page = ProductPage {
            chrome: page_chrome(&req, &admin),
            product: form_product(&form),
            is_new: true,
            notice: Some((crate::error::sentence(&message), true)),
            moved: None,
            restock_key: new_form_key(),
            adjust_key: new_form_key(),
        };
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
    let created = sqlx::query(
        r#"insert into products (sku, name, description, price_cents, active, purchase_limit,
                                 category)
           values ($1, $2, $3, $4, $5, $6, $7) on conflict (sku) do nothing"#,
    )
    .bind(sku.as_str())
    .bind(&fields.name)
    .bind(&fields.description)
    .bind(fields.price_cents)
    .bind(form.active.is_some())
    .bind(fields.purchase_limit)
    .bind(&fields.category)
    .execute(&mut *tx)
    .await?
    .rows_affected()
        == 1;
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
    path: web::Path<String>,
    query: web::Query<DoneQuery>,
) -> Result<HttpResponse, AppError> {
    let product = load_product(&state, &path).await?;
    let page = format!("/admin/products/{}", product.sku);
    let notice = done_notice(&state, &admin, &page, query.done.as_deref()).await?;
    let page = ProductPage {
        chrome: page_chrome(&req, &admin),
        product,
        is_new: false,
        notice: notice.map(|n| (n, false)),
        moved: None,
        restock_key: new_form_key(),
        adjust_key: new_form_key(),
    };
    html(StatusCode::OK, &page)
}

pub async fn post_product(
    req: HttpRequest,
    admin: Admin,
    state: web::Data<AppState>,
    path: web::Path<String>,
    form: web::Form<ProductForm>,
) -> Result<HttpResponse, AppError> {
    csrf::check_admin(&admin, &form.csrf)?;
    let mut product = load_product(&state, &path).await?;
    match check_product(&form) {
        Err(message) => {
            product.name = form.name.clone();
            product.description = form.description.clone();
            product.category = Some(form.category.clone());
            let page = ProductPage {
                chrome: page_chrome(&req, &admin),
                product,
                is_new: false,
                notice: Some((crate::error::sentence(&message), true)),
                moved: None,
                restock_key: new_form_key(),
                adjust_key: new_form_key(),
            };
            html(StatusCode::UNPROCESSABLE_ENTITY, &page)
        }
        Ok(fields) => {
            sqlx::query(
                r#"update products set name = $2, description = $3, price_cents = $4, active = $5,
                          purchase_limit = $6, category = $7
                    where sku = $1"#,
            )
            .bind(&product.sku)
            .bind(fields.name)
            .bind(fields.description)
            .bind(fields.price_cents)
            .bind(form.active.is_some())
            .bind(fields.purchase_limit)
            .bind(fields.category)
            .execute(&state.db)
            .await?;
            state
                .catalog
                .forget(&Sku::parse(&product.sku).expect("stored SKUs are valid"));
            Ok(see_other(&format!("/admin/products/{}", product.sku)))
        }
    }
}

/// Uploads a product's picture (a multipart form: `csrf`, then `image`). A refused file
/// leaves the product as it was and says why on its page.
#[tracing::instrument(skip_all, fields(sku = %path))]
pub async fn post_product_image(
    req: HttpRequest,
    admin: Admin,
    state: web::Data<AppState>,
    path: web::Path<String>,
    payload: web::Payload,
) -> Result<HttpResponse, AppError> {
    let product = load_product(&state, &path).await?;
    // The file, plus room for the form's other field and part headers.
    let cap = images::MAX_UPLOAD_BYTES + 64 * 1024;
    let parts = match super::multipart::read(
        &req,
        payload,
        cap,
        "The picture is larger than 5 MB; choose a smaller one (it is resized anyway).",
    )
    .await
    {
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
    // Decoding and encoding take real CPU time: off the request thread.
    let processed = web::block(move || images::process(&upload))
        .await
        .map_err(|e| AppError::Internal(e.into()))?;
    let processed = match processed {
        Ok(processed) => processed,
        Err(refused) => {
            let page = ProductPage {
                chrome: page_chrome(&req, &admin),
                product,
                is_new: false,
                notice: Some((
                    crate::error::sentence(&format!("picture not changed: {refused}")),
                    true,
                )),
                moved: None,
                restock_key: new_form_key(),
                adjust_key: new_form_key(),
            };
            return html(StatusCode::UNPROCESSABLE_ENTITY, &page);
        }
    };
    let sku = Sku::parse(&product.sku).expect("stored SKUs are valid");
    if !images::save(&state.db, &sku, &processed, &admin.username).await? {
        return Err(AppError::not_found(format!("No product with SKU {sku}.")));
    }
    state.catalog.forget(&sku);
    tracing::info!(bytes = processed.image.len(), "product picture replaced");
    Ok(see_other(&format!("/admin/products/{sku}")))
}

#[derive(Deserialize)]
pub struct StockForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    key: String,
    #[serde(default)]
    units: String,
    #[serde(default)]
    expected: String,
    #[serde(default)]
    on_hand: String,
    #[serde(default)]
    reason: String,
}

fn reason_of(raw: &str) -> Result<String, AppError> {
    crate::text::single_line("The reason", raw)?;
    let reason = raw.trim();
    if reason.is_empty() {
        return Err(AppError::Unprocessable(
            "Please give a reason for the change (it goes into the ledger).".into(),
        ));
    }
    if reason.chars().count() > 500 {
        return Err(AppError::Unprocessable(
            "A reason is at most 500 characters.".into(),
        ));
    }
    Ok(reason.to_string())
}

/// A restock that would take a product past what its count can hold.
fn too_much(units: i32) -> AppError {
    AppError::Unprocessable(format!(
        "Adding {units} units would take this product past the most it can have on hand \
         ({}); nothing was changed.",
        stock::MAX_ON_HAND
    ))
}

fn whole(raw: &str, what: &str, min: i32, max: i32) -> Result<i32, AppError> {
    raw.trim()
        .parse::<i32>()
        .ok()
        .filter(|n| (min..=max).contains(n))
        .ok_or_else(|| {
            AppError::Unprocessable(format!(
                "{what} must be a whole number from {min} to {max}."
            ))
        })
}

async fn product_notice(
    req: &HttpRequest,
    admin: &Admin,
    state: &AppState,
    sku: &str,
    status: StatusCode,
    notice: (String, bool),
    moved: Option<i32>,
) -> Result<HttpResponse, AppError> {
    let page = ProductPage {
        chrome: page_chrome(req, admin),
        product: load_product(state, sku).await?,
        is_new: false,
        notice: Some(notice),
        moved,
        restock_key: new_form_key(),
        adjust_key: new_form_key(),
    };
    html(status, &page)
}

/// "Add N units": a delta, which never conflicts with sales. Applied once per form.
pub async fn post_restock(
    req: HttpRequest,
    admin: Admin,
    state: web::Data<AppState>,
    path: web::Path<String>,
    form: web::Form<StockForm>,
) -> Result<HttpResponse, AppError> {
    csrf::check_admin(&admin, &form.csrf)?;
    let key = form_key(&form.key)?;
    let product = load_product(&state, &path).await?;
    let checked = whole(&form.units, "Units to add", 1, 10_000_000)
        .and_then(|units| Ok((units, reason_of(&form.reason)?)));
    let (units, reason) = match checked {
        Ok(v) => v,
        Err(e) => {
            let notice = (e.public_message(), true);
            return product_notice(
                &req,
                &admin,
                &state,
                &product.sku,
                StatusCode::UNPROCESSABLE_ENTITY,
                notice,
                None,
            )
            .await;
        }
    };
    let sku = Sku::parse(&product.sku).expect("stored SKUs are valid");
    let fingerprint = ("restock", sku.as_str(), units, reason.clone());
    let (restocked, actor) = (sku.clone(), admin.username.clone());
    let answer = apply_form(
        &state,
        &admin,
        &key,
        &fingerprint,
        async move |db: &PgPool| -> Result<Changed, AppError> {
            let mut tx = db.begin().await?;
            let on_hand = stock::restock(&mut tx, &restocked, units, &reason, &actor)
                .await?
                .ok_or_else(|| too_much(units))?;
            let outcome = FormOutcome {
                page: format!("/admin/products/{restocked}"),
                notice: format!("Added {units} units; {on_hand} on hand now."),
            };
            Ok(outcome.changed(tx))
        },
    )
    .await??;
    state.stock_changed(&sku).await;
    Ok(answer)
}

/// "Set the count to N": compare-and-set against the count the form was rendered with.
/// Applied once per form; when stock moved under the form, nothing is applied and the
/// form comes back (409) with the new figure.
pub async fn post_adjust(
    req: HttpRequest,
    admin: Admin,
    state: web::Data<AppState>,
    path: web::Path<String>,
    form: web::Form<StockForm>,
) -> Result<HttpResponse, AppError> {
    csrf::check_admin(&admin, &form.csrf)?;
    let key = form_key(&form.key)?;
    let product = load_product(&state, &path).await?;
    let checked = (|| {
        let expected = whole(&form.expected, "The count the form showed", 0, i32::MAX)?;
        let new = whole(&form.on_hand, "The new count", 0, 10_000_000)?;
        Ok::<_, AppError>((expected, new, reason_of(&form.reason)?))
    })();
    let (expected, new, reason) = match checked {
        Ok(v) => v,
        Err(e) => {
            let notice = (e.public_message(), true);
            return product_notice(
                &req,
                &admin,
                &state,
                &product.sku,
                StatusCode::UNPROCESSABLE_ENTITY,
                notice,
                None,
            )
            .await;
        }
    };
    let sku = Sku::parse(&product.sku).expect("stored SKUs are valid");
    let fingerprint = ("adjust", sku.as_str(), expected, new, reason.clone());
    let (adjusted, actor) = (sku.clone(), admin.username.clone());
    let answer = apply_form(
        &state,
        &admin,
        &key,
        &fingerprint,
        async move |db: &PgPool| -> Result<Changed, NotSet> {
            let mut tx = db.begin().await.map_err(AppError::from)?;
            let outcome = stock::adjust(&mut tx, &adjusted, expected, new, &reason, &actor)
                .await
                .map_err(AppError::from)?;
            match outcome {
                Adjusted::Done => {
                    let outcome = FormOutcome {
                        page: format!("/admin/products/{adjusted}"),
                        notice: format!("On hand set to {new}."),
                    };
                    Ok(outcome.changed(tx))
                }
                Adjusted::Moved { on_hand } => Err(NotSet::Moved { on_hand }),
                Adjusted::BelowReserved { reserved } => Err(NotSet::BelowReserved { reserved }),
            }
        },
    )
    .await?;
    let (notice, moved) = match answer {
        Ok(answer) => {
            state.stock_changed(&sku).await;
            return Ok(answer);
        }
        Err(NotSet::Failed(e)) => return Err(e),
        Err(NotSet::Moved { on_hand }) => (
            format!(
                "Stock moved while you were counting: the form showed {expected} on hand, \
                 now there are {on_hand}. Nothing was changed; check the new figure and \
                 submit again."
            ),
            Some(on_hand),
        ),
        Err(NotSet::BelowReserved { reserved }) => (
            format!("{reserved} units are held in checkouts; the count cannot go below that."),
            None,
        ),
    };
    let notice = (notice, true);
    product_notice(
        &req,
        &admin,
        &state,
        &product.sku,
        StatusCode::CONFLICT,
        notice,
        moved,
    )
    .await
}

/// Why a count was not set: stock moved under the form (nothing changed, nothing stored
/// under the key, so the same form may be sent again), or an error.
enum NotSet {
    Moved { on_hand: i32 },
    BelowReserved { reserved: i32 },
    Failed(AppError),
}

impl From<AppError> for NotSet {
    fn from(e: AppError) -> Self {
        Self::Failed(e)
    }
}

#[derive(Template)]
#[template(path = "admin/ledger.html")]
struct LedgerPage {
    chrome: Chrome,
    product: ProductRow,
    movements: Vec<Movement>,
    page: i64,
    pages: i64,
    /// After "verify": the ledger's on hand and reserved, whether they match, and the
    /// stock record's on hand and reserved (read in the same snapshot).
    verified: Option<(i64, i64, bool, i32, i32)>,
}

#[derive(Deserialize)]
pub struct LedgerQuery {
    page: Option<i64>,
    verify: Option<String>,
}

pub async fn get_ledger(
    req: HttpRequest,
    admin: Admin,
    state: web::Data<AppState>,
    path: web::Path<String>,
    query: web::Query<LedgerQuery>,
) -> Result<HttpResponse, AppError> {
    let product = load_product(&state, &path).await?;
    let sku = Sku::parse(&product.sku).expect("stored SKUs are valid");
    let page = query.page.unwrap_or(1).clamp(1, MAX_PAGE);
    let movements = stock::ledger(&state.db, &sku, PAGE * 2, (page - 1) * PAGE * 2).await?;
    let total = stock::ledger_len(&state.db, &sku).await?;
    let verified = match query.verify {
        Some(_) => {
            // One statement, one snapshot: sales in between cannot fake a mismatch.
            let (on_hand, reserved, ledger_on_hand, ledger_reserved): (i32, i32, i64, i64) =
                sqlx::query_as(
                    r#"select s.on_hand, s.reserved,
                              coalesce(sum(m.delta), 0)::bigint,
                              coalesce(sum(m.reserved_delta), 0)::bigint
                         from stock s left join stock_movements m on m.sku = s.sku
                        where s.sku = $1
                        group by s.on_hand, s.reserved"#,
                )
                .bind(sku.as_str())
                .fetch_one(&state.db)
                .await?;
            let ok = ledger_on_hand == i64::from(on_hand) && ledger_reserved == i64::from(reserved);
            Some((ledger_on_hand, ledger_reserved, ok, on_hand, reserved))
        }
        None => None,
    };
    let page = LedgerPage {
        chrome: page_chrome(&req, &admin),
        product,
        movements,
        page,
        pages: ((total + PAGE * 2 - 1) / (PAGE * 2)).max(1),
        verified,
    };
    html(StatusCode::OK, &page)
}

// ---------------------------------------------------------------- orders and holds

#[derive(Template)]
#[template(path = "admin/orders.html")]
struct OrdersPage {
    chrome: Chrome,
    orders: Vec<OrderSummary>,
    status: String,
    sku: String,
    date: String,
    page: i64,
    pages: i64,
    query: String,
}

#[derive(Deserialize)]
pub struct OrdersQuery {
    status: Option<String>,
    sku: Option<String>,
    date: Option<String>,
    page: Option<i64>,
}

pub async fn get_orders(
    req: HttpRequest,
    admin: Admin,
    state: web::Data<AppState>,
    query: web::Query<OrdersQuery>,
) -> Result<HttpResponse, AppError> {
    let text = |v: &Option<String>| {
        v.as_deref()
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
    };
    let status = text(&query.status);
    if let Some(s) = &status
        && s != "placed"
        && s != "cancelled"
    {
        return Err(AppError::Unprocessable(
            "Status is placed or cancelled.".into(),
        ));
    }
    let sku = match text(&query.sku) {
        Some(raw) => Some(
            Sku::parse(&raw)
                .map_err(|e| AppError::Unprocessable(e.to_string()))?
                .to_string(),
        ),
        None => None,
    };
    let date =
        match text(&query.date) {
            Some(raw) => Some(chrono::NaiveDate::parse_from_str(&raw, "%Y-%m-%d").map_err(
                |_| AppError::Unprocessable(format!("{raw:?} is not a date like 2026-11-30.")),
            )?),
            None => None,
        };
    let page = query.page.unwrap_or(1).clamp(1, MAX_PAGE);
    let filter = OrderFilter {
        status: status.clone(),
        sku: sku.clone(),
        date,
    };
    let (orders, total) =
        orders::db::list_orders(&state.db, &filter, PAGE, (page - 1) * PAGE).await?;
    let query_string = format!(
        "status={}&sku={}&date={}",
        status.clone().unwrap_or_default(),
        sku.clone().unwrap_or_default(),
        date.map(|d| d.to_string()).unwrap_or_default()
    );
    let page = OrdersPage {
        chrome: page_chrome(&req, &admin),
        orders,
        status: status.unwrap_or_default(),
        sku: sku.unwrap_or_default(),
        date: date.map(|d| d.to_string()).unwrap_or_default(),
        page,
        pages: ((total + PAGE - 1) / PAGE).max(1),
        query: query_string,
    };
    html(StatusCode::OK, &page)
}

#[derive(Template)]
#[template(path = "admin/order.html")]
struct OrderPage {
    chrome: Chrome,
    order: Order,
    notice: Option<String>,
    /// A fresh idempotency key for the cancel form.
    cancel_key: String,
}

async fn load_order(state: &AppState, raw: &str) -> Result<Order, AppError> {
    let not_found = || AppError::not_found(format!("No order with id {raw:?}."));
    let id = Uuid::parse_str(raw).map_err(|_| not_found())?;
    orders::db::find_order(&state.db, id)
        .await?
        .ok_or_else(not_found)
}

/// An order, with its cancel form; after cancelling, `?done=<key>` shows what it did.
pub async fn get_order(
    req: HttpRequest,
    admin: Admin,
    state: web::Data<AppState>,
    path: web::Path<String>,
    query: web::Query<DoneQuery>,
) -> Result<HttpResponse, AppError> {
    let order = load_order(&state, &path).await?;
    let page = format!("/admin/orders/{}", order.id);
    let page = OrderPage {
        chrome: page_chrome(&req, &admin),
        notice: done_notice(&state, &admin, &page, query.done.as_deref()).await?,
        order,
        cancel_key: new_form_key(),
    };
    html(StatusCode::OK, &page)
}

/// The forms that act on one thing (cancel an order, release a hold).
#[derive(Deserialize)]
pub struct ActionForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    key: String,
}

/// Cancels an order (its units come back through `cancel` ledger rows). Applied once per
/// form; cancelling an order that is already cancelled changes nothing and says so.
pub async fn post_cancel(
    admin: Admin,
    state: web::Data<AppState>,
    path: web::Path<String>,
    form: web::Form<ActionForm>,
) -> Result<HttpResponse, AppError> {
    csrf::check_admin(&admin, &form.csrf)?;
    let key = form_key(&form.key)?;
    let order = load_order(&state, &path).await?;
    let shared = state.clone().into_inner();
    let actor = admin.username.clone();
    apply_form(
        &state,
        &admin,
        &key,
        &("cancel", order.id),
        async move |db: &PgPool| -> Result<Changed, AppError> {
            // The cancel commits on its own, and only once per order however often it is
            // asked (it locks the order and checks its status); the key is completed just
            // after, so a retry that finds the key stale and takes it over is told
            // "already cancelled".
            let notice = match orders::cancel(db, order.id, &actor, "cancelled by an admin").await?
            {
                Some(Cancelled::Now) => {
                    for line in &order.lines {
                        shared.stock_changed(&line.sku).await;
                    }
                    "Order cancelled; its units are back in stock."
                }
                Some(Cancelled::Already) => "This order was already cancelled; nothing changed.",
                None => return Err(AppError::not_found("No such order.")),
            };
            let outcome = FormOutcome {
                page: format!("/admin/orders/{}", order.id),
                notice: notice.into(),
            };
            Ok(outcome.changed(db.begin().await?))
        },
    )
    .await?
}

#[derive(Template)]
#[template(path = "admin/holds.html")]
struct HoldsPage {
    chrome: Chrome,
    /// Each active hold, with a fresh idempotency key for its release form.
    holds: Vec<(crate::holds::Hold, String)>,
    notice: Option<String>,
}

/// The active holds; after a release, `?done=<key>` shows what it did.
pub async fn get_holds(
    req: HttpRequest,
    admin: Admin,
    state: web::Data<AppState>,
    query: web::Query<DoneQuery>,
) -> Result<HttpResponse, AppError> {
    let holds = crate::holds::db::active_holds(&state.db, 200).await?;
    let page = HoldsPage {
        chrome: page_chrome(&req, &admin),
        holds: holds.into_iter().map(|h| (h, new_form_key())).collect(),
        notice: done_notice(&state, &admin, "/admin/holds", query.done.as_deref()).await?,
    };
    html(StatusCode::OK, &page)
}

/// Releases a checkout hold: its units go back on sale at once. Applied once per form.
pub async fn post_release_hold(
    admin: Admin,
    state: web::Data<AppState>,
    path: web::Path<String>,
    form: web::Form<ActionForm>,
) -> Result<HttpResponse, AppError> {
    csrf::check_admin(&admin, &form.csrf)?;
    let key = form_key(&form.key)?;
    let id = Uuid::parse_str(&path).map_err(|_| AppError::not_found("No such hold."))?;
    let shared = state.clone().into_inner();
    let actor = admin.username.clone();
    apply_form(
        &state,
        &admin,
        &key,
        &("release", id),
        async move |db: &PgPool| -> Result<Changed, AppError> {
            // Like a cancel: the release commits on its own and happens once per hold;
            // the key is completed just after.
            use crate::holds::{HoldError, Released};
            let notice = match crate::holds::release(db, Some(&shared.redis), id, &actor).await {
                Ok(Released::Now) => "Hold released; its units are back on sale.",
                Ok(Released::Already) => "That hold was already released.",
                Err(HoldError::AlreadyConfirmed(_)) => "That hold has already become an order.",
                Err(e) => return Err(e.into()),
            };
            let outcome = FormOutcome {
                page: "/admin/holds".into(),
                notice: notice.into(),
            };
            Ok(outcome.changed(db.begin().await?))
        },
    )
    .await?
}

// ---------------------------------------------------------------- admin JSON API

#[derive(Debug, Deserialize, Serialize)]
pub struct RestockBody {
    units: i64,
    reason: String,
}

#[derive(Debug, Deserialize, Serialize)]
pub struct AdjustBody {
    expected_on_hand: i64,
    on_hand: i64,
    reason: String,
}

/// The admin API's CSRF token, sent as a header by browser clients of the API.
pub(super) fn check_api_csrf(req: &HttpRequest, admin: &Admin) -> Result<(), AppError> {
    let token = req
        .headers()
        .get("x-csrf-token")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    csrf::check_admin(admin, token)
}

/// The admin API's answer to a stock change under an `Idempotency-Key`: the stored JSON,
/// the first time and (marked replayed) for every retry.
fn api_answer(once: Once) -> Result<HttpResponse, AppError> {
    let (stored, replayed) = match once {
        Once::Applied(stored) => (stored, false),
        Once::Replayed(stored) => (stored, true),
        Once::Mismatch => {
            return Err(AppError::Unprocessable(
                "This Idempotency-Key was already used for a different request.".into(),
            ));
        }
        Once::InFlight => {
            return Err(AppError::Conflict {
                message: "A request with this Idempotency-Key is still being processed.".into(),
                retry_after: Some(1),
                details: None,
            });
        }
    };
    let status = StatusCode::from_u16(stored.status).unwrap_or(StatusCode::OK);
    let mut res = HttpResponse::build(status);
    if replayed {
        res.insert_header((super::api::REPLAYED_HEADER, "true"));
    }
    Ok(res.json(stored.body))
}

/// `PATCH /api/v1/admin/products/{sku}`: `{"purchase_limit": n}` sets the most units one
/// customer may buy (`null` removes the limit). Answers the product's new settings.
pub async fn patch_api_product(
    req: HttpRequest,
    admin: Admin,
    state: web::Data<AppState>,
    path: web::Path<String>,
    body: web::Json<serde_json::Value>,
) -> Result<HttpResponse, AppError> {
    check_api_csrf(&req, &admin)?;
    let sku = Sku::parse(&path)
        .map_err(|_| AppError::not_found(format!("No product with SKU {:?}.", path.as_str())))?;
    let fields = body
        .as_object()
        .ok_or_else(|| AppError::Unprocessable("The body must be a JSON object.".into()))?;
    const FIELDS: [&str; 2] = ["purchase_limit", "category"];
    if let Some(other) = fields.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        return Err(AppError::Unprocessable(format!(
            "{other:?} cannot be changed here; only \"purchase_limit\" and \"category\" can."
        )));
    }
    if fields.is_empty() {
        return Err(AppError::Unprocessable(
            "Send {\"purchase_limit\": n} (or null for no limit) and/or {\"category\": \"…\"} \
             (or null for none)."
                .into(),
        ));
    }
    // Both are checked before either is written.
    let limit = match fields.get("purchase_limit") {
        None => None,
        Some(serde_json::Value::Null) => Some(None),
        Some(value) => Some(Some(
            value
                .as_i64()
                .filter(|n| (1..=1_000_000).contains(n))
                .map(|n| n as i32)
                .ok_or_else(|| {
                    AppError::Unprocessable(
                        "purchase_limit is a whole number from 1 to 1,000,000, or null.".into(),
                    )
                })?,
        )),
    };
    let category = match fields.get("category") {
        None => None,
        Some(serde_json::Value::Null) => Some(None),
        Some(serde_json::Value::String(c)) => {
            Some(Some(catalog::browse::parse_category(c).map_err(|e| {
                AppError::Unprocessable(crate::error::sentence(&e.0))
            })?))
        }
        Some(_) => {
            return Err(AppError::Unprocessable(
                "category is a text of 1 to 40 characters, or null.".into(),
            ));
        }
    };
    let not_found = || AppError::not_found(format!("No product with SKU {sku}."));
    let mut tx = state.db.begin().await?;
    if let Some(limit) = limit
        && !catalog::db::set_purchase_limit(&mut *tx, &sku, limit).await?
    {
        return Err(not_found());
    }
    if let Some(category) = &category
        && !catalog::db::set_category(&mut *tx, &sku, category.as_deref()).await?
    {
        return Err(not_found());
    }
    tx.commit().await?;
    let (limit, category): (Option<i32>, Option<String>) =
        sqlx::query_as("select purchase_limit, category from products where sku = $1")
            .bind(sku.as_str())
            .fetch_one(&state.db)
            .await?;
    state.catalog.forget(&sku);
    Ok(HttpResponse::Ok()
        .json(serde_json::json!({"sku": sku, "purchase_limit": limit, "category": category})))
}

pub async fn post_api_restock(
    req: HttpRequest,
    admin: Admin,
    state: web::Data<AppState>,
    path: web::Path<String>,
    body: web::Json<RestockBody>,
) -> Result<HttpResponse, AppError> {
    check_api_csrf(&req, &admin)?;
    let sku = Sku::parse(&path)
        .map_err(|_| AppError::not_found(format!("No product with SKU {:?}.", path.as_str())))?;
    catalog::db::find_product(&state.db, &sku)
        .await?
        .ok_or_else(|| AppError::not_found(format!("No product with SKU {sku}.")))?;
    // Bounds are checked here, before any SQL: a count the column cannot hold is a 422.
    let units = i32::try_from(body.units)
        .ok()
        .filter(|n| (1..=10_000_000).contains(n))
        .ok_or_else(|| AppError::Unprocessable("units must be from 1 to 10,000,000.".into()))?;
    let reason = reason_of(&body.reason)?;
    let fingerprint = ("restock", sku.as_str(), units, reason.clone());
    let key = admin_key(&admin, &super::api::idempotency_key(&req)?)?;
    let actor = admin.username.clone();
    let restocked = sku.clone();
    let once = apply_once(
        &state,
        Scope::Admin,
        key,
        &fingerprint,
        Duration::ZERO,
        async move |db: &PgPool| -> Result<Changed, AppError> {
            let sku = restocked;
            let mut tx = db.begin().await?;
            let on_hand = stock::restock(&mut tx, &sku, units, &reason, &actor)
                .await?
                .ok_or_else(|| too_much(units))?;
            let body = serde_json::json!({"sku": sku, "on_hand": on_hand});
            Ok(Changed {
                tx,
                status: 200,
                body,
            })
        },
    )
    .await??;
    state.stock_changed(&sku).await;
    api_answer(once)
}

pub async fn post_api_adjust(
    req: HttpRequest,
    admin: Admin,
    state: web::Data<AppState>,
    path: web::Path<String>,
    body: web::Json<AdjustBody>,
) -> Result<HttpResponse, AppError> {
    check_api_csrf(&req, &admin)?;
    let sku = Sku::parse(&path)
        .map_err(|_| AppError::not_found(format!("No product with SKU {:?}.", path.as_str())))?;
    catalog::db::find_product(&state.db, &sku)
        .await?
        .ok_or_else(|| AppError::not_found(format!("No product with SKU {sku}.")))?;
    let new = i32::try_from(body.on_hand)
        .ok()
        .filter(|n| (0..=10_000_000).contains(n))
        .ok_or_else(|| AppError::Unprocessable("on_hand must be from 0 to 10,000,000.".into()))?;
    let expected = i32::try_from(body.expected_on_hand)
        .ok()
        .filter(|n| *n >= 0)
        .ok_or_else(|| {
            AppError::Unprocessable(format!(
                "expected_on_hand must be from 0 to {}.",
                stock::MAX_ON_HAND
            ))
        })?;
    let reason = reason_of(&body.reason)?;
    let fingerprint = ("adjust", sku.as_str(), expected, new, reason.clone());
    let key = admin_key(&admin, &super::api::idempotency_key(&req)?)?;
    let actor = admin.username.clone();
    let adjusted = sku.clone();
    let once = apply_once(
        &state,
        Scope::Admin,
        key,
        &fingerprint,
        Duration::ZERO,
        async move |db: &PgPool| -> Result<Changed, AppError> {
            let sku = adjusted;
            let mut tx = db.begin().await?;
            match stock::adjust(&mut tx, &sku, expected, new, &reason, &actor).await? {
                Adjusted::Done => {
                    let body = serde_json::json!({"sku": sku, "on_hand": new});
                    Ok(Changed {
                        tx,
                        status: 200,
                        body,
                    })
                }
                Adjusted::Moved { on_hand } => Err(AppError::Conflict {
                    message: format!(
                        "Stock moved: expected {expected} on hand, but there are {on_hand}; \
                         nothing was changed."
                    ),
                    retry_after: None,
                    details: Some(serde_json::json!({"on_hand": on_hand})),
                }),
                Adjusted::BelowReserved { reserved } => Err(AppError::Conflict {
                    message: format!(
                        "{reserved} units are held in checkouts; on_hand cannot go below that."
                    ),
                    retry_after: None,
                    details: Some(serde_json::json!({"reserved": reserved})),
                }),
            }
        },
    )
    .await??;
    state.stock_changed(&sku).await;
    api_answer(once)
}
