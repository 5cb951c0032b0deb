//! Inventory SQL. Functions that must share a transaction take `&mut PgConnection`
//! (pass `&mut *tx`), so the transaction boundary shows in the caller.

use sqlx::{PgConnection, PgPool};

use super::{LedgerMismatch, StockLevel};
use crate::catalog::Sku;

/// Creates the stock row of a new product with its `initial` ledger row.
pub async fn create_stock(
    conn: &mut PgConnection,
    sku: &Sku,
    on_hand: i32,
    actor: &str,
) -> sqlx::Result<()> {
    sqlx::query("insert into stock (sku, on_hand) values ($1, $2)")
        .bind(sku.as_str())
        .bind(on_hand)
        .execute(&mut *conn)
        .await?;
    sqlx::query(
        r#"insert into stock_movements (sku, delta, reason, actor)
           values ($1, $2, 'initial', $3)"#,
    )
    .bind(sku.as_str())
    .bind(on_hand)
    .bind(actor)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// The stock row of `sku`.
pub async fn stock_level(pool: &PgPool, sku: &Sku) -> sqlx::Result<Option<StockLevel>> {
    sqlx::query_as("select sku, on_hand, reserved from stock where sku = $1")
        .bind(sku.as_str())
        .fetch_optional(pool)
        .await
}

/// SKUs whose stock row differs from the sum of their ledger (empty when all is well).
pub async fn ledger_mismatches(pool: &PgPool) -> sqlx::Result<Vec<LedgerMismatch>> {
    sqlx::query_as(
        r#"select s.sku, s.on_hand, s.reserved,
                  coalesce(sum(m.delta), 0) as ledger_on_hand,
                  coalesce(sum(m.reserved_delta), 0) as ledger_reserved
             from stock s
             left join stock_movements m on m.sku = s.sku
            group by s.sku, s.on_hand, s.reserved
           having s.on_hand <> coalesce(sum(m.delta), 0)
               or s.reserved <> coalesce(sum(m.reserved_delta), 0)
            order by s.sku"#,
    )
    .fetch_all(pool)
    .await
}
