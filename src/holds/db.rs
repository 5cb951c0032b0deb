//! Hold SQL.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use super::{Hold, HoldState};
use crate::catalog::Sku;
use crate::inventory::group::Moves;
use crate::orders::OrderLine;
use crate::orders::db::OrderRows;

/// Inserts a hold and its lines; it expires `ttl` from now by the database's clock (the
/// one the sweeper and confirmation use), which is returned.
#[tracing::instrument(skip_all)]
pub async fn insert_hold(
    conn: &mut PgConnection,
    hold: &Hold,
    ttl: std::time::Duration,
    scope: &str,
    key: &str,
    shopper: &[String],
) -> sqlx::Result<DateTime<Utc>> {
    let expires_at = sqlx::query_scalar!(
        r#"insert into holds
             (id, state, expires_at, email, customer_name, idempotency_scope, idempotency_key,
              shopper)
           values ($1, $2, now() + make_interval(secs => $3), $4, $5, $6, $7, $8)
        returning expires_at"#,
        hold.id,
        hold.state.as_str(),
        ttl.as_secs_f64(),
        hold.email.as_deref(),
        hold.customer_name.as_deref(),
        scope,
        key,
        shopper,
    )
    .fetch_one(&mut *conn)
    .await?;
    let skus: Vec<&str> = hold.lines.iter().map(|l| l.sku.as_str()).collect();
    let quantities: Vec<i32> = hold.lines.iter().map(|l| l.quantity).collect();
    let prices: Vec<i64> = hold.lines.iter().map(|l| l.unit_price_cents).collect();
    sqlx::query!(
        r#"insert into hold_lines (hold_id, sku, quantity, unit_price_cents)
           select $1, * from unnest($2::text[], $3::int[], $4::bigint[])"#,
        hold.id,
        &skus as &[&str],
        &quantities,
        &prices,
    )
    .execute(&mut *conn)
    .await?;
    Ok(expires_at)
}

/// Whether a hold is active and unexpired by the database's clock.
#[tracing::instrument(skip_all)]
pub async fn is_live(conn: &mut PgConnection, id: Uuid) -> sqlx::Result<bool> {
    sqlx::query_scalar!(
        r#"select state = 'active' and expires_at > now() as "live!" from holds where id = $1"#,
        id,
    )
    .fetch_one(conn)
    .await
}

struct HoldRow {
    id: Uuid,
    state: HoldState,
    expires_at: DateTime<Utc>,
    email: Option<String>,
    customer_name: Option<String>,
    order_id: Option<Uuid>,
}

#[tracing::instrument(skip_all)]
async fn lines_of(conn: impl sqlx::PgExecutor<'_>, id: Uuid) -> sqlx::Result<Vec<OrderLine>> {
    sqlx::query_as!(
        OrderLine,
        r#"select l.sku as "sku: Sku", p.name, l.quantity, l.unit_price_cents
             from hold_lines l join products p on p.sku = l.sku
            where l.hold_id = $1
            order by l.sku collate "C""#,
        id,
    )
    .fetch_all(conn)
    .await
}

fn assemble(row: HoldRow, lines: Vec<OrderLine>) -> Hold {
    Hold {
        id: row.id,
        state: row.state,
        expires_at: row.expires_at,
        total_cents: lines
            .iter()
            .map(|l| l.unit_price_cents * i64::from(l.quantity))
            .sum(),
        lines,
        email: row.email,
        customer_name: row.customer_name,
        order_id: row.order_id,
    }
}

/// One hold with its lines.
#[tracing::instrument(skip_all)]
pub async fn find_hold(pool: &PgPool, id: Uuid) -> sqlx::Result<Option<Hold>> {
    let Some(row) = sqlx::query_as!(
        HoldRow,
        r#"select id, state as "state: HoldState", expires_at, email, customer_name, order_id
             from holds where id = $1"#,
        id,
    )
    .fetch_optional(pool)
    .await?
    else {
        return Ok(None);
    };
    let lines = lines_of(pool, id).await?;
    Ok(Some(assemble(row, lines)))
}

/// One hold, its row locked until the transaction ends: confirm, cancel and the sweeper
/// serialise on this lock, so each hold changes state once.
#[tracing::instrument(skip_all)]
pub async fn lock_hold(conn: &mut PgConnection, id: Uuid) -> sqlx::Result<Option<Hold>> {
    let Some(row) = sqlx::query_as!(
        HoldRow,
        r#"select id, state as "state: HoldState", expires_at, email, customer_name, order_id
             from holds where id = $1 for update"#,
        id,
    )
    .fetch_optional(&mut *conn)
    .await?
    else {
        return Ok(None);
    };
    let lines = lines_of(&mut *conn, id).await?;
    Ok(Some(assemble(row, lines)))
}

/// The identities of whoever placed hold `id` (see [`crate::orders::limits`]).
#[tracing::instrument(skip_all)]
pub async fn shopper_of(conn: &mut PgConnection, id: Uuid) -> sqlx::Result<Vec<String>> {
    sqlx::query_scalar!("select shopper from holds where id = $1", id)
        .fetch_one(conn)
        .await
}

/// Moves a locked hold to `state`.
#[tracing::instrument(skip_all)]
pub async fn set_state(
    conn: &mut PgConnection,
    id: Uuid,
    state: HoldState,
    order_id: Option<Uuid>,
) -> sqlx::Result<()> {
    sqlx::query!(
        "update holds set state = $2, order_id = $3, updated_at = now() where id = $1",
        id,
        state.as_str(),
        order_id,
    )
    .execute(&mut *conn)
    .await?;
    if state == HoldState::Released {
        payments_due(conn, &[id]).await?;
    }
    Ok(())
}

/// Puts the payments of holds that just ended up for the payment reconciler's look now
/// (an authorization without an order is released), in the transaction that ended them.
async fn payments_due(conn: &mut PgConnection, holds: &[Uuid]) -> sqlx::Result<()> {
    sqlx::query!(
        "update payments set reconcile_at = now()
          where hold_id = any($1::uuid[]) and not settled",
        holds,
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// Up to `limit` expired active holds, locked; holds another process or a confirming
/// shopper has locked are skipped, not waited for.
#[tracing::instrument(skip_all)]
pub async fn claim_expired(conn: &mut PgConnection, limit: i64) -> sqlx::Result<Vec<Uuid>> {
    sqlx::query_scalar!(
        r#"select id from holds
            where state = 'active' and expires_at < now()
            order by expires_at
            limit $1
            for update skip locked"#,
        limit,
    )
    .fetch_all(conn)
    .await
}

/// Marks locked holds expired.
#[tracing::instrument(skip_all)]
pub async fn expire_many(conn: &mut PgConnection, ids: &[Uuid]) -> sqlx::Result<()> {
    sqlx::query!(
        "update holds set state = $2, updated_at = now() where id = any($1::uuid[])",
        ids,
        HoldState::Expired.as_str(),
    )
    .execute(&mut *conn)
    .await?;
    payments_due(conn, ids).await
}

/// Deletes up to `limit` of the oldest released and expired holds whose state changed
/// longer than `retention` ago and whose idempotency record is gone, with their lines. Rows another process is purging are
/// skipped (`skip locked`), so every process may run this at once. Returns how many holds
/// went.
pub async fn purge(pool: &PgPool, retention: Duration, limit: i64) -> sqlx::Result<u64> {
    let purged = sqlx::query!(
        r#"with done as (
               select h.id from holds h
                where h.state in ('released', 'expired')
                  and h.updated_at < now() - make_interval(secs => $1)
                  -- the key's record goes first: a retry replaying it must find its hold
                  and not exists (select 1 from idempotency_keys k
                                   where k.scope = h.idempotency_scope
                                     and k.key = h.idempotency_key)
                order by h.updated_at
                limit $2
                  for update skip locked
           ), lines_gone as (
               delete from hold_lines l using done where l.hold_id = done.id
           )
           delete from holds h using done where h.id = done.id"#,
        retention.as_secs_f64(),
        limit,
    )
    .execute(pool)
    .await?
    .rows_affected();
    Ok(purged)
}

/// Lines of `holds`, per hold and SKU: `(hold, sku, quantity)`.
#[tracing::instrument(skip_all)]
pub async fn lines_of_many(
    conn: &mut PgConnection,
    holds: &[Uuid],
) -> sqlx::Result<Vec<(Uuid, Sku, i32)>> {
    let rows = sqlx::query!(
        r#"select hold_id, sku as "sku: Sku", quantity
             from hold_lines where hold_id = any($1::uuid[])"#,
        holds,
    )
    .fetch_all(conn)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| (r.hold_id, r.sku, r.quantity))
        .collect())
}

/// Active holds, soonest expiry first (for the admin pages).
#[tracing::instrument(skip_all)]
pub async fn active_holds(pool: &PgPool, limit: i64) -> sqlx::Result<Vec<Hold>> {
    let rows = sqlx::query_as!(
        HoldRow,
        r#"select id, state as "state: HoldState", expires_at, email, customer_name, order_id
             from holds where state = 'active' order by expires_at limit $1"#,
        limit,
    )
    .fetch_all(pool)
    .await?;
    // All their lines in one query, not one per hold.
    let ids: Vec<Uuid> = rows.iter().map(|r| r.id).collect();
    let mut lines: Vec<(Uuid, OrderLine)> = sqlx::query!(
        r#"select l.hold_id, l.sku as "sku: Sku", p.name, l.quantity, l.unit_price_cents
             from hold_lines l join products p on p.sku = l.sku
            where l.hold_id = any($1::uuid[])
            order by l.sku collate "C""#,
        &ids,
    )
    .fetch_all(pool)
    .await?
    .into_iter()
    .map(|r| {
        let line = OrderLine {
            sku: r.sku,
            name: r.name,
            quantity: r.quantity,
            unit_price_cents: r.unit_price_cents,
        };
        (r.hold_id, line)
    })
    .collect();
    Ok(rows
        .into_iter()
        .map(|row| {
            let mine = lines
                .extract_if(.., |(hold, _)| *hold == row.id)
                .map(|(_, line)| line)
                .collect();
            assemble(row, mine)
        })
        .collect())
}

/// The hold placed under an idempotency key, if any.
#[tracing::instrument(skip_all)]
pub async fn hold_for_key(pool: &PgPool, scope: &str, key: &str) -> sqlx::Result<Option<Uuid>> {
    sqlx::query_scalar!(
        "select id from holds where idempotency_scope = $1 and idempotency_key = $2",
        scope,
        key,
    )
    .fetch_optional(pool)
    .await
}

/// Whether hold `id` was placed through the API under a key of `owner` (an API client's
/// key prefix, `"{owner}:"`).
#[tracing::instrument(skip_all)]
pub async fn owned_by(db: &PgPool, id: Uuid, owner: &str) -> sqlx::Result<bool> {
    sqlx::query_scalar!(
        r#"select exists (
             select 1 from holds
              where id = $1 and idempotency_scope = 'api-hold'
                and starts_with(idempotency_key, $2)) as "owns!""#,
        id,
        owner,
    )
    .fetch_one(db)
    .await
}

/// Whether `hold`'s key belongs to `owner` (as [`owned_by`] asks the database).
pub(super) fn owns(owner: &str, scope: &str, key: &str) -> bool {
    scope == "api-hold" && key.starts_with(owner)
}

/// The live holds among `ids` (active, unexpired by the database's clock) that hold no
/// product with a purchase limit, locked in id order until the transaction ends, with
/// their lines and an order number drawn for each: what a lot of confirmations may
/// confirm together ([`super::batch`]). A hold left unconfirmed leaves its number unused,
/// as a rolled-back order does.
#[tracing::instrument(skip_all, fields(holds = ids.len()))]
pub(super) async fn lock_live(
    conn: &mut PgConnection,
    ids: &[Uuid],
) -> sqlx::Result<Vec<LiveHold>> {
    let rows = sqlx::query!(
        r#"select h.id, h.email, h.customer_name, h.shopper, h.idempotency_scope,
                  h.idempotency_key, nextval('order_numbers') as "number!"
             from holds h
            where h.id = any($1::uuid[]) and h.state = 'active' and h.expires_at > now()
              and not exists (select 1 from hold_lines l join products p on p.sku = l.sku
                               where l.hold_id = h.id and p.purchase_limit is not null)
            order by h.id
              for update of h"#,
        ids,
    )
    .fetch_all(&mut *conn)
    .await?;
    let live: Vec<Uuid> = rows.iter().map(|r| r.id).collect();
    let mut lines = sqlx::query!(
        r#"select l.hold_id, l.sku as "sku: Sku", p.name, l.quantity, l.unit_price_cents
             from hold_lines l join products p on p.sku = l.sku
            where l.hold_id = any($1::uuid[])
            order by l.sku collate "C""#,
        &live,
    )
    .fetch_all(&mut *conn)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| LiveHold {
            id: r.id,
            email: r.email,
            customer_name: r.customer_name,
            shopper: r.shopper,
            scope: r.idempotency_scope,
            key: r.idempotency_key,
            number: r.number,
            lines: lines
                .extract_if(.., |l| l.hold_id == r.id)
                .map(|l| OrderLine {
                    sku: l.sku,
                    name: l.name,
                    quantity: l.quantity,
                    unit_price_cents: l.unit_price_cents,
                })
                .collect(),
        })
        .collect())
}

/// A lot of confirmations as the columns [`confirm_many`] writes.
#[derive(Debug, Default)]
pub(super) struct Confirmations {
    /// Units per SKU, each SKU once, in SKU order.
    units: BTreeMap<String, i32>,
    /// The orders, placed under scope `hold` and the hold's id.
    orders: OrderRows,
    /// Each order's hold, and its `hold.confirmed` payload.
    hold_ids: Vec<Uuid>,
    confirmed_events: Vec<serde_json::Value>,
}

impl Confirmations {
    /// Hold `hold` becomes `order`, counted for `shopper`'s identities.
    pub(super) fn add(&mut self, hold: Uuid, order: &crate::orders::Order, shopper: &[String]) {
        for line in &order.lines {
            *self.units.entry(line.sku.to_string()).or_default() += line.quantity;
        }
        let key = hold.to_string();
        self.orders
            .add(order, ("hold", &key), shopper, true, "shopper");
        self.hold_ids.push(hold);
        self.confirmed_events
            .push(crate::events::Event::hold_confirmed(hold, order.id).payload);
    }
}

/// A lot's one write: the stock and order parts every group-commit write shares
/// ([`crate::inventory::group::stock_sql`], [`crate::orders::db::order_rows_sql`]), then
/// its holds marked confirmed.
const CONFIRM_SQL: &str = concat!(
    crate::inventory::group::stock_sql!(),
    crate::orders::db::order_rows_sql!("$23", "$24"),
    crate::events::db::events_sql!("placed_events", "order.placed", "$20"),
    r#", confirmed as (
           update holds h
              set state = 'confirmed', order_id = u.id, updated_at = now()
             from unnest($6::uuid[], $21::uuid[]) as u(id, hold)
            where h.id = u.hold and (select go from go)
       )"#,
    crate::events::db::events_sql!("confirmed_events", "hold.confirmed", "$22"),
    " select go from go"
);

/// Confirms a lot of locked, live holds by one statement: each SKU's stock sold from what
/// the holds reserved, every order with its lines, ledger rows and `order.placed` event,
/// every hold marked confirmed with its `hold.confirmed` event. False, having written
/// nothing, when a stock row no longer has the units reserved.
#[tracing::instrument(skip_all, fields(orders = w.hold_ids.len()))]
pub(super) async fn confirm_many(conn: &mut PgConnection, w: &Confirmations) -> sqlx::Result<bool> {
    let units: Vec<i32> = w.units.values().copied().collect();
    let moves = Moves {
        skus: w.units.keys().map(String::as_str).collect(),
        sold: units.clone(),
        held: vec![0; units.len()],
        released: units,
        fence: None,
    };
    w.orders
        .bind(moves.bind(sqlx::query_scalar(CONFIRM_SQL)))
        .bind(&w.hold_ids)
        .bind(&w.confirmed_events)
        .bind(&w.orders.numbers)
        .bind(&w.orders.addresses)
        .fetch_one(conn)
        .await
}

/// What a drop asks of a hold about to be confirmed: each SKU of hold `id` that a
/// confirmation could still sell, with when the hold was placed and whether it still
/// reserves its stock (active and unexpired by the database's clock). Every state a
/// confirmation can turn into an order is read, the expired one included (expired by the
/// sweeper, or past its time and not yet swept): none for a hold confirmed (answered from
/// its record) or released.
///
/// A hold within `margin` of its end counts as expired already: the confirmation that
/// follows this read may find it expired (it may wait that long for its transaction), and
/// would then sell from free stock under a check made for a live hold.
pub async fn confirmable_skus(
    db: &PgPool,
    id: Uuid,
    margin: std::time::Duration,
) -> sqlx::Result<Vec<HeldSku>> {
    Ok(sqlx::query!(
        r#"select l.sku, h.created_at,
                  (h.state = 'active' and h.expires_at > now() + make_interval(secs => $2))
                    as "live!"
             from holds h join hold_lines l on l.hold_id = h.id
            where h.id = $1 and h.state in ('active', 'expired')"#,
        id,
        margin.as_secs_f64(),
    )
    .fetch_all(db)
    .await?
    .into_iter()
    .map(|r| HeldSku {
        sku: r.sku,
        placed_at: r.created_at,
        live: r.live,
    })
    .collect())
}

/// A SKU of a hold, as [`confirmable_skus`] reads it.
#[derive(Debug, Clone)]
pub struct HeldSku {
    pub sku: String,
    pub placed_at: DateTime<Utc>,
    /// The hold still reserves it: confirming sells what is reserved, not free stock.
    pub live: bool,
}

/// A live hold of unlimited products, locked for a lot.
pub struct LiveHold {
    pub id: Uuid,
    pub email: Option<String>,
    pub customer_name: Option<String>,
    pub shopper: Vec<String>,
    /// Its idempotency scope and key: whose it is.
    pub scope: String,
    pub key: String,
    /// The number its order takes.
    pub number: i64,
    pub lines: Vec<OrderLine>,
}
