//! The report's latency-percentile plots: per workload, a line per row from p50 to the
//! slowest answer, drawn as inline SVG (no scripts, no network).

use super::rows::{QUANTILES, Row};

/// Where the plot's axes sit, in the SVG's own units.
const WIDTH: f64 = 640.0;
const HEIGHT: f64 = 260.0;
const LEFT: f64 = 56.0;
const RIGHT: f64 = 16.0;
const TOP: f64 = 12.0;
const BOTTOM: f64 = 28.0;

/// Line colours, told apart by the legend's names as well.
const COLOURS: [&str; 6] = [
    "#1f3a34", "#b42318", "#2f6fb0", "#b7791f", "#6b4fa3", "#2f7a4f",
];

/// One workload's plot.
pub struct Plot {
    pub workload: &'static str,
    /// What a screen reader says for it: each line's p50, p99 and slowest.
    pub description: String,
    pub lines: Vec<Line>,
    /// The y axis's marks: position and label (`1 ms`, `10 ms` …).
    pub y_marks: Vec<(f64, String)>,
    /// The x axis's marks: position and label.
    pub x_marks: Vec<(f64, &'static str)>,
    pub width: f64,
    pub height: f64,
    pub left: f64,
    pub bottom: f64,
    pub right: f64,
}

/// One row's line.
pub struct Line {
    pub label: String,
    pub colour: &'static str,
    /// SVG polyline points.
    pub points: String,
}

/// A plot per workload with latency percentiles, in the order the rows came.
pub fn plots(rows: &[Row]) -> Vec<Plot> {
    let mut workloads: Vec<&'static str> = Vec::new();
    for r in rows.iter().filter(|r| !r.percentiles.is_empty()) {
        if !workloads.contains(&r.workload.name()) {
            workloads.push(r.workload.name());
        }
    }
    workloads
        .into_iter()
        .map(|workload| {
            let rows: Vec<&Row> = rows
                .iter()
                .filter(|r| r.workload.name() == workload && !r.percentiles.is_empty())
                .collect();
            plot(workload, &rows)
        })
        .collect()
}

fn plot(workload: &'static str, rows: &[&Row]) -> Plot {
    let values = rows.iter().flat_map(|r| r.percentiles.iter().copied());
    let (low, high) = values.fold((f64::MAX, 0.0_f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
    // Whole decades around the data (latency spans them: 2 ms at p50, 900 ms at max).
    let low = 10f64.powf(low.max(0.01).log10().floor());
    let high = 10f64.powf(high.max(low * 10.0).log10().ceil());
    let y = |ms: f64| {
        let span = (high / low).log10();
        let up = (ms.max(low) / low).log10() / span;
        TOP + (1.0 - up) * (HEIGHT - TOP - BOTTOM)
    };
    let x = |i: usize| LEFT + i as f64 * (WIDTH - LEFT - RIGHT) / (QUANTILES.len() - 1) as f64;
    let mut y_marks = Vec::new();
    let mut mark = low;
    while mark <= high * 1.0001 {
        y_marks.push((y(mark), ms_label(mark)));
        mark *= 10.0;
    }
    let lines = rows
        .iter()
        .enumerate()
        .map(|(n, r)| Line {
            label: r.label(),
            colour: COLOURS[n % COLOURS.len()],
            points: r
                .percentiles
                .iter()
                .enumerate()
                .map(|(i, ms)| format!("{:.1},{:.1}", x(i), y(*ms)))
                .collect::<Vec<_>>()
                .join(" "),
        })
        .collect();
    let description = rows
        .iter()
        .map(|r| {
            let at = |q: usize| r.percentiles.get(q).copied().unwrap_or_default();
            format!(
                "{}: p50 {:.1} ms, p99 {:.1} ms, slowest {:.1} ms",
                r.label(),
                at(0),
                at(4),
                at(6)
            )
        })
        .collect::<Vec<_>>()
        .join("; ");
    Plot {
        workload,
        description: format!("Latency by percentile, {workload}. {description}."),
        lines,
        y_marks,
        x_marks: QUANTILES
            .iter()
            .enumerate()
            .map(|(i, (_, name))| (x(i), *name))
            .collect(),
        width: WIDTH,
        height: HEIGHT,
        left: LEFT,
        bottom: HEIGHT - BOTTOM,
        right: WIDTH - RIGHT,
    }
}

fn ms_label(ms: f64) -> String {
    if ms >= 1000.0 {
        format!("{} s", ms / 1000.0)
    } else if ms >= 1.0 {
        format!("{ms:.0} ms")
    } else {
        format!("{ms} ms")
    }
}

#[cfg(test)]
mod tests {
    use super::super::Workload;
    use super::super::load::Measured;
    use super::*;

    /// A row whose answers took `fast` ms, but for one in a hundred that took `slow` ms.
    fn row(strategy: &str, fast: u64, slow: u64) -> Row {
        let mut m = Measured::empty();
        m.seconds = 1.0;
        for i in 0..1000 {
            let ms = if i % 100 == 0 { slow } else { fast };
            m.record(201, std::time::Duration::from_millis(ms));
        }
        Row::of(Workload::HotSku, strategy, "closed", None, &m)
    }

    #[test]
    fn a_plot_per_workload_spans_whole_decades_and_a_slower_line_sits_higher() {
        let rows = [row("batched", 2, 300), row("redis-lock", 20, 900)];
        let plots = plots(&rows);
        assert_eq!(plots.len(), 1);
        let plot = &plots[0];
        let labels: Vec<&str> = plot.y_marks.iter().map(|(_, l)| l.as_str()).collect();
        assert_eq!(labels, ["1 ms", "10 ms", "100 ms", "1 s"]);
        let ys = |line: &Line| -> Vec<f64> {
            let points = line.points.split(' ');
            points
                .map(|p| p.split(',').nth(1).unwrap().parse().unwrap())
                .collect()
        };
        let (fast, slow) = (ys(&plot.lines[0]), ys(&plot.lines[1]));
        assert_eq!(fast.len(), QUANTILES.len());
        // SVG's y grows downwards: higher latency, smaller y, at every percentile.
        assert!(
            fast.iter().zip(&slow).all(|(f, s)| s < f),
            "{fast:?} {slow:?}"
        );
        // Each line climbs at its tail: the slowest answer above the median.
        assert!(fast[6] < fast[0] && slow[6] < slow[0]);
        assert!(plot.description.contains("redis-lock: p50 20.0 ms"));
    }

    #[test]
    fn rows_that_answered_nothing_draw_no_plot() {
        let empty = Row::of(
            Workload::HotSku,
            "batched",
            "closed",
            None,
            &Measured::empty(),
        );
        assert!(empty.percentiles.is_empty());
        assert!(plots(&[empty]).is_empty());
    }
}
