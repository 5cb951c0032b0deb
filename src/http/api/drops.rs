//! A drop's queue for API clients: join (a ticket), then poll it until admitted (a pass
//! to send as `Drop-Pass` with the hold or order of the drop's product).

use actix_web::http::header;
use actix_web::{HttpRequest, HttpResponse, web};
use uuid::Uuid;

use crate::clients::Caller;
use crate::drops::queue::Joiner;
use crate::drops::ticket::TicketView;
use crate::error::AppError;
use crate::http::contract::{LookupErrors, QueueErrors, ShopperHeader};
use crate::http::gate::{DropAddress, TicketAddress, find_id, identity, join, look};
use crate::http::paths::IdPath;
use crate::http::{AppState, limits};

fn ticket_response(mut res: actix_web::HttpResponseBuilder, view: &TicketView) -> HttpResponse {
    if view.retry_after_seconds > 0 {
        res.insert_header((header::RETRY_AFTER, view.retry_after_seconds.to_string()));
    }
    res.insert_header((
        header::LOCATION,
        format!("/api/v1/drops/{}/queue/{}", view.drop_id, view.ticket),
    ))
    .json(view)
}

/// Joins a drop's queue (or, joined already, returns the same ticket). One place per
/// caller (per `Drop-Shopper` for a client acting for many buyers); poll the ticket's
/// `Location` no sooner than `Retry-After`.
#[utoipa::path(
    post,
    path = "/api/v1/drops/{id}/queue",
    tag = "drops",
    security(("api_key" = [])),
    params(("id" = String, Path, description = "The drop's id."), ShopperHeader),
    responses(
        (status = 201, description = "The ticket, new or the one this caller had.",
            body = TicketView,
            headers(
                ("Location" = String, description = "The ticket's address, to poll."),
                ("Retry-After" = u64, description = "Seconds before asking again."),
            )),
        QueueErrors,
    )
)]
pub async fn post_queue(
    req: HttpRequest,
    state: web::Data<AppState>,
    address: IdPath<DropAddress>,
) -> Result<HttpResponse, AppError> {
    let caller = limits::caller(&req, &state).await?;
    if caller == Caller::Anonymous {
        return Err(AppError::ApiKey {
            message: "Joining a drop's queue needs an API key (`Authorization: Bearer sk_…`): \
                      a pass is given to one client."
                .into(),
            invalid: false,
        });
    }
    let drop = find_id(&state, address.id()?).await?;
    let (identity, key_owner) = identity(&req, &caller)?;
    let address = crate::http::client_addr(&req, &state.settings).to_string();
    let joiner = Joiner {
        identity: &identity,
        key_owner: &key_owner,
        address: &address,
    };
    let ticket = join(&state, &drop, &joiner).await?;
    let view = look(&state, &drop, ticket, &identity).await?;
    Ok(ticket_response(HttpResponse::Created(), &view))
}

/// Where a ticket stands; once admitted, the pass. Only the caller that joined sees it.
#[utoipa::path(
    get,
    path = "/api/v1/drops/{id}/queue/{ticket}",
    tag = "drops",
    security(("api_key" = [])),
    params(
        ("id" = String, Path, description = "The drop's id."),
        ("ticket" = String, Path, description = "The ticket's id."),
        ShopperHeader,
    ),
    responses(
        (status = 200, description = "The ticket.", body = TicketView,
            headers(("Retry-After" = u64, description = "Seconds before asking again."))),
        QueueErrors,
    )
)]
pub async fn get_queue_ticket(
    req: HttpRequest,
    state: web::Data<AppState>,
    address: IdPath<DropAddress>,
    ticket: IdPath<TicketAddress>,
) -> Result<HttpResponse, AppError> {
    let caller = limits::caller(&req, &state).await?;
    let drop = find_id(&state, address.id()?).await?;
    let (identity, _) = identity(&req, &caller)?;
    let view = look(&state, &drop, ticket.id()?, &identity).await?;
    Ok(ticket_response(HttpResponse::Ok(), &view))
}

/// A drop as shoppers see it.
#[derive(serde::Serialize, utoipa::ToSchema)]
pub struct PublicDrop {
    id: Uuid,
    sku: String,
    /// `scheduled`, `paused`, `ended` or `sold_out`.
    status: String,
    opens_at: chrono::DateTime<chrono::Utc>,
    /// When joining the queue opens (the pre-queue).
    queue_opens_at: chrono::DateTime<chrono::Utc>,
    /// `fifo` or `lottery`.
    queueing: String,
    /// Where to join (`POST`).
    queue: String,
}

/// A drop: its product, when it opens, and where its queue is.
#[utoipa::path(
    get,
    path = "/api/v1/drops/{id}",
    tag = "drops",
    params(("id" = String, Path, description = "The drop's id.")),
    responses(
        (status = 200, description = "The drop.", body = PublicDrop),
        LookupErrors,
    )
)]
pub async fn get_drop(
    state: web::Data<AppState>,
    address: IdPath<DropAddress>,
) -> Result<HttpResponse, AppError> {
    let id = address.id()?;
    let drop = find_id(&state, id).await?;
    Ok(HttpResponse::Ok().json(PublicDrop {
        id: drop.id,
        sku: drop.sku.clone(),
        status: drop.status.as_str().into(),
        opens_at: drop.opens_at,
        queue_opens_at: drop.prequeue_at(),
        queueing: drop.queueing.as_str().into(),
        queue: format!("/api/v1{}", drop.queue_path()),
    }))
}
