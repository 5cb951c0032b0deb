//! `stockade check --quick`: the invariants a live shop can be held to every minute, checked
//! incrementally, and the verdicts of every check, kept for the dashboard.
//!
//! The full check sums the whole ledger and every order line, which grows with the shop's
//! history. The quick one keeps per-SKU sums of the ledger (`ledger_checkpoints`) through
//! a position (`ledger_cursor.through_id`) and reads only the ledger rows after it and the
//! orders since its last run. The position moves in two steps, because ledger ids are
//! taken before their transactions commit, so an id can become visible after a larger one:
//! a run notes the largest id it sees and its snapshot's `xmax`; a later run whose
//! snapshot's `xmin` has passed that `xmax` (every transaction running at the first run
//! has ended) adds the rows up to the noted id to the sums and moves the position there.
//! No row is summed twice or skipped; a row that is not there yet is read as "after the
//! position" by every run until it is summed.
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

use serde::Serialize;
use sqlx::{Acquire, PgPool};

use super::check::{Verdict, verdict};

/// How far before its last run a quick check looks at orders: a transaction's rows carry
/// its start time, so an order committed just after a run can be dated before it.
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

/// The last check recorded, as the dashboard shows it.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct LastCheck {
    /// `quick` or `full`.
    pub kind: String,
    pub passed: bool,
    /// When it finished (UTC, RFC 3339).
    pub finished_at: String,
    pub seconds_ago: i64,
    pub covered: String,
    /// The invariants that failed, `I1: …`.
    pub failed: Vec<String>,
}

/// Runs the quick check on `db`, moves its checkpoints, and records the verdict.
pub async fn quick_check(db: &PgPool, stale_after: Duration) -> anyhow::Result<QuickRun> {
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
    let run = checked(&mut conn, stale_after).await;
    let _ = sqlx::query_scalar!(r#"select pg_advisory_unlock($1) as "unlocked!""#, LOCK_KEY)
        .fetch_one(&mut *conn)
        .await;
    let run = run?;
    record(db, "quick", started, &run.verdicts, &run.covered).await?;
    tracing::info!(
        elapsed_ms = clock.elapsed().as_millis() as u64,
        covered = %run.covered,
        "quick check done"
    );
    Ok(run)
}

async fn checked(conn: &mut sqlx::PgConnection, stale_after: Duration) -> anyhow::Result<QuickRun> {
    let mut tx = conn.begin().await?;
    sqlx::query("set transaction isolation level repeatable read")
        .execute(&mut *tx)
        .await?;
    sqlx::query("set local jit = off").execute(&mut *tx).await?;
    let cursor = sqlx::query!(
        r#"select through_id, pending_id, orders_from,
                  coalesce(pending_xmax <= pg_snapshot_xmin(pg_current_snapshot()), false)
                      as "ripe!"
             from ledger_cursor"#
    )
    .fetch_one(&mut *tx)
    .await?;
    let mut through = cursor.through_id;
    if let (true, Some(pending)) = (cursor.ripe, cursor.pending_id) {
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

    let balances = sqlx::query!(
        r#"select s.sku, s.on_hand, s.reserved,
                  (coalesce(c.on_hand, 0) + coalesce(r.on_hand, 0))::bigint as "ledger_on_hand!",
                  (coalesce(c.reserved, 0) + coalesce(r.reserved, 0))::bigint as "ledger_reserved!",
                  (coalesce(c.sold, 0) + coalesce(r.sold, 0))::bigint as "sold!",
                  (coalesce(c.supplied, 0) + coalesce(r.supplied, 0))::bigint as "supplied!",
                  coalesce(r.rows, 0)::bigint as "recent_rows!"
             from stock s
             left join ledger_checkpoints c on c.sku = s.sku
             left join (select sku, sum(delta) as on_hand, sum(reserved_delta) as reserved,
                               -sum(delta) filter (where reason = 'order') as sold,
                               sum(delta) filter (where reason <> 'order') as supplied,
                               count(*) as rows
                          from stock_movements where id > $1 group by sku) r on r.sku = s.sku
            order by s.sku"#,
        through,
    )
    .fetch_all(&mut *tx)
    .await?;
    let mut verdicts = Vec::new();

    let mut rows: Vec<String> = balances
        .iter()
        .filter_map(|b| {
            let mut problems = Vec::new();
            if i64::from(b.on_hand) != b.ledger_on_hand {
                problems.push(format!(
                    "on_hand {} but the ledger sums to {}",
                    b.on_hand, b.ledger_on_hand
                ));
            }
            if i64::from(b.reserved) != b.ledger_reserved {
                problems.push(format!(
                    "reserved {} but the ledger sums to {}",
                    b.reserved, b.ledger_reserved
                ));
            }
            (!problems.is_empty()).then(|| format!("{}: {}", b.sku, problems.join("; ")))
        })
        .collect();
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
    verdicts.push(verdict(
        "I1",
        "ledger conservation (the stock rows, and each sale since the last checkpoint)",
        rows,
    ));

    let mut rows: Vec<String> = balances
        .iter()
        .filter(|b| b.on_hand < 0 || b.reserved < 0 || b.reserved > b.on_hand)
        .map(|b| format!("{}: on_hand {}, reserved {}", b.sku, b.on_hand, b.reserved))
        .collect();
    rows.extend(balances.iter().filter(|b| b.sold > b.supplied).map(|b| {
        format!(
            "{}: oversold by {} ({} sold, {} ever supplied)",
            b.sku,
            b.sold - b.supplied,
            b.sold,
            b.supplied
        )
    }));
    verdicts.push(verdict(
        "I2",
        "no negative stock, no unit sold twice (oversell)",
        rows,
    ));

    // Orders since the last run (all of them on the first).
    let from = cursor.orders_from.unwrap_or(chrono::DateTime::UNIX_EPOCH);
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
    verdicts.push(verdict(
        "I3",
        "one order per idempotency key (recent orders)",
        rows,
    ));

    let mut rows: Vec<String> = sqlx::query_scalar!(
        r#"select format('%s hold(s) expired but still active, the oldest since %s',
                         count(*), min(expires_at)) as "problem!"
             from holds where state = 'active' and expires_at < now() - interval '1 minute'
           having count(*) > 0"#,
    )
    .fetch_all(&mut *tx)
    .await?;
    rows.extend(
        sqlx::query_scalar!(
            r#"select format('idempotency key %s/%s in flight since %s', scope, key, locked_at)
                      as "problem!"
                 from idempotency_keys
                where state = 'in_flight'
                  and locked_at < now() - make_interval(secs => $1) - interval '1 minute'
                order by locked_at"#,
            stale_after.as_secs_f64(),
        )
        .fetch_all(&mut *tx)
        .await?,
    );
    verdicts.push(verdict(
        "I6",
        "live: no hold active past its expiry, no request in flight past the stale window",
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
    verdicts.push(verdict(
        "I7",
        "each recent order has exactly one order.placed event, and each such event an order",
        rows,
    ));

    let recent_orders: i64 = sqlx::query_scalar!(
        r#"select count(*) as "n!" from orders where created_at >= $1"#,
        from
    )
    .fetch_one(&mut *tx)
    .await?;
    // What the next run may sum through, and when.
    sqlx::query!(
        r#"update ledger_cursor
              set through_id = $1,
                  pending_id = (select coalesce(max(id), $1) from stock_movements),
                  pending_xmax = pg_snapshot_xmax(pg_current_snapshot()),
                  orders_from = now() - make_interval(secs => $2)"#,
        through,
        ORDERS_OVERLAP.as_secs_f64(),
    )
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    let recent_rows: i64 = balances.iter().map(|b| b.recent_rows).sum();
    Ok(QuickRun {
        verdicts,
        covered: format!(
            "{} SKUs, {recent_rows} ledger rows past the checkpoint, {recent_orders} recent orders",
            balances.len()
        ),
    })
}

/// Records a check's verdict for the dashboard.
pub async fn record(
    db: &PgPool,
    kind: &str,
    started: chrono::DateTime<chrono::Utc>,
    verdicts: &[Verdict],
    covered: &str,
) -> anyhow::Result<()> {
    let passed = verdicts.iter().all(|v| v.pass);
    sqlx::query!(
        "insert into check_runs (kind, started_at, passed, verdicts, covered)
         values ($1, $2, $3, $4, $5)",
        kind,
        started,
        passed,
        serde_json::to_value(verdicts)?,
        covered,
    )
    .execute(db)
    .await?;
    Ok(())
}

/// How long check verdicts are kept: a month of one a minute is 43,200 rows.
pub const RUNS_KEPT: &str = "30 days";

/// Deletes up to `limit` verdicts older than [`RUNS_KEPT`], skipping rows another process
/// is purging (retention). Returns how many went.
pub async fn purge_runs(db: &PgPool, limit: i64) -> sqlx::Result<u64> {
    Ok(sqlx::query!(
        r#"with old as (
               select id from check_runs where finished_at < now() - interval '30 days'
                order by finished_at limit $1 for update skip locked
           )
           delete from check_runs r using old where r.id = old.id"#,
        limit,
    )
    .execute(db)
    .await?
    .rows_affected())
}

/// The last check recorded, if any.
pub async fn last(db: impl sqlx::PgExecutor<'_>) -> sqlx::Result<Option<LastCheck>> {
    let row = sqlx::query!(
        r#"select kind, passed, finished_at, covered, verdicts,
                  extract(epoch from now() - finished_at)::bigint as "seconds_ago!"
             from check_runs order by finished_at desc limit 1"#
    )
    .fetch_optional(db)
    .await?;
    Ok(row.map(|r| LastCheck {
        kind: r.kind,
        passed: r.passed,
        finished_at: r
            .finished_at
            .to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        seconds_ago: r.seconds_ago,
        covered: r.covered,
        failed: r
            .verdicts
            .as_array()
            .into_iter()
            .flatten()
            .filter(|v| v["pass"] == false)
            .map(|v| {
                format!(
                    "{}: {}",
                    v["id"].as_str().unwrap_or("?"),
                    v["name"].as_str().unwrap_or("")
                )
            })
            .collect(),
    }))
}
