//! Rate limits on placing orders and holds, shared by every process.
//!
//! The rule is GCRA (the generic cell rate algorithm, a token bucket kept as one
//! timestamp): a subject (an API client, or an address) may place `per_minute` requests a
//! minute, and up to `burst` at once after a quiet spell. Each subject has a "theoretical
//! arrival time" (TAT): each allowed request pushes it one interval (a minute / per_minute)
//! later; a request is refused while the TAT is more than `burst - 1` intervals ahead of
//! now, and told to come back when it no longer is (`Retry-After`).
//!
//! The TAT lives in Redis and is read and moved by one Lua script, atomically, on Redis's
//! clock, so every process counts against the same bucket. When Redis cannot be asked (its
//! circuit breaker is open, or the call fails), each process falls back to a bucket of its
//! own in memory with the same parameters: limits stay on (N processes then allow up to N
//! times the rate between them), nothing fails open, and nothing answers 500.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use redis::Script;

use crate::locking::Redis;

/// How much a subject may place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quota {
    pub per_minute: u32,
    pub burst: u32,
}

impl Quota {
    /// Time between requests at the sustained rate.
    pub fn interval(self) -> Duration {
        Duration::from_secs(60) / self.per_minute.max(1)
    }

    /// How far ahead of now the TAT may be and still let a request through.
    pub fn tolerance(self) -> Duration {
        self.interval() * (self.burst.max(1) - 1)
    }
}

/// How many failures (wrong API keys) a subject may make: `max` at once, and as they age
/// out, `max` more each `window` (GCRA with an interval of `window / max`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Failures {
    pub max: u32,
    pub window: Duration,
}

impl Failures {
    fn interval(self) -> Duration {
        self.window / self.max.max(1)
    }

    fn tolerance(self) -> Duration {
        self.interval() * (self.max.max(1) - 1)
    }
}

/// Whether a check counts a request (moves the TAT) or only asks whether one would pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Count,
    Peek,
}

/// A limiter's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Allowed,
    /// Refused; the next request would be allowed after this.
    Limited {
        retry_after: Duration,
    },
}

/// Which bucket decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Store {
    /// The bucket in Redis, shared by every process.
    Shared,
    /// This process's own bucket (Redis was unreachable).
    Process,
}

impl Store {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Shared => "redis",
            Self::Process => "process",
        }
    }
}

/// GCRA on Redis's clock. KEYS[1]: the subject's TAT (µs since the epoch). ARGV[1]: the
/// interval, ARGV[2]: the tolerance (µs), ARGV[3]: `1` to only ask (the TAT stays).
/// Returns {1, 0} when allowed (and, unless asking, moves the TAT), {0, µs to wait} when
/// refused.
const GCRA: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local interval = tonumber(ARGV[1])
local tolerance = tonumber(ARGV[2])
local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
if tat < now then tat = now end
local wait = tat - now - tolerance
if wait > 0 then return {0, wait} end
if ARGV[3] == '1' then return {1, 0} end
local new_tat = tat + interval
local ttl_ms = math.floor((new_tat - now) / 1000) + 1
redis.call('SET', KEYS[1], string.format('%.0f', new_tat), 'PX', string.format('%d', ttl_ms))
return {1, 0}
"#;

/// Most subjects a process's own buckets keep before dropping the idle ones.
const LOCAL_MAX: usize = 100_000;

/// The limiter of one process: Redis first, its own buckets when Redis is away.
pub struct RateLimiter {
    redis: Redis,
    script: Script,
    local: Mutex<HashMap<String, Instant>>,
    /// Whether the last decision came from this process's buckets (to log changes once).
    on_local: AtomicBool,
}

impl RateLimiter {
    pub fn new(redis: Redis) -> Self {
        Self {
            redis,
            script: Script::new(GCRA),
            local: Mutex::default(),
            on_local: AtomicBool::new(false),
        }
    }

    /// Counts one request of `subject` against `quota`.
    pub async fn check(&self, subject: &str, quota: Quota) -> (Decision, Store) {
        let rate = (quota.interval(), quota.tolerance());
        self.decide(subject, rate, Mode::Count).await
    }

    /// Whether `subject` is past its `failures` now (counting nothing): a throttled
    /// subject is refused before the work its failures would cost.
    pub async fn peek_failures(&self, subject: &str, failures: Failures) -> (Decision, Store) {
        let rate = (failures.interval(), failures.tolerance());
        self.decide(subject, rate, Mode::Peek).await
    }

    /// Counts one failure of `subject` against `failures`.
    pub async fn count_failure(&self, subject: &str, failures: Failures) -> (Decision, Store) {
        let rate = (failures.interval(), failures.tolerance());
        self.decide(subject, rate, Mode::Count).await
    }

    /// GCRA for `subject` at `(interval, tolerance)`, in Redis or else in this process.
    async fn decide(
        &self,
        subject: &str,
        rate: (Duration, Duration),
        mode: Mode,
    ) -> (Decision, Store) {
        let key = self.redis.key(&format!("rate:{subject}"));
        let mut invocation = self.script.key(key);
        invocation
            .arg(rate.0.as_micros() as u64)
            .arg(rate.1.as_micros() as u64)
            .arg(u8::from(mode == Mode::Peek));
        let mut conn = self.redis.conn();
        let answer = self
            .redis
            .call(
                "rate limit script",
                invocation.invoke_async::<(i64, i64)>(&mut conn),
            )
            .await;
        match answer {
            Some((allowed, wait_us)) => {
                if self.on_local.swap(false, Ordering::Relaxed) {
                    tracing::info!("rate limits are shared through Redis again");
                }
                let decision = if allowed == 1 {
                    Decision::Allowed
                } else {
                    Decision::Limited {
                        retry_after: Duration::from_micros(wait_us.max(1) as u64),
                    }
                };
                (decision, Store::Shared)
            }
            None => {
                if !self.on_local.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        "Redis is unreachable; rate limits are counted per process until it is back"
                    );
                }
                (self.check_local(subject, rate, mode), Store::Process)
            }
        }
    }

    /// GCRA in this process's memory.
    fn check_local(&self, subject: &str, rate: (Duration, Duration), mode: Mode) -> Decision {
        let now = Instant::now();
        let mut buckets = self.local.lock().unwrap_or_else(|e| e.into_inner());
        if buckets.len() >= LOCAL_MAX {
            buckets.retain(|_, tat| *tat > now);
        }
        let tat = buckets.get(subject).copied();
        match step(tat, now, rate) {
            Ok(next) => {
                if mode == Mode::Count {
                    buckets.insert(subject.to_string(), next);
                }
                Decision::Allowed
            }
            Err(retry_after) => Decision::Limited { retry_after },
        }
    }
}

/// One GCRA step: the new TAT when a request at `now` is allowed, or how long to wait.
pub fn gcra(tat: Option<Instant>, now: Instant, quota: Quota) -> Result<Instant, Duration> {
    step(tat, now, (quota.interval(), quota.tolerance()))
}

/// One GCRA step at `(interval, tolerance)`.
fn step(
    tat: Option<Instant>,
    now: Instant,
    (interval, tolerance): (Duration, Duration),
) -> Result<Instant, Duration> {
    let tat = tat.map_or(now, |t| t.max(now));
    let ahead = tat - now;
    if ahead > tolerance {
        return Err(ahead - tolerance);
    }
    Ok(tat + interval)
}

/// `Retry-After` in whole seconds (at least 1) for a wait.
pub fn retry_after_secs(wait: Duration) -> u64 {
    wait.as_secs() + u64::from(wait.subsec_nanos() > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_passes_then_one_per_interval() {
        let quota = Quota {
            per_minute: 60,
            burst: 3,
        };
        let start = Instant::now();
        let mut tat = None;
        for _ in 0..3 {
            tat = Some(gcra(tat, start, quota).expect("within the burst"));
        }
        let wait = gcra(tat, start, quota).expect_err("past the burst");
        assert_eq!(wait, Duration::from_secs(1));
        assert_eq!(retry_after_secs(wait), 1);
        // Half an interval later: still refused, for the other half.
        let later = start + Duration::from_millis(500);
        assert_eq!(gcra(tat, later, quota), Err(Duration::from_millis(500)));
        // One interval later: exactly one more.
        let later = start + Duration::from_secs(1);
        let tat = Some(gcra(tat, later, quota).expect("one interval later"));
        assert!(gcra(tat, later, quota).is_err());
    }

    #[test]
    fn a_quiet_subject_gets_its_whole_burst_back_and_no_more() {
        let quota = Quota {
            per_minute: 6,
            burst: 2,
        };
        let start = Instant::now();
        let tat = Some(gcra(None, start, quota).unwrap());
        let much_later = start + Duration::from_secs(3600);
        let tat = Some(gcra(tat, much_later, quota).unwrap());
        let tat = Some(gcra(tat, much_later, quota).unwrap());
        assert_eq!(
            gcra(tat, much_later, quota),
            Err(Duration::from_secs(10)),
            "a burst of two, then one every ten seconds"
        );
    }

    #[test]
    fn failures_pass_all_at_once_then_one_each_share_of_the_window() {
        let failures = Failures {
            max: 20,
            window: Duration::from_secs(60),
        };
        let rate = (failures.interval(), failures.tolerance());
        let start = Instant::now();
        let mut tat = None;
        for _ in 0..20 {
            tat = Some(step(tat, start, rate).expect("within the allowance"));
        }
        assert_eq!(step(tat, start, rate), Err(Duration::from_secs(3)));
    }

    #[tokio::test]
    async fn a_peek_counts_nothing() {
        // No Redis at this address: the process's own buckets decide.
        let redis = Redis::connect_lazy("redis://127.0.0.1:1", "test:").unwrap();
        let limiter = RateLimiter::new(redis);
        let failures = Failures {
            max: 2,
            window: Duration::from_secs(60),
        };
        for _ in 0..5 {
            let (decision, _) = limiter.peek_failures("a", failures).await;
            assert_eq!(decision, Decision::Allowed, "peeking used the allowance");
        }
        for _ in 0..2 {
            assert_eq!(
                limiter.count_failure("a", failures).await.0,
                Decision::Allowed
            );
        }
        let (peeked, _) = limiter.peek_failures("a", failures).await;
        assert!(matches!(peeked, Decision::Limited { .. }), "{peeked:?}");
    }

    #[test]
    fn retry_after_rounds_up() {
        assert_eq!(retry_after_secs(Duration::from_millis(1)), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(2_001)), 3);
        assert_eq!(retry_after_secs(Duration::from_secs(2)), 2);
    }
}
