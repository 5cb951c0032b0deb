//! `stockade check`: the invariants I1–I8 (listed in the README), read from PostgreSQL (and
//! Redis, and the client log of a run when there is one). Each prints PASS or FAIL with
//! the rows that break it.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde::Serialize;
use sqlx::PgPool;

use super::run::LogEntry;
use crate::config::Settings;

/// The verdict on one invariant.
#[derive(Debug, Clone, Serialize)]
pub struct Verdict {
    pub id: &'static str,
    /// What holds, as [`statement`] says it; with the part a partial check reads.
    pub name: String,
    pub pass: bool,
    /// Offending rows, one line each (at most [`MAX_ROWS`] shown).
    pub rows: Vec<String>,
    /// How many offending rows there were in all.
    pub violations: usize,
    /// Why the invariant had nothing to judge (no drop ever ran, for I8): it neither
    /// passed nor failed, and is shown as "n/a" with this reason.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub not_applicable: Option<&'static str>,
}

impl Verdict {
    /// "PASS", "FAIL", or "n/a" when there was nothing to judge.
    pub fn word(&self) -> &'static str {
        match (self.not_applicable, self.pass) {
            (Some(_), _) => "n/a ",
            (None, true) => "PASS",
            (None, false) => "FAIL",
        }
    }
}

/// The verdict on invariant `id` where there was nothing to judge, and why.
pub(crate) fn not_applicable(id: &'static str, why: &'static str) -> Verdict {
    Verdict {
        not_applicable: Some(why),
        ..verdict(id, Vec::new())
    }
}

/// Most offending rows kept per invariant.
pub const MAX_ROWS: usize = 20;

/// What invariant `id` says, stated once for the full check and the quick one.
pub fn statement(id: &str) -> &'static str {
    match id {
        "I1" => "ledger conservation: initial + restocks − adjustments = on_hand + sold",
        "I2" => "no negative stock, no unit sold twice (oversell)",
        "I3" => "one order and one answer per idempotency key",
        "I4" => "every acknowledged order exists",
        "I5" => "no order for a request the client was told failed",
        "I6" => {
            "quiet state: no leases, idle transactions, expired active holds or stale in-flight keys"
        }
        "I7" => {
            "every order has exactly one order.placed event (within the event retention), and every such event an order"
        }
        "I8" => {
            "every hold and order of a drop's product, placed while the drop bound it, was placed by a shopper it admitted"
        }
        "I9" => {
            "money moved as orders say: each capture is one order's total (or refunded), each paid order captured, no authorization left open, each refund a cancelled order's"
        }
        _ => "an invariant not listed",
    }
}

/// The verdict on invariant `id`, from the rows that break it.
pub(crate) fn verdict(id: &'static str, rows: Vec<String>) -> Verdict {
    verdict_on(id, None, rows)
}

/// The verdict on the `part` of invariant `id` a partial check reads (`check --quick`).
pub(crate) fn verdict_on(id: &'static str, part: Option<&str>, mut rows: Vec<String>) -> Verdict {
    let violations = rows.len();
    rows.truncate(MAX_ROWS);
    let name = match part {
        Some(part) => format!("{} ({part})", statement(id)),
        None => statement(id).to_string(),
    };
    Verdict {
        id,
        name,
        pass: violations == 0,
        rows,
        violations,
        not_applicable: None,
    }
}

/// Per SKU: what was supplied, sold, and is on hand.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct SkuBalance {
    pub sku: String,
    /// initial + restocks ± adjustments + cancellations: every ledger movement but sales.
    pub supplied: i64,
    /// Units in order lines.
    pub sold: i64,
    pub on_hand: i32,
    pub reserved: i32,
    pub ledger_on_hand: i64,
    pub ledger_reserved: i64,
    /// Units the ledger records as sold.
    pub ledger_sold: i64,
}

impl SkuBalance {
    /// Units sold beyond what ever existed.
    pub fn oversold(&self) -> i64 {
        (self.sold - self.supplied).max(0)
    }
}

/// Stock, ledger and sales per SKU.
#[tracing::instrument(skip_all)]
pub async fn balances(db: impl sqlx::PgExecutor<'_>) -> sqlx::Result<Vec<SkuBalance>> {
    sqlx::query_as!(
        SkuBalance,
        r#"select s.sku, s.on_hand, s.reserved,
                  coalesce((select sum(m.delta) from stock_movements m
                             where m.sku = s.sku and m.reason <> 'order'), 0)::bigint as "supplied!",
                  coalesce((select sum(l.quantity) from order_lines l
                             where l.sku = s.sku), 0)::bigint as "sold!",
                  coalesce((select sum(m.delta) from stock_movements m where m.sku = s.sku), 0)::bigint
                      as "ledger_on_hand!",
                  coalesce((select sum(m.reserved_delta) from stock_movements m where m.sku = s.sku), 0)::bigint
                      as "ledger_reserved!",
                  coalesce((select -sum(m.delta) from stock_movements m
                             where m.sku = s.sku and m.reason = 'order'), 0)::bigint as "ledger_sold!"
             from stock s
            order by s.sku"#,
    )
    .fetch_all(db)
    .await
}

/// Where to look for leftover lease keys.
#[derive(Debug, Clone)]
pub struct RedisTarget {
    pub url: String,
    pub prefix: String,
}

/// How long the servers trust an in-flight idempotency record, with default settings: a
/// record older than this when all is quiet belongs to a request that died (I6).
pub fn default_stale_after() -> Duration {
    crate::checkout::stale_after(&Settings::default())
}

/// Keys the client was given contradicting definite answers for: created under two ids, or
/// created once and refused (sold out, rejected) another time. Transient answers (in
/// flight, busy, no answer) decide nothing and are left out. Each kind of request counts
/// apart: a changed body under a used key is logged as its own kind, `order-changed`.
fn contradictions(log: &[LogEntry]) -> Vec<String> {
    let mut answers: BTreeMap<(&str, &str), BTreeSet<String>> = BTreeMap::new();
    for e in log {
        let answer = match e.outcome.as_str() {
            "created" => format!("{} {}", e.status, e.id.as_deref().unwrap_or("without id")),
            "sold-out" | "rejected" => format!("{} {}", e.status, e.outcome),
            _ => continue,
        };
        answers.entry((&e.kind, &e.key)).or_default().insert(answer);
    }
    answers
        .into_iter()
        .filter(|(_, answers)| answers.len() > 1)
        .map(|((kind, key), answers)| {
            let answers: Vec<String> = answers.into_iter().collect();
            format!("{kind} key {key}: answered {}", answers.join(" and "))
        })
        .collect()
}

/// Checks I1–I7. `log` is the client log of a run (I4, I5 and part of I3 need it); `redis`
/// is where the servers keep their leases, and `stale_after` how long they trust an
/// in-flight idempotency record (both for I6).
#[tracing::instrument(skip_all)]
pub async fn check(
    db: &PgPool,
    log: Option<&[LogEntry]>,
    redis: Option<&RedisTarget>,
    stale_after: Duration,
) -> anyhow::Result<Vec<Verdict>> {
    // Redis first: a session waiting on it inside the transaction would sit idle in
    // transaction meanwhile (which a PgBouncer set up by `stockade cluster` ends after 2 s).
    let leases: Vec<String> = match redis {
        Some(target) => crate::locking::Redis::connect_lazy(&target.url, &target.prefix)?
            .held_leases()
            .await?
            .into_iter()
            .map(|k| format!("lease key {k} left behind"))
            .collect(),
        None => Vec::new(),
    };
    // Then one snapshot for every check, so verdicts on a database still being written
    // agree with each other; and no JIT, whose compiling costs more than these whole-table
    // queries do.
    let mut tx = db.begin().await?;
    sqlx::query("set transaction isolation level repeatable read, read only")
        .execute(&mut *tx)
        .await?;
    sqlx::query("set local jit = off").execute(&mut *tx).await?;
    let balances = balances(&mut *tx).await?;
    let mut verdicts = Vec::new();

    // I1: conservation — the ledger sums to the stock row; sales match order lines.
    let rows = conservation_rows(&balances);
    verdicts.push(verdict("I1", rows));

    // I2: never below zero, never more sold than existed.
    let rows = level_rows(&balances);
    verdicts.push(verdict("I2", rows));

    // I3: at most one order per idempotency key, and one answer: the client was never told
    // two different things about one request.
    let mut rows: Vec<String> = sqlx::query!(
        r#"select idempotency_scope, idempotency_key, count(*) as "orders!" from orders
            group by 1, 2 having count(*) > 1"#,
    )
    .fetch_all(&mut *tx)
    .await?
    .into_iter()
    .map(|r| {
        format!(
            "{}/{}: {} orders",
            r.idempotency_scope, r.idempotency_key, r.orders
        )
    })
    .collect();
    if let Some(log) = log {
        rows.extend(contradictions(log));
    }
    verdicts.push(verdict("I3", rows));

    if let Some(log) = log {
        // I4: every acknowledged order exists.
        let acknowledged: BTreeSet<uuid::Uuid> = log
            .iter()
            .filter(|e| e.status == 201 && e.kind != "hold")
            .filter_map(|e| e.id.as_deref()?.parse().ok())
            .collect();
        let ids: Vec<uuid::Uuid> = acknowledged.iter().copied().collect();
        let found: BTreeSet<uuid::Uuid> =
            sqlx::query_scalar!("select id from orders where id = any($1)", &ids)
                .fetch_all(&mut *tx)
                .await?
                .into_iter()
                .collect();
        let rows = acknowledged
            .difference(&found)
            .map(|id| format!("order {id} was acknowledged with 201 but does not exist"))
            .collect();
        verdicts.push(verdict("I4", rows));

        // I5: a key the client was definitely refused on (and never told "created") has no
        // order; keys that only ever saw no answer may go either way. (Only the first body
        // sent under a key counts: a later changed body is logged as `order-changed`.)
        let mut per_key: BTreeMap<&str, (bool, bool)> = BTreeMap::new();
        for e in log.iter().filter(|e| e.kind == "order") {
            let (created, refused) = per_key.entry(e.key.as_str()).or_default();
            *created |= e.outcome == "created";
            *refused |= matches!(e.outcome.as_str(), "sold-out" | "rejected");
        }
        let refused: Vec<&str> = per_key
            .iter()
            .filter(|(_, (created, refused))| *refused && !created)
            .map(|(key, _)| *key)
            .collect();
        // The log has the keys as sent; the database as `<API client>:<key>`.
        let rows = sqlx::query!(
            r#"select idempotency_key, id from orders
                where idempotency_scope = 'api'
                  and substr(idempotency_key, strpos(idempotency_key, ':') + 1) = any($1)"#,
            &refused as &[&str],
        )
        .fetch_all(&mut *tx)
        .await?
        .into_iter()
        .map(|r| {
            format!(
                "key {} was refused, yet order {} exists",
                r.idempotency_key, r.id
            )
        })
        .collect();
        verdicts.push(verdict("I5", rows));
    }

    // I6: quiet state — no leases left, no idle transactions, no expired holds still active,
    // no request still in flight long after any request could be.
    let mut rows = stuck_work(&mut tx, Duration::from_secs(5), stale_after).await?;
    rows.extend(
        // Between two statements of a live transaction (a dispatcher's or a sweeper's
        // pass) a session is idle in transaction for a moment; one left there for seconds
        // is stuck.
        sqlx::query_scalar!(
            r#"select format('session %s idle in transaction since %s', pid, state_change)
                      as "problem!"
                 from pg_stat_activity
                where state like 'idle in transaction%' and datname = current_database()
                  and state_change < now() - interval '2 seconds'
                  and pid <> pg_backend_pid()"#,
        )
        .fetch_all(&mut *tx)
        .await?,
    );
    rows.extend(leases);
    verdicts.push(verdict("I6", rows));

    // I7: the outbox — every order announced exactly once, and no announcement of an
    // order that does not exist (one written by a transaction that rolled back). Not asked
    // of a database migrated by a build that had no outbox (`stockade bench --server-exe`).
    let has_outbox = sqlx::query_scalar!(r#"select to_regclass('events') is not null as "has!""#)
        .fetch_one(&mut *tx)
        .await?;
    if !has_outbox {
        tx.rollback().await?;
        return Ok(verdicts);
    }
    // Events past their retention are purged once delivered, so only orders within it
    // are asked for theirs (the window as this process's environment sets it).
    let retention = Settings::from_env()
        .unwrap_or_default()
        .event_retention_days;
    let rows = sqlx::query_scalar!(
        r#"select format('order %s has %s order.placed events', o.id, count(e.id)) as "problem!"
             from orders o
             left join events e on e.type = 'order.placed' and e.payload->>'order_id' = o.id::text
            where o.created_at > now() - make_interval(days => $1)
            group by o.id having count(e.id) <> 1
           union all
           select format('order.placed event %s is for order %s, which does not exist',
                         e.id, e.payload->>'order_id')
             from events e
            where e.type = 'order.placed'
              and not exists (select 1 from orders o where o.id::text = e.payload->>'order_id')"#,
        i32::try_from(retention).unwrap_or(i32::MAX),
    )
    .fetch_all(&mut *tx)
    .await?;
    verdicts.push(verdict("I7", rows));
    let has_drops = sqlx::query_scalar!(r#"select to_regclass('drops') is not null as "has!""#)
        .fetch_one(&mut *tx)
        .await?;
    if has_drops {
        let any = sqlx::query_scalar!(r#"select exists (select 1 from drops) as "any!""#)
            .fetch_one(&mut *tx)
            .await?;
        verdicts.push(match any {
            true => verdict("I8", without_pass(&mut tx).await?),
            false => not_applicable("I8", "no drop was ever scheduled in this database"),
        });
    }
    tx.rollback().await?;
    Ok(verdicts)
}

/// I8's rows: holds and orders (not those confirming a hold: the hold is checked) of a
/// drop's product placed from the moment it bound the product until it ended, whose key
/// owner (a browser, an API client) had no admission of that drop by then. The margin
/// allows for Redis's clock, which times admissions, running ahead of PostgreSQL's.
async fn without_pass(conn: &mut sqlx::PgConnection) -> sqlx::Result<Vec<String>> {
    sqlx::query_scalar!(
        r#"with bound as (
               select id, sku, binds_at, coalesce(ended_at, 'infinity') as until from drops
           ), placed as (
               select 'order' as kind, o.id, l.sku, o.created_at as at,
                      split_part(o.idempotency_key, ':', 1) as owner
                 from bound d
                 join order_lines l on l.sku = d.sku
                 join orders o on o.id = l.order_id
                where o.idempotency_scope <> 'hold'
               union all
               select 'hold', h.id, hl.sku, h.created_at, split_part(h.idempotency_key, ':', 1)
                 from bound d
                 join hold_lines hl on hl.sku = d.sku
                 join holds h on h.id = hl.hold_id
           )
           select distinct format('%s %s of %s at %s by %s: drop %s admitted nobody of that key owner by then',
                         p.kind, p.id, p.sku, p.at, p.owner, d.id) as "problem!"
             from bound d
             join placed p on p.sku = d.sku and p.at >= d.binds_at and p.at < d.until
            where not exists (select 1 from drop_admissions a
                               where a.drop_id = d.id and a.key_owner = p.owner
                                 and a.admitted_at <= p.at + interval '5 seconds')"#
    )
    .fetch_all(conn)
    .await
}

/// I1's rows: each SKU whose stock row disagrees with its ledger, or whose order lines
/// disagree with the ledger's sales.
pub(crate) fn conservation_rows(balances: &[SkuBalance]) -> Vec<String> {
    balances
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
            if b.sold != b.ledger_sold {
                problems.push(format!(
                    "{} units in orders but {} sold in the ledger",
                    b.sold, b.ledger_sold
                ));
            }
            (!problems.is_empty()).then(|| format!("{}: {}", b.sku, problems.join("; ")))
        })
        .collect()
}

/// I2's rows: stock below zero or reserved beyond what is on hand, and SKUs sold beyond
/// what was ever supplied.
pub(crate) fn level_rows(balances: &[SkuBalance]) -> Vec<String> {
    let mut rows: Vec<String> = balances
        .iter()
        .filter(|b| b.on_hand < 0 || b.reserved < 0 || b.reserved > b.on_hand)
        .map(|b| format!("{}: on_hand {}, reserved {}", b.sku, b.on_hand, b.reserved))
        .collect();
    rows.extend(balances.iter().filter(|b| b.oversold() > 0).map(|b| {
        format!(
            "{}: oversold by {} ({} sold, {} ever supplied)",
            b.sku,
            b.oversold(),
            b.sold,
            b.supplied
        )
    }));
    rows
}

/// Holds still active `grace` past their expiry, and requests in flight for longer than
/// `stale`: I6's rows about work left undone (a quiet database is asked with a short
/// grace; a live shop, by `--quick`, with a minute more).
pub(crate) async fn stuck_work(
    conn: &mut sqlx::PgConnection,
    grace: Duration,
    stale: Duration,
) -> sqlx::Result<Vec<String>> {
    let mut rows: Vec<String> = sqlx::query_scalar!(
        r#"select format('%s hold(s) expired but still active, the oldest since %s',
                         count(*), min(expires_at)) as "problem!"
             from holds where state = 'active' and expires_at < now() - make_interval(secs => $1)
           having count(*) > 0"#,
        grace.as_secs_f64(),
    )
    .fetch_all(&mut *conn)
    .await?;
    rows.extend(
        sqlx::query_scalar!(
            r#"select format('idempotency key %s/%s in flight since %s', scope, key, locked_at)
                      as "problem!"
                 from idempotency_keys
                where state = 'in_flight' and locked_at < now() - make_interval(secs => $1)
                order by locked_at"#,
            stale.as_secs_f64(),
        )
        .fetch_all(&mut *conn)
        .await?,
    );
    Ok(rows)
}

/// Prints each verdict; returns whether all passed.
pub fn print(verdicts: &[Verdict]) -> bool {
    for v in verdicts {
        println!("{} {}  {}", v.word(), v.id, v.name);
        if let Some(why) = v.not_applicable {
            println!("       not applicable: {why}");
        }
        for row in &v.rows {
            println!("       {row}");
        }
        if v.violations > v.rows.len() {
            println!("       … and {} more", v.violations - v.rows.len());
        }
    }
    verdicts.iter().all(|v| v.pass)
}
