//! The comparisons below the bench's table: rates of one workload over another's under the
//! same strategy, the storefront's targets, and the open-loop lines beside pgbench's.

use super::Workload;
use super::pgbench;
use super::rows::{Derived, Row};

/// The storefront's target, per request: requests/s through the pages (each completed
/// checkout is [`super::storefront::STEPS`]' six) at least this share of the hot SKU's
/// API orders/s under the same strategy.
pub const STOREFRONT_TARGET: f64 = 1.0;
/// The storefront's target for each step's p99 in the open loop at 80 % of its peak.
pub const STEP_P99_TARGET_MS: f64 = 100.0;
/// Cold product pages/s at least this share of pgbench's selects of the same row.
pub const PRODUCT_PAGE_TARGET: f64 = 0.4;
/// Cold search pages/s at least this share of pgbench's runs of the same three queries.
pub const SEARCH_TARGET: f64 = 0.3;
/// Paid checkouts/s at least this share of the payment provider's own rate for the same
/// calls: Stockade must never be the bottleneck in front of a payment provider.
pub const PAID_CHECKOUT_TARGET: f64 = 0.8;
/// Sold-out answers/s at least this share of the refused ceiling.
pub const SOLD_OUT_TARGET: f64 = 0.3;

fn met(met: bool) -> &'static str {
    if met { "met" } else { "missed" }
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
    // Each strategy once, with its label (`default (batched)` when named so).
    let mut strategies: Vec<(&str, String)> = Vec::new();
    for row in rows {
        if !strategies.iter().any(|(s, _)| *s == row.strategy) {
            strategies.push((&row.strategy, row.strategy_label()));
        }
    }
    for (strategy, label) in strategies {
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
                    &format!("{name} ÷ hot SKU ({label})"),
                    value,
                    meaning,
                ));
            }
        }
        let per_checkout = super::storefront::STEPS.len() as f64;
        if let Some(value) = ratio(
            rate(Workload::Storefront, strategy).map(|r| r * per_checkout),
            rate(Workload::HotSku, strategy),
        ) {
            lines.push(Derived::ratio(
                &format!("storefront ÷ hot SKU ({label})"),
                value,
                &format!(
                    "requests/s through the shop's pages (completed checkouts × their six \
                     requests) over API orders/s of the same SKU; target ≥ \
                     {STOREFRONT_TARGET:.1}×: {}",
                    met(value >= STOREFRONT_TARGET)
                ),
            ));
        }
        let paid = rows.iter().find(|r| {
            r.workload == Workload::PaidCheckout && r.strategy == strategy && r.mode == "closed"
        });
        if let Some(value) = paid.and_then(|r| ratio(Some(r.rate), r.provider_rate)) {
            lines.push(Derived::ratio(
                &format!("paid-checkout ÷ provider ({label})"),
                value,
                &format!(
                    "paid checkouts/s (a hold, its payment, its confirmation: four provider \
                     calls) over the provider's own rate for the same four calls, alone; \
                     target ≥ {PAID_CHECKOUT_TARGET:.1}×: {}",
                    met(value >= PAID_CHECKOUT_TARGET)
                ),
            ));
        }
        if let Some(value) = ratio(rate(Workload::SoldOut, strategy), ceiling) {
            lines.push(Derived::ratio(
                &format!("sold-out ÷ refused ({label})"),
                value,
                &format!(
                    "409 answers/s over requests refused before any database or Redis \
                     work (the app's ceiling for an order request on this machine); \
                     target ≥ {SOLD_OUT_TARGET:.1}×: {}",
                    met(value >= SOLD_OUT_TARGET)
                ),
            ));
        }
        if let Some(value) = ratio(ceiling, rate(Workload::HotSku, strategy)) {
            lines.push(Derived::ratio(
                &format!("refused ÷ hot SKU ({label})"),
                value,
                "the most any sold-out ÷ hot SKU ratio can reach here: a sold-out answer \
                 cannot be cheaper than a request refused with no work at all",
            ));
        }
    }
    for (workload, name, detail, target) in [
        (
            Workload::ProductPage,
            "product page ÷ pgbench select",
            "HTML pages/s over the page's query alone",
            PRODUCT_PAGE_TARGET,
        ),
        (
            Workload::Search,
            "search page ÷ pgbench search",
            "catalogue pages searched for a word over the page's three queries alone",
            SEARCH_TARGET,
        ),
    ] {
        if let Some(value) = rows
            .iter()
            .find(|r| r.workload == workload && r.ratio_to_pgbench.is_some())
            .and_then(|r| r.ratio_to_pgbench)
        {
            lines.push(Derived::ratio(
                name,
                value,
                &format!("{detail}; target ≥ {target:.1}×: {}", met(value >= target)),
            ));
        }
    }
    let open = |workload| {
        rows.iter()
            .filter(move |r| r.mode == "open" && r.workload == workload)
    };
    for row in open(Workload::Storefront) {
        for step in &row.steps {
            lines.push(Derived {
                name: format!(
                    "open loop: storefront {}, {}",
                    step.name,
                    row.strategy_label()
                ),
                value: step.p99_ms,
                shown: format!("p99 {:.1} ms", step.p99_ms),
                detail: format!(
                    "at {:.0} checkouts/s (80 % of the closed loop's), from the click; \
                     target ≤ {STEP_P99_TARGET_MS:.0} ms: {}",
                    row.offered_rate.unwrap_or_default(),
                    met(step.p99_ms <= STEP_P99_TARGET_MS)
                ),
            });
        }
    }
    for row in open(Workload::HotSku) {
        lines.push(Derived {
            name: format!(
                "open loop: hot SKU, {} at {:.0}/s",
                row.strategy_label(),
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
                name: format!("open loop p99: hot SKU, {} ÷ pgbench", row.strategy_label()),
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
mod tests {
    use super::*;
    use crate::bench::load;
    use crate::bench::report::{BenchReport, summary};
    use crate::bench::rows::{PostgresInfo, Step};

    #[test]
    fn the_storefront_gets_its_ratio_to_orders_and_each_steps_open_loop_p99_against_targets() {
        let measured = |status: u16, n: u64, ms: u64| {
            let mut latency = hdrhistogram::Histogram::new(3).unwrap();
            latency.record(ms * 1000).unwrap();
            load::Measured {
                seconds: 1.0,
                statuses: [(status, n)].into(),
                latency,
            }
        };
        let mut hot = Row::of(
            Workload::HotSku,
            "batched",
            "closed",
            None,
            &measured(201, 1000, 5),
        );
        hot.default_strategy = true;
        let mut rows = vec![hot];
        for (mode, rate) in [("closed", None), ("open", Some(200.0))] {
            let mut row = Row::of(
                Workload::Storefront,
                "batched",
                mode,
                rate,
                &measured(303, 250, 40),
            );
            row.default_strategy = true;
            row.steps = vec![
                Step::of("product", 200, &measured(200, 250, 3)),
                Step::of("checkout", 303, &measured(303, 250, 150)),
            ];
            rows.push(row);
        }
        assert_eq!(rows[2].label(), "default (batched) (open 200/s)");
        let lines = derived_lines(&rows, &[]);
        let shown: Vec<(&str, &str)> = lines
            .iter()
            .map(|d| (d.name.as_str(), d.shown.as_str()))
            .collect();
        assert_eq!(
            shown,
            [
                ("storefront ÷ hot SKU (default (batched))", "1.50×"),
                (
                    "open loop: storefront product, default (batched)",
                    "p99 3.0 ms"
                ),
                (
                    "open loop: storefront checkout, default (batched)",
                    "p99 150.0 ms"
                ),
            ]
        );
        assert!(lines[0].detail.ends_with("target ≥ 1.0×: met"), "{lines:?}");
        assert!(
            lines[1].detail.ends_with("target ≤ 100 ms: met"),
            "{lines:?}"
        );
        assert!(
            lines[2].detail.ends_with("target ≤ 100 ms: missed"),
            "{lines:?}"
        );
        let table = summary(&BenchReport {
            title: "t".into(),
            postgres: PostgresInfo {
                version: "15".into(),
                fsync: "on".into(),
                synchronous_commit: "on".into(),
            },
            parameters: crate::bench::Plan {
                workloads: vec![],
                soak_minutes: None,
                soak_minute_s: 60,
                strategies: vec![],
                connections: 1,
                duration_s: 1,
                warmup_s: 0.0,
                skus: 1,
                open_loop_rate: None,
                servers: 1,
                pgbench_clients: 1,
                quick: true,
                server_exe: "stockade".into(),
                settings: vec![],
                quiet: true,
            },
            rows,
            pgbench: vec![],
            derived: lines,
            soak: vec![],
            soak_verdicts: vec![],
            passed: true,
        });
        assert!(
            table.contains("storefront    default (batched) (open 200/s)"),
            "{table}"
        );
        assert!(table.contains("3.0 / 3.0"), "{table}");
    }

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
        let names = |rows: &[Row]| -> Vec<String> {
            derived_lines(rows, &[])
                .into_iter()
                .map(|d| d.name)
                .collect()
        };
        assert_eq!(
            names(&rows),
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
        assert_eq!(
            names(&rows),
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
