//! Reads of holds for the admin's dashboard.

use sqlx::PgPool;

/// How many holds are active and not yet expired.
#[tracing::instrument(skip_all)]
pub async fn active_count(pool: &PgPool) -> sqlx::Result<i64> {
    sqlx::query_scalar!(
        r#"select count(*) as "count!" from holds where state = 'active' and expires_at > now()"#
    )
    .fetch_one(pool)
    .await
}
