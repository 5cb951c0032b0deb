//! What the server accepts, as schemas: each input the API reads (a SKU, an email, a search,
//! a reason …) is one named component here, built from the server's own constants and with
//! a pattern that says exactly what its parser takes, so a client (or a fuzzer) that follows
//! the document is never refused on the format, and one that strays is.
//!
//! The parsers trim before they check (Rust's `str::trim`, Unicode White_Space); some refuse
//! control characters (Unicode `Cc`) before trimming ([`crate::text::single_line`] on the
//! raw value: a name, an email, a reason), others after (a search, a category, a webhook's
//! description). The patterns spell these classes out character by character rather than
//! with `\s` or `\p{Cc}`: `\s` differs between ECMAScript, Python and Rust, and `\p{…}` is
//! not in Python's `re` (which schemathesis generates from). The unit tests below check each
//! pattern against the parser it describes.

use utoipa::openapi::schema::{AdditionalProperties, ObjectBuilder, SchemaType};
use utoipa::openapi::{RefOr, Schema, Type};

use crate::catalog::browse::{MAX_CATEGORY_CHARS, MAX_QUERY_CHARS, Sort};
use crate::events::EventType;

/// The format characters (Unicode 15 `Cf`: soft hyphen, bidi controls, zero-width
/// spaces and joiners, the BOM, tags …), as a character class body. The single-line
/// fields refuse them ([`crate::text::single_line`]), but for a joiner between two
/// letters of a script that needs one, which the document leaves out: it asks for a
/// little less than the server takes, never more.
macro_rules! format_chars {
    () => {
        "\\xad\\u0600-\\u0605\\u061c\\u06dd\\u070f\\u0890\\u0891\\u08e2\\u180e\\u200b-\\u200f\\u202a-\\u202e\\u2060-\\u2064\\u2066-\\u206f\\ufeff\\ufff9-\\ufffb\\U000110bd\\U000110cd\\U00013430-\\U0001343f\\U0001bca0-\\U0001bca3\\U0001d173-\\U0001d17a\\U000e0001\\U000e0020-\\U000e007f"
    };
}

/// What `str::trim` removes (Unicode White_Space), control characters among them.
const TRIMMED: &str =
    "\\t\\n\\x0b\\x0c\\r \\x85\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000";
/// White_Space that is not a control character: what may pad text refused for any `Cc`.
const BLANK: &str = " \\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000";
/// Neither a control character (`Cc`: C0, DEL, C1), nor White_Space, nor a format
/// character (`Cf`, see `format_chars!`).
const VISIBLE: &str = concat!(
    "[^\\x00-\\x20\\x7f-\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000",
    format_chars!(),
    "]"
);
/// Anything but a control or a format character.
const NOT_CONTROL: &str = concat!("[^\\x00-\\x1f\\x7f-\\x9f", format_chars!(), "]");

/// One line of `min` (0 or 1) to `max` characters once trimmed of `pad`, with no control
/// character inside.
fn line(pad: &str, min: usize, max: usize) -> String {
    let text = format!("{VISIBLE}(?:{NOT_CONTROL}{{0,{}}}{VISIBLE})?", max - 2);
    let text = match min {
        0 => format!("(?:{text})?"),
        _ => text,
    };
    format!("^[{pad}]*{text}[{pad}]*$")
}

/// A text trimmed first, then refused for control characters (a search, a category).
pub(crate) fn trimmed_line(min: usize, max: usize) -> String {
    line(TRIMMED, min, max)
}

/// A text refused for any control character, then trimmed (a name, a reason).
pub(crate) fn plain_line(min: usize, max: usize) -> String {
    line(BLANK, min, max)
}

/// One of `words` (or none, when `optional`), trimmed.
pub(crate) fn one_of(words: impl IntoIterator<Item = &'static str>, optional: bool) -> String {
    words_padded(words, optional, TRIMMED)
}

/// One of `words`, refused for any control character, then trimmed (a country code).
pub(crate) fn plain_one_of(words: impl IntoIterator<Item = &'static str>) -> String {
    words_padded(words, false, BLANK)
}

fn words_padded(
    words: impl IntoIterator<Item = &'static str>,
    optional: bool,
    pad: &str,
) -> String {
    let words: Vec<String> = words.into_iter().map(|w| w.replace('.', "\\.")).collect();
    let maybe = if optional { "?" } else { "" };
    format!("^[{pad}]*(?:{}){maybe}[{pad}]*$", words.join("|"))
}

/// A string with `pattern`, described.
fn string(pattern: String, description: &str) -> ObjectBuilder {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .pattern(Some(pattern))
        .description(Some(description))
}

/// Declares a component schema `name` built by `schema`.
macro_rules! input {
    ($(#[doc = $doc:literal])* $name:ident => $schema:expr) => {
        $(#[doc = $doc])*
        pub struct $name;

        impl utoipa::PartialSchema for $name {
            fn schema() -> RefOr<Schema> {
                $schema.into()
            }
        }

        impl utoipa::ToSchema for $name {}
    };
}

/// [`crate::catalog::Sku::parse`]: 2–32 of `A–Z` (any case), `0–9`, `-`, not first.
pub fn sku_pattern() -> String {
    format!("^[{TRIMMED}]*[A-Za-z0-9][A-Za-z0-9-]{{1,31}}[{TRIMMED}]*$")
}

/// `validate_email` (checkout): no control character; trimmed, empty or `local@domain`,
/// no white space, the domain with a dot and not ending in one.
pub fn email_pattern() -> String {
    let part = concat!(
        "[^\\x00-\\x20\\x7f-\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000@",
        format_chars!(),
        "]"
    );
    let last = concat!(
        "[^\\x00-\\x20\\x7f-\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000@.",
        format_chars!(),
        "]"
    );
    format!("^[{BLANK}]*(?:{part}+@{part}*\\.{part}*{last})?[{BLANK}]*$")
}

/// `whole_number` and [`crate::catalog::browse::MAX_PAGE`]: up to 18 ASCII digits whose
/// value is 1 to 10000 (leading zeros count toward the 18), or nothing.
pub fn page_pattern() -> String {
    let page =
        "0{0,17}[1-9]|0{0,16}[1-9][0-9]|0{0,15}[1-9][0-9]{2}|0{0,14}[1-9][0-9]{3}|0{0,13}10000";
    format!("^[{TRIMMED}]*(?:{page})?[{TRIMMED}]*$")
}

input!(
    /// A SKU as a request sends it.
    SkuInput => string(sku_pattern(), "A SKU: 2 to 32 letters (any case), digits or dashes, \
        not starting with a dash; surrounding white space is ignored.")
        .examples(["KB-ALPINE-75"])
);
input!(
    /// An email address for the receipt.
    Email => string(email_pattern(), "Where the receipt goes: `local@domain.tld`, at most 254 \
        bytes, no control characters or inner white space; empty (or only white space) means \
        none.")
        .max_length(Some(254))
        .examples(["ada@example.com"])
);
input!(
    /// A customer's name.
    CustomerName => string(plain_line(0, 200), "The customer's name: one line (no control \
        characters), at most 200 characters once trimmed; empty means none.")
);
input!(
    /// The words of a catalogue search.
    SearchWords => string(trimmed_line(0, MAX_QUERY_CHARS), "Search words (name and \
        description, prefix match): one line, at most 100 characters once trimmed.")
);
input!(
    /// A category filter: empty is no filter.
    CategoryFilter => string(trimmed_line(0, MAX_CATEGORY_CHARS), "Only this category (as the \
        admin named it): one line, at most 40 characters once trimmed; empty is every one.")
);
input!(
    /// A category as the admin sets it, or `null` for none.
    CategoryName => string(plain_line(1, MAX_CATEGORY_CHARS), "The shelf: one line of 1 to \
        40 characters once trimmed, or `null` for none.")
        .schema_type(SchemaType::from_iter([Type::String, Type::Null]))
);
input!(
    /// A catalogue order.
    SortOrder => string(one_of(Sort::ALL.map(Sort::as_str), true), "`relevance` (the \
        default), `name`, `price-low`, `price-high` or `newest`.")
);
input!(
    /// A page of the catalogue.
    PageNumber => string(page_pattern(), "Pages of 100, from 1 to 10000 (digits only); \
        without it (or empty), every match.")
);
input!(
    /// Why stock changed, for the ledger.
    Reason => string(plain_line(1, 500), "Why (it goes into the ledger): one line (no control \
        characters), 1 to 500 characters once trimmed.")
);
input!(
    /// What a webhook endpoint is for.
    EndpointDescription => string(trimmed_line(0, 200), "One line, at most 200 characters \
        once trimmed.")
);
input!(
    /// An event type a webhook endpoint receives.
    EventTypeName => string(one_of(EventType::ALL.map(|t| t.as_str()), false), "An event \
        type.")
);
input!(
    /// A webhook delivery's status, to filter by.
    DeliveryStatus => string(one_of(["pending", "sent", "failed"], true), "Only `pending`, \
        `sent` or `failed` ones; empty is all.")
);
input!(
    /// Where a webhook endpoint's deliveries go.
    WebhookUrl => ObjectBuilder::new()
        .schema_type(Type::String)
        .format(Some(utoipa::openapi::SchemaFormat::Custom("uri".into())))
        .max_length(Some(2000))
        .description(Some("An `http` or `https` URL with a host, without a user name or \
            password, whose host resolves only to public addresses (unless \
            STOCKADE_WEBHOOK_ALLOW_PRIVATE)."))
);
input!(
    /// `PATCH /api/v1/admin/products/{sku}`: what may change, at least one of them.
    ProductSettingsPatch => ObjectBuilder::new()
        .property(
            "purchase_limit",
            ObjectBuilder::new()
                .schema_type(SchemaType::from_iter([Type::Integer, Type::Null]))
                .minimum(Some(1))
                .maximum(Some(1_000_000))
                .description(Some("At most this many per customer; `null` removes the limit.")),
        )
        .property("category", utoipa::openapi::Ref::from_schema_name("CategoryName"))
        .min_properties(Some(1))
        .additional_properties(Some(AdditionalProperties::<Schema>::FreeForm(false)))
);
input!(
    /// Where an order is shipped.
    ShippingAddressInput => {
        use crate::address::{MAX_CITY, MAX_LINE, MAX_POSTAL_CODE};
        let text = |min, max, what: &str| string(plain_line(min, max), what);
        let maybe = |min, max, what: &str| {
            text(min, max, what).schema_type(SchemaType::from_iter([Type::String, Type::Null]))
        };
        let countries = crate::address::countries::COUNTRIES.iter().map(|(code, _)| *code);
        ObjectBuilder::new()
            .property("name", text(1, MAX_LINE, "Who receives it: one line, at most 200 \
                characters once trimmed."))
            .property("line1", text(1, MAX_LINE, "Street and number: one line, at most 200 \
                characters once trimmed."))
            .property("line2", maybe(0, MAX_LINE, "Flat, floor, company: optional, at most \
                200 characters once trimmed."))
            .property("city", text(1, MAX_CITY, "One line, at most 100 characters once \
                trimmed."))
            .property("postal_code", maybe(0, MAX_POSTAL_CODE, "Optional (not every country \
                has them), at most 20 characters once trimmed."))
            .property("country", string(plain_one_of(countries), "ISO 3166-1 alpha-2, in \
                capitals: `DE`, `US`, `GB` …"))
            .required("name")
            .required("line1")
            .required("city")
            .required("country")
            .additional_properties(Some(AdditionalProperties::<Schema>::FreeForm(false)))
            .examples([serde_json::json!({
                "name": "Ada Lovelace", "line1": "12 St James's Square",
                "city": "London", "postal_code": "SW1Y 4JH", "country": "GB"
            })])
    }
);
#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// `pattern` says yes exactly when `parser` does, for each sample.
    pub(crate) fn agrees(pattern: &str, parser: impl Fn(&str) -> bool, samples: &[&str]) {
        let re = regex::Regex::new(pattern).unwrap();
        for s in samples {
            assert_eq!(
                re.is_match(s),
                parser(s),
                "{pattern} and the parser differ on {s:?}"
            );
        }
    }

    pub(crate) const TEXTS: &[&str] = &[
        "",
        " ",
        "a",
        " a ",
        "\ta\n",
        "a\tb",
        "a\u{0}",
        "\u{85}x",
        "x\u{85}y",
        "\u{a0}x\u{a0}",
        "\u{3000}",
        "é",
        "a b",
        "\u{1b}[0m",
        "\u{9f}",
        "\u{200b}x",
    ];

    #[test]
    fn the_sku_pattern_is_sku_parse() {
        let long = "A".repeat(32);
        let longer = "A".repeat(33);
        agrees(
            &sku_pattern(),
            |s| crate::catalog::Sku::parse(s).is_ok(),
            &[
                "KB-ALPINE-75",
                "kb-alpine-75",
                " A1 ",
                "\tA1\n",
                "A",
                "-A1",
                "A-",
                "A_1",
                "Ä1",
                "A 1",
                &long,
                &longer,
                "\u{3000}AB",
                "\u{85}AB",
            ],
        );
    }

    #[test]
    fn the_email_pattern_is_the_checkout_rule() {
        agrees(
            &email_pattern(),
            |s| crate::checkout::OrderRequest::check_contact(Some(s), None, None).is_ok(),
            &[
                "ada@example.com",
                " ada@example.com ",
                "",
                " ",
                "ada",
                "@b.c",
                "a@b",
                "a@b.",
                "a@.b",
                "a@b@c.d",
                "a b@c.d",
                "a@b.c\t",
                "\ta@b.c",
                "é@ü.de",
                "a\u{a0}b@c.d",
                "a@b\u{0}.c",
                "a.@b.c",
                "a@b.c.",
            ],
        );
        agrees(
            &email_pattern(),
            |s| crate::checkout::OrderRequest::check_contact(Some(s), None, None).is_ok(),
            TEXTS,
        );
    }

    #[test]
    fn the_text_patterns_are_their_parsers() {
        let long = |n| "x".repeat(n);
        let mut samples: Vec<String> = TEXTS.iter().map(|s| s.to_string()).collect();
        for n in [39, 40, 41, 99, 100, 101, 199, 200, 201, 499, 500, 501] {
            samples.push(long(n));
            samples.push(format!("  {}\t", long(n)));
        }
        let samples: Vec<&str> = samples.iter().map(String::as_str).collect();
        let browse = |q: Option<&str>, c: Option<&str>| {
            crate::catalog::browse::Browse::parse(q, c, None, None).is_ok()
        };
        agrees(
            &trimmed_line(0, MAX_QUERY_CHARS),
            |s| browse(Some(s), None),
            &samples,
        );
        agrees(
            &trimmed_line(0, MAX_CATEGORY_CHARS),
            |s| browse(None, Some(s)),
            &samples,
        );
        agrees(
            &plain_line(1, MAX_CATEGORY_CHARS),
            |s| crate::catalog::browse::parse_category(s).is_ok(),
            &samples,
        );
        agrees(
            &plain_line(0, 200),
            |s| crate::checkout::OrderRequest::check_contact(None, Some(s), None).is_ok(),
            &samples,
        );
    }

    #[test]
    fn the_address_patterns_are_the_address_rules() {
        use crate::address::AddressInput;
        let long = |n| "x".repeat(n);
        let mut samples: Vec<String> = TEXTS.iter().map(|s| s.to_string()).collect();
        for n in [1, 2, 19, 20, 21, 99, 100, 101, 199, 200, 201] {
            samples.push(long(n));
            samples.push(format!("  {}\t", long(n)));
        }
        samples
            .extend(["DE", "de", " GB ", "GB\n", "\u{2028}GB", "XX", "GBR", ""].map(String::from));
        let samples: Vec<&str> = samples.iter().map(String::as_str).collect();
        let valid = || AddressInput {
            name: Some("Ada".into()),
            line1: Some("1 Road".into()),
            line2: None,
            city: Some("Town".into()),
            postal_code: None,
            country: Some("GB".into()),
        };
        let with = |change: fn(&mut AddressInput, String), s: &str| {
            let mut a = valid();
            change(&mut a, s.to_string());
            a.parse().is_ok()
        };
        agrees(
            &plain_line(1, 200),
            |s| with(|a, s| a.name = Some(s), s),
            &samples,
        );
        agrees(
            &plain_line(1, 200),
            |s| with(|a, s| a.line1 = Some(s), s),
            &samples,
        );
        agrees(
            &plain_line(0, 200),
            |s| with(|a, s| a.line2 = Some(s), s),
            &samples,
        );
        agrees(
            &plain_line(1, 100),
            |s| with(|a, s| a.city = Some(s), s),
            &samples,
        );
        agrees(
            &plain_line(0, 20),
            |s| with(|a, s| a.postal_code = Some(s), s),
            &samples,
        );
        let countries = crate::address::countries::COUNTRIES.iter().map(|(c, _)| *c);
        agrees(
            &plain_one_of(countries),
            |s| with(|a, s| a.country = Some(s), s),
            &samples,
        );
    }

    #[test]
    fn the_page_and_sort_patterns_are_browse_parse() {
        let page =
            |p: &str| crate::catalog::browse::Browse::parse(None, None, None, Some(p)).is_ok();
        agrees(
            &page_pattern(),
            page,
            &[
                "",
                " ",
                "1",
                " 7 ",
                "0",
                "00",
                "01",
                "10000",
                "10001",
                "9999",
                "000000000000000001",
                "0000000000000000001",
                "00000000000010000",
                "0000000000000010000",
                "+1",
                "1.0",
                "-1",
                "1e3",
                "\t42\n",
                "١",
            ],
        );
        let sort =
            |s: &str| crate::catalog::browse::Browse::parse(None, None, Some(s), None).is_ok();
        agrees(
            &one_of(Sort::ALL.map(Sort::as_str), true),
            sort,
            &[
                "",
                " ",
                "name",
                " newest\t",
                "Name",
                "price",
                "price-lowx",
                "relevance",
            ],
        );
        let event = |s: &str| EventType::parse(s).is_some();
        let pattern = one_of(EventType::ALL.map(|t| t.as_str()), false);
        agrees(
            &pattern,
            event,
            &[
                "",
                "order.placed",
                " order.placed ",
                "orderxplaced",
                "order",
            ],
        );
    }
}
