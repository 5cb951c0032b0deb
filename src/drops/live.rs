//! A drop's figures for the admin's live view: the queue's from Redis, the sales from
//! PostgreSQL.

use chrono::Utc;
use serde::Serialize;
use sqlx::PgPool;

use super::{Drop, Status, queue};
use crate::locking::Redis;

/// What the admin sees of a drop while it runs.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Live {
    pub id: uuid::Uuid,
    pub sku: String,
    /// The product's name.
    pub name: String,
    /// `scheduled`, `paused`, `ended` or `sold_out`: as recorded.
    pub status: String,
    /// Where it stands now, by the clock as well: `scheduled` (the queue not open yet),
    /// `pre-queue` (joining, not yet selling), `open`, `paused`, `sold out` or `ended`.
    pub phase: &'static str,
    pub opens_at: chrono::DateTime<Utc>,
    pub queue_opens_at: chrono::DateTime<Utc>,
    /// `fifo` or `lottery`.
    pub queueing: String,
    pub admit_per_minute: i32,
    pub max_active: Option<i32>,
    pub session_seconds: i32,
    /// The queue's figures; none while Redis cannot be reached.
    pub waiting: Option<u64>,
    pub admitted: Option<u64>,
    /// Admitted and their admission not over yet.
    pub active: Option<u64>,
    /// Shoppers let in over the last minute (or since the opening, if sooner), per minute.
    pub admission_rate_per_minute: Option<f64>,
    /// Units sold since the drop bound its product, and units left to sell.
    pub sold: i64,
    pub units_left: i64,
    /// At the rate units sold since the opening.
    pub estimated_seconds_to_sell_out: Option<u64>,
}

pub async fn live(db: &PgPool, redis: &Redis, drop: &Drop) -> sqlx::Result<Live> {
    let sales = super::db::sales(db, drop).await?;
    let stats = if drop.status.is_over() {
        None
    } else {
        queue::poll(redis, drop, None, drop.status == Status::Scheduled)
            .await
            .ok()
            .map(|(stats, _)| stats)
    };
    let since_opening = (Utc::now() - drop.opens_at).num_milliseconds() as f64 / 1000.0;
    let eta = (since_opening > 0.0 && sales.sold > 0 && sales.left > 0)
        .then(|| (sales.left as f64 / (sales.sold as f64 / since_opening)).ceil() as u64);
    let name = sqlx::query_scalar!("select name from products where sku = $1", drop.sku)
        .fetch_optional(db)
        .await?
        .unwrap_or_else(|| drop.sku.clone());
    let now = Utc::now();
    let phase = match drop.status {
        Status::Paused => "paused",
        Status::Ended => "ended",
        Status::SoldOut => "sold out",
        Status::Scheduled if sales.left <= 0 && now >= drop.opens_at => "sold out",
        Status::Scheduled if now >= drop.opens_at => "open",
        Status::Scheduled if now >= drop.prequeue_at() => "pre-queue",
        Status::Scheduled => "scheduled",
    };
    Ok(Live {
        id: drop.id,
        sku: drop.sku.clone(),
        name,
        status: drop.status.as_str().into(),
        phase,
        opens_at: drop.opens_at,
        queue_opens_at: drop.prequeue_at(),
        queueing: drop.queueing.as_str().into(),
        admit_per_minute: drop.admit_per_minute,
        max_active: drop.max_active,
        session_seconds: drop.session_seconds,
        waiting: stats.map(|s| s.waiting),
        admitted: stats.map(|s| s.admitted),
        active: stats.map(|s| s.active),
        admission_rate_per_minute: stats
            .filter(|s| s.now >= drop.opens_at)
            .map(|s| (queue::rate_per_second(drop, &s) * 60.0 * 10.0).round() / 10.0),
        sold: sales.sold,
        units_left: sales.left,
        estimated_seconds_to_sell_out: eta,
    })
}
