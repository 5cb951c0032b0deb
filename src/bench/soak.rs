//! `stockade bench --soak MINUTES`: does the shop stay as fast after an hour of sales as in
//! its first minute?
//!
//! Per workload, under one strategy: a fresh database and servers, the closed-loop peak
//! measured as a normal bench row, then an open loop at 80 % of that peak for `MINUTES`,
//! in windows of a minute. Each window is a [`SoakRow`]: latency from the scheduled start
//! (so a slowdown shows as latency, not as a lower offered rate), answers per second, the
//! servers' resident memory, the WAL written, and every table's size and dead tuples —
//! `stock`'s above all, the row every order updates. The [`SoakVerdict`] compares the last
//! minute's latency with the first's, and the last third's memory with the middle third's.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use sqlx::PgPool;

use super::db::{wal_position, wal_since};
use super::load::{Connections, Load, Schedule};
use super::rows::Row;
use super::{Bench, OPEN_LOOP_CONNECTIONS, Strategy, Workload, stop_all};
use crate::loadtest::check::{self, RedisTarget, Verdict};
use crate::loadtest::servers::ServerProcess;

/// Share of the measured peak the soak offers.
pub const SOAK_SHARE: f64 = 0.8;
/// The last minute's p99 may be at most this many times the first's.
pub const P99_GROWTH_LIMIT: f64 = 1.5;
/// After the first minutes, the servers' memory may grow by at most this share.
pub const RSS_GROWTH_LIMIT: f64 = 0.10;

/// One minute of a soak.
#[derive(Debug, Clone, Serialize)]
pub struct SoakRow {
    pub workload: Workload,
    pub strategy: String,
    /// 1 for the first minute.
    pub minute: u64,
    pub offered_rate: f64,
    /// From the minute's first scheduled request to its last answer.
    pub seconds: f64,
    /// Answers with the workload's expected status per second of that (orders, for
    /// orders): below the offered rate when answers fall behind.
    pub orders_per_s: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// Answers with another status, or none.
    pub errors: u64,
    /// Resident memory of the servers, summed, at the minute's end.
    pub rss_mb: f64,
    /// WAL the cluster wrote during the minute.
    pub wal_mb: Option<f64>,
    pub stock_dead_tuples: i64,
    /// `stock`'s size, table and indexes.
    pub stock_kb: f64,
    /// Every table of the database, largest first.
    pub tables: Vec<TableSize>,
}

/// A table's size at a minute's end.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct TableSize {
    pub name: String,
    pub live_tuples: i64,
    pub dead_tuples: i64,
    pub table_mb: f64,
    pub indexes_mb: f64,
}

/// The soak's targets, first minute against last.
#[derive(Debug, Clone, Serialize)]
pub struct SoakVerdict {
    pub workload: Workload,
    pub minutes: u64,
    pub first_p99_ms: f64,
    pub last_p99_ms: f64,
    /// `last_p99_ms ÷ first_p99_ms`; at most [`P99_GROWTH_LIMIT`].
    pub p99_growth: f64,
    /// The minutes memory is compared from, first and last: the soak's middle third, once
    /// allocators and caches have filled during the first.
    pub settled_minutes: (u64, u64),
    /// The servers' median memory over those minutes.
    pub settled_rss_mb: f64,
    /// The minutes memory is compared with: the last third.
    pub last_minutes: (u64, u64),
    /// The servers' median memory over those minutes.
    pub last_rss_mb: f64,
    /// `last ÷ settled − 1`; at most [`RSS_GROWTH_LIMIT`].
    pub rss_growth: f64,
    pub first_stock_kb: f64,
    pub max_stock_kb: f64,
    pub pass: bool,
}

impl SoakVerdict {
    fn of(workload: Workload, rows: &[SoakRow]) -> Option<Self> {
        let (first, last) = (rows.first()?, rows.last()?);
        let p99_growth = last.p99_ms / first.p99_ms.max(1e-3);
        // Memory by thirds, each its median: one minute's reading swings with the requests in
        // flight at that moment (±15 MB at 6,000 orders/s), while growth that goes on moves
        // a whole third.
        let third = (rows.len() / 3).max(1);
        let ending = &rows[rows.len() - third..];
        let settled = match &rows[rows.len().saturating_sub(2 * third)..rows.len() - third] {
            [] => ending, // a one-minute soak
            middle => middle,
        };
        let (settled_rss_mb, last_rss_mb) = (median_rss(settled), median_rss(ending));
        let rss_growth = last_rss_mb / settled_rss_mb.max(1e-3) - 1.0;
        let max_stock_kb = rows.iter().map(|r| r.stock_kb).fold(0.0, f64::max);
        // Bounded: a few pages more than at the start, not a table that grows with sales.
        let stock_bounded = max_stock_kb <= 2.0 * first.stock_kb + 64.0;
        Some(Self {
            workload,
            minutes: last.minute,
            first_p99_ms: first.p99_ms,
            last_p99_ms: last.p99_ms,
            p99_growth,
            settled_minutes: span(settled),
            settled_rss_mb,
            last_minutes: span(ending),
            last_rss_mb,
            rss_growth,
            first_stock_kb: first.stock_kb,
            max_stock_kb,
            pass: p99_growth <= P99_GROWTH_LIMIT && rss_growth <= RSS_GROWTH_LIMIT && stock_bounded,
        })
    }
}

/// The first and last minute of `rows`.
fn span(rows: &[SoakRow]) -> (u64, u64) {
    (rows[0].minute, rows[rows.len() - 1].minute)
}

/// The median of `rows`' memory.
fn median_rss(rows: &[SoakRow]) -> f64 {
    let mut mb: Vec<f64> = rows.iter().map(|r| r.rss_mb).collect();
    mb.sort_by(f64::total_cmp);
    let middle = mb.len() / 2;
    if mb.len().is_multiple_of(2) {
        (mb[middle - 1] + mb[middle]) / 2.0
    } else {
        mb[middle]
    }
}

/// What one workload's soak produced.
pub(super) struct Soaked {
    pub peak: Row,
    pub rows: Vec<SoakRow>,
    pub verdict: Option<SoakVerdict>,
    pub verdicts: Vec<Verdict>,
}

impl Bench<'_> {
    /// Soaks `workload` under `strategy` for `minutes` windows of `minute` each.
    pub(super) async fn soak(
        &self,
        admin: &PgPool,
        workload: Workload,
        strategy: &Strategy,
        minutes: u64,
        minute: Duration,
    ) -> anyhow::Result<Soaked> {
        let plan = self.plan;
        let (name, url, api_key) = self.database(workload, &strategy.name).await?;
        let prefix = format!("bench-{}:", uuid::Uuid::new_v4().simple());
        let env = self.server_env(&url, &prefix, workload, strategy);
        let mut servers = Vec::new();
        for _ in 0..plan.servers {
            servers.push(ServerProcess::start(&plan.server_exe, &env, &[]).await?);
        }
        let work = workload
            .work(plan.skus, plan.confirm_holds())
            .expect("soaked workloads send requests");
        let load = Load {
            targets: servers.iter().map(|s| s.address.clone()).collect(),
            work,
            timeout: Duration::from_secs(10),
            api_key,
        };
        let label = format!("{} · {} · peak", workload.name(), strategy.name);
        let peak = self
            .phases(admin, &load, plan.connections, Schedule::Closed, label)
            .await;
        let mut peak = peak.row(workload, &strategy.name, None);
        peak.default_strategy = strategy.default;
        let rate = (SOAK_SHARE * peak.rate).max(1.0);

        let db = PgPool::connect(&url).await?;
        if workload.expected_status() == 201 {
            let needed = rate * minute.as_secs_f64() * minutes as f64 * 1.2;
            restock_for(&db, needed).await?;
        }
        println!(
            "\nsoak: {} with {}, {rate:.0} requests/s (80 % of the peak {:.0}/s), \
             {minutes} × {} s",
            workload.name(),
            strategy.label(),
            peak.rate,
            minute.as_secs()
        );
        println!(
            "{:>6} {:>9} {:>8} {:>8} {:>7} {:>8} {:>8} {:>10} {:>9} {:>10}",
            "minute",
            "orders/s",
            "p50 ms",
            "p99 ms",
            "errors",
            "RSS MB",
            "WAL MB",
            "stock dead",
            "stock KB",
            "largest"
        );
        let mut connections = Connections::new(&load, OPEN_LOOP_CONNECTIONS);
        let mut rows = Vec::new();
        for n in 1..=minutes {
            let wal_before = wal_position(admin).await;
            let began = Instant::now();
            let measured = connections
                .run(
                    &load,
                    Schedule::Open { rate },
                    minute,
                    10 + n,
                    Arc::default(),
                )
                .await;
            // Until the last answer: a minute whose answers ran late is longer than one.
            let seconds = began.elapsed().as_secs_f64();
            let wal = wal_since(admin, wal_before).await;
            let tables = table_sizes(&db).await?;
            let stock = tables.iter().find(|t| t.name == "stock");
            let expected = measured.expected(workload.expected_status());
            let row = SoakRow {
                workload,
                strategy: strategy.name.clone(),
                minute: n,
                offered_rate: rate,
                seconds,
                orders_per_s: expected as f64 / seconds.max(1e-9),
                p50_ms: measured.ms(0.5),
                p99_ms: measured.ms(0.99),
                errors: measured.requests() - expected,
                rss_mb: servers.iter().filter_map(rss_mb).sum(),
                wal_mb: wal.map(|b| b as f64 / 1e6),
                stock_dead_tuples: stock.map_or(0, |s| s.dead_tuples),
                stock_kb: stock.map_or(0.0, |s| (s.table_mb + s.indexes_mb) * 1e3),
                tables,
            };
            println!("{}", line(&row));
            rows.push(row);
        }
        db.close().await;
        stop_all(servers).await;

        let verdicts = if workload.orders() {
            let db = PgPool::connect(&url).await?;
            let redis = RedisTarget {
                url: self.redis_url.clone(),
                prefix,
            };
            let verdicts =
                check::check(&db, None, Some(&redis), check::default_stale_after()).await;
            db.close().await;
            let verdicts = verdicts?;
            println!("\ninvariants after the soak:");
            check::print(&verdicts);
            verdicts
        } else {
            Vec::new()
        };
        super::db::wait_for_no_sessions(admin, &name).await;
        super::db::drop_database(admin, &name).await;
        peak.invariants = workload.orders().then(|| verdicts.iter().all(|v| v.pass));
        let verdict = SoakVerdict::of(workload, &rows);
        Ok(Soaked {
            peak,
            rows,
            verdict,
            verdicts,
        })
    }
}

/// A minute as the terminal shows it.
fn line(row: &SoakRow) -> String {
    let largest = row
        .tables
        .first()
        .map(|t| format!("{} {:.0} MB", t.name, t.table_mb + t.indexes_mb))
        .unwrap_or_default();
    format!(
        "{:>6} {:>9.0} {:>8.1} {:>8.1} {:>7} {:>8.0} {:>8} {:>10} {:>9.0} {largest}",
        row.minute,
        row.orders_per_s,
        row.p50_ms,
        row.p99_ms,
        row.errors,
        row.rss_mb,
        row.wal_mb.map_or("-".into(), |w| format!("{w:.0}")),
        row.stock_dead_tuples,
        row.stock_kb,
    )
}

/// Tops up every SKU with fewer than `needed` units, through the ledger, so a long soak
/// does not sell out.
async fn restock_for(db: &PgPool, needed: f64) -> anyhow::Result<()> {
    let needed = needed.min(f64::from(crate::inventory::db::MAX_ON_HAND)) as i32;
    // Runtime: the bench's own bookkeeping, on a fresh database.
    let short: Vec<(String, i32)> =
        sqlx::query_as("select sku, on_hand from stock where on_hand < $1 and on_hand > 0")
            .bind(needed)
            .fetch_all(db)
            .await?;
    for (sku, on_hand) in short {
        let sku = crate::catalog::Sku::parse(&sku)?;
        let mut tx = db.begin().await?;
        crate::inventory::db::restock(&mut tx, &sku, needed - on_hand, "soak", "bench").await?;
        tx.commit().await?;
    }
    Ok(())
}

/// Every table's size and tuples, largest first.
async fn table_sizes(db: &PgPool) -> anyhow::Result<Vec<TableSize>> {
    // Runtime: statistics views, read as the bench reads the server's.
    Ok(sqlx::query_as(
        r#"select c.relname::text as name,
                  coalesce(s.n_live_tup, 0) as live_tuples,
                  coalesce(s.n_dead_tup, 0) as dead_tuples,
                  pg_table_size(c.oid) / 1e6::float8 as table_mb,
                  pg_indexes_size(c.oid) / 1e6::float8 as indexes_mb
             from pg_class c
             join pg_namespace n on n.oid = c.relnamespace
             left join pg_stat_user_tables s on s.relid = c.oid
            where n.nspname = 'public' and c.relkind in ('r', 'p')
            order by pg_total_relation_size(c.oid) desc"#,
    )
    .fetch_all(db)
    .await?)
}

/// A server's resident memory, from `/proc`.
fn rss_mb(server: &ServerProcess) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{}/status", server.pid()?)).ok()?;
    let kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb / 1e3)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(rss_mb: &[f64]) -> Vec<SoakRow> {
        rss_mb
            .iter()
            .zip(1..)
            .map(|(&rss_mb, minute)| SoakRow {
                workload: Workload::HotSku,
                strategy: "batched".into(),
                minute,
                offered_rate: 100.0,
                seconds: 60.0,
                orders_per_s: 100.0,
                p50_ms: 5.0,
                p99_ms: 20.0,
                errors: 0,
                rss_mb,
                wal_mb: None,
                stock_dead_tuples: 0,
                stock_kb: 64.0,
                tables: Vec::new(),
            })
            .collect()
    }

    #[test]
    fn memory_that_rises_then_holds_passes_despite_a_high_last_minute() {
        // The shape of a 30-minute soak here: a rise over the first dozen minutes, then a
        // level with one-minute swings of ±15 MB, the last reading among the high ones.
        let mut mb = vec![70.0, 75.0, 78.0, 80.0, 77.0, 82.0, 85.0, 84.0, 88.0, 86.0];
        mb.extend([89.0, 104.0, 86.0, 90.0, 75.0, 89.0, 91.0, 88.0, 95.0, 89.0]);
        mb.extend([90.0, 87.0, 103.0, 89.0, 76.0, 92.0, 89.0, 88.0, 91.0, 108.0]);
        let verdict = SoakVerdict::of(Workload::HotSku, &rows(&mb)).unwrap();
        assert_eq!(
            (verdict.settled_minutes, verdict.last_minutes),
            ((11, 20), (21, 30))
        );
        assert_eq!((verdict.settled_rss_mb, verdict.last_rss_mb), (89.0, 89.5));
        assert!(verdict.pass, "{verdict:?}");
    }

    #[test]
    fn memory_that_keeps_growing_fails_however_small_each_minutes_step() {
        // 1 % a minute, never a jump: the last third's median is a tenth above the middle's.
        let mb: Vec<f64> = (0..30).map(|m| 80.0 * 1.01f64.powi(m)).collect();
        let verdict = SoakVerdict::of(Workload::HotSku, &rows(&mb)).unwrap();
        assert!(verdict.rss_growth > RSS_GROWTH_LIMIT, "{verdict:?}");
        assert!(!verdict.pass);
    }

    #[test]
    fn short_soaks_compare_what_they_have() {
        let verdict = SoakVerdict::of(Workload::HotSku, &rows(&[50.0, 60.0, 61.0])).unwrap();
        assert_eq!(
            (verdict.settled_minutes, verdict.last_minutes),
            ((2, 2), (3, 3))
        );
        let verdict = SoakVerdict::of(Workload::HotSku, &rows(&[50.0])).unwrap();
        assert_eq!(
            (verdict.settled_minutes, verdict.last_minutes),
            ((1, 1), (1, 1))
        );
        assert_eq!(verdict.rss_growth, 0.0);
        assert!(SoakVerdict::of(Workload::HotSku, &[]).is_none());
    }
}
