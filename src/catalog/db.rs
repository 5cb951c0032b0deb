//! Catalogue queries. Availability is always `on_hand − reserved`.

use sqlx::PgPool;

use super::{ProductView, Sku};

/// The columns of a [`ProductView`]; a macro so queries stay `'static` literals.
macro_rules! select_view {
    ($rest:literal) => {
        concat!(
            "select p.sku, p.name, p.description, p.price_cents, p.purchase_limit, ",
            "coalesce(s.on_hand - s.reserved, 0) as available ",
            "from products p left join stock s on s.sku = p.sku ",
            $rest
        )
    };
}

/// Active products, by name.
#[tracing::instrument(skip_all)]
pub async fn list_products(pool: &PgPool) -> sqlx::Result<Vec<ProductView>> {
    sqlx::query_as(select_view!("where p.active order by p.name"))
        .fetch_all(pool)
        .await
}

/// One active product, or `None`.
#[tracing::instrument(skip_all, fields(sku = %sku))]
pub async fn find_product(pool: &PgPool, sku: &Sku) -> sqlx::Result<Option<ProductView>> {
    sqlx::query_as(select_view!("where p.active and p.sku = $1"))
        .bind(sku.as_str())
        .fetch_optional(pool)
        .await
}

/// Sets (or with `None` removes) `sku`'s purchase limit; false when there is no such product.
pub async fn set_purchase_limit(
    pool: &PgPool,
    sku: &Sku,
    limit: Option<i32>,
) -> sqlx::Result<bool> {
    let updated = sqlx::query("update products set purchase_limit = $2 where sku = $1")
        .bind(sku.as_str())
        .bind(limit)
        .execute(pool)
        .await?
        .rows_affected();
    Ok(updated == 1)
}
