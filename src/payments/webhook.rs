//! The provider's webhook (`POST /webhooks/stripe`): a signed event says that an intent
//! changed. The event is only a prompt: the intent is read from the provider and the
//! payment finished as [`super::finish`] says, so an event delivered twice, late, or
//! before an earlier one changes nothing (one about a payment already settled asks
//! nothing). Events are noted by id once handled.
//!
//! Stripe's signature: `Stripe-Signature: t=<unix seconds>,v1=<hex>[,v1=<hex>…]`, each
//! `v1` an HMAC-SHA256 with the endpoint's secret (the whole `whsec_…` text as the key) of
//! `"{t}.{raw body}"`; any one matching is enough (secrets roll over). A `t` more than
//! [`TOLERANCE`] from now is refused, so a captured request cannot be replayed later.

use hmac::{KeyInit as _, Mac as _};
use serde::Deserialize;

use super::flow::PayError;
use super::{Payments, db};

type HmacSha256 = hmac::Hmac<sha2::Sha256>;

/// How far a signature's time may be from now, in seconds (Stripe's own libraries' default).
pub const TOLERANCE: i64 = 300;

/// What the webhook answers.
#[derive(Debug)]
pub enum Handled {
    /// Handled now (or nothing to do: not an intent of this shop's).
    Now,
    /// This event id was handled before.
    Again,
}

/// Why an event was not handled.
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    /// 400: no valid signature, a stale one, or a body that is not an event.
    #[error("{0}")]
    Bad(&'static str),
    /// 503: the provider or Redis did not answer; the provider sends the event again.
    #[error("{0}")]
    Later(PayError),
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

#[derive(Deserialize)]
struct Event {
    id: String,
    #[serde(rename = "type")]
    kind: String,
    data: EventData,
}

#[derive(Deserialize)]
struct EventData {
    object: EventObject,
}

#[derive(Deserialize)]
struct EventObject {
    id: String,
    object: String,
}

impl Payments {
    /// Handles one webhook request: `body` as received, with its `Stripe-Signature`.
    pub async fn webhook(
        &self,
        body: &[u8],
        signature: &str,
        now: i64,
    ) -> Result<Handled, Refused> {
        if !verify(&self.webhook_secret, body, signature, now) {
            return Err(Refused::Bad(
                "The Stripe-Signature header does not sign this body with this shop's webhook \
                 secret within five minutes of now.",
            ));
        }
        let event: Event = serde_json::from_slice(body)
            .map_err(|_| Refused::Bad("The body is not a Stripe event."))?;
        if db::seen_event(&self.db, &event.id).await? {
            return Ok(Handled::Again);
        }
        if event.data.object.object == "payment_intent"
            && let Some(payment) = db::find_by_intent(&self.db, &event.data.object.id).await?
        {
            match self.finish(payment.hold_id).await {
                // Busy: the finisher that holds it reads the intent itself.
                Ok(()) | Err(PayError::Busy) => {}
                Err(e @ (PayError::NoLease | PayError::Provider(_))) => {
                    return Err(Refused::Later(e));
                }
                Err(PayError::Database(e)) => return Err(e.into()),
                Err(e) => {
                    tracing::warn!(event = %event.id, error = %e, "webhook left the payment as it was")
                }
            }
        }
        Ok(if db::note_event(&self.db, &event.id, &event.kind).await? {
            Handled::Now
        } else {
            Handled::Again
        })
    }
}

/// Whether `header` holds a `v1` signature of `body` by `secret` whose time is within
/// [`TOLERANCE`] of `now`.
pub fn verify(secret: &str, body: &[u8], header: &str, now: i64) -> bool {
    let mut time = None;
    let mut signatures = Vec::new();
    for part in header.split(',') {
        match part.trim().split_once('=') {
            Some(("t", t)) => time = t.parse::<i64>().ok(),
            Some(("v1", sig)) => signatures.extend(hex::decode(sig).ok()),
            _ => {}
        }
    }
    let Some(time) = time else {
        return false;
    };
    if (now - time).abs() > TOLERANCE {
        return false;
    }
    signatures.iter().any(|sig| {
        let Ok(mut mac) = HmacSha256::new_from_slice(secret.as_bytes()) else {
            return false;
        };
        mac.update(format!("{time}.").as_bytes());
        mac.update(body);
        mac.verify_slice(sig).is_ok()
    })
}

/// The `Stripe-Signature` value for `body` at `time` (tests and the load tools sign as
/// Stripe does).
pub fn sign(secret: &str, body: &[u8], time: i64) -> String {
    let mut mac = HmacSha256::new_from_slice(secret.as_bytes()).expect("HMAC takes any key");
    mac.update(format!("{time}.").as_bytes());
    mac.update(body);
    format!("t={time},v1={}", hex::encode(mac.finalize().into_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signature_verifies_only_for_its_body_secret_and_time() {
        let body = br#"{"id":"evt_1"}"#;
        let header = sign("whsec_a", body, 1_000);
        assert!(verify("whsec_a", body, &header, 1_000));
        assert!(verify("whsec_a", body, &header, 1_000 + TOLERANCE));
        assert!(!verify("whsec_a", body, &header, 1_000 + TOLERANCE + 1));
        assert!(!verify("whsec_b", body, &header, 1_000));
        assert!(!verify("whsec_a", br#"{"id":"evt_2"}"#, &header, 1_000));
        assert!(!verify("whsec_a", body, "v1=00", 1_000));
        assert!(!verify("whsec_a", body, "", 1_000));
    }

    #[test]
    fn any_one_of_several_signatures_is_enough() {
        let body = b"{}";
        let good = sign("whsec_new", body, 50);
        let v1 = good.split_once(",v1=").unwrap().1;
        let header = format!("t=50,v1={},v1={v1},v0=ignored", "ab".repeat(32));
        assert!(verify("whsec_new", body, &header, 60));
    }

    #[test]
    fn matches_stripes_own_construction() {
        // HMAC-SHA256("whsec_test", "1700000000.{}") in hex, computed independently
        // (`printf '1700000000.{}' | openssl dgst -sha256 -hmac whsec_test`).
        let header = sign("whsec_test", b"{}", 1_700_000_000);
        assert_eq!(header, format!("t=1700000000,v1={}", EXPECTED));
    }

    const EXPECTED: &str = "35495024f4ef3f94e5a93e22221544c4b75e9a42300cd965ab81cb85cd994e91";
}
