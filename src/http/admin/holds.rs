//! Checkout holds: the active ones, and a release form for each (applied once per form).

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use askama::Template;

use super::once::{Apart, DoneQuery, FormOutcome, apply_form, done_notice, form_key, new_form_key};
use super::orders::ActionForm;
use super::page_chrome;
use crate::admin::Admin;
use crate::error::AppError;
use crate::http::paths::{IdPath, Names};
use crate::http::{AppState, Chrome, csrf, html};
use crate::idempotency::StoredResponse;

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
    address: IdPath<HoldAddress>,
    form: web::Form<ActionForm>,
) -> Result<HttpResponse, AppError> {
    csrf::check_admin(&admin, &form.csrf)?;
    let key = form_key(&form.key)?;
    let id = address.id()?;
    let shared = state.clone().into_inner();
    let actor = admin.username.clone();
    apply_form(
        &state,
        &admin,
        &key,
        &("release", id),
        Apart(async move || -> Result<StoredResponse, AppError> {
            // Like a cancel: the release commits on its own and happens once per hold;
            // the key is completed just after.
            use crate::holds::{HoldError, Released};
            let notice =
                match crate::holds::release(&shared.db, Some(&shared.redis), id, &actor).await {
                    Ok(Released::Now) => "Hold released; its units are back on sale.",
                    Ok(Released::Already) => "That hold was already released.",
                    Err(HoldError::AlreadyConfirmed(_)) => "That hold has already become an order.",
                    Err(e) => return Err(e.into()),
                };
            let outcome = FormOutcome {
                page: "/admin/holds".into(),
                notice: notice.into(),
            };
            Ok(outcome.stored())
        }),
    )
    .await?
}

/// A hold's address in the admin: `/admin/holds/{id}/…`.
pub struct HoldAddress;

impl Names for HoldAddress {
    type Id = uuid::Uuid;

    fn missing(_: &str) -> AppError {
        AppError::not_found("No such hold.")
    }
}
