//! The per-SKU leases on the process's Redis: granting (all or nothing, or whichever are
//! free), renewing while the holder works, releasing, and the fence counter.

use std::sync::LazyLock;
use std::time::{Duration, Instant};

use rand::Rng;
use redis::Script;

use super::Redis;
use crate::catalog::Sku;

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
    /// The breaker is open (Redis unreachable): proceed on the database guard alone.
    Degraded,
}

/// KEYS: n lease keys (sorted), n sold-out keys, the fence counter. ARGV: token, ttl, n.
/// Returns {1, fence} when granted, {0, i} when lease i is held by another token, {-1, i}
/// when SKU i is hinted sold out. A lease already held by this token (an earlier try whose
/// answer was lost) is granted again.
const ACQUIRE: &str = r#"
local n = tonumber(ARGV[3])
for i = 1, n do
  if redis.call('EXISTS', KEYS[n + i]) == 1 then return {-1, i} end
end
for i = 1, n do
  local owner = redis.call('GET', KEYS[i])
  if owner and owner ~= ARGV[1] then return {0, i} end
end
for i = 1, n do
  redis.call('SET', KEYS[i], ARGV[1], 'PX', ARGV[2])
end
return {1, redis.call('INCR', KEYS[2 * n + 1])}
"#;

/// KEYS: n lease keys, the fence counter. ARGV: token, ttl. Takes every lease that is
/// free; returns {fence, granted_1, …, granted_n} (fence 0 when none was).
const ACQUIRE_FREE: &str = r#"
local out = {0}
local any = false
for i = 1, #KEYS - 1 do
  if redis.call('SET', KEYS[i], ARGV[1], 'PX', ARGV[2], 'NX') then
    out[i + 1] = 1
    any = true
  else
    out[i + 1] = 0
  end
end
if any then out[1] = redis.call('INCR', KEYS[#KEYS]) end
return out
"#;

/// What [`Redis::acquire_free`] got.
#[derive(Debug)]
pub enum AcquireFree {
    /// The leases of the SKUs marked true, under one fence (`None` when none was free).
    Granted(Option<Lease>, Vec<bool>),
    /// Redis did not answer, or the breaker is open: proceed on the database guard alone.
    Degraded,
}

/// What [`Redis::acquire_key`] got.
#[derive(Debug)]
pub enum KeyLease {
    Granted(Lease),
    /// Another holder has it.
    Busy,
    /// Redis did not answer, or the breaker is open.
    Degraded,
}

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

/// [`RELEASE`] of `keys` for `token`.
fn release_script(keys: &[String], token: &str) -> redis::ScriptInvocation<'static> {
    static SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(RELEASE));
    let mut invocation = SCRIPT.prepare_invoke();
    for key in keys {
        invocation.key(key);
    }
    invocation.arg(token);
    invocation
}

/// Raises the fence counter to at least ARGV[1] (after Redis lost it, e.g. a restart).
/// Callers add a wide margin, past any token a holder from before the restart may still
/// carry.
pub(super) const RAISE_FENCE: &str = r#"
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
if current < tonumber(ARGV[1]) then redis.call('SET', KEYS[1], ARGV[1]) end
return 1
"#;

/// How far the fence counter jumps past the highest token seen once Redis has lost it.
pub const FENCE_EPOCH: i64 = 1_000_000;

/// How long the sold-out hint lives unless renewed. Stock coming back clears it at once;
/// should that clearing fail, sold-out answers may go on for at most this long.
const SOLD_OUT_HINT_TTL_MS: u64 = 3_000;

/// Extends each key's TTL to ARGV[2] ms while it is still owned by ARGV[1]; returns how
/// many were.
const RENEW: &str = r#"
local renewed = 0
for _, key in ipairs(KEYS) do
  if redis.call('GET', key) == ARGV[1] then
    redis.call('PEXPIRE', key, ARGV[2])
    renewed = renewed + 1
  end
end
return renewed
"#;

impl Redis {
    /// Leases the one key `name` (under this process's prefix) for `ttl` if it is free
    /// (`SET NX PX`); released by [`Redis::release`], renewed by [`Redis::while_held`].
    pub async fn acquire_key(&self, name: &str, ttl: Duration) -> KeyLease {
        let token = uuid::Uuid::new_v4().to_string();
        let key = self.key(name);
        let mut cmd = redis::cmd("SET");
        cmd.arg(&key)
            .arg(&token)
            .arg("NX")
            .arg("PX")
            .arg(ttl.as_millis() as u64);
        // A failed call is tried twice more, shortly: the first commands after Redis came
        // back may meet the old connection. An open breaker answers at once.
        for attempt in 0..3 {
            if self.is_degraded() {
                break;
            }
            let mut conn = self.conn();
            match self
                .call("key lease", cmd.query_async::<Option<String>>(&mut conn))
                .await
            {
                Some(Some(_)) => {
                    return KeyLease::Granted(Lease {
                        keys: vec![key],
                        token,
                        fence: 0,
                    });
                }
                Some(None) => return KeyLease::Busy,
                None if attempt < 2 => tokio::time::sleep(Duration::from_millis(50)).await,
                None => {}
            }
        }
        KeyLease::Degraded
    }

    /// Leases every SKU in `skus` (sorted, distinct) for `ttl`, retrying with jittered
    /// backoff for up to `wait`. A failed call is retried too: a holder that stalled
    /// past its call's timeout gets a fenced lease on waking, not a degraded write; only
    /// an open breaker answers [`Acquire::Degraded`].
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
        // Whether a try went unanswered: Redis may still run it, and grant this token
        // leases nobody waits for any more.
        let mut unanswered = false;
        let gave_up = |unanswered: bool, outcome: Acquire| {
            if unanswered {
                self.release_later(lease_keys.clone(), token.clone());
            }
            outcome
        };
        loop {
            if self.is_degraded() {
                return gave_up(unanswered, Acquire::Degraded);
            }
            let mut conn = self.conn();
            let answer = self
                .call(
                    "lease script",
                    invocation.invoke_async::<(i64, i64)>(&mut conn),
                )
                .await;
            match answer {
                Some((1, fence)) => {
                    return Acquire::Granted(Lease {
                        keys: lease_keys,
                        token,
                        fence,
                    });
                }
                Some((-1, i)) => {
                    let sku = &skus[(i - 1) as usize];
                    self.believe_sold_out(sku, true);
                    return gave_up(unanswered, Acquire::SoldOutHint(sku.clone()));
                }
                Some(_) => {}
                // The next try, under the same token, gets what this one may have got.
                None => unanswered = true,
            }
            let now = Instant::now();
            if now >= deadline {
                let outcome = if self.is_degraded() {
                    Acquire::Degraded
                } else {
                    Acquire::Busy
                };
                return gave_up(unanswered, outcome);
            }
            // Full jitter: sleep a random time up to the current backoff.
            let sleep = rand::rng().random_range(Duration::from_micros(500)..=backoff);
            tokio::time::sleep(sleep.min(deadline - now)).await;
            backoff = (backoff * 2).min(Duration::from_millis(50));
        }
    }

    /// Leases whichever of `skus` are free right now, all under one fence, without
    /// waiting for the others.
    pub async fn acquire_free(&self, skus: &[Sku], ttl: Duration) -> AcquireFree {
        let token = uuid::Uuid::new_v4().to_string();
        let lease_keys: Vec<String> = skus.iter().map(|s| self.lease_key(s)).collect();
        let script = Script::new(ACQUIRE_FREE);
        let mut invocation = script.prepare_invoke();
        for key in &lease_keys {
            invocation.key(key);
        }
        invocation
            .key(self.fence_key())
            .arg(&token)
            .arg(ttl.as_millis() as u64);
        let mut conn = self.conn();
        let Some(answer) = self
            .call(
                "lease script",
                invocation.invoke_async::<Vec<i64>>(&mut conn),
            )
            .await
        else {
            // Redis may still run the script: what it grants this token is freed after.
            self.release_later(lease_keys, token);
            return AcquireFree::Degraded;
        };
        let fence = answer.first().copied().unwrap_or(0);
        let granted: Vec<bool> = (0..skus.len())
            .map(|i| answer.get(i + 1) == Some(&1))
            .collect();
        let keys: Vec<String> = lease_keys
            .into_iter()
            .zip(&granted)
            .filter_map(|(key, granted)| granted.then_some(key))
            .collect();
        let lease = (!keys.is_empty()).then_some(Lease { keys, token, fence });
        AcquireFree::Granted(lease, granted)
    }

    /// Runs `work` while keeping `lease` alive: renews it every third of `ttl` (a
    /// watchdog, run beside `work` in the same task) until `work` ends or the lease is
    /// found lost. A stopped process renews nothing, so its lease lapses after `ttl`.
    pub async fn while_held<T>(
        &self,
        lease: Option<&Lease>,
        ttl: Duration,
        work: impl Future<Output = T>,
    ) -> T {
        let Some(lease) = lease else {
            return work.await;
        };
        let renewals = async {
            loop {
                tokio::time::sleep(ttl / 3).await;
                if !self.renew(lease, ttl).await {
                    // Lost (expired and re-granted, or Redis forgot it): the fence refuses
                    // this holder's write if a newer lease wrote first.
                    std::future::pending::<()>().await;
                }
            }
        };
        tokio::select! {
            out = work => out,
            () = renewals => unreachable!("renewals never end"),
        }
    }

    /// Extends `lease` to `ttl` if it is still ours.
    async fn renew(&self, lease: &Lease, ttl: Duration) -> bool {
        let script = Script::new(RENEW);
        let mut invocation = script.prepare_invoke();
        for key in &lease.keys {
            invocation.key(key);
        }
        invocation.arg(&lease.token).arg(ttl.as_millis() as u64);
        let mut conn = self.conn();
        self.call("lease renewal", invocation.invoke_async::<usize>(&mut conn))
            .await
            == Some(lease.keys.len())
    }

    /// Releases what `lease` still owns; a lease that expired and was re-granted to someone
    /// else is left alone. Returns how many keys were released (0 when Redis did not
    /// answer: the release is then sent again in the background, see
    /// [`Redis::release_later`]).
    pub async fn release(&self, lease: &Lease) -> usize {
        let mut conn = self.conn();
        let released = self
            .call(
                "lease release",
                release_script(&lease.keys, &lease.token).invoke_async::<usize>(&mut conn),
            )
            .await;
        released.unwrap_or_else(|| {
            self.release_later(lease.keys.clone(), lease.token.clone());
            0
        })
    }

    /// Sends a release of whatever `token` holds of `keys`, in the background and past an
    /// open breaker. Redis that stops answering (paused, stopped, a stalled host) keeps
    /// the calls it was sent and runs them when it wakes, in the order each connection
    /// sent them: a lease script its caller gave up on then grants leases nobody holds,
    /// which would stop orders of those SKUs for a whole lease TTL just as Redis is
    /// back. A release sent after the script runs right after it. (Over a connection
    /// that was replaced in between, the order is not kept; the TTL frees such a lease.)
    fn release_later(&self, keys: Vec<String>, token: String) {
        let (mut conn, timeout) = (self.conn(), self.timeout);
        tokio::spawn(async move {
            let script = release_script(&keys, &token);
            let release = script.invoke_async::<usize>(&mut conn);
            if !matches!(tokio::time::timeout(timeout, release).await, Ok(Ok(_))) {
                tracing::debug!("a lease release sent in the background was not answered");
            }
        });
    }

    /// Makes every later fencing token greater than `seen` by a wide margin
    /// ([`FENCE_EPOCH`]), so it also passes any token issued before Redis lost its counter.
    pub async fn raise_fence(&self, seen: i64) {
        let mut conn = self.conn();
        let script = Script::new(RAISE_FENCE);
        let mut invocation = script.key(self.fence_key());
        invocation.arg(seen.saturating_add(FENCE_EPOCH));
        self.call(
            "raising the fence",
            invocation.invoke_async::<i64>(&mut conn),
        )
        .await;
    }

    /// Marks `sku` as sold out, so waiting buyers stop queueing for it.
    pub async fn hint_sold_out(&self, sku: &Sku) {
        self.believe_sold_out(sku, true);
        let mut conn = self.conn();
        let mut cmd = redis::cmd("SET");
        cmd.arg(self.sold_out_key(sku))
            .arg(1)
            .arg("PX")
            .arg(SOLD_OUT_HINT_TTL_MS);
        self.call(
            "setting the sold-out hint",
            cmd.query_async::<()>(&mut conn),
        )
        .await;
    }

    /// Removes the sold-out hint (stock came back, or the hint was stale); false when
    /// Redis did not answer (the hint then lives out its TTL).
    pub async fn clear_sold_out(&self, sku: &Sku) -> bool {
        self.believe_sold_out(sku, false);
        let mut conn = self.conn();
        let mut cmd = redis::cmd("DEL");
        cmd.arg(self.sold_out_key(sku));
        self.call(
            "clearing the sold-out hint",
            cmd.query_async::<()>(&mut conn),
        )
        .await
        .is_some()
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
