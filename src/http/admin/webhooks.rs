//! The admin's webhooks: endpoints (made with a URL and event types; the signing secret
//! shown once, in the answer to the form), deliveries with their last answer and a
//! "resend" button, and the latest receipts written to the mail folder. Their JSON twins,
//! under `/api/v1/admin/webhooks`, are in [`super::api`]. Listed in [`super::routes`], so every
//! route here is behind the admin guard; every form carries the session's CSRF token.

use actix_web::http::{StatusCode, header};
use actix_web::{HttpRequest, HttpResponse, web};
use askama::Template;
use serde::Deserialize;
use uuid::Uuid;

use super::page_chrome;
use crate::admin::Admin;
use crate::error::AppError;
use crate::events::db::{self, Delivery, Endpoint, Stats};
use crate::events::mail::{self, Written};
use crate::events::{EventType, sign, target};
use crate::http::csrf::TokenForm;
use crate::http::{AppState, Chrome, csrf, html, see_other};

/// Deliveries listed per page.
pub(super) const DELIVERIES_SHOWN: i64 = 100;

#[derive(Template)]
#[template(path = "admin/webhooks.html")]
struct WebhooksPage {
    chrome: Chrome,
    endpoints: Vec<Endpoint>,
    types: Vec<&'static str>,
    stats: Stats,
    receipts: Vec<Written>,
    mail: String,
    /// `(message, is it a problem)`.
    notice: Option<(String, bool)>,
    /// The secret just made, shown this once.
    new_secret: Option<String>,
}

async fn page(
    req: &HttpRequest,
    admin: &Admin,
    state: &AppState,
    notice: Option<(String, bool)>,
    new_secret: Option<String>,
) -> Result<WebhooksPage, AppError> {
    let s = &state.settings;
    let mail = match (&s.smtp_url, &s.mail_dir) {
        (Some(_), _) => "Receipts are sent by SMTP.".to_string(),
        (None, Some(dir)) => format!(
            "No SMTP server is set (STOCKADE_SMTP_URL), so receipts are written to {} instead of sent.",
            dir.display()
        ),
        (None, None) => "Receipts are off: set STOCKADE_SMTP_URL (or STOCKADE_MAIL_DIR).".into(),
    };
    let receipts = match (&s.smtp_url, &s.mail_dir) {
        (None, Some(dir)) => {
            let dir = dir.clone();
            web::block(move || mail::latest(&dir, 10))
                .await
                .unwrap_or_default()
        }
        _ => Vec::new(),
    };
    Ok(WebhooksPage {
        chrome: page_chrome(req, admin),
        endpoints: db::endpoints(&state.db).await?,
        types: EventType::ALL.iter().map(|t| t.as_str()).collect(),
        stats: db::stats(&state.db).await?,
        receipts,
        mail,
        notice,
        new_secret,
    })
}

#[derive(Deserialize)]
pub struct WebhooksQuery {
    deleted: Option<String>,
}

pub async fn get_webhooks(
    req: HttpRequest,
    admin: Admin,
    state: web::Data<AppState>,
    query: web::Query<WebhooksQuery>,
) -> Result<HttpResponse, AppError> {
    let notice = query.deleted.as_ref().map(|_| {
        (
            "The endpoint is deleted; it gets no more events.".to_string(),
            false,
        )
    });
    html(
        StatusCode::OK,
        &page(&req, &admin, &state, notice, None).await?,
    )
}

/// What a new endpoint needs, from the form or the API.
pub(super) struct NewEndpoint {
    pub(super) url: String,
    pub(super) types: Vec<EventType>,
    pub(super) description: String,
}

/// Checks a new endpoint: a URL that may receive webhooks, known event types (at least
/// one), a short description. The message says what is wrong.
pub(super) async fn check_new(
    state: &AppState,
    url: &str,
    types: &[String],
    description: &str,
) -> Result<NewEndpoint, String> {
    let url = target::check(url, state.settings.webhook_allow_private)
        .await
        .map_err(|e| crate::error::sentence(&e.to_string()))?;
    if url.as_str().len() > 2000 {
        return Err("The URL is longer than 2000 characters.".into());
    }
    let mut parsed = Vec::new();
    for t in types {
        let kind = EventType::parse(t).ok_or_else(|| {
            format!(
                "{t:?} is not an event type; the types are {}.",
                EventType::ALL.map(|t| t.as_str()).join(", ")
            )
        })?;
        if !parsed.contains(&kind) {
            parsed.push(kind);
        }
    }
    if parsed.is_empty() {
        return Err("Choose at least one event type.".into());
    }
    let description = description.trim();
    if description.chars().count() > 200
        || crate::text::single_line("description", description).is_err()
    {
        return Err("The description is plain text of at most 200 characters.".into());
    }
    Ok(NewEndpoint {
        url: url.to_string(),
        types: parsed,
        description: description.to_string(),
    })
}

/// Makes an endpoint and shows its secret, this once (answered directly, not redirected,
/// so the secret is never in a URL).
pub async fn post_webhooks(
    req: HttpRequest,
    admin: Admin,
    state: web::Data<AppState>,
    form: web::Form<Vec<(String, String)>>,
) -> Result<HttpResponse, AppError> {
    let field = |name: &str| {
        form.iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
            .unwrap_or_default()
    };
    csrf::check_admin(&admin, field("csrf"))?;
    let types: Vec<String> = form
        .iter()
        .filter(|(k, _)| k == "event_types")
        .map(|(_, v)| v.clone())
        .collect();
    let new = match check_new(&state, field("url"), &types, field("description")).await {
        Ok(new) => new,
        Err(message) => {
            let page = page(&req, &admin, &state, Some((message, true)), None).await?;
            return html(StatusCode::UNPROCESSABLE_ENTITY, &page);
        }
    };
    let secret = sign::new_secret();
    let endpoint =
        db::insert_endpoint(&state.db, &new.url, &new.types, &new.description, &secret).await?;
    tracing::info!(admin = %admin.username, endpoint = %endpoint.id, "webhook endpoint created");
    let notice = format!("Endpoint {} is ready.", endpoint.url);
    let page = page(&req, &admin, &state, Some((notice, false)), Some(secret)).await?;
    let mut res = html(StatusCode::CREATED, &page)?;
    res.headers_mut().insert(
        header::CACHE_CONTROL,
        header::HeaderValue::from_static("no-store"),
    );
    Ok(res)
}

pub(super) fn endpoint_id(raw: &str) -> Result<Uuid, AppError> {
    Uuid::parse_str(raw).map_err(|_| AppError::not_found("No such webhook endpoint."))
}

pub async fn post_delete_webhook(
    admin: Admin,
    state: web::Data<AppState>,
    path: web::Path<String>,
    form: web::Form<TokenForm>,
) -> Result<HttpResponse, AppError> {
    csrf::check_admin(&admin, &form.csrf)?;
    let id = endpoint_id(&path)?;
    // Deleting twice (a double click) shows the same result.
    db::delete_endpoint(&state.db, id).await?;
    tracing::info!(admin = %admin.username, endpoint = %id, "webhook endpoint deleted");
    Ok(see_other("/admin/webhooks?deleted=1"))
}

#[derive(Template)]
#[template(path = "admin/deliveries.html")]
struct DeliveriesPage {
    chrome: Chrome,
    deliveries: Vec<Delivery>,
    status: String,
    notice: Option<String>,
}

#[derive(Deserialize)]
pub struct DeliveriesQuery {
    pub(super) status: Option<String>,
    resent: Option<i64>,
}

/// `pending`, `sent`, `failed`, or empty for all; anything else is 400.
pub(super) fn status_filter(raw: Option<&str>) -> Result<Option<&str>, AppError> {
    match raw.map(str::trim) {
        None | Some("") => Ok(None),
        Some(s @ ("pending" | "sent" | "failed")) => Ok(Some(s)),
        Some(other) => Err(AppError::BadRequest(format!(
            "Unknown delivery status {other:?}; use pending, sent or failed."
        ))),
    }
}

pub async fn get_deliveries(
    req: HttpRequest,
    admin: Admin,
    state: web::Data<AppState>,
    query: web::Query<DeliveriesQuery>,
) -> Result<HttpResponse, AppError> {
    let status = status_filter(query.status.as_deref())?;
    let page = DeliveriesPage {
        chrome: page_chrome(&req, &admin),
        deliveries: db::deliveries(&state.db, status, DELIVERIES_SHOWN).await?,
        status: status.unwrap_or_default().to_string(),
        notice: query
            .resent
            .map(|id| format!("Delivery {id} is queued to be sent again.")),
    };
    html(StatusCode::OK, &page)
}

pub(super) fn delivery_id(raw: &str) -> Result<i64, AppError> {
    raw.parse()
        .map_err(|_| AppError::not_found("No such delivery."))
}

pub async fn post_resend_delivery(
    admin: Admin,
    state: web::Data<AppState>,
    path: web::Path<String>,
    form: web::Form<TokenForm>,
) -> Result<HttpResponse, AppError> {
    csrf::check_admin(&admin, &form.csrf)?;
    let id = delivery_id(&path)?;
    if !db::resend(&state.db, id).await? {
        return Err(AppError::not_found("No such delivery."));
    }
    tracing::info!(admin = %admin.username, delivery = id, "delivery queued again");
    Ok(see_other(&format!("/admin/deliveries?resent={id}")))
}
