//! The bench's results: a terminal table, `bench.json`, and `bench.html` (an askama
//! template, self-contained: inline CSS, no scripts, no network).

use std::fmt::Write as _;
use std::path::Path;

use askama::Template;
use serde::Serialize;

use super::Plan;
use super::pgbench::PgbenchResult;
use super::rows::{Derived, PostgresInfo, Row};
use super::soak::{P99_GROWTH_LIMIT, RSS_GROWTH_LIMIT, SoakRow, SoakVerdict};

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
    for table in step_tables(report) {
        let title = format!("{} steps, p50 / p99 ms", table.workload);
        let _ = write!(out, "\n{title:<w$}", w = w + 14);
        for name in &table.names {
            let _ = write!(out, " {name:>15}");
        }
        let _ = writeln!(out);
        for (label, cells) in &table.rows {
            let _ = write!(out, "{label:<w$}", w = w + 14);
            for cell in cells {
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
    /// The ratio as a bar width, 0–100, on the table's scale (its largest ratio, at least
    /// 1×), so that 6.66× reads as six times 1×, not as a full 1×.
    bar: u32,
    /// Where 1× is on that scale, 0–100.
    one: u32,
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
    /// Per workload measured in steps (the storefront, the paid checkout): its steps.
    step_tables: Vec<StepTable>,
    /// Per workload: its rows' latency by percentile.
    plots: Vec<super::plot::Plot>,
    parameters: String,
    failures: Vec<String>,
}

/// The HTML report.
pub fn html(report: &BenchReport) -> anyhow::Result<String> {
    let scale = report
        .rows
        .iter()
        .filter_map(|r| r.ratio_to_pgbench)
        .fold(1.0_f64, f64::max);
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
                .map_or(0, |x| (x / scale * 100.0).clamp(0.0, 100.0) as u32),
            one: (100.0 / scale).round() as u32,
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
        step_tables: step_tables(report),
        plots: super::plot::plots(&report.rows),
        parameters: serde_json::to_string_pretty(&report.parameters)?,
        failures,
    };
    Ok(page.render()?)
}

/// One workload's steps: their names, and per row its label and each step's `p50 / p99`.
struct StepTable {
    workload: &'static str,
    names: Vec<String>,
    rows: Vec<(String, Vec<String>)>,
}

/// A table per workload measured in steps, in the order the rows came.
fn step_tables(report: &BenchReport) -> Vec<StepTable> {
    let mut tables: Vec<StepTable> = Vec::new();
    for r in report.rows.iter().filter(|r| !r.steps.is_empty()) {
        let cells = r.steps.iter();
        let cells = cells.map(|s| format!("{:.1} / {:.1}", s.p50_ms, s.p99_ms));
        let row = (r.label(), cells.collect());
        match tables.iter_mut().find(|t| t.workload == r.workload.name()) {
            Some(table) => table.rows.push(row),
            None => tables.push(StepTable {
                workload: r.workload.name(),
                names: r.steps.iter().map(|s| s.name.clone()).collect(),
                rows: vec![row],
            }),
        }
    }
    tables
}
