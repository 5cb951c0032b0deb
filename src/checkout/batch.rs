//! The `batched` strategy: group commit.
//!
//! A hot SKU is one row, and one row takes one commit at a time; a wide catalogue pays
//! one commit (one WAL flush) per order. So instead of one transaction per order,
//! concurrent single-SKU orders queue in this process behind one leader task, which
//! applies them in batches of up to `STOCKADE_BATCH_MAX`, whatever their SKUs:
//!
//! 1. orders for a SKU this process saw sold out are answered from Redis with no write
//!    (see [`super::sold_out`]); the other keys are marked in Redis as being decided in
//!    PostgreSQL, and a key that has an answer there already gets it;
//! 2. the leader takes the leases of the batch's SKUs that are free, all under one fence
//!    (exclusion and fencing across processes, as `redis-lock`); orders for a SKU whose
//!    lease another process holds wait for the next batch, and give up with 503 after
//!    `STOCKADE_LEASE_WAIT_MS`;
//! 3. one transaction: the stock rows are locked in SKU order and prices read; one read
//!    finds the keys that have a record (they drop out and are answered from it, as does
//!    the second of a key sent twice); units are allocated per SKU in arrival order, each
//!    order accepted while enough is left, the others refused with their own shortage;
//!    one conditional update takes each SKU's accepted total (it still refuses to go below
//!    zero or past a newer fence); set-based inserts (`unnest`) write every order, line
//!    and ledger row, and one insert records every key, completed with its own answer. A
//!    request elsewhere that claimed one of the keys meanwhile holds that insert until it
//!    ends; if it recorded the key (or its order), nothing is written and the batch starts
//!    again, and the key is answered from that record;
//! 4. one COMMIT, then every request gets its own answer.
//!
//! A request never poisons its batch: it is parsed and validated before it queues, a key
//! decided elsewhere drops out, and a SKU no longer on sale refuses only its own orders.
//! A queued request costs the database nothing of its own: its key, its SKU and its stock
//! are read by the batch's transaction. Orders of several SKUs, and holds, take the
//! per-request path: their SKU sets rarely coincide, and a batch that mixed them would
//! hold many leases for the sake of one order.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::Utc;
use sqlx::PgPool;
use tokio::sync::{mpsc, oneshot};
use uuid::Uuid;

use super::sold_out::{self, Answer};
use super::{Order, OrderError, OrderLine, OrderRequest, Shortage};
use crate::catalog::Sku;
use crate::catalog::cache::CatalogCache;
use crate::config::Settings;
use crate::idempotency::{Fingerprint, IdempotencyKey, Scope};
use crate::inventory::db as stock;
use crate::locking::{AcquireFree, Redis};
use crate::metrics::Metrics;

/// One single-SKU order for the queue.
pub struct Job {
    pub scope: Scope,
    pub key: IdempotencyKey,
    pub fingerprint: Fingerprint,
    pub request: OrderRequest,
}

impl Job {
    fn sku(&self) -> &Sku {
        &self.request.lines()[0].sku
    }

    fn quantity(&self) -> i32 {
        self.request.lines()[0].quantity.get()
    }
}

/// A job in the queue: the way back to the request waiting for it, and when it came.
struct Queued {
    job: Job,
    answer: oneshot::Sender<BatchAnswer>,
    since: Instant,
}

impl Queued {
    fn answer(self, answer: BatchAnswer) {
        let _ = self.answer.send(answer);
    }
}

/// What the leader tells one waiting request.
#[derive(Debug)]
pub enum BatchAnswer {
    /// The order was placed (201).
    Placed(Order),
    /// Not enough stock (409), stored under the key.
    Short(Vec<Shortage>),
    /// The key was decided by another request: answer from its record.
    DecidedElsewhere,
    /// The key has a sold-out answer kept in Redis: this.
    FromRedis(Answer),
    /// Nothing was decided; the request fails with this (and may be retried).
    Failed(OrderError),
}

/// The queue of this process, and what its leader needs.
pub struct Batcher {
    /// Open while a leader runs; the leader leaves (and closes it) when it runs dry.
    queue: Mutex<Option<mpsc::UnboundedSender<Queued>>>,
    db: PgPool,
    redis: Redis,
    settings: Arc<Settings>,
    metrics: Arc<Metrics>,
    catalog: Arc<CatalogCache>,
}

impl Batcher {
    pub fn new(
        db: PgPool,
        redis: Redis,
        settings: Arc<Settings>,
        metrics: Arc<Metrics>,
        catalog: Arc<CatalogCache>,
    ) -> Self {
        Self {
            queue: Mutex::default(),
            db,
            redis,
            settings,
            metrics,
            catalog,
        }
    }

    /// Queues `job` behind the leader (starting one if there is none) and waits for its
    /// answer.
    pub async fn submit(self: &Arc<Self>, job: Job) -> BatchAnswer {
        let (answer, rx) = oneshot::channel();
        let queued = Queued {
            job,
            answer,
            since: Instant::now(),
        };
        {
            let mut queue = self.queue.lock().expect("batch queue");
            let sender = queue.get_or_insert_with(|| {
                let (sender, jobs) = mpsc::unbounded_channel();
                tokio::spawn(Arc::clone(self).lead(jobs));
                sender
            });
            // The leader leaves only under this lock, after seeing its queue empty.
            let _ = sender.send(queued);
        }
        rx.await.unwrap_or(BatchAnswer::Failed(OrderError::Busy))
    }

    /// The leader: applies batches while orders keep coming, then leaves. Orders whose
    /// SKU was leased elsewhere go first into the next batch.
    async fn lead(self: Arc<Self>, mut jobs: mpsc::UnboundedReceiver<Queued>) {
        let s = &self.settings;
        let mut waiting: VecDeque<Queued> = VecDeque::new();
        let mut backoff = Duration::from_millis(1);
        loop {
            let mut batch: Vec<Queued> = Vec::new();
            while batch.len() < s.batch_max {
                match waiting.pop_front() {
                    Some(q) => batch.push(q),
                    None => break,
                }
            }
            let retried = batch.len();
            while batch.len() < s.batch_max {
                match jobs.try_recv() {
                    Ok(q) => batch.push(q),
                    Err(_) => break,
                }
            }
            if batch.is_empty() {
                let mut queue = self.queue.lock().expect("batch queue");
                if jobs.is_empty() {
                    *queue = None;
                    return;
                }
                continue;
            }
            if retried == batch.len() {
                // Only orders whose SKUs were leased elsewhere: give those leases a moment.
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_millis(20));
            } else {
                backoff = Duration::from_millis(1);
            }
            if !s.batch_wait.is_zero() && batch.len() < s.batch_max {
                let until = tokio::time::Instant::now() + s.batch_wait;
                while batch.len() < s.batch_max {
                    match tokio::time::timeout_at(until, jobs.recv()).await {
                        Ok(Some(q)) => batch.push(q),
                        _ => break,
                    }
                }
            }
            waiting.extend(self.apply(batch).await);
        }
    }

    /// Applies one batch and answers every job in it, except those whose SKU's lease is
    /// held elsewhere: they are returned, to wait for the next batch.
    async fn apply(&self, batch: Vec<Queued>) -> Vec<Queued> {
        let batch = self.answer_sold_out(batch).await;
        let mut batch = self.answer_from_redis(batch).await;
        if batch.is_empty() {
            return Vec::new();
        }
        let s = &self.settings;
        let mut skus: Vec<Sku> = batch.iter().map(|q| q.job.sku().clone()).collect();
        skus.sort_unstable();
        skus.dedup();

        let mut attempts = 0;
        loop {
            attempts += 1;
            let (lease, granted) = match self.redis.acquire_free(&skus, s.lease_ttl).await {
                AcquireFree::Granted(lease, granted) => (lease, granted),
                AcquireFree::Degraded => (None, vec![true; skus.len()]),
            };
            let leased: HashSet<&Sku> = skus
                .iter()
                .zip(&granted)
                .filter_map(|(sku, granted)| granted.then_some(sku))
                .collect();
            let (now, later): (Vec<Queued>, Vec<Queued>) = batch
                .into_iter()
                .partition(|q| leased.contains(q.job.sku()));
            let later = self.give_up_on_stale(later);
            if now.is_empty() {
                return later;
            }
            self.metrics.batch_size.observe(now.len() as f64);
            let fence = lease.as_ref().map(|l| l.fence);
            let jobs: Vec<&Job> = now.iter().map(|q| &q.job).collect();
            let work = tokio::time::timeout(s.tx_timeout, transact(&self.db, &jobs, fence));
            let result = self
                .redis
                .while_held(lease.as_ref(), s.lease_ttl, work)
                .await;
            // A committed batch answers before it lets go of its lease; any other ends here.
            if !matches!(result, Ok(Ok(Applied::Done(_)))) {
                self.release(lease.as_ref()).await;
            }
            let error = match result {
                Err(_) => OrderError::TimedOut,
                Ok(Err(e)) => OrderError::Database(e),
                Ok(Ok(Applied::StaleFence { last_fence })) => {
                    self.metrics.stale_fences.inc();
                    self.redis.raise_fence(last_fence).await;
                    if attempts < super::place::MAX_ATTEMPTS {
                        batch = now.into_iter().chain(later).collect();
                        continue;
                    }
                    OrderError::Busy
                }
                Ok(Ok(Applied::Raced)) => {
                    if attempts < super::place::MAX_ATTEMPTS {
                        batch = now.into_iter().chain(later).collect();
                        continue;
                    }
                    OrderError::Busy
                }
                Ok(Ok(Applied::Done(decided))) => {
                    for sku in &decided.sold {
                        self.catalog.forget(sku);
                    }
                    for (q, answer) in now.into_iter().zip(decided.each) {
                        q.answer(answer);
                    }
                    self.release(lease.as_ref()).await;
                    for sku in &decided.sold_out {
                        self.redis.hint_sold_out(sku).await;
                    }
                    return later;
                }
            };
            for q in now {
                q.answer(BatchAnswer::Failed(copy_error(&error)));
            }
            return later;
        }
    }

    /// Answers 503 to the orders among `later` that waited for their lease as long as
    /// an order may; returns the others.
    fn give_up_on_stale(&self, later: Vec<Queued>) -> Vec<Queued> {
        let wait = self.settings.lease_wait;
        let (expired, keep): (Vec<Queued>, Vec<Queued>) =
            later.into_iter().partition(|q| q.since.elapsed() >= wait);
        for q in expired {
            self.metrics.lease_timeouts.inc();
            q.answer(BatchAnswer::Failed(OrderError::Busy));
        }
        keep
    }

    async fn release(&self, lease: Option<&crate::locking::Lease>) {
        if let Some(lease) = lease {
            self.redis.release(lease).await;
        }
    }

    /// Answers from Redis the orders for SKUs this process saw sold out (one read of
    /// PostgreSQL for all their keys, one Redis call per SKU, no write); keys with a
    /// record in PostgreSQL are answered from it by their own requests. Returns the rest.
    async fn answer_sold_out(&self, batch: Vec<Queued>) -> Vec<Queued> {
        let (believed, mut rest): (Vec<Queued>, Vec<Queued>) = batch.into_iter().partition(|q| {
            self.redis
                .believes_sold_out(std::slice::from_ref(q.job.sku()))
        });
        if believed.is_empty() {
            return rest;
        }
        let keys: Vec<(&str, &str)> = believed
            .iter()
            .map(|q| (q.job.scope.as_str(), q.job.key.as_str()))
            .collect();
        let Ok(present) = crate::idempotency::present(&self.db, &keys).await else {
            rest.extend(believed);
            return rest;
        };
        let mut by_sku: BTreeMap<Sku, Vec<Queued>> = BTreeMap::new();
        for (q, present) in believed.into_iter().zip(present) {
            if present {
                q.answer(BatchAnswer::DecidedElsewhere);
            } else {
                by_sku.entry(q.job.sku().clone()).or_default().push(q);
            }
        }
        for (sku, asking) in by_sku {
            let questions: Vec<sold_out::Asking<'_>> = asking
                .iter()
                .map(|q| sold_out::Asking {
                    scope: q.job.scope,
                    key: &q.job.key,
                    fingerprint: &q.job.fingerprint,
                    requested: q.job.quantity(),
                })
                .collect();
            let answers = sold_out::answer_many(&self.redis, &sku, &questions).await;
            drop(questions);
            let Some(answers) = answers else {
                rest.extend(asking);
                continue;
            };
            for (q, answer) in asking.into_iter().zip(answers) {
                match answer {
                    Answer::Elsewhere => rest.push(q),
                    answer => q.answer(BatchAnswer::FromRedis(answer)),
                }
            }
        }
        rest
    }

    /// Marks the batch's keys as decided in PostgreSQL (so no twin is answered from
    /// Redis), and answers the jobs whose key has a sold-out answer kept in Redis; returns
    /// the others.
    async fn answer_from_redis(&self, batch: Vec<Queued>) -> Vec<Queued> {
        let keys: Vec<(&str, &str)> = batch
            .iter()
            .map(|q| (q.job.scope.as_str(), q.job.key.as_str()))
            .collect();
        let stale = super::stale_after(&self.settings);
        let Some(stored) = self.redis.mark_keys(&keys, stale).await else {
            return batch;
        };
        let mut rest = Vec::with_capacity(batch.len());
        for (q, stored) in batch.into_iter().zip(stored) {
            match stored.map(|s| sold_out::replay(&s, &q.job.fingerprint)) {
                None | Some(Answer::Elsewhere) => rest.push(q),
                Some(answer) => q.answer(BatchAnswer::FromRedis(answer)),
            }
        }
        rest
    }
}

/// The same failure for every job of a failed batch (each request then checks whether its
/// key was decided after all, as a single request would).
fn copy_error(error: &OrderError) -> OrderError {
    match error {
        OrderError::UnknownSkus(skus) => OrderError::UnknownSkus(skus.clone()),
        OrderError::TimedOut => OrderError::TimedOut,
        OrderError::Database(e) if crate::pg::is_transient(e) => OrderError::Busy,
        OrderError::Database(e) => {
            OrderError::Database(sqlx::Error::Protocol(format!("batch failed: {e}")))
        }
        _ => OrderError::Busy,
    }
}

/// What the batch transaction did.
enum Applied {
    Done(Answers),
    /// A newer lease wrote a row: nothing was written.
    StaleFence {
        last_fence: i64,
    },
    /// A key of the batch was recorded elsewhere while it ran: nothing was written.
    Raced,
}

/// One answer per job, in job order, and what the batch did to stock.
struct Answers {
    each: Vec<BatchAnswer>,
    /// SKUs the batch sold units of.
    sold: Vec<Sku>,
    /// SKUs with nothing left after the batch.
    sold_out: Vec<Sku>,
}

/// A SKU of the batch as its locked row and product say.
struct Stocked {
    left: i32,
    taken: i32,
    name: String,
    price_cents: i64,
    limit: Option<i32>,
}

/// The batch's one transaction (see the module documentation).
async fn transact(db: &PgPool, jobs: &[&Job], fence: Option<i64>) -> sqlx::Result<Applied> {
    let mut skus: Vec<Sku> = jobs.iter().map(|j| j.sku().clone()).collect();
    skus.sort_unstable();
    skus.dedup();
    let names: Vec<&str> = skus.iter().map(Sku::as_str).collect();
    let mut tx = db.begin().await?;

    // 1. Lock the stock rows and read today's prices. A SKU without both (gone, or no
    //    longer sold) refuses its own orders; a row a newer lease wrote refuses the batch.
    let locked = stock::lock_for_sale(&mut tx, &names).await?;
    if let Some(fence) = fence
        && let Some(last_fence) = locked.iter().map(|(_, _, f)| *f).max()
        && last_fence >= fence
    {
        tx.rollback().await?;
        return Ok(Applied::StaleFence { last_fence });
    }
    let products = super::db::products_for(&mut *tx, &skus).await?;
    let mut stocked: HashMap<&str, Stocked> = HashMap::new();
    for (sku, available, _) in &locked {
        if let Some(p) = products.iter().find(|p| &p.sku == sku) {
            let entry = Stocked {
                left: *available,
                taken: 0,
                name: p.name.clone(),
                price_cents: p.price_cents,
                limit: p.purchase_limit,
            };
            stocked.insert(sku.as_str(), entry);
        }
    }

    // 2. Keys with a record already drop out (answered from it); the batch decides the
    //    others, the first of each key if one came twice. Their records are written at
    //    the end, completed; a request elsewhere that records one of them first makes
    //    the batch start again. Then allocate in arrival order.
    let on_sale: Vec<(&str, &str)> = jobs
        .iter()
        .filter(|j| stocked.contains_key(j.sku().as_str()))
        .map(|j| (j.scope.as_str(), j.key.as_str()))
        .collect();
    let recorded = crate::idempotency::present(&mut *tx, &on_sale).await?;
    let mut claims: HashSet<(&str, &str)> = on_sale
        .iter()
        .zip(recorded)
        .filter_map(|(key, recorded)| (!recorded).then_some(*key))
        .collect();

    // Purchase limits: what each limited order's shopper bought or holds already (the
    //    rows are locked, so no other sale of these SKUs is in between), plus what the
    //    batch accepts for them on the way.
    let limited: Vec<(usize, &Job)> = jobs
        .iter()
        .enumerate()
        .filter(|(_, j)| {
            stocked
                .get(j.sku().as_str())
                .is_some_and(|s| s.limit.is_some())
        })
        .map(|(i, j)| (i, *j))
        .collect();
    let asks: Vec<(&str, &[String])> = limited
        .iter()
        .map(|(_, j)| (j.sku().as_str(), j.request.shopper().identities()))
        .collect();
    let counted = if asks.is_empty() {
        Vec::new()
    } else {
        super::db::bought_by(&mut tx, &asks).await?
    };
    let mut bought: HashMap<usize, i64> = limited.iter().map(|(i, _)| *i).zip(counted).collect();

    let now = chrono::DateTime::from_timestamp_micros(Utc::now().timestamp_micros())
        .expect("now is representable");
    let mut each = Vec::with_capacity(jobs.len());
    for (i, job) in jobs.iter().enumerate() {
        let Some(stock) = stocked.get_mut(job.sku().as_str()) else {
            each.push(BatchAnswer::Failed(OrderError::UnknownSkus(vec![
                job.sku().to_string(),
            ])));
            continue;
        };
        // A key twice in the batch: the first holds the claim, the second replays it.
        if !claims.remove(&(job.scope.as_str(), job.key.as_str())) {
            each.push(BatchAnswer::DecidedElsewhere);
            continue;
        }
        let q = job.quantity();
        if let (Some(limit), Some(already)) = (stock.limit, bought.get(&i).copied())
            && already + i64::from(q) > i64::from(limit)
        {
            let refusal = super::place::limit_refusal(&stock.name, limit, q, already);
            each.push(BatchAnswer::Failed(OrderError::OverLimit(refusal)));
            continue;
        }
        if q <= stock.left {
            stock.left -= q;
            stock.taken += q;
            // Later orders in this batch by the same shopper count this one.
            let mine = job.request.shopper().identities();
            for (j, later) in jobs.iter().enumerate().skip(i + 1) {
                if later.sku() == job.sku()
                    && later
                        .request
                        .shopper()
                        .identities()
                        .iter()
                        .any(|id| mine.contains(id))
                    && let Some(count) = bought.get_mut(&j)
                {
                    *count += i64::from(q);
                }
            }
            each.push(BatchAnswer::Placed(Order {
                id: Uuid::new_v4(),
                status: crate::orders::OrderStatus::Placed,
                total_cents: stock.price_cents * i64::from(q),
                lines: vec![OrderLine {
                    sku: job.sku().clone(),
                    name: stock.name.clone(),
                    quantity: q,
                    unit_price_cents: stock.price_cents,
                }],
                email: job.request.email().map(str::to_string),
                customer_name: job.request.name().map(str::to_string),
                created_at: now,
            }));
        } else {
            each.push(BatchAnswer::Short(vec![Shortage {
                sku: job.sku().to_string(),
                requested: q,
                available: stock.left.max(0),
            }]));
        }
    }

    // 3. One conditional update for each SKU's accepted total: the database still refuses
    //    to go below zero, or past a newer fence.
    let sold: Vec<(&str, i32)> = names
        .iter()
        .filter_map(|sku| {
            let taken = stocked.get(sku)?.taken;
            (taken > 0).then_some((*sku, taken))
        })
        .collect();
    if !sold.is_empty() {
        let (sold_skus, sold_units): (Vec<&str>, Vec<i32>) = sold.iter().copied().unzip();
        let changed = stock::sell_many(&mut tx, &sold_skus, &sold_units, fence).await?;
        if changed as usize != sold.len() {
            // Impossible under the row locks; refuse the whole batch rather than guess.
            return Err(sqlx::Error::Protocol(
                "a stock row changed under its lock".into(),
            ));
        }
    }
    let placed: Vec<(&Job, &Order)> = jobs
        .iter()
        .zip(&each)
        .filter_map(|(job, answer)| match answer {
            BatchAnswer::Placed(order) => Some((*job, order)),
            _ => None,
        })
        .collect();
    if !placed.is_empty() {
        match insert_orders(&mut tx, &placed).await {
            // A key got its order elsewhere meanwhile: start again, without it.
            Err(sqlx::Error::Database(e)) if e.is_unique_violation() => {
                tx.rollback().await?;
                return Ok(Applied::Raced);
            }
            other => other?,
        }
        // One `order.placed` event per order, by one statement.
        let placed_events = placed
            .iter()
            .map(|(_, order)| crate::events::Event::order_placed(order).payload)
            .collect();
        crate::events::db::record_many(
            &mut tx,
            crate::events::EventType::OrderPlaced,
            placed_events,
        )
        .await?;
    }

    // Every key the batch decided, recorded with its own answer. A request elsewhere that
    // claimed one of these keys since the read above holds this insert until it ends; if
    // it recorded the key, the batch starts again without it.
    let decisions: Vec<crate::idempotency::Decision<'_>> = jobs
        .iter()
        .zip(&each)
        .filter_map(|(job, answer)| {
            let (status, body) = match answer {
                BatchAnswer::Placed(order) => {
                    (201, serde_json::to_value(order).expect("orders serialise"))
                }
                BatchAnswer::Short(shortages) => {
                    (409, serde_json::json!({ "shortages": shortages }))
                }
                _ => return None,
            };
            Some(crate::idempotency::Decision {
                scope: job.scope.as_str(),
                key: job.key.as_str(),
                fingerprint: job.fingerprint.as_str(),
                response: crate::idempotency::StoredResponse { status, body },
            })
        })
        .collect();
    let recorded = crate::idempotency::store_decided(&mut *tx, &decisions).await?;
    if recorded as usize != decisions.len() {
        tx.rollback().await?;
        return Ok(Applied::Raced);
    }
    tx.commit().await?;
    let sold = sold
        .iter()
        .filter_map(|(sku, _)| Sku::parse(sku).ok())
        .collect();
    let sold_out = skus
        .into_iter()
        .filter(|sku| stocked.get(sku.as_str()).is_some_and(|s| s.left <= 0))
        .collect();
    Ok(Applied::Done(Answers {
        each,
        sold,
        sold_out,
    }))
}

/// The accepted orders, their lines and their ledger rows, each by one statement.
async fn insert_orders(
    conn: &mut sqlx::PgConnection,
    placed: &[(&Job, &Order)],
) -> sqlx::Result<()> {
    let ids: Vec<Uuid> = placed.iter().map(|(_, o)| o.id).collect();
    let names: Vec<Option<&str>> = placed
        .iter()
        .map(|(_, o)| o.customer_name.as_deref())
        .collect();
    let emails: Vec<Option<&str>> = placed.iter().map(|(_, o)| o.email.as_deref()).collect();
    let totals: Vec<i64> = placed.iter().map(|(_, o)| o.total_cents).collect();
    let scopes: Vec<&str> = placed.iter().map(|(j, _)| j.scope.as_str()).collect();
    let keys: Vec<&str> = placed.iter().map(|(j, _)| j.key.as_str()).collect();
    let created: Vec<chrono::DateTime<Utc>> = placed.iter().map(|(_, o)| o.created_at).collect();
    // unnest() flattens arrays of arrays, so each identity set travels as one string.
    let shoppers: Vec<String> = placed
        .iter()
        .map(|(j, _)| j.request.shopper().identities().join("\n"))
        .collect();
    let skus: Vec<&str> = placed.iter().map(|(j, _)| j.sku().as_str()).collect();
    let quantities: Vec<i32> = placed.iter().map(|(_, o)| o.lines[0].quantity).collect();
    let prices: Vec<i64> = placed
        .iter()
        .map(|(_, o)| o.lines[0].unit_price_cents)
        .collect();
    let orders = crate::orders::db::SingleLineOrders {
        ids: &ids,
        names: &names,
        emails: &emails,
        totals: &totals,
        scopes: &scopes,
        keys: &keys,
        created: &created,
        shoppers: &shoppers,
        skus: &skus,
        quantities: &quantities,
        unit_prices: &prices,
    };
    crate::orders::db::insert_single_line_orders(&mut *conn, &orders).await?;
    let references: Vec<String> = ids.iter().map(Uuid::to_string).collect();
    stock::record_sales(conn, &skus, &quantities, &references, &scopes).await?;
    Ok(())
}
