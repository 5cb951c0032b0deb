//! The admin's API clients page: lists clients, makes one (showing its key once, in the
//! answer to the form; only its hash is kept) and revokes. Listed in
//! [`super::routes`], so every route here is behind the admin guard; every form
//! carries the session's CSRF token.

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use askama::Template;
use serde::Deserialize;

use super::page_chrome;
use crate::admin::Admin;
use crate::clients::{self, ClientError, ClientRow, Limit};
use crate::error::AppError;
use crate::http::csrf::TokenForm;
use crate::http::paths::{IdPath, Names};
use crate::http::{AppState, Chrome, csrf, html, see_other};

#[derive(Template)]
#[template(path = "admin/api_clients.html")]
struct ClientsPage {
    chrome: Chrome,
    clients: Vec<ClientRow>,
    default_limit: String,
    /// `(message, is it a problem)`.
    notice: Option<(String, bool)>,
    /// The key just made, shown this once.
    new_key: Option<String>,
}

async fn page(
    req: &HttpRequest,
    admin: &Admin,
    state: &AppState,
    notice: Option<(String, bool)>,
    new_key: Option<String>,
) -> Result<ClientsPage, AppError> {
    Ok(ClientsPage {
        chrome: page_chrome(req, admin),
        clients: clients::list(&state.db).await?,
        default_limit: format!(
            "{} a minute, {} at once",
            state.settings.rate_limit_per_minute, state.settings.rate_limit_burst
        ),
        notice,
        new_key,
    })
}

#[derive(Deserialize)]
pub struct ClientsQuery {
    revoked: Option<i64>,
}

pub async fn get_api_clients(
    req: HttpRequest,
    admin: Admin,
    state: web::Data<AppState>,
    query: web::Query<ClientsQuery>,
) -> Result<HttpResponse, AppError> {
    let notice = query.revoked.map(|id| {
        (
            format!("Client {id} is revoked; its key no longer works."),
            false,
        )
    });
    html(
        StatusCode::OK,
        &page(&req, &admin, &state, notice, None).await?,
    )
}

#[derive(Deserialize)]
pub struct NewClientForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    rate_limit: String,
    unlimited: Option<String>,
}

fn limit_of(form: &NewClientForm) -> Result<Limit, String> {
    let rate = form.rate_limit.trim();
    match (form.unlimited.is_some(), rate) {
        (true, "") => Ok(Limit::Unlimited),
        (true, _) => Err("Choose a rate limit or no limit, not both.".into()),
        (false, "") => Ok(Limit::Default),
        (false, n) => n
            .parse::<u32>()
            .ok()
            .filter(|n| (1..=1_000_000).contains(n))
            .map(Limit::PerMinute)
            .ok_or_else(|| "The rate limit is a whole number from 1 to 1000000.".into()),
    }
}

/// Makes a client and shows its key, this once (answered directly, not redirected and
/// not kept as other answers to forms are, so the key is never in a URL or kept anywhere).
pub async fn post_api_clients(
    req: HttpRequest,
    admin: Admin,
    state: web::Data<AppState>,
    form: web::Form<NewClientForm>,
) -> Result<HttpResponse, AppError> {
    csrf::check_admin(&admin, &form.csrf)?;
    let refused = |message: String| async {
        let page = page(&req, &admin, &state, Some((message, true)), None).await?;
        html(StatusCode::UNPROCESSABLE_ENTITY, &page)
    };
    let limit = match limit_of(&form) {
        Ok(limit) => limit,
        Err(message) => return refused(message).await,
    };
    match clients::create(&state.db, &form.name, limit).await {
        Ok((client, key)) => {
            tracing::info!(admin = %admin.username, client = client.id, "API client created");
            let notice = format!("Client {} (id {}) is ready.", client.name, client.id);
            let page = page(&req, &admin, &state, Some((notice, false)), Some(key)).await?;
            let mut res = html(StatusCode::CREATED, &page)?;
            res.extensions_mut().insert(crate::http::shown::NotKept);
            res.headers_mut().insert(
                actix_web::http::header::CACHE_CONTROL,
                actix_web::http::header::HeaderValue::from_static("no-store"),
            );
            Ok(res)
        }
        Err(e @ (ClientError::BadName | ClientError::Exists(_))) => {
            refused(crate::error::sentence(&e.to_string())).await
        }
        Err(ClientError::Database(e)) => Err(e.into()),
        Err(e) => Err(AppError::Internal(e.into())),
    }
}

/// Revokes a client: its key stops working here at once, elsewhere within seconds.
pub async fn post_revoke_api_client(
    admin: Admin,
    state: web::Data<AppState>,
    address: IdPath<ClientAddress>,
    form: web::Form<TokenForm>,
) -> Result<HttpResponse, AppError> {
    csrf::check_admin(&admin, &form.csrf)?;
    let id = address.id()?;
    let no_such = || ClientAddress::missing("");
    // Revoking twice (a double click) shows the same result; revoking a client that never
    // existed is a 404, not a page saying it is revoked.
    if !clients::revoke(&state.db, id).await?
        && !clients::list(&state.db).await?.iter().any(|c| c.id == id)
    {
        return Err(no_such());
    }
    state.api_keys.clear();
    tracing::info!(admin = %admin.username, client = id, "API client revoked");
    Ok(see_other(&format!("/admin/api-clients?revoked={id}")))
}

/// An API client's address in the admin: `/admin/api-clients/{id}/revoke`.
pub struct ClientAddress;

impl Names for ClientAddress {
    type Id = i64;

    fn missing(_: &str) -> AppError {
        AppError::not_found("There is no API client with this id; nothing was revoked.")
    }
}
