//! What every process does for the live drops, every `STOCKADE_DROP_TICK_MS`: lets in whoever the
//! rate allows (the same script a poll runs, so it makes no difference which process or
//! how many run it), records `drop.opened` after the opening and ends a drop whose
//! product sold out. Each of those is a conditional update, so it happens once however
//! many processes see it.

use std::sync::Arc;

use chrono::Utc;
use sqlx::PgPool;

use std::time::Duration;

use super::{Registry, Status, TICK_LIMIT, db, queue};
use crate::locking::Redis;
use crate::pg::bounded;

/// Every database call here is cut off at [`super::TICK_LIMIT`] (`pg::bounded`), so a tick
/// facing a dead network gives its connection up and the next tick tries again.
pub fn spawn(db: PgPool, redis: Redis, registry: Arc<Registry>, every: Duration) {
    tokio::spawn(async move {
        let mut last_reload = std::time::Instant::now() - super::registry::REFRESH;
        loop {
            if last_reload.elapsed() >= super::registry::REFRESH {
                match bounded(TICK_LIMIT, registry.reload(&db)).await {
                    Ok(()) => last_reload = std::time::Instant::now(),
                    Err(e) => tracing::warn!(error = %e, "could not read the live drops"),
                }
            }
            if let Ok(drops) = bounded(TICK_LIMIT, registry.live(&db)).await {
                for drop in drops {
                    if let Err(e) = tick(&db, &redis, &registry, &drop).await {
                        tracing::warn!(drop = %drop.id, error = %e, "a drop's tick failed");
                    }
                }
            }
            tokio::time::sleep(every).await;
        }
    });
}

async fn tick(
    db: &PgPool,
    redis: &Redis,
    registry: &Registry,
    drop: &super::Drop,
) -> sqlx::Result<()> {
    let now = Utc::now();
    if drop.opens_at > now {
        return Ok(());
    }
    if drop.opened_at.is_none() && bounded(TICK_LIMIT, db::mark_opened(db, drop)).await? {
        tracing::info!(drop = %drop.id, sku = %drop.sku, "drop opened");
    }
    // Sold out when nothing is on hand: held units may still come back to the queue.
    let on_hand = bounded(
        TICK_LIMIT,
        sqlx::query_scalar!("select on_hand from stock where sku = $1", drop.sku)
            .fetch_optional(db),
    )
    .await?
    .unwrap_or(0);
    if on_hand <= 0 && bounded(TICK_LIMIT, db::mark_sold_out_if_gone(db, drop)).await? {
        tracing::info!(drop = %drop.id, sku = %drop.sku, "drop sold out; its queue is closed");
        bounded(TICK_LIMIT, registry.reload(db)).await?;
        queue::expire(redis, drop.id).await;
        return Ok(());
    }
    // Redis away: nobody is let in until it answers again.
    let _ = queue::poll(redis, drop, None, drop.status == Status::Scheduled).await;
    Ok(())
}
