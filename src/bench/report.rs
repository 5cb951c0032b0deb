//! The bench's results: a terminal table, `bench.json`, and `bench.html` (an askama
//! template, self-contained: inline CSS, no scripts, no network).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use askama::Template;
use serde::Serialize;

use super::load::Measured;
use super::pgbench::{self, PgbenchResult};
use super::{Plan, Workload};
use crate::loadtest::check::Verdict;

/// The database server everything ran on.
#[derive(Debug, Clone, Serialize)]
pub struct PostgresInfo {
    pub version: String,
    pub fsync: String,
    pub synchronous_commit: String,
}

/// One workload under one strategy, closed or open loop.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub workload: Workload,
    pub strategy: String,
    /// `closed` (fixed connections) or `open` (fixed rate).
    pub mode: String,
    pub offered_rate: Option<f64>,
    pub seconds: f64,
    pub requests: u64,
    pub expected_status: u16,
    /// Answers with the expected status per second.
    pub rate: f64,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    /// Answers with another status, or none.
    pub errors: u64,
    /// Answers by status (`0`: no answer).
    pub statuses: BTreeMap<String, u64>,
    /// pgbench's transactions/s for the same work.
    pub pgbench_tps: Option<f64>,
    /// `rate ÷ pgbench_tps`.
    pub ratio_to_pgbench: Option<f64>,
    /// Database commits per request, over the server's whole run (warm-up included).
    pub commits_per_request: Option<f64>,
    /// Statements per request, when `pg_stat_statements` is available.
    pub statements_per_request: Option<f64>,
    /// Bytes of WAL the cluster wrote per request during the measured phase: what the
    /// disk must take per answer.
    pub wal_per_request: Option<f64>,
    /// Whether every invariant held afterwards (`None`: not an order workload).
    pub invariants: Option<bool>,
    pub verdicts: Vec<Verdict>,
}

impl Row {
    pub fn of(
        workload: Workload,
        strategy: &str,
        mode: &str,
        offered_rate: Option<f64>,
        m: &Measured,
    ) -> Self {
        let expected_status = workload.expected_status();
        let expected = m.expected(expected_status);
        Self {
            workload,
            strategy: strategy.to_string(),
            mode: mode.to_string(),
            offered_rate,
            seconds: m.seconds,
            requests: m.requests(),
            expected_status,
            rate: expected as f64 / m.seconds.max(1e-9),
            p50_ms: m.ms(0.5),
            p90_ms: m.ms(0.9),
            p99_ms: m.ms(0.99),
            max_ms: m.ms(1.0),
            errors: m.requests() - expected,
            statuses: m
                .statuses
                .iter()
                .map(|(s, n)| (s.to_string(), *n))
                .collect(),
            pgbench_tps: None,
            ratio_to_pgbench: None,
            commits_per_request: None,
            statements_per_request: None,
            wal_per_request: None,
            invariants: None,
            verdicts: Vec::new(),
        }
    }

    fn label(&self) -> String {
        match self.offered_rate {
            Some(rate) if self.mode == "open" => format!("{} (open {rate:.0}/s)", self.strategy),
            _ => self.strategy.clone(),
        }
    }
}

/// A comparison drawn from several rows.
#[derive(Debug, Clone, Serialize)]
pub struct Derived {
    pub name: String,
    pub value: f64,
    /// The value as printed.
    pub shown: String,
    pub detail: String,
}

impl Derived {
    pub fn ratio(name: &str, value: f64, detail: &str) -> Self {
        Self {
            name: name.to_string(),
            value,
            shown: format!("{value:.2}×"),
            detail: detail.to_string(),
        }
    }
}

/// Everything written to `bench.json`.
#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    pub title: String,
    pub postgres: PostgresInfo,
    pub parameters: Plan,
    pub rows: Vec<Row>,
    pub pgbench: Vec<PgbenchResult>,
    pub derived: Vec<Derived>,
    /// Every invariant held after every order workload.
    pub passed: bool,
}

fn opt(value: Option<f64>, digits: usize) -> String {
    value.map_or_else(|| "-".into(), |v| format!("{v:.digits$}"))
}

fn verdict(invariants: Option<bool>) -> &'static str {
    match invariants {
        Some(true) => "PASS",
        Some(false) => "FAIL",
        None => "-",
    }
}

/// The terminal table.
pub fn summary(report: &BenchReport) -> String {
    let mut out = String::new();
    let p = &report.postgres;
    let _ = writeln!(
        out,
        "\n{} (PostgreSQL {}, fsync {}, synchronous_commit {})",
        report.title, p.version, p.fsync, p.synchronous_commit
    );
    let _ = writeln!(
        out,
        "{:<13} {:<22} {:>9} {:>8} {:>8} {:>7} {:>9} {:>7} {:>9} {:>8} {:>7} {:>10}",
        "workload",
        "strategy",
        "req/s",
        "p50 ms",
        "p99 ms",
        "errors",
        "pgbench",
        "ratio",
        "commits/r",
        "stmts/r",
        "WAL B/r",
        "invariants"
    );
    for r in &report.rows {
        let _ = writeln!(
            out,
            "{:<13} {:<22} {:>9.0} {:>8.1} {:>8.1} {:>7} {:>9} {:>7} {:>9} {:>8} {:>7} {:>10}",
            r.workload.name(),
            r.label(),
            r.rate,
            r.p50_ms,
            r.p99_ms,
            r.errors,
            opt(r.pgbench_tps, 0),
            opt(r.ratio_to_pgbench, 2),
            opt(r.commits_per_request, 2),
            opt(r.statements_per_request, 1),
            opt(r.wal_per_request, 0),
            verdict(r.invariants),
        );
    }
    if !report.derived.is_empty() {
        let _ = writeln!(out);
        for d in &report.derived {
            let _ = writeln!(out, "{:<44} {:>12}   {}", d.name, d.shown, d.detail);
        }
    }
    out
}

/// Writes `bench.json` and `bench.html` into `dir`.
pub fn write(report: &BenchReport, dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join("bench.json"), serde_json::to_vec_pretty(report)?)?;
    std::fs::write(dir.join("bench.html"), html(report)?)?;
    Ok(())
}

/// One table row as the page shows it.
struct RowView {
    workload: &'static str,
    strategy: String,
    rate: String,
    p50: String,
    p99: String,
    errors: u64,
    pgbench: String,
    ratio: String,
    /// The ratio as a bar width, 0–100.
    bar: u32,
    commits: String,
    statements: String,
    wal: String,
    invariants: &'static str,
}

#[derive(Template)]
#[template(path = "bench/report.html")]
struct ReportPage<'a> {
    report: &'a BenchReport,
    rows: Vec<RowView>,
    parameters: String,
    failures: Vec<String>,
}

/// The HTML report.
pub fn html(report: &BenchReport) -> anyhow::Result<String> {
    let rows = report
        .rows
        .iter()
        .map(|r| RowView {
            workload: r.workload.name(),
            strategy: r.label(),
            rate: format!("{:.0}", r.rate),
            p50: format!("{:.1}", r.p50_ms),
            p99: format!("{:.1}", r.p99_ms),
            errors: r.errors,
            pgbench: opt(r.pgbench_tps, 0),
            ratio: opt(r.ratio_to_pgbench, 2),
            bar: r
                .ratio_to_pgbench
                .map_or(0, |x| (x * 100.0).clamp(0.0, 100.0) as u32),
            commits: opt(r.commits_per_request, 2),
            statements: opt(r.statements_per_request, 1),
            wal: opt(r.wal_per_request, 0),
            invariants: verdict(r.invariants),
        })
        .collect();
    let failures = report
        .rows
        .iter()
        .filter(|r| r.mode == "closed")
        .flat_map(|r| {
            r.verdicts.iter().filter(|v| !v.pass).map(move |v| {
                format!(
                    "{} / {}: {} {} ({} violations)",
                    r.workload.name(),
                    r.strategy,
                    v.id,
                    v.name,
                    v.violations
                )
            })
        })
        .collect();
    let page = ReportPage {
        report,
        rows,
        parameters: serde_json::to_string_pretty(&report.parameters)?,
        failures,
    };
    Ok(page.render()?)
}

/// The comparisons the table does not show at a glance.
pub(super) fn derived_lines(rows: &[Row], pgbench: &[pgbench::PgbenchResult]) -> Vec<Derived> {
    let rate = |workload: Workload, strategy: &str| {
        rows.iter()
            .find(|r| r.workload == workload && r.strategy == strategy && r.mode == "closed")
            .map(|r| r.rate)
    };
    let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    };
    // The refused workload runs once, under the first strategy: its rate is the ceiling of
    // every strategy's order requests.
    let ceiling = rows
        .iter()
        .find(|r| r.workload == Workload::Refused && r.mode == "closed")
        .map(|r| r.rate);
    let mut lines = Vec::new();
    if let Some(value) = ratio(
        rate(Workload::HotSku, "batched"),
        rate(Workload::HotSku, "redis-lock"),
    ) {
        lines.push(Derived::ratio(
            "hot SKU: batched ÷ redis-lock",
            value,
            "orders/s with group commit over orders/s with a lease per order",
        ));
    }
    let mut strategies: Vec<&str> = Vec::new();
    for row in rows {
        if !strategies.contains(&row.strategy.as_str()) {
            strategies.push(&row.strategy);
        }
    }
    for strategy in strategies {
        // Each of these workloads' rate over the hot SKU's orders, under one strategy.
        let beside_orders = [
            (
                Workload::HoldHot,
                "hold-hot",
                "holds/s (the checkout button) over orders/s of the same SKU",
            ),
            (
                Workload::Confirm,
                "confirm",
                "confirmations/s (\"Place order\") over orders/s of the same SKU",
            ),
            (
                Workload::SoldOut,
                "sold-out",
                "409 answers/s over orders/s: what refusing costs next to selling",
            ),
        ];
        for (workload, name, meaning) in beside_orders {
            if let Some(value) = ratio(rate(workload, strategy), rate(Workload::HotSku, strategy)) {
                lines.push(Derived::ratio(
                    &format!("{name} ÷ hot SKU ({strategy})"),
                    value,
                    meaning,
                ));
            }
        }
        if let Some(value) = ratio(rate(Workload::SoldOut, strategy), ceiling) {
            lines.push(Derived::ratio(
                &format!("sold-out ÷ refused ({strategy})"),
                value,
                "409 answers/s over requests refused before any database or Redis work \
                 (the app's ceiling for an order request on this machine)",
            ));
        }
        if let Some(value) = ratio(ceiling, rate(Workload::HotSku, strategy)) {
            lines.push(Derived::ratio(
                &format!("refused ÷ hot SKU ({strategy})"),
                value,
                "the most any sold-out ÷ hot SKU ratio can reach here: a sold-out answer \
                 cannot be cheaper than a request refused with no work at all",
            ));
        }
    }
    if let Some(row) = rows
        .iter()
        .find(|r| r.workload == Workload::ProductPage && r.ratio_to_pgbench.is_some())
    {
        lines.push(Derived::ratio(
            "product page ÷ pgbench select",
            row.ratio_to_pgbench.unwrap_or_default(),
            "HTML pages/s over the page's query alone",
        ));
    }
    for row in rows.iter().filter(|r| r.mode == "open") {
        lines.push(Derived {
            name: format!(
                "open loop: hot SKU, {} at {:.0}/s",
                row.strategy,
                row.offered_rate.unwrap_or_default()
            ),
            value: row.p99_ms,
            shown: format!("p99 {:.1} ms", row.p99_ms),
            detail: "latency from each request's scheduled start, at 80 % of the closed-loop \
                     rate unless --rate says otherwise"
                .into(),
        });
        let own = pgbench
            .iter()
            .find(|p| p.script == "order-hot-sku" && p.offered_rate.is_some());
        if let Some((pg, pg_p99)) = own.and_then(|p| Some((p, p.p99_ms?)))
            && pg_p99 > 0.0
        {
            lines.push(Derived {
                name: format!("open loop p99: hot SKU, {} ÷ pgbench", row.strategy),
                value: row.p99_ms / pg_p99,
                shown: format!("{:.2}×", row.p99_ms / pg_p99),
                detail: format!(
                    "each at the same share of its own closed-loop peak: the app {:.1} ms at \
                     {:.0}/s, pgbench {pg_p99:.1} ms at {:.0}/s on the same server and disk",
                    row.p99_ms,
                    row.offered_rate.unwrap_or_default(),
                    pg.offered_rate.unwrap_or_default()
                ),
            });
        }
    }
    lines
}

#[cfg(test)]
mod derived_tests {
    use super::*;
    use crate::bench::{Workload, load};

    #[test]
    fn each_strategy_gets_its_sold_out_lines_against_orders_and_the_ceiling() {
        let measured = |status: u16| load::Measured {
            seconds: 1.0,
            statuses: [(status, 10)].into(),
            latency: hdrhistogram::Histogram::new(3).unwrap(),
        };
        let mut rows = Vec::new();
        for workload in [Workload::HotSku, Workload::SoldOut] {
            for strategy in ["redis-lock", "batched"] {
                let m = measured(workload.expected_status());
                rows.push(Row::of(workload, strategy, "closed", None, &m));
            }
        }
        let names: Vec<String> = derived_lines(&rows, &[])
            .into_iter()
            .map(|d| d.name)
            .collect();
        assert_eq!(
            names,
            [
                "hot SKU: batched ÷ redis-lock",
                "sold-out ÷ hot SKU (redis-lock)",
                "sold-out ÷ hot SKU (batched)"
            ]
        );

        // The refused workload runs under the first strategy and serves every strategy.
        let refused = measured(Workload::Refused.expected_status());
        rows.push(Row::of(
            Workload::Refused,
            "redis-lock",
            "closed",
            None,
            &refused,
        ));
        let names: Vec<String> = derived_lines(&rows, &[])
            .into_iter()
            .map(|d| d.name)
            .collect();
        assert_eq!(
            names,
            [
                "hot SKU: batched ÷ redis-lock",
                "sold-out ÷ hot SKU (redis-lock)",
                "sold-out ÷ refused (redis-lock)",
                "refused ÷ hot SKU (redis-lock)",
                "sold-out ÷ hot SKU (batched)",
                "sold-out ÷ refused (batched)",
                "refused ÷ hot SKU (batched)"
            ]
        );
    }
}
