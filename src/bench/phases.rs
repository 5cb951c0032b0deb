//! A request workload's phases under one strategy: a warm-up and the measured phase on
//! connections kept from one to the other, closed loop, and for the hot SKU under
//! `batched` the open loop as well.

use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;

use super::db::{per_request, wal_position, wal_since};
use super::load::{Connections, Live, Load, Measured, Schedule};
use super::rows::Row;
use super::{Bench, OPEN_LOOP_CONNECTIONS, Workload};

impl Bench<'_> {
    /// The closed loop of `load`'s requests, and for the hot SKU under `batched` the open
    /// loop; their rows and the requests sent in every phase.
    pub(super) async fn requests(
        &self,
        admin: &PgPool,
        load: &Load,
        workload: Workload,
        strategy: &str,
    ) -> (Row, Option<Row>, u64) {
        let plan = self.plan;
        let label = format!("{} · {strategy}", workload.name());
        let closed = self
            .phases(admin, load, plan.connections, Schedule::Closed, label)
            .await;
        let mut answered = closed.requests();
        let closed_row = closed.row(workload, strategy, None);
        let open = if workload == Workload::HotSku && strategy == "batched" {
            let rate = plan.open_loop_rate.unwrap_or(0.8 * closed_row.rate);
            // Connections kept open between requests, and a warm-up at the same rate.
            let label = format!("hot-sku · batched · open loop {rate:.0}/s");
            let schedule = Schedule::Open { rate };
            let open = self
                .phases(admin, load, OPEN_LOOP_CONNECTIONS, schedule, label)
                .await;
            answered += open.requests();
            Some(open.row(workload, strategy, Some(rate)))
        } else {
            None
        };
        (closed_row, open, answered)
    }

    /// A warm-up, then the measured phase, on `connections` connections kept from one to
    /// the other; the WAL written during the measured phase alone.
    pub(super) async fn phases(
        &self,
        admin: &PgPool,
        load: &Load,
        connections: usize,
        schedule: Schedule,
        label: String,
    ) -> Phases {
        let mut connections = Connections::new(load, connections);
        self.warm_then_measure(admin, label, async |duration, seed, live| {
            connections.run(load, schedule, duration, seed, live).await
        })
        .await
    }

    /// A warm-up, then the measured phase, each run by `phase` (given its length, its
    /// seed and what it counts as it goes); the WAL written during the measured phase
    /// alone.
    pub(super) async fn warm_then_measure<M>(
        &self,
        admin: &PgPool,
        label: String,
        mut phase: impl AsyncFnMut(Duration, u64, Arc<Live>) -> M,
    ) -> Phases<M> {
        let warmup = Duration::from_secs_f64(self.plan.warmup_s);
        let warm = phase(warmup, 1, Arc::default()).await;
        let duration = Duration::from_secs(self.plan.duration_s);
        let live = Arc::new(Live::default());
        let progress = self.progress(label, duration, live.clone());
        let wal_before = wal_position(admin).await;
        let measured = phase(duration, 2, live).await;
        let wal = wal_since(admin, wal_before).await;
        progress.finish();
        Phases {
            warm,
            measured,
            wal,
        }
    }
}

/// A load's warm-up and its measured phase, with the bytes of WAL written during the latter.
pub(super) struct Phases<M = Measured> {
    pub(super) warm: M,
    pub(super) measured: M,
    pub(super) wal: Option<i64>,
}

impl Phases {
    /// Requests sent in both phases.
    pub(super) fn requests(&self) -> u64 {
        self.warm.requests() + self.measured.requests()
    }

    /// The measured phase's row (`rate`: the open loop's schedule, `None` for closed).
    pub(super) fn row(&self, workload: Workload, strategy: &str, rate: Option<f64>) -> Row {
        let kind = if rate.is_some() { "open" } else { "closed" };
        let mut row = Row::of(workload, strategy, kind, rate, &self.measured);
        row.wal_per_request = per_request(self.wal, self.measured.requests());
        row
    }
}
