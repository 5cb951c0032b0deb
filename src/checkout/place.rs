//! The steps every placement takes, orders and holds alike (see the module's own page,
//! [`crate::checkout`], for why they keep stock and keys right). What differs between an
//! order and a hold is the [`Want`](super::placement::Want) a step is run for: how stock
//! moves, which rows are written, how the made thing is read back for a replay.

use std::sync::Arc;
use std::time::Instant;

use sqlx::Postgres;
use sqlx::pool::PoolConnection;

use super::batch::{self, BatchAnswer, Batcher};
use super::decided::{Reached, settle};
use super::placement::{Deps, Keyed, MAX_ATTEMPTS, OrderError, Outcome};
use super::request::OrderRequest;
use super::sold_out;
use super::transact::{Tx, transact};
use crate::catalog::Sku;
use crate::config::OrderStrategy;
use crate::idempotency::{self, Found};
use crate::inventory::db as stock;
use crate::locking::{Acquire, Lease, Redis};
use crate::orders::Shortage;
use crate::orders::db::{self as order_rows, OrderProduct};

/// Steps 1–6 for a request, under the strategies that place one request at a time (under
/// `batched` it goes to the batch instead: [`place_batched`]).
pub(super) async fn place(
    deps: Deps<'_>,
    keyed: &Keyed<'_>,
    request: &OrderRequest,
) -> Result<Outcome, OrderError> {
    let reached = reach(deps, keyed, request).await;
    settle(deps, keyed, reached).await
}

/// Steps 1–6, up to where the request's answer is decided.
async fn reach(
    deps: Deps<'_>,
    keyed: &Keyed<'_>,
    request: &OrderRequest,
) -> Result<Reached, OrderError> {
    // A SKU this process saw sold out: answered from Redis if it still is, no write.
    // (`batched` does this for a whole batch at once.)
    if deps.settings.order_strategy == OrderStrategy::RedisLock
        && deps.redis.believes_sold_out(&request.skus())
        && let Some(reached) = sold_out_answer(deps, keyed, request).await?
    {
        return Ok(reached);
    }

    // A decided key is answered from its record, before any lease or transaction. One
    // connection serves both reads, and goes back to the pool before the lease wait.
    let mut conn = deps.db.acquire().await?;
    let k = keyed;
    let found =
        idempotency::lookup(&mut *conn, k.scope, k.key, &k.fingerprint, k.stale_after).await?;
    match found {
        Found::Absent | Found::Stale(_) => {}
        found => {
            // Back to the pool first: a replay reads with a connection of its own.
            drop(conn);
            return Ok(Reached::Elsewhere(found));
        }
    }
    let skus = request.skus();
    let products = order_rows::products_for(&mut *conn, &skus).await?;
    let unknown: Vec<String> = skus
        .iter()
        .filter(|s| !products.iter().any(|p| p.sku == s.as_str()))
        .map(|s| s.to_string())
        .collect();
    if !unknown.is_empty() {
        drop(conn);
        return Err(OrderError::UnknownSkus(unknown));
    }
    place_keyed(deps, keyed, request, &products, conn).await
}

/// The answer for a request whose SKU this process saw sold out: from the key's record
/// in PostgreSQL if it has one, else "not enough stock" stored in Redis while the SKU is
/// still hinted sold out. `None`: decide as usual.
async fn sold_out_answer(
    deps: Deps<'_>,
    keyed: &Keyed<'_>,
    request: &OrderRequest,
) -> Result<Option<Reached>, OrderError> {
    match keyed.lookup(deps.db).await? {
        Found::Absent => {}
        found => return Ok(Some(Reached::Elsewhere(found))),
    }
    let k = keyed;
    let answer = sold_out::answer(deps.redis, k.scope, k.key, &k.fingerprint, request).await;
    Ok(answer.outcome(deps.metrics)?.map(Reached::Outcome))
}

fn shortages_of(request: &OrderRequest, available: &[(String, i32)]) -> Vec<Shortage> {
    request
        .lines()
        .iter()
        .filter_map(|line| {
            let available = available
                .iter()
                .find(|(sku, _)| sku == line.sku.as_str())
                .map_or(0, |(_, n)| *n);
            (available < line.quantity.get()).then(|| Shortage {
                sku: line.sku.to_string(),
                requested: line.quantity.get(),
                available: available.max(0),
            })
        })
        .collect()
}

/// Steps 3–6 for a request whose key is undecided; `conn` is the connection its reads
/// used. Where nothing is waited for before the transaction (no lease), that connection
/// carries it, so a request queues for the pool once.
async fn place_keyed(
    deps: Deps<'_>,
    keyed: &Keyed<'_>,
    request: &OrderRequest,
    products: &[OrderProduct],
    conn: PoolConnection<Postgres>,
) -> Result<Reached, OrderError> {
    let s = deps.settings;
    let mut held = Some(conn);
    // A plain read is a true answer at the moment it was read: when stock is already
    // short, say so without queueing for a lease.
    let seen: Vec<(String, i32)> = products
        .iter()
        .map(|p| (p.sku.clone(), p.available))
        .collect();
    let shortages = shortages_of(request, &seen);
    if !shortages.is_empty() {
        hint_sold_out(deps, &shortages).await;
        return Ok(Reached::Short(shortages, held.take()));
    }

    if s.order_strategy == OrderStrategy::RedisLock {
        // Not held while queueing for the lease: waiters would drain the pool.
        held = None;
    }

    if s.order_strategy == OrderStrategy::RedisLock {
        // Marked as decided in PostgreSQL, so a twin is never answered from Redis; a key
        // answered there already gets that answer.
        let k = keyed;
        let marked = deps
            .redis
            .mark_keys(&[(k.scope.as_str(), k.key.as_str())], k.stale_after)
            .await;
        if let Some(Some(stored)) = marked.and_then(|m| m.into_iter().next()) {
            let answer = sold_out::replay(&stored, &k.fingerprint);
            if let Some(outcome) = answer.outcome(deps.metrics)? {
                return Ok(Reached::Outcome(outcome));
            }
        }
    }

    let skus = request.skus();
    let deadline = Instant::now() + s.lease_wait;
    let mut attempts = 0;
    loop {
        let lease = match s.order_strategy {
            OrderStrategy::RedisLock => {
                let wait = deadline.saturating_duration_since(Instant::now());
                let started = Instant::now();
                let acquired = deps.redis.acquire(&skus, s.lease_ttl, wait).await;
                deps.metrics
                    .lease_wait
                    .observe(started.elapsed().as_secs_f64());
                deps.metrics
                    .degraded
                    .set(i64::from(deps.redis.is_degraded()));
                match acquired {
                    Acquire::Granted(lease) => Some(lease),
                    Acquire::Degraded => None,
                    Acquire::Busy => {
                        deps.metrics.lease_timeouts.inc();
                        return Err(OrderError::Busy);
                    }
                    Acquire::SoldOutHint(sku) => {
                        // Confirm the hint against the database before answering.
                        let now = stock::availability(deps.db, &skus).await?;
                        let shortages = shortages_of(request, &now);
                        if !shortages.is_empty() {
                            return Ok(Reached::Short(shortages, None));
                        }
                        deps.redis.clear_sold_out(&sku).await;
                        attempts += 1;
                        if attempts >= MAX_ATTEMPTS || Instant::now() >= deadline {
                            return Err(OrderError::Busy);
                        }
                        continue;
                    }
                }
            }
            // `batched` never comes here: its requests go to the batch (`place_batched`).
            OrderStrategy::PgAtomic | OrderStrategy::NaiveUnsafe | OrderStrategy::Batched => None,
        };
        attempts += 1;

        if !s.fault_pause_after_lease.is_zero() {
            // A stalled process: nothing of it runs, its lease watchdog included.
            tokio::time::sleep(s.fault_pause_after_lease).await;
        }
        if Instant::now() >= deps.answer_by {
            // Its client has been answered: no transaction may start for it now.
            release(deps.redis, lease.as_ref()).await;
            return Err(OrderError::TimedOut);
        }
        let fence = lease.as_ref().map(|l| l.fence);
        let work = transact(deps, keyed, request, fence, held.as_deref_mut());
        let outcome = deps
            .redis
            .while_held(
                lease.as_ref(),
                s.lease_ttl,
                crate::pg::cut_off(s.tx_timeout, work),
            )
            .await;
        release(deps.redis, lease.as_ref()).await;

        match outcome {
            Err(_) => return Err(OrderError::TimedOut),
            Ok(Err(e)) => return Err(e),
            Ok(Ok(Tx::Done { made, sold_out })) => {
                for sku in &sold_out {
                    deps.catalog.forget(sku);
                    deps.redis.hint_sold_out(sku).await;
                }
                return Ok(Reached::Outcome(Outcome::Made {
                    made,
                    replayed: false,
                }));
            }
            Ok(Ok(Tx::Decided(found))) => {
                // Back to the pool first: a replay reads with a connection of its own.
                drop(held);
                return Ok(Reached::Elsewhere(found));
            }
            Ok(Ok(Tx::Short(shortages))) => {
                hint_sold_out(deps, &shortages).await;
                return Ok(Reached::Short(shortages, held.take()));
            }
            Ok(Ok(Tx::StaleFence { last_fence })) => {
                // A newer lease wrote the row: ours had expired, or Redis forgot the
                // counter. Make later tokens larger and try again under a fresh lease.
                deps.metrics.stale_fences.inc();
                tracing::warn!(fence, last_fence, "stock write refused for a stale fence");
                deps.redis.raise_fence(last_fence).await;
                if attempts >= MAX_ATTEMPTS || Instant::now() >= deadline {
                    return Err(OrderError::Busy);
                }
            }
        }
    }
}

/// Hints the SKUs that have nothing left sold out (under the strategies that lease).
async fn hint_sold_out(deps: Deps<'_>, shortages: &[Shortage]) {
    if !matches!(
        deps.settings.order_strategy,
        OrderStrategy::RedisLock | OrderStrategy::Batched
    ) {
        return;
    }
    for short in shortages.iter().filter(|s| s.available == 0) {
        if let Ok(sku) = Sku::parse(&short.sku) {
            deps.redis.hint_sold_out(&sku).await;
        }
    }
}

async fn release(redis: &Redis, lease: Option<&Lease>) {
    if let Some(lease) = lease {
        redis.release(lease).await;
    }
}

/// An order or hold under `batched`: queued behind the process's batch leader, answered
/// from the batch.
pub(super) async fn place_batched(
    deps: Deps<'_>,
    batcher: &Arc<Batcher>,
    keyed: &Keyed<'_>,
    request: &OrderRequest,
) -> Result<Outcome, OrderError> {
    let job = batch::Job {
        want: keyed.want,
        scope: keyed.scope,
        key: keyed.key.clone(),
        fingerprint: keyed.fingerprint.clone(),
        request: request.clone(),
        answer_by: deps.answer_by,
    };
    let reached = match batcher.submit(job).await {
        BatchAnswer::Made(made) => Ok(Reached::Outcome(Outcome::Made {
            made,
            replayed: false,
        })),
        // Stored under the key by the batch's write.
        BatchAnswer::Short(shortages) => Ok(Reached::Outcome(Outcome::Insufficient {
            shortages,
            replayed: false,
        })),
        // Never "decide elsewhere": such jobs stay in their batch.
        BatchAnswer::FromRedis(answer) => answer
            .outcome(deps.metrics)
            .and_then(|outcome| outcome.map(Reached::Outcome).ok_or(OrderError::InFlight)),
        BatchAnswer::DecidedElsewhere => keyed
            .lookup(deps.db)
            .await
            .map(Reached::Elsewhere)
            .map_err(OrderError::from),
        BatchAnswer::Failed(error) => Err(error),
    };
    settle(deps, keyed, reached).await
}
