//! [`run`]: a change applied at most once per idempotency key, by the protocol the orders
//! follow. The key is claimed (committed at once, so a twin request sees it in flight); the
//! change runs in a transaction that [`run`] opens, and the key is completed with the
//! change's answer in that same transaction, so the change and the record of it commit
//! together or not at all. A change that refuses (its `Err`, never stored) rolls back and
//! releases the key, so a retry starts afresh. A request that dies mid-way leaves a claim
//! whose lock runs out; the next retry takes it over, and the dead request, if it wakes,
//! finds its claim gone and rolls back ([`RunError::TakenOver`]). A change that commits on
//! its own (an order's cancel, a hold's release) goes through [`run_apart`]: it runs with no
//! connection held for it, and the key is completed just after.

use std::time::{Duration, Instant};

use sqlx::{PgConnection, PgPool, Postgres, Transaction};

use super::{Begin, Fingerprint, IdempotencyKey, Scope, StoredResponse, abandon, begin, complete};

/// The key a change is applied under, and how long to wait for a twin already running.
#[derive(Debug, Clone)]
pub struct Request {
    pub scope: Scope,
    pub key: IdempotencyKey,
    /// The fingerprint of the change's canonical values: the same key with other values
    /// is a [`Once::Mismatch`].
    pub fingerprint: Fingerprint,
    /// An in-flight claim older than this belongs to a request that died.
    pub stale_after: Duration,
    /// While the key's first request is still running, wait this long for its answer
    /// before answering [`Once::InFlight`] (zero: answer at once).
    pub wait: Duration,
}

/// What applying a change under a key came to (the change's refusal aside).
#[derive(Debug, Clone, PartialEq)]
pub enum Once {
    /// The change ran now; this answer is stored under the key.
    Applied(StoredResponse),
    /// The change ran before under this key: its stored answer. Nothing ran now.
    Replayed(StoredResponse),
    /// The key was used before for a change with other values. Nothing ran.
    Mismatch,
    /// The key's first request is still running. Nothing ran.
    InFlight,
}

/// Why [`run`] could not say what happened.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Database(#[from] sqlx::Error),
    /// The claim went stale while the change ran and a retry took the key over; the
    /// change was rolled back.
    #[error("the request was taken over by a retry")]
    TakenOver,
}

/// Applies `change` at most once per `request.key`; see the module documentation.
///
/// `change` gets the open transaction and answers what to store under the key. A change
/// that commits on its own goes through [`run_apart`] instead, so that it does not take a
/// second connection while this transaction holds one. The outer error is the machinery's,
/// the inner one the change's refusal.
pub async fn run<E, F>(
    pool: &PgPool,
    request: Request,
    change: F,
) -> Result<Result<Once, E>, RunError>
where
    F: AsyncFnOnce(&mut PgConnection) -> Result<StoredResponse, E>,
{
    let claim = match claim(pool, request).await? {
        Claimed::Started(claim) => claim,
        Claimed::Done(once) => return Ok(Ok(once)),
    };
    let mut tx = match pool.begin().await {
        Ok(tx) => tx,
        Err(e) => {
            abandon(pool, &claim).await?;
            return Err(e.into());
        }
    };
    match change(&mut *tx).await {
        Ok(response) => Ok(Ok(finish(tx, &claim, response).await?)),
        Err(refused) => {
            tx.rollback().await?;
            abandon(pool, &claim).await?;
            Ok(Err(refused))
        }
    }
}

/// Applies `change`, a change that commits on its own (it locks rows or takes a lease in
/// transactions of its own), at most once per `request.key`: as [`run`], except that no
/// connection is held while it runs, and the key is completed with its answer in a short
/// transaction just after. Holding one while the change waited for a second would let a
/// burst of such requests take every connection of the pool and wait for one more, until
/// the pool's timeout answered them all 503.
///
/// The change must be safe to repeat: a request that dies between the change and the
/// completion leaves a claim whose retry runs it again.
pub async fn run_apart<E, F>(
    pool: &PgPool,
    request: Request,
    change: F,
) -> Result<Result<Once, E>, RunError>
where
    F: AsyncFnOnce() -> Result<StoredResponse, E>,
{
    let claim = match claim(pool, request).await? {
        Claimed::Started(claim) => claim,
        Claimed::Done(once) => return Ok(Ok(once)),
    };
    match change().await {
        Ok(response) => Ok(Ok(finish(pool.begin().await?, &claim, response).await?)),
        Err(refused) => {
            abandon(pool, &claim).await?;
            Ok(Err(refused))
        }
    }
}

/// Completes `claim` with `response` in `tx` and commits both, or rolls back when a retry
/// took the key over.
async fn finish(
    mut tx: Transaction<'_, Postgres>,
    claim: &super::Claim,
    response: StoredResponse,
) -> Result<Once, RunError> {
    if !complete(&mut tx, claim, &response).await? {
        tx.rollback().await?;
        return Err(RunError::TakenOver);
    }
    tx.commit().await?;
    Ok(Once::Applied(response))
}

/// What claiming a key came to: this request runs the change, or it is answered already.
enum Claimed {
    Started(super::Claim),
    Done(Once),
}

/// Claims `request.key`, waiting up to `request.wait` for a twin still running.
async fn claim(pool: &PgPool, request: Request) -> Result<Claimed, RunError> {
    let Request {
        scope,
        key,
        fingerprint,
        stale_after,
        wait,
    } = request;
    let deadline = Instant::now() + wait;
    let mut pause = Duration::from_millis(20);
    loop {
        match begin(pool, scope, &key, &fingerprint, stale_after).await? {
            Begin::Started(claim) => return Ok(Claimed::Started(claim)),
            Begin::Replay(stored) => return Ok(Claimed::Done(Once::Replayed(stored))),
            Begin::Mismatch => return Ok(Claimed::Done(Once::Mismatch)),
            Begin::InFlight if Instant::now() < deadline => {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(200));
            }
            Begin::InFlight => return Ok(Claimed::Done(Once::InFlight)),
        }
    }
}
