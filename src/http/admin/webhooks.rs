//! The admin's webhooks: endpoints (made with a URL and event types, once per form, as the
//! stock forms are; the signing secret shown once, on the page the form redirects to),
//! deliveries with their last answer and a
//! "resend" button, and the latest receipts written to the mail folder. Their JSON twins,
//! under `/api/v1/admin/webhooks`, are in [`super::api`]. Listed in [`super::routes`], so every
//! route here is behind the admin guard; every form carries the session's CSRF token.

use std::time::Duration;

use actix_web::http::{StatusCode, header};
use actix_web::{HttpRequest, HttpResponse, web};
use askama::Template;
use serde::Deserialize;
use sqlx::PgConnection;
use uuid::Uuid;

use super::once::{FormOutcome, InTransaction, apply_form, done_notice, form_key, new_form_key};
use super::page_chrome;
use crate::admin::Admin;
use crate::error::AppError;
use crate::events::db::{self, Delivery, Endpoint, Stats};
use crate::events::mail::{self, Written};
use crate::events::{EventType, sign, target};
use crate::http::csrf::TokenForm;
use crate::http::paths::{IdPath, Names};
use crate::http::{AppState, Chrome, csrf, html, see_other};
use crate::idempotency::StoredResponse;

/// Deliveries listed per page.
pub(super) const DELIVERIES_SHOWN: i64 = 100;

/// How long a new endpoint's secret waits in Redis for the page that shows it.
const SECRET_SHOWN_WITHIN: Duration = Duration::from_secs(600);

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
    /// The idempotency key of the new-endpoint form.
    form_key: String,
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
        form_key: new_form_key(),
    })
}

#[derive(Deserialize)]
pub struct WebhooksQuery {
    deleted: Option<String>,
    /// The key of the new-endpoint form that redirected here.
    done: Option<String>,
}

/// Where a new endpoint's secret waits for its page: this admin's, this form's.
fn secret_slot(state: &AppState, admin: &Admin, key: &str) -> String {
    state
        .redis
        .key(&format!("webhook-secret:{}:{key}", admin.id))
}

/// The endpoints; after the new-endpoint form, `?done=<key>` says what it made and, the
/// first time only, shows the secret (read and deleted at once, so a reload, the
/// browser's history or a second tab never show it again).
pub async fn get_webhooks(
    req: HttpRequest,
    admin: Admin,
    state: web::Data<AppState>,
    query: web::Query<WebhooksQuery>,
) -> Result<HttpResponse, AppError> {
    let made = done_notice(&state, &admin, "/admin/webhooks", query.done.as_deref()).await?;
    let mut secret = None;
    let notice = if let (Some(made), Some(key)) = (made, query.done.as_deref()) {
        let slot = secret_slot(&state, &admin, key);
        let mut conn = state.redis.conn();
        let taken = state
            .redis
            .call(
                "taking a new webhook secret",
                redis::pipe()
                    .atomic()
                    .get(&slot)
                    .del(&slot)
                    .query_async::<(Option<String>, i64)>(&mut conn),
            )
            .await;
        match taken {
            // Redis did not answer: whether the secret is still there is not known.
            None => Some((
                format!(
                    "{made} Its signing secret could not be read just now; reload this page \
                     in a moment to see it."
                ),
                true,
            )),
            Some((None, _)) => Some((
                format!(
                    "{made} Its signing secret was shown once, on the first visit to this page; \
                     if it is lost, delete the endpoint and make a new one."
                ),
                false,
            )),
            Some((Some(taken), _)) => {
                secret = Some(taken);
                Some((made, false))
            }
        }
    } else {
        query.deleted.as_ref().map(|_| {
            (
                "The endpoint is deleted; it gets no more events.".to_string(),
                false,
            )
        })
    };
    let shown = secret.is_some();
    let mut res = html(
        StatusCode::OK,
        &page(&req, &admin, &state, notice, secret).await?,
    )?;
    if shown {
        res.headers_mut().insert(
            header::CACHE_CONTROL,
            header::HeaderValue::from_static("no-store"),
        );
    }
    Ok(res)
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

/// Makes an endpoint, once per form: post/redirect/get, as the stock forms do, so a
/// reload or a second press replays the redirect instead of making another endpoint with
/// another secret. The secret waits in Redis, under this admin and form, for the page the
/// form redirects to (never in a URL); without Redis nothing is made.
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
    let key = form_key(field("key"))?;
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
    let fingerprint = (
        "webhook",
        new.url.clone(),
        types.clone(),
        new.description.clone(),
    );
    let shared = state.clone().into_inner();
    let slot = secret_slot(&state, &admin, key.as_str());
    let actor = admin.username.clone();
    apply_form(
        &state,
        &admin,
        &key,
        &fingerprint,
        InTransaction(
            async move |conn: &mut PgConnection| -> Result<StoredResponse, AppError> {
                let secret = sign::new_secret();
                let endpoint = db::insert_endpoint(
                    &mut *conn,
                    &new.url,
                    &new.types,
                    &new.description,
                    &secret,
                )
                .await?;
                // Kept before the endpoint commits: if this fails, nothing is made. If the
                // commit fails instead, the secret expires unshown (no page finds the key).
                // Through the breaker, so a Redis that hangs holds this transaction no longer
                // than its timeout.
                let mut redis = shared.redis.conn();
                let kept = shared
                    .redis
                    .call(
                        "keeping a new webhook secret",
                        redis::cmd("SET")
                            .arg(&slot)
                            .arg(&secret)
                            .arg("EX")
                            .arg(SECRET_SHOWN_WITHIN.as_secs())
                            .query_async::<()>(&mut redis),
                    )
                    .await;
                if kept.is_none() {
                    tracing::warn!("keeping a new webhook secret in Redis failed");
                    return Err(AppError::Unavailable {
                        message: "The endpoint was not made: its signing secret could not be kept \
                              to show it to you. Please try again in a moment."
                            .into(),
                        retry_after: 1,
                    });
                }
                tracing::info!(admin = %actor, endpoint = %endpoint.id, "webhook endpoint created");
                let outcome = FormOutcome {
                    page: "/admin/webhooks".into(),
                    notice: format!("Endpoint {} is ready.", endpoint.url),
                };
                Ok(outcome.stored())
            },
        ),
    )
    .await?
}

/// A webhook endpoint's address: `…/webhooks/{id}…`.
pub struct EndpointAddress;

impl Names for EndpointAddress {
    type Id = Uuid;

    fn missing(_: &str) -> AppError {
        AppError::not_found("No such webhook endpoint.")
    }
}

pub async fn post_delete_webhook(
    admin: Admin,
    state: web::Data<AppState>,
    address: IdPath<EndpointAddress>,
    form: web::Form<TokenForm>,
) -> Result<HttpResponse, AppError> {
    csrf::check_admin(&admin, &form.csrf)?;
    let id = address.id()?;
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

/// A delivery's address: `…/deliveries/{id}/resend`.
pub struct DeliveryAddress;

impl Names for DeliveryAddress {
    type Id = i64;

    fn missing(_: &str) -> AppError {
        AppError::not_found("No such delivery.")
    }
}

pub async fn post_resend_delivery(
    admin: Admin,
    state: web::Data<AppState>,
    address: IdPath<DeliveryAddress>,
    form: web::Form<TokenForm>,
) -> Result<HttpResponse, AppError> {
    csrf::check_admin(&admin, &form.csrf)?;
    let id = address.id()?;
    if !db::resend(&state.db, id).await? {
        return Err(AppError::not_found("No such delivery."));
    }
    tracing::info!(admin = %admin.username, delivery = id, "delivery queued again");
    Ok(see_other(&format!("/admin/deliveries?resent={id}")))
}
