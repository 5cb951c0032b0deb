//! A person's change of a product's stock, as the admin's form and its JSON API both make
//! it: add units (a delta, which never conflicts with sales) or set the count
//! (compare-and-set against the count the person saw), with a reason for the ledger. The
//! bounds are checked here, before any SQL, so the form and the API refuse alike.

use sqlx::PgConnection;

use super::db::{self, Adjusted, MAX_ON_HAND};
use crate::catalog::Sku;

/// The most units one change adds, or sets the count to.
pub const MAX_UNITS: i32 = 10_000_000;

/// A change of a product's count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// Add `units` (a delivery).
    Restock { units: i32 },
    /// Set the count to `new`, if it still is `expected`.
    Adjust { expected: i32, new: i32 },
}

/// A value a change refuses, as a sentence naming it.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Invalid(pub String);

/// Why a valid change changed nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The count would pass what it can hold ([`MAX_ON_HAND`]).
    TooMuch { units: i32 },
    /// The count is no longer the one the person saw: this is it now.
    Moved { on_hand: i32 },
    /// The new count is below what holds keep reserved.
    BelowReserved { reserved: i32 },
}

impl Refused {
    /// The refusal in a sentence. (The form says "moved" in its own words: its page shows
    /// the new count beside the field.)
    pub fn sentence(&self, change: Change) -> String {
        match (*self, change) {
            (Self::TooMuch { units }, _) => format!(
                "Adding {units} units would take this product past the most it can have on \
                 hand ({MAX_ON_HAND}); nothing was changed."
            ),
            (Self::Moved { on_hand }, Change::Adjust { expected, .. }) => format!(
                "Stock moved: expected {expected} on hand, but there are {on_hand}; nothing \
                 was changed."
            ),
            (Self::Moved { on_hand }, _) => {
                format!("Stock moved: there are {on_hand} on hand; nothing was changed.")
            }
            (Self::BelowReserved { reserved }, _) => {
                format!("{reserved} units are held in checkouts; the count cannot go below that.")
            }
        }
    }
}

/// `n` as a count from `min` to `max`, or a sentence naming `what`.
fn bounded(n: Option<i64>, what: &str, min: i32, max: i32) -> Result<i32, Invalid> {
    n.and_then(|n| i32::try_from(n).ok())
        .filter(|n| (min..=max).contains(n))
        .ok_or_else(|| {
            Invalid(format!(
                "{what} must be a whole number from {min} to {max}."
            ))
        })
}

impl Change {
    /// Add `units`, named `what` in a refusal; `None` for a value that is not a number.
    pub fn restock(units: Option<i64>, what: &str) -> Result<Self, Invalid> {
        let units = bounded(units, what, 1, MAX_UNITS)?;
        Ok(Self::Restock { units })
    }

    /// Set the count to `new` if it still is `expected`, each named in a refusal.
    pub fn adjust(
        (expected, expected_what): (Option<i64>, &str),
        (new, new_what): (Option<i64>, &str),
    ) -> Result<Self, Invalid> {
        let expected = bounded(expected, expected_what, 0, MAX_ON_HAND)?;
        let new = bounded(new, new_what, 0, MAX_UNITS)?;
        Ok(Self::Adjust { expected, new })
    }

    /// What a retry under the same key must match.
    pub fn fingerprint(&self, sku: &Sku, reason: &str) -> serde_json::Value {
        let sku = sku.as_str();
        match *self {
            Self::Restock { units } => serde_json::json!(("restock", sku, units, reason)),
            Self::Adjust { expected, new } => {
                serde_json::json!(("adjust", sku, expected, new, reason))
            }
        }
    }

    /// Applies the change to `sku` in `tx`, with its ledger row and event: the count on
    /// hand after it, or why nothing changed.
    pub async fn apply(
        &self,
        tx: &mut PgConnection,
        sku: &Sku,
        reason: &str,
        actor: &str,
    ) -> sqlx::Result<Result<i32, Refused>> {
        Ok(match *self {
            Self::Restock { units } => db::restock(tx, sku, units, reason, actor)
                .await?
                .ok_or(Refused::TooMuch { units }),
            Self::Adjust { expected, new } => {
                match db::adjust(tx, sku, expected, new, reason, actor).await? {
                    Adjusted::Done => Ok(new),
                    Adjusted::Moved { on_hand } => Err(Refused::Moved { on_hand }),
                    Adjusted::BelowReserved { reserved } => {
                        Err(Refused::BelowReserved { reserved })
                    }
                }
            }
        })
    }
}

/// The reason a person gives for a change, for the ledger: one line, 1 to 500 characters.
pub fn reason(raw: &str) -> Result<String, Invalid> {
    crate::text::single_line("The reason", raw)
        .map_err(|e| Invalid(crate::text::sentence(&e.to_string())))?;
    let reason = raw.trim();
    if reason.is_empty() {
        return Err(Invalid(
            "Please give a reason for the change (it goes into the ledger).".into(),
        ));
    }
    if reason.chars().count() > 500 {
        return Err(Invalid("A reason is at most 500 characters.".into()));
    }
    Ok(reason.to_string())
}
