//! A SKU's ledger as the admin reads it: a page of movements, newest first, with the
//! on-hand and reserved counts after each.

use sqlx::PgPool;

use crate::catalog::Sku;

/// One ledger row with the on-hand count after it.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Movement {
    pub id: i64,
    pub created_at: chrono::DateTime<chrono::Utc>,
    pub delta: i32,
    pub reserved_delta: i32,
    pub reason: String,
    pub note: Option<String>,
    pub reference: Option<String>,
    pub actor: String,
    pub running_on_hand: i64,
    pub running_reserved: i64,
}

/// A page of `sku`'s ledger, newest first, with running totals.
///
/// The totals are counted back from the stock row, in the same snapshot: the count after
/// a movement is the stock row's minus every movement newer than it. While the ledger and
/// the stock row agree (I1, which the page's "Verify" and `stockade check` prove), that is
/// the ledger's own running sum — at the cost of the rows newer than the page, not of the
/// SKU's whole history (a hot SKU's ledger grows by millions of rows a day). Those rows
/// and the page's are read once, together: the sums run over them, and the offset drops
/// the newer rows after. (Read apart, a planner without statistics on a freshly filled
/// ledger summed the newer rows again for every row of the page.)
#[tracing::instrument(skip_all)]
pub async fn page(
    pool: &PgPool,
    sku: &Sku,
    limit: i64,
    offset: i64,
) -> sqlx::Result<Vec<Movement>> {
    sqlx::query_as!(
        Movement,
        r#"select m.id as "id!", m.created_at as "created_at!", m.delta as "delta!",
                  m.reserved_delta as "reserved_delta!", m.reason as "reason!", m.note,
                  m.reference, m.actor as "actor!",
                  (s.on_hand - coalesce(sum(m.delta) over newer, 0))::bigint
                      as "running_on_hand!",
                  (s.reserved - coalesce(sum(m.reserved_delta) over newer, 0))::bigint
                      as "running_reserved!"
             from (select id, created_at, delta, reserved_delta, reason, note, reference,
                          actor
                     from stock_movements where sku = $1
                    order by id desc limit $2::bigint + $3::bigint) m
             join stock s on s.sku = $1
           window newer as (order by m.id desc rows between unbounded preceding and 1 preceding)
            order by m.id desc
           offset $3::bigint"#,
        sku.as_str(),
        limit,
        offset,
    )
    .fetch_all(pool)
    .await
}

/// Ledger rows counted for the page links at most: a hot SKU's ledger has millions, and
/// counting them all would cost the page half a second per ten million.
pub const COUNTED: i64 = 100_000;

/// How many ledger rows `sku` has, counted up to [`COUNTED`]; `true` when there are more.
#[tracing::instrument(skip_all)]
pub async fn len(pool: &PgPool, sku: &Sku) -> sqlx::Result<(i64, bool)> {
    let counted = sqlx::query_scalar!(
        r#"select count(*) as "count!"
             from (select 1 from stock_movements where sku = $1 limit $2) counted"#,
        sku.as_str(),
        COUNTED + 1,
    )
    .fetch_one(pool)
    .await?;
    Ok((counted.min(COUNTED), counted > COUNTED))
}
