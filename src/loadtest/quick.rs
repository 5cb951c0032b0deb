//! `stockade check --quick`: the invariants a live shop can be held to every minute, checked
//! incrementally, and the verdicts of every check, kept for the dashboard.
//!
//! The full check sums the whole ledger and every order line, which grows with the shop's
//! history. The quick one keeps per-SKU sums of the ledger (`ledger_checkpoints`) through
//! a position (`ledger_cursor.through_id`) and reads only the ledger rows after it and the
//! orders since its last run. The position moves in two steps, because ledger ids are
//! taken before their transactions commit, so an id can become visible after a larger one:
//! a run notes the largest id it sees and its own transaction id, assigned after its
//! snapshot; a later run whose snapshot's `xmin` has passed that id (every transaction that
//! had an id when the first run looked has ended) adds the rows up to the noted id to the
//! sums and moves the position there. No row is summed twice or skipped; a row that is not
//! there yet is read as "after the position" by every run until it is summed. This relies
//! on every writer of the ledger having its transaction id before it takes a ledger id:
//! each updates the stock row (or claims its idempotency key) before writing the ledger.
//!
//! Checked, in one snapshot:
//! - I1: every stock row against its checkpoint plus the ledger since; each ledger sale
//!   since the position against its order line.
//! - I2: no negative stock, nothing reserved beyond what is on hand, nothing sold beyond
//!   what was ever supplied (from the same sums).
//! - I3: no recent order shares its key with another order.
//! - I6 (live): no hold active a minute past its expiry, no request in flight a minute past
//!   the stale window (leases and idle sessions are what a live shop has: not checked).
//! - I7: each recent order has exactly one `order.placed` event, each recent one an order.

use std::time::{Duration, Instant};

use sqlx::{Acquire, PgPool};

use super::check::{SkuBalance, Verdict, conservation_rows, level_rows, stuck_work, verdict_on};

/// How far before its last run a quick check looks at orders: an order is dated by the
/// app when it is decided, a moment before it commits, so one committed just after a run
/// can be dated before it. (A later one only goes unchecked: never a false alarm.)
const ORDERS_OVERLAP: Duration = Duration::from_secs(60);
/// Key of the session advisory lock that keeps quick checks one at a time.
const LOCK_KEY: i64 = 0x5354_4f43_4b43_4b51; // "STOCKCKQ"

/// A quick check's verdicts and what it covered.
#[derive(Debug, Clone)]
pub struct QuickRun {
    pub verdicts: Vec<Verdict>,
    /// What it looked at, in words.
    pub covered: String,
}

/// Runs the quick check on `db`, moves its checkpoints, and records the verdict.
/// `event_retention_days`: how far back orders still have their events (I7).
pub async fn quick_check(
    db: &PgPool,
    stale_after: Duration,
    event_retention_days: u32,
) -> anyhow::Result<QuickRun> {
    let started = chrono::Utc::now();
    let clock = Instant::now();
    let mut conn = db.acquire().await?;
    let locked: bool =
        sqlx::query_scalar!(r#"select pg_try_advisory_lock($1) as "locked!""#, LOCK_KEY)
            .fetch_one(&mut *conn)
            .await?;
    if !locked {
        anyhow::bail!("another quick check is running on this database; try again in a moment");
    }
    let run = checked(&mut conn, stale_after, event_retention_days).await;
    let _ = sqlx::query_scalar!(r#"select pg_advisory_unlock($1) as "unlocked!""#, LOCK_KEY)
        .fetch_one(&mut *conn)
        .await;
    let run = run?;
    let passed = run.verdicts.iter().all(|v| v.pass);
    crate::verdicts::record(db, "quick", started, passed, &run.verdicts, &run.covered).await?;
    tracing::info!(
        elapsed_ms = clock.elapsed().as_millis() as u64,
        covered = %run.covered,
        "quick check done"
    );
    Ok(run)
}

async fn checked(
    conn: &mut sqlx::PgConnection,
    stale_after: Duration,
    event_retention_days: u32,
) -> anyhow::Result<QuickRun> {
    let mut tx = conn.begin().await?;
    sqlx::query("set transaction isolation level repeatable read")
        .execute(&mut *tx)
        .await?;
    sqlx::query("set local jit = off").execute(&mut *tx).await?;
    let cursor = sqlx::query!(
        r#"select through_id, pending_id,
                  -- Orders since the last run, within the event retention (older orders'
                  -- events may be purged).
                  greatest(coalesce(orders_from, '-infinity'),
                           now() - make_interval(days => $1)) as "orders_from!",
                  coalesce(pending_xmax <= pg_snapshot_xmin(pg_current_snapshot()), false)
                      as "ripe!"
             from ledger_cursor"#,
        i32::try_from(event_retention_days).unwrap_or(i32::MAX),
    )
    .fetch_one(&mut *tx)
    .await?;
    let mut through = cursor.through_id;
    let mut promoted = false;
    if let (true, Some(pending)) = (cursor.ripe, cursor.pending_id) {
        promoted = true;
        sqlx::query!(
            r#"insert into ledger_checkpoints as c (sku, on_hand, reserved, sold, supplied)
               select sku, sum(delta), sum(reserved_delta),
                      coalesce(-sum(delta) filter (where reason = 'order'), 0),
                      coalesce(sum(delta) filter (where reason <> 'order'), 0)
                 from stock_movements where id > $1 and id <= $2
                group by sku
               on conflict (sku) do update
                  set on_hand = c.on_hand + excluded.on_hand,
                      reserved = c.reserved + excluded.reserved,
                      sold = c.sold + excluded.sold,
                      supplied = c.supplied + excluded.supplied"#,
            through,
            pending,
        )
        .execute(&mut *tx)
        .await?;
        through = pending;
    }

    // The ledger's sales are the sales here: each recent one is matched to its order line
    // below, instead of summing every order line.
    let balances = sqlx::query_as!(
        SkuBalance,
        r#"select s.sku, s.on_hand, s.reserved,
                  (coalesce(c.supplied, 0) + coalesce(r.supplied, 0))::bigint as "supplied!",
                  (coalesce(c.sold, 0) + coalesce(r.sold, 0))::bigint as "sold!",
                  (coalesce(c.on_hand, 0) + coalesce(r.on_hand, 0))::bigint as "ledger_on_hand!",
                  (coalesce(c.reserved, 0) + coalesce(r.reserved, 0))::bigint as "ledger_reserved!",
                  (coalesce(c.sold, 0) + coalesce(r.sold, 0))::bigint as "ledger_sold!"
             from stock s
             left join ledger_checkpoints c on c.sku = s.sku
             left join (select sku, sum(delta) as on_hand, sum(reserved_delta) as reserved,
                               -sum(delta) filter (where reason = 'order') as sold,
                               sum(delta) filter (where reason <> 'order') as supplied
                          from stock_movements where id > $1 group by sku) r on r.sku = s.sku
            order by s.sku"#,
        through,
    )
    .fetch_all(&mut *tx)
    .await?;
    let recent_rows: i64 = sqlx::query_scalar!(
        r#"select count(*) as "rows!" from stock_movements where id > $1"#,
        through
    )
    .fetch_one(&mut *tx)
    .await?;
    let mut verdicts = Vec::new();

    let mut rows = conservation_rows(&balances);
    rows.extend(
        sqlx::query_scalar!(
            r#"select format('ledger row %s sells %s of %s for order %s, whose line has %s',
                             m.id, -m.delta, m.sku, m.reference,
                             coalesce(l.quantity::text, 'none')) as "problem!"
                 from stock_movements m
                 left join order_lines l
                        on l.sku = m.sku
                       and l.order_id = case when m.reference ~* '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'
                                             then m.reference::uuid end
                where m.id > $1 and m.reason = 'order'
                  and l.quantity is distinct from -m.delta
                order by m.id"#,
            through,
        )
        .fetch_all(&mut *tx)
        .await?,
    );
    verdicts.push(verdict_on(
        "I1",
        Some("the stock rows, and each sale since the last checkpoint"),
        rows,
    ));

    let rows = level_rows(&balances);
    verdicts.push(verdict_on("I2", None, rows));

    let from = cursor.orders_from;
    let rows = sqlx::query_scalar!(
        r#"select format('%s/%s: orders %s and %s', o.idempotency_scope, o.idempotency_key,
                         o.id, d.id) as "problem!"
             from orders o
             join orders d on d.idempotency_scope = o.idempotency_scope
                          and d.idempotency_key = o.idempotency_key and d.id <> o.id
            where o.created_at >= $1"#,
        from,
    )
    .fetch_all(&mut *tx)
    .await?;
    verdicts.push(verdict_on("I3", Some("recent orders"), rows));

    let minute = Duration::from_secs(60);
    let rows = stuck_work(&mut tx, minute, stale_after + minute).await?;
    verdicts.push(verdict_on(
        "I6",
        Some("live: the holds and in-flight keys only"),
        rows,
    ));

    let rows = sqlx::query_scalar!(
        r#"select format('order %s has %s order.placed events', o.id, n.events) as "problem!"
             from orders o
             cross join lateral (select count(*) as events from events e
                                  where e.type = 'order.placed'
                                    and e.payload->>'order_id' = o.id::text) n
            where o.created_at >= $1 and n.events <> 1
           union all
           select format('order.placed event %s is for order %s, which does not exist',
                         e.id, e.payload->>'order_id')
             from events e
            where e.type = 'order.placed' and e.created_at >= $1
              and not exists (select 1 from orders o where o.id::text = e.payload->>'order_id')"#,
        from,
    )
    .fetch_all(&mut *tx)
    .await?;
    verdicts.push(verdict_on("I7", Some("recent orders"), rows));

    let recent_orders: i64 = sqlx::query_scalar!(
        r#"select count(*) as "n!" from orders where created_at >= $1"#,
        from
    )
    .fetch_one(&mut *tx)
    .await?;
    // What the next run may sum through, and when: noted anew only once the last note
    // has been used, so runs that each overlap a long transaction still move on.
    sqlx::query!(
        r#"update ledger_cursor
              set through_id = $1,
                  pending_id = case when $3 or pending_id is null
                                    then (select coalesce(max(id), $1) from stock_movements)
                                    else pending_id end,
                  pending_xmax = case when $3 or pending_id is null
                                      then pg_current_xact_id()
                                      else pending_xmax end,
                  orders_from = now() - make_interval(secs => $2)"#,
        through,
        ORDERS_OVERLAP.as_secs_f64(),
        promoted,
    )
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(QuickRun {
        verdicts,
        covered: format!(
            "{} SKUs, {recent_rows} ledger rows past the checkpoint, {recent_orders} recent orders",
            balances.len()
        ),
    })
}
