//! Placing an order (or a checkout hold):
//!
//! 1. the request arrives parsed ([`OrderRequest`]); unknown SKUs are refused, not stored;
//! 2. a key already decided is answered from its record: the stored answer replayed, 422
//!    for another request under it, 409 while another request is working on it;
//! 3. a plain read answers "not enough stock" at once when that is already so, stored
//!    under the key by one statement;
//! 4. the SKU leases are taken (strategy `redis-lock`), all or nothing, with a fence, and
//!    renewed while the transaction runs;
//! 5. one transaction, one commit: the key claimed, conditional decrements in SKU order,
//!    the order and its lines, the ledger rows, and the key completed with the answer;
//! 6. the leases are released by compare-and-delete.
//!
//! Whatever Redis does, step 5's conditional update is what keeps stock from going below
//! zero; a write whose fence is older than the row's is refused and retried under a fresh
//! lease. Because the key is claimed inside the transaction, a twin request with the same
//! key waits for it and replays its answer, and a request that dies leaves nothing behind.

use std::time::{Duration, Instant};

use chrono::Utc;
use sqlx::pool::PoolConnection;
use sqlx::{Acquire as _, PgConnection, PgPool, Postgres};
use uuid::Uuid;

use super::batch::BatchAnswer;
use super::db::{self, OrderProduct};
use super::{Order, OrderLine, OrderRequest, Shortage};
use crate::catalog::Sku;
use crate::config::{OrderStrategy, Settings};
use crate::events::{self, Event};
use crate::holds::Hold;
use crate::idempotency::{self, Begin, Fingerprint, Found, IdempotencyKey, Scope, StoredResponse};
use crate::inventory::db::{Take, reserve_stock, take_stock, take_stock_naive};
use crate::locking::{Acquire, Lease, Redis};
use crate::metrics::Metrics;

/// What placing an order needs.
#[derive(Clone, Copy)]
pub struct OrderDeps<'a> {
    pub db: &'a PgPool,
    pub redis: &'a Redis,
    pub settings: &'a Settings,
    pub metrics: &'a Metrics,
    pub batcher: &'a std::sync::Arc<super::Batcher>,
    /// Forgotten for a SKU this process sells out, so its pages say so at once.
    pub catalog: &'a crate::catalog::cache::CatalogCache,
}

/// What a request asks for: stock sold now, or stock held for a while.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Intent {
    Order,
    Hold,
}

/// A decided outcome; stored under the key and replayed for retries.
#[derive(Debug, Clone)]
pub enum Placement {
    /// The order exists (201).
    Placed { order: Order, replayed: bool },
    /// The hold exists (201).
    Held { hold: Hold, replayed: bool },
    /// Not enough stock for these SKUs; nothing was written (409).
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
    #[error("the order took too long and was cancelled; nothing was charged or reserved")]
    TimedOut,
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

impl OrderError {
    fn outcome(&self) -> &'static str {
        match self {
            Self::UnknownSkus(_) | Self::OverCap(_) => "invalid",
            Self::OverLimit(_) => "over_limit",
            Self::KeyReused => "key_reused",
            Self::InFlight => "in_flight",
            Self::Busy | Self::TimedOut => "busy",
            Self::Database(_) => "error",
        }
    }
}

/// How many times a write refused for a stale fence is retried under a fresh lease.
pub(super) const MAX_ATTEMPTS: usize = 5;

/// Places `request` under `key`: the single entry point for pages and the API.
#[tracing::instrument(skip_all, fields(scope = scope.as_str(), lines = request.lines().len()))]
pub async fn place_order(
    deps: OrderDeps<'_>,
    scope: Scope,
    key: &IdempotencyKey,
    request: &OrderRequest,
) -> Result<Placement, OrderError> {
    let result = place(deps, scope, key, request, Intent::Order).await;
    count(deps, &result);
    result
}

/// Places a checkout hold for `request` under `key`: the same path as an order, with
/// `reserved += q` instead of `on_hand −= q`, and a cap per SKU.
#[tracing::instrument(skip_all, fields(scope = scope.as_str(), lines = request.lines().len()))]
pub async fn place_hold(
    deps: OrderDeps<'_>,
    scope: Scope,
    key: &IdempotencyKey,
    request: &OrderRequest,
) -> Result<Placement, OrderError> {
    let cap = deps.settings.hold_max_per_sku;
    if let Some(line) = request.lines().iter().find(|l| l.quantity.get() > cap) {
        return Err(OrderError::OverCap(format!(
            "a checkout can hold at most {cap} of {} (asked for {})",
            line.sku,
            line.quantity.get()
        )));
    }
    place(deps, scope, key, request, Intent::Hold).await
}

fn count(deps: OrderDeps<'_>, result: &Result<Placement, OrderError>) {
    let outcome = match result {
        Ok(Placement::Placed { replayed: true, .. })
        | Ok(Placement::Held { replayed: true, .. })
        | Ok(Placement::Insufficient { replayed: true, .. }) => "replayed",
        Ok(Placement::Placed { .. }) => "placed",
        Ok(Placement::Held { .. }) => "held",
        Ok(Placement::Insufficient { .. }) => "insufficient",
        Err(e) => e.outcome(),
    };
    deps.metrics.orders.with_label_values(&[outcome]).inc();
}

/// How long an in-flight idempotency record is trusted before a retry may take it over:
/// longer than any request can still be working on it (its budget). A process stopped
/// for longer finds its claim gone on waking and answers with what the key holds then.
pub fn stale_after(s: &Settings) -> Duration {
    s.request_budget + s.fault_pause_after_lease + Duration::from_secs(2)
}

/// The key a request is placed under, with what its record must match.
struct Keyed<'a> {
    scope: Scope,
    key: &'a IdempotencyKey,
    fingerprint: Fingerprint,
    stale_after: Duration,
}

async fn place(
    deps: OrderDeps<'_>,
    scope: Scope,
    key: &IdempotencyKey,
    request: &OrderRequest,
    intent: Intent,
) -> Result<Placement, OrderError> {
    let keyed = Keyed {
        scope,
        key,
        fingerprint: request.fingerprint(),
        stale_after: stale_after(deps.settings),
    };
    // A SKU this process saw sold out: answered from Redis if it still is, no write.
    // (`batched` does this for a whole batch at once.)
    let strategy = deps.settings.order_strategy;
    if strategy == OrderStrategy::RedisLock
        && deps.redis.believes_sold_out(&request.skus())
        && let Some(answer) = sold_out_answer(deps, &keyed, request, intent).await?
    {
        return Ok(answer);
    }

    // A single-SKU order under `batched` goes straight to the process's queue: the
    // batch's transaction reads its key and its stock along with everyone else's.
    if strategy == OrderStrategy::Batched && intent == Intent::Order && request.lines().len() == 1 {
        let placed = place_batched(deps, &keyed, request, intent).await;
        return answer_or_settled(deps, &keyed, intent, placed).await;
    }

    // A decided key is answered from its record, before any lease or transaction. One
    // connection serves both reads, and goes back to the pool before the lease wait.
    let mut conn = deps.db.acquire().await?;
    let found = idempotency::lookup(
        &mut *conn,
        scope,
        key,
        &keyed.fingerprint,
        keyed.stale_after,
    )
    .await?;
    match found {
        Found::Absent | Found::Stale(_) => {}
        found => {
            // Back to the pool first: a replay reads with a connection of its own.
            drop(conn);
            return decided_elsewhere(deps, &keyed, found, intent).await;
        }
    }
    let skus = request.skus();
    let products = db::products_for(&mut *conn, &skus).await?;
    let unknown: Vec<String> = skus
        .iter()
        .filter(|s| !products.iter().any(|p| p.sku == s.as_str()))
        .map(|s| s.to_string())
        .collect();
    if !unknown.is_empty() {
        drop(conn);
        return Err(OrderError::UnknownSkus(unknown));
    }
    let placed = place_keyed(deps, &keyed, request, &products, intent, conn).await;
    answer_or_settled(deps, &keyed, intent, placed).await
}

/// The answer for a request whose SKU this process saw sold out: from the key's record
/// in PostgreSQL if it has one, else "not enough stock" stored in Redis while the SKU is
/// still hinted sold out. `None`: decide as usual.
async fn sold_out_answer(
    deps: OrderDeps<'_>,
    keyed: &Keyed<'_>,
    request: &OrderRequest,
    intent: Intent,
) -> Result<Option<Placement>, OrderError> {
    let k = keyed;
    match idempotency::lookup(deps.db, k.scope, k.key, &k.fingerprint, k.stale_after).await? {
        Found::Absent => {}
        found => {
            return decided_elsewhere(deps, keyed, found, intent)
                .await
                .map(Some);
        }
    }
    let answer = super::sold_out::answer(deps.redis, k.scope, k.key, &k.fingerprint, request).await;
    from_redis(deps, answer)
}

/// A sold-out answer kept in Redis, as a placement; `None` when there is none.
fn from_redis(
    deps: OrderDeps<'_>,
    answer: super::sold_out::Answer,
) -> Result<Option<Placement>, OrderError> {
    use super::sold_out::Answer;
    match answer {
        Answer::SoldOut {
            shortages,
            replayed,
        } => {
            if replayed {
                deps.metrics.idempotent_replays.inc();
            }
            Ok(Some(Placement::Insufficient {
                shortages,
                replayed,
            }))
        }
        Answer::KeyReused => Err(OrderError::KeyReused),
        Answer::Elsewhere => Ok(None),
    }
}

/// `placed`, unless it failed in a way that may hide a decision: the transaction may have
/// committed after all (the timeout fired during COMMIT, or the connection broke after
/// it), or a retry elsewhere placed it while this request stalled; then what was done.
async fn answer_or_settled(
    deps: OrderDeps<'_>,
    keyed: &Keyed<'_>,
    intent: Intent,
    placed: Result<Placement, OrderError>,
) -> Result<Placement, OrderError> {
    let error = match placed {
        Err(error @ (OrderError::TimedOut | OrderError::Database(_) | OrderError::Busy)) => error,
        decided => return decided,
    };
    let k = keyed;
    if let Ok(Found::Completed(stored)) =
        idempotency::lookup(deps.db, k.scope, k.key, &k.fingerprint, k.stale_after).await
    {
        return replay(deps, stored, intent).await;
    }
    Err(error)
}

/// The answer for a request that found its key decided by another request — a retry
/// that went ahead while this one stalled, or a concurrent twin: what that request
/// decided, or 409 while it is still deciding. Never "key reused" for the same request.
async fn decided_elsewhere(
    deps: OrderDeps<'_>,
    keyed: &Keyed<'_>,
    found: Found,
    intent: Intent,
) -> Result<Placement, OrderError> {
    match found {
        Found::Completed(stored) => {
            deps.metrics.idempotent_replays.inc();
            replay(deps, stored, intent).await
        }
        Found::Mismatch => Err(OrderError::KeyReused),
        Found::InFlight | Found::Stale(_) => Err(OrderError::InFlight),
        // The record is gone (purged) but the key's order or hold is there: that is it.
        Found::Absent => match existing_placement(deps, keyed, intent).await? {
            Some(placement) => {
                deps.metrics.idempotent_replays.inc();
                Ok(placement)
            }
            None => Err(OrderError::InFlight),
        },
    }
}

/// The order or hold made under the key.
async fn existing_placement(
    deps: OrderDeps<'_>,
    keyed: &Keyed<'_>,
    intent: Intent,
) -> Result<Option<Placement>, OrderError> {
    let (scope, key) = (keyed.scope.as_str(), keyed.key.as_str());
    Ok(Some(match intent {
        Intent::Order => {
            let Some(id) = db::order_for_key(deps.db, scope, key).await? else {
                return Ok(None);
            };
            let Some(order) = db::find_order(deps.db, id).await? else {
                return Ok(None);
            };
            Placement::Placed {
                order,
                replayed: true,
            }
        }
        Intent::Hold => {
            let Some(id) = crate::holds::db::hold_for_key(deps.db, scope, key).await? else {
                return Ok(None);
            };
            let Some(hold) = crate::holds::db::find_hold(deps.db, id).await? else {
                return Ok(None);
            };
            Placement::Held {
                hold,
                replayed: true,
            }
        }
    }))
}

/// The placement a stored response recorded, with the order or hold as it is now (it may
/// have been confirmed, cancelled or expired since).
async fn replay(
    deps: OrderDeps<'_>,
    stored: StoredResponse,
    intent: Intent,
) -> Result<Placement, OrderError> {
    let corrupt = |e: serde_json::Error| OrderError::Database(sqlx::Error::Decode(Box::new(e)));
    if stored.status == 201 && intent == Intent::Hold {
        let hold: Hold = serde_json::from_value(stored.body).map_err(corrupt)?;
        let hold = crate::holds::db::find_hold(deps.db, hold.id)
            .await?
            .unwrap_or(hold);
        Ok(Placement::Held {
            hold,
            replayed: true,
        })
    } else if stored.status == 201 {
        let order: Order = serde_json::from_value(stored.body).map_err(corrupt)?;
        let order = db::find_order(deps.db, order.id).await?.unwrap_or(order);
        Ok(Placement::Placed {
            order,
            replayed: true,
        })
    } else {
        #[derive(serde::Deserialize)]
        struct Body {
            shortages: Vec<Shortage>,
        }
        let body: Body = serde_json::from_value(stored.body).map_err(corrupt)?;
        Ok(Placement::Insufficient {
            shortages: body.shortages,
            replayed: true,
        })
    }
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
    deps: OrderDeps<'_>,
    keyed: &Keyed<'_>,
    request: &OrderRequest,
    products: &[OrderProduct],
    intent: Intent,
    conn: PoolConnection<Postgres>,
) -> Result<Placement, OrderError> {
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
        return store_insufficient(deps, keyed, shortages, intent, held.as_deref_mut()).await;
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
            let answer = super::sold_out::replay(&stored, &k.fingerprint);
            if let Some(placement) = from_redis(deps, answer)? {
                return Ok(placement);
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
                        let now = crate::inventory::db::availability(deps.db, &skus).await?;
                        let shortages = shortages_of(request, &now);
                        if !shortages.is_empty() {
                            return store_insufficient(deps, keyed, shortages, intent, None).await;
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
            // `batched` comes here for orders of several SKUs, and for holds.
            OrderStrategy::PgAtomic | OrderStrategy::NaiveUnsafe | OrderStrategy::Batched => None,
        };
        attempts += 1;

        if !s.fault_pause_after_lease.is_zero() {
            // A stalled process: nothing of it runs, its lease watchdog included.
            tokio::time::sleep(s.fault_pause_after_lease).await;
        }
        let fence = lease.as_ref().map(|l| l.fence);
        let work = transact(deps, keyed, request, fence, intent, held.as_deref_mut());
        let outcome = deps
            .redis
            .while_held(
                lease.as_ref(),
                s.lease_ttl,
                tokio::time::timeout(s.tx_timeout, work),
            )
            .await;
        release(deps.redis, lease.as_ref()).await;

        match outcome {
            Err(_) => return Err(OrderError::TimedOut),
            Ok(Err(e)) => return Err(e),
            Ok(Ok(Tx::Done {
                placement,
                sold_out,
            })) => {
                for sku in &sold_out {
                    deps.catalog.forget(sku);
                    deps.redis.hint_sold_out(sku).await;
                }
                return Ok(placement);
            }
            Ok(Ok(Tx::Decided(found))) => {
                return decided_elsewhere(deps, keyed, found, intent).await;
            }
            Ok(Ok(Tx::Short(shortages))) => {
                hint_sold_out(deps, &shortages).await;
                return store_insufficient(deps, keyed, shortages, intent, held.as_deref_mut())
                    .await;
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
async fn hint_sold_out(deps: OrderDeps<'_>, shortages: &[Shortage]) {
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

enum Tx {
    Done {
        placement: Placement,
        sold_out: Vec<Sku>,
    },
    Short(Vec<Shortage>),
    StaleFence {
        last_fence: i64,
    },
    /// Another request decided the key first (what its record says now); nothing was
    /// written.
    Decided(Found),
}

/// The one transaction of an order or hold, and its one commit: the key's claim, the
/// stock changes, the order or hold, the ledger rows, and the completed key.
async fn transact(
    deps: OrderDeps<'_>,
    keyed: &Keyed<'_>,
    request: &OrderRequest,
    fence: Option<i64>,
    intent: Intent,
    held: Option<&mut PgConnection>,
) -> Result<Tx, OrderError> {
    let naive = deps.settings.order_strategy == OrderStrategy::NaiveUnsafe;
    let order_id = Uuid::new_v4();
    let reference = order_id.to_string();
    let actor = keyed.scope.as_str();

    let mut tx = match held {
        Some(conn) => conn.begin().await?,
        None => deps.db.begin().await?,
    };
    // Claimed inside the transaction: a concurrent request with the same key waits here
    // for this one to end, and a request that dies leaves no record behind.
    let claim = match idempotency::begin_in(
        &mut tx,
        keyed.scope,
        keyed.key,
        &keyed.fingerprint,
        keyed.stale_after,
    )
    .await?
    {
        Begin::Started(claim) => claim,
        Begin::Replay(stored) => {
            tx.rollback().await?;
            return Ok(Tx::Decided(Found::Completed(stored)));
        }
        Begin::Mismatch => {
            tx.rollback().await?;
            return Ok(Tx::Decided(Found::Mismatch));
        }
        Begin::InFlight => {
            tx.rollback().await?;
            return Ok(Tx::Decided(Found::InFlight));
        }
    };
    let mut shortages = Vec::new();
    let mut sold_out = Vec::new();
    // Lines are sorted by SKU: every order locks stock rows in the same order.
    for line in request.lines() {
        let q = line.quantity.get();
        let take = match intent {
            Intent::Hold => reserve_stock(&mut tx, &line.sku, q, fence, &reference, actor).await?,
            Intent::Order if naive => {
                take_stock_naive(&mut tx, &line.sku, q, &reference, actor).await?
            }
            Intent::Order => take_stock(&mut tx, &line.sku, q, fence, &reference, actor).await?,
        };
        match take {
            Take::Taken { left } => {
                if left == 0 {
                    sold_out.push(line.sku.clone());
                }
            }
            Take::Short { available } => shortages.push(Shortage {
                sku: line.sku.to_string(),
                requested: q,
                available: available.max(0),
            }),
            Take::StaleFence { last_fence } => {
                tx.rollback().await?;
                return Ok(Tx::StaleFence { last_fence });
            }
        }
    }
    if !shortages.is_empty() {
        tx.rollback().await?;
        return Ok(Tx::Short(shortages));
    }

    // Prices as of this transaction, captured on the lines.
    let products = db::products_for(&mut *tx, &request.skus()).await?;
    // Purchase limits, counted under the stock rows' locks taken above.
    if let Some(refusal) = over_limit(&mut tx, request, &products).await? {
        tx.rollback().await?;
        return Err(OrderError::OverLimit(refusal));
    }
    let lines: Vec<OrderLine> = request
        .lines()
        .iter()
        .map(|line| {
            // A product deactivated since the check at the start cannot be sold.
            let product = products
                .iter()
                .find(|p| p.sku == line.sku.as_str())
                .ok_or_else(|| OrderError::UnknownSkus(vec![line.sku.to_string()]))?;
            Ok(OrderLine {
                sku: product.sku.clone(),
                name: product.name.clone(),
                quantity: line.quantity.get(),
                unit_price_cents: product.price_cents,
            })
        })
        .collect::<Result<_, OrderError>>()?;
    let total_cents = lines
        .iter()
        .map(|l| l.unit_price_cents * i64::from(l.quantity))
        .sum();
    // Microsecond precision, as PostgreSQL stores it, so replays compare equal.
    let now = chrono::DateTime::from_timestamp_micros(Utc::now().timestamp_micros())
        .expect("now is representable");
    let (scope, key) = (keyed.scope.as_str(), keyed.key.as_str());
    let (placement, body) = match intent {
        Intent::Order => {
            let order = Order {
                id: order_id,
                status: "placed".into(),
                total_cents,
                lines,
                email: request.email().map(str::to_string),
                customer_name: request.name().map(str::to_string),
                created_at: now,
            };
            let shopper = request.shopper().identities();
            match db::insert_order(&mut tx, &order, scope, key, shopper).await {
                Err(sqlx::Error::Database(e)) if e.is_unique_violation() => {
                    // The key already has its order, from before its record was purged.
                    tx.rollback().await?;
                    return Ok(Tx::Decided(Found::Absent));
                }
                other => other?,
            }
            events::db::record(&mut tx, Event::order_placed(&order)).await?;
            let body = serde_json::to_value(&order).expect("orders serialise");
            (
                Placement::Placed {
                    order,
                    replayed: false,
                },
                body,
            )
        }
        Intent::Hold => {
            let mut hold = Hold {
                id: order_id,
                state: "active".into(),
                expires_at: now,
                lines,
                total_cents,
                email: request.email().map(str::to_string),
                customer_name: request.name().map(str::to_string),
                order_id: None,
            };
            let ttl = deps.settings.hold_ttl;
            let shopper = request.shopper().identities();
            match crate::holds::db::insert_hold(&mut tx, &hold, ttl, scope, key, shopper).await {
                Err(sqlx::Error::Database(e)) if e.is_unique_violation() => {
                    tx.rollback().await?;
                    return Ok(Tx::Decided(Found::Absent));
                }
                other => hold.expires_at = other?,
            }
            events::db::record(&mut tx, Event::hold_placed(&hold)).await?;
            let body = serde_json::to_value(&hold).expect("holds serialise");
            (
                Placement::Held {
                    hold,
                    replayed: false,
                },
                body,
            )
        }
    };
    let stored = StoredResponse { status: 201, body };
    if !idempotency::complete(&mut tx, &claim, &stored).await? {
        // Our claim was taken over as stale; the other request decides.
        tx.rollback().await?;
        return Ok(Tx::Decided(Found::InFlight));
    }
    tx.commit().await?;
    Ok(Tx::Done {
        placement,
        sold_out,
    })
}

/// Why `request` may not be placed by its shopper: a line that would take them past its
/// product's purchase limit, counting what they bought or hold already. `None`: it may.
async fn over_limit(
    conn: &mut PgConnection,
    request: &OrderRequest,
    products: &[OrderProduct],
) -> sqlx::Result<Option<String>> {
    let limited: Vec<(&OrderProduct, i32, i32)> = request
        .lines()
        .iter()
        .filter_map(|line| {
            let product = products.iter().find(|p| p.sku == line.sku.as_str())?;
            Some((product, product.purchase_limit?, line.quantity.get()))
        })
        .collect();
    if limited.is_empty() {
        return Ok(None);
    }
    let identities = request.shopper().identities();
    let asks: Vec<(&str, &[String])> = limited
        .iter()
        .map(|(p, ..)| (p.sku.as_str(), identities))
        .collect();
    let bought = db::bought_by(conn, &asks).await?;
    Ok(limited
        .iter()
        .zip(bought)
        .find(|((_, limit, asked), bought)| bought + i64::from(*asked) > i64::from(*limit))
        .map(|((p, limit, asked), bought)| limit_refusal(&p.name, *limit, *asked, bought)))
}

/// "Only N per customer" in words a shopper understands.
pub(super) fn limit_refusal(name: &str, limit: i32, asked: i32, bought: i64) -> String {
    if bought == 0 {
        format!("{name} is limited to {limit} per customer; you asked for {asked}.")
    } else {
        format!(
            "{name} is limited to {limit} per customer, and you already have {bought} \
             (ordered, or held in a checkout)."
        )
    }
}

/// A single-SKU order under `batched`: queued behind the process's batch leader, answered
/// from the batch.
async fn place_batched(
    deps: OrderDeps<'_>,
    keyed: &Keyed<'_>,
    request: &OrderRequest,
    intent: Intent,
) -> Result<Placement, OrderError> {
    let job = super::batch::Job {
        scope: keyed.scope,
        key: keyed.key.clone(),
        fingerprint: keyed.fingerprint.clone(),
        request: request.clone(),
    };
    match deps.batcher.submit(job).await {
        BatchAnswer::Placed(order) => Ok(Placement::Placed {
            order,
            replayed: false,
        }),
        BatchAnswer::Short(shortages) => Ok(Placement::Insufficient {
            shortages,
            replayed: false,
        }),
        // Never "decide elsewhere": such jobs stay in their batch.
        BatchAnswer::FromRedis(answer) => from_redis(deps, answer)?.ok_or(OrderError::InFlight),
        BatchAnswer::DecidedElsewhere => {
            let found = idempotency::lookup(
                deps.db,
                keyed.scope,
                keyed.key,
                &keyed.fingerprint,
                keyed.stale_after,
            )
            .await?;
            decided_elsewhere(deps, keyed, found, intent).await
        }
        BatchAnswer::Failed(error) => Err(error),
    }
}

/// Stores "not enough stock" under the key (one statement, one commit) and answers it;
/// if another request decided the key first, its answer.
async fn store_insufficient(
    deps: OrderDeps<'_>,
    keyed: &Keyed<'_>,
    shortages: Vec<Shortage>,
    intent: Intent,
    conn: Option<&mut PgConnection>,
) -> Result<Placement, OrderError> {
    let stored = StoredResponse {
        status: 409,
        body: serde_json::json!({ "shortages": shortages }),
    };
    let k = keyed;
    let found = match conn {
        Some(conn) => {
            idempotency::store(conn, k.scope, k.key, &k.fingerprint, &stored, k.stale_after).await?
        }
        None => {
            let mut conn = deps.db.acquire().await?;
            idempotency::store(
                &mut conn,
                k.scope,
                k.key,
                &k.fingerprint,
                &stored,
                k.stale_after,
            )
            .await?
        }
    };
    match found {
        None => Ok(Placement::Insufficient {
            shortages,
            replayed: false,
        }),
        Some(found) => decided_elsewhere(deps, keyed, found, intent).await,
    }
}
