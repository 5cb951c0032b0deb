//! Idempotency SQL: the `idempotency_keys` rows, claimed, read, completed, purged.

use std::time::Duration;

use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use super::{Begin, Claim, Decision, Fingerprint, Found, IdempotencyKey, Scope, StoredResponse};

struct Row {
    fingerprint: String,
    state: String,
    owner: Uuid,
    response_status: Option<i16>,
    response_body: Option<serde_json::Value>,
    stale: bool,
}

/// Claims `key` for a request with `fingerprint`, on its own (committed at once). An
/// in-flight record older than `stale_after` belongs to a request that died; it is taken
/// over.
#[tracing::instrument(skip_all)]
pub async fn begin(
    pool: &PgPool,
    scope: Scope,
    key: &IdempotencyKey,
    fingerprint: &Fingerprint,
    stale_after: Duration,
) -> sqlx::Result<Begin> {
    let mut conn = pool.acquire().await?;
    begin_in(&mut conn, scope, key, fingerprint, stale_after).await
}

/// [`begin`] inside the caller's transaction: the claim is then invisible to others until
/// the transaction commits (a concurrent request with the same key waits for it, and then
/// finds the key completed), and vanishes if it rolls back — a request that dies leaves no
/// record behind.
#[tracing::instrument(skip_all)]
pub async fn begin_in(
    conn: &mut PgConnection,
    scope: Scope,
    key: &IdempotencyKey,
    fingerprint: &Fingerprint,
    stale_after: Duration,
) -> sqlx::Result<Begin> {
    let owner = Uuid::new_v4();
    let claim = Claim {
        scope,
        key: key.clone(),
        owner,
    };
    loop {
        let inserted = sqlx::query!(
            r#"insert into idempotency_keys (scope, key, fingerprint, state, owner)
               values ($1, $2, $3, 'in_flight', $4)
               on conflict (scope, key) do nothing"#,
            scope.as_str(),
            key.as_str(),
            fingerprint.0,
            owner,
        )
        .execute(&mut *conn)
        .await?
        .rows_affected();
        if inserted == 1 {
            return Ok(Begin::Started(claim));
        }
        let found = lookup(&mut *conn, scope, key, fingerprint, stale_after).await?;
        let stale_owner = match found {
            // Removed between our insert and select (abandoned): try again.
            Found::Absent => continue,
            Found::Completed(stored) => return Ok(Begin::Replay(stored)),
            Found::Mismatch => return Ok(Begin::Mismatch),
            Found::InFlight => return Ok(Begin::InFlight),
            Found::Stale(stale_owner) => stale_owner,
        };
        // Take over a dead request's key; only one of several retries wins.
        let taken = sqlx::query!(
            r#"update idempotency_keys set owner = $4, locked_at = now()
                where scope = $1 and key = $2 and state = 'in_flight' and owner = $3"#,
            scope.as_str(),
            key.as_str(),
            stale_owner,
            owner,
        )
        .execute(&mut *conn)
        .await?
        .rows_affected();
        return Ok(if taken == 1 {
            Begin::Started(claim)
        } else {
            Begin::InFlight
        });
    }
}

/// Reads the record of `key` without claiming it: how a decided key is answered before
/// any work (a lease, a transaction) is spent on it.
#[tracing::instrument(skip_all)]
pub async fn lookup(
    conn: impl sqlx::PgExecutor<'_>,
    scope: Scope,
    key: &IdempotencyKey,
    fingerprint: &Fingerprint,
    stale_after: Duration,
) -> sqlx::Result<Found> {
    let row = sqlx::query_as!(
        Row,
        r#"select fingerprint, state, owner, response_status, response_body,
                  locked_at < now() - make_interval(secs => $3) as "stale!"
             from idempotency_keys
            where scope = $1 and key = $2"#,
        scope.as_str(),
        key.as_str(),
        stale_after.as_secs_f64(),
    )
    .fetch_optional(conn)
    .await?;
    Ok(match row {
        None => Found::Absent,
        Some(row) if row.fingerprint != fingerprint.0 => Found::Mismatch,
        Some(row) if row.state == "completed" => Found::Completed(StoredResponse {
            status: row.response_status.unwrap_or(500) as u16,
            body: row.response_body.unwrap_or(serde_json::Value::Null),
        }),
        Some(row) if row.stale => Found::Stale(row.owner),
        Some(_) => Found::InFlight,
    })
}

/// Which of `keys` (scope, key) have a record, in order.
#[tracing::instrument(skip_all)]
pub async fn present(
    conn: impl sqlx::PgExecutor<'_>,
    keys: &[(&str, &str)],
) -> sqlx::Result<Vec<bool>> {
    let scopes: Vec<&str> = keys.iter().map(|(s, _)| *s).collect();
    let names: Vec<&str> = keys.iter().map(|(_, k)| *k).collect();
    // Runtime, not `query_scalar!`: the macro's query cannot be made non-persistent.
    let found: Vec<i64> = sqlx::query_scalar(
        r#"select u.i from unnest($1::text[], $2::text[]) with ordinality as u(scope, key, i)
            where exists (select 1 from idempotency_keys k
                           where k.scope = u.scope and k.key = u.key)"#,
    )
    .bind(&scopes)
    .bind(&names)
    // Planned afresh each time: a plan kept from when the table was small reads all of it
    // (a join, or a scan per key once the table was analysed at a page or two), and the
    // table grows by every order.
    .persistent(false)
    .fetch_all(conn)
    .await?;
    let mut present = vec![false; keys.len()];
    for i in found {
        present[(i - 1) as usize] = true;
    }
    Ok(present)
}

/// Stores a decided `response` under a key that was never claimed (a decision reached
/// without a transaction of its own, such as "not enough stock"): one statement, one
/// commit. When the key has a record already, returns what it says instead.
#[tracing::instrument(skip_all)]
pub async fn store(
    conn: &mut PgConnection,
    scope: Scope,
    key: &IdempotencyKey,
    fingerprint: &Fingerprint,
    response: &StoredResponse,
    stale_after: Duration,
) -> sqlx::Result<Option<Found>> {
    let inserted = sqlx::query!(
        r#"insert into idempotency_keys
                  (scope, key, fingerprint, state, owner, response_status, response_body,
                   completed_at)
           values ($1, $2, $3, 'completed', $4, $5, $6, now())
           on conflict (scope, key) do nothing"#,
        scope.as_str(),
        key.as_str(),
        fingerprint.0,
        Uuid::new_v4(),
        response.status as i16,
        response.body,
    )
    .execute(&mut *conn)
    .await?
    .rows_affected();
    if inserted == 1 {
        return Ok(None);
    }
    lookup(conn, scope, key, fingerprint, stale_after)
        .await
        .map(Some)
}

/// Stores many decided answers (sold-out answers first kept in Redis); a key that has a
/// record already keeps it, and a key given twice (answered again after its answer
/// lapsed in Redis) is stored once, with its first answer. Returns how many were stored.
#[tracing::instrument(skip_all)]
pub async fn store_decided(db: &PgPool, decisions: &[Decision<'_>]) -> sqlx::Result<u64> {
    let mut seen = std::collections::HashSet::new();
    let mut decisions: Vec<&Decision<'_>> = decisions
        .iter()
        .filter(|d| seen.insert((d.scope, d.key)))
        .collect();
    let mut attempts = 0;
    loop {
        attempts += 1;
        match insert_decided(db, &decisions).await {
            Err(sqlx::Error::Database(e)) if e.is_unique_violation() && attempts < 5 => {
                // The statement wrote nothing: leave out the keys recorded meanwhile.
                let keys: Vec<(&str, &str)> = decisions.iter().map(|d| (d.scope, d.key)).collect();
                let present = present(db, &keys).await?;
                let mut present = present.into_iter();
                decisions.retain(|_| !present.next().unwrap_or(false));
            }
            stored => return stored,
        }
    }
}

/// One insert of every decision. Plain, not `on conflict`: that makes each row a
/// speculative insertion, which costs PostgreSQL about twice the row itself, while a key
/// here is almost never recorded already (only when a copy's commit went unacknowledged
/// and its answers came back); then the statement fails on the primary key, writing
/// nothing, and [`store_decided`] leaves that key out.
async fn insert_decided(db: &PgPool, decisions: &[&Decision<'_>]) -> sqlx::Result<u64> {
    let scopes: Vec<&str> = decisions.iter().map(|d| d.scope).collect();
    let keys: Vec<&str> = decisions.iter().map(|d| d.key).collect();
    let fingerprints: Vec<&str> = decisions.iter().map(|d| d.fingerprint).collect();
    let statuses: Vec<i16> = decisions.iter().map(|d| d.response.status as i16).collect();
    let bodies: Vec<&serde_json::Value> = decisions.iter().map(|d| &d.response.body).collect();
    Ok(sqlx::query!(
        r#"insert into idempotency_keys
                  (scope, key, fingerprint, state, owner, response_status, response_body,
                   completed_at)
           select scope, key, fingerprint, 'completed', $6, status, body, now()
             from unnest($1::text[], $2::text[], $3::text[], $4::int2[], $5::jsonb[])
                  as u(scope, key, fingerprint, status, body)"#,
        &scopes as &[&str],
        &keys as &[&str],
        &fingerprints as &[&str],
        &statuses,
        &bodies as &[&serde_json::Value],
        Uuid::new_v4(),
    )
    .execute(db)
    .await?
    .rows_affected())
}

/// Stores the response under the claimed key, inside the caller's transaction. Returns
/// false when the claim was lost (taken over as stale): the caller must roll back.
#[tracing::instrument(skip_all)]
pub async fn complete(
    conn: &mut PgConnection,
    claim: &Claim,
    response: &StoredResponse,
) -> sqlx::Result<bool> {
    let updated = sqlx::query!(
        r#"update idempotency_keys
              set state = 'completed', response_status = $4, response_body = $5,
                  completed_at = now()
            where scope = $1 and key = $2 and owner = $3 and state = 'in_flight'"#,
        claim.scope.as_str(),
        claim.key.as_str(),
        claim.owner,
        response.status as i16,
        response.body,
    )
    .execute(conn)
    .await?
    .rows_affected();
    Ok(updated == 1)
}

/// Forgets the claim, so a retry starts afresh (for outcomes that are not stored).
#[tracing::instrument(skip_all)]
pub async fn abandon(pool: &PgPool, claim: &Claim) -> sqlx::Result<()> {
    sqlx::query!(
        r#"delete from idempotency_keys
            where scope = $1 and key = $2 and owner = $3 and state = 'in_flight'"#,
        claim.scope.as_str(),
        claim.key.as_str(),
        claim.owner,
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// The response stored under a completed key, whatever request it answered (for pages
/// that show the outcome of a form by its key).
#[tracing::instrument(skip_all)]
pub async fn stored(
    pool: &PgPool,
    scope: Scope,
    key: &IdempotencyKey,
) -> sqlx::Result<Option<StoredResponse>> {
    let row = sqlx::query!(
        r#"select response_status as "status!", response_body as "body!"
             from idempotency_keys
            where scope = $1 and key = $2 and state = 'completed'"#,
        scope.as_str(),
        key.as_str(),
    )
    .fetch_optional(pool)
    .await?;
    Ok(row.map(|row| StoredResponse {
        status: row.status as u16,
        body: row.body,
    }))
}

/// Deletes up to `limit` of the oldest completed records older than `ttl`, skipping rows
/// another process is purging. Returns how many went.
#[tracing::instrument(skip_all)]
pub async fn purge(pool: &PgPool, ttl: Duration, limit: i64) -> sqlx::Result<u64> {
    Ok(sqlx::query!(
        r#"with old as (
               select scope, key from idempotency_keys
                where state = 'completed' and created_at < now() - make_interval(secs => $1)
                order by created_at
                limit $2
                  for update skip locked
           )
           delete from idempotency_keys k using old
            where k.scope = old.scope and k.key = old.key"#,
        ttl.as_secs_f64(),
        limit,
    )
    .execute(pool)
    .await?
    .rows_affected())
}

/// Deletes in-flight records whose request died longer than `stale_after` ago (they never
/// have an order: completing the record is part of the order's transaction; a request
/// still running on one finds its claim gone and answers with what the key holds then).
/// Cheap enough to run every second: a partial index holds only in-flight records.
#[tracing::instrument(skip_all)]
pub async fn purge_stale(pool: &PgPool, stale_after: Duration) -> sqlx::Result<u64> {
    Ok(sqlx::query!(
        r#"delete from idempotency_keys
            where state = 'in_flight' and locked_at < now() - make_interval(secs => $1)"#,
        stale_after.as_secs_f64(),
    )
    .execute(pool)
    .await?
    .rows_affected())
}
