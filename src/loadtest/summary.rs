//! A run's figures from its client log: outcomes, acknowledged orders and units, latency
//! percentiles, and the timeline in up to 60 slices.

use std::collections::BTreeMap;

use hdrhistogram::Histogram;
use serde::Serialize;

use super::run::{LogEntry, Plan, Ran, behaviour_of, buyer_rng, lines_for};

/// One slice of the run's timeline; counts are per second.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Slice {
    /// Seconds since the start, at the slice's start.
    pub t: f64,
    pub requests_per_s: f64,
    pub created_per_s: f64,
    pub sold_out_per_s: f64,
    pub other_per_s: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
}

/// Everything a run produced.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RunResult {
    pub wall_seconds: f64,
    pub requests: u64,
    pub outcomes: BTreeMap<String, u64>,
    /// Orders acknowledged with 201 (distinct ids) and their units.
    pub orders_acknowledged: u64,
    pub units_acknowledged: i64,
    pub latency_ms: Percentiles,
    /// The run in up to 60 slices of 0.1 s to 10 s.
    pub timeline: Vec<Slice>,
    /// `(seconds since start, units available)` sampled during the run.
    pub stock: Vec<(f64, i64)>,
    pub offered_rate: Option<f64>,
    pub achieved_rate: f64,
    /// Buyers (or shoppers) who started.
    #[serde(default)]
    pub buyers: u64,
    #[serde(skip)]
    pub log: Vec<LogEntry>,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Percentiles {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
}

impl Percentiles {
    pub(super) fn of(h: &Histogram<u64>) -> Self {
        let ms = |v: u64| v as f64 / 1000.0;
        if h.is_empty() {
            return Self::default();
        }
        Self {
            p50: ms(h.value_at_quantile(0.5)),
            p90: ms(h.value_at_quantile(0.9)),
            p99: ms(h.value_at_quantile(0.99)),
            p999: ms(h.value_at_quantile(0.999)),
            max: ms(h.max()),
        }
    }
}

pub(super) fn summarise(plan: &Plan, ran: Ran) -> RunResult {
    let Ran {
        mut log,
        stock,
        wall,
        buyers_started,
        dispatch,
    } = ran;
    log.sort_by(|a, b| a.at_ms.total_cmp(&b.at_ms));
    let mut all = Histogram::<u64>::new_with_bounds(1, 600_000_000, 3).expect("valid bounds");
    let width = [0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .find(|w| wall.as_secs_f64() / w <= 60.0)
        .unwrap_or(30.0);
    let mut slices: BTreeMap<u64, ([u64; 4], Histogram<u64>)> = BTreeMap::new();
    let mut outcomes = BTreeMap::new();
    let mut acknowledged = BTreeMap::new();
    for entry in &log {
        let micros = (entry.latency_ms * 1e3).max(1.0) as u64;
        *outcomes.entry(entry.outcome.clone()).or_insert(0) += 1;
        let timed = entry.outcome != "abandoned";
        if timed {
            all.saturating_record(micros);
        }
        let (counts, hist) = slices
            .entry((entry.at_ms / 1e3 / width) as u64)
            .or_insert_with(|| {
                let hist = Histogram::new_with_bounds(1, 600_000_000, 2).expect("valid bounds");
                ([0; 4], hist)
            });
        counts[0] += 1;
        match entry.outcome.as_str() {
            "created" => counts[1] += 1,
            "sold-out" => counts[2] += 1,
            _ => counts[3] += 1,
        }
        if timed {
            hist.saturating_record(micros);
        }
        if entry.outcome == "created" && entry.kind != "hold" {
            acknowledged.insert(entry.id.clone().unwrap_or_default(), entry.buyer);
        }
    }
    let units_per_buyer = |buyer: u64| {
        let mut rng = buyer_rng(plan, buyer);
        let _ = behaviour_of(plan, &mut rng);
        lines_for(plan, buyer, &mut rng)
            .iter()
            .map(|(_, q)| q)
            .sum::<i64>()
    };
    RunResult {
        wall_seconds: wall.as_secs_f64(),
        requests: log.len() as u64,
        outcomes,
        orders_acknowledged: acknowledged.len() as u64,
        units_acknowledged: acknowledged.values().map(|b| units_per_buyer(*b)).sum(),
        latency_ms: Percentiles::of(&all),
        timeline: slices
            .into_iter()
            .map(|(i, (counts, hist))| {
                let p = Percentiles::of(&hist);
                let rate = |n: u64| n as f64 / width;
                Slice {
                    t: i as f64 * width,
                    requests_per_s: rate(counts[0]),
                    created_per_s: rate(counts[1]),
                    sold_out_per_s: rate(counts[2]),
                    other_per_s: rate(counts[3]),
                    p50_ms: p.p50,
                    p99_ms: p.p99,
                }
            })
            .collect(),
        stock,
        offered_rate: plan.rate,
        achieved_rate: buyers_started as f64 / dispatch.as_secs_f64().max(1e-9),
        buyers: buyers_started,
        log,
    }
}
