//! A drop's pass: `v1.<drop>.<ticket>.<expires, ms since the epoch>.<signature>`, the
//! signature an HMAC-SHA256 with the drop's key over the drop, the ticket, the expiry and
//! the identity it was given to. The identity is not in the pass: a pass checked under
//! any other identity fails its signature, so a copied pass is worth nothing.

use chrono::{DateTime, TimeZone as _, Utc};
use hmac::{KeyInit as _, Mac as _};
use uuid::Uuid;

type HmacSha256 = hmac::Hmac<sha2::Sha256>;

/// What a valid pass says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pass {
    pub drop_id: Uuid,
    pub ticket: Uuid,
    pub expires_at: DateTime<Utc>,
}

/// Why a pass was refused, in words for the shopper.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("This drop's product needs a pass from its queue.")]
    Missing,
    #[error("This pass is not one the shop gave to you for this drop.")]
    Invalid,
    #[error("Your pass for this drop has expired: your turn to buy is over.")]
    Expired,
}

fn mac(secret: &[u8], drop_id: Uuid, ticket: Uuid, expires_ms: i64, identity: &str) -> HmacSha256 {
    let mut mac = HmacSha256::new_from_slice(secret).expect("HMAC takes a key of any length");
    mac.update(format!("{drop_id}.{ticket}.{expires_ms}.").as_bytes());
    mac.update(identity.as_bytes());
    mac
}

/// The pass for `ticket` of drop `drop_id`, given to `identity` until `expires_at`.
pub fn sign(
    secret: &[u8],
    drop_id: Uuid,
    ticket: Uuid,
    expires_at: DateTime<Utc>,
    identity: &str,
) -> String {
    let expires_ms = expires_at.timestamp_millis();
    let signature = mac(secret, drop_id, ticket, expires_ms, identity)
        .finalize()
        .into_bytes();
    format!(
        "v1.{}.{}.{expires_ms}.{}",
        drop_id.simple(),
        ticket.simple(),
        hex::encode(signature)
    )
}

/// `raw` checked as a pass of drop `drop_id` for `identity` at `now`.
pub fn verify(
    raw: &str,
    secret: &[u8],
    drop_id: Uuid,
    identity: &str,
    now: DateTime<Utc>,
) -> Result<Pass, Refused> {
    let mut parts = raw.trim().split('.');
    let (Some("v1"), Some(drop), Some(ticket), Some(expires), Some(signature), None) = (
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
    ) else {
        return Err(Refused::Invalid);
    };
    let (Ok(drop), Ok(ticket), Ok(expires_ms), Ok(signature)) = (
        Uuid::try_parse(drop),
        Uuid::try_parse(ticket),
        expires.parse::<i64>(),
        hex::decode(signature),
    ) else {
        return Err(Refused::Invalid);
    };
    if drop != drop_id
        || mac(secret, drop, ticket, expires_ms, identity)
            .verify_slice(&signature)
            .is_err()
    {
        return Err(Refused::Invalid);
    }
    let expires_at = Utc
        .timestamp_millis_opt(expires_ms)
        .single()
        .ok_or(Refused::Invalid)?;
    if expires_at <= now {
        return Err(Refused::Expired);
    }
    Ok(Pass {
        drop_id,
        ticket,
        expires_at,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pass_holds_only_for_its_identity_drop_and_time() {
        let (secret, drop, ticket) = ([7u8; 32], Uuid::new_v4(), Uuid::new_v4());
        let now = Utc::now();
        let until = now + chrono::Duration::seconds(60);
        let pass = sign(&secret, drop, ticket, until, "b123");
        let ok = verify(&pass, &secret, drop, "b123", now).unwrap();
        assert_eq!((ok.drop_id, ok.ticket), (drop, ticket));
        assert_eq!(ok.expires_at.timestamp_millis(), until.timestamp_millis());

        assert_eq!(
            verify(&pass, &secret, drop, "b124", now),
            Err(Refused::Invalid)
        );
        assert_eq!(
            verify(&pass, &secret, Uuid::new_v4(), "b123", now),
            Err(Refused::Invalid)
        );
        assert_eq!(
            verify(&pass, &[8u8; 32], drop, "b123", now),
            Err(Refused::Invalid)
        );
        assert_eq!(
            verify(
                &pass,
                &secret,
                drop,
                "b123",
                until + chrono::Duration::seconds(1)
            ),
            Err(Refused::Expired)
        );
        // A later expiry written into the pass breaks its signature.
        let stretched = pass.replace(
            &until.timestamp_millis().to_string(),
            &(until.timestamp_millis() + 3_600_000).to_string(),
        );
        assert_eq!(
            verify(&stretched, &secret, drop, "b123", now),
            Err(Refused::Invalid)
        );
        assert_eq!(
            verify("v1.x", &secret, drop, "b123", now),
            Err(Refused::Invalid)
        );
    }
}
