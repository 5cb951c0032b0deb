//! Redis: one shared connection manager for the whole process, and the per-SKU leases
//! built on it.
//!
//! A lease queues the buyers of one SKU so the database does not burn work on conflicts;
//! it is not what prevents overselling — the conditional update in
//! [`crate::inventory::db::take_stock`] is (DESIGN.md section 2). So:
//! - an order takes the leases of all its SKUs at once, in sorted order, in one Lua script
//!   (all or nothing);
//! - each grant carries a fencing token from one counter; the stock row refuses a write
//!   with a token older than the last one that wrote it;
//! - release is compare-and-delete on the owner token, so a holder whose lease expired
//!   cannot delete its successor's;
//! - when Redis is unreachable the layer reports [`Acquire::Degraded`] and orders continue
//!   on the database guard alone; the connection manager reconnects by itself.
//!
//! A "sold out" hint per SKU lets waiters stop queueing once the database has said a SKU
//! is gone; it is only a hint, and the caller confirms it against the database.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rand::Rng;
use redis::Script;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use crate::catalog::Sku;

/// The process's Redis handle; cheap to clone.
#[derive(Clone)]
pub struct Redis {
    conn: ConnectionManager,
    prefix: String,
    degraded: Arc<AtomicBool>,
}

impl Redis {
    /// Prepares a connection to `url` without waiting for it; keys are prefixed by `prefix`.
    pub fn connect_lazy(url: &str, prefix: &str) -> anyhow::Result<Self> {
        let client = redis::Client::open(url)?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(Duration::from_millis(500)))
            .set_response_timeout(Some(Duration::from_millis(1_000)))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_millis(200));
        let conn = ConnectionManager::new_lazy_with_config(client, config)?;
        Ok(Self {
            conn,
            prefix: prefix.to_string(),
            degraded: Arc::new(AtomicBool::new(false)),
        })
    }

    /// A connection to use for one command or script call.
    pub fn conn(&self) -> ConnectionManager {
        self.conn.clone()
    }

    /// `prefix + name`.
    pub fn key(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }

    fn lease_key(&self, sku: &Sku) -> String {
        self.key(&format!("lease:{sku}"))
    }

    fn sold_out_key(&self, sku: &Sku) -> String {
        self.key(&format!("soldout:{sku}"))
    }

    fn fence_key(&self) -> String {
        self.key("fence")
    }

    /// Round trip to the server.
    pub async fn ping(&self) -> redis::RedisResult<()> {
        let mut conn = self.conn();
        redis::cmd("PING").query_async::<String>(&mut conn).await?;
        Ok(())
    }

    /// Whether the last lease operation found Redis unreachable.
    pub fn is_degraded(&self) -> bool {
        self.degraded.load(Ordering::Relaxed)
    }

    /// Records whether Redis answered; logs once per transition, not per request.
    fn note(&self, reachable: bool) {
        let was_degraded = self.degraded.swap(!reachable, Ordering::Relaxed);
        if was_degraded && reachable {
            tracing::info!("Redis is reachable again; SKU leases are back in use");
        } else if !was_degraded && !reachable {
            tracing::warn!(
                "Redis is unreachable; orders continue on the database guard alone (degraded)"
            );
        }
    }
}

/// A granted set of leases.
#[derive(Debug, Clone)]
pub struct Lease {
    keys: Vec<String>,
    token: String,
    /// The fencing token: higher than that of every earlier grant.
    pub fence: i64,
}

/// The result of trying to lease a set of SKUs.
#[derive(Debug)]
pub enum Acquire {
    Granted(Lease),
    /// Still busy after the wait.
    Busy,
    /// A SKU carries the sold-out hint; confirm against the database.
    SoldOutHint(Sku),
    /// Redis is unreachable: proceed on the database guard alone.
    Degraded,
}

/// KEYS: n lease keys (sorted), n sold-out keys, the fence counter. ARGV: token, ttl, n.
/// Returns {1, fence} when granted, {0, i} when lease i is held, {-1, i} when SKU i is
/// hinted sold out.
const ACQUIRE: &str = r#"
local n = tonumber(ARGV[3])
for i = 1, n do
  if redis.call('EXISTS', KEYS[n + i]) == 1 then return {-1, i} end
end
for i = 1, n do
  if redis.call('EXISTS', KEYS[i]) == 1 then return {0, i} end
end
for i = 1, n do
  redis.call('SET', KEYS[i], ARGV[1], 'PX', ARGV[2])
end
return {1, redis.call('INCR', KEYS[2 * n + 1])}
"#;

/// Deletes each key still owned by ARGV[1]; returns how many.
const RELEASE: &str = r#"
local released = 0
for _, key in ipairs(KEYS) do
  if redis.call('GET', key) == ARGV[1] then
    redis.call('DEL', key)
    released = released + 1
  end
end
return released
"#;

/// Raises the fence counter to at least ARGV[1] (after Redis lost it, e.g. a restart).
/// Callers add a wide margin, past any token a holder from before the restart may still
/// carry.
const RAISE_FENCE: &str = r#"
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
if current < tonumber(ARGV[1]) then redis.call('SET', KEYS[1], ARGV[1]) end
return 1
"#;

/// How far the fence counter jumps past the highest token seen once Redis has lost it.
pub const FENCE_EPOCH: i64 = 1_000_000;

/// How long the sold-out hint lives; stale hints only cost one database read.
const SOLD_OUT_HINT_TTL_MS: u64 = 30_000;

impl Redis {
    /// Leases every SKU in `skus` (sorted, distinct) for `ttl`, retrying with jittered
    /// backoff for up to `wait`.
    pub async fn acquire(&self, skus: &[Sku], ttl: Duration, wait: Duration) -> Acquire {
        let token = uuid::Uuid::new_v4().to_string();
        let lease_keys: Vec<String> = skus.iter().map(|s| self.lease_key(s)).collect();
        let script = Script::new(ACQUIRE);
        let mut invocation = script.prepare_invoke();
        for key in &lease_keys {
            invocation.key(key);
        }
        for sku in skus {
            invocation.key(self.sold_out_key(sku));
        }
        invocation
            .key(self.fence_key())
            .arg(&token)
            .arg(ttl.as_millis() as u64)
            .arg(skus.len());

        let deadline = Instant::now() + wait;
        let mut backoff = Duration::from_millis(2);
        loop {
            let mut conn = self.conn();
            match invocation.invoke_async::<(i64, i64)>(&mut conn).await {
                Ok((1, fence)) => {
                    self.note(true);
                    return Acquire::Granted(Lease {
                        keys: lease_keys,
                        token,
                        fence,
                    });
                }
                Ok((-1, i)) => {
                    self.note(true);
                    return Acquire::SoldOutHint(skus[(i - 1) as usize].clone());
                }
                Ok(_) => self.note(true),
                Err(e) => {
                    tracing::debug!(error = %e, "lease script failed");
                    self.note(false);
                    // The script may have run before the answer was lost: undo what this
                    // token may hold, or other buyers would wait for its TTL.
                    let orphan = Lease {
                        keys: lease_keys,
                        token,
                        fence: 0,
                    };
                    let redis = self.clone();
                    tokio::spawn(async move { redis.release(&orphan).await });
                    return Acquire::Degraded;
                }
            }
            let now = Instant::now();
            if now >= deadline {
                return Acquire::Busy;
            }
            // Full jitter: sleep a random time up to the current backoff.
            let sleep = rand::rng().random_range(Duration::from_micros(500)..=backoff);
            tokio::time::sleep(sleep.min(deadline - now)).await;
            backoff = (backoff * 2).min(Duration::from_millis(50));
        }
    }

    /// Releases what `lease` still owns; a lease that expired and was re-granted to someone
    /// else is left alone. Returns how many keys were released.
    pub async fn release(&self, lease: &Lease) -> usize {
        let script = Script::new(RELEASE);
        let mut invocation = script.prepare_invoke();
        for key in &lease.keys {
            invocation.key(key);
        }
        invocation.arg(&lease.token);
        let mut conn = self.conn();
        match invocation.invoke_async::<usize>(&mut conn).await {
            Ok(n) => n,
            Err(e) => {
                // The TTL frees the lease anyway.
                tracing::debug!(error = %e, "lease release failed");
                self.note(false);
                0
            }
        }
    }

    /// Makes every later fencing token greater than `seen` by a wide margin
    /// ([`FENCE_EPOCH`]), so it also passes any token issued before Redis lost its counter.
    pub async fn raise_fence(&self, seen: i64) {
        let mut conn = self.conn();
        let result = Script::new(RAISE_FENCE)
            .key(self.fence_key())
            .arg(seen.saturating_add(FENCE_EPOCH))
            .invoke_async::<i64>(&mut conn)
            .await;
        if let Err(e) = result {
            tracing::debug!(error = %e, "raising the fence failed");
        }
    }

    /// Marks `sku` as sold out, so waiting buyers stop queueing for it.
    pub async fn hint_sold_out(&self, sku: &Sku) {
        let mut conn = self.conn();
        let result = redis::cmd("SET")
            .arg(self.sold_out_key(sku))
            .arg(1)
            .arg("PX")
            .arg(SOLD_OUT_HINT_TTL_MS)
            .query_async::<()>(&mut conn)
            .await;
        if let Err(e) = result {
            tracing::debug!(error = %e, "setting the sold-out hint failed");
        }
    }

    /// Removes the sold-out hint (stock came back, or the hint was stale).
    pub async fn clear_sold_out(&self, sku: &Sku) {
        let mut conn = self.conn();
        let result = redis::cmd("DEL")
            .arg(self.sold_out_key(sku))
            .query_async::<()>(&mut conn)
            .await;
        if let Err(e) = result {
            tracing::debug!(error = %e, "clearing the sold-out hint failed");
        }
    }

    /// Lease keys currently held under this prefix (for checks and tests).
    pub async fn held_leases(&self) -> redis::RedisResult<Vec<String>> {
        let mut conn = self.conn();
        let pattern = self.key("lease:*");
        let mut keys = Vec::new();
        let mut cursor: u64 = 0;
        loop {
            let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(1000)
                .query_async(&mut conn)
                .await?;
            keys.extend(batch);
            if next == 0 {
                return Ok(keys);
            }
            cursor = next;
        }
    }
}
