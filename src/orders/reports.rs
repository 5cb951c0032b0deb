//! Reads of orders for the admin: today's figures, and the order list with its filters.

use sqlx::{PgPool, Postgres, QueryBuilder};

use super::db::{OrderFilter, OrderSummary};

/// Orders placed since midnight (UTC) and their revenue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Today {
    pub orders: i64,
    pub revenue_cents: i64,
}

/// How many orders were placed today, and for how much (cancelled ones not counted).
#[tracing::instrument(skip_all)]
pub async fn today(pool: &PgPool) -> sqlx::Result<Today> {
    sqlx::query_as!(
        Today,
        r#"select count(*) as "orders!", coalesce(sum(total_cents), 0)::bigint as "revenue_cents!"
             from orders
            where status = 'placed' and created_at >= date_trunc('day', now())"#,
    )
    .fetch_one(pool)
    .await
}

/// A page of orders matching `filter`, newest first, and how many match in all. Only the
/// filters that are set become conditions, each with its value bound.
#[tracing::instrument(skip_all)]
pub async fn list(
    pool: &PgPool,
    filter: &OrderFilter,
    limit: i64,
    offset: i64,
) -> sqlx::Result<(Vec<OrderSummary>, i64)> {
    // Runtime SQL, not `query_as!`: the conditions depend on which filters are set.
    let mut rows = QueryBuilder::new(
        r#"select o.id, o.number, o.status, o.total_cents, o.email, o.customer_name, o.created_at,
                  coalesce((select sum(l.quantity) from order_lines l where l.order_id = o.id), 0)::bigint as units,
                  coalesce((select string_agg(p.name || ' (' || l.sku || ')', ', ' order by l.sku)
                              from order_lines l join products p on p.sku = l.sku
                             where l.order_id = o.id), '') as products
             from orders o"#,
    );
    push_filter(&mut rows, filter);
    rows.push(" order by o.created_at desc, o.id limit ")
        .push_bind(limit)
        .push(" offset ")
        .push_bind(offset);
    let rows = rows.build_query_as().fetch_all(pool).await?;
    let mut count = QueryBuilder::new("select count(*) from orders o");
    push_filter(&mut count, filter);
    let total = count.build_query_scalar().fetch_one(pool).await?;
    Ok((rows, total))
}

/// The condition for what the admin typed: an order number (`#1001` or `1001`), an email
/// or part of one (it has an `@`), else part of a product's name or SKU. Case does not
/// matter; `%` and `_` are matched as themselves.
fn push_search(query: &mut QueryBuilder<Postgres>, search: &str) {
    let digits = search.strip_prefix('#').unwrap_or(search);
    if let Ok(number) = digits.parse::<i64>()
        && digits.bytes().all(|b| b.is_ascii_digit())
    {
        query.push("o.number = ").push_bind(number);
        return;
    }
    let pattern = format!(
        "%{}%",
        search
            .replace('\\', "\\\\")
            .replace('%', "\\%")
            .replace('_', "\\_")
    );
    if search.contains('@') {
        query.push("o.email ilike ").push_bind(pattern);
        return;
    }
    query
        .push(
            "exists (select 1 from order_lines x join products p on p.sku = x.sku
                      where x.order_id = o.id and (p.name ilike ",
        )
        .push_bind(pattern.clone())
        .push(" or x.sku ilike ")
        .push_bind(pattern)
        .push("))");
}

/// ` where …` with one bound condition per filter that is set (nothing when none is).
fn push_filter(query: &mut QueryBuilder<Postgres>, filter: &OrderFilter) {
    let mut joiner = " where ";
    if let Some(search) = filter.search.as_deref() {
        query.push(joiner);
        push_search(query, search);
        joiner = " and ";
    }
    if let Some(status) = filter.status {
        query.push(joiner).push("o.status = ").push_bind(status);
        joiner = " and ";
    }
    if let Some(sku) = &filter.sku {
        query
            .push(joiner)
            .push("exists (select 1 from order_lines x where x.order_id = o.id and x.sku = ")
            .push_bind(sku.clone())
            .push(")");
        joiner = " and ";
    }
    if let Some(date) = filter.date {
        query
            .push(joiner)
            .push("(o.created_at at time zone 'UTC')::date = ")
            .push_bind(date);
    }
}
