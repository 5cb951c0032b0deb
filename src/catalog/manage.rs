//! Products as the admin manages them: every product (active or not) with its stock
//! figures and settings, found by SKU or name, created, and edited. The opening stock of a
//! new product is written by [`crate::inventory`], in the caller's transaction.

use sqlx::{PgConnection, PgPool};

use super::{Sku, format_cents};

/// A product with its stock row, as the admin's list and product page show it.
#[derive(Debug, Clone)]
pub struct ProductRow {
    pub sku: String,
    pub name: String,
    pub description: String,
    pub price_cents: i64,
    pub active: bool,
    pub on_hand: i32,
    pub reserved: i32,
    /// At most this many per customer (none: no limit).
    pub purchase_limit: Option<i32>,
    pub category: Option<String>,
    /// The picture's ETag, when it has one (read on the product page only).
    pub image: Option<String>,
}

impl ProductRow {
    pub fn price(&self) -> String {
        format_cents(self.price_cents)
    }
    pub fn price_input(&self) -> String {
        format!("{}.{:02}", self.price_cents / 100, self.price_cents % 100)
    }
    pub fn available(&self) -> i32 {
        self.on_hand - self.reserved
    }
    pub fn category_input(&self) -> &str {
        self.category.as_deref().unwrap_or_default()
    }
    pub fn limit_input(&self) -> String {
        self.purchase_limit
            .map(|n| n.to_string())
            .unwrap_or_default()
    }
}

/// What the admin sets on a product.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProductFields {
    pub name: String,
    pub description: String,
    pub price_cents: i64,
    pub active: bool,
    pub purchase_limit: Option<i32>,
    pub category: Option<String>,
}

/// A page of products whose SKU or name contains `text` (any case), by SKU, and how many
/// match in all.
#[tracing::instrument(skip_all)]
pub async fn search(
    pool: &PgPool,
    text: &str,
    limit: i64,
    offset: i64,
) -> sqlx::Result<(Vec<ProductRow>, i64)> {
    let pattern = format!(
        "%{}%",
        text.replace('\\', "\\\\")
            .replace('%', "\\%")
            .replace('_', "\\_")
    );
    let products = sqlx::query_as!(
        ProductRow,
        r#"select p.sku, p.name, p.description, p.price_cents, p.active, s.on_hand, s.reserved,
                  p.purchase_limit, p.category, null::text as image
             from products p join stock s on s.sku = p.sku
            where p.sku ilike $1 or p.name ilike $1
            order by p.sku limit $2 offset $3"#,
        pattern,
        limit,
        offset,
    )
    .fetch_all(pool)
    .await?;
    let total = sqlx::query_scalar!(
        r#"select count(*) as "count!" from products p where p.sku ilike $1 or p.name ilike $1"#,
        pattern,
    )
    .fetch_one(pool)
    .await?;
    Ok((products, total))
}

/// One product with its stock and picture, active or not.
#[tracing::instrument(skip_all)]
pub async fn find(pool: &PgPool, sku: &Sku) -> sqlx::Result<Option<ProductRow>> {
    sqlx::query_as!(
        ProductRow,
        r#"select p.sku, p.name, p.description, p.price_cents, p.active, s.on_hand, s.reserved,
                  p.purchase_limit, p.category, i.image_etag as "image?"
             from products p join stock s on s.sku = p.sku
             left join product_images i on i.sku = p.sku
            where p.sku = $1"#,
        sku.as_str(),
    )
    .fetch_optional(pool)
    .await
}

/// Inserts a product (without its stock row); false when `sku` is taken.
#[tracing::instrument(skip_all)]
pub async fn insert(
    conn: &mut PgConnection,
    sku: &Sku,
    fields: &ProductFields,
) -> sqlx::Result<bool> {
    let inserted = sqlx::query!(
        r#"insert into products (sku, name, description, price_cents, active, purchase_limit,
                                 category)
           values ($1, $2, $3, $4, $5, $6, shelf_category($7, $1)) on conflict (sku) do nothing"#,
        sku.as_str(),
        fields.name,
        fields.description,
        fields.price_cents,
        fields.active,
        fields.purchase_limit,
        fields.category.as_deref(),
    )
    .execute(conn)
    .await?
    .rows_affected();
    Ok(inserted == 1)
}

/// Replaces a product's fields; false when there is no such product.
#[tracing::instrument(skip_all)]
pub async fn update(pool: &PgPool, sku: &Sku, fields: &ProductFields) -> sqlx::Result<bool> {
    let updated = sqlx::query!(
        r#"update products set name = $2, description = $3, price_cents = $4, active = $5,
                  purchase_limit = $6, category = shelf_category($7, $1)
            where sku = $1"#,
        sku.as_str(),
        fields.name,
        fields.description,
        fields.price_cents,
        fields.active,
        fields.purchase_limit,
        fields.category.as_deref(),
    )
    .execute(pool)
    .await?
    .rows_affected();
    Ok(updated == 1)
}

/// A product's purchase limit and category, as the admin API answers them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    pub purchase_limit: Option<i32>,
    pub category: Option<String>,
}

/// `sku`'s settings, or `None` when there is no such product.
#[tracing::instrument(skip_all)]
pub async fn settings(pool: &PgPool, sku: &Sku) -> sqlx::Result<Option<Settings>> {
    sqlx::query_as!(
        Settings,
        "select purchase_limit, category from products where sku = $1",
        sku.as_str(),
    )
    .fetch_optional(pool)
    .await
}
