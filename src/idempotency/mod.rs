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

mod db;
mod run;

pub use db::{
    abandon, begin, begin_in, complete, lookup, present, purge, purge_stale, store, store_decided,
    stored,
};
pub use run::{Once, Request, RunError, run, run_apart};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
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

/// One decided answer to store under a key that has no record.
pub struct Decision<'a> {
    pub scope: &'a str,
    pub key: &'a str,
    pub fingerprint: &'a str,
    pub response: StoredResponse,
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
