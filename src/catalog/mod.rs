//! What is for sale: products identified by a [`Sku`], with prices in cents. Stock levels
//! live in [`crate::inventory`]; this module only joins them in for display.

pub mod browse;
pub mod cache;
pub mod db;
pub mod images;
pub mod manage;

use serde::Serialize;

/// A stock-keeping unit: 2–32 characters of `A–Z`, `0–9` and `-`, starting with a letter or
/// digit. Parsing upper-cases, so `/products/kb-alpine-75` finds `KB-ALPINE-75`.
///
/// Rows decode straight into it (`#[sqlx(transparent)]`): what the database holds passed
/// this check on the way in. From JSON it is parsed like any other input.
#[derive(
    Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, sqlx::Type, utoipa::ToSchema,
)]
#[serde(transparent)]
#[sqlx(transparent)]
#[schema(example = "KB-ALPINE-75")]
pub struct Sku(String);

impl<'de> serde::Deserialize<'de> for Sku {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = String::deserialize(d)?;
        Self::parse(&raw).map_err(serde::de::Error::custom)
    }
}

/// Why a SKU was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "{0:?} is not a valid SKU: use 2 to 32 letters, digits or dashes, starting with a letter or digit"
)]
pub struct InvalidSku(pub String);

impl Sku {
    pub fn parse(raw: &str) -> Result<Self, InvalidSku> {
        let s = raw.trim().to_ascii_uppercase();
        let valid = (2..=32).contains(&s.len())
            && s.bytes()
                .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'-')
            && !s.starts_with('-');
        if valid {
            Ok(Self(s))
        } else {
            Err(InvalidSku(raw.chars().take(64).collect()))
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for Sku {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// How many units below which the storefront says "only N left".
pub const LOW_STOCK: i32 = 5;

/// A product as the storefront lists it.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct ProductView {
    pub sku: Sku,
    pub name: String,
    pub description: String,
    pub price_cents: i64,
    /// At most this many per customer; `null` when there is no limit.
    pub purchase_limit: Option<i32>,
    /// The shelf it sits on (`null`: none).
    pub category: Option<String>,
    /// Its picture's ETag, when it has one ([`images`]).
    #[serde(skip)]
    pub image: Option<String>,
    /// `on_hand − reserved`: what a shopper can still buy.
    pub available: i32,
}

impl ProductView {
    pub fn price(&self) -> String {
        format_cents(self.price_cents)
    }

    /// The name as shown: numbers and their units never split across lines.
    pub fn display_name(&self) -> String {
        crate::text::keep_units_together(&self.name)
    }

    /// A short version of the picture for its address, so a new picture is a new URL:
    /// `/products/{sku}/image?v=…`.
    pub fn image_version(&self) -> Option<&str> {
        self.image.as_deref().map(images::version)
    }

    pub fn sold_out(&self) -> bool {
        self.available <= 0
    }

    pub fn low(&self) -> bool {
        self.available > 0 && self.available <= LOW_STOCK
    }

    /// The badge text: "In stock", "Only 3 left", "Sold out".
    pub fn badge(&self) -> String {
        if self.sold_out() {
            "Sold out".into()
        } else if self.low() {
            format!("Only {} left", self.available)
        } else {
            "In stock".into()
        }
    }
}

/// The shop's one currency (`STOCKADE_CURRENCY`), set once when the process starts: every
/// price is shown in it. Unset (a tool, a test), prices are in US dollars.
static CURRENCY: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Sets the currency every price is shown in (the first call wins: one per process).
pub fn set_currency(code: &str) {
    let _ = CURRENCY.set(code.to_ascii_lowercase());
}

/// `129900` → `"$1,299.00"` (in the shop's currency: `"€1,299.00"`, `"1,299.00 CHF"`).
pub fn format_cents(cents: i64) -> String {
    in_currency(cents, CURRENCY.get().map_or("usd", String::as_str))
}

/// `cents` of `currency` (a two-decimal ISO 4217 code, lower case) as a person reads it.
pub fn in_currency(cents: i64, currency: &str) -> String {
    let sign = if cents < 0 { "-" } else { "" };
    let cents = cents.unsigned_abs();
    let units = (cents / 100).to_string();
    let mut grouped = String::new();
    for (i, c) in units.chars().enumerate() {
        if i > 0 && (units.len() - i).is_multiple_of(3) {
            grouped.push(',');
        }
        grouped.push(c);
    }
    let amount = format!("{grouped}.{:02}", cents % 100);
    match currency {
        "usd" => format!("{sign}${amount}"),
        "eur" => format!("{sign}€{amount}"),
        "gbp" => format!("{sign}£{amount}"),
        other => format!("{sign}{amount} {}", other.to_ascii_uppercase()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skus_are_normalised_and_checked() {
        assert_eq!(
            Sku::parse(" kb-alpine-75 ").unwrap().as_str(),
            "KB-ALPINE-75"
        );
        for bad in [
            "",
            "A",
            "-AB",
            "AB CD",
            "ÄB",
            "a/b",
            &"X".repeat(33),
            "AB'--",
        ] {
            assert!(Sku::parse(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn prices_read_like_prices() {
        assert_eq!(format_cents(0), "$0.00");
        assert_eq!(format_cents(5), "$0.05");
        assert_eq!(format_cents(129_900), "$1,299.00");
        assert_eq!(format_cents(123_456_789), "$1,234,567.89");
        assert_eq!(format_cents(-250), "-$2.50");
        assert_eq!(in_currency(129_900, "eur"), "€1,299.00");
        assert_eq!(in_currency(250, "gbp"), "£2.50");
        assert_eq!(in_currency(-129_900, "chf"), "-1,299.00 CHF");
    }

    #[test]
    fn badges_follow_availability() {
        let mut p = ProductView {
            sku: Sku::parse("A1").unwrap(),
            name: "n".into(),
            description: String::new(),
            price_cents: 1,
            purchase_limit: None,
            category: None,
            image: None,
            available: 0,
        };
        assert_eq!(p.badge(), "Sold out");
        p.available = 3;
        assert_eq!(p.badge(), "Only 3 left");
        p.available = 6;
        assert_eq!(p.badge(), "In stock");
    }
}
