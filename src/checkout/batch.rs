//! The `batched` strategy (the default): group commit, for orders and holds alike, of
//! one SKU or of several (a cart).
//!
//! A hot SKU is one row, and one row takes one commit at a time; a wide catalogue pays
//! one commit (one WAL flush) per order. So instead of one transaction per order,
//! concurrent orders and holds queue in this process behind one leader task, which
//! applies them in batches of up to `STOCKADE_BATCH_MAX`, whatever their SKUs:
//!
//! 1. orders for a SKU this process saw sold out queue apart, behind a leader of their
//!    own, which answers them from Redis with no write (see [`super::sold_out`]) and
//!    never waits for a lease or a commit; the other keys are marked in Redis as being decided in PostgreSQL, and a key that
//!    has an answer there already gets it;
//! 2. the leader takes the leases of the batch's SKUs that are free, all under one fence
//!    (exclusion and fencing across processes, as `redis-lock`); orders for a SKU whose
//!    lease another process holds wait for the next batch, and give up with 503 after
//!    `STOCKADE_LEASE_WAIT_MS`;
//! 3. one read ([`db::Asked::read`]) gets the stock rows, today's prices and which keys have a
//!    record (they drop out and are answered from it, as does the second of a key sent
//!    twice); units are allocated per SKU in arrival order, each order accepted while
//!    enough is left, the others refused with their own shortage;
//! 4. one write ([`db::write`]), a single statement and so atomic on its own: the
//!    conditional update of each SKU's accepted total (it refuses to go below zero or past
//!    a newer fence, and then nothing is written and the batch starts again from a fresh
//!    read), every order, line, ledger row and `order.placed` event by `unnest`, and every
//!    key, completed with its own answer. A request elsewhere that claimed one of the keys
//!    meanwhile holds that insert until it ends; if it recorded the key (or its order),
//!    the write fails on the unique index, nothing is written, the batch starts again and
//!    the key is answered from that record;
//! 5. every request gets its own answer, then the leases are released.
//!
//! Under a lease the read and the write are the whole transaction: two round trips, no
//! `BEGIN`, and the hot row locked only while the write runs. The lease keeps other
//! batches of the SKU out; the write's conditions catch anything else (a stale lease, a
//! hold or an order of several SKUs, which take no lease, an admin's count). Two cases lock
//! the rows for the whole transaction instead: no lease (Redis is down), and a SKU with a
//! purchase limit, whose count of what a shopper already has must not miss a hold placed
//! between the read and the write.
//!
//! A request never poisons its batch: it is parsed and validated before it queues, a key
//! decided elsewhere drops out, and a SKU no longer on sale refuses only its own orders.
//! A queued request costs the database nothing of its own: its key, its SKU and its stock
//! are read by the batch's transaction. A hold is allocated from the same free units as
//! an order (in arrival order, purchase limits counted alike) and written by the same
//! statement, as `reserved += q` with its hold row, line, ledger row and `hold.placed`
//! event; it expires `STOCKADE_HOLD_TTL` after the database's clock as the batch's read
//! saw it (so never later than a hold placed on its own would). A cart (several SKUs)
//! joins a batch once the leases of all its SKUs are the batch's, and is allocated all or
//! nothing: every line has its units, or it is refused with the shortage of each short
//! line; a SKU it shares with other jobs is allocated in arrival order as any other.
//! Carts never queue for the sold-out leader (Redis keeps sold-out answers of one SKU).
//! Confirmations of
//! holds are group-committed apart, by [`crate::holds::Confirmer`]: they take no stock
//! that is not theirs already, so they need no lease.

pub mod db;
mod decide;

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::PgPool;
use tokio::sync::oneshot;

use self::decide::{Applied, transact};
use super::placement::{MAX_ATTEMPTS, Made, OrderError, Want, stale_after};
use super::request::OrderRequest;
use super::sold_out::{self, Answer};
use crate::catalog::Sku;
use crate::catalog::cache::CatalogCache;
use crate::config::Settings;
use crate::idempotency::{Fingerprint, IdempotencyKey, Scope};
use crate::lane::{Lane, Queue};
use crate::locking::{AcquireFree, Lease, Redis};
use crate::metrics::Metrics;

/// One order or hold for the queue, of one SKU or several (a cart).
pub struct Job {
    pub want: Want,
    pub scope: Scope,
    pub key: IdempotencyKey,
    pub fingerprint: Fingerprint,
    pub request: OrderRequest,
    /// When its client is answered whatever happens: no batch takes it after that.
    pub answer_by: Instant,
}

impl Job {
    /// The SKU of a single-SKU job; a cart's first.
    fn sku(&self) -> &Sku {
        &self.request.lines()[0].sku
    }

    fn quantity(&self) -> i32 {
        self.request.lines()[0].quantity.get()
    }

    /// Every SKU it asks for, in SKU order.
    fn skus(&self) -> impl Iterator<Item = &Sku> {
        self.request.lines().iter().map(|l| &l.sku)
    }
}

/// A job in the queue: the way back to the request waiting for it, and when it came.
struct Queued {
    job: Job,
    answer: oneshot::Sender<BatchAnswer>,
    since: Instant,
    /// Redis was asked for a sold-out answer already, and sent it on to PostgreSQL.
    past_sold_out: bool,
}

impl Queued {
    fn answer(self, answer: BatchAnswer) {
        let _ = self.answer.send(answer);
    }
}

/// What the leader tells one waiting request.
#[derive(Debug)]
pub enum BatchAnswer {
    /// The order or hold was made (201).
    Made(Made),
    /// Not enough stock (409), stored under the key.
    Short(Vec<crate::orders::Shortage>),
    /// The key was decided by another request: answer from its record.
    DecidedElsewhere,
    /// The key has a sold-out answer kept in Redis: this.
    FromRedis(Answer),
    /// Nothing was decided; the request fails with this (and may be retried).
    Failed(OrderError),
}

/// The queue of this process, and what its leader needs.
pub struct Batcher {
    /// Where jobs wait for the batch leader.
    queue: Lane<Queued>,
    /// The same for orders of a SKU this process saw sold out, answered from Redis by a
    /// leader of their own ([`Batcher::lead_sold_out`]) that never waits for a lease or
    /// a commit.
    sold_out_queue: Lane<Queued>,
    /// The leaders' own connections (see `startup::Leaders`).
    db: PgPool,
    redis: Redis,
    settings: Arc<Settings>,
    metrics: Arc<Metrics>,
    catalog: Arc<CatalogCache>,
    /// Where leaders run: the runtime the batcher was made on, not the worker whose
    /// request started them.
    runtime: tokio::runtime::Handle,
}

impl Batcher {
    /// A batcher whose leaders use `db` (the leaders' pool) and run on the runtime it is
    /// made on.
    pub fn new(
        db: PgPool,
        redis: Redis,
        settings: Arc<Settings>,
        metrics: Arc<Metrics>,
        catalog: Arc<CatalogCache>,
    ) -> Self {
        Self {
            queue: Lane::default(),
            sold_out_queue: Lane::default(),
            db,
            redis,
            settings,
            metrics,
            catalog,
            runtime: tokio::runtime::Handle::current(),
        }
    }

    /// Queues `job` behind the leader (starting one if there is none) and waits for its
    /// answer.
    pub async fn submit(self: &Arc<Self>, job: Job) -> BatchAnswer {
        let (answer, rx) = oneshot::channel();
        self.enqueue(Queued {
            job,
            answer,
            since: Instant::now(),
            past_sold_out: false,
        });
        rx.await.unwrap_or(BatchAnswer::Failed(OrderError::Busy))
    }

    /// Puts `queued` behind the leader of its queue, starting one if there is none: the
    /// sold-out queue if its SKU was seen sold out (and Redis was not asked yet), else the
    /// batch queue.
    fn enqueue(self: &Arc<Self>, queued: Queued) {
        let sold_out = self.for_sold_out_queue(&queued);
        self.enqueue_to(sold_out, queued);
    }

    /// Whether `queued` is for a SKU this process saw sold out, not yet asked of Redis.
    /// (A cart is decided by the batch: Redis keeps sold-out answers of one SKU.)
    fn for_sold_out_queue(&self, queued: &Queued) -> bool {
        !queued.past_sold_out
            && queued.job.request.lines().len() == 1
            && self
                .redis
                .believes_sold_out(std::slice::from_ref(queued.job.sku()))
    }

    fn enqueue_to(self: &Arc<Self>, sold_out: bool, queued: Queued) {
        if sold_out {
            self.sold_out_queue.send(queued, |jobs| {
                self.runtime.spawn(Arc::clone(self).lead_sold_out(jobs));
            });
        } else {
            self.queue.send(queued, |jobs| {
                self.runtime.spawn(Arc::clone(self).lead(jobs));
            });
        }
    }

    /// The sold-out leader: answers from Redis whatever queued while it answered the last
    /// lot (one read of PostgreSQL and one Redis call per SKU for all of them), sends what
    /// Redis cannot answer to the batch queue, and leaves when its queue runs dry.
    async fn lead_sold_out(self: Arc<Self>, mut jobs: Queue<Queued>) {
        loop {
            let mut lot = Vec::new();
            jobs.take_ready(&mut lot, self.settings.batch_max);
            if lot.is_empty() {
                if self.sold_out_queue.leave_if_dry(&jobs) {
                    return;
                }
                continue;
            }
            for mut q in self.answer_sold_out(lot).await {
                q.past_sold_out = true;
                self.enqueue(q);
            }
        }
    }

    /// The leader: applies batches while orders keep coming, then leaves. Orders whose
    /// SKU was leased elsewhere go first into the next batch.
    async fn lead(self: Arc<Self>, mut jobs: Queue<Queued>) {
        let s = &self.settings;
        let mut waiting: VecDeque<Queued> = VecDeque::new();
        let mut backoff = Duration::from_millis(1);
        // The last batch's leases, released together with the next batch's first Redis
        // call (one round trip for both), or at once when nothing follows.
        let mut to_release: Option<Lease> = None;
        loop {
            let mut batch: Vec<Queued> = Vec::new();
            while batch.len() < s.batch_max {
                match waiting.pop_front() {
                    Some(q) => batch.push(q),
                    None => break,
                }
            }
            let retried = batch.len();
            jobs.take_ready(&mut batch, s.batch_max);
            if batch.is_empty() || retried == batch.len() {
                self.release(to_release.take().as_ref()).await;
            }
            if batch.is_empty() {
                if self.queue.leave_if_dry(&jobs) {
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
            let (later, lease) = self.apply(batch, to_release.take()).await;
            waiting.extend(later);
            to_release = lease;
        }
    }

    /// Applies one batch and answers every job in it, except those whose SKU's lease is
    /// held elsewhere: they are returned, to wait for the next batch. `previous` (the last
    /// batch's leases) is released by the batch's first Redis round trip; the leases of a
    /// batch that committed are returned, for the next batch to release the same way.
    async fn apply(
        self: &Arc<Self>,
        batch: Vec<Queued>,
        previous: Option<Lease>,
    ) -> (Vec<Queued>, Option<Lease>) {
        let batch = self.send_sold_out_aside(batch);
        let s = &self.settings;
        let mut skus: Vec<Sku> = batch.iter().flat_map(|q| q.job.skus().cloned()).collect();
        skus.sort_unstable();
        skus.dedup();
        if batch.is_empty() {
            self.release(previous.as_ref()).await;
            return (Vec::new(), None);
        }
        // Three calls, one round trip: the commands leave on the one Redis connection in
        // this order (the release first, so this batch can lease what the last one held).
        let keys: Vec<(&str, &str)> = batch
            .iter()
            .map(|q| (q.job.scope.as_str(), q.job.key.as_str()))
            .collect();
        let stale = stale_after(s);
        let (_, marked, acquired) = tokio::join!(
            self.release(previous.as_ref()),
            self.redis.mark_keys(&keys, stale),
            self.redis.acquire_free(&skus, s.lease_ttl),
        );
        drop(keys);
        let mut batch = answer_marked(batch, marked);
        let mut acquired = Some(acquired);

        let mut attempts = 0;
        loop {
            attempts += 1;
            let acquired = match acquired.take() {
                Some(acquired) => acquired,
                None => self.redis.acquire_free(&skus, s.lease_ttl).await,
            };
            let (lease, granted) = match acquired {
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
                .partition(|q| q.job.skus().all(|sku| leased.contains(sku)));
            let later = self.give_up_on_stale(later);
            if !s.fault_pause_after_lease.is_zero() {
                // A stalled process: nothing of it runs, its lease watchdog included.
                tokio::time::sleep(s.fault_pause_after_lease).await;
            }
            let now = answered_already(now);
            if now.is_empty() {
                self.release(lease.as_ref()).await;
                return (later, None);
            }
            self.metrics.batch_size.observe(now.len() as f64);
            let fence = lease.as_ref().map(|l| l.fence);
            let jobs: Vec<&Job> = now.iter().map(|q| &q.job).collect();
            let work = crate::pg::cut_off(
                s.tx_timeout,
                transact(
                    &self.db,
                    &jobs,
                    fence,
                    s.hold_ttl,
                    crate::holds::cap::Caps::of(s),
                ),
            );
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
                    if attempts < MAX_ATTEMPTS {
                        batch = now.into_iter().chain(later).collect();
                        continue;
                    }
                    OrderError::Busy
                }
                Ok(Ok(Applied::Raced)) => {
                    if attempts < MAX_ATTEMPTS {
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
                    for sku in &decided.sold_out {
                        self.redis.hint_sold_out(sku).await;
                    }
                    return (later, lease);
                }
            };
            for q in now {
                q.answer(BatchAnswer::Failed(error.copied()));
            }
            return (later, None);
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

    /// Hands the orders for SKUs this process saw sold out since they queued to the
    /// sold-out queue; returns the others.
    fn send_sold_out_aside(self: &Arc<Self>, batch: Vec<Queued>) -> Vec<Queued> {
        let mut rest = Vec::with_capacity(batch.len());
        for q in batch {
            if self.for_sold_out_queue(&q) {
                self.enqueue_to(true, q);
            } else {
                rest.push(q);
            }
        }
        rest
    }

    /// Answers from Redis the orders for SKUs this process saw sold out (one read of
    /// PostgreSQL for all their keys, one Redis call per SKU, no write); keys with a
    /// record in PostgreSQL are answered from it by their own requests. Returns the rest.
    async fn answer_sold_out(&self, believed: Vec<Queued>) -> Vec<Queued> {
        let mut rest = Vec::new();
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
}

/// The jobs of `now` whose clients are still waiting; the others (cut off by their
/// budget, or gone) are answered "timed out" and take no part in the transaction about
/// to start.
fn answered_already(now: Vec<Queued>) -> Vec<Queued> {
    let at = Instant::now();
    let (late, live): (Vec<Queued>, Vec<Queued>) = now
        .into_iter()
        .partition(|q| at >= q.job.answer_by || q.answer.is_closed());
    for q in late {
        q.answer(BatchAnswer::Failed(OrderError::TimedOut));
    }
    live
}

/// Answers the jobs whose key has a sold-out answer kept in Redis (`marked`, from
/// [`Redis::mark_keys`], which also marked the others as decided in PostgreSQL so no twin
/// is answered from Redis); returns the others.
fn answer_marked(batch: Vec<Queued>, marked: Option<Vec<Option<String>>>) -> Vec<Queued> {
    let Some(stored) = marked else {
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
