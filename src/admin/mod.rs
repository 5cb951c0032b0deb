//! Admins: accounts with argon2id password hashes, server-side sessions, and throttling of
//! failed logins per (account, client address) and per client address.
//!
//! - Passwords are hashed and verified on the blocking pool, never on an async worker.
//! - An unknown user costs the same verification as a wrong password, and both get the
//!   same answer.
//! - A session is a random token in an HttpOnly cookie; the database keeps only its
//!   SHA-256, with the session's CSRF token and expiry. Logging in makes a new session;
//!   logging out deletes it.

use std::time::Duration;

use argon2::Argon2;
use argon2::password_hash::{PasswordHasher, PasswordVerifier};
use sha2::{Digest, Sha256};
use sqlx::PgPool;

/// A logged-in admin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admin {
    pub id: i64,
    pub username: String,
    /// The session's CSRF token, which every admin form carries.
    pub csrf: String,
}

/// Why an admin account could not be made or changed.
#[derive(Debug, thiserror::Error)]
pub enum AccountError {
    #[error("usernames are 3 to 32 lowercase letters, digits, dots, dashes or underscores")]
    BadUsername,
    #[error("passwords need at least 12 characters")]
    WeakPassword,
    #[error("there is already an admin called {0}")]
    Exists(String),
    #[error("there is no admin called {0}")]
    Unknown(String),
    #[error(transparent)]
    Database(#[from] sqlx::Error),
    #[error("could not hash the password: {0}")]
    Hash(String),
}

/// How long a session lasts.
pub const SESSION_LENGTH: Duration = Duration::from_secs(12 * 3600);

fn valid_username(name: &str) -> bool {
    (3..=32).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
        && name.as_bytes()[0].is_ascii_alphanumeric()
}

/// A random secret: 256 bits as 64 hex characters.
pub fn random_token() -> String {
    format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    )
}

/// A readable random password: 20 characters from an alphabet without look-alikes.
pub fn generate_password() -> String {
    use rand::Rng;
    const ALPHABET: &[u8] = b"abcdefghjkmnpqrstuvwxyzABCDEFGHJKLMNPQRSTUVWXYZ23456789";
    let mut rng = rand::rng();
    (0..20)
        .map(|i| {
            if i > 0 && i % 5 == 0 {
                '-'
            } else {
                ALPHABET[rng.random_range(0..ALPHABET.len())] as char
            }
        })
        .collect()
}

/// argon2id hash of `password` (CPU-heavy: call from the blocking pool).
pub fn hash_password(password: &str) -> Result<String, AccountError> {
    Argon2::default()
        .hash_password(password.as_bytes())
        .map(|h| h.to_string())
        .map_err(|e| AccountError::Hash(e.to_string()))
}

/// Whether `password` matches `hash` (CPU-heavy: call from the blocking pool).
pub fn verify_password(hash: &str, password: &str) -> bool {
    Argon2::default()
        .verify_password(password.as_bytes(), hash)
        .is_ok()
}

/// At most this many password hashes are computed at once, so a storm of logins takes at
/// most half the cores and shoppers keep the rest (argon2id is built to be expensive).
static HASHING: std::sync::LazyLock<tokio::sync::Semaphore> = std::sync::LazyLock::new(|| {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    tokio::sync::Semaphore::new((cores / 2).max(1))
});

/// Runs `work` (a hash or a verification) on the blocking pool, within [`HASHING`]'s limit.
async fn hashing<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    let _permit = HASHING.acquire().await.ok()?;
    tokio::task::spawn_blocking(work).await.ok()
}

/// Verified against when the user does not exist, so that costs the same as a wrong
/// password. (The hash of a random string nobody knows.)
static DUMMY_HASH: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    hash_password(&random_token()).expect("hashing a fixed-size secret works")
});

/// The hash of `password`, which must be long enough.
async fn strong_hash(password: &str) -> Result<String, AccountError> {
    if password.chars().count() < 12 {
        return Err(AccountError::WeakPassword);
    }
    let password = password.to_string();
    hashing(move || hash_password(&password))
        .await
        .ok_or_else(|| AccountError::Hash("the hashing task failed".into()))?
}

/// Creates an admin.
#[tracing::instrument(skip_all)]
pub async fn create_admin(db: &PgPool, username: &str, password: &str) -> Result<(), AccountError> {
    if !valid_username(username) {
        return Err(AccountError::BadUsername);
    }
    let hash = strong_hash(password).await?;
    let inserted = sqlx::query!(
        "insert into admin_users (username, password_hash) values ($1, $2) on conflict (username) do nothing",
        username,
        hash,
    )
    .execute(db)
    .await?
    .rows_affected();
    if inserted == 0 {
        return Err(AccountError::Exists(username.to_string()));
    }
    Ok(())
}

/// Sets an admin's password and ends all their sessions.
#[tracing::instrument(skip_all)]
pub async fn set_password(db: &PgPool, username: &str, password: &str) -> Result<(), AccountError> {
    let hash = strong_hash(password).await?;
    let mut tx = db.begin().await?;
    let id = sqlx::query_scalar!(
        "update admin_users set password_hash = $2 where username = $1 returning id",
        username,
        hash,
    )
    .fetch_optional(&mut *tx)
    .await?;
    let id = id.ok_or_else(|| AccountError::Unknown(username.to_string()))?;
    sqlx::query!("delete from admin_sessions where user_id = $1", id)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(())
}

/// How many admins exist.
#[tracing::instrument(skip_all)]
pub async fn count_admins(db: &PgPool) -> sqlx::Result<i64> {
    sqlx::query_scalar!(r#"select count(*) as "count!" from admin_users"#)
        .fetch_one(db)
        .await
}

/// The admin with these credentials, or `None` — the same work and answer either way.
#[tracing::instrument(skip_all)]
pub async fn authenticate(
    db: &PgPool,
    username: &str,
    password: &str,
) -> sqlx::Result<Option<i64>> {
    let row = sqlx::query!(
        "select id, password_hash from admin_users where username = $1",
        username,
    )
    .fetch_optional(db)
    .await?;
    let (id, hash) = match row {
        Some(row) => (Some(row.id), row.password_hash),
        None => (None, DUMMY_HASH.clone()),
    };
    let password = password.to_string();
    let matches = hashing(move || verify_password(&hash, &password))
        .await
        .unwrap_or(false);
    Ok(id.filter(|_| matches))
}

fn token_hash(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// Starts a session for `user_id`; returns the cookie token.
#[tracing::instrument(skip_all)]
pub async fn start_session(db: &PgPool, user_id: i64) -> sqlx::Result<String> {
    let token = random_token();
    sqlx::query!(
        r#"insert into admin_sessions (token_hash, user_id, csrf_token, expires_at)
           values ($1, $2, $3, now() + make_interval(secs => $4))"#,
        token_hash(&token),
        user_id,
        random_token(),
        SESSION_LENGTH.as_secs_f64(),
    )
    .execute(db)
    .await?;
    Ok(token)
}

/// The admin whose unexpired session `token` is.
#[tracing::instrument(skip_all)]
pub async fn session(db: &PgPool, token: &str) -> sqlx::Result<Option<Admin>> {
    sqlx::query_as!(
        Admin,
        r#"select u.id, u.username, s.csrf_token as csrf
             from admin_sessions s join admin_users u on u.id = s.user_id
            where s.token_hash = $1 and s.expires_at > now()"#,
        token_hash(token),
    )
    .fetch_optional(db)
    .await
}

/// Ends the session `token`.
#[tracing::instrument(skip_all)]
pub async fn end_session(db: &PgPool, token: &str) -> sqlx::Result<()> {
    sqlx::query!(
        "delete from admin_sessions where token_hash = $1 or expires_at < now()",
        token_hash(token),
    )
    .execute(db)
    .await?;
    Ok(())
}

/// Limits on failed logins.
#[derive(Debug, Clone, Copy)]
pub struct LoginLimits {
    /// Failures of one account from one client address.
    pub per_account: i64,
    /// Failures from one client address, whatever the account.
    pub per_client: i64,
    pub window: Duration,
}

/// A login attempt, counted before the password is checked.
#[derive(Debug)]
pub enum Attempt {
    /// Go ahead; on success, [`forgive`] these failure rows.
    Allowed(Vec<i64>),
    /// Too many recent failures: retry after this many seconds. Nothing was recorded.
    Throttled(u64),
}

/// The stored account of a failure record: its SHA-256, so any input has a bounded size.
fn account_hash(account: &str) -> String {
    hex::encode(Sha256::digest(account.as_bytes()))
}

/// Counts a login attempt of `account` from `client`, *before* the (slow) password check,
/// so guesses sent in parallel are counted like guesses in a row.
///
/// Failures are counted per (account, client address) and per client address, never per
/// account alone: guessing from one address cannot lock the account for anyone else, so
/// the admin at another address still gets in with the right password. A throttled
/// attempt records nothing, so attempts made while throttled do not extend the wait.
#[tracing::instrument(skip_all)]
pub async fn begin_attempt(
    db: &PgPool,
    limits: LoginLimits,
    account: &str,
    client: std::net::IpAddr,
) -> sqlx::Result<Attempt> {
    let client = client.to_string();
    let pair = format!("{}/{client}", account_hash(account));
    // Attempts on one pair (or from one client) take turns, so each sees all before it.
    let mut locks: Vec<i64> = [&pair, &client]
        .iter()
        .map(|s| {
            let digest = Sha256::digest(format!("login:{s}").as_bytes());
            i64::from_be_bytes(digest[..8].try_into().expect("8 bytes"))
        })
        .collect();
    locks.sort_unstable();
    let mut tx = db.begin().await?;
    sqlx::query!(
        "select pg_advisory_xact_lock(k) from unnest($1::bigint[]) as k",
        &locks,
    )
    .execute(&mut *tx)
    .await?;
    // Per kind: the failures in the window, and in how many seconds the failure whose
    // lapse brings the count under the limit lapses (the limit-th newest).
    let counted = sqlx::query!(
        r#"with recent as (
             select kind, at from login_failures
              where at > now() - make_interval(secs => $3)
                and ((kind = 'pair' and subject = $1) or (kind = 'client' and subject = $2)))
           select (select count(*) from recent where kind = 'pair') as "by_pair!",
                  (select count(*) from recent where kind = 'client') as "by_client!",
                  (select extract(epoch from at + make_interval(secs => $3) - now())::float8
                     from recent where kind = 'pair' order by at desc offset $4::bigint - 1 limit 1)
                    as pair_wait,
                  (select extract(epoch from at + make_interval(secs => $3) - now())::float8
                     from recent where kind = 'client' order by at desc offset $5::bigint - 1 limit 1)
                    as client_wait"#,
        pair,
        client,
        limits.window.as_secs_f64(),
        limits.per_account,
        limits.per_client,
    )
    .fetch_one(&mut *tx)
    .await?;
    let (by_pair, by_client) = (counted.by_pair, counted.by_client);
    let (pair_wait, client_wait) = (counted.pair_wait, counted.client_wait);
    let waits = [
        (by_pair >= limits.per_account).then_some(pair_wait),
        (by_client >= limits.per_client).then_some(client_wait),
    ];
    if waits.iter().any(Option::is_some) {
        tx.rollback().await?;
        let wait = waits
            .into_iter()
            .flatten()
            .map(|w| w.unwrap_or(0.0).max(0.0).ceil() as u64)
            .max()
            .unwrap_or(1);
        return Ok(Attempt::Throttled(wait.max(1)));
    }
    let ids = sqlx::query_scalar!(
        r#"insert into login_failures (kind, subject) values ('pair', $1), ('client', $2)
           returning id"#,
        pair,
        client,
    )
    .fetch_all(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(Attempt::Allowed(ids))
}

/// A successful login does not count as a failure.
#[tracing::instrument(skip_all)]
pub async fn forgive(db: &PgPool, ids: &[i64]) -> sqlx::Result<()> {
    sqlx::query!(
        "delete from login_failures where id = any($1::bigint[])",
        ids,
    )
    .execute(db)
    .await?;
    Ok(())
}

/// Clears failed-login records (`stockade admin unlock`): with `username`, that account's
/// records from every address; without, every record (per address too). Returns how many
/// were deleted.
#[tracing::instrument(skip_all)]
pub async fn unlock(db: &PgPool, username: Option<&str>) -> sqlx::Result<u64> {
    let deleted = match username {
        Some(name) => {
            let hash = account_hash(name);
            sqlx::query!(
                r#"delete from login_failures
                    where (kind = 'pair' and starts_with(subject, $1 || '/'))
                       or (kind = 'account' and subject = $1)"#,
                hash,
            )
            .execute(db)
            .await?
        }
        None => {
            sqlx::query!("delete from login_failures")
                .execute(db)
                .await?
        }
    };
    Ok(deleted.rows_affected())
}

/// Deletes up to `limit` login failures older than a day (the longest window they are
/// counted over), skipping rows another process is purging. Returns how many went.
pub async fn purge_login_failures(db: &PgPool, limit: i64) -> sqlx::Result<u64> {
    Ok(sqlx::query!(
        r#"with old as (
               select id from login_failures where at < now() - interval '1 day'
                order by id limit $1 for update skip locked
           )
           delete from login_failures f using old where f.id = old.id"#,
        limit,
    )
    .execute(db)
    .await?
    .rows_affected())
}

/// Deletes up to `limit` expired admin sessions, skipping rows another process is
/// purging. Returns how many went.
pub async fn purge_sessions(db: &PgPool, limit: i64) -> sqlx::Result<u64> {
    Ok(sqlx::query!(
        r#"with old as (
               select token_hash from admin_sessions where expires_at < now()
                order by expires_at limit $1 for update skip locked
           )
           delete from admin_sessions s using old where s.token_hash = old.token_hash"#,
        limit,
    )
    .execute(db)
    .await?
    .rows_affected())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_verify_only_against_their_own_hash() {
        let hash = hash_password("correct horse battery").unwrap();
        assert!(hash.starts_with("$argon2id$"));
        assert!(verify_password(&hash, "correct horse battery"));
        assert!(!verify_password(&hash, "correct horse battery!"));
        assert!(!verify_password("not a hash", "x"));
    }

    #[test]
    fn usernames_are_plain() {
        for ok in ["admin", "ada.lovelace", "ops-1", "a_b"] {
            assert!(valid_username(ok), "{ok}");
        }
        for bad in ["ad", "Admin", "-admin", "ad min", "ädmin", &"a".repeat(33)] {
            assert!(!valid_username(bad), "{bad}");
        }
    }

    #[test]
    fn generated_secrets_look_right() {
        let p = generate_password();
        assert_eq!(p.len(), 20);
        assert_eq!(p.matches('-').count(), 3);
        assert_ne!(generate_password(), p);
        assert_eq!(random_token().len(), 64);
    }
}
