//! Hoarding across holds: the live holds (active, unexpired) of a product that one shopper
//! keeps, counted together against `STOCKADE_HOLD_MAX_PER_SKU` — by the identities that
//! name one shopper (API client, browser, email; see [`crate::checkout::Shopper`]) — and
//! those kept from one client address, against the larger
//! `STOCKADE_HOLD_MAX_PER_SKU_PER_ADDRESS` (an address may be a whole office or NAT).
//!
//! Counted, like purchase limits, after the placing transaction locked the product's stock
//! row (a hold's `reserved += q` takes it; a batch with a hold locks its rows first), which
//! orders every hold of that SKU: the count sees every hold committed before it, so holds
//! sent at once cannot pass the cap together. A hold refused here writes nothing (409).

use sqlx::PgConnection;

/// The caps a hold is counted against.
#[derive(Debug, Clone, Copy)]
pub struct Caps {
    /// Per shopper (client, browser, email).
    pub shopper: i32,
    /// Per client address.
    pub address: i32,
}

impl Caps {
    pub fn of(settings: &crate::config::Settings) -> Self {
        Self {
            shopper: settings.hold_max_per_sku,
            address: settings.hold_max_per_sku_per_address,
        }
    }
}

/// What one shopper's live holds of one SKU keep already: by their own identities, and by
/// their address.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Held {
    pub by_shopper: i64,
    pub by_address: i64,
}

/// A line to count: its SKU, and the shopper's identities apart from their addresses
/// ([`crate::checkout::Shopper::hold_identities`]).
pub struct Ask<'a> {
    pub sku: &'a str,
    pub persons: &'a [String],
    pub addresses: &'a [String],
}

/// What the live holds of each ask's SKU keep, by holds sharing one of its identities, and
/// by holds sharing one of its addresses; one statement for all. Run under the SKUs' stock
/// row locks.
#[tracing::instrument(skip_all)]
pub async fn held_by(conn: &mut PgConnection, asks: &[Ask<'_>]) -> sqlx::Result<Vec<Held>> {
    if asks.is_empty() {
        return Ok(Vec::new());
    }
    let skus: Vec<&str> = asks.iter().map(|a| a.sku).collect();
    // unnest() flattens arrays of arrays, so each identity set travels as one string.
    let persons: Vec<String> = asks.iter().map(|a| a.persons.join("\n")).collect();
    let addresses: Vec<String> = asks.iter().map(|a| a.addresses.join("\n")).collect();
    // Runtime, not `query!`: like `orders::db::bought_by`, planned afresh on every call.
    let counted: Vec<(i64, i64, i64)> = sqlx::query_as(
        r#"select u.i,
                  coalesce((select sum(l.quantity) from holds h
                              join hold_lines l on l.hold_id = h.id
                             where u.persons <> ''
                               and h.shopper && string_to_array(u.persons, E'\n')
                               and h.state = 'active' and h.expires_at > now()
                               and l.sku = u.sku), 0)::bigint,
                  coalesce((select sum(l.quantity) from holds h
                              join hold_lines l on l.hold_id = h.id
                             where u.addresses <> ''
                               and h.shopper && string_to_array(u.addresses, E'\n')
                               and h.state = 'active' and h.expires_at > now()
                               and l.sku = u.sku), 0)::bigint
             from unnest($1::text[], $2::text[], $3::text[]) with ordinality
                  as u(sku, persons, addresses, i)
            order by u.i"#,
    )
    .bind(&skus)
    .bind(&persons)
    .bind(&addresses)
    .persistent(false)
    .fetch_all(conn)
    .await?;
    Ok(counted
        .into_iter()
        .map(|(_, by_shopper, by_address)| Held {
            by_shopper,
            by_address,
        })
        .collect())
}

/// Why `asked` more units of product `name` may not be held, given what is `held`
/// already; `None`: they may.
pub fn refusal(name: &str, asked: i32, held: Held, caps: Caps) -> Option<String> {
    let asked = i64::from(asked);
    if held.by_shopper + asked > i64::from(caps.shopper) {
        let held = held.by_shopper;
        let cap = caps.shopper;
        return Some(if held == 0 {
            format!(
                "One shopper may hold at most {cap} of {name} at a time; you asked for {asked}."
            )
        } else {
            format!(
                "You already hold {held} of {name} in checkouts not yet placed, and one \
                 shopper may hold at most {cap} at a time. Place or cancel them first, or \
                 wait for them to expire."
            )
        });
    }
    if held.by_address + asked > i64::from(caps.address) {
        let (held, cap) = (held.by_address, caps.address);
        return Some(if held == 0 {
            format!(
                "At most {cap} of {name} may be held from one network at a time; you asked for {asked}."
            )
        } else {
            format!(
                "Checkouts from your network already hold {held} of {name}, and at most \
                 {cap} may be held from one network at a time. Please try again in a few \
                 minutes."
            )
        });
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hold_is_refused_past_either_cap_in_words() {
        let caps = Caps {
            shopper: 5,
            address: 8,
        };
        let held = |by_shopper, by_address| Held {
            by_shopper,
            by_address,
        };
        assert_eq!(refusal("Alpine", 5, held(0, 3), caps), None);
        assert_eq!(refusal("Alpine", 2, held(3, 6), caps), None);
        let mine = refusal("Alpine", 1, held(5, 5), caps).unwrap();
        assert!(mine.starts_with("You already hold 5 of Alpine"), "{mine}");
        let network = refusal("Alpine", 1, held(0, 8), caps).unwrap();
        assert!(
            network.starts_with("Checkouts from your network already hold 8"),
            "{network}"
        );
    }
}
