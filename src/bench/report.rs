//! The bench's results: a terminal table, `bench.json`, and `bench.html` (an askama
//! template, self-contained: inline CSS, no scripts, no network).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use askama::Template;
use serde::Serialize;

use super::load::Measured;
use super::pgbench::PgbenchResult;
use super::soak::{P99_GROWTH_LIMIT, RSS_GROWTH_LIMIT, SoakRow, SoakVerdict};
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
    /// The strategy served with (`redis-lock`, `pg-atomic`, `batched`).
    pub strategy: String,
    /// Whether it was named as the build's `default` (shown as `default (batched)`).
    pub default_strategy: bool,
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
    /// The storefront's steps, each measured on its own (empty for other workloads, whose
    /// rows measure single requests).
    pub steps: Vec<Step>,
}

/// One step of the storefront's checkout: its own requests and latency.
#[derive(Debug, Clone, Serialize)]
pub struct Step {
    pub name: String,
    pub requests: u64,
    /// Answers with another status than the step's own, or none.
    pub errors: u64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

impl Step {
    pub fn of(name: &str, expected_status: u16, m: &Measured) -> Self {
        Self {
            name: name.to_string(),
            requests: m.requests(),
            errors: m.requests() - m.expected(expected_status),
            p50_ms: m.ms(0.5),
            p99_ms: m.ms(0.99),
            max_ms: m.ms(1.0),
        }
    }
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
            default_strategy: false,
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
            steps: Vec::new(),
        }
    }

    /// The strategy as the report shows it: `batched`, `default (batched)`.
    pub fn strategy_label(&self) -> String {
        super::args::label(&self.strategy, self.default_strategy)
    }

    /// The strategy column: the strategy, and an open loop's rate.
    pub fn label(&self) -> String {
        match self.offered_rate {
            Some(rate) if self.mode == "open" => {
                format!("{} (open {rate:.0}/s)", self.strategy_label())
            }
            _ => self.strategy_label(),
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
    /// `--soak`: a row per minute of each workload.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub soak: Vec<SoakRow>,
    /// `--soak`: each workload's first minute against its last.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub soak_verdicts: Vec<SoakVerdict>,
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
    // Wide enough for the longest label (`default (batched) (open 680/s)`).
    let w = report
        .rows
        .iter()
        .map(|r| r.label().chars().count())
        .max()
        .unwrap_or(0)
        .max(22);
    let _ = writeln!(
        out,
        "{:<13} {:<w$} {:>9} {:>8} {:>8} {:>7} {:>9} {:>7} {:>9} {:>8} {:>7} {:>10}",
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
            "{:<13} {:<w$} {:>9.0} {:>8.1} {:>8.1} {:>7} {:>9} {:>7} {:>9} {:>8} {:>7} {:>10}",
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
    let stepped: Vec<&Row> = report.rows.iter().filter(|r| !r.steps.is_empty()).collect();
    if let Some(first) = stepped.first() {
        let _ = write!(
            out,
            "\n{:<w$}",
            "storefront steps, p50 / p99 ms",
            w = w + 14
        );
        for step in &first.steps {
            let _ = write!(out, " {:>15}", step.name);
        }
        let _ = writeln!(out);
        for r in stepped {
            let _ = write!(out, "{:<w$}", r.label(), w = w + 14);
            for step in &r.steps {
                let cell = format!("{:.1} / {:.1}", step.p50_ms, step.p99_ms);
                let _ = write!(out, " {cell:>15}");
            }
            let _ = writeln!(out);
        }
    }
    if !report.derived.is_empty() {
        let _ = writeln!(out);
        let w = report
            .derived
            .iter()
            .map(|d| d.name.chars().count())
            .max()
            .unwrap_or(0)
            .max(44);
        for d in &report.derived {
            let _ = writeln!(out, "{:<w$} {:>12}   {}", d.name, d.shown, d.detail);
        }
    }
    for v in &report.soak_verdicts {
        let _ = writeln!(
            out,
            "\nsoak {} ({} minutes): {}\n  p99 {:.1} ms in the first minute, {:.1} ms in the \
             last: {:.2}× (target ≤ {P99_GROWTH_LIMIT}×)\n  servers' memory, median: {:.1} MB \
             over minutes {}–{}, {:.1} MB over {}–{}: {:+.1} % (target ≤ +{:.0} %)\n  stock \
             {:.0} KB at first, at most {:.0} KB",
            v.workload.name(),
            v.minutes,
            if v.pass {
                "targets met"
            } else {
                "targets MISSED"
            },
            v.first_p99_ms,
            v.last_p99_ms,
            v.p99_growth,
            v.settled_rss_mb,
            v.settled_minutes.0,
            v.settled_minutes.1,
            v.last_rss_mb,
            v.last_minutes.0,
            v.last_minutes.1,
            v.rss_growth * 100.0,
            RSS_GROWTH_LIMIT * 100.0,
            v.first_stock_kb,
            v.max_stock_kb,
        );
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
    /// The storefront's step names, and per row with steps its label and each step's
    /// `p50 / p99`.
    step_names: Vec<String>,
    steps: Vec<(String, Vec<String>)>,
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
    let stepped = || report.rows.iter().filter(|r| !r.steps.is_empty());
    let step_names = stepped()
        .next()
        .map(|r| r.steps.iter().map(|s| s.name.clone()).collect())
        .unwrap_or_default();
    let steps = stepped()
        .map(|r| {
            let cells = r.steps.iter();
            let cells = cells.map(|s| format!("{:.1} / {:.1}", s.p50_ms, s.p99_ms));
            (r.label(), cells.collect())
        })
        .collect();
    let page = ReportPage {
        report,
        rows,
        step_names,
        steps,
        parameters: serde_json::to_string_pretty(&report.parameters)?,
        failures,
    };
    Ok(page.render()?)
}
