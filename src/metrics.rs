//! Prometheus metrics of one process, served at `/metrics`. Each application has its own
//! registry, so several apps in one test process do not mix their numbers.

use prometheus::{
    Encoder, Gauge, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, Opts, Registry,
    TextEncoder,
};

/// Every metric Stockade exports.
pub struct Metrics {
    registry: Registry,
    /// Orders by outcome: placed, insufficient, replayed, busy, in_flight, key_reused,
    /// invalid, error.
    pub orders: IntCounterVec,
    /// Time spent waiting for SKU leases, granted or not.
    pub lease_wait: Histogram,
    /// Orders that gave up waiting for a lease.
    pub lease_timeouts: IntCounter,
    /// Requests answered from a stored idempotent response.
    pub idempotent_replays: IntCounter,
    /// Writes refused because a newer lease had written the stock row.
    pub stale_fences: IntCounter,
    /// 1 while Redis is unreachable and orders run on the database guard alone.
    pub degraded: IntGauge,
    /// The primary pool's connections, open or opening, and how many of them are idle
    /// (read when `/metrics` is served).
    pub db_pool_connections: IntGauge,
    pub db_pool_idle: IntGauge,
    pub db_leader_pool_connections: IntGauge,
    pub db_leader_pool_idle: IntGauge,
    /// Orders applied per `batched` transaction.
    pub batch_size: Histogram,
    /// Orders and holds refused by the rate limit (429), by the limiter that refused them
    /// (`redis`, or `process` while Redis is unreachable).
    pub rate_limited: IntCounterVec,
    /// Events not yet routed plus deliveries not yet sent (whole database, as this
    /// process's dispatcher last saw it).
    pub events_pending: IntGauge,
    /// Age in seconds of the oldest of them.
    pub events_oldest_pending: Gauge,
    /// Delivery attempts by this process, by outcome: sent, retry, failed.
    pub deliveries: IntCounterVec,
    /// From an event's commit to its delivery being accepted.
    pub event_delivery_latency: Histogram,
}

impl Metrics {
    pub fn new() -> Self {
        let registry =
            Registry::new_custom(Some("stockade".into()), None).expect("valid registry prefix");
        let orders = IntCounterVec::new(
            Opts::new("orders_total", "Order requests by outcome"),
            &["outcome"],
        )
        .expect("valid metric");
        let lease_wait = Histogram::with_opts(
            HistogramOpts::new("lease_wait_seconds", "Time spent waiting for SKU leases").buckets(
                vec![
                    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                ],
            ),
        )
        .expect("valid metric");
        let lease_timeouts = IntCounter::new(
            "lease_timeouts_total",
            "Orders that gave up waiting for a SKU lease",
        )
        .expect("valid metric");
        let idempotent_replays = IntCounter::new(
            "idempotent_replays_total",
            "Requests answered from a stored idempotent response",
        )
        .expect("valid metric");
        let stale_fences = IntCounter::new(
            "stale_fence_refusals_total",
            "Stock writes refused because a newer lease had written the row",
        )
        .expect("valid metric");
        let degraded = IntGauge::new(
            "lease_layer_degraded",
            "1 while Redis is unreachable and orders use the database guard alone",
        )
        .expect("valid metric");
        let db_pool_connections = IntGauge::new(
            "db_pool_connections",
            "Connections of the primary database pool, open or opening",
        )
        .expect("valid metric");
        let db_pool_idle = IntGauge::new(
            "db_pool_idle",
            "Idle connections of the primary database pool",
        )
        .expect("valid metric");
        let db_leader_pool_connections = IntGauge::new(
            "db_leader_pool_connections",
            "Connections of the group-commit leaders' own pool, open or opening \
             (0 while the leaders share the primary pool)",
        )
        .expect("valid metric");
        let db_leader_pool_idle = IntGauge::new(
            "db_leader_pool_idle",
            "Idle connections of the group-commit leaders' own pool",
        )
        .expect("valid metric");
        let batch_size = Histogram::with_opts(
            HistogramOpts::new("batch_size", "Orders applied per batched transaction")
                .buckets(vec![1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0]),
        )
        .expect("valid metric");
        let rate_limited = IntCounterVec::new(
            Opts::new(
                "rate_limited_total",
                "Orders and holds refused by the rate limit (429)",
            ),
            &["limiter"],
        )
        .expect("valid metric");
        let events_pending = IntGauge::new(
            "events_pending",
            "Events not yet routed plus webhook and mail deliveries not yet sent",
        )
        .expect("valid metric");
        let events_oldest_pending = Gauge::new(
            "events_oldest_pending_seconds",
            "Age of the oldest event or delivery still waiting",
        )
        .expect("valid metric");
        let deliveries = IntCounterVec::new(
            Opts::new(
                "event_deliveries_total",
                "Webhook and mail delivery attempts by outcome (sent, retry, failed)",
            ),
            &["outcome"],
        )
        .expect("valid metric");
        let event_delivery_latency = Histogram::with_opts(
            HistogramOpts::new(
                "event_delivery_latency_seconds",
                "From an event's commit to its delivery being accepted",
            )
            .buckets(vec![
                0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
            ]),
        )
        .expect("valid metric");
        for metric in [
            Box::new(orders.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(lease_wait.clone()),
            Box::new(lease_timeouts.clone()),
            Box::new(idempotent_replays.clone()),
            Box::new(stale_fences.clone()),
            Box::new(degraded.clone()),
            Box::new(db_pool_connections.clone()),
            Box::new(db_pool_idle.clone()),
            Box::new(db_leader_pool_connections.clone()),
            Box::new(db_leader_pool_idle.clone()),
            Box::new(batch_size.clone()),
            Box::new(rate_limited.clone()),
            Box::new(events_pending.clone()),
            Box::new(events_oldest_pending.clone()),
            Box::new(deliveries.clone()),
            Box::new(event_delivery_latency.clone()),
        ] {
            registry.register(metric).expect("metric registered once");
        }
        Self {
            registry,
            orders,
            lease_wait,
            lease_timeouts,
            idempotent_replays,
            stale_fences,
            degraded,
            db_pool_connections,
            db_pool_idle,
            db_leader_pool_connections,
            db_leader_pool_idle,
            batch_size,
            rate_limited,
            events_pending,
            events_oldest_pending,
            deliveries,
            event_delivery_latency,
        }
    }

    /// The text exposition format.
    pub fn render(&self) -> String {
        let mut out = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut out)
            .expect("encoding to memory");
        String::from_utf8(out).expect("metrics are UTF-8")
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}
