//! Checkout: the one way stock leaves the shelf on a shopper's request, as an order
//! ([`place_order`]) or as a hold that sets it aside for a while ([`place_hold`]); pages and
//! the JSON API both come here. This page is the whole argument for why it never oversells
//! and never places one request twice.
//!
//! **The request** arrives parsed ([`OrderRequest`]): SKUs checked, quantities within the
//! cap, lines merged per SKU and sorted by it, contact details checked. Unknown SKUs are
//! refused before anything is stored.
//!
//! **Placing** (in `place.rs`) takes these steps, for an order and a hold alike; what the
//! request wants ([`Want`]: an order, a hold) says only what differs between the two
//! (`kind.rs`):
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
//! What a key decided is an [`Outcome`]: what was [`Made`], or the shortages; the errors
//! that are not stored, so that a retry under the same key may still succeed, are
//! [`OrderError`]. Mapping either to a status code is the HTTP layer's business. The
//! folder runs one way: `placement.rs` (these words) ← `kind.rs` ← `decided.rs` ←
//! `transact.rs`, `batch/` ← `place.rs` ← this page.
//!
//! Two optimisations sit beside the path and keep its guarantees: [`batch`] (strategy
//! `batched`, the default: the orders and holds of one process share a transaction) and [`sold_out`]
//! (answers for SKUs known sold out kept in Redis, copied into PostgreSQL).

pub mod batch;
mod decided;
mod kind;
mod place;
pub mod placement;
mod request;
pub mod sold_out;
mod transact;

use std::sync::Arc;
use std::time::Duration;

pub use batch::Batcher;
pub use placement::{Deps, Made, OrderError, Outcome, Want, stale_after};
pub use request::{
    InvalidOrder, MAX_LINES, OrderRequest, PlacementBody, Quantity, RequestLine, Shopper,
};

use crate::config::{OrderStrategy, Settings};
use crate::idempotency::{IdempotencyKey, Scope};

/// What placing an order or hold needs: what every step reads and writes through, and
/// the process's batch queue (the `batched` strategy's).
#[derive(Clone, Copy)]
pub struct OrderDeps<'a> {
    pub steps: Deps<'a>,
    pub batcher: &'a Arc<Batcher>,
}

/// Places `request` as what it wants (an order, or a hold with a cap per SKU) under `key`:
/// the one way either is made on a shopper's request, for pages and the API alike.
#[tracing::instrument(skip_all, fields(want = ?want, scope = scope.as_str(), lines = request.lines().len()))]
pub async fn place(
    deps: OrderDeps<'_>,
    want: Want,
    scope: Scope,
    key: &IdempotencyKey,
    request: &OrderRequest,
) -> Result<Outcome, OrderError> {
    let OrderDeps { steps, batcher } = deps;
    let cap = steps.settings.hold_max_per_sku;
    if want == Want::Hold
        && let Some(line) = request.lines().iter().find(|l| l.quantity.get() > cap)
    {
        return Err(OrderError::OverCap(format!(
            "a checkout can hold at most {cap} of {} (asked for {})",
            line.sku,
            line.quantity.get()
        )));
    }
    let keyed = placement::Keyed::new(steps.settings, want, scope, key, request);
    // Under `batched` an order or hold goes straight to the process's queue: the batch's
    // transaction reads its key and its stock along with everyone else's.
    let placed = if steps.settings.order_strategy == OrderStrategy::Batched {
        place::place_batched(steps, batcher, &keyed, request).await
    } else {
        place::place(steps, &keyed, request).await
    };
    if want == Want::Order {
        let outcome = match &placed {
            Ok(o) if o.replayed() => "replayed",
            Ok(Outcome::Made { .. }) => "placed",
            Ok(Outcome::Insufficient { .. }) => "insufficient",
            Err(e) => e.outcome(),
        };
        steps.metrics.orders.with_label_values(&[outcome]).inc();
    }
    placed
}

/// The longest a request's work may go on, answered or not, before it is stopped
/// ([`crate::http::detached`]): twice its budget, and never less than a lease wait and a
/// transaction past it. By then its client was answered long ago, and what the work still
/// waits for is a database behind a network that stopped answering.
pub fn work_limit(s: &Settings) -> Duration {
    (s.request_budget * 2).max(s.request_budget + s.lease_wait + s.tx_timeout)
}
