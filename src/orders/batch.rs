//! The `batched` strategy: group commit for a hot SKU.
//!
//! A hot SKU is one row, and one row takes one commit at a time; so instead of one
//! transaction per order, concurrent single-SKU orders for the same SKU queue in this
//! process behind one leader task. The leader takes the SKU's lease once (exclusion and a
//! fence across processes, exactly as `redis-lock`), then applies the whole batch in one
//! transaction:
//!
//! 1. the stock row is locked (`for update`) and the price read (no such product: every
//!    order of the batch is refused, nothing written);
//! 2. every key of the batch is claimed by one insert (a key already decided, or twice in
//!    the batch, is left out and answered from its record after the commit), and units
//!    are allocated in arrival order, each order accepted while enough is left, the others
//!    refused with their own shortage;
//! 3. one conditional update takes the accepted total (it still refuses to go below zero or
//!    past a newer fence), and set-based inserts (`unnest`) write every order, line and
//!    ledger row, and complete every key with its own answer;
//! 4. one COMMIT, then every request gets its own answer.
//!
//! A request never poisons its batch: it is parsed and validated before it queues, and a
//! key decided elsewhere simply drops out. A queued request costs the database nothing of
//! its own: its key, its SKU and its stock are all read by the batch's transaction. Orders of several SKUs, and holds, take
//! the per-request path: their SKU sets rarely coincide, so they would batch alone.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use chrono::Utc;
use sqlx::PgPool;
use tokio::sync::{mpsc, oneshot};
use uuid::Uuid;

use super::{Order, OrderError, OrderRequest, Shortage};
use crate::catalog::Sku;
use crate::catalog::cache::CatalogCache;
use crate::config::Settings;
use crate::idempotency::{Fingerprint, IdempotencyKey, Scope};
use crate::inventory::db as stock;
use crate::locking::{Acquire, Redis};
use crate::metrics::Metrics;

/// One single-SKU order for its SKU's queue.
pub struct Job {
    pub scope: Scope,
    pub key: IdempotencyKey,
    pub fingerprint: Fingerprint,
    pub request: OrderRequest,
}

/// A job in the queue, with the way back to the request waiting for it.
type Queued = (Job, oneshot::Sender<BatchAnswer>);

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
    FromRedis(super::sold_out::Answer),
    /// Nothing was decided; the request fails with this (and may be retried).
    Failed(OrderError),
}

/// The per-SKU queues of this process, and what their leaders need.
pub struct Batcher {
    queues: Mutex<HashMap<Sku, mpsc::UnboundedSender<Queued>>>,
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
            queues: Mutex::default(),
            db,
            redis,
            settings,
            metrics,
            catalog,
        }
    }

    /// Queues `job` behind the leader of `sku` (starting one if there is none) and waits
    /// for its answer.
    pub async fn submit(self: &Arc<Self>, sku: Sku, job: Job) -> BatchAnswer {
        let (answer, rx) = oneshot::channel();
        {
            let mut queues = self.queues.lock().expect("batch queues");
            let queue = match queues.get(&sku) {
                Some(queue) => queue.clone(),
                None => {
                    let (queue, jobs) = mpsc::unbounded_channel();
                    queues.insert(sku.clone(), queue.clone());
                    let leader = Arc::clone(self);
                    tokio::spawn(leader.lead(sku, jobs));
                    queue
                }
            };
            // The leader leaves only under this lock, after seeing its queue empty.
            let _ = queue.send((job, answer));
        }
        rx.await.unwrap_or(BatchAnswer::Failed(OrderError::Busy))
    }

    /// The leader of one SKU: applies batches while orders keep coming, then leaves.
    async fn lead(self: Arc<Self>, sku: Sku, mut jobs: mpsc::UnboundedReceiver<Queued>) {
        let s = &self.settings;
        loop {
            let mut batch = Vec::new();
            while batch.len() < s.batch_max {
                match jobs.try_recv() {
                    Ok(job) => batch.push(job),
                    Err(_) => break,
                }
            }
            if batch.is_empty() {
                let mut queues = self.queues.lock().expect("batch queues");
                if jobs.is_empty() {
                    queues.remove(&sku);
                    return;
                }
                continue;
            }
            if !s.batch_wait.is_zero() && batch.len() < s.batch_max {
                let until = tokio::time::Instant::now() + s.batch_wait;
                while batch.len() < s.batch_max {
                    match tokio::time::timeout_at(until, jobs.recv()).await {
                        Ok(Some(job)) => batch.push(job),
                        _ => break,
                    }
                }
            }
            self.metrics.batch_size.observe(batch.len() as f64);
            self.apply(&sku, batch).await;
        }
    }

    /// Applies one batch under the SKU's lease and answers every job in it.
    async fn apply(&self, sku: &Sku, batch: Vec<Queued>) {
        let Some(batch) = self.answer_sold_out(sku, batch).await else {
            return;
        };
        let Some(batch) = self.answer_from_redis(batch).await else {
            return;
        };
        let (jobs, answers): (Vec<Job>, Vec<_>) = batch.into_iter().unzip();
        let s = &self.settings;
        let deadline = Instant::now() + s.lease_wait;
        let mut attempts = 0;
        let outcome = loop {
            attempts += 1;
            let wait = deadline.saturating_duration_since(Instant::now());
            let lease = match self
                .redis
                .acquire(std::slice::from_ref(sku), s.lease_ttl, wait)
                .await
            {
                Acquire::Granted(lease) => Some(lease),
                // Sold out says the hint: the transaction confirms it and answers every
                // order in one commit, no lease needed.
                Acquire::Degraded | Acquire::SoldOutHint(_) => None,
                Acquire::Busy => {
                    self.metrics.lease_timeouts.inc();
                    break Err(OrderError::Busy);
                }
            };
            let fence = lease.as_ref().map(|l| l.fence);
            let work = tokio::time::timeout(s.tx_timeout, transact(&self.db, sku, &jobs, fence));
            let result = self
                .redis
                .while_held(lease.as_ref(), s.lease_ttl, work)
                .await;
            if let Some(lease) = &lease {
                self.redis.release(lease).await;
            }
            match result {
                Err(_) => break Err(OrderError::TimedOut),
                Ok(Err(e)) => break Err(OrderError::Database(e)),
                Ok(Ok(Applied::StaleFence { last_fence })) => {
                    self.metrics.stale_fences.inc();
                    self.redis.raise_fence(last_fence).await;
                    if attempts >= super::place::MAX_ATTEMPTS || Instant::now() >= deadline {
                        break Err(OrderError::Busy);
                    }
                }
                Ok(Ok(Applied::Done(answers))) => break Ok(answers),
                Ok(Ok(Applied::Unknown)) => {
                    break Err(OrderError::UnknownSkus(vec![sku.to_string()]));
                }
            }
        };
        match outcome {
            Ok(decided) => {
                if decided.sold_out {
                    if decided.sold_any {
                        self.catalog.forget(sku);
                    }
                    self.redis.hint_sold_out(sku).await;
                }
                for (to, answer) in answers.into_iter().zip(decided.each) {
                    let _ = to.send(answer);
                }
            }
            Err(error) => {
                for to in answers {
                    let _ = to.send(BatchAnswer::Failed(copy_error(&error)));
                }
            }
        }
    }
}

impl Batcher {
    /// While this process believes `sku` sold out: answers the batch from Redis (one
    /// read of PostgreSQL for all its keys, one Redis call, no write); keys with a record
    /// in PostgreSQL are answered from it by their own requests. Returns the jobs still
    /// to decide, `None` when none are left.
    async fn answer_sold_out(&self, sku: &Sku, batch: Vec<Queued>) -> Option<Vec<Queued>> {
        if !self.redis.believes_sold_out(std::slice::from_ref(sku)) {
            return Some(batch);
        }
        let keys: Vec<(&str, &str)> = batch
            .iter()
            .map(|(job, _)| (job.scope.as_str(), job.key.as_str()))
            .collect();
        let Ok(present) = crate::idempotency::present(&self.db, &keys).await else {
            return Some(batch);
        };
        let (mut asking, mut rest) = (Vec::new(), Vec::new());
        for ((job, to), present) in batch.into_iter().zip(present) {
            if present {
                let _ = to.send(BatchAnswer::DecidedElsewhere);
            } else {
                asking.push((job, to));
            }
        }
        let questions: Vec<super::sold_out::Asking<'_>> = asking
            .iter()
            .map(|(job, _)| super::sold_out::Asking {
                scope: job.scope,
                key: &job.key,
                fingerprint: &job.fingerprint,
                requested: job.request.lines()[0].quantity.get(),
            })
            .collect();
        let answers = super::sold_out::answer_many(&self.redis, sku, &questions).await;
        drop(questions);
        let Some(answers) = answers else {
            return (!asking.is_empty()).then_some(asking);
        };
        for ((job, to), answer) in asking.into_iter().zip(answers) {
            match answer {
                super::sold_out::Answer::Elsewhere => rest.push((job, to)),
                answer => {
                    let _ = to.send(BatchAnswer::FromRedis(answer));
                }
            }
        }
        (!rest.is_empty()).then_some(rest)
    }

    /// Marks the batch's keys as decided in PostgreSQL (so no twin is answered from
    /// Redis), and answers the jobs whose key has a sold-out answer kept in Redis; returns
    /// the others, `None` when none are left.
    async fn answer_from_redis(&self, batch: Vec<Queued>) -> Option<Vec<Queued>> {
        let keys: Vec<(&str, &str)> = batch
            .iter()
            .map(|(job, _)| (job.scope.as_str(), job.key.as_str()))
            .collect();
        let stale = super::stale_after(&self.settings);
        let Some(stored) = self.redis.mark_keys(&keys, stale).await else {
            return Some(batch);
        };
        let mut rest = Vec::with_capacity(batch.len());
        for ((job, to), stored) in batch.into_iter().zip(stored) {
            let answer = stored.map(|s| super::sold_out::replay(&s, &job.fingerprint));
            match answer {
                None | Some(super::sold_out::Answer::Elsewhere) => rest.push((job, to)),
                Some(answer) => {
                    let _ = to.send(BatchAnswer::FromRedis(answer));
                }
            }
        }
        (!rest.is_empty()).then_some(rest)
    }
}

/// The same failure for every job of a failed batch (each request then checks whether its
/// key was decided after all, as a single request would).
fn copy_error(error: &OrderError) -> OrderError {
    match error {
        OrderError::UnknownSkus(skus) => OrderError::UnknownSkus(skus.clone()),
        OrderError::TimedOut => OrderError::TimedOut,
        OrderError::Database(e) if crate::error::is_transient(e) => OrderError::Busy,
        OrderError::Database(e) => {
            OrderError::Database(sqlx::Error::Protocol(format!("batch failed: {e}")))
        }
        _ => OrderError::Busy,
    }
}

/// What the batch transaction did.
enum Applied {
    Done(Answers),
    /// A newer lease wrote the row: nothing was written.
    StaleFence {
        last_fence: i64,
    },
    /// No such product on sale: nothing was written.
    Unknown,
}

/// One answer per job, in job order.
struct Answers {
    each: Vec<BatchAnswer>,
    /// Nothing is left after the batch.
    sold_out: bool,
    /// The batch sold something.
    sold_any: bool,
}

/// The batch's one transaction (see the module documentation).
async fn transact(
    db: &PgPool,
    sku: &Sku,
    jobs: &[Job],
    fence: Option<i64>,
) -> sqlx::Result<Applied> {
    let owner = Uuid::new_v4();
    let mut tx = db.begin().await?;

    // 1. Lock the stock row and read today's price; a product that does not exist or is
    //    no longer sold ends the batch before any key is claimed.
    let locked = stock::lock_for_sale(&mut tx, sku).await?;
    let product = super::db::products_for(&mut *tx, std::slice::from_ref(sku))
        .await?
        .pop();
    let (Some((available, last_fence)), Some(product)) = (locked, product) else {
        tx.rollback().await?;
        return Ok(Applied::Unknown);
    };
    if let Some(fence) = fence
        && last_fence >= fence
    {
        tx.rollback().await?;
        return Ok(Applied::StaleFence { last_fence });
    }
    let (mut left, name, price) = (available, product.name, product.price_cents);

    // 2. Claim every key at once; those already taken drop out of the batch. Then
    //    allocate in arrival order.
    let scopes: Vec<&str> = jobs.iter().map(|j| j.scope.as_str()).collect();
    let keys: Vec<&str> = jobs.iter().map(|j| j.key.as_str()).collect();
    let fingerprints: Vec<&str> = jobs.iter().map(|j| j.fingerprint.as_str()).collect();
    let claimed: Vec<(String, String)> = sqlx::query_as(
        r#"insert into idempotency_keys (scope, key, fingerprint, state, owner)
           select scope, key, fingerprint, 'in_flight', $4
             from unnest($1::text[], $2::text[], $3::text[]) as u(scope, key, fingerprint)
           on conflict (scope, key) do nothing
           returning scope, key"#,
    )
    .bind(&scopes)
    .bind(&keys)
    .bind(&fingerprints)
    .bind(owner)
    .fetch_all(&mut *tx)
    .await?;
    let mut claims: HashSet<(&str, &str)> = claimed
        .iter()
        .map(|(s, k)| (s.as_str(), k.as_str()))
        .collect();
    // A key twice in the batch: the first holds the claim, the second replays it.
    let mine: Vec<bool> = jobs
        .iter()
        .map(|j| claims.remove(&(j.scope.as_str(), j.key.as_str())))
        .collect();

    let now = chrono::DateTime::from_timestamp_micros(Utc::now().timestamp_micros())
        .expect("now is representable");
    let mut each = Vec::with_capacity(jobs.len());
    let mut taken = 0;
    for (job, mine) in jobs.iter().zip(&mine) {
        if !mine {
            each.push(BatchAnswer::DecidedElsewhere);
            continue;
        }
        let line = &job.request.lines()[0];
        let q = line.quantity.get();
        if q <= left {
            left -= q;
            taken += q;
            each.push(BatchAnswer::Placed(Order {
                id: Uuid::new_v4(),
                status: "placed".into(),
                total_cents: price * i64::from(q),
                lines: vec![super::OrderLine {
                    sku: sku.to_string(),
                    name: name.clone(),
                    quantity: q,
                    unit_price_cents: price,
                }],
                email: job.request.email().map(str::to_string),
                customer_name: job.request.name().map(str::to_string),
                created_at: now,
            }));
        } else {
            each.push(BatchAnswer::Short(vec![Shortage {
                sku: sku.to_string(),
                requested: q,
                available: left.max(0),
            }]));
        }
    }

    // 3. One conditional update for the accepted total: the database still refuses to go
    //    below zero, or past a newer fence.
    if taken > 0
        && stock::sell_units(&mut tx, sku, taken, fence)
            .await?
            .is_none()
    {
        // Impossible under the row lock; refuse the whole batch rather than guess.
        return Err(sqlx::Error::Protocol(
            "the stock row changed under its lock".into(),
        ));
    }
    let placed: Vec<(&Job, &Order)> = jobs
        .iter()
        .zip(&each)
        .filter_map(|(job, answer)| match answer {
            BatchAnswer::Placed(order) => Some((job, order)),
            _ => None,
        })
        .collect();
    if !placed.is_empty() {
        insert_orders(&mut tx, sku, &placed).await?;
    }

    // Every claimed key completed with its own answer.
    let mut done_scopes = Vec::new();
    let mut done_keys = Vec::new();
    let mut statuses = Vec::new();
    let mut bodies = Vec::new();
    for (job, answer) in jobs.iter().zip(&each) {
        let (status, body) = match answer {
            BatchAnswer::Placed(order) => (201i16, serde_json::to_value(order)),
            BatchAnswer::Short(shortages) => {
                (409, Ok(serde_json::json!({ "shortages": shortages })))
            }
            _ => continue,
        };
        done_scopes.push(job.scope.as_str());
        done_keys.push(job.key.as_str());
        statuses.push(status);
        bodies.push(body.expect("answers serialise"));
    }
    let completed = sqlx::query(
        r#"update idempotency_keys k
              set state = 'completed', response_status = u.status, response_body = u.body,
                  completed_at = now()
             from unnest($1::text[], $2::text[], $3::int2[], $4::jsonb[])
                  as u(scope, key, status, body)
            where k.scope = u.scope and k.key = u.key and k.owner = $5
              and k.state = 'in_flight'"#,
    )
    .bind(&done_scopes)
    .bind(&done_keys)
    .bind(&statuses)
    .bind(&bodies)
    .bind(owner)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    if completed as usize != done_keys.len() {
        return Err(sqlx::Error::Protocol(
            "a batch key was claimed but could not be completed".into(),
        ));
    }
    tx.commit().await?;
    Ok(Applied::Done(Answers {
        each,
        sold_out: left <= 0,
        sold_any: taken > 0,
    }))
}

/// The accepted orders, their lines and their ledger rows, each by one statement.
async fn insert_orders(
    conn: &mut sqlx::PgConnection,
    sku: &Sku,
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
    sqlx::query(
        r#"insert into orders
             (id, status, customer_name, email, total_cents, idempotency_scope, idempotency_key, created_at)
           select id, 'placed', name, email, total, scope, key, created
             from unnest($1::uuid[], $2::text[], $3::text[], $4::bigint[], $5::text[],
                         $6::text[], $7::timestamptz[])
                  as u(id, name, email, total, scope, key, created)"#,
    )
    .bind(&ids)
    .bind(&names)
    .bind(&emails)
    .bind(&totals)
    .bind(&scopes)
    .bind(&keys)
    .bind(&created)
    .execute(&mut *conn)
    .await?;
    let quantities: Vec<i32> = placed.iter().map(|(_, o)| o.lines[0].quantity).collect();
    let prices: Vec<i64> = placed
        .iter()
        .map(|(_, o)| o.lines[0].unit_price_cents)
        .collect();
    sqlx::query(
        r#"insert into order_lines (order_id, sku, quantity, unit_price_cents)
           select id, $1, quantity, price
             from unnest($2::uuid[], $3::int[], $4::bigint[]) as u(id, quantity, price)"#,
    )
    .bind(sku.as_str())
    .bind(&ids)
    .bind(&quantities)
    .bind(&prices)
    .execute(&mut *conn)
    .await?;
    let references: Vec<String> = ids.iter().map(Uuid::to_string).collect();
    stock::record_sales(conn, sku, &quantities, &references, &scopes).await?;
    Ok(())
}
