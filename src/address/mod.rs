//! Where an order is shipped: a name, two lines, a city, a postal code and a country (an
//! ISO 3166-1 code). Typed as the client typed it ([`AddressInput`]), then checked field by
//! field, each refusal naming its field.

pub mod countries;

use serde::{Deserialize, Serialize};

/// Longest name and address line; city; postal code (characters, once trimmed).
pub const MAX_LINE: usize = 200;
pub const MAX_CITY: usize = 100;
pub const MAX_POSTAL_CODE: usize = 20;

/// A checked shipping address, as an order stores and shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ShippingAddress {
    pub name: String,
    pub line1: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub line2: Option<String>,
    pub city: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub postal_code: Option<String>,
    /// ISO 3166-1 alpha-2, upper case (`DE`).
    pub country: String,
}

impl ShippingAddress {
    /// The country's name, as the checkout's list shows it.
    pub fn country_name(&self) -> &'static str {
        countries::name(&self.country).unwrap_or("")
    }

    /// The address as lines to print on a label: name; line 1; line 2; postal code and
    /// city; country.
    pub fn label(&self) -> Vec<String> {
        let town = match &self.postal_code {
            Some(code) => format!("{code} {}", self.city),
            None => self.city.clone(),
        };
        [
            Some(self.name.clone()),
            Some(self.line1.clone()),
            self.line2.clone(),
        ]
        .into_iter()
        .flatten()
        .chain([town, self.country_name().to_string()])
        .collect()
    }
}

/// An address as typed, every field as it came (a form's, or the API's JSON).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AddressInput {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub line1: Option<String>,
    #[serde(default)]
    pub line2: Option<String>,
    #[serde(default)]
    pub city: Option<String>,
    #[serde(default)]
    pub postal_code: Option<String>,
    #[serde(default)]
    pub country: Option<String>,
}

/// A field of an address that was refused, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("in shipping_address, {field} {message}")]
pub struct InvalidAddress {
    /// `name`, `line1`, `line2`, `city`, `postal_code` or `country`.
    pub field: &'static str,
    pub message: String,
}

impl AddressInput {
    /// Checks every field; the first refused names itself.
    pub fn parse(&self) -> Result<ShippingAddress, InvalidAddress> {
        let name = required("name", &self.name, MAX_LINE)?;
        let line1 = required("line1", &self.line1, MAX_LINE)?;
        let line2 = optional("line2", &self.line2, MAX_LINE)?;
        let city = required("city", &self.city, MAX_CITY)?;
        let postal_code = optional("postal_code", &self.postal_code, MAX_POSTAL_CODE)?;
        let country = required("country", &self.country, 2)?;
        if countries::name(&country).is_none() {
            return Err(InvalidAddress {
                field: "country",
                message: format!(
                    "must be a country code (two capital letters from ISO 3166-1, like \"DE\" \
                     or \"US\"): {country:?} is not one"
                ),
            });
        }
        Ok(ShippingAddress {
            name,
            line1,
            line2,
            city,
            postal_code,
            country,
        })
    }
}

/// One line of at most `max` characters once trimmed; `None` when empty.
fn optional(
    field: &'static str,
    value: &Option<String>,
    max: usize,
) -> Result<Option<String>, InvalidAddress> {
    let Some(value) = value else {
        return Ok(None);
    };
    crate::text::single_line(field, value).map_err(|e| InvalidAddress {
        field,
        message: e.to_string().replacen(&format!("{field} "), "", 1),
    })?;
    let value = value.trim();
    if value.chars().count() > max {
        return Err(InvalidAddress {
            field,
            message: format!("must be at most {max} characters"),
        });
    }
    Ok(Some(value.to_string()).filter(|v| !v.is_empty()))
}

/// As [`optional`], and not empty.
fn required(
    field: &'static str,
    value: &Option<String>,
    max: usize,
) -> Result<String, InvalidAddress> {
    optional(field, value, max)?.ok_or(InvalidAddress {
        field,
        message: "is required".into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(country: &str) -> AddressInput {
        AddressInput {
            name: Some(" Ada Lovelace ".into()),
            line1: Some("12 St James's Square".into()),
            line2: Some("".into()),
            city: Some("London".into()),
            postal_code: Some("SW1Y 4JH".into()),
            country: Some(country.into()),
        }
    }

    #[test]
    fn an_address_is_trimmed_and_its_empty_fields_are_none() {
        let address = input("GB").parse().unwrap();
        assert_eq!(address.name, "Ada Lovelace");
        assert_eq!(address.line2, None);
        assert_eq!(address.country_name(), "United Kingdom");
        assert_eq!(
            address.label(),
            [
                "Ada Lovelace",
                "12 St James's Square",
                "SW1Y 4JH London",
                "United Kingdom"
            ]
        );
    }

    #[test]
    fn each_refusal_names_its_field() {
        let refused = |a: AddressInput| a.parse().unwrap_err().to_string();
        assert!(refused(input("XX")).starts_with("in shipping_address, country must be a"));
        assert!(refused(input("gb")).ends_with("\"gb\" is not one"));
        let mut a = input("GB");
        a.city = Some("  ".into());
        assert_eq!(refused(a), "in shipping_address, city is required");
        let mut a = input("GB");
        a.line1 = Some("x".repeat(201));
        assert_eq!(
            refused(a),
            "in shipping_address, line1 must be at most 200 characters"
        );
        let mut a = input("GB");
        a.name = Some("Ada\u{0}".into());
        assert!(refused(a).starts_with("in shipping_address, name must not contain control"));
    }
}
