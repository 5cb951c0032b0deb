//! What every process does for the live drops, every [`super::TICK`]: lets in whoever the
//! rate allows (the same script a poll runs, so it makes no difference which process or
//! how many run it), records `drop.opened` after the opening and ends a drop whose
//! product sold out. Each of those is a conditional update, so it happens once however
//! many processes see it.

use std::sync::Arc;

use chrono::Utc;
use sqlx::PgPool;

use super::{Registry, Status, db, queue};
use crate::locking::Redis;

pub fn spawn(db: PgPool, redis: Redis, registry: Arc<Registry>) {
    tokio::spawn(async move {
        let mut last_reload = std::time::Instant::now() - super::registry::REFRESH;
        loop {
            if last_reload.elapsed() >= super::registry::REFRESH {
                match registry.reload(&db).await {
                    Ok(()) => last_reload = std::time::Instant::now(),
                    Err(e) => tracing::warn!(error = %e, "could not read the live drops"),
                }
            }
            if let Ok(drops) = registry.live(&db).await {
                for drop in drops {
                    if let Err(e) = tick(&db, &redis, &registry, &drop).await {
                        tracing::warn!(drop = %drop.id, error = %e, "a drop's tick failed");
                    }
                }
            }
            tokio::time::sleep(super::TICK).await;
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
    if drop.opened_at.is_none() && db::mark_opened(db, drop).await? {
        tracing::info!(drop = %drop.id, sku = %drop.sku, "drop opened");
    }
    let left = sqlx::query_scalar!(
        r#"select (on_hand - reserved)::bigint as "left!" from stock where sku = $1"#,
        drop.sku
    )
    .fetch_optional(db)
    .await?
    .unwrap_or(0);
    if left <= 0 && db::mark_sold_out_if_gone(db, drop).await? {
        tracing::info!(drop = %drop.id, sku = %drop.sku, "drop sold out; its queue is closed");
        registry.reload(db).await?;
        queue::expire(redis, drop.id).await;
        return Ok(());
    }
    // Redis away: nobody is let in until it answers again.
    let _ = queue::poll(redis, drop, None, drop.status == Status::Scheduled).await;
    Ok(())
}
