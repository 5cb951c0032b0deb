//! API clients: who places orders and holds through the JSON API.
//!
//! - A client has a name and a key: `sk_` and 64 hex digits (256 random bits), shown once
//!   when it is made and sent as `Authorization: Bearer sk_…`. The database keeps only the
//!   key's SHA-256 (a fast hash is right for a key this random: there is nothing to guess),
//!   and its first characters so people can tell keys apart.
//! - Everything a client does through the API is its own: its idempotency keys are stored
//!   as `<client id>:<key>` ([`Caller::owner`]), so the same key from another client is
//!   another key, and it reads only orders and holds placed under its keys
//!   ([`owns_order`], [`owns_hold`]).
//! - A client may have its own rate limit ([`Limit`]); the load tools' clients have none.
//! - Revoking keeps the row (its orders still name it); the key stops working at once in
//!   the process that revoked it and within [`CACHE_FOR`] in every other.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use sha2::{Digest, Sha256};
use sqlx::PgPool;
use uuid::Uuid;

/// What every key starts with, so a leaked one is recognisable (e.g. by secret scanners).
pub const KEY_PREFIX: &str = "sk_";

/// How long a process trusts what it looked up about a key (a revoked key works at most
/// this long in processes other than the one that revoked it).
pub const CACHE_FOR: Duration = Duration::from_secs(2);

/// An authenticated API client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiClient {
    pub id: i64,
    pub name: String,
    pub limit: Limit,
    /// May place orders without a payment step when the shop takes payments (load tools,
    /// back-ends invoiced elsewhere).
    pub unpaid_orders: bool,
}

/// A client's rate limit on placing orders and holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// `STOCKADE_RATE_LIMIT_PER_MINUTE` and `STOCKADE_RATE_LIMIT_BURST`.
    Default,
    /// This many per minute.
    PerMinute(u32),
    /// None (the load tools' own clients).
    Unlimited,
}

impl Limit {
    fn of(per_minute: Option<i32>, unlimited: bool) -> Self {
        match (unlimited, per_minute) {
            (true, _) => Self::Unlimited,
            (false, Some(n)) => Self::PerMinute(n.max(1) as u32),
            (false, None) => Self::Default,
        }
    }

    fn columns(self) -> (Option<i32>, bool) {
        match self {
            Self::Default => (None, false),
            Self::PerMinute(n) => (Some(n.min(1_000_000) as i32), false),
            Self::Unlimited => (None, true),
        }
    }
}

impl std::fmt::Display for Limit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Default => f.write_str("default"),
            Self::PerMinute(n) => write!(f, "{n}/min"),
            Self::Unlimited => f.write_str("unlimited"),
        }
    }
}

/// Who is calling the API: a client, or (when `STOCKADE_API_ANONYMOUS_ORDERS` allows it)
/// nobody in particular. All anonymous callers share one identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    Client(ApiClient),
    Anonymous,
}

impl Caller {
    /// The owner part of this caller's idempotency keys: the client id, or `anon`.
    /// The prefix of this caller's hold keys (see [`crate::holds::db::owned_by`]).
    pub fn hold_owner(&self) -> String {
        format!("{}:", self.owner())
    }

    /// Whether it may place orders without a payment step (when the shop takes payments).
    pub fn orders_unpaid(&self) -> bool {
        matches!(self, Self::Client(client) if client.unpaid_orders)
    }

    pub fn owner(&self) -> String {
        match self {
            Self::Client(client) => client.id.to_string(),
            Self::Anonymous => "anon".into(),
        }
    }
}

/// A client as the admin page and `stockade api-key list` show it.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct ClientRow {
    pub id: i64,
    pub name: String,
    pub key_prefix: String,
    pub rate_limit_per_minute: Option<i32>,
    pub unlimited: bool,
    pub unpaid_orders: bool,
    pub created_at: DateTime<Utc>,
    pub revoked_at: Option<DateTime<Utc>>,
}

impl ClientRow {
    pub fn limit(&self) -> Limit {
        Limit::of(self.rate_limit_per_minute, self.unlimited)
    }

    pub fn is_revoked(&self) -> bool {
        self.revoked_at.is_some()
    }
}

/// Why a client could not be made or changed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("client names are 1 to 100 printable characters")]
    BadName,
    #[error("there is already a live API client called {0}")]
    Exists(String),
    #[error("there is no live API client {0}")]
    Unknown(String),
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

/// A new random key: `sk_` and 64 hex digits (256 bits).
pub fn generate_key() -> String {
    format!(
        "{KEY_PREFIX}{}{}",
        Uuid::new_v4().simple(),
        Uuid::new_v4().simple()
    )
}

/// What the database keeps of a key.
pub fn hash_key(key: &str) -> String {
    hex::encode(Sha256::digest(key.as_bytes()))
}

fn valid_name(name: &str) -> bool {
    let name = name.trim();
    !name.is_empty() && name.chars().count() <= 100 && !name.chars().any(char::is_control)
}

/// Makes a client; returns it and its key (which nothing keeps: show it now).
#[tracing::instrument(skip_all, fields(name = name))]
pub async fn create(
    db: &PgPool,
    name: &str,
    limit: Limit,
) -> Result<(ClientRow, String), ClientError> {
    let name = name.trim();
    if !valid_name(name) {
        return Err(ClientError::BadName);
    }
    let key = generate_key();
    let (per_minute, unlimited) = limit.columns();
    let row = sqlx::query_as!(
        ClientRow,
        r#"insert into api_clients (name, key_hash, key_prefix, rate_limit_per_minute, unlimited)
           values ($1, $2, $3, $4, $5)
           returning id, name, key_prefix, rate_limit_per_minute, unlimited, unpaid_orders,
                     created_at, revoked_at"#,
        name,
        hash_key(&key),
        &key[..KEY_PREFIX.len() + 8],
        per_minute,
        unlimited,
    )
    .fetch_one(db)
    .await
    .map_err(|e| match &e {
        sqlx::Error::Database(d) if d.code().as_deref() == Some("23505") => {
            ClientError::Exists(name.to_string())
        }
        _ => ClientError::Database(e),
    })?;
    Ok((row, key))
}

/// Lets client `id` place orders without a payment step when the shop takes payments.
pub async fn allow_unpaid_orders(db: &PgPool, id: i64) -> sqlx::Result<()> {
    sqlx::query!(
        "update api_clients set unpaid_orders = true where id = $1",
        id
    )
    .execute(db)
    .await?;
    Ok(())
}

/// Every client, live ones first, newest first.
#[tracing::instrument(skip_all)]
pub async fn list(db: &PgPool) -> sqlx::Result<Vec<ClientRow>> {
    sqlx::query_as!(
        ClientRow,
        r#"select id, name, key_prefix, rate_limit_per_minute, unlimited, unpaid_orders,
                  created_at, revoked_at
             from api_clients
            order by revoked_at is not null, id desc"#,
    )
    .fetch_all(db)
    .await
}

/// Revokes live client `id`; false when there is none.
#[tracing::instrument(skip_all)]
pub async fn revoke(db: &PgPool, id: i64) -> sqlx::Result<bool> {
    Ok(sqlx::query!(
        "update api_clients set revoked_at = now() where id = $1 and revoked_at is null",
        id,
    )
    .execute(db)
    .await?
    .rows_affected()
        == 1)
}

/// Revokes every live client whose name is `like` the pattern (a load test's shoppers);
/// how many.
pub async fn revoke_matching(db: &PgPool, pattern: &str) -> sqlx::Result<u64> {
    Ok(sqlx::query!(
        "update api_clients set revoked_at = now() where name like $1 and revoked_at is null",
        pattern,
    )
    .execute(db)
    .await?
    .rows_affected())
}

/// Revokes the live client called `name`.
#[tracing::instrument(skip_all)]
pub async fn revoke_by_name(db: &PgPool, name: &str) -> Result<i64, ClientError> {
    sqlx::query_scalar!(
        r#"update api_clients set revoked_at = now()
            where name = $1 and revoked_at is null
        returning id"#,
        name.trim(),
    )
    .fetch_optional(db)
    .await?
    .ok_or_else(|| ClientError::Unknown(name.to_string()))
}

/// The live client whose key this is.
#[tracing::instrument(skip_all)]
pub async fn find_by_key(db: &PgPool, key: &str) -> sqlx::Result<Option<ApiClient>> {
    let row = sqlx::query!(
        r#"select id, name, rate_limit_per_minute, unlimited, unpaid_orders from api_clients
            where key_hash = $1 and revoked_at is null"#,
        hash_key(key),
    )
    .fetch_optional(db)
    .await?;
    Ok(row.map(|row| ApiClient {
        id: row.id,
        name: row.name,
        limit: Limit::of(row.rate_limit_per_minute, row.unlimited),
        unpaid_orders: row.unpaid_orders,
    }))
}

/// Whether `caller` placed order `id`: through the API under its own key, or by confirming
/// a hold it placed. Orders from the storefront belong to no API caller.
#[tracing::instrument(skip_all)]
pub async fn owns_order(db: &PgPool, caller: &Caller, id: Uuid) -> sqlx::Result<bool> {
    sqlx::query_scalar!(
        r#"select exists (
             select 1 from orders o
               left join holds h on o.idempotency_scope = 'hold' and h.id::text = o.idempotency_key
              where o.id = $1
                and ((o.idempotency_scope = 'api' and starts_with(o.idempotency_key, $2))
                  or (h.idempotency_scope = 'api-hold' and starts_with(h.idempotency_key, $2))))
           as "owns!""#,
        id,
        format!("{}:", caller.owner()),
    )
    .fetch_one(db)
    .await
}

/// Whether `caller` placed hold `id` through the API.
#[tracing::instrument(skip_all)]
pub async fn owns_hold(db: &PgPool, caller: &Caller, id: Uuid) -> sqlx::Result<bool> {
    crate::holds::db::owned_by(db, id, &caller.hold_owner()).await
}

/// Most keys a process remembers; past this the cache starts afresh.
const CACHE_MAX: usize = 10_000;

/// What a process looked up about keys lately (by their hash), so a busy client costs one
/// database read every [`CACHE_FOR`], not one per request.
#[derive(Default)]
pub struct KeyCache {
    entries: Mutex<HashMap<String, (Instant, Option<ApiClient>)>>,
}

impl KeyCache {
    /// The live client of `key`, from the cache or the database.
    pub async fn client(&self, db: &PgPool, key: &str) -> sqlx::Result<Option<ApiClient>> {
        let hash = hash_key(key);
        if let Some((at, client)) = self.lock().get(&hash)
            && at.elapsed() < CACHE_FOR
        {
            return Ok(client.clone());
        }
        let client = find_by_key(db, key).await?;
        let mut entries = self.lock();
        if entries.len() >= CACHE_MAX {
            entries.clear();
        }
        entries.insert(hash, (Instant::now(), client.clone()));
        Ok(client)
    }

    /// What the cache knows of `key` without asking the database: `Some(Some(client))` for
    /// a live key looked up lately, `Some(None)` for a wrong one, `None` when it does not
    /// know.
    pub fn cached(&self, key: &str) -> Option<Option<ApiClient>> {
        self.lock()
            .get(&hash_key(key))
            .filter(|(at, _)| at.elapsed() < CACHE_FOR)
            .map(|(_, client)| client.clone())
    }

    /// Forgets everything (after a revocation in this process).
    pub fn clear(&self) {
        self.lock().clear();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (Instant, Option<ApiClient>)>> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_random_prefixed_and_hashed() {
        let (a, b) = (generate_key(), generate_key());
        assert_ne!(a, b);
        assert!(a.starts_with(KEY_PREFIX));
        assert_eq!(a.len(), KEY_PREFIX.len() + 64, "256 bits as hex");
        assert_eq!(hash_key(&a), hash_key(&a));
        assert_ne!(hash_key(&a), hash_key(&b));
        assert_eq!(hash_key(&a).len(), 64);
    }

    #[test]
    fn limits_round_trip_through_their_columns() {
        for limit in [Limit::Default, Limit::PerMinute(600), Limit::Unlimited] {
            let (per_minute, unlimited) = limit.columns();
            assert_eq!(Limit::of(per_minute, unlimited), limit);
        }
    }

    #[test]
    fn callers_own_distinct_key_spaces() {
        let client = |id| {
            Caller::Client(ApiClient {
                id,
                name: "x".into(),
                limit: Limit::Default,
                unpaid_orders: false,
            })
        };
        assert_eq!(client(7).owner(), "7");
        assert_ne!(client(7).owner(), client(8).owner());
        assert_eq!(Caller::Anonymous.owner(), "anon");
    }
}
