//! Stockade: an inventory and checkout-reservation web app that never oversells.
//!
//! Read in this order: [`startup`] wires everything, [`http`] holds every route,
//! [`checkout`] places orders and holds, [`inventory`] guards stock, [`catalog`] describes what is for sale.
#![forbid(unsafe_code)]

/// Shipping addresses, checked field by field, and the countries they may name.
pub mod address;
/// Admins: accounts, password hashes, sessions, login throttling.
pub mod admin;
/// `stockade bench`: the app's rates next to PostgreSQL's own (pgbench), one machine, one run.
pub mod bench;
/// What is for sale: products, SKUs, prices, pictures.
pub mod catalog;
/// Checkout: placing an order or a hold without overselling or doubling (the argument).
pub mod checkout;
/// What Stockade starts: ports never given twice, children that never outlive it, starts
/// that fail at once when a daemon dies.
pub mod children;
/// Command-line interface: `serve`, `migrate`, `seed`.
pub mod cli;
/// API clients: their keys, rate-limit overrides, and what each may read.
pub mod clients;
/// Settings: defaults in code, then `STOCKADE_*` environment variables.
/// The shop's time zone, in which people read times.
pub mod clock;
/// `stockade cluster`: HAProxy, app processes, PgBouncer, a PostgreSQL replica, Redis
/// with Sentinel, all as child processes.
pub mod cluster;
pub mod config;

#[cfg(test)]
mod doc_paths;
/// Drops: a product released at a set time through a waiting room.
pub mod drops;
/// The one application error and how it becomes a status code.
pub mod error;
/// Events out: the transactional outbox, signed webhooks with retries, receipts by email.
pub mod events;
/// Checkout holds: stock reserved for a while, confirmed once, released on expiry.
pub mod holds;
/// Everything that speaks HTTP: routes, pages, API, health.
pub mod http;
/// Idempotency keys: claim, replay, complete, purge.
pub mod idempotency;
/// Stock levels and the append-only ledger of every movement.
pub mod inventory;
pub mod lane;
/// The module graph, checked (tests only).
#[cfg(test)]
mod layering;
/// The load tester, the invariant checker and the report.
pub mod loadtest;
/// Local mode: PostgreSQL and Redis as child processes.
pub mod local;
/// Redis: the shared connection and the per-SKU leases.
pub mod locking;
/// Prometheus metrics of one process.
pub mod metrics;
/// Orders: placed orders, their lines, cancelling one.
pub mod orders;
/// Payments: each hold's one Stripe PaymentIntent, authorized then captured after the order.
pub mod payments;
/// Which PostgreSQL failures are passing ones (worth a retry, or a 503).
pub mod pg;
/// Rate limits on placing orders and holds: GCRA in Redis, per process when Redis is away.
pub mod ratelimit;
/// Retention: what each table that grows with traffic keeps, and the purge.
pub mod retention;
/// The demo shop: its products, pictures and opening stock.
pub mod seed;
/// `Application::build`: pools, migrations, the HTTP server.
pub mod startup;
/// Tracing subscriber: pretty for people, JSON for machines.
pub mod telemetry;
/// Checks on free text from clients (no control characters), shared by every parser.
pub mod text;
/// The verdicts of `stockade check` the dashboard shows.
pub mod verdicts;

/// Chooses the TLS implementation (rustls with *ring*) for every outgoing https and SMTP
/// connection: webhooks, receipts, the load tool. Called before any client is built;
/// calling it again does nothing.
pub fn install_tls_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}
