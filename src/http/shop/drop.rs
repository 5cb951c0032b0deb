//! A drop in the storefront: the product page's countdown and "Join the queue", and the
//! queue page (`/drops/{id}/queue`), which keeps itself current at the interval the server
//! gives (`static/app.js` fetches it again and swaps the queue's content; without
//! JavaScript a `<noscript>` refresh reloads it) until the shopper is let in. Their ticket
//! and, once admitted, their pass live in cookies named after the drop.

use actix_web::cookie::SameSite;
use actix_web::{HttpRequest, HttpResponse, web};
use askama::Template;
use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::drops::queue::Joiner;
use crate::drops::ticket::{State, TicketView};
use crate::drops::{Drop, pass};
use crate::error::AppError;
use crate::http::csrf::{self, TokenForm};
use crate::http::gate as api;
use crate::http::paths::IdPath;
use crate::http::{AppState, Chrome, html, named_cookie, see_other};

fn ticket_cookie(id: Uuid) -> String {
    format!("drop-ticket-{}", id.simple())
}

fn pass_cookie(id: Uuid) -> String {
    format!("drop-pass-{}", id.simple())
}

/// The pass this browser carries for drop `id`, if any.
pub fn browser_pass(req: &HttpRequest, id: Uuid) -> Option<String> {
    req.cookie(&pass_cookie(id)).map(|c| c.value().to_string())
}

/// What the product page shows of the drop its product is in.
pub struct DropBox {
    pub queue_path: String,
    pub opens_at: DateTime<Utc>,
    pub queue_opens_at: DateTime<Utc>,
    pub seconds_to_opening: i64,
    /// Joining is open (the pre-queue or after the opening).
    pub can_join: bool,
    /// This browser has a ticket.
    pub joined: bool,
    /// Until when this browser's pass lets it buy (after the opening).
    pub pass_until: Option<DateTime<Utc>>,
}

impl DropBox {
    /// Whether the product can go in the cart now.
    pub fn may_buy(&self) -> bool {
        self.pass_until.is_some()
    }

    pub fn opens(&self) -> String {
        crate::clock::date_time_seconds(self.opens_at)
    }

    pub fn queue_opens(&self) -> String {
        crate::clock::date_time_seconds(self.queue_opens_at)
    }

    pub fn pass_ends(&self) -> String {
        self.pass_until
            .map(crate::clock::time_seconds)
            .unwrap_or_default()
    }
}

/// The drop box of `sku`'s page: `None` when the product is in no drop that binds it.
pub async fn drop_box(
    req: &HttpRequest,
    state: &AppState,
    sku: &str,
) -> Result<Option<DropBox>, AppError> {
    let Some(drop) = state.drops.of_sku(&state.db, sku).await? else {
        return Ok(None);
    };
    let now = Utc::now();
    if drop.binds_at > now {
        return Ok(None);
    }
    let identity = super::browser(req);
    let pass_until = browser_pass(req, drop.id)
        .and_then(|raw| pass::verify(&raw, &drop.secret, drop.id, &identity, now).ok())
        .filter(|_| drop.opens_at <= now)
        .map(|p| p.expires_at);
    Ok(Some(DropBox {
        queue_path: drop.queue_path(),
        opens_at: drop.opens_at,
        queue_opens_at: drop.prequeue_at(),
        seconds_to_opening: (drop.opens_at - now).num_seconds().max(0),
        can_join: api::join_refusal(&drop, now).is_none(),
        joined: req.cookie(&ticket_cookie(drop.id)).is_some(),
        pass_until,
    }))
}

#[derive(Template)]
#[template(path = "shop/queue.html")]
struct QueuePage {
    chrome: Chrome,
    drop: Drop,
    name: String,
    /// Where this browser's ticket stands; none before it joined.
    ticket: Option<TicketView>,
    /// Why joining is not possible now, in words.
    refusal: Option<String>,
    /// The queue could not be reached.
    unreachable: bool,
}

impl QueuePage {
    fn refresh_seconds(&self) -> u64 {
        match &self.ticket {
            _ if self.unreachable => 5,
            Some(t) if t.state == State::Waiting => t.retry_after_seconds,
            _ => 0,
        }
    }

    fn wait(&self) -> String {
        let Some(secs) = self.ticket.as_ref().and_then(|t| t.estimated_wait_seconds) else {
            return String::new();
        };
        match secs {
            0..=59 => "less than a minute".into(),
            60..=119 => "about a minute".into(),
            s if s < 3600 => format!("about {} minutes", s.div_ceil(60)),
            s => format!("about {} hours", s.div_ceil(3600)),
        }
    }

    fn opens(&self) -> String {
        crate::clock::date_time_seconds(self.drop.opens_at)
    }

    fn pass_ends(&self) -> String {
        self.ticket
            .as_ref()
            .and_then(|t| t.pass_expires_at)
            .map(crate::clock::time_seconds)
            .unwrap_or_default()
    }
}

async fn product_name(state: &AppState, drop: &Drop) -> String {
    let Ok(sku) = crate::catalog::Sku::parse(&drop.sku) else {
        return drop.sku.clone();
    };
    match state.catalog.product(&state.db, &sku).await {
        Ok(Some(p)) => p.name,
        _ => drop.sku.clone(),
    }
}

/// `GET /drops/{id}/queue`: the queue page.
pub async fn get_queue(
    req: HttpRequest,
    state: web::Data<AppState>,
    address: IdPath<api::DropAddress>,
) -> Result<HttpResponse, AppError> {
    let id = address.id()?;
    let drop = api::find_id(&state, id).await?;
    let identity = super::browser(&req);
    let mut page = QueuePage {
        chrome: Chrome::new(&req),
        name: product_name(&state, &drop).await,
        ticket: None,
        refusal: api::join_refusal(&drop, Utc::now()).map(|e| e.public_message()),
        unreachable: false,
        drop,
    };
    let ticket = req.cookie(&ticket_cookie(page.drop.id));
    // A cookie that is no ticket's id is as unknown as a ticket Redis lost.
    if let Some(ticket) = ticket.and_then(|t| Uuid::try_parse(t.value()).ok()) {
        match api::look(&state, &page.drop, ticket, &identity).await {
            Ok(view) => page.ticket = Some(view),
            // Unknown here (Redis lost it, or another browser's cookie): join again.
            Err(AppError::NotFound(_)) => {}
            Err(AppError::Unavailable { .. }) => page.unreachable = true,
            Err(e) => return Err(e),
        }
    }
    let status = if page.unreachable {
        actix_web::http::StatusCode::SERVICE_UNAVAILABLE
    } else {
        actix_web::http::StatusCode::OK
    };
    let mut res = html(status, &page)?;
    if let Some(view) = page.ticket.as_ref()
        && let (Some(pass), Some(until)) = (&view.pass, view.pass_expires_at)
    {
        let mut cookie = named_cookie(&req, pass_cookie(view.drop_id), pass.clone(), SameSite::Lax);
        let left = (until - Utc::now()).num_seconds().max(1);
        cookie.set_max_age(actix_web::cookie::time::Duration::seconds(left));
        res.add_cookie(&cookie).ok();
    }
    Ok(res)
}

/// `POST /drops/{id}/queue`: joins (or keeps the place this browser has) and shows it.
pub async fn post_queue(
    req: HttpRequest,
    state: web::Data<AppState>,
    address: IdPath<api::DropAddress>,
    form: web::Form<TokenForm>,
) -> Result<HttpResponse, AppError> {
    csrf::check_storefront(&req, &form.csrf)?;
    let id = address.id()?;
    let drop = api::find_id(&state, id).await?;
    let identity = super::browser(&req);
    let address = crate::http::client_addr(&req, &state.settings).to_string();
    let joiner = Joiner {
        identity: &identity,
        key_owner: &identity,
        address: &address,
    };
    let ticket = api::join(&state, &drop, &joiner).await?;
    let mut res = see_other(&drop.queue_path());
    let mut cookie = named_cookie(
        &req,
        ticket_cookie(drop.id),
        ticket.to_string(),
        SameSite::Lax,
    );
    cookie.set_max_age(actix_web::cookie::time::Duration::days(7));
    res.add_cookie(&cookie).ok();
    Ok(res)
}
