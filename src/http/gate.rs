//! A drop's gate, as the pages and the API both meet it: who a shopper is to a drop, whether
//! a hold, order or confirmation of a product in a drop may go ahead (a pass, or a key
//! already decided), and joining the queue and reading a ticket, with every refusal in
//! words.

use actix_web::HttpRequest;
use uuid::Uuid;

use crate::clients::{Caller, Limit};
use crate::drops::queue::{self, Joined, Joiner};
use crate::drops::ticket::{self, LookError, TicketView};
use crate::drops::{Drop, registry::RequireError};
use crate::error::AppError;
use crate::http::AppState;
use crate::http::paths::Names;

/// The header an admitted API client sends its pass in.
pub const PASS_HEADER: &str = "drop-pass";
/// The header a client acting for many buyers (one with no rate limit) names the buyer in.
pub const SHOPPER_HEADER: &str = "drop-shopper";

/// Who a pass is for, from the API, and the owner part of their idempotency keys: the
/// client; for a client acting for many buyers (no rate limit: a platform, the load
/// tools), the buyer it names in `Drop-Shopper`. Anonymous callers share one identity.
pub fn identity(req: &HttpRequest, caller: &Caller) -> Result<(String, String), AppError> {
    let owner = caller.owner();
    let Some(raw) = req.headers().get(SHOPPER_HEADER) else {
        return Ok((owner.clone(), owner));
    };
    let shopper = raw
        .to_str()
        .ok()
        .map(str::trim)
        .filter(|s| {
            (1..=64).contains(&s.len())
                && s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
        .ok_or_else(|| {
            AppError::BadRequest(
                "Drop-Shopper must be 1 to 64 letters, digits, dashes or underscores.".into(),
            )
        })?;
    match caller {
        Caller::Client(c) if c.limit == Limit::Unlimited => {
            Ok((format!("{owner}/{shopper}"), owner))
        }
        _ => Err(AppError::Unprocessable(
            "Only an API client without a rate limit may act for several buyers with \
             Drop-Shopper; send the request without it."
                .into(),
        )),
    }
}

/// A drop's address, `/drops/{id}/…` or `/api/v1/drops/{id}/…`.
pub struct DropAddress;

impl Names for DropAddress {
    type Id = uuid::Uuid;

    fn missing(_: &str) -> AppError {
        AppError::not_found("There is no drop at this address.")
    }
}

/// A ticket in a drop's queue: `/api/v1/drops/{id}/queue/{ticket}` (the shop keeps it in a
/// cookie). One that is not a ticket's id, or not the caller's, reads the same.
pub struct TicketAddress;

impl Names for TicketAddress {
    type Id = Uuid;
    const SEGMENT: &'static str = "ticket";

    fn missing(_: &str) -> AppError {
        AppError::not_found(
            "There is no such ticket in this drop's queue for you; join the queue to get one.",
        )
    }
}

/// The drop `id`, or 404: a live one as this process knows it (no database read per
/// poll), an ended one from the database.
pub async fn find_id(state: &AppState, id: Uuid) -> Result<Drop, AppError> {
    if let Some(live) = state.drops.by_id(&state.db, id).await? {
        return Ok((*live).clone());
    }
    crate::drops::db::get(&state.db, id)
        .await?
        .ok_or_else(|| DropAddress::missing(""))
}

/// A hold or order of `skus` may go ahead for `identity` (`Err`: a caller whose identity is
/// not valid, which matters only for a product in a drop) with `passes`; and one refused
/// for want of a pass still goes ahead when its key (`scope`, `key`) already has a record,
/// so a retry is answered from it (the order or hold it made), never contradicted.
pub async fn may_place(
    state: &AppState,
    skus: &[crate::catalog::Sku],
    identity: Result<&str, &AppError>,
    passes: impl Fn(Uuid) -> Option<String>,
    record: (
        crate::idempotency::Scope,
        &crate::idempotency::IdempotencyKey,
    ),
) -> Result<(), RequireError> {
    let who = identity.as_ref().map_or("", |i| *i);
    let refusal = match state
        .drops
        .require_pass(&state.db, skus.iter().map(|s| s.as_str()), who, passes)
        .await
    {
        Ok(()) => return Ok(()),
        Err(RequireError::Database(e)) => return Err(e.into()),
        Err(refusal) => refusal,
    };
    let (scope, key) = record;
    let known = crate::idempotency::present(&state.db, &[(scope.as_str(), key.as_str())]).await?;
    if known.first().copied().unwrap_or(false) {
        return Ok(());
    }
    Err(refusal)
}

/// A hold becomes an order of a drop's product only under the drop's rule in force at
/// confirmation, checked whatever the hold's state (one read of the hold, when a drop
/// binds any product):
/// - a live hold placed before the drop bound its product was placed without a pass, so
///   it needs one now (one placed after had to show a pass to be made);
/// - an expired hold no longer reserves anything: confirming it buys from free stock, a
///   new sale, so it needs a pass as a new order would, whenever it was placed. Otherwise
///   holds taken before a drop was announced, left to expire, would buy past its queue.
///
/// A confirmed hold is answered from its record, a released one refused; neither is read.
pub async fn may_confirm(
    state: &AppState,
    hold: Uuid,
    identity: &str,
    passes: impl Fn(Uuid) -> Option<String>,
) -> Result<(), RequireError> {
    let now = chrono::Utc::now();
    if !state.drops.binds_any(&state.db, now).await? {
        return Ok(());
    }
    let mut unbound = Vec::new();
    // The confirmation after this read may take up to the request's budget: a hold that
    // could expire meanwhile is held to an expired hold's rule now.
    let margin = state.settings.request_budget;
    for held in crate::holds::db::confirmable_skus(&state.db, hold, margin).await? {
        let drop = state.drops.of_sku(&state.db, &held.sku).await?;
        if drop.is_some_and(|d| d.binds_at <= now && (!held.live || held.placed_at < d.binds_at)) {
            unbound.push(held.sku);
        }
    }
    state
        .drops
        .require_pass(
            &state.db,
            unbound.iter().map(String::as_str),
            identity,
            passes,
        )
        .await
}

/// A hold or order refused for want of a pass (403 naming the queue), or a database error.
pub fn refused(e: RequireError) -> AppError {
    match e {
        RequireError::NeedsPass(n) => AppError::NeedsPass {
            message: n.message,
            details: serde_json::json!({
                "queue": format!("/api/v1{}", n.queue_path),
                "queue_page": n.queue_path,
                "drop_id": n.drop_id,
                "sku": n.sku,
            }),
        },
        RequireError::Database(e) => e.into(),
    }
}

pub fn unreachable() -> AppError {
    AppError::Unavailable {
        message: "The drop's queue cannot be reached right now; nobody is let in meanwhile. \
                  Please try again in a moment: your place is kept."
            .into(),
        retry_after: 2,
    }
}

/// Why joining was refused, in words; `None` when joining is open.
pub fn join_refusal(drop: &Drop, now: chrono::DateTime<chrono::Utc>) -> Option<AppError> {
    if drop.status.is_over() {
        return Some(AppError::conflict(
            "This drop has ended; its queue is closed.",
        ));
    }
    let from = drop.prequeue_at();
    (now < from).then(|| AppError::Conflict {
        message: format!(
            "The queue for this drop opens at {}; please come back then.",
            from.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
        ),
        retry_after: Some((from - now).num_seconds().max(1) as u64),
        details: Some(serde_json::json!({ "queue_opens_at": from })),
    })
}

/// Joins the queue for `joiner`, or the refusal in words.
pub async fn join(state: &AppState, drop: &Drop, joiner: &Joiner<'_>) -> Result<Uuid, AppError> {
    if let Some(refusal) = join_refusal(drop, chrono::Utc::now()) {
        return Err(refusal);
    }
    let per_address = state.settings.drop_places_per_address;
    match queue::join(&state.redis, drop, joiner, per_address).await {
        Err(queue::Unreachable) => Err(unreachable()),
        Ok(Joined::Ticket { ticket, .. }) => Ok(ticket),
        // Redis's clock says the pre-queue has not opened yet (ours runs a little ahead).
        Ok(Joined::Early) => Err(join_refusal(
            drop,
            drop.prequeue_at() - chrono::Duration::seconds(1),
        )
        .unwrap_or_else(unreachable)),
        Ok(Joined::AddressFull) => Err(AppError::TooManyRequests {
            message: format!(
                "{per_address} shoppers from your network have joined this drop's queue, as many \
                 as one address may; if you are one of them, use the browser or key you joined with."
            ),
            retry_after: 60,
        }),
    }
}

/// `ticket` for `identity`, or 404/503 in words.
pub async fn look(
    state: &AppState,
    drop: &Drop,
    ticket: Uuid,
    identity: &str,
) -> Result<TicketView, AppError> {
    match ticket::look(&state.db, &state.redis, drop, ticket, identity).await {
        Ok(Some(view)) => Ok(view),
        Ok(None) => Err(TicketAddress::missing("")),
        Err(LookError::Unreachable) => Err(unreachable()),
        Err(LookError::Database(e)) => Err(e.into()),
    }
}
