//! Where a ticket stands, as the queue page and the API show it: its place, the wait
//! estimated from the rate shoppers were actually let in, when to ask again, and once
//! admitted the pass (written to PostgreSQL first).

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;
use uuid::Uuid;

use super::queue::{self, Standing, Unreachable};
use super::{Drop, Status, pass};
use crate::locking::Redis;

/// A ticket's state, as the API names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum State {
    Waiting,
    Admitted,
    Expired,
    Closed,
}

/// Where a ticket stands in a drop's queue.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct TicketView {
    pub drop_id: Uuid,
    pub ticket: Uuid,
    pub sku: String,
    /// `waiting`; `admitted` (with `pass`); `expired` (the admission ran out); `closed`
    /// (the drop ended or sold out).
    pub state: State,
    /// 1 for the next one in; none before a lottery's draw at the opening.
    pub position: Option<u64>,
    pub ahead: Option<u64>,
    pub estimated_wait_seconds: Option<u64>,
    /// When to ask again.
    pub retry_after_seconds: u64,
    pub opens_at: DateTime<Utc>,
    /// Whether letting in is paused.
    pub paused: bool,
    /// Once admitted: send it as `Drop-Pass` with the hold or order of the drop's product.
    pub pass: Option<String>,
    pub pass_expires_at: Option<DateTime<Utc>>,
}

#[derive(Debug, thiserror::Error)]
pub enum LookError {
    #[error("the queue cannot be reached")]
    Unreachable,
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

impl From<Unreachable> for LookError {
    fn from(_: Unreachable) -> Self {
        Self::Unreachable
    }
}

/// How often a waiting shopper asks again: every 2 s close to the front, less often far
/// back, never less often than every 15 s.
fn retry_after(wait: Option<u64>) -> u64 {
    wait.map_or(5, |w| (w / 10).clamp(2, 15))
}

/// `ticket` of `drop` as `identity` may see it; `None` when it is not theirs (or unknown).
pub async fn look(
    db: &PgPool,
    redis: &Redis,
    drop: &Drop,
    ticket: Uuid,
    identity: &str,
) -> Result<Option<TicketView>, LookError> {
    let mut view = TicketView {
        drop_id: drop.id,
        ticket,
        sku: drop.sku.clone(),
        state: State::Closed,
        position: None,
        ahead: None,
        estimated_wait_seconds: None,
        retry_after_seconds: 0,
        opens_at: drop.opens_at,
        paused: drop.status == Status::Paused,
        pass: None,
        pass_expires_at: None,
    };
    let open = drop.status == Status::Scheduled;
    let (stats, standing) = queue::poll(redis, drop, Some(ticket), open).await?;
    match standing {
        Standing::Unknown => return Ok(None),
        Standing::Waiting { identity: i, .. }
        | Standing::Admitted(queue::Admission { identity: i, .. })
            if i != identity =>
        {
            return Ok(None);
        }
        _ if drop.status.is_over() => {}
        Standing::Waiting { ahead, drawn, .. } => {
            // In milliseconds: a lottery's place stays hidden until the opening itself, not
            // only until its last whole second.
            let until_opening = (drop.opens_at - stats.now).num_milliseconds().max(0) as u64;
            let before_opening = until_opening.div_ceil(1000);
            let rate = queue::rate_per_second(drop, &stats);
            let hidden = drawn && until_opening > 0;
            // Before a lottery's opening the place is secret, and so is the wait it implies:
            // the pre-queue's average is shown instead.
            let place = if hidden {
                stats.waiting.div_ceil(2)
            } else {
                ahead + 1
            };
            let wait = before_opening + (place as f64 / rate).ceil() as u64;
            view.state = State::Waiting;
            view.position = (!hidden).then_some(ahead + 1);
            view.ahead = (!hidden).then_some(ahead);
            view.estimated_wait_seconds = Some(wait);
            view.retry_after_seconds = if view.paused {
                10
            } else {
                retry_after(Some(wait))
            };
        }
        Standing::Admitted(admission) if admission.expires_at <= stats.now => {
            view.state = State::Expired;
            view.pass_expires_at = Some(admission.expires_at);
        }
        Standing::Admitted(admission) => {
            let (recorded, expires_at) =
                super::db::record_admission(db, drop.id, &admission).await?;
            if expires_at <= stats.now {
                view.state = State::Expired;
                view.pass_expires_at = Some(expires_at);
                return Ok(Some(view));
            }
            view.state = State::Admitted;
            view.position = Some(0);
            view.ahead = Some(0);
            view.estimated_wait_seconds = Some(0);
            view.pass = Some(pass::sign(
                &drop.secret,
                drop.id,
                recorded,
                expires_at,
                identity,
            ));
            view.pass_expires_at = Some(expires_at);
        }
    }
    Ok(Some(view))
}
