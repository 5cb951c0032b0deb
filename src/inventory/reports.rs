//! Reads of stock for the admin: totals, the products lowest on stock, and a product's
//! stock row checked against its ledger. Nothing here writes.

use serde::Serialize;
use sqlx::PgPool;

use crate::catalog::Sku;

/// Units on hand and reserved, over every SKU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Totals {
    pub on_hand: i64,
    pub reserved: i64,
}

/// Sums of every stock row.
#[tracing::instrument(skip_all)]
pub async fn totals(pool: &PgPool) -> sqlx::Result<Totals> {
    sqlx::query_as!(
        Totals,
        r#"select coalesce(sum(on_hand), 0)::bigint as "on_hand!",
                  coalesce(sum(reserved), 0)::bigint as "reserved!"
             from stock"#,
    )
    .fetch_one(pool)
    .await
}

/// An active product's stock, as the dashboard lists it.
#[derive(Debug, Clone, Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct StockRow {
    pub sku: String,
    pub name: String,
    pub on_hand: i32,
    pub reserved: i32,
    pub available: i32,
}

/// Up to `limit` active products whose available units (`on_hand − reserved`) lie in
/// `range`, fewest first.
#[tracing::instrument(skip_all)]
pub async fn available_between(
    pool: &PgPool,
    range: std::ops::RangeInclusive<i32>,
    limit: i64,
) -> sqlx::Result<Vec<StockRow>> {
    sqlx::query_as!(
        StockRow,
        r#"select p.sku, p.name, s.on_hand, s.reserved, s.on_hand - s.reserved as "available!"
             from stock s join products p on p.sku = s.sku
            where p.active and s.on_hand - s.reserved between $1 and $2
            order by s.on_hand - s.reserved, p.sku limit $3"#,
        *range.start(),
        *range.end(),
        limit,
    )
    .fetch_all(pool)
    .await
}

/// A stock row beside the sums of its ledger, read in one snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LedgerCheck {
    pub on_hand: i32,
    pub reserved: i32,
    pub ledger_on_hand: i64,
    pub ledger_reserved: i64,
}

impl LedgerCheck {
    /// The ledger sums to the stock row (invariant I1 for this SKU).
    pub fn matches(&self) -> bool {
        self.ledger_on_hand == i64::from(self.on_hand)
            && self.ledger_reserved == i64::from(self.reserved)
    }
}

/// `sku`'s stock row and its ledger's sums, or `None` without a stock row. One statement,
/// one snapshot: sales in between cannot fake a mismatch.
#[tracing::instrument(skip_all)]
pub async fn check_ledger(pool: &PgPool, sku: &Sku) -> sqlx::Result<Option<LedgerCheck>> {
    sqlx::query_as!(
        LedgerCheck,
        r#"select s.on_hand, s.reserved,
                  coalesce(sum(m.delta), 0)::bigint as "ledger_on_hand!",
                  coalesce(sum(m.reserved_delta), 0)::bigint as "ledger_reserved!"
             from stock s left join stock_movements m on m.sku = s.sku
            where s.sku = $1
            group by s.on_hand, s.reserved"#,
        sku.as_str(),
    )
    .fetch_optional(pool)
    .await
}
