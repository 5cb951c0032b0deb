//! What a bench run measured, row by row: one workload under one strategy, its steps,
//! and the ratios derived from the rows; and the database server it all ran on.

use std::collections::BTreeMap;

use serde::Serialize;

use super::Workload;
use super::load::Measured;
use crate::loadtest::check::Verdict;

/// The quantiles every row's latency is read at, with the names the report gives them.
pub const QUANTILES: [(f64, &str); 7] = [
    (0.5, "p50"),
    (0.75, "p75"),
    (0.9, "p90"),
    (0.95, "p95"),
    (0.99, "p99"),
    (0.999, "p99.9"),
    (1.0, "max"),
];

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
    /// Latency in milliseconds at each of [`QUANTILES`] (empty when nothing
    /// was answered).
    pub percentiles: Vec<f64>,
    /// Answers with another status, or none.
    pub errors: u64,
    /// Answers by status (`0`: no answer).
    pub statuses: BTreeMap<String, u64>,
    /// pgbench's transactions/s for the same work.
    pub pgbench_tps: Option<f64>,
    /// `rate ÷ pgbench_tps`.
    pub ratio_to_pgbench: Option<f64>,
    /// `paid-checkout`: the payment provider's own rate for the same calls, alone.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provider_rate: Option<f64>,
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
            percentiles: match m.latency.is_empty() {
                true => Vec::new(),
                false => QUANTILES.iter().map(|(q, _)| m.ms(*q)).collect(),
            },
            errors: m.requests() - expected,
            statuses: m
                .statuses
                .iter()
                .map(|(s, n)| (s.to_string(), *n))
                .collect(),
            pgbench_tps: None,
            ratio_to_pgbench: None,
            provider_rate: None,
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
