//! Idempotency keys, with the semantics of the IETF `Idempotency-Key` draft as Stripe
//! implements them:
//! - a completed key with the same request fingerprint replays the stored response;
//! - the same key with another fingerprint is refused (422);
//! - the same key while its first request is still running is refused (409, retry);
//! - orders and holds claim their key inside their own transaction ([`begin_in`]): a
//!   concurrent request with the same key waits for that transaction and then replays its
//!   answer, and a request that dies leaves no record at all;
//! - other callers claim with [`begin`] (committed at once); a request that died in flight
//!   then leaves a record whose lock runs out, and the next retry takes it over, or the
//!   purge deletes it. Completing the record happens in the change's own transaction, so a
//!   taken-over key can never already have its change.
//!
//! Decided outcomes (an order, or "not enough stock") are stored; validation failures and
//! "busy, try again" are not, and their record is removed.

mod run;
pub use run::{Once, Request, RunError, run};

use std::time::Duration;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

/// A client-chosen key: 1–255 printable ASCII characters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotencyKey(String);

/// Why a key was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum InvalidKey {
    #[error("the Idempotency-Key is empty")]
    Empty,
    #[error("the Idempotency-Key is longer than 255 characters")]
    TooLong,
    #[error("the Idempotency-Key may contain only printable ASCII characters")]
    NotPrintable,
}

impl IdempotencyKey {
    pub const MAX_LEN: usize = 255;

    pub fn parse(raw: &str) -> Result<Self, InvalidKey> {
        if raw.is_empty() {
            return Err(InvalidKey::Empty);
        }
        if raw.len() > Self::MAX_LEN {
            return Err(InvalidKey::TooLong);
        }
        if !raw.bytes().all(|b| (0x20..=0x7e).contains(&b)) {
            return Err(InvalidKey::NotPrintable);
        }
        Ok(Self(raw.to_string()))
    }

    /// `raw` in the key space of `owner` (an API client, a browser): stored as
    /// `<owner>:<raw>`, so the same raw key sent by another owner is another key. `raw` was
    /// parsed (and its length checked) on its own; `owner` must not contain `:`.
    pub fn scoped(owner: &str, raw: &IdempotencyKey) -> Self {
        debug_assert!(
            !owner.contains(':'),
            "owners are separated by the first colon"
        );
        Self(format!("{owner}:{}", raw.0))
    }

    /// A fresh random key, as checkout forms carry.
    pub fn generate() -> Self {
        Self(Uuid::new_v4().to_string())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Who a key belongs to: API clients and checkout forms have separate key spaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// API orders.
    Api,
    /// API holds.
    ApiHold,
    /// Checkout forms (which place holds).
    Page,
    /// Admin stock changes through the API.
    Admin,
    /// Admin stock-changing forms (their stored answer is a page to redirect to, not JSON).
    AdminForm,
}

impl Scope {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Api => "api",
            Self::ApiHold => "api-hold",
            Self::Page => "page",
            Self::Admin => "admin",
            Self::AdminForm => "admin-form",
        }
    }
}

/// SHA-256 of the canonical form of a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fingerprint(String);

impl Fingerprint {
    pub fn of(canonical: &impl Serialize) -> Self {
        let bytes = serde_json::to_vec(canonical).expect("serialisable request");
        Self(hex::encode(Sha256::digest(bytes)))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A response kept under a key.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredResponse {
    pub status: u16,
    pub body: serde_json::Value,
}

/// What `begin` found.
#[derive(Debug)]
pub enum Begin {
    /// This request owns the key now; finish with `complete` or `abandon`.
    Started(Claim),
    /// Completed earlier with the same request: replay this.
    Replay(StoredResponse),
    /// The key was used for a different request.
    Mismatch,
    /// The first request with this key is still running.
    InFlight,
}

/// Ownership of an in-flight key.
#[derive(Debug, Clone)]
pub struct Claim {
    pub scope: Scope,
    pub key: IdempotencyKey,
    pub owner: Uuid,
}

#[derive(sqlx::FromRow)]
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
        let inserted = sqlx::query(
            r#"insert into idempotency_keys (scope, key, fingerprint, state, owner)
               values ($1, $2, $3, 'in_flight', $4)
               on conflict (scope, key) do nothing"#,
        )
        .bind(scope.as_str())
        .bind(key.as_str())
        .bind(&fingerprint.0)
        .bind(owner)
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
        let taken = sqlx::query(
            r#"update idempotency_keys set owner = $4, locked_at = now()
                where scope = $1 and key = $2 and state = 'in_flight' and owner = $3"#,
        )
        .bind(scope.as_str())
        .bind(key.as_str())
        .bind(stale_owner)
        .bind(owner)
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

/// What the record of a key says about a request with a given fingerprint.
#[derive(Debug)]
pub enum Found {
    /// No record.
    Absent,
    /// Completed for this same request: replay this.
    Completed(StoredResponse),
    /// The key was used for a different request.
    Mismatch,
    /// Another request is working on it.
    InFlight,
    /// In flight, but its request died (older than the stale window); its owner.
    Stale(Uuid),
}

/// Reads the record of `key` without claiming it: how a decided key is answered before
/// any work (a lease, a transaction) is spent on it.
pub async fn lookup(
    conn: impl sqlx::PgExecutor<'_>,
    scope: Scope,
    key: &IdempotencyKey,
    fingerprint: &Fingerprint,
    stale_after: Duration,
) -> sqlx::Result<Found> {
    let row: Option<Row> = sqlx::query_as(
        r#"select fingerprint, state, owner, response_status, response_body,
                  locked_at < now() - make_interval(secs => $3) as stale
             from idempotency_keys
            where scope = $1 and key = $2"#,
    )
    .bind(scope.as_str())
    .bind(key.as_str())
    .bind(stale_after.as_secs_f64())
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
pub async fn present(
    conn: impl sqlx::PgExecutor<'_>,
    keys: &[(&str, &str)],
) -> sqlx::Result<Vec<bool>> {
    let scopes: Vec<&str> = keys.iter().map(|(s, _)| *s).collect();
    let names: Vec<&str> = keys.iter().map(|(_, k)| *k).collect();
    let found: Vec<i64> = sqlx::query_scalar(
        r#"select u.i from unnest($1::text[], $2::text[]) with ordinality as u(scope, key, i)
            where exists (select 1 from idempotency_keys k
                           where k.scope = u.scope and k.key = u.key)"#,
    )
    .bind(&scopes)
    .bind(&names)
    // Planned afresh each time: a plan kept from when the table was small joins by
    // reading all of it, and the table grows by every order.
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
pub async fn store(
    conn: &mut PgConnection,
    scope: Scope,
    key: &IdempotencyKey,
    fingerprint: &Fingerprint,
    response: &StoredResponse,
    stale_after: Duration,
) -> sqlx::Result<Option<Found>> {
    let inserted = sqlx::query(
        r#"insert into idempotency_keys
                  (scope, key, fingerprint, state, owner, response_status, response_body,
                   completed_at)
           values ($1, $2, $3, 'completed', $4, $5, $6, now())
           on conflict (scope, key) do nothing"#,
    )
    .bind(scope.as_str())
    .bind(key.as_str())
    .bind(&fingerprint.0)
    .bind(Uuid::new_v4())
    .bind(response.status as i16)
    .bind(&response.body)
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

/// One decided answer to store under a key that has no record.
pub struct Decision<'a> {
    pub scope: &'a str,
    pub key: &'a str,
    pub fingerprint: &'a str,
    pub response: StoredResponse,
}

/// Stores many decided answers by one statement (a batch's answers, or sold-out answers
/// first kept in Redis); a key that has a record already keeps it. Returns how many were
/// stored.
pub async fn store_decided(
    conn: impl sqlx::PgExecutor<'_>,
    decisions: &[Decision<'_>],
) -> sqlx::Result<u64> {
    let scopes: Vec<&str> = decisions.iter().map(|d| d.scope).collect();
    let keys: Vec<&str> = decisions.iter().map(|d| d.key).collect();
    let fingerprints: Vec<&str> = decisions.iter().map(|d| d.fingerprint).collect();
    let statuses: Vec<i16> = decisions.iter().map(|d| d.response.status as i16).collect();
    let bodies: Vec<&serde_json::Value> = decisions.iter().map(|d| &d.response.body).collect();
    Ok(sqlx::query(
        r#"insert into idempotency_keys
                  (scope, key, fingerprint, state, owner, response_status, response_body,
                   completed_at)
           select scope, key, fingerprint, 'completed', $6, status, body, now()
             from unnest($1::text[], $2::text[], $3::text[], $4::int2[], $5::jsonb[])
                  as u(scope, key, fingerprint, status, body)
           on conflict (scope, key) do nothing"#,
    )
    .bind(&scopes)
    .bind(&keys)
    .bind(&fingerprints)
    .bind(&statuses)
    .bind(&bodies)
    .bind(Uuid::new_v4())
    .execute(conn)
    .await?
    .rows_affected())
}

/// Stores the response under the claimed key, inside the caller's transaction. Returns
/// false when the claim was lost (taken over as stale): the caller must roll back.
pub async fn complete(
    conn: &mut PgConnection,
    claim: &Claim,
    response: &StoredResponse,
) -> sqlx::Result<bool> {
    let updated = sqlx::query(
        r#"update idempotency_keys
              set state = 'completed', response_status = $4, response_body = $5,
                  completed_at = now()
            where scope = $1 and key = $2 and owner = $3 and state = 'in_flight'"#,
    )
    .bind(claim.scope.as_str())
    .bind(claim.key.as_str())
    .bind(claim.owner)
    .bind(response.status as i16)
    .bind(&response.body)
    .execute(conn)
    .await?
    .rows_affected();
    Ok(updated == 1)
}

/// Forgets the claim, so a retry starts afresh (for outcomes that are not stored).
pub async fn abandon(pool: &PgPool, claim: &Claim) -> sqlx::Result<()> {
    sqlx::query(
        r#"delete from idempotency_keys
            where scope = $1 and key = $2 and owner = $3 and state = 'in_flight'"#,
    )
    .bind(claim.scope.as_str())
    .bind(claim.key.as_str())
    .bind(claim.owner)
    .execute(pool)
    .await?;
    Ok(())
}

/// The response stored under a completed key, whatever request it answered (for pages
/// that show the outcome of a form by its key).
pub async fn stored(
    pool: &PgPool,
    scope: Scope,
    key: &IdempotencyKey,
) -> sqlx::Result<Option<StoredResponse>> {
    let row: Option<(i16, serde_json::Value)> = sqlx::query_as(
        r#"select response_status, response_body from idempotency_keys
            where scope = $1 and key = $2 and state = 'completed'"#,
    )
    .bind(scope.as_str())
    .bind(key.as_str())
    .fetch_optional(pool)
    .await?;
    Ok(row.map(|(status, body)| StoredResponse {
        status: status as u16,
        body,
    }))
}

/// Deletes completed records older than `ttl`. Returns how many.
pub async fn purge(pool: &PgPool, ttl: Duration) -> sqlx::Result<u64> {
    Ok(sqlx::query(
        r#"delete from idempotency_keys
            where state = 'completed' and created_at < now() - make_interval(secs => $1)"#,
    )
    .bind(ttl.as_secs_f64())
    .execute(pool)
    .await?
    .rows_affected())
}

/// Deletes in-flight records whose request died longer than `stale_after` ago (they never
/// have an order: completing the record is part of the order's transaction; a request
/// still running on one finds its claim gone and answers with what the key holds then).
/// Cheap enough to run every second: a partial index holds only in-flight records.
pub async fn purge_stale(pool: &PgPool, stale_after: Duration) -> sqlx::Result<u64> {
    Ok(sqlx::query(
        r#"delete from idempotency_keys
            where state = 'in_flight' and locked_at < now() - make_interval(secs => $1)"#,
    )
    .bind(stale_after.as_secs_f64())
    .execute(pool)
    .await?
    .rows_affected())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_printable_ascii_up_to_255_characters() {
        assert!(IdempotencyKey::parse("order-2026-11-30-0001").is_ok());
        assert!(IdempotencyKey::parse(&"k".repeat(255)).is_ok());
        assert_eq!(IdempotencyKey::parse(""), Err(InvalidKey::Empty));
        assert_eq!(
            IdempotencyKey::parse(&"k".repeat(256)),
            Err(InvalidKey::TooLong)
        );
        for bad in ["tab\there", "new\nline", "ключ", "nul\0"] {
            assert_eq!(IdempotencyKey::parse(bad), Err(InvalidKey::NotPrintable));
        }
    }

    #[test]
    fn scoped_keys_of_different_owners_differ() {
        let raw = IdempotencyKey::parse(&"k".repeat(255)).unwrap();
        let a = IdempotencyKey::scoped("1", &raw);
        let b = IdempotencyKey::scoped("2", &raw);
        assert_ne!(a, b);
        assert_eq!(a.as_str(), format!("1:{}", raw.as_str()));
        // Owners end at the first colon, so `1` + `2:x` is not `12` + `x`.
        let x = IdempotencyKey::parse("2:x").unwrap();
        let y = IdempotencyKey::parse("x").unwrap();
        assert_ne!(
            IdempotencyKey::scoped("1", &x),
            IdempotencyKey::scoped("12", &y)
        );
    }

    #[test]
    fn fingerprints_differ_exactly_when_requests_differ() {
        let a = Fingerprint::of(&serde_json::json!({"lines": [["A1", 1]]}));
        let b = Fingerprint::of(&serde_json::json!({"lines": [["A1", 1]]}));
        let c = Fingerprint::of(&serde_json::json!({"lines": [["A1", 2]]}));
        assert_eq!(a, b);
        assert_ne!(a, c);
    }
}
