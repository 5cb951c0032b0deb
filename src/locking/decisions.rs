//! Sold-out answers kept in Redis, so a sold-out SKU costs the database no writes.
//!
//! Once a SKU is gone, most of what a flash sale sends is "one more, please" for it, and
//! each answer must be kept under its idempotency key so a retry gets the same one. Kept
//! in PostgreSQL, that is a commit per answer: a sold-out answer would cost nearly what
//! an order does. So the keys of requests for a sold-out SKU live here for a while:
//!
//! - [`Redis::decide_sold_out`] stores 409s under their keys (`decision:{scope}:{key}`)
//!   only while the SKU carries the sold-out hint, atomically with that check, and
//!   appends them to a drain list; a key's existing record is returned instead;
//! - [`Redis::mark_keys`] marks the keys of requests that go on to PostgreSQL (`pg`, for
//!   the stale window) before their transaction, so a twin request that comes later goes
//!   to PostgreSQL too (where it waits for the first and replays it) instead of being
//!   answered here; a key that already has an answer here is reported, and answered from
//!   it;
//! - [`Redis::take_drained`] pops answers to copy into PostgreSQL, which every process
//!   does every second; a copy that fails is put back with [`Redis::requeue`].
//!
//! Records here are opaque strings; `crate::checkout::sold_out` gives them meaning.

use std::time::Duration;

use redis::Script;

use super::Redis;
use crate::catalog::Sku;

/// What [`Redis::decide_sold_out`] did.
#[derive(Debug, PartialEq, Eq)]
pub enum Decided {
    /// The SKU carries the hint; per key, `None` if its answer was stored now, or the
    /// record it had already: `pg` (a request is deciding it in PostgreSQL) or an answer.
    SoldOut(Vec<Option<String>>),
    /// The SKU no longer carries the hint; nothing was stored.
    NotSoldOut,
}

/// The mark of a key being decided in PostgreSQL.
pub const IN_POSTGRES: &str = "pg";

/// KEYS: the SKU's sold-out hint, the drain list, n decision keys. ARGV: ttl ms, n
/// records. Unless the hint is gone (then returns {}), stores each record under its key
/// when the key has none, and returns per key '' (stored now) or the record it had. One
/// `SET … NX GET` per key and one `RPUSH` per thousand stored: a call from the script
/// costs Redis more than the work it does.
const DECIDE: &str = r#"
if redis.call('EXISTS', KEYS[1]) == 0 then return {} end
local out, stored = {}, {}
for i = 3, #KEYS do
  local prev = redis.call('SET', KEYS[i], ARGV[i - 1], 'NX', 'GET', 'PX', ARGV[1])
  if prev then
    out[i - 2] = prev
  else
    stored[#stored + 1] = ARGV[i - 1]
    out[i - 2] = ''
  end
end
-- In slices: unpack() gives at most a few thousand values at once.
for i = 1, #stored, 1000 do
  redis.call('RPUSH', KEYS[2], unpack(stored, i, math.min(i + 999, #stored)))
end
return out
"#;

/// KEYS: decision keys. ARGV: ttl ms. Marks each unrecorded key `pg`; returns, per key,
/// its stored answer or '' (marked now, or already marked).
const MARK: &str = r#"
local out = {}
for i, key in ipairs(KEYS) do
  local v = redis.call('SET', key, 'pg', 'NX', 'GET', 'PX', ARGV[1])
  if not v or v == 'pg' then v = '' end
  out[i] = v
end
return out
"#;

impl Redis {
    fn decision_key(&self, scope: &str, key: &str) -> String {
        self.key(&format!("decision:{scope}:{key}"))
    }

    fn drain_key(&self) -> String {
        self.key("decisions-to-copy")
    }

    /// Whether this process saw any of `skus` hinted sold out (and not cleared since).
    pub fn believes_sold_out(&self, skus: &[Sku]) -> bool {
        let here = self.sold_out_here.lock().expect("sold-out set");
        !here.is_empty() && skus.iter().any(|s| here.contains(s.as_str()))
    }

    pub(super) fn believe_sold_out(&self, sku: &Sku, sold_out: bool) {
        let mut here = self.sold_out_here.lock().expect("sold-out set");
        if sold_out {
            here.insert(sku.to_string());
        } else {
            here.remove(sku.as_str());
        }
    }

    /// Stores each `(scope, key, record)` as the key's answer if `sku` is still hinted
    /// sold out (see [`Decided`]); `None` when Redis did not answer.
    pub async fn decide_sold_out(
        &self,
        sku: &Sku,
        answers: &[(&str, &str, String)],
        keep: Duration,
    ) -> Option<Decided> {
        if answers.is_empty() {
            return Some(Decided::SoldOut(Vec::new()));
        }
        let script = Script::new(DECIDE);
        let mut invocation = script.prepare_invoke();
        invocation.key(self.sold_out_key(sku)).key(self.drain_key());
        for (scope, key, _) in answers {
            invocation.key(self.decision_key(scope, key));
        }
        invocation.arg(keep.as_millis() as u64);
        for (_, _, record) in answers {
            invocation.arg(record);
        }
        let mut conn = self.conn();
        let found = self
            .call(
                "storing sold-out answers",
                invocation.invoke_async::<Vec<String>>(&mut conn),
            )
            .await?;
        if found.is_empty() {
            self.believe_sold_out(sku, false);
            return Some(Decided::NotSoldOut);
        }
        Some(Decided::SoldOut(
            found
                .into_iter()
                .map(|v| (!v.is_empty()).then_some(v))
                .collect(),
        ))
    }

    /// Marks each `(scope, key)` as being decided in PostgreSQL for `ttl`; returns, per
    /// key, the answer stored here for it, if any. `None` when Redis did not answer.
    pub async fn mark_keys(
        &self,
        keys: &[(&str, &str)],
        ttl: Duration,
    ) -> Option<Vec<Option<String>>> {
        if keys.is_empty() {
            return Some(Vec::new());
        }
        let script = Script::new(MARK);
        let mut invocation = script.prepare_invoke();
        for (scope, key) in keys {
            invocation.key(self.decision_key(scope, key));
        }
        invocation.arg(ttl.as_millis() as u64);
        let mut conn = self.conn();
        let found = self
            .call(
                "marking idempotency keys",
                invocation.invoke_async::<Vec<String>>(&mut conn),
            )
            .await?;
        Some(
            found
                .into_iter()
                .map(|v| (!v.is_empty()).then_some(v))
                .collect(),
        )
    }

    /// Pops up to `max` answers waiting to be copied into PostgreSQL.
    pub async fn take_drained(&self, max: usize) -> Option<Vec<String>> {
        let mut conn = self.conn();
        let mut cmd = redis::cmd("LPOP");
        cmd.arg(self.drain_key()).arg(max);
        self.call(
            "taking sold-out answers to copy",
            cmd.query_async::<Option<Vec<String>>>(&mut conn),
        )
        .await
        .map(Option::unwrap_or_default)
    }

    /// Puts back answers whose copy failed.
    pub async fn requeue(&self, records: &[String]) {
        if records.is_empty() {
            return;
        }
        let mut conn = self.conn();
        let mut cmd = redis::cmd("RPUSH");
        cmd.arg(self.drain_key()).arg(records);
        self.call(
            "putting back sold-out answers",
            cmd.query_async::<()>(&mut conn),
        )
        .await;
    }
}
