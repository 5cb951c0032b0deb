//! Logging in and out: the login page, the throttled password check, and a new session
//! (and cookie) every login.

use actix_web::cookie::{Cookie, SameSite};
use actix_web::http::{StatusCode, header};
use actix_web::{HttpRequest, HttpResponse, web};
use askama::Template;
use serde::Deserialize;

use super::SESSION_COOKIE;
use crate::admin::{self, Attempt, LoginLimits};
use crate::error::AppError;
use crate::http::csrf::TokenForm;
use crate::http::{AppState, Chrome, csrf, html};

fn session_cookie(req: &HttpRequest, token: &str) -> Cookie<'static> {
    let mut cookie = crate::http::cookie(req, SESSION_COOKIE, token.to_string(), SameSite::Strict);
    cookie.set_max_age(actix_web::cookie::time::Duration::seconds(
        admin::SESSION_LENGTH.as_secs() as i64,
    ));
    cookie
}

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
    let client = crate::http::client_addr(&req, &state.settings);
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
    if let Some(old) = req.cookie(crate::http::cookie_name(&req, SESSION_COOKIE)) {
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
    if let Some(cookie) = req.cookie(crate::http::cookie_name(&req, SESSION_COOKIE)) {
        if let Some(admin) = admin::session(&state.db, cookie.value()).await? {
            csrf::check_admin(&admin, &form.csrf)?;
        }
        admin::end_session(&state.db, cookie.value()).await?;
    }
    let mut gone = crate::http::cookie(&req, SESSION_COOKIE, String::new(), SameSite::Strict);
    gone.make_removal();
    Ok(HttpResponse::SeeOther()
        .insert_header((header::LOCATION, "/admin/login"))
        .cookie(gone)
        .finish())
}
