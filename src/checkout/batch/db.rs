//! The batch's two statements: one read of everything a batch decides from, and one write
//! of everything it decided. Under a lease they are the whole transaction: no `BEGIN`, no
//! `COMMIT`, two round trips, and the hot row locked only while the write runs.
//!
//! The write is one statement of data-modifying `WITH` parts, so it is atomic on its own:
//! the stock update refuses unless every sold SKU still has the units and no newer fence,
//! and every insert runs only if that update took all of them. A refused write therefore
//! writes nothing, and the batch starts again from a fresh read. A key or order recorded
//! elsewhere since the read fails the statement on its unique index, also writing nothing.

use serde_json::Value;
use sqlx::PgConnection;
use uuid::Uuid;

use crate::inventory::group::Moves;
use crate::orders::db::OrderRows;

/// A stock row of the batch's SKUs with its product, as the read found it.
#[derive(Debug, sqlx::FromRow)]
pub struct Row {
    pub sku: String,
    pub available: i32,
    pub last_fence: i64,
    /// On sale: an inactive product refuses its own orders.
    pub active: bool,
    pub name: String,
    pub price_cents: i64,
    pub purchase_limit: Option<i32>,
    /// Positions (from 1) of the batch's keys that have a record; the same on every row.
    pub recorded: Vec<i64>,
    /// The database's clock, which hold expiries are set by (the one the sweeper reads).
    pub now: chrono::DateTime<chrono::Utc>,
    /// Order numbers drawn for the batch's orders (as many as it may place); the same on
    /// every row.
    pub numbers: Vec<i64>,
}

/// The batch's read: stock and product rows, which keys have a record, the time.
macro_rules! read_sql {
    () => {
        r#"select s.sku, s.on_hand - s.reserved as available, s.last_fence, p.active,
                  p.name, p.price_cents, p.purchase_limit,
                  array(select u.i
                          from unnest($2::text[], $3::text[]) with ordinality as u(scope, key, i)
                         where exists (select 1 from idempotency_keys k
                                        where k.scope = u.scope and k.key = u.key)) as recorded,
                  now() as now,
                  array(select nextval('order_numbers')
                          from generate_series(1, $4::int)) as numbers
             from stock s
             join products p on p.sku = s.sku
            where s.sku = any($1)
            order by s.sku collate "C""#
    };
}

/// What a batch reads: its SKUs (sorted, each once), its keys (`scopes[i]`, `keys[i]`),
/// and how many order numbers it may need.
pub struct Asked<'a> {
    pub skus: Vec<&'a str>,
    pub scopes: Vec<&'a str>,
    pub keys: Vec<&'a str>,
    pub orders: usize,
}

impl Asked<'_> {
    /// The stock and product rows of the SKUs, which of the keys have a record already,
    /// and the order numbers, by one statement. Reads without locking; see [`write`].
    pub async fn read(&self, conn: &mut PgConnection) -> sqlx::Result<Vec<Row>> {
        self.run(conn, read_sql!()).await
    }

    /// [`Asked::read`], locking the stock rows for the rest of the transaction, in SKU
    /// order (as every locker of several stock rows does, so no two deadlock): one round
    /// trip where a lock and a read took two, while the rows are held.
    pub async fn read_locking(&self, conn: &mut PgConnection) -> sqlx::Result<Vec<Row>> {
        self.run(conn, concat!(read_sql!(), " for update of s"))
            .await
    }

    async fn run(&self, conn: &mut PgConnection, sql: &'static str) -> sqlx::Result<Vec<Row>> {
        // A runtime query, planned afresh each time (`persistent(false)`, which the macros
        // do not offer): a plan kept from when `idempotency_keys` was small joins the keys
        // by reading the whole table, and that table grows by every order.
        sqlx::query_as(sql)
            .bind(&self.skus)
            .bind(&self.scopes)
            .bind(&self.keys)
            .bind(self.orders as i32)
            .persistent(false)
            .fetch_all(conn)
            .await
    }
}

/// Everything one batch decided, as the columns of its rows.
#[derive(Debug, Default)]
pub struct Decided<'a> {
    /// Units sold (`on_hand −= q`) and held (`reserved += q`) per SKU, under the batch's
    /// fence.
    pub moves: Moves<'a>,
    /// The orders it placed.
    pub orders: OrderRows,
    /// The holds it placed.
    pub holds: PlacedHolds<'a>,
    /// One entry per decided key (placed or short), with its answer.
    pub key_scopes: Vec<&'a str>,
    pub keys: Vec<&'a str>,
    pub fingerprints: Vec<&'a str>,
    pub statuses: Vec<i16>,
    pub bodies: Vec<Value>,
}

/// The holds a batch placed, as columns (one SKU each).
#[derive(Debug, Default)]
pub struct PlacedHolds<'a> {
    pub ids: Vec<Uuid>,
    pub names: Vec<Option<&'a str>>,
    pub emails: Vec<Option<&'a str>>,
    pub scopes: Vec<&'a str>,
    pub keys: Vec<&'a str>,
    pub expires: Vec<chrono::DateTime<chrono::Utc>>,
    /// Identities joined by newlines, as for orders.
    pub shoppers: Vec<String>,
    /// One entry per hold line: its hold, the hold's scope.
    pub line_holds: Vec<Uuid>,
    pub line_scopes: Vec<&'a str>,
    pub skus: Vec<&'a str>,
    pub quantities: Vec<i32>,
    pub prices: Vec<i64>,
    /// The `hold.placed` payload of each hold.
    pub events: Vec<Value>,
}

/// The batch's one write: the stock and order parts every group-commit write shares
/// ([`crate::inventory::group::stock_sql`], [`crate::orders::db::order_rows_sql`]), then
/// its holds and its keys' answers.
const WRITE_SQL: &str = concat!(
    crate::inventory::group::stock_sql!(),
    crate::orders::db::order_rows_sql!("$40", "$41"),
    crate::events::db::events_sql!("placed_events", "order.placed", "$20"),
    r#", held as (
           insert into holds
                  (id, state, expires_at, email, customer_name, idempotency_scope,
                   idempotency_key, shopper)
           select id, 'active', expires, email, name, scope, key,
                  string_to_array(shopper, E'\n')
             from unnest($21::uuid[], $22::text[], $23::text[], $24::text[], $25::text[],
                         $26::timestamptz[], $27::text[])
                  as u(id, name, email, scope, key, expires, shopper)
            where (select go from go)
       ), held_lines as (
           insert into hold_lines (hold_id, sku, quantity, unit_price_cents)
           select id, sku, quantity, price
             from unnest($28::uuid[], $29::text[], $30::int[], $31::bigint[])
                  as u(id, sku, quantity, price)
            where (select go from go)
       ), held_ledger as (
           insert into stock_movements (sku, delta, reserved_delta, reason, reference, actor)
           select sku, 0, quantity, 'hold', id::text, scope
             from unnest($28::uuid[], $29::text[], $30::int[], $32::text[])
                  as u(id, sku, quantity, scope)
            where (select go from go)
       )"#,
    crate::events::db::events_sql!("held_events", "hold.placed", "$33"),
    r#", answers as (
           insert into idempotency_keys
                  (scope, key, fingerprint, state, owner, response_status, response_body,
                   completed_at)
           select scope, key, fingerprint, 'completed', $39, status, body, now()
             from unnest($34::text[], $35::text[], $36::text[], $37::int2[], $38::jsonb[])
                  as u(scope, key, fingerprint, status, body)
            where (select go from go)
       )
       select go from go"#
);

/// Writes what a batch decided by one statement: the stock of each sold SKU, every order,
/// line, ledger row and `order.placed` event, every hold with its line, ledger row and
/// `hold.placed` event, and every decided key with its answer.
/// Returns false, having written nothing, when the stock update refused (a row no longer
/// has the units, or a newer lease wrote it). Fails with a unique violation, having
/// written nothing, when a key or an order was recorded elsewhere since the read.
pub async fn write(conn: &mut PgConnection, d: &Decided<'_>) -> sqlx::Result<bool> {
    let h = &d.holds;
    let query = d.orders.bind(d.moves.bind(sqlx::query_scalar(WRITE_SQL)));
    query
        .bind(&h.ids)
        .bind(&h.names)
        .bind(&h.emails)
        .bind(&h.scopes)
        .bind(&h.keys)
        .bind(&h.expires)
        .bind(&h.shoppers)
        .bind(&h.line_holds)
        .bind(&h.skus)
        .bind(&h.quantities)
        .bind(&h.prices)
        .bind(&h.line_scopes)
        .bind(&h.events)
        .bind(&d.key_scopes)
        .bind(&d.keys)
        .bind(&d.fingerprints)
        .bind(&d.statuses)
        .bind(&d.bodies)
        .bind(Uuid::new_v4())
        .bind(&d.orders.numbers)
        .bind(&d.orders.addresses)
        .fetch_one(conn)
        .await
}
