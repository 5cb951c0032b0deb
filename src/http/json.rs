//! Every JSON body the API takes is read here, by one rule:
//!
//! - a body that is not `application/json` (or `…+json`) is 415;
//! - one larger than [`JSON_LIMIT`] is 413;
//! - malformed JSON is 400, and so is an object naming a member twice at any depth
//!   (`{"lines": […], "lines": […]}`): parsers disagree on which one counts (serde keeps
//!   the last, others the first), so an ambiguous body is refused rather than guessed at;
//! - well-formed JSON that does not fit the request (not an object, a missing or mistyped
//!   field, a fraction where a whole number goes) is 422. A whole number is written as
//!   one: `1.0` and `1e0` are refused where a whole number goes, as they always were here.
//!   (JSON Schema counts them as integers and cannot say otherwise, so the API document
//!   says it in words.)
//!
//! Handlers take [`Json<T>`] instead of actix's `web::Json`, whose `serde_json::Value`
//! silently keeps the last of two members of one name.

use std::fmt;
use std::future::Future;
use std::pin::Pin;

use actix_web::dev::{JsonBody, Payload};
use actix_web::{FromRequest, HttpMessage, HttpRequest};
use serde::de::{self, DeserializeOwned, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

use crate::error::AppError;

/// JSON bodies above this size are refused with 413.
pub const JSON_LIMIT: usize = 64 * 1024;

/// A JSON body read by the rule above, as `T`.
#[derive(Debug)]
pub struct Json<T>(pub T);

impl<T> std::ops::Deref for Json<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T> Json<T> {
    pub fn into_inner(self) -> T {
        self.0
    }
}

impl<T: DeserializeOwned + 'static> FromRequest for Json<T> {
    type Error = AppError;
    type Future = Read<Self>;

    fn from_request(req: &HttpRequest, payload: &mut Payload) -> Self::Future {
        read(req, payload, |value| fit(value).map(Json))
    }
}

/// What each extractor here returns: the body, read and then judged.
pub type Read<T> = Pin<Box<dyn Future<Output = Result<T, AppError>>>>;

/// The body as one unambiguous JSON document, by the rule above (415, 413, 400), then as
/// `judge` makes it.
fn read<T: 'static>(
    req: &HttpRequest,
    payload: &mut Payload,
    judge: impl FnOnce(Value) -> Result<T, AppError> + 'static,
) -> Read<T> {
    let body = JsonBody::<Strict>::new(req, payload, None, true).limit(JSON_LIMIT);
    Box::pin(async move { judge(body.await.map_err(payload_error)?.0) })
}

/// A request body that checks itself on the way in, in its own words (see [`Body`]).
pub trait FromBody: Sized {
    /// The body as `Self`, or what does not fit, as the API answers it (422).
    fn from_body(value: Value) -> Result<Self, AppError>;
}

/// A JSON body read by the rule above, then checked by `T` itself: for a body whose
/// refusals say more than serde's (the shape it wants, or which member may not be sent).
#[derive(Debug)]
pub struct Body<T>(pub T);

impl<T: FromBody + 'static> FromRequest for Body<T> {
    type Error = AppError;
    type Future = Read<Self>;

    fn from_request(req: &HttpRequest, payload: &mut Payload) -> Self::Future {
        read(req, payload, |value| T::from_body(value).map(Body))
    }
}

/// A JSON body read by the rule above at once (400, 413, 415), and checked by `T` when the
/// handler asks ([`Checked::into_inner`]): after it has checked who is asking, so a caller
/// without a key hears 401 before anything about the body's fields.
#[derive(Debug)]
pub struct Checked<T>(Result<T, AppError>);

impl<T> Checked<T> {
    /// The body as `T`, or 422 in its words.
    pub fn into_inner(self) -> Result<T, AppError> {
        self.0
    }
}

impl<T: FromBody + 'static> FromRequest for Checked<T> {
    type Error = AppError;
    type Future = Read<Self>;

    fn from_request(req: &HttpRequest, payload: &mut Payload) -> Self::Future {
        read(req, payload, |value| Ok(Checked(T::from_body(value))))
    }
}

/// `value` as `T`, or 422 saying the body must be `shape`, with serde's reason in words.
pub fn shaped<T: DeserializeOwned>(value: Value, shape: &str) -> Result<T, AppError> {
    serde_json::from_value(value)
        .map_err(|e| AppError::Unprocessable(format!("The body must be {shape}: {}.", plain(&e))))
}

/// An optional body (`POST /api/v1/holds/{id}/confirm`): `None` when it is empty or only
/// whitespace; otherwise it must be JSON by the same rule as [`Json`].
pub fn optional<T: DeserializeOwned>(
    req: &HttpRequest,
    body: &[u8],
) -> Result<Option<T>, AppError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    let is_json = matches!(
        req.mime_type(),
        Ok(Some(mime)) if mime.subtype() == actix_web::mime::JSON || mime.suffix() == Some(actix_web::mime::JSON)
    );
    if !is_json {
        return Err(unsupported());
    }
    let Strict(value) = serde_json::from_slice(body).map_err(malformed)?;
    fit(value).map(Some)
}

/// `value` as `T`: an object whose fields fit, else 422. (Every body the API takes is an
/// object; serde alone would also take an array of a struct's field values.)
pub fn fit<T: DeserializeOwned>(value: Value) -> Result<T, AppError> {
    if !value.is_object() {
        return Err(AppError::Unprocessable(
            "The body must be a JSON object ({\"name\": value, …}).".into(),
        ));
    }
    T::deserialize(value).map_err(|e| {
        AppError::Unprocessable(format!(
            "The body does not fit this request: {}.",
            plain(&e)
        ))
    })
}

fn unsupported() -> AppError {
    AppError::UnsupportedMediaType(
        "Send the body as JSON with Content-Type: application/json.".into(),
    )
}

/// What reading a body as JSON failed with, as the API answers it.
pub fn payload_error(e: actix_web::error::JsonPayloadError) -> AppError {
    use actix_web::error::JsonPayloadError as E;
    match e {
        E::ContentType => unsupported(),
        E::Overflow { limit } | E::OverflowKnownLength { limit, .. } => {
            AppError::TooLarge(format!("The body is larger than {limit} bytes."))
        }
        E::Deserialize(e) => malformed(e),
        other => AppError::BadRequest(format!("The body could not be read: {other}.")),
    }
}

/// 400 for a body that is not one unambiguous JSON document.
fn malformed(e: serde_json::Error) -> AppError {
    let at = format!("line {}, column {}", e.line(), e.column());
    let message = plain(&e);
    match message.strip_prefix(DUPLICATE) {
        Some(name) => AppError::BadRequest(format!(
            "The body names {name} twice (at {at}); send each member once."
        )),
        None => AppError::BadRequest(format!("The body is not valid JSON: {message} (at {at}).")),
    }
}

/// How the visitor below says which member was repeated (the name follows, quoted).
const DUPLICATE: &str = "duplicate member ";

/// serde's message without its position, in words rather than Rust's types.
pub fn plain(e: &serde_json::Error) -> String {
    let message = e.to_string();
    let position = format!(" at line {} column {}", e.line(), e.column());
    let message = message.strip_suffix(&position).unwrap_or(&message);
    let mut message = message.replace('`', "\"");
    for (rust, words) in [
        ("floating point", "number with a decimal point or exponent"),
        ("expected i64", "expected a whole number"),
        ("expected i32", "expected a whole number"),
        ("expected u64", "expected a whole number"),
        ("expected u32", "expected a whole number"),
        ("expected a sequence", "expected a list"),
        ("expected a map", "expected an object"),
    ] {
        message = message.replace(rust, words);
    }
    message
}

/// A JSON value read with every object's member names checked to be distinct.
struct Strict(Value);

impl<'de> de::Deserialize<'de> for Strict {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(StrictVisitor).map(Strict)
    }
}

struct StrictVisitor;

impl<'de> Visitor<'de> for StrictVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        // JSON has no NaN or infinity, so every number read is finite.
        Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_string()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        de::Deserialize::deserialize(d).map(|Strict(v)| v)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(Strict(item)) = seq.next_element()? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut members = Map::new();
        while let Some(name) = map.next_key::<String>()? {
            if members.contains_key(&name) {
                let quoted = serde_json::to_string(&name).unwrap_or_default();
                return Err(de::Error::custom(format_args!("{DUPLICATE}{quoted}")));
            }
            let Strict(value) = map.next_value()?;
            members.insert(name, value);
        }
        Ok(Value::Object(members))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(body: &str) -> Result<Value, String> {
        serde_json::from_str::<Strict>(body)
            .map(|Strict(v)| v)
            .map_err(|e| malformed(e).to_string())
    }

    #[test]
    fn a_member_named_twice_is_refused_at_any_depth() {
        let twice = read(r#"{"lines":[{"sku":"NOPE!","quantity":0}],"lines":[]}"#).unwrap_err();
        assert!(
            twice.starts_with("The body names \"lines\" twice"),
            "{twice}"
        );
        let deep = read(r#"{"lines":[{"sku":"A-1","sku":"B-2","quantity":1}]}"#).unwrap_err();
        assert!(deep.starts_with("The body names \"sku\" twice"), "{deep}");
    }

    #[test]
    fn distinct_members_read_as_serde_json_reads_them() {
        let body = r#"{"a":[1,-2,3.5,true,null,"x"],"b":{"c":{}},"d":18446744073709551615}"#;
        assert_eq!(
            read(body).unwrap(),
            serde_json::from_str::<Value>(body).unwrap()
        );
    }

    #[test]
    fn a_number_written_with_a_decimal_point_or_exponent_stays_a_fraction() {
        let read = read(r#"{"a":[1,1.0,-2.0,1e2,1.5]}"#).unwrap();
        assert_eq!(read["a"][0].as_i64(), Some(1));
        for n in 1..5 {
            assert_eq!(read["a"][n].as_i64(), None, "{}", read["a"][n]);
            assert!(read["a"][n].is_f64());
        }
    }

    #[test]
    fn malformed_json_says_where_without_rust_words() {
        let bad = read(r#"{"lines": }"#).unwrap_err();
        assert!(bad.starts_with("The body is not valid JSON: "), "{bad}");
        assert!(bad.contains("line 1, column"), "{bad}");
    }

    #[test]
    fn a_missing_or_mistyped_field_is_named_in_words() {
        #[derive(Debug, serde::Deserialize)]
        #[allow(dead_code)]
        struct Restock {
            units: i64,
            reason: String,
        }
        let missing = fit::<Restock>(serde_json::json!({"units": 1})).unwrap_err();
        assert!(matches!(missing, AppError::Unprocessable(_)));
        assert_eq!(
            missing.to_string(),
            "The body does not fit this request: missing field \"reason\"."
        );
        let mistyped = fit::<Restock>(serde_json::json!({"units": "1", "reason": "x"}));
        let mistyped = mistyped.unwrap_err().to_string();
        assert!(mistyped.contains("expected a whole number"), "{mistyped}");
        let array = fit::<Restock>(serde_json::json!([1, "x"])).unwrap_err();
        assert!(matches!(array, AppError::Unprocessable(_)), "{array}");
    }
}
