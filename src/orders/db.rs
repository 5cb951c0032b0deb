//! Order SQL.

use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use super::{Order, OrderLine};
use crate::catalog::Sku;

/// A product an order refers to, with its current price and availability.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct OrderProduct {
    pub sku: String,
    pub name: String,
    pub price_cents: i64,
    pub available: i32,
    /// At most this many units per shopper (see [`super::Shopper`]).
    pub purchase_limit: Option<i32>,
}

/// The active products among `skus` (unknown or inactive ones are missing).
pub async fn products_for(
    conn: impl sqlx::PgExecutor<'_>,
    skus: &[Sku],
) -> sqlx::Result<Vec<OrderProduct>> {
    let skus: Vec<&str> = skus.iter().map(Sku::as_str).collect();
    sqlx::query_as(
        r#"select p.sku, p.name, p.price_cents, s.on_hand - s.reserved as available,
                  p.purchase_limit
             from products p
             join stock s on s.sku = p.sku
            where p.active and p.sku = any($1)
            order by p.sku collate "C""#,
    )
    .bind(skus)
    .fetch_all(conn)
    .await
}

/// Inserts the order and its lines. Fails with a unique violation when the idempotency key
/// already has an order.
pub async fn insert_order(
    conn: &mut PgConnection,
    order: &Order,
    scope: &str,
    key: &str,
    shopper: &[String],
) -> sqlx::Result<()> {
    sqlx::query(
        r#"insert into orders
             (id, status, customer_name, email, total_cents, idempotency_scope, idempotency_key,
              created_at, shopper)
           values ($1, $2, $3, $4, $5, $6, $7, $8, $9)"#,
    )
    .bind(order.id)
    .bind(&order.status)
    .bind(&order.customer_name)
    .bind(&order.email)
    .bind(order.total_cents)
    .bind(scope)
    .bind(key)
    .bind(order.created_at)
    .bind(shopper)
    .execute(&mut *conn)
    .await?;
    let skus: Vec<&str> = order.lines.iter().map(|l| l.sku.as_str()).collect();
    let quantities: Vec<i32> = order.lines.iter().map(|l| l.quantity).collect();
    let prices: Vec<i64> = order.lines.iter().map(|l| l.unit_price_cents).collect();
    sqlx::query(
        r#"insert into order_lines (order_id, sku, quantity, unit_price_cents)
           select $1, * from unnest($2::text[], $3::int[], $4::bigint[])"#,
    )
    .bind(order.id)
    .bind(skus)
    .bind(quantities)
    .bind(prices)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Units of `asks[i].0` (a SKU) that shoppers sharing an identity with `asks[i].1` have
/// bought (orders not cancelled) or hold (active holds), for each i, by one statement.
/// Run inside a transaction that has already updated the SKU's stock row, whose lock
/// orders every sale of that SKU: so it sees every order or hold committed before it.
pub async fn bought_by(
    conn: &mut PgConnection,
    asks: &[(&str, &[String])],
) -> sqlx::Result<Vec<i64>> {
    let skus: Vec<&str> = asks.iter().map(|(sku, _)| *sku).collect();
    // unnest() flattens arrays of arrays, so each identity set travels as one string.
    let shoppers: Vec<String> = asks.iter().map(|(_, ids)| ids.join("\n")).collect();
    let counted: Vec<(i64, i64)> = sqlx::query_as(
        r#"select u.i,
                  coalesce((select sum(l.quantity) from orders o
                              join order_lines l on l.order_id = o.id
                             where o.shopper <> '{}' and o.shopper && string_to_array(u.shopper, E'\n')
                               and o.status = 'placed' and l.sku = u.sku), 0)
                + coalesce((select sum(l.quantity) from holds h
                              join hold_lines l on l.hold_id = h.id
                             where h.shopper <> '{}' and h.shopper && string_to_array(u.shopper, E'\n')
                               and h.state = 'active' and l.sku = u.sku), 0)
             from unnest($1::text[], $2::text[]) with ordinality as u(sku, shopper, i)
            order by u.i"#,
    )
    .bind(&skus)
    .bind(&shoppers)
    // Planned afresh each time, like `idempotency::present`: the orders grow.
    .persistent(false)
    .fetch_all(conn)
    .await?;
    Ok(counted.into_iter().map(|(_, n)| n).collect())
}

#[derive(sqlx::FromRow)]
struct OrderRow {
    id: Uuid,
    status: String,
    total_cents: i64,
    email: Option<String>,
    customer_name: Option<String>,
    created_at: chrono::DateTime<chrono::Utc>,
}

/// One order with its lines.
pub async fn find_order(pool: &PgPool, id: Uuid) -> sqlx::Result<Option<Order>> {
    let Some(row): Option<OrderRow> = sqlx::query_as(
        "select id, status, total_cents, email, customer_name, created_at from orders where id = $1",
    )
    .bind(id)
    .fetch_optional(pool)
    .await?
    else {
        return Ok(None);
    };
    let lines: Vec<OrderLine> = sqlx::query_as(
        r#"select l.sku, p.name, l.quantity, l.unit_price_cents
             from order_lines l join products p on p.sku = l.sku
            where l.order_id = $1
            order by l.sku collate "C""#,
    )
    .bind(id)
    .fetch_all(pool)
    .await?;
    Ok(Some(Order {
        id: row.id,
        status: row.status,
        lines,
        total_cents: row.total_cents,
        email: row.email,
        customer_name: row.customer_name,
        created_at: row.created_at,
    }))
}

/// The order placed under an idempotency key, if any.
pub async fn order_for_key(pool: &PgPool, scope: &str, key: &str) -> sqlx::Result<Option<Uuid>> {
    sqlx::query_scalar(
        "select id from orders where idempotency_scope = $1 and idempotency_key = $2",
    )
    .bind(scope)
    .bind(key)
    .fetch_optional(pool)
    .await
}

/// An order as the admin list shows it.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct OrderSummary {
    pub id: Uuid,
    pub status: String,
    pub total_cents: i64,
    pub email: Option<String>,
    pub customer_name: Option<String>,
    pub created_at: chrono::DateTime<chrono::Utc>,
    pub units: i64,
    pub skus: String,
}

impl OrderSummary {
    pub fn total(&self) -> String {
        crate::catalog::format_cents(self.total_cents)
    }
}

/// Filters for the admin order list; empty fields match everything.
#[derive(Debug, Clone, Default)]
pub struct OrderFilter {
    pub status: Option<String>,
    pub sku: Option<String>,
    pub date: Option<chrono::NaiveDate>,
}

/// A page of orders, newest first, and how many match in all.
pub async fn list_orders(
    pool: &PgPool,
    filter: &OrderFilter,
    limit: i64,
    offset: i64,
) -> sqlx::Result<(Vec<OrderSummary>, i64)> {
    const WHERE: &str = r#"
        where ($1::text is null or o.status = $1)
          and ($2::text is null or exists (select 1 from order_lines x where x.order_id = o.id and x.sku = $2))
          and ($3::date is null or (o.created_at at time zone 'UTC')::date = $3)"#;
    let rows = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        r#"select o.id, o.status, o.total_cents, o.email, o.customer_name, o.created_at,
                  coalesce((select sum(l.quantity) from order_lines l where l.order_id = o.id), 0)::bigint as units,
                  coalesce((select string_agg(l.sku, ', ' order by l.sku) from order_lines l where l.order_id = o.id), '') as skus
             from orders o {WHERE}
            order by o.created_at desc, o.id
            limit $4 offset $5"#
    )))
    .bind(&filter.status)
    .bind(&filter.sku)
    .bind(filter.date)
    .bind(limit)
    .bind(offset)
    .fetch_all(pool)
    .await?;
    let total = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "select count(*) from orders o {WHERE}"
    )))
    .bind(&filter.status)
    .bind(&filter.sku)
    .bind(filter.date)
    .fetch_one(pool)
    .await?;
    Ok((rows, total))
}
