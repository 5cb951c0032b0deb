//! Order SQL.

use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use super::address::ShippingAddress;
use super::{Order, OrderLine, OrderStatus};
use crate::catalog::Sku;

/// A product an order refers to, with its current price and availability.
#[derive(Debug, Clone)]
pub struct OrderProduct {
    pub sku: String,
    pub name: String,
    pub price_cents: i64,
    pub available: i32,
    /// At most this many units per shopper (see [`super::Shopper`]).
    pub purchase_limit: Option<i32>,
}

/// The active products among `skus` (unknown or inactive ones are missing).
#[tracing::instrument(skip_all)]
pub async fn products_for(
    conn: impl sqlx::PgExecutor<'_>,
    skus: &[Sku],
) -> sqlx::Result<Vec<OrderProduct>> {
    let skus: Vec<&str> = skus.iter().map(Sku::as_str).collect();
    sqlx::query_as!(
        OrderProduct,
        r#"select p.sku, p.name, p.price_cents, s.on_hand - s.reserved as "available!",
                  p.purchase_limit
             from products p
             join stock s on s.sku = p.sku
            where p.active and p.sku = any($1::text[])
            order by p.sku collate "C""#,
        &skus as &[&str],
    )
    .fetch_all(conn)
    .await
}

/// Inserts the order and its lines. Fails with a unique violation when the idempotency key
/// already has an order.
#[tracing::instrument(skip_all)]
pub async fn insert_order(
    conn: &mut PgConnection,
    order: &Order,
    scope: &str,
    key: &str,
    shopper: &[String],
) -> sqlx::Result<()> {
    sqlx::query!(
        r#"insert into orders
             (id, status, customer_name, email, total_cents, idempotency_scope, idempotency_key,
              created_at, shopper, number, shipping_address)
           values ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)"#,
        order.id,
        order.status.as_str(),
        order.customer_name.as_deref(),
        order.email.as_deref(),
        order.total_cents,
        scope,
        key,
        order.created_at,
        shopper,
        order.number,
        order.shipping_address.as_ref().map(sqlx::types::Json) as _,
    )
    .execute(&mut *conn)
    .await?;
    let skus: Vec<&str> = order.lines.iter().map(|l| l.sku.as_str()).collect();
    let quantities: Vec<i32> = order.lines.iter().map(|l| l.quantity).collect();
    let prices: Vec<i64> = order.lines.iter().map(|l| l.unit_price_cents).collect();
    sqlx::query!(
        r#"insert into order_lines (order_id, sku, quantity, unit_price_cents)
           select $1, * from unnest($2::text[], $3::int[], $4::bigint[])"#,
        order.id,
        &skus as &[&str],
        &quantities,
        &prices,
    )
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Units of `asks[i].0` (a SKU) that shoppers sharing an identity with `asks[i].1` have
/// bought (orders not cancelled) or hold (active holds other than `except`), for each i,
/// by one statement.
/// Run inside a transaction that holds the SKU's stock row lock (it updated the row, or a
/// batch locked it first), which orders every sale of that SKU: so it sees every order
/// or hold committed before it.
#[tracing::instrument(skip_all)]
pub async fn bought_by(
    conn: &mut PgConnection,
    asks: &[(&str, &[String])],
    except: Option<Uuid>,
) -> sqlx::Result<Vec<i64>> {
    let skus: Vec<&str> = asks.iter().map(|(sku, _)| *sku).collect();
    // unnest() flattens arrays of arrays, so each identity set travels as one string.
    let shoppers: Vec<String> = asks.iter().map(|(_, ids)| ids.join("\n")).collect();
    // Runtime, not `query!`: the macro's query cannot be made non-persistent.
    let counted: Vec<(i64, i64)> = sqlx::query_as(
        r#"select u.i,
                  coalesce((select sum(l.quantity) from orders o
                              join order_lines l on l.order_id = o.id
                             where o.shopper <> '{}' and o.shopper && string_to_array(u.shopper, E'\n')
                               and o.status = 'placed' and l.sku = u.sku), 0)
                + coalesce((select sum(l.quantity) from holds h
                              join hold_lines l on l.hold_id = h.id
                             where h.shopper <> '{}' and h.shopper && string_to_array(u.shopper, E'\n')
                               and h.state = 'active' and l.sku = u.sku
                               and h.id is distinct from $3), 0)
             from unnest($1::text[], $2::text[]) with ordinality as u(sku, shopper, i)
            order by u.i"#,
    )
    .bind(&skus)
    .bind(&shoppers)
    .bind(except)
    // Planned afresh each time, like `idempotency::present`: the orders grow.
    .persistent(false)
    .fetch_all(conn)
    .await?;
    Ok(counted.into_iter().map(|(_, n)| n).collect())
}

struct OrderRow {
    id: Uuid,
    number: i64,
    shipping_address: Option<sqlx::types::Json<ShippingAddress>>,
    status: OrderStatus,
    total_cents: i64,
    email: Option<String>,
    customer_name: Option<String>,
    created_at: chrono::DateTime<chrono::Utc>,
}

/// One order with its lines.
#[tracing::instrument(skip_all)]
pub async fn find_order(pool: &PgPool, id: Uuid) -> sqlx::Result<Option<Order>> {
    let Some(row) = sqlx::query_as!(
        OrderRow,
        r#"select id, number, status as "status: OrderStatus", total_cents, email,
                  customer_name, created_at,
                  shipping_address as "shipping_address: sqlx::types::Json<ShippingAddress>"
             from orders where id = $1"#,
        id,
    )
    .fetch_optional(pool)
    .await?
    else {
        return Ok(None);
    };
    let lines = sqlx::query_as!(
        OrderLine,
        r#"select l.sku as "sku: Sku", p.name, l.quantity, l.unit_price_cents
             from order_lines l join products p on p.sku = l.sku
            where l.order_id = $1
            order by l.sku collate "C""#,
        id,
    )
    .fetch_all(pool)
    .await?;
    Ok(Some(Order {
        id: row.id,
        number: row.number,
        status: row.status,
        lines,
        total_cents: row.total_cents,
        email: row.email,
        customer_name: row.customer_name,
        shipping_address: row.shipping_address.map(|a| Box::new(a.0)),
        created_at: row.created_at,
        payment: None,
    }))
}

/// One order number, drawn from the shop's one sequence: never the same twice, whichever
/// process draws it (a number drawn by a transaction that rolls back is skipped). Batches
/// draw theirs with `nextval('order_numbers')` in the read they already make.
pub async fn draw_number(conn: &mut PgConnection) -> sqlx::Result<i64> {
    sqlx::query_scalar!(r#"select nextval('order_numbers') as "number!""#)
        .fetch_one(conn)
        .await
}

/// The order placed under an idempotency key, if any.
#[tracing::instrument(skip_all)]
pub async fn order_for_key(pool: &PgPool, scope: &str, key: &str) -> sqlx::Result<Option<Uuid>> {
    sqlx::query_scalar!(
        "select id from orders where idempotency_scope = $1 and idempotency_key = $2",
        scope,
        key,
    )
    .fetch_optional(pool)
    .await
}

/// The status of order `id`, its row locked until the transaction ends (cancels of one
/// order serialise on this lock); `None` when there is no such order.
#[tracing::instrument(skip_all)]
pub async fn lock_status(conn: &mut PgConnection, id: Uuid) -> sqlx::Result<Option<OrderStatus>> {
    sqlx::query_scalar!(
        r#"select status as "status: OrderStatus" from orders where id = $1 for update"#,
        id,
    )
    .fetch_optional(conn)
    .await
}

/// The units of each SKU in order `id`, in SKU byte order (collate "C", as Rust sorts
/// SKUs): every writer locks stock rows in the same order, whatever the database's
/// default collation.
#[tracing::instrument(skip_all)]
pub async fn lines_to_restock(conn: &mut PgConnection, id: Uuid) -> sqlx::Result<Vec<(Sku, i32)>> {
    let rows = sqlx::query!(
        r#"select sku as "sku: Sku", quantity from order_lines
            where order_id = $1 order by sku collate "C""#,
        id,
    )
    .fetch_all(conn)
    .await?;
    Ok(rows.into_iter().map(|r| (r.sku, r.quantity)).collect())
}

/// Marks a locked order cancelled.
#[tracing::instrument(skip_all)]
pub async fn set_cancelled(conn: &mut PgConnection, id: Uuid) -> sqlx::Result<()> {
    sqlx::query!(
        "update orders set status = $2 where id = $1",
        id,
        OrderStatus::Cancelled.as_str(),
    )
    .execute(&mut *conn)
    .await?;
    // Its payment (if the shop took one) is looked at again, in the same transaction: a
    // charge for a cancelled order is refunded however the process that cancelled it ends.
    sqlx::query!(
        "update payments set settled = false, reconcile_at = now()
          where order_id = $1 or hold_id = (select id from holds where order_id = $1)",
        id
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// An order as the admin list shows it.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct OrderSummary {
    pub id: Uuid,
    pub number: i64,
    pub status: OrderStatus,
    pub total_cents: i64,
    pub email: Option<String>,
    pub customer_name: Option<String>,
    pub created_at: chrono::DateTime<chrono::Utc>,
    pub units: i64,
    /// Each product's name and SKU, as "Enamel mug (MUG-1)", by SKU.
    pub products: String,
}

impl OrderSummary {
    /// The order's number as people read it: `#1001`.
    pub fn reference(&self) -> String {
        super::reference(self.number, self.id)
    }

    pub fn total(&self) -> String {
        crate::catalog::format_cents(self.total_cents)
    }
}

/// Filters for the admin order list; empty fields match everything.
#[derive(Debug, Clone, Default)]
pub struct OrderFilter {
    /// What the admin typed to find: an order number (`#1001`, `1001`), an email (or part
    /// of one), or part of a product's name or SKU.
    pub search: Option<String>,
    pub status: Option<OrderStatus>,
    pub sku: Option<String>,
    pub date: Option<chrono::NaiveDate>,
}

/// The parts of a group-commit write that place its orders, on parameters `$6`–`$19`
/// ([`OrderRows`]) and the orders' numbers and shipping addresses (the parameters given,
/// bound last by the statement's caller: [`OrderRows::numbers`], [`OrderRows::addresses`]),
/// after
/// [`crate::inventory::group::stock_sql`]'s `go`: every order, line and ledger row, or
/// nothing. Their `order.placed` events (`$20`) follow, as
/// `events_sql!("placed_events", "order.placed", "$20")`.
macro_rules! order_rows_sql {
    ($numbers:literal, $addresses:literal) => {
        concat!(
            r#", placed as (
               insert into orders
                      (id, status, customer_name, email, total_cents, idempotency_scope,
                       idempotency_key, created_at, shopper, number, shipping_address)
               select id, 'placed', name, email, total, scope, key, created,
                      string_to_array(shopper, E'\n'), number, address
                 from unnest($6::uuid[], $7::text[], $8::text[], $9::bigint[], $10::text[],
                             $11::text[], $12::timestamptz[], $13::text[], "#,
            $numbers,
            "::bigint[], ",
            $addresses,
            r#"::jsonb[])
                      as u(id, name, email, total, scope, key, created, shopper, number,
                           address)
                where (select go from go)
           ), lines as (
               insert into order_lines (order_id, sku, quantity, unit_price_cents)
               select id, sku, quantity, price
                 from unnest($14::uuid[], $15::text[], $16::int[], $17::bigint[])
                      as u(id, sku, quantity, price)
                where (select go from go)
           ), ledger as (
               insert into stock_movements (sku, delta, reserved_delta, reason, reference, actor)
               select sku, -quantity, reserved_delta, 'order', id::text, actor
                 from unnest($14::uuid[], $15::text[], $16::int[], $18::int[], $19::text[])
                      as u(id, sku, quantity, reserved_delta, actor)
                where (select go from go)
           )"#
        )
    };
}
pub(crate) use order_rows_sql;

/// The orders one group-commit write places, as the columns of their rows.
#[derive(Debug, Default)]
pub struct OrderRows {
    /// One entry per order.
    pub ids: Vec<Uuid>,
    /// Bound by the statement's caller, on the parameters it gave `order_rows_sql!`.
    pub numbers: Vec<i64>,
    pub addresses: Vec<Option<serde_json::Value>>,
    pub names: Vec<Option<String>>,
    pub emails: Vec<Option<String>>,
    pub totals: Vec<i64>,
    /// The idempotency scope and key it was placed under (a confirmed hold's: `hold`, and
    /// the hold's id).
    pub scopes: Vec<String>,
    pub keys: Vec<String>,
    pub created: Vec<chrono::DateTime<chrono::Utc>>,
    /// Each shopper's identities, joined by newlines (`unnest` flattens arrays of arrays).
    pub shoppers: Vec<String>,
    /// One entry per order line: its order, SKU, units, price; its ledger row's change of
    /// `reserved` (0 sold from free stock, −q sold from a hold) and actor.
    pub line_orders: Vec<Uuid>,
    pub line_skus: Vec<String>,
    pub line_quantities: Vec<i32>,
    pub line_prices: Vec<i64>,
    pub line_reserved: Vec<i32>,
    pub line_actors: Vec<String>,
    /// The `order.placed` payload of each order.
    pub events: Vec<serde_json::Value>,
}

impl OrderRows {
    /// Adds `order`, placed under `scope` and `key` for `shopper`'s identities; its units
    /// sold from a hold (`from_reserved`) or from free stock; `actor` on its ledger rows.
    pub fn add(
        &mut self,
        order: &Order,
        (scope, key): (&str, &str),
        shopper: &[String],
        from_reserved: bool,
        actor: &str,
    ) {
        self.ids.push(order.id);
        self.numbers.push(order.number);
        self.addresses.push(
            order
                .shipping_address
                .as_ref()
                .map(|a| serde_json::to_value(a).expect("addresses serialise")),
        );
        self.names.push(order.customer_name.clone());
        self.emails.push(order.email.clone());
        self.totals.push(order.total_cents);
        self.scopes.push(scope.to_string());
        self.keys.push(key.to_string());
        self.created.push(order.created_at);
        self.shoppers.push(shopper.join("\n"));
        for line in &order.lines {
            self.line_orders.push(order.id);
            self.line_skus.push(line.sku.to_string());
            self.line_quantities.push(line.quantity);
            self.line_prices.push(line.unit_price_cents);
            self.line_reserved
                .push(if from_reserved { -line.quantity } else { 0 });
            self.line_actors.push(actor.to_string());
        }
        self.events
            .push(crate::events::Event::order_placed(order).payload);
    }

    /// Binds `$6`–`$20`.
    pub fn bind<'q>(
        &'q self,
        query: sqlx::query::QueryScalar<'q, sqlx::Postgres, bool, sqlx::postgres::PgArguments>,
    ) -> sqlx::query::QueryScalar<'q, sqlx::Postgres, bool, sqlx::postgres::PgArguments> {
        query
            .bind(&self.ids)
            .bind(&self.names)
            .bind(&self.emails)
            .bind(&self.totals)
            .bind(&self.scopes)
            .bind(&self.keys)
            .bind(&self.created)
            .bind(&self.shoppers)
            .bind(&self.line_orders)
            .bind(&self.line_skus)
            .bind(&self.line_quantities)
            .bind(&self.line_prices)
            .bind(&self.line_reserved)
            .bind(&self.line_actors)
            .bind(&self.events)
    }
}
