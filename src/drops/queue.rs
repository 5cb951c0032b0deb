//! A drop's queue in Redis, changed only by the two scripts below, so every process sees
//! the same places:
//! - `q`: the waiting tickets, a sorted set. FIFO scores a ticket by its arrival number;
//!   a lottery scores a pre-queue ticket by a random draw below [`AFTER_OPENING`] (drawn
//!   once, when it joins, and never shown before the opening) and a later one by
//!   [`AFTER_OPENING`] + its arrival number, so the pre-queue goes first in drawn order.
//! - `ids` identity → ticket (one place per identity), `who` ticket → identity and key
//!   owner, `addr` places per client address, `n` the arrival counter.
//! - `adm` admitted tickets scored by when their admission ends, `admt` by when it began,
//!   `bucket` the token bucket that paces admission: refilled at the drop's rate per
//!   minute from the moment it opens (not while paused), holding at most
//!   [`BURST`] of it, so a quiet spell does not let a crowd in at once.
//!
//! Time is Redis's (`TIME`), so processes with different clocks agree on it. Every key
//! expires [`KEPT_AFTER_OPENING`] after the opening.

use chrono::{DateTime, TimeZone as _, Utc};
use redis::Script;
use std::sync::LazyLock;
use uuid::Uuid;

use super::Drop;
use crate::locking::Redis;

/// Lottery scores of pre-queue tickets are below this; arrival-ordered ones above.
pub const AFTER_OPENING: f64 = 1e15;
/// The bucket holds this much of the admission rate.
pub const BURST: std::time::Duration = std::time::Duration::from_secs(2);

static JOIN: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local ids, q, who, addr, n = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local opens, from = tonumber(ARGV[6]), tonumber(ARGV[7])
if now < from then return {'early', ''} end
local existing = redis.call('HGET', ids, ARGV[2])
if existing then return {'again', existing} end
local per_address = tonumber(ARGV[4])
if per_address > 0 and tonumber(redis.call('HGET', addr, ARGV[3]) or '0') >= per_address then
  return {'address', ''}
end
local seq = redis.call('INCR', n)
-- Scores as integers in text: Lua would print a large number with 14 digits.
local score = string.format('%.0f', 1e15 + seq)
if ARGV[8] == 'lottery' and now < opens then score = ARGV[5] end
redis.call('HSET', ids, ARGV[2], ARGV[1])
redis.call('HSET', who, ARGV[1], ARGV[2] .. '\n' .. ARGV[9])
redis.call('HINCRBY', addr, ARGV[3], 1)
redis.call('ZADD', q, score, ARGV[1])
for i = 1, 5 do redis.call('PEXPIREAT', KEYS[i], ARGV[10]) end
return {'new', ARGV[1]}
"#,
    )
});

static POLL: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local q, adm, admt, bucket, who = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local open, opens, rate = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local max_active, session, burst_ms = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local let_in = 0
if open == '1' and now >= opens then
  local b = redis.call('HMGET', bucket, 'tokens', 'refill')
  local tokens, refill = tonumber(b[1]) or 0, tonumber(b[2]) or opens
  if refill < opens then refill = opens end
  tokens = tokens + (now - refill) * rate / 60000
  local burst = math.max(1, rate * burst_ms / 60000)
  if tokens > burst then tokens = burst end
  local room = math.floor(tokens)
  if max_active > 0 then
    room = math.min(room, max_active - redis.call('ZCOUNT', adm, string.format('(%.0f', now), '+inf'))
  end
  if room > 0 then
    local popped = redis.call('ZPOPMIN', q, room)
    for i = 1, #popped, 2 do
      redis.call('ZADD', adm, string.format('%.0f', now + session), popped[i])
      redis.call('ZADD', admt, string.format('%.0f', now), popped[i])
    end
    let_in = #popped / 2
    tokens = tokens - let_in
  end
  redis.call('HSET', bucket, 'tokens', tostring(tokens), 'refill', string.format('%.0f', now))
  for i = 2, 4 do redis.call('PEXPIREAT', KEYS[i], ARGV[8]) end
elseif open == '0' then
  -- Paused: the bucket does not fill meanwhile.
  redis.call('HSET', bucket, 'refill', string.format('%.0f', now))
  redis.call('PEXPIREAT', bucket, ARGV[8])
end
local stats = {now, redis.call('ZCARD', q), redis.call('ZCOUNT', adm, string.format('(%.0f', now), '+inf'),
               redis.call('ZCARD', admt), redis.call('ZCOUNT', admt, string.format('%.0f', now - 60000), string.format('%.0f', now)), let_in}
local ticket = ARGV[1]
if ticket == '' then return {'stats', stats} end
local whom = redis.call('HGET', who, ticket)
if not whom then return {'unknown', stats} end
local ends = redis.call('ZSCORE', adm, ticket)
if ends then
  return {'admitted', stats, whom, tonumber(ends), tonumber(redis.call('ZSCORE', admt, ticket))}
end
local rank = redis.call('ZRANK', q, ticket)
if rank then
  local drawn = 0
  if tonumber(redis.call('ZSCORE', q, ticket)) < 1e15 then drawn = 1 end
  return {'waiting', stats, whom, rank, drawn}
end
return {'unknown', stats}
"#,
    )
});

/// A queue's keys outlive its opening by this much at most (an ended drop's are let go
/// sooner, by [`expire`]); its admissions stay in PostgreSQL.
pub const KEPT_AFTER_OPENING: chrono::Duration = chrono::Duration::days(30);

/// When Redis forgets drop `drop`'s queue, in ms since the epoch.
fn forget_at(drop: &Drop) -> i64 {
    (drop.opens_at + KEPT_AFTER_OPENING).timestamp_millis()
}

/// Redis did not answer (or its breaker is open): nobody joins or is let in meanwhile.
#[derive(Debug, Clone, Copy)]
pub struct Unreachable;

/// The keys of drop `id`'s queue.
fn key(redis: &Redis, id: Uuid, name: &str) -> String {
    redis.key(&format!("drop:{}:{name}", id.simple()))
}

/// What joining did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Joined {
    /// A place: a new one, or (`again`) the one this identity had.
    Ticket { ticket: Uuid, again: bool },
    /// Before the pre-queue opens.
    Early,
    /// This client address has all the places it may take.
    AddressFull,
}

/// Who is joining: the identity a pass is bound to, the owner part of their idempotency
/// keys, and their address.
pub struct Joiner<'a> {
    pub identity: &'a str,
    pub key_owner: &'a str,
    pub address: &'a str,
}

/// Joins `drop`'s queue; `per_address` places at most per client address (0: no limit).
pub async fn join(
    redis: &Redis,
    drop: &Drop,
    joiner: &Joiner<'_>,
    per_address: u32,
) -> Result<Joined, Unreachable> {
    use rand::Rng as _;
    let draw: u64 = rand::rng().random_range(0..(AFTER_OPENING as u64));
    let ticket = Uuid::new_v4();
    let mut invocation = JOIN.prepare_invoke();
    for name in ["ids", "q", "who", "addr", "n"] {
        invocation.key(key(redis, drop.id, name));
    }
    invocation
        .arg(ticket.to_string())
        .arg(joiner.identity)
        .arg(joiner.address)
        .arg(per_address)
        .arg(draw)
        .arg(drop.opens_at.timestamp_millis())
        .arg(drop.prequeue_at().timestamp_millis())
        .arg(drop.queueing.as_str())
        .arg(joiner.key_owner)
        .arg(forget_at(drop));
    let mut conn = redis.conn();
    let (what, value): (String, String) = redis
        .call("joining a drop's queue", invocation.invoke_async(&mut conn))
        .await
        .ok_or(Unreachable)?;
    Ok(match what.as_str() {
        "early" => Joined::Early,
        "address" => Joined::AddressFull,
        again => Joined::Ticket {
            ticket: Uuid::try_parse(&value).map_err(|_| Unreachable)?,
            again: again == "again",
        },
    })
}

/// The queue's counts at one moment.
#[derive(Debug, Clone, Copy, Default)]
pub struct Stats {
    /// Redis's clock.
    pub now: DateTime<Utc>,
    pub waiting: u64,
    /// Admitted, their admission not over.
    pub active: u64,
    pub admitted: u64,
    pub admitted_last_minute: u64,
    /// Let in by this call.
    pub let_in: u64,
}

/// An admitted ticket, as PostgreSQL records it.
#[derive(Debug, Clone)]
pub struct Admission {
    pub ticket: Uuid,
    pub identity: String,
    pub key_owner: String,
    pub admitted_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
}

/// Where one ticket stands.
#[derive(Debug, Clone)]
pub enum Standing {
    /// `ahead` tickets before it; `drawn` when its place is a lottery draw (hidden until
    /// the opening).
    Waiting {
        identity: String,
        ahead: u64,
        drawn: bool,
    },
    Admitted(Admission),
    /// No such ticket (never given, or Redis lost it).
    Unknown,
}

/// Lets in whoever the drop's rate allows now (when `open`: not paused, not over) and
/// says where `ticket` stands, by one script.
pub async fn poll(
    redis: &Redis,
    drop: &Drop,
    ticket: Option<Uuid>,
    open: bool,
) -> Result<(Stats, Standing), Unreachable> {
    let mut invocation = POLL.prepare_invoke();
    for name in ["q", "adm", "admt", "bucket", "who"] {
        invocation.key(key(redis, drop.id, name));
    }
    invocation
        .arg(ticket.map(|t| t.to_string()).unwrap_or_default())
        .arg(if open { "1" } else { "0" })
        .arg(drop.opens_at.timestamp_millis())
        .arg(drop.admit_per_minute)
        .arg(drop.max_active.unwrap_or(0))
        .arg(i64::from(drop.session_seconds) * 1000)
        .arg(BURST.as_millis() as u64)
        .arg(forget_at(drop));
    let mut conn = redis.conn();
    let answer: Vec<redis::Value> = redis
        .call("polling a drop's queue", invocation.invoke_async(&mut conn))
        .await
        .ok_or(Unreachable)?;
    parse_poll(ticket, &answer).ok_or(Unreachable)
}

fn int(v: &redis::Value) -> Option<i64> {
    match v {
        redis::Value::Int(i) => Some(*i),
        redis::Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
        _ => None,
    }
}

fn text(v: &redis::Value) -> Option<String> {
    match v {
        redis::Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        redis::Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

fn millis(ms: i64) -> Option<DateTime<Utc>> {
    Utc.timestamp_millis_opt(ms).single()
}

fn parse_poll(ticket: Option<Uuid>, answer: &[redis::Value]) -> Option<(Stats, Standing)> {
    let what = text(answer.first()?)?;
    let redis::Value::Array(s) = answer.get(1)? else {
        return None;
    };
    let n = |i: usize| s.get(i).and_then(int).map(|v| v.max(0) as u64);
    let stats = Stats {
        now: millis(s.first().and_then(int)?)?,
        waiting: n(1)?,
        active: n(2)?,
        admitted: n(3)?,
        admitted_last_minute: n(4)?,
        let_in: n(5)?,
    };
    let whom = || {
        let whom = text(answer.get(2)?)?;
        let (identity, owner) = whom.split_once('\n')?;
        Some((identity.to_string(), owner.to_string()))
    };
    let standing = match what.as_str() {
        "waiting" => Standing::Waiting {
            identity: whom()?.0,
            ahead: answer.get(3).and_then(int)?.max(0) as u64,
            drawn: answer.get(4).and_then(int)? == 1,
        },
        "admitted" => {
            let (identity, key_owner) = whom()?;
            Standing::Admitted(Admission {
                ticket: ticket?,
                identity,
                key_owner,
                expires_at: millis(answer.get(3).and_then(int)?)?,
                admitted_at: millis(answer.get(4).and_then(int)?)?,
            })
        }
        _ => Standing::Unknown,
    };
    Some((stats, standing))
}

/// Shoppers let in per second lately: over the last minute (or since the opening, if
/// sooner), else the drop's own rate before anyone was let in.
pub fn rate_per_second(drop: &Drop, stats: &Stats) -> f64 {
    let since_opening = (stats.now - drop.opens_at).num_milliseconds() as f64 / 1000.0;
    let window = since_opening.clamp(1.0, 60.0);
    if stats.admitted_last_minute == 0 || since_opening <= 0.0 {
        return f64::from(drop.admit_per_minute) / 60.0;
    }
    stats.admitted_last_minute as f64 / window
}

/// Every ticket drop `id` let in and when (ms since the epoch, Redis's clock), whether or
/// not its shopper came back to see it (PostgreSQL records those who did): for the load
/// test's fairness figures. `None` when Redis does not answer.
pub async fn admitted(redis: &Redis, id: Uuid) -> Option<Vec<(Uuid, i64)>> {
    let mut conn = redis.conn();
    let mut cmd = redis::cmd("ZRANGE");
    cmd.arg(key(redis, id, "admt"))
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES");
    let pairs: Vec<(String, f64)> = redis
        .call("reading a drop's admissions", cmd.query_async(&mut conn))
        .await?;
    Some(
        pairs
            .into_iter()
            .filter_map(|(t, at)| Some((Uuid::try_parse(&t).ok()?, at as i64)))
            .collect(),
    )
}

/// Lets Redis forget an ended drop's queue a day later (its admissions stay in PostgreSQL).
pub async fn expire(redis: &Redis, id: Uuid) {
    let mut pipe = redis::pipe();
    for name in ["ids", "q", "who", "addr", "n", "adm", "admt", "bucket"] {
        pipe.cmd("EXPIRE")
            .arg(key(redis, id, name))
            .arg(86_400)
            .ignore();
    }
    let mut conn = redis.conn();
    redis
        .call("expiring a drop's queue", pipe.query_async::<()>(&mut conn))
        .await;
}
