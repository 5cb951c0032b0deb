//! The steps every placement takes, orders and holds alike (see the module's own page,
//! [`crate::checkout`], for why they keep stock and keys right). What differs between an
//! order and a hold is the [`Kind`] a step is run for: how stock moves, which rows are
//! written, how the made thing is read back for a replay.

use std::time::Instant;

use chrono::Utc;
use serde::Serialize;
use serde::de::DeserializeOwned;
use sqlx::pool::PoolConnection;
use sqlx::{Acquire as _, PgConnection, PgPool, Postgres};
use uuid::Uuid;

use super::batch::{self, BatchAnswer};
use super::sold_out::{self, Answer};
use super::{HoldOutcome, OrderDeps, OrderError, OrderOutcome, OrderRequest, stale_after};
use crate::catalog::Sku;
use crate::config::{OrderStrategy, Settings};
use crate::events::{self, Event};
use crate::holds::{self, Hold, HoldState};
use crate::idempotency::{self, Begin, Fingerprint, Found, IdempotencyKey, Scope, StoredResponse};
use crate::inventory::db::{self as stock, Take};
use crate::locking::{Acquire, Lease, Redis};
use crate::orders::db::{self as order_rows, OrderProduct};
use crate::orders::{Order, OrderLine, OrderStatus, Shortage};

/// How many times a write refused for a stale fence is retried under a fresh lease.
pub(super) const MAX_ATTEMPTS: usize = 5;

/// What a placement of kind `K` decided; stored under the key and replayed for retries.
#[derive(Debug, Clone)]
pub(super) enum Outcome<K> {
    /// `K` was made: the order, or the hold.
    Made { made: K, replayed: bool },
    /// Not enough stock for these SKUs; nothing was written.
    Insufficient {
        shortages: Vec<Shortage>,
        replayed: bool,
    },
}

impl From<Outcome<Order>> for OrderOutcome {
    fn from(o: Outcome<Order>) -> Self {
        match o {
            Outcome::Made { made, replayed } => Self::Placed {
                order: made,
                replayed,
            },
            Outcome::Insufficient {
                shortages,
                replayed,
            } => Self::Insufficient {
                shortages,
                replayed,
            },
        }
    }
}

impl From<Outcome<Hold>> for HoldOutcome {
    fn from(o: Outcome<Hold>) -> Self {
        match o {
            Outcome::Made { made, replayed } => Self::Held {
                hold: made,
                replayed,
            },
            Outcome::Insufficient {
                shortages,
                replayed,
            } => Self::Insufficient {
                shortages,
                replayed,
            },
        }
    }
}

/// An outcome as its key's record keeps it: the made thing as the API shows it, or the
/// shortages. Which one a record holds is read from its body's shape.
#[derive(serde::Deserialize)]
#[serde(untagged)]
enum Stored<K> {
    Insufficient { shortages: Vec<Shortage> },
    Made(K),
}

impl<K: Serialize> Stored<K> {
    /// The record kept under the key. (Its status is the one the JSON API answers with,
    /// so that every record in the table reads the same way.)
    fn made(made: &K) -> StoredResponse {
        let body = serde_json::to_value(made).expect("orders and holds serialise");
        StoredResponse { status: 201, body }
    }

    fn insufficient(shortages: &[Shortage]) -> StoredResponse {
        let body = serde_json::json!({ "shortages": shortages });
        StoredResponse { status: 409, body }
    }
}

/// What an order or a hold is made of, before the kind decides the rest.
pub(super) struct Draft<'a> {
    id: Uuid,
    lines: Vec<OrderLine>,
    total_cents: i64,
    request: &'a OrderRequest,
    /// Microsecond precision, as PostgreSQL stores it, so replays compare equal.
    now: chrono::DateTime<Utc>,
}

/// One kind of placement: an order (stock sold now) or a hold (stock set aside for a
/// while). The path is the same for both; these are the points where they differ.
pub(super) trait Kind: Serialize + DeserializeOwned + Send + Sync + Sized {
    /// Moves `quantity` of `sku` inside the transaction: `on_hand −= q` for an order,
    /// `reserved += q` for a hold; conditional, fenced.
    async fn take(
        tx: &mut PgConnection,
        settings: &Settings,
        line: (&Sku, i32),
        fence: Option<i64>,
        reference: &str,
        actor: &str,
    ) -> sqlx::Result<Take>;

    /// Writes the made thing and its lines under the key; `None` when the key already has
    /// one (from before its record was purged).
    async fn insert(
        tx: &mut PgConnection,
        settings: &Settings,
        draft: Draft<'_>,
        keyed: &Keyed<'_>,
    ) -> sqlx::Result<Option<Self>>;

    /// The event told to the outside world when one is made.
    fn event(&self) -> Event;

    fn id(&self) -> Uuid;

    /// The one with this id, as it is now.
    async fn find(db: &PgPool, id: Uuid) -> sqlx::Result<Option<Self>>;

    /// The one made under the key, if any.
    async fn for_key(db: &PgPool, scope: &str, key: &str) -> sqlx::Result<Option<Uuid>>;
}

impl Kind for Order {
    async fn take(
        tx: &mut PgConnection,
        settings: &Settings,
        (sku, q): (&Sku, i32),
        fence: Option<i64>,
        reference: &str,
        actor: &str,
    ) -> sqlx::Result<Take> {
        if settings.order_strategy == OrderStrategy::NaiveUnsafe {
            stock::take_stock_naive(tx, sku, q, reference, actor).await
        } else {
            stock::take_stock(tx, sku, q, fence, reference, actor).await
        }
    }

    async fn insert(
        tx: &mut PgConnection,
        _: &Settings,
        draft: Draft<'_>,
        keyed: &Keyed<'_>,
    ) -> sqlx::Result<Option<Self>> {
        let order = Order {
            id: draft.id,
            status: OrderStatus::Placed,
            total_cents: draft.total_cents,
            lines: draft.lines,
            email: draft.request.email().map(str::to_string),
            customer_name: draft.request.name().map(str::to_string),
            created_at: draft.now,
        };
        let (scope, key) = (keyed.scope.as_str(), keyed.key.as_str());
        let shopper = draft.request.shopper().identities();
        match order_rows::insert_order(tx, &order, scope, key, shopper).await {
            Err(sqlx::Error::Database(e)) if e.is_unique_violation() => Ok(None),
            other => other.map(|()| Some(order)),
        }
    }

    fn event(&self) -> Event {
        Event::order_placed(self)
    }

    fn id(&self) -> Uuid {
        self.id
    }

    async fn find(db: &PgPool, id: Uuid) -> sqlx::Result<Option<Self>> {
        order_rows::find_order(db, id).await
    }

    async fn for_key(db: &PgPool, scope: &str, key: &str) -> sqlx::Result<Option<Uuid>> {
        order_rows::order_for_key(db, scope, key).await
    }
}

impl Kind for Hold {
    async fn take(
        tx: &mut PgConnection,
        _: &Settings,
        (sku, q): (&Sku, i32),
        fence: Option<i64>,
        reference: &str,
        actor: &str,
    ) -> sqlx::Result<Take> {
        stock::reserve_stock(tx, sku, q, fence, reference, actor).await
    }

    async fn insert(
        tx: &mut PgConnection,
        settings: &Settings,
        draft: Draft<'_>,
        keyed: &Keyed<'_>,
    ) -> sqlx::Result<Option<Self>> {
        let mut hold = Hold {
            id: draft.id,
            state: HoldState::Active,
            expires_at: draft.now,
            lines: draft.lines,
            total_cents: draft.total_cents,
            email: draft.request.email().map(str::to_string),
            customer_name: draft.request.name().map(str::to_string),
            order_id: None,
        };
        let (scope, key) = (keyed.scope.as_str(), keyed.key.as_str());
        let shopper = draft.request.shopper().identities();
        let ttl = settings.hold_ttl;
        match holds::db::insert_hold(tx, &hold, ttl, scope, key, shopper).await {
            Err(sqlx::Error::Database(e)) if e.is_unique_violation() => Ok(None),
            other => {
                // Expiry by the database's clock, the one the sweeper uses.
                hold.expires_at = other?;
                Ok(Some(hold))
            }
        }
    }

    fn event(&self) -> Event {
        Event::hold_placed(self)
    }

    fn id(&self) -> Uuid {
        self.id
    }

    async fn find(db: &PgPool, id: Uuid) -> sqlx::Result<Option<Self>> {
        holds::db::find_hold(db, id).await
    }

    async fn for_key(db: &PgPool, scope: &str, key: &str) -> sqlx::Result<Option<Uuid>> {
        holds::db::hold_for_key(db, scope, key).await
    }
}

/// The key a request is placed under, with what its record must match.
pub(super) struct Keyed<'a> {
    scope: Scope,
    key: &'a IdempotencyKey,
    fingerprint: Fingerprint,
    stale_after: std::time::Duration,
}

impl<'a> Keyed<'a> {
    pub(super) fn new(
        settings: &Settings,
        scope: Scope,
        key: &'a IdempotencyKey,
        request: &OrderRequest,
    ) -> Self {
        Self {
            scope,
            key,
            fingerprint: request.fingerprint(),
            stale_after: stale_after(settings),
        }
    }

    async fn lookup(&self, db: &PgPool) -> sqlx::Result<Found> {
        idempotency::lookup(
            db,
            self.scope,
            self.key,
            &self.fingerprint,
            self.stale_after,
        )
        .await
    }
}

/// Steps 1–6 for a request of kind `K` (a single-SKU order under `batched` goes to the
/// batch instead: [`place_batched`]).
pub(super) async fn place<K: Kind>(
    deps: OrderDeps<'_>,
    keyed: &Keyed<'_>,
    request: &OrderRequest,
) -> Result<Outcome<K>, OrderError> {
    // A SKU this process saw sold out: answered from Redis if it still is, no write.
    // (`batched` does this for a whole batch at once.)
    if deps.settings.order_strategy == OrderStrategy::RedisLock
        && deps.redis.believes_sold_out(&request.skus())
        && let Some(answer) = sold_out_answer(deps, keyed, request).await?
    {
        return Ok(answer);
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
            return decided_elsewhere(deps, keyed, found).await;
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
    let placed = place_keyed(deps, keyed, request, &products, conn).await;
    answer_or_settled(deps, keyed, placed).await
}

/// The answer for a request whose SKU this process saw sold out: from the key's record
/// in PostgreSQL if it has one, else "not enough stock" stored in Redis while the SKU is
/// still hinted sold out. `None`: decide as usual.
async fn sold_out_answer<K: Kind>(
    deps: OrderDeps<'_>,
    keyed: &Keyed<'_>,
    request: &OrderRequest,
) -> Result<Option<Outcome<K>>, OrderError> {
    match keyed.lookup(deps.db).await? {
        Found::Absent => {}
        found => return decided_elsewhere(deps, keyed, found).await.map(Some),
    }
    let k = keyed;
    let answer = sold_out::answer(deps.redis, k.scope, k.key, &k.fingerprint, request).await;
    from_redis(deps, answer)
}

/// A sold-out answer kept in Redis, as an outcome; `None` when there is none.
fn from_redis<K>(deps: OrderDeps<'_>, answer: Answer) -> Result<Option<Outcome<K>>, OrderError> {
    match answer {
        Answer::SoldOut {
            shortages,
            replayed,
        } => {
            if replayed {
                deps.metrics.idempotent_replays.inc();
            }
            Ok(Some(Outcome::Insufficient {
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
async fn answer_or_settled<K: Kind>(
    deps: OrderDeps<'_>,
    keyed: &Keyed<'_>,
    placed: Result<Outcome<K>, OrderError>,
) -> Result<Outcome<K>, OrderError> {
    let error = match placed {
        Err(error @ (OrderError::TimedOut | OrderError::Database(_) | OrderError::Busy)) => error,
        decided => return decided,
    };
    if let Ok(Found::Completed(stored)) = keyed.lookup(deps.db).await {
        return replay(deps, stored).await;
    }
    Err(error)
}

/// The answer for a request that found its key decided by another request — a retry
/// that went ahead while this one stalled, or a concurrent twin: what that request
/// decided, or 409 while it is still deciding. Never "key reused" for the same request.
async fn decided_elsewhere<K: Kind>(
    deps: OrderDeps<'_>,
    keyed: &Keyed<'_>,
    found: Found,
) -> Result<Outcome<K>, OrderError> {
    match found {
        Found::Completed(stored) => {
            deps.metrics.idempotent_replays.inc();
            replay(deps, stored).await
        }
        Found::Mismatch => Err(OrderError::KeyReused),
        Found::InFlight | Found::Stale(_) => Err(OrderError::InFlight),
        // The record is gone (purged) but the key's order or hold is there: that is it.
        Found::Absent => {
            let (scope, key) = (keyed.scope.as_str(), keyed.key.as_str());
            let made = match K::for_key(deps.db, scope, key).await? {
                Some(id) => K::find(deps.db, id).await?,
                None => None,
            };
            let made = made.ok_or(OrderError::InFlight)?;
            deps.metrics.idempotent_replays.inc();
            Ok(Outcome::Made {
                made,
                replayed: true,
            })
        }
    }
}

/// The outcome a stored response recorded, with the order or hold as it is now (it may
/// have been confirmed, cancelled or expired since).
async fn replay<K: Kind>(
    deps: OrderDeps<'_>,
    stored: StoredResponse,
) -> Result<Outcome<K>, OrderError> {
    let corrupt = |e: serde_json::Error| OrderError::Database(sqlx::Error::Decode(Box::new(e)));
    match serde_json::from_value(stored.body).map_err(corrupt)? {
        Stored::Made(made) => {
            let now = K::find(deps.db, K::id(&made)).await?;
            Ok(Outcome::Made {
                made: now.unwrap_or(made),
                replayed: true,
            })
        }
        Stored::Insufficient { shortages } => Ok(Outcome::Insufficient {
            shortages,
            replayed: true,
        }),
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
async fn place_keyed<K: Kind>(
    deps: OrderDeps<'_>,
    keyed: &Keyed<'_>,
    request: &OrderRequest,
    products: &[OrderProduct],
    conn: PoolConnection<Postgres>,
) -> Result<Outcome<K>, OrderError> {
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
        return store_insufficient(deps, keyed, shortages, held.as_deref_mut()).await;
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
            if let Some(outcome) = from_redis(deps, answer)? {
                return Ok(outcome);
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
                            return store_insufficient(deps, keyed, shortages, None).await;
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
        let work = transact::<K>(deps, keyed, request, fence, held.as_deref_mut());
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
            Ok(Ok(Tx::Done { made, sold_out })) => {
                for sku in &sold_out {
                    deps.catalog.forget(sku);
                    deps.redis.hint_sold_out(sku).await;
                }
                return Ok(Outcome::Made {
                    made,
                    replayed: false,
                });
            }
            Ok(Ok(Tx::Decided(found))) => {
                return decided_elsewhere(deps, keyed, found).await;
            }
            Ok(Ok(Tx::Short(shortages))) => {
                hint_sold_out(deps, &shortages).await;
                return store_insufficient(deps, keyed, shortages, held.as_deref_mut()).await;
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

enum Tx<K> {
    Done {
        made: K,
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
async fn transact<K: Kind>(
    deps: OrderDeps<'_>,
    keyed: &Keyed<'_>,
    request: &OrderRequest,
    fence: Option<i64>,
    held: Option<&mut PgConnection>,
) -> Result<Tx<K>, OrderError> {
    let id = Uuid::new_v4();
    let reference = id.to_string();
    let actor = keyed.scope.as_str();

    let mut tx = match held {
        Some(conn) => conn.begin().await?,
        None => deps.db.begin().await?,
    };
    // Claimed inside the transaction: a concurrent request with the same key waits here
    // for this one to end, and a request that dies leaves no record behind.
    let k = keyed;
    let claim = match idempotency::begin_in(&mut tx, k.scope, k.key, &k.fingerprint, k.stale_after)
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
        let take = K::take(
            &mut tx,
            deps.settings,
            (&line.sku, q),
            fence,
            &reference,
            actor,
        )
        .await?;
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
    let products = order_rows::products_for(&mut *tx, &request.skus()).await?;
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
                sku: line.sku.clone(),
                name: product.name.clone(),
                quantity: line.quantity.get(),
                unit_price_cents: product.price_cents,
            })
        })
        .collect::<Result<_, OrderError>>()?;
    let draft = Draft {
        id,
        total_cents: lines
            .iter()
            .map(|l| l.unit_price_cents * i64::from(l.quantity))
            .sum(),
        lines,
        request,
        now: chrono::DateTime::from_timestamp_micros(Utc::now().timestamp_micros())
            .expect("now is representable"),
    };
    let Some(made) = K::insert(&mut tx, deps.settings, draft, keyed).await? else {
        // The key already has its order or hold, from before its record was purged.
        tx.rollback().await?;
        return Ok(Tx::Decided(Found::Absent));
    };
    events::db::record(&mut tx, made.event()).await?;
    if !idempotency::complete(&mut tx, &claim, &Stored::made(&made)).await? {
        // Our claim was taken over as stale; the other request decides.
        tx.rollback().await?;
        return Ok(Tx::Decided(Found::InFlight));
    }
    tx.commit().await?;
    Ok(Tx::Done { made, sold_out })
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
    let bought = order_rows::bought_by(conn, &asks).await?;
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
pub(super) async fn place_batched(
    deps: OrderDeps<'_>,
    keyed: &Keyed<'_>,
    request: &OrderRequest,
) -> Result<Outcome<Order>, OrderError> {
    let job = batch::Job {
        scope: keyed.scope,
        key: keyed.key.clone(),
        fingerprint: keyed.fingerprint.clone(),
        request: request.clone(),
    };
    let placed = match deps.batcher.submit(job).await {
        BatchAnswer::Placed(order) => Ok(Outcome::Made {
            made: order,
            replayed: false,
        }),
        BatchAnswer::Short(shortages) => Ok(Outcome::Insufficient {
            shortages,
            replayed: false,
        }),
        // Never "decide elsewhere": such jobs stay in their batch.
        BatchAnswer::FromRedis(answer) => from_redis(deps, answer)?.ok_or(OrderError::InFlight),
        BatchAnswer::DecidedElsewhere => match keyed.lookup(deps.db).await {
            Ok(found) => decided_elsewhere(deps, keyed, found).await,
            Err(e) => Err(e.into()),
        },
        BatchAnswer::Failed(error) => Err(error),
    };
    answer_or_settled(deps, keyed, placed).await
}

/// Stores "not enough stock" under the key (one statement, one commit) and answers it;
/// if another request decided the key first, its answer.
async fn store_insufficient<K: Kind>(
    deps: OrderDeps<'_>,
    keyed: &Keyed<'_>,
    shortages: Vec<Shortage>,
    conn: Option<&mut PgConnection>,
) -> Result<Outcome<K>, OrderError> {
    let stored = Stored::<K>::insufficient(&shortages);
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
        None => Ok(Outcome::Insufficient {
            shortages,
            replayed: false,
        }),
        Some(found) => decided_elsewhere(deps, keyed, found).await,
    }
}
