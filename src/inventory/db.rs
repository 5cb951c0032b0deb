//! Inventory SQL. Functions that must share a transaction take `&mut PgConnection`
//! (pass `&mut *tx`), so the transaction boundary shows in the caller.

use sqlx::{PgConnection, PgPool};

use super::{LedgerMismatch, StockLevel};
use crate::catalog::Sku;
use crate::events::Event;

/// Creates the stock row of a new product with its `initial` ledger row.
#[tracing::instrument(skip_all)]
pub async fn create_stock(
    conn: &mut PgConnection,
    sku: &Sku,
    on_hand: i32,
    actor: &str,
) -> sqlx::Result<()> {
    sqlx::query!(
        "insert into stock (sku, on_hand) values ($1, $2)",
        sku.as_str(),
        on_hand,
    )
    .execute(&mut *conn)
    .await?;
    record_movement(conn, sku, Entry::of(on_hand, 0, "initial", actor)).await
}

/// The stock row of `sku`.
#[tracing::instrument(skip_all)]
pub async fn stock_level(pool: &PgPool, sku: &Sku) -> sqlx::Result<Option<StockLevel>> {
    sqlx::query_as!(
        StockLevel,
        "select sku, on_hand, reserved from stock where sku = $1",
        sku.as_str(),
    )
    .fetch_optional(pool)
    .await
}

/// SKUs whose stock row differs from the sum of their ledger (empty when all is well).
#[tracing::instrument(skip_all)]
pub async fn ledger_mismatches(pool: &PgPool) -> sqlx::Result<Vec<LedgerMismatch>> {
    sqlx::query_as!(
        LedgerMismatch,
        r#"select s.sku, s.on_hand, s.reserved,
                  coalesce(sum(m.delta), 0) as "ledger_on_hand!",
                  coalesce(sum(m.reserved_delta), 0) as "ledger_reserved!"
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

/// The result of trying to take units of one SKU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Take {
    /// Taken; `left` units remain available.
    Taken { left: i32 },
    /// Not enough: only `available` units are left.
    Short { available: i32 },
    /// Refused: a lease with a newer fencing token (`last_fence`) has written this row.
    StaleFence { last_fence: i64 },
}

/// Takes `quantity` units of `sku` for an order with one conditional statement: the row
/// changes only if enough is available and, with a `fence`, only if no newer lease has
/// written it. Writes the ledger row in the same transaction.
#[tracing::instrument(skip_all)]
pub async fn take_stock(
    conn: &mut PgConnection,
    sku: &Sku,
    quantity: i32,
    fence: Option<i64>,
    reference: &str,
    actor: &str,
) -> sqlx::Result<Take> {
    let entry = Entry::of(-quantity, 0, "order", actor).for_ref(reference);
    claim_units(conn, sku, entry, fence).await
}

/// Reserves `quantity` units of `sku` for a hold: `reserved += quantity` under the same
/// conditions as [`take_stock`].
#[tracing::instrument(skip_all)]
pub async fn reserve_stock(
    conn: &mut PgConnection,
    sku: &Sku,
    quantity: i32,
    fence: Option<i64>,
    reference: &str,
    actor: &str,
) -> sqlx::Result<Take> {
    let entry = Entry::of(0, quantity, "hold", actor).for_ref(reference);
    claim_units(conn, sku, entry, fence).await
}

/// How often a conditional update is retried when stock moved under it.
const RETRIES: usize = 3;

/// Applies `entry` to free units (its `delta` sells them, its `reserved_delta` reserves
/// them) by [`claim_free_units`], with its ledger row; retried while stock moves under it.
async fn claim_units(
    conn: &mut PgConnection,
    sku: &Sku,
    entry: Entry<'_>,
    fence: Option<i64>,
) -> sqlx::Result<Take> {
    for _ in 0..RETRIES {
        // None: stock came back between the update and the look at why it failed (read
        // committed takes a new snapshot per statement), so the update may succeed now.
        if let Some(done) = claim_once(conn, sku, entry, fence).await? {
            return Ok(done);
        }
    }
    why_not_final(conn, sku).await
}

async fn claim_once(
    conn: &mut PgConnection,
    sku: &Sku,
    entry: Entry<'_>,
    fence: Option<i64>,
) -> sqlx::Result<Option<Take>> {
    let (sold, held) = (-entry.delta, entry.reserved_delta);
    let Some(left) = claim_free_units(conn, sku, (sold, held), fence).await? else {
        return why_not(conn, sku, sold + held, fence).await;
    };
    record_movement(conn, sku, entry).await?;
    Ok(Some(Take::Taken { left }))
}

/// Sells units that a hold reserved: `on_hand −= q, reserved −= q`. False when fewer than
/// `quantity` units are reserved (which a locked, active hold rules out).
#[tracing::instrument(skip_all)]
pub async fn sell_reserved(
    conn: &mut PgConnection,
    sku: &Sku,
    quantity: i32,
    reference: &str,
    actor: &str,
) -> sqlx::Result<bool> {
    let entry = Entry::of(-quantity, -quantity, "order", actor);
    release_reserved(conn, sku, entry.for_ref(reference)).await
}

/// Returns reserved units to sale (`reserved −= q`); `reason` is `release` or `expire`.
#[tracing::instrument(skip_all)]
pub async fn unreserve(
    conn: &mut PgConnection,
    sku: &Sku,
    quantity: i32,
    reason: &str,
    reference: &str,
    actor: &str,
) -> sqlx::Result<bool> {
    let entry = Entry::of(0, -quantity, reason, actor);
    release_reserved(conn, sku, entry.for_ref(reference)).await
}

/// Applies `entry` to units that are reserved (`entry.reserved_delta` is −q; its `delta`
/// sells them, or 0 returns them to sale), with its ledger row. False, and nothing
/// changed, when fewer than q are reserved.
async fn release_reserved(
    conn: &mut PgConnection,
    sku: &Sku,
    entry: Entry<'_>,
) -> sqlx::Result<bool> {
    let changed = sqlx::query!(
        r#"update stock
              set on_hand = on_hand + $2, reserved = reserved + $3, updated_at = now()
            where sku = $1 and reserved >= -$3::int"#,
        sku.as_str(),
        entry.delta,
        entry.reserved_delta,
    )
    .execute(&mut *conn)
    .await?
    .rows_affected();
    if changed == 1 {
        record_movement(conn, sku, entry).await?;
    }
    Ok(changed == 1)
}

/// Returns reserved units to sale for many `(reference, sku, quantity)` lines at once (the
/// sweeper's expired holds): one update per SKU, in SKU order (the order every writer locks
/// stock rows in), and one ledger row per line. Returns the SKUs changed.
#[tracing::instrument(skip_all)]
pub async fn unreserve_many(
    conn: &mut PgConnection,
    lines: &[(uuid::Uuid, Sku, i32)],
    reason: &str,
    actor: &str,
) -> sqlx::Result<Vec<Sku>> {
    let mut per_sku: std::collections::BTreeMap<&Sku, i32> = Default::default();
    for (_, sku, quantity) in lines {
        *per_sku.entry(sku).or_default() += quantity;
    }
    for (sku, quantity) in &per_sku {
        sqlx::query!(
            "update stock set reserved = reserved - $2, updated_at = now() where sku = $1",
            sku.as_str(),
            quantity,
        )
        .execute(&mut *conn)
        .await?;
    }
    let skus: Vec<&str> = lines.iter().map(|(_, s, _)| s.as_str()).collect();
    let deltas: Vec<i32> = lines.iter().map(|(_, _, q)| -q).collect();
    let references: Vec<String> = lines.iter().map(|(r, _, _)| r.to_string()).collect();
    sqlx::query!(
        r#"insert into stock_movements (sku, delta, reserved_delta, reason, reference, actor)
           select sku, 0, d, $4, r, $5
             from unnest($1::text[], $2::int[], $3::text[]) as t(sku, d, r)"#,
        &skus as &[&str],
        &deltas,
        &references,
        reason,
        actor,
    )
    .execute(&mut *conn)
    .await?;
    Ok(per_sku.into_keys().cloned().collect())
}

/// After the retries: report what is available now (stock keeps moving; say so honestly).
#[tracing::instrument(skip_all)]
async fn why_not_final(conn: &mut PgConnection, sku: &Sku) -> sqlx::Result<Take> {
    let available = sqlx::query_scalar!(
        r#"select on_hand - reserved as "available!" from stock where sku = $1"#,
        sku.as_str(),
    )
    .fetch_one(&mut *conn)
    .await?;
    Ok(Take::Short { available })
}

/// Why a conditional update changed nothing, from the row as this transaction sees it.
#[tracing::instrument(skip_all)]
async fn why_not(
    conn: &mut PgConnection,
    sku: &Sku,
    quantity: i32,
    fence: Option<i64>,
) -> sqlx::Result<Option<Take>> {
    let row = sqlx::query!(
        r#"select on_hand - reserved as "available!", last_fence from stock where sku = $1"#,
        sku.as_str(),
    )
    .fetch_one(&mut *conn)
    .await?;
    let (available, last_fence) = (row.available, row.last_fence);
    Ok(match fence {
        Some(fence) if last_fence >= fence && available >= quantity => {
            Some(Take::StaleFence { last_fence })
        }
        _ if available >= quantity => None,
        _ => Some(Take::Short { available }),
    })
}

/// The naive way, kept to demonstrate overselling: read, check in Rust, write back an
/// absolute value. Two buyers who read the same number both "succeed".
#[tracing::instrument(skip_all)]
pub async fn take_stock_naive(
    conn: &mut PgConnection,
    sku: &Sku,
    quantity: i32,
    reference: &str,
    actor: &str,
) -> sqlx::Result<Take> {
    let row = sqlx::query!(
        "select on_hand, reserved from stock where sku = $1",
        sku.as_str(),
    )
    .fetch_one(&mut *conn)
    .await?;
    let (on_hand, reserved) = (row.on_hand, row.reserved);
    if on_hand - reserved < quantity {
        return Ok(Take::Short {
            available: on_hand - reserved,
        });
    }
    // Stands in for the work a handler does between reading and writing (pricing, tax,
    // fraud checks); it widens the race this strategy exists to show.
    tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    sqlx::query!(
        "update stock set on_hand = $2, updated_at = now() where sku = $1",
        sku.as_str(),
        on_hand - quantity,
    )
    .execute(&mut *conn)
    .await?;
    let entry = Entry::of(-quantity, 0, "order", actor).for_ref(reference);
    record_movement(conn, sku, entry).await?;
    Ok(Take::Taken {
        left: on_hand - quantity - reserved,
    })
}

/// Sells `sold` and reserves `held` units of `sku` (one of them is 0) by the one
/// conditional statement every single-row claim goes through: nothing changes unless
/// enough is free and, with a `fence`, no newer lease has written the row. The units left,
/// or `None` when refused. Writes no ledger row: [`claim_units`] does. (The group-commit
/// writes state the same guard for many rows: [`super::group`].)
async fn claim_free_units(
    conn: &mut PgConnection,
    sku: &Sku,
    (sold, held): (i32, i32),
    fence: Option<i64>,
) -> sqlx::Result<Option<i32>> {
    sqlx::query_scalar!(
        r#"update stock
              set on_hand = on_hand - $2,
                  reserved = reserved + $3,
                  last_fence = greatest(last_fence, $4),
                  updated_at = now()
            where sku = $1
              and on_hand - reserved >= $2::int + $3::int
              and ($4::bigint is null or last_fence < $4)
        returning on_hand - reserved as "left!""#,
        sku.as_str(),
        sold,
        held,
        fence,
    )
    .fetch_optional(conn)
    .await
}

/// One ledger row to append: `delta` to on_hand, `reserved_delta` to reserved.
#[derive(Debug, Clone, Copy)]
pub struct Entry<'a> {
    pub delta: i32,
    pub reserved_delta: i32,
    /// The kind: initial, restock, adjust, order, cancel, hold, release, expire.
    pub reason: &'a str,
    /// The order or hold it belongs to.
    pub reference: Option<&'a str>,
    /// Why a person made the change.
    pub note: Option<&'a str>,
    pub actor: &'a str,
}

impl<'a> Entry<'a> {
    /// A row of `reason` by `actor`: `delta` to on_hand, `reserved_delta` to reserved.
    pub fn of(delta: i32, reserved_delta: i32, reason: &'a str, actor: &'a str) -> Self {
        Self {
            delta,
            reserved_delta,
            reason,
            reference: None,
            note: None,
            actor,
        }
    }

    /// For the order or hold `reference`.
    pub fn for_ref(self, reference: &'a str) -> Self {
        Self {
            reference: Some(reference),
            ..self
        }
    }

    /// With a person's reason.
    pub fn noting(self, note: &'a str) -> Self {
        Self {
            note: Some(note),
            ..self
        }
    }
}

/// Appends one ledger row; every ledger write but the sweeper's bulk insert comes here.
#[tracing::instrument(skip_all)]
pub async fn record_movement(conn: &mut PgConnection, sku: &Sku, e: Entry<'_>) -> sqlx::Result<()> {
    sqlx::query!(
        r#"insert into stock_movements (sku, delta, reserved_delta, reason, reference, note, actor)
           values ($1, $2, $3, $4, $5, $6, $7)"#,
        sku.as_str(),
        e.delta,
        e.reserved_delta,
        e.reason,
        e.reference,
        e.note,
        e.actor,
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// Adds `entry.delta` units to `sku`'s on-hand count (a delivery, a cancelled order): a
/// delta, so it never conflicts with sales. Returns the new count.
#[tracing::instrument(skip_all)]
pub async fn add_on_hand(
    conn: &mut PgConnection,
    sku: &Sku,
    entry: Entry<'_>,
) -> sqlx::Result<i32> {
    let on_hand = sqlx::query_scalar!(
        "update stock set on_hand = on_hand + $2, updated_at = now() where sku = $1 returning on_hand",
        sku.as_str(),
        entry.delta,
    )
    .fetch_one(&mut *conn)
    .await?;
    record_movement(conn, sku, entry).await?;
    Ok(on_hand)
}

/// Units available (`on_hand − reserved`) per SKU, for those of `skus` that exist.
#[tracing::instrument(skip_all)]
pub async fn availability(pool: &PgPool, skus: &[Sku]) -> sqlx::Result<Vec<(String, i32)>> {
    let skus: Vec<&str> = skus.iter().map(Sku::as_str).collect();
    let rows = sqlx::query!(
        r#"select sku, on_hand - reserved as "available!" from stock where sku = any($1::text[])"#,
        &skus as &[&str],
    )
    .fetch_all(pool)
    .await?;
    Ok(rows.into_iter().map(|r| (r.sku, r.available)).collect())
}

/// What a compare-and-set adjustment found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Adjusted {
    Done,
    /// Stock moved since the form was rendered: `on_hand` is the value now.
    Moved {
        on_hand: i32,
    },
    /// The new value would be below what holds keep reserved.
    BelowReserved {
        reserved: i32,
    },
}

/// The most units one product can have on hand (the column is a 32-bit integer).
pub const MAX_ON_HAND: i32 = i32::MAX;

/// Adds `units` (positive) to `sku` (a delivery): a delta, so it never conflicts with sales.
/// `None` (and nothing changed) when the count would pass [`MAX_ON_HAND`]: the statement
/// checks the sum before making it, so it never overflows.
#[tracing::instrument(skip_all)]
pub async fn restock(
    conn: &mut PgConnection,
    sku: &Sku,
    units: i32,
    note: &str,
    actor: &str,
) -> sqlx::Result<Option<i32>> {
    let on_hand = sqlx::query_scalar!(
        r#"update stock set on_hand = on_hand + $2, updated_at = now()
            where sku = $1 and on_hand <= $3::int - $2::int returning on_hand"#,
        sku.as_str(),
        units,
        MAX_ON_HAND,
    )
    .fetch_optional(&mut *conn)
    .await?;
    if let Some(on_hand) = on_hand {
        let entry = Entry::of(units, 0, "restock", actor).noting(note);
        record_movement(conn, sku, entry).await?;
        let event = Event::stock_adjusted(sku.as_str(), "restock", units, on_hand, actor);
        crate::events::db::record(conn, event).await?;
    }
    Ok(on_hand)
}

/// Sets `sku`'s on-hand count to `new`, but only if it is still `expected` (the value the
/// admin saw): a count never overwrites sales made meanwhile.
#[tracing::instrument(skip_all)]
pub async fn adjust(
    conn: &mut PgConnection,
    sku: &Sku,
    expected: i32,
    new: i32,
    note: &str,
    actor: &str,
) -> sqlx::Result<Adjusted> {
    let changed = sqlx::query!(
        r#"update stock set on_hand = $3, updated_at = now()
            where sku = $1 and on_hand = $2 and reserved <= $3"#,
        sku.as_str(),
        expected,
        new,
    )
    .execute(&mut *conn)
    .await?
    .rows_affected();
    if changed == 1 {
        if new != expected {
            let entry = Entry::of(new - expected, 0, "adjust", actor).noting(note);
            record_movement(conn, sku, entry).await?;
            let event = Event::stock_adjusted(sku.as_str(), "adjust", new - expected, new, actor);
            crate::events::db::record(conn, event).await?;
        }
        return Ok(Adjusted::Done);
    }
    let row = sqlx::query!(
        "select on_hand, reserved from stock where sku = $1",
        sku.as_str(),
    )
    .fetch_one(&mut *conn)
    .await?;
    let (on_hand, reserved) = (row.on_hand, row.reserved);
    Ok(if on_hand != expected {
        Adjusted::Moved { on_hand }
    } else {
        Adjusted::BelowReserved { reserved }
    })
}
