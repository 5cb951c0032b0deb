//! What a shopper asks for, parsed at the edge: an [`OrderRequest`] of [`RequestLine`]s
//! (a [`Sku`] and a [`Quantity`]), contact details, and the [`Shopper`] asking. Placing an
//! order and placing a hold take the same request.

use serde::{Deserialize, Serialize};

use crate::address::{AddressInput, ShippingAddress};
use crate::catalog::Sku;
use crate::idempotency::Fingerprint;
use crate::orders::Contact;

/// Units of one SKU in one order: a whole number from 1 to the configured cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Quantity(i32);

impl Quantity {
    /// Checks `n` against `1..=max`.
    pub fn new(n: i64, max: i32) -> Result<Self, InvalidOrder> {
        if n < 1 {
            return Err(InvalidOrder(format!(
                "quantity must be at least 1 (got {n})"
            )));
        }
        if n > i64::from(max) {
            return Err(InvalidOrder(format!(
                "quantity must be at most {max} per product in one order (got {n})"
            )));
        }
        Ok(Self(n as i32))
    }

    /// Parses form or query text, e.g. `"2"`.
    pub fn parse(raw: &str, max: i32) -> Result<Self, InvalidOrder> {
        let raw = raw.trim();
        let n: i64 = raw
            .parse()
            .map_err(|_| InvalidOrder(format!("quantity must be a whole number (got {raw:?})")))?;
        Self::new(n, max)
    }

    pub fn get(self) -> i32 {
        self.0
    }
}

/// Why a request is not an acceptable order; the message is shown to the person.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidOrder(pub String);

/// One line of an order request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RequestLine {
    pub sku: Sku,
    pub quantity: Quantity,
}

/// A validated order request: lines merged per SKU and sorted by SKU (the canonical order
/// in which stock rows and leases are taken, so concurrent orders never deadlock).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OrderRequest {
    lines: Vec<RequestLine>,
    /// Serialized as its fields, as `email` and `name` were before addresses existed.
    #[serde(flatten)]
    contact: Contact,
    /// Who is asking; not part of the request's fingerprint.
    #[serde(skip)]
    shopper: Shopper,
}

/// Who places an order or hold, as well as a shop without accounts can tell: each
/// identity is counted on its own against a product's purchase limit, so a new order is
/// refused when the units already bought or held under *any* of them would pass it.
///
/// The identities: the API client (`client:`), the browser (`browser:`, from its CSRF
/// cookie), the email given (`email:`, lower-cased), and the client address (`addr:`;
/// an IPv6 address counts by its /64, which one household or phone usually gets). The
/// address is what stops a bot that throws its cookies away; what it costs is that
/// shoppers behind one shared address (an office, a campus, a carrier's NAT) share one
/// allowance of a limited product.
///
/// Live holds of a product are counted together too (see [`crate::holds::cap`]): by the
/// identities that name one shopper (client, browser, email) against
/// `STOCKADE_HOLD_MAX_PER_SKU`, and by the address alone against the larger
/// `STOCKADE_HOLD_MAX_PER_SKU_PER_ADDRESS`, so a whole NAT is not capped as one shopper.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Shopper {
    ids: Vec<String>,
    /// An API client that stands for many shoppers (one without a rate limit: a load
    /// tool, a trusted backend): its holds are capped one by one, not counted together
    /// by client or address.
    many: bool,
}

impl Shopper {
    /// The API client with this id.
    pub fn client(mut self, id: &str) -> Self {
        self.ids.push(format!("client:{id}"));
        self
    }

    /// The API client stands for many shoppers (it has no rate limit).
    pub fn for_many(mut self) -> Self {
        self.many = true;
        self
    }

    /// The browser whose CSRF cookie is `token` (kept as a hash, not the token).
    pub fn browser(mut self, token: &str) -> Self {
        use sha2::Digest;
        let hash = hex::encode(&sha2::Sha256::digest(token.as_bytes())[..12]);
        self.ids.push(format!("browser:{hash}"));
        self
    }

    /// The client address (IPv6 by its /64).
    pub fn address(self, ip: std::net::IpAddr) -> Self {
        let ip = match ip {
            std::net::IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => std::net::IpAddr::V4(v4),
                None => {
                    let s = v6.segments();
                    let net = std::net::Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0);
                    return self.with(format!("addr:{net}/64"));
                }
            },
            v4 => v4,
        };
        self.with(format!("addr:{ip}"))
    }

    fn with(mut self, identity: String) -> Self {
        self.ids.push(identity);
        self
    }

    /// Every identity, the email's included.
    pub fn identities(&self) -> &[String] {
        &self.ids
    }

    /// The identities live holds are counted under: those that name one shopper, and
    /// the address, apart (a client that stands for many is counted by email alone).
    pub fn hold_identities(&self) -> (Vec<String>, Vec<String>) {
        let (addresses, persons): (Vec<String>, Vec<String>) = self
            .ids
            .iter()
            .cloned()
            .partition(|id| id.starts_with("addr:"));
        if self.many {
            let emails = persons.into_iter().filter(|id| id.starts_with("email:"));
            return (emails.collect(), Vec::new());
        }
        (persons, addresses)
    }
}

/// An order's or a hold's JSON body as read: each field of the right type, before the
/// shop's caps and the contact rules apply ([`OrderRequest::from_body`]).
#[derive(Debug)]
pub struct PlacementBody {
    lines: Vec<(Sku, i64)>,
    email: Option<String>,
    name: Option<String>,
    shipping_address: Option<AddressInput>,
}

impl PlacementBody {
    /// Reads the API body `{"lines": [{"sku", "quantity"}], "email"?, "name"?,
    /// "shipping_address"?}`, each field in its own words; the caps come after
    /// ([`OrderRequest::from_body`]).
    pub fn parse(body: &serde_json::Value) -> Result<Self, InvalidOrder> {
        let obj = body
            .as_object()
            .ok_or_else(|| InvalidOrder("the body must be a JSON object".into()))?;
        let raw_lines = obj
            .get("lines")
            .ok_or_else(|| InvalidOrder("\"lines\" is required".into()))?
            .as_array()
            .ok_or_else(|| InvalidOrder("\"lines\" must be an array".into()))?;
        let mut lines = Vec::with_capacity(raw_lines.len());
        for (i, line) in raw_lines.iter().enumerate() {
            let at = |msg: &str| InvalidOrder(format!("lines[{i}]: {msg}"));
            let sku = line
                .get("sku")
                .and_then(|s| s.as_str())
                .ok_or_else(|| at("\"sku\" must be a string"))?;
            let sku = Sku::parse(sku).map_err(|e| at(&e.to_string()))?;
            let quantity = line
                .get("quantity")
                .ok_or_else(|| at("\"quantity\" is required"))?;
            let n = quantity.as_i64().ok_or_else(|| match quantity.as_f64() {
                Some(f) if f.fract() == 0.0 => at(&format!(
                    "quantity must be written as a whole number, without a decimal point or \
                     exponent (got {quantity})"
                )),
                _ => at(&format!("quantity must be a whole number (got {quantity})")),
            })?;
            lines.push((sku, n));
        }
        let text = |field: &str| -> Result<Option<String>, InvalidOrder> {
            match obj.get(field) {
                None | Some(serde_json::Value::Null) => Ok(None),
                Some(serde_json::Value::String(s)) => Ok(Some(s.clone())),
                Some(_) => Err(InvalidOrder(format!("\"{field}\" must be a string"))),
            }
        };
        let address = match obj.get("shipping_address") {
            None | Some(serde_json::Value::Null) => None,
            Some(raw) if !raw.is_object() => {
                return Err(InvalidOrder(
                    "the shipping address must be a JSON object: \"name\", \"line1\", \
                     \"city\" and \"country\", and optionally \"line2\" and \"postal_code\""
                        .into(),
                ));
            }
            Some(raw) => Some(
                AddressInput::deserialize(raw)
                    .map_err(|e| InvalidOrder(format!("in shipping_address, {e}")))?,
            ),
        };
        Ok(Self {
            lines,
            email: text("email")?,
            name: text("name")?,
            shipping_address: address,
        })
    }
}

/// Most distinct products in one order.
pub const MAX_LINES: usize = 50;

impl OrderRequest {
    /// Builds a request from `(sku, quantity)` pairs, merging repeated SKUs.
    pub fn new(
        lines: Vec<(Sku, i64)>,
        email: Option<&str>,
        name: Option<&str>,
        address: Option<&AddressInput>,
        max_quantity: i32,
    ) -> Result<Self, InvalidOrder> {
        if lines.is_empty() {
            return Err(InvalidOrder("an order needs at least one line".into()));
        }
        let mut merged: std::collections::BTreeMap<Sku, i64> = Default::default();
        for (sku, n) in lines {
            Quantity::new(n, max_quantity).map_err(|e| InvalidOrder(format!("{sku}: {e}")))?;
            *merged.entry(sku).or_default() += n;
        }
        if merged.len() > MAX_LINES {
            return Err(InvalidOrder(format!(
                "an order may have at most {MAX_LINES} different products"
            )));
        }
        let lines = merged
            .into_iter()
            .map(|(sku, n)| {
                let quantity = Quantity::new(n, max_quantity)
                    .map_err(|e| InvalidOrder(format!("{sku}: {e}")))?;
                Ok(RequestLine { sku, quantity })
            })
            .collect::<Result<Vec<_>, InvalidOrder>>()?;
        Ok(Self {
            lines,
            ..Self::check_contact(email, name, address)?
        })
    }

    /// The request a placement's body asks for, under the shop's cap per line.
    pub fn from_body(body: PlacementBody, max_quantity: i32) -> Result<Self, InvalidOrder> {
        Self::new(
            body.lines,
            body.email.as_deref(),
            body.name.as_deref(),
            body.shipping_address.as_ref(),
            max_quantity,
        )
    }

    /// Checks contact details alone (for confirming a hold); the result has no lines.
    pub fn check_contact(
        email: Option<&str>,
        name: Option<&str>,
        address: Option<&AddressInput>,
    ) -> Result<Self, InvalidOrder> {
        let text = |field, value: Option<&str>| {
            value
                .map_or(Ok(()), |v| crate::text::single_line(field, v))
                .map_err(|e| InvalidOrder(e.to_string()))
        };
        text("email", email)?;
        text("name", name)?;
        let email = email.map(str::trim).filter(|e| !e.is_empty());
        if let Some(email) = email {
            validate_email(email)?;
        }
        let name = name.map(str::trim).filter(|n| !n.is_empty());
        if let Some(name) = name
            && name.chars().count() > 200
        {
            return Err(InvalidOrder("name must be at most 200 characters".into()));
        }
        let shipping_address = address
            .map(AddressInput::parse)
            .transpose()
            .map_err(|e| InvalidOrder(e.to_string()))?;
        Ok(Self {
            lines: Vec::new(),
            contact: Contact {
                email: email.map(str::to_string),
                name: name.map(str::to_string),
                shipping_address,
            },
            shopper: Shopper::default(),
        })
    }

    /// The request as placed by `shopper` (whose identities gain the email, if given).
    pub fn placed_by(mut self, shopper: Shopper) -> Self {
        self.shopper = match &self.contact.email {
            Some(email) => shopper.with(crate::orders::limits::email_identity(email)),
            None => shopper,
        };
        self
    }

    /// Who placed it.
    pub fn shopper(&self) -> &Shopper {
        &self.shopper
    }

    pub fn lines(&self) -> &[RequestLine] {
        &self.lines
    }

    pub fn skus(&self) -> Vec<Sku> {
        self.lines.iter().map(|l| l.sku.clone()).collect()
    }

    pub fn email(&self) -> Option<&str> {
        self.contact.email.as_deref()
    }

    pub fn name(&self) -> Option<&str> {
        self.contact.name.as_deref()
    }

    pub fn shipping_address(&self) -> Option<&ShippingAddress> {
        self.contact.shipping_address.as_ref()
    }

    /// The email, name and address given.
    pub fn contact(&self) -> &Contact {
        &self.contact
    }

    /// The hash under which an idempotency key remembers this request.
    pub fn fingerprint(&self) -> Fingerprint {
        Fingerprint::of(self)
    }
}

fn validate_email(email: &str) -> Result<(), InvalidOrder> {
    let bad = || InvalidOrder(format!("{email:?} does not look like an email address"));
    if email.len() > 254 || email.chars().any(char::is_whitespace) {
        return Err(bad());
    }
    let (local, domain) = email.split_once('@').ok_or_else(bad)?;
    if local.is_empty() || domain.contains('@') || !domain.contains('.') || domain.ends_with('.') {
        return Err(bad());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sku(s: &str) -> Sku {
        Sku::parse(s).unwrap()
    }

    #[test]
    fn quantities_are_whole_numbers_within_the_cap() {
        assert_eq!(Quantity::parse(" 3 ", 10).unwrap().get(), 3);
        for bad in ["0", "-1", "11", "1.5", "two", "", "99999999999999999999"] {
            assert!(Quantity::parse(bad, 10).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn lines_are_merged_per_sku_and_sorted() {
        let req = OrderRequest::new(
            vec![(sku("B-2"), 1), (sku("A-1"), 2), (sku("B-2"), 3)],
            None,
            None,
            None,
            10,
        )
        .unwrap();
        let lines: Vec<(&str, i32)> = req
            .lines()
            .iter()
            .map(|l| (l.sku.as_str(), l.quantity.get()))
            .collect();
        assert_eq!(lines, [("A-1", 2), ("B-2", 4)]);
        // Merged lines still respect the cap.
        assert!(
            OrderRequest::new(vec![(sku("A-1"), 6), (sku("A-1"), 6)], None, None, None, 10)
                .is_err()
        );
    }

    #[test]
    fn the_same_order_in_another_line_order_has_the_same_fingerprint() {
        let a = OrderRequest::new(vec![(sku("A-1"), 1), (sku("B-2"), 2)], None, None, None, 10)
            .unwrap();
        let b = OrderRequest::new(vec![(sku("B-2"), 2), (sku("A-1"), 1)], None, None, None, 10)
            .unwrap();
        let c = OrderRequest::new(vec![(sku("B-2"), 1), (sku("A-1"), 1)], None, None, None, 10)
            .unwrap();
        assert_eq!(a.fingerprint(), b.fingerprint());
        assert_ne!(a.fingerprint(), c.fingerprint());
    }

    #[test]
    fn json_bodies_are_checked_field_by_field() {
        let ok = serde_json::json!({"lines": [{"sku": "a-1", "quantity": 2}], "email": "a@b.co"});
        let req = OrderRequest::from_body(PlacementBody::parse(&ok).unwrap(), 10).unwrap();
        assert_eq!(req.lines()[0].sku.as_str(), "A-1");
        for (body, needle) in [
            (serde_json::json!([]), "JSON object"),
            (serde_json::json!({}), "\"lines\" is required"),
            (serde_json::json!({"lines": []}), "at least one line"),
            (
                serde_json::json!({"lines": [{"sku": 5, "quantity": 1}]}),
                "\"sku\" must be a string",
            ),
            (
                serde_json::json!({"lines": [{"sku": "A-1"}]}),
                "\"quantity\" is required",
            ),
            (
                serde_json::json!({"lines": [{"sku": "A-1", "quantity": 1.5}]}),
                "whole number",
            ),
            (
                serde_json::json!({"lines": [{"sku": "A-1", "quantity": "1"}]}),
                "whole number",
            ),
            (
                serde_json::json!({"lines": [{"sku": "A-1", "quantity": 0}]}),
                "at least 1",
            ),
            (
                serde_json::json!({"lines": [{"sku": "A-1", "quantity": 11}]}),
                "at most 10",
            ),
            (
                serde_json::json!({"lines": [{"sku": "no such", "quantity": 1}]}),
                "not a valid SKU",
            ),
            (
                serde_json::json!({"lines": [{"sku": "A-1", "quantity": 1}], "email": "nope"}),
                "email",
            ),
        ] {
            let err = PlacementBody::parse(&body)
                .and_then(|b| OrderRequest::from_body(b, 10))
                .unwrap_err();
            assert!(err.0.contains(needle), "{body}: {err}");
        }
    }
}
