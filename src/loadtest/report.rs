//! The report of a run: a terminal summary, a JSON file, and a self-contained HTML page
//! with SVG charts (plotters) that needs no network to view.

use std::fmt::Write as _;
use std::path::Path;

use plotters::prelude::*;
use serde::Serialize;

use super::check::{SkuBalance, Verdict};
use super::summary::{RunResult, Slice};

/// One run of one strategy, with its verdicts.
#[derive(Debug, Clone, Serialize)]
pub struct StrategyRun {
    pub strategy: String,
    pub result: RunResult,
    pub verdicts: Vec<Verdict>,
    pub balances: Vec<SkuBalance>,
    /// The drop scenario's figures.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub drop: Option<super::drop::DropSection>,
    /// With `--payments`: charges against orders.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub payments: Option<super::pay::PaymentTally>,
}

impl StrategyRun {
    pub fn oversold(&self) -> i64 {
        self.balances.iter().map(SkuBalance::oversold).sum()
    }

    /// Every invariant held (and, in a drop, nobody held two places or bought without
    /// their own pass).
    pub fn passed(&self) -> bool {
        self.verdicts.iter().all(|v| v.pass)
            && self
                .drop
                .as_ref()
                .is_none_or(|d| d.admitted_twice == 0 && d.misuse_accepted == 0)
    }

    /// Orders per second over the whole run.
    pub fn orders_per_second(&self) -> f64 {
        self.result.orders_acknowledged as f64 / self.result.wall_seconds.max(1e-9)
    }
}

/// Everything written to `report.json`.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub title: String,
    pub scenario: String,
    pub parameters: serde_json::Value,
    pub runs: Vec<StrategyRun>,
}

/// The terminal summary.
pub fn summary(report: &Report) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "\n{}", report.title);
    let _ = writeln!(
        out,
        "{:<14} {:>8} {:>8} {:>9} {:>9} {:>8} {:>9} {:>9} {:>9} {:>9} {:>6}",
        "strategy",
        "requests",
        "orders",
        "oversold",
        "orders/s",
        "req/s",
        "p50 ms",
        "p90 ms",
        "p99 ms",
        "max ms",
        "check"
    );
    for run in &report.runs {
        let r = &run.result;
        let _ = writeln!(
            out,
            "{:<14} {:>8} {:>8} {:>9} {:>9.1} {:>8.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>6}",
            run.strategy,
            r.requests,
            r.orders_acknowledged,
            run.oversold(),
            run.orders_per_second(),
            r.requests as f64 / r.wall_seconds.max(1e-9),
            r.latency_ms.p50,
            r.latency_ms.p90,
            r.latency_ms.p99,
            r.latency_ms.max,
            if run.passed() { "PASS" } else { "FAIL" }
        );
    }
    for run in &report.runs {
        let r = &run.result;
        let outcomes: Vec<String> = r.outcomes.iter().map(|(k, v)| format!("{k} {v}")).collect();
        let _ = writeln!(
            out,
            "{}: {} in {:.1} s; answers: {}; p99.9 {:.1} ms",
            run.strategy,
            r.requests,
            r.wall_seconds,
            outcomes.join(", "),
            r.latency_ms.p999
        );
        if let Some(drop) = &run.drop {
            out.push_str(&super::drop::summary(&run.strategy, drop));
        }
        if let Some(payments) = &run.payments {
            out.push_str(&super::pay::summary(&run.strategy, payments));
        }
        if let Some(offered) = r.offered_rate {
            let _ = writeln!(
                out,
                "{}: open loop, offered {offered:.1} buyers/s, achieved {:.1} buyers/s (latency from intended start)",
                run.strategy, r.achieved_rate
            );
        }
    }
    out
}

/// Writes `report.json` and `report.html` into `dir`.
pub fn write(report: &Report, dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join("report.json"), serde_json::to_vec_pretty(report)?)?;
    std::fs::write(dir.join("report.html"), html(report)?)?;
    Ok(())
}

const COLOURS: [RGBColor; 4] = [
    RGBColor(31, 58, 52),
    RGBColor(196, 120, 20),
    RGBColor(155, 44, 44),
    RGBColor(60, 110, 180),
];

fn colour_of(strategy: &str, i: usize) -> RGBColor {
    match strategy {
        "naive-unsafe" => COLOURS[2],
        "pg-atomic" => COLOURS[1],
        "redis-lock" => COLOURS[0],
        "batched" => COLOURS[3],
        _ => COLOURS[i % COLOURS.len()],
    }
}

type Series<'a> = (&'a str, RGBColor, Vec<(f64, f64)>);

/// A line chart of several series as an SVG string.
fn line_chart(title: &str, y_label: &str, series: &[Series<'_>]) -> anyhow::Result<String> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (640, 300)).into_drawing_area();
        root.fill(&WHITE)?;
        let x_max = series
            .iter()
            .flat_map(|(_, _, p)| p.iter().map(|(x, _)| *x))
            .fold(1.0_f64, f64::max);
        let y_max = series
            .iter()
            .flat_map(|(_, _, p)| p.iter().map(|(_, y)| *y))
            .fold(1.0_f64, f64::max)
            * 1.1;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(56)
            .build_cartesian_2d(0.0..x_max, 0.0..y_max)?;
        chart
            .configure_mesh()
            .x_desc("seconds")
            .y_desc(y_label)
            .max_light_lines(0)
            .bold_line_style(RGBColor(235, 230, 220))
            .draw()?;
        for (name, colour, points) in series {
            let colour = *colour;
            chart
                .draw_series(LineSeries::new(
                    points.iter().copied(),
                    colour.stroke_width(2),
                ))?
                .label(*name)
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 18, y)], colour.stroke_width(2))
                });
        }
        if series.len() > 1 {
            chart
                .configure_series_labels()
                .background_style(WHITE.mix(0.85))
                .border_style(RGBColor(200, 200, 200))
                .position(SeriesLabelPosition::UpperRight)
                .draw()?;
        }
        root.present()?;
    }
    Ok(svg)
}

/// A bar chart with one bar per label.
fn bar_chart(title: &str, bars: &[(String, RGBColor, f64)]) -> anyhow::Result<String> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (640, 260)).into_drawing_area();
        root.fill(&WHITE)?;
        let y_max = bars.iter().map(|(_, _, v)| *v).fold(1.0_f64, f64::max) * 1.15;
        let n = bars.len().max(1);
        let labels: Vec<String> = bars.iter().map(|(l, _, _)| l.clone()).collect();
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(56)
            .build_cartesian_2d((0..n as i32 - 1).into_segmented(), 0.0..y_max)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(n)
            .x_label_formatter(&|v| match v {
                SegmentValue::CenterOf(i) => labels.get(*i as usize).cloned().unwrap_or_default(),
                _ => String::new(),
            })
            .light_line_style(TRANSPARENT)
            .bold_line_style(RGBColor(235, 230, 220))
            .draw()?;
        for (i, (_, colour, value)) in bars.iter().enumerate() {
            chart.draw_series(std::iter::once(Rectangle::new(
                [
                    (SegmentValue::Exact(i as i32), 0.0),
                    (SegmentValue::Exact(i as i32 + 1), *value),
                ],
                colour.filled(),
            )))?;
        }
        root.present()?;
    }
    Ok(svg)
}

/// One row of the HTML table, formatted.
struct HtmlRow {
    strategy: String,
    requests: u64,
    orders: u64,
    oversold: i64,
    orders_per_s: String,
    p50: String,
    p99: String,
    p999: String,
    max: String,
    passed: bool,
}

/// The HTML report (`templates/loadtest/report.html`): one file, inline CSS and SVG, no
/// scripts, no network.
#[derive(askama::Template)]
#[template(path = "loadtest/report.html")]
struct HtmlReport<'a> {
    title: &'a str,
    scenario: &'a str,
    rows: Vec<HtmlRow>,
    /// Bar charts side by side when several strategies ran.
    compare: Vec<String>,
    charts: Vec<String>,
    verdicts: &'a [StrategyRun],
    /// The drop scenario's sections, as the terminal shows them.
    drops: Vec<String>,
    parameters: String,
}

/// The HTML report of `report`.
pub fn html(report: &Report) -> anyhow::Result<String> {
    use askama::Template as _;
    let runs = &report.runs;
    let per_run = |f: &dyn Fn(&StrategyRun) -> Vec<(f64, f64)>| -> Vec<Series<'_>> {
        runs.iter()
            .enumerate()
            .map(|(i, r)| (r.strategy.as_str(), colour_of(&r.strategy, i), f(r)))
            .collect()
    };
    let timeline = |f: fn(&Slice) -> f64| {
        per_run(&|r| r.result.timeline.iter().map(|s| (s.t, f(s))).collect())
    };
    let mut charts = vec![
        line_chart(
            "Orders created per second",
            "orders/s",
            &timeline(|s| s.created_per_s),
        )?,
        line_chart(
            "Units available during the run",
            "units",
            &per_run(&|r| {
                r.result
                    .stock
                    .iter()
                    .map(|(t, v)| (*t, *v as f64))
                    .collect()
            }),
        )?,
        line_chart("Latency p50 over time", "ms", &timeline(|s| s.p50_ms))?,
        line_chart("Latency p99 over time", "ms", &timeline(|s| s.p99_ms))?,
        line_chart(
            "Requests answered per second",
            "requests/s",
            &timeline(|s| s.requests_per_s),
        )?,
    ];
    for (i, run) in runs.iter().enumerate() {
        let bars: Vec<(String, RGBColor, f64)> = run
            .result
            .outcomes
            .iter()
            .map(|(outcome, n)| (outcome.clone(), colour_of(&run.strategy, i), *n as f64))
            .collect();
        charts.push(bar_chart(
            &format!("Answers by outcome: {}", run.strategy),
            &bars,
        )?);
    }
    let mut compare = Vec::new();
    if runs.len() > 1 {
        let bars = |f: &dyn Fn(&StrategyRun) -> f64| -> Vec<(String, RGBColor, f64)> {
            runs.iter()
                .enumerate()
                .map(|(i, r)| (r.strategy.clone(), colour_of(&r.strategy, i), f(r)))
                .collect()
        };
        compare.push(bar_chart(
            "Units oversold",
            &bars(&|r| r.oversold() as f64),
        )?);
        compare.push(bar_chart(
            "Orders per second",
            &bars(&|r| r.orders_per_second()),
        )?);
        compare.push(bar_chart(
            "Latency p99 (ms)",
            &bars(&|r| r.result.latency_ms.p99),
        )?);
    }
    let rows = runs
        .iter()
        .map(|run| {
            let r = &run.result;
            HtmlRow {
                strategy: run.strategy.clone(),
                requests: r.requests,
                orders: r.orders_acknowledged,
                oversold: run.oversold(),
                orders_per_s: format!("{:.1}", run.orders_per_second()),
                p50: format!("{:.1}", r.latency_ms.p50),
                p99: format!("{:.1}", r.latency_ms.p99),
                p999: format!("{:.1}", r.latency_ms.p999),
                max: format!("{:.1}", r.latency_ms.max),
                passed: run.passed(),
            }
        })
        .collect();
    let page = HtmlReport {
        title: &report.title,
        scenario: &report.scenario,
        rows,
        compare,
        charts,
        verdicts: runs,
        drops: runs
            .iter()
            .filter_map(|r| Some(super::drop::summary(&r.strategy, r.drop.as_ref()?)))
            .collect(),
        parameters: serde_json::to_string_pretty(&report.parameters)?,
    };
    Ok(page.render()?)
}
