//! Drops in the admin: the list with a form to schedule one, and each drop's live view
//! (waiting, admitted, active, sold, left, the admission rate, the time to sell out) with
//! pause, resume and end buttons, each applied once per form (as the stock forms are).

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use askama::Template;
use chrono::Utc;
use serde::Deserialize;
use uuid::Uuid;

use super::once::{Apart, DoneQuery, FormOutcome, apply_form, done_notice, form_key, new_form_key};
use super::page_chrome;
use crate::admin::Admin;
use crate::drops::db::{Change, DropError};
use crate::drops::live::Live;
use crate::drops::{self, NewDrop, Queueing};
use crate::error::AppError;
use crate::http::paths::{IdPath, Names};
use crate::http::{AppState, Chrome, csrf, html};
use crate::idempotency::StoredResponse;

/// A drop error as the admin sees it.
pub(super) fn drop_error(e: DropError) -> AppError {
    match e {
        DropError::Invalid(m) => AppError::Unprocessable(m),
        DropError::NoProduct(_) => AppError::Unprocessable(e.to_string()),
        DropError::AlreadyLive(_) | DropError::Over(_) => AppError::conflict(e.to_string()),
        DropError::NotFound(_) => AppError::not_found("There is no such drop."),
        DropError::Database(e) => e.into(),
    }
}

/// What the new-drop form and the admin API's body say, as text and numbers.
#[derive(Debug, Deserialize)]
pub struct DropForm {
    pub(super) sku: String,
    /// RFC 3339, or `+SECONDS` from now.
    pub(super) opens_at: String,
    #[serde(default)]
    pub(super) prequeue_seconds: Option<i64>,
    pub(super) queueing: String,
    pub(super) admit_per_minute: i64,
    #[serde(default)]
    pub(super) max_active: Option<i64>,
    #[serde(default)]
    pub(super) session_seconds: Option<i64>,
}

impl DropForm {
    /// The drop asked for, or what is wrong in words.
    pub(super) fn parse(&self) -> Result<NewDrop, AppError> {
        let bad = |m: String| AppError::Unprocessable(m);
        let queueing = Queueing::parse(&self.queueing).ok_or_else(|| {
            bad("Queueing must be \"fifo\" (first come, first served) or \"lottery\".".into())
        })?;
        let int = |v: i64, what: &str| {
            i32::try_from(v).map_err(|_| bad(format!("{what} is out of range.")))
        };
        Ok(NewDrop {
            sku: crate::catalog::Sku::parse(&self.sku)
                .map_err(|e| bad(format!("{e}.")))?
                .to_string(),
            opens_at: drops::parse_opens_at(&self.opens_at, Utc::now()).map_err(bad)?,
            prequeue_seconds: int(self.prequeue_seconds.unwrap_or(0), "The pre-queue")?,
            queueing,
            admit_per_minute: int(self.admit_per_minute, "Shoppers let in per minute")?,
            max_active: self
                .max_active
                .filter(|n| *n != 0)
                .map(|n| int(n, "Shoppers active at once"))
                .transpose()?,
            session_seconds: int(
                self.session_seconds
                    .unwrap_or(i64::from(drops::DEFAULT_SESSION_SECONDS)),
                "The admission's length",
            )?,
        })
    }
}

/// Applies `change` to drop `id` and what follows from it in this process: the drops
/// read again, and an ended drop's queue left for Redis to forget.
pub(super) async fn apply_change(
    state: &AppState,
    id: Uuid,
    change: Change,
    actor: &str,
) -> Result<bool, AppError> {
    let changed = drops::db::change(&state.db, id, change, actor)
        .await
        .map_err(drop_error)?;
    state.drops.reload(&state.db).await?;
    if change == Change::End {
        drops::queue::expire(&state.redis, id).await;
    }
    Ok(changed)
}

#[derive(Template)]
#[template(path = "admin/drops.html")]
struct DropsPage {
    chrome: Chrome,
    drops: Vec<drops::Drop>,
    key: String,
    notice: Option<String>,
    /// The new-drop form as typed (a refused one comes back filled in).
    form: DropFormText,
    /// Why the form was refused, shown at the form.
    error: Option<String>,
}

impl DropsPage {
    async fn of(
        req: &HttpRequest,
        admin: &Admin,
        state: &AppState,
        form: DropFormText,
        error: Option<String>,
    ) -> Result<Self, AppError> {
        Ok(Self {
            chrome: page_chrome(req, admin),
            drops: drops::db::recent(&state.db, 50).await?,
            key: new_form_key(),
            notice: None,
            form,
            error,
        })
    }
}

pub async fn get_drops(
    req: HttpRequest,
    admin: Admin,
    state: web::Data<AppState>,
    query: web::Query<DoneQuery>,
) -> Result<HttpResponse, AppError> {
    let mut page = DropsPage::of(&req, &admin, &state, DropFormText::default(), None).await?;
    page.notice = done_notice(&state, &admin, "/admin/drops", query.done.as_deref()).await?;
    html(StatusCode::OK, &page)
}

#[derive(Deserialize)]
pub struct NewDropForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    key: String,
    #[serde(flatten)]
    drop: DropFormText,
}

/// The form's fields as sent (empty fields are "not given").
#[derive(Clone, Deserialize, serde::Serialize)]
// Every field defaults to empty, so a form missing one is refused by the CSRF check or
// by `form()` in words, not by the extractor.
pub struct DropFormText {
    #[serde(default)]
    sku: String,
    /// `+SECONDS` from now, or RFC 3339.
    #[serde(default)]
    opens_at: String,
    /// The date-and-time field (`2026-12-24T18:00`, in the shop's zone), which wins when
    /// given.
    #[serde(default)]
    opens_at_local: String,
    #[serde(default)]
    prequeue_seconds: String,
    #[serde(default)]
    queueing: String,
    #[serde(default)]
    admit_per_minute: String,
    #[serde(default)]
    max_active: String,
    #[serde(default)]
    session_seconds: String,
}

impl DropFormText {
    fn form(&self) -> Result<DropForm, AppError> {
        let number = |raw: &str, what: &str| -> Result<Option<i64>, AppError> {
            let raw = raw.trim();
            if raw.is_empty() {
                return Ok(None);
            }
            crate::text::whole_number(raw).map(Some).ok_or_else(|| {
                AppError::Unprocessable(format!(
                    "{what} must be a whole number (digits only), not {}.",
                    crate::text::quoted(raw)
                ))
            })
        };
        Ok(DropForm {
            sku: self.sku.clone(),
            // A person's typing: spaces around the time are let go here, not in the API;
            // the date-and-time field's value, a time in the shop's zone, as RFC 3339 in UTC.
            opens_at: match self.opens_at_local.trim() {
                "" => self.opens_at.trim().to_string(),
                local => local_time(local)?,
            },
            prequeue_seconds: number(&self.prequeue_seconds, "The pre-queue")?,
            queueing: self.queueing.clone(),
            admit_per_minute: number(&self.admit_per_minute, "Shoppers let in per minute")?
                .ok_or_else(|| {
                    AppError::Unprocessable("Say how many shoppers to let in per minute.".into())
                })?,
            max_active: number(&self.max_active, "Shoppers active at once")?,
            session_seconds: number(&self.session_seconds, "The admission's length")?,
        })
    }
}

impl Default for DropFormText {
    /// The form as first shown: five minutes from now, a five-minute pre-queue, 120 a
    /// minute for ten minutes each.
    fn default() -> Self {
        Self {
            sku: String::new(),
            opens_at: "+300".into(),
            opens_at_local: String::new(),
            prequeue_seconds: "300".into(),
            queueing: "lottery".into(),
            admit_per_minute: "120".into(),
            max_active: String::new(),
            session_seconds: "600".into(),
        }
    }
}

/// A `datetime-local` field's value (`2026-12-24T18:00`, seconds optional), a time in the
/// shop's zone, as RFC 3339 in UTC.
fn local_time(raw: &str) -> Result<String, AppError> {
    let local = ["%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S"]
        .iter()
        .find_map(|f| chrono::NaiveDateTime::parse_from_str(raw, f).ok())
        .ok_or_else(|| {
            AppError::Unprocessable(format!(
                "{} is not a date and time like 2026-12-24T18:00.",
                crate::text::quoted(raw)
            ))
        })?;
    let at = crate::clock::from_local(local).ok_or_else(|| {
        AppError::Unprocessable(format!(
            "{raw} happens twice or not at all in {} (the clocks change then): choose \
             another time.",
            crate::clock::zone()
        ))
    })?;
    Ok(at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
}

/// Schedules a drop from the form; applied once per form. A form refused for what it says
/// comes back filled in, with the reason at the form.
pub async fn post_drops(
    req: HttpRequest,
    admin: Admin,
    state: web::Data<AppState>,
    form: web::Form<NewDropForm>,
) -> Result<HttpResponse, AppError> {
    csrf::check_admin(&admin, &form.csrf)?;
    let key = form_key(&form.key)?;
    let new = match form.drop.form().and_then(|f| f.parse()) {
        Ok(new) => new,
        Err(AppError::Unprocessable(why)) => {
            let page = DropsPage::of(&req, &admin, &state, form.drop.clone(), Some(why)).await?;
            return html(StatusCode::UNPROCESSABLE_ENTITY, &page);
        }
        Err(e) => return Err(e),
    };
    // A mistyped SKU is the likeliest slip: said at the form, which keeps what was typed.
    let sku =
        crate::catalog::Sku::parse(&new.sku).map_err(|e| AppError::Unprocessable(e.to_string()))?;
    if crate::catalog::db::find_product(&state.db, &sku)
        .await?
        .is_none()
    {
        let why = DropError::NoProduct(new.sku.clone()).to_string();
        let page = DropsPage::of(&req, &admin, &state, form.drop.clone(), Some(why)).await?;
        return html(StatusCode::UNPROCESSABLE_ENTITY, &page);
    }
    let shared = state.clone().into_inner();
    apply_form(
        &state,
        &admin,
        &key,
        &form.drop,
        Apart(async move || -> Result<StoredResponse, AppError> {
            let drop = drops::db::create(&shared.db, &new)
                .await
                .map_err(drop_error)?;
            shared.drops.reload(&shared.db).await?;
            tracing::info!(drop = %drop.id, sku = %drop.sku, "drop scheduled");
            let outcome = FormOutcome {
                page: format!("/admin/drops/{}", drop.id),
                notice: format!("Drop of {} scheduled.", drop.sku),
            };
            Ok(outcome.stored())
        }),
    )
    .await?
}

#[derive(Template)]
#[template(path = "admin/drop.html")]
struct DropPage {
    chrome: Chrome,
    live: Live,
    /// A fresh key for each of the pause, resume and end forms.
    keys: [String; 3],
    notice: Option<String>,
}

impl DropPage {
    fn over(&self) -> bool {
        self.live.status == "ended" || self.live.status == "sold_out"
    }

    fn opt(n: &Option<u64>) -> String {
        n.map_or_else(|| "—".into(), |n| n.to_string())
    }

    fn rate(&self) -> String {
        self.live
            .admission_rate_per_minute
            .map_or_else(|| "—".into(), |r| format!("{r:.1}/min"))
    }

    fn eta(&self) -> String {
        match self.live.estimated_seconds_to_sell_out {
            None => "—".into(),
            Some(s) if s < 120 => format!("{s} s"),
            Some(s) => format!("{} min", s.div_ceil(60)),
        }
    }
}

/// A drop's address in the admin: `/admin/drops/{id}`, `/api/v1/admin/drops/{id}`.
pub struct AdminDrop;

impl Names for AdminDrop {
    type Id = uuid::Uuid;

    fn missing(_: &str) -> AppError {
        AppError::not_found("There is no such drop.")
    }
}

/// What is asked of a drop in its address: `/admin/drops/{id}/{action}`, and the API's.
pub struct DropAction;

impl Names for DropAction {
    type Id = Change;
    const SEGMENT: &'static str = "action";

    fn missing(_: &str) -> AppError {
        AppError::not_found("A drop can be paused, resumed or ended.")
    }
}

/// A drop's live view (it refreshes itself while the drop runs).
pub async fn get_drop(
    req: HttpRequest,
    admin: Admin,
    state: web::Data<AppState>,
    address: IdPath<AdminDrop>,
    query: web::Query<DoneQuery>,
) -> Result<HttpResponse, AppError> {
    let id = address.id()?;
    let drop = drops::db::get(&state.db, id)
        .await?
        .ok_or_else(|| AppError::not_found("There is no such drop."))?;
    let page_path = format!("/admin/drops/{id}");
    let page = DropPage {
        chrome: page_chrome(&req, &admin),
        live: drops::live::live(&state.db, &state.redis, &drop).await?,
        keys: [new_form_key(), new_form_key(), new_form_key()],
        notice: done_notice(&state, &admin, &page_path, query.done.as_deref()).await?,
    };
    html(StatusCode::OK, &page)
}

#[derive(Deserialize)]
pub struct ChangeForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    key: String,
}

/// Pauses, resumes or ends a drop; applied once per form.
pub async fn post_drop_change(
    admin: Admin,
    state: web::Data<AppState>,
    address: IdPath<AdminDrop>,
    action: IdPath<DropAction>,
    form: web::Form<ChangeForm>,
) -> Result<HttpResponse, AppError> {
    csrf::check_admin(&admin, &form.csrf)?;
    let key = form_key(&form.key)?;
    let id = address.id()?;
    let change = action.id()?;
    let shared = state.clone().into_inner();
    let actor = admin.username.clone();
    apply_form(
        &state,
        &admin,
        &key,
        &(change.as_str(), id),
        Apart(async move || -> Result<StoredResponse, AppError> {
            let changed = apply_change(&shared, id, change, &actor).await?;
            let notice = match (change, changed) {
                (Change::Pause, true) => "Paused: nobody is let in until you resume.",
                (Change::Resume, true) => "Resumed: shoppers are let in again.",
                (Change::End, true) => "Ended: the queue is closed and the product sells as usual.",
                (_, false) => "The drop was already in that state; nothing changed.",
            };
            let outcome = FormOutcome {
                page: format!("/admin/drops/{id}"),
                notice: notice.into(),
            };
            Ok(outcome.stored())
        }),
    )
    .await?
}
