//! Checkout: the one way stock leaves the shelf on a shopper's request, as an order
//! ([`place_order`]) or as a hold that sets it aside for a while ([`place_hold`]); pages and
//! the JSON API both come here. This page is the whole argument for why it never oversells
//! and never places one request twice.
//!
//! **The request** arrives parsed ([`OrderRequest`]): SKUs checked, quantities within the
//! cap, lines merged per SKU and sorted by it, contact details checked. Unknown SKUs are
//! refused before anything is stored.
//!
//! **Placing** (in `place.rs`) takes these steps, for an order and a hold alike; a
//! [`Kind`](kind::Kind) (an order, a hold) says only what differs between the two:
//!
//! 1. *claim check*: a key already decided is answered from its record — the stored
//!    answer replayed, 422 ([`OrderError::KeyReused`]) for another request under it,
//!    409 ([`OrderError::InFlight`]) while another request is working on it;
//! 2. *early check*: a plain read answers "not enough stock" at once when that is already
//!    so, stored under the key by one statement;
//! 3. *leases* (strategy `redis-lock`): the SKUs' leases are taken all or nothing, in SKU
//!    order, with a fence, and renewed while the transaction runs;
//! 4. *transact* (`transact.rs`): one transaction, one commit — the key claimed, conditional decrements in
//!    SKU order, the order or hold and its lines, the ledger rows, the outbox event, and
//!    the key completed with the answer;
//! 5. *release*: the leases are released by compare-and-delete.
//!
//! **Why stock never goes below zero.** Step 4's update is conditional
//! (`… where on_hand - reserved >= q`, in [`crate::inventory::db`]), and the stock row's
//! `check` constraints back it; whatever Redis does (a lease that expired mid-pause, a
//! restart that forgot it), PostgreSQL refuses the oversell. Leases only queue buyers so the
//! database does not burn work on conflicts. A write whose fence is older than the row's
//! is refused and retried under a fresh lease, so a holder whose lease expired cannot
//! clobber a newer one. Rows are locked in SKU order, so concurrent orders never deadlock.
//!
//! **Why a request is placed once.** The key is claimed *inside* step 4's transaction: a
//! twin with the same key waits on that row for the first to end, then replays its answer;
//! a request that dies leaves no claim behind. The answer (the order or hold, or the
//! shortages) is stored in the same commit as the stock change, so a client told "placed"
//! finds it placed after any crash, and one told nothing converges on retry: a request that
//! timed out reads its key once more before answering (`decided.rs`: `answer_or_settled`).
//! A replay returns the order or hold as it is now (it may have been confirmed or
//! cancelled since). Should the key's record be purged, the key's unique column on the
//! order or hold still refuses a second one.
//!
//! Each operation has its own outcome ([`OrderOutcome`], [`HoldOutcome`]); the errors that
//! are not stored, so that a retry under the same key may still succeed, are
//! [`OrderError`]. Mapping either to a status code is the HTTP layer's business.
//!
//! Two optimisations sit beside the path and keep its guarantees: [`batch`] (strategy
//! `batched`, the default: the orders and holds of one process share a transaction) and [`sold_out`]
//! (answers for SKUs known sold out kept in Redis, copied into PostgreSQL).

pub mod batch;
mod decided;
mod kind;
mod place;
mod request;
pub mod sold_out;
mod transact;

use std::time::Duration;

use sqlx::PgPool;

pub use batch::Batcher;
pub use request::{InvalidOrder, MAX_LINES, OrderRequest, Quantity, RequestLine, Shopper};

use crate::config::{OrderStrategy, Settings};
use crate::holds::Hold;
use crate::idempotency::{IdempotencyKey, Scope};
use crate::locking::Redis;
use crate::metrics::Metrics;
// Also what `batch` and `sold_out` read and write, as `super::…`.
use crate::orders::{Order, OrderLine, Shortage};

/// What placing an order or hold needs.
#[derive(Clone, Copy)]
pub struct OrderDeps<'a> {
    pub db: &'a PgPool,
    pub redis: &'a Redis,
    pub settings: &'a Settings,
    pub metrics: &'a Metrics,
    pub batcher: &'a std::sync::Arc<Batcher>,
    /// Forgotten for a SKU this process sells out, so its pages say so at once.
    pub catalog: &'a crate::catalog::cache::CatalogCache,
    /// When the request's client is answered whatever happens (its budget runs out): no
    /// transaction starts for it after this. A commit sent before may still finish; its
    /// key then replays the order.
    pub answer_by: std::time::Instant,
}

/// What placing an order decided; stored under the key and replayed for retries.
#[derive(Debug, Clone)]
pub enum OrderOutcome {
    /// The order exists.
    Placed { order: Order, replayed: bool },
    /// Not enough stock for these SKUs; nothing was written.
    Insufficient {
        shortages: Vec<Shortage>,
        replayed: bool,
    },
}

/// What placing a hold decided; stored under the key and replayed for retries.
#[derive(Debug, Clone)]
pub enum HoldOutcome {
    /// The hold exists; its stock is reserved until it expires.
    Held { hold: Hold, replayed: bool },
    /// Not enough stock for these SKUs; nothing was written.
    Insufficient {
        shortages: Vec<Shortage>,
        replayed: bool,
    },
}

/// Outcomes that are not stored: the client may retry with the same key.
#[derive(Debug, thiserror::Error)]
pub enum OrderError {
    #[error("no product with SKU {}", .0.join(", "))]
    UnknownSkus(Vec<String>),
    #[error("{0}")]
    OverCap(String),
    /// The shopper already has what a product's purchase limit allows (409, not stored:
    /// it changes when one of their holds is released).
    #[error("{0}")]
    OverLimit(String),
    #[error("this idempotency key was already used for a different request")]
    KeyReused,
    #[error("a request with this idempotency key is still being processed; retry shortly")]
    InFlight,
    #[error("these products are in high demand right now; please retry in a moment")]
    Busy,
    /// A batch failed for a passing database reason ([`crate::pg::transient_cause`] says
    /// which, for every order of the batch alike): not stored, retry.
    #[error("{0}")]
    Transient(&'static str),
    /// The request ran out of time with its outcome unknown (a commit may have been sent
    /// and not answered): only the key can tell.
    #[error(
        "we could not confirm the order in time; retry with the same Idempotency-Key to find out whether it was placed"
    )]
    TimedOut,
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

impl OrderError {
    /// The metric label of a request that ended with this error.
    fn outcome(&self) -> &'static str {
        match self {
            Self::UnknownSkus(_) | Self::OverCap(_) => "invalid",
            Self::OverLimit(_) => "over_limit",
            Self::KeyReused => "key_reused",
            Self::InFlight => "in_flight",
            // Shed for want of a connection, as a 503 says.
            Self::Busy
            | Self::Transient(_)
            | Self::TimedOut
            | Self::Database(sqlx::Error::PoolTimedOut) => "busy",
            Self::Database(_) => "error",
        }
    }
}

/// Places `request` as an order under `key`: the one way an order is made on a
/// shopper's request, for pages and the API alike.
#[tracing::instrument(skip_all, fields(scope = scope.as_str(), lines = request.lines().len()))]
pub async fn place_order(
    deps: OrderDeps<'_>,
    scope: Scope,
    key: &IdempotencyKey,
    request: &OrderRequest,
) -> Result<OrderOutcome, OrderError> {
    let keyed = decided::Keyed::new(deps.settings, scope, key, request);
    // Under `batched` an order goes straight to the process's queue: the batch's
    // transaction reads its key and its stock along with everyone else's.
    let placed = if deps.settings.order_strategy == OrderStrategy::Batched {
        place::place_batched::<Order>(deps, &keyed, request).await
    } else {
        place::place::<Order>(deps, &keyed, request).await
    };
    let outcome = match &placed {
        Ok(decided::Outcome::Made { replayed: true, .. })
        | Ok(decided::Outcome::Insufficient { replayed: true, .. }) => "replayed",
        Ok(decided::Outcome::Made { .. }) => "placed",
        Ok(decided::Outcome::Insufficient { .. }) => "insufficient",
        Err(e) => e.outcome(),
    };
    deps.metrics.orders.with_label_values(&[outcome]).inc();
    placed.map(OrderOutcome::from)
}

/// Places a checkout hold for `request` under `key`: the same path as an order, with
/// `reserved += q` instead of `on_hand −= q`, and a cap per SKU.
#[tracing::instrument(skip_all, fields(scope = scope.as_str(), lines = request.lines().len()))]
pub async fn place_hold(
    deps: OrderDeps<'_>,
    scope: Scope,
    key: &IdempotencyKey,
    request: &OrderRequest,
) -> Result<HoldOutcome, OrderError> {
    let cap = deps.settings.hold_max_per_sku;
    if let Some(line) = request.lines().iter().find(|l| l.quantity.get() > cap) {
        return Err(OrderError::OverCap(format!(
            "a checkout can hold at most {cap} of {} (asked for {})",
            line.sku,
            line.quantity.get()
        )));
    }
    let keyed = decided::Keyed::new(deps.settings, scope, key, request);
    // Under `batched` a hold (the storefront's checkout button) joins the batch, as an
    // order does.
    let placed = if deps.settings.order_strategy == OrderStrategy::Batched {
        place::place_batched::<Hold>(deps, &keyed, request).await
    } else {
        place::place::<Hold>(deps, &keyed, request).await
    };
    placed.map(HoldOutcome::from)
}

/// How long an in-flight idempotency record is trusted before a retry may take it over:
/// longer than any request can still be working on it (its budget). A process stopped
/// for longer finds its claim gone on waking and answers with what the key holds then.
pub fn stale_after(s: &Settings) -> Duration {
    s.request_budget + s.fault_pause_after_lease + Duration::from_secs(2)
}

/// The longest a request's work may go on, answered or not, before it is stopped
/// ([`crate::http::detached`]): twice its budget, and never less than a lease wait and a
/// transaction past it. By then its client was answered long ago, and what the work still
/// waits for is a database behind a network that stopped answering.
pub fn work_limit(s: &Settings) -> Duration {
    (s.request_budget * 2).max(s.request_budget + s.lease_wait + s.tx_timeout)
}
