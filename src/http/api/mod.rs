//! The JSON API under `/api/v1`, one file per resource: [`products`], [`orders`],
//! [`holds`]; placing an order or a hold shares one path ([`place`]). Errors are RFC 9457
//! problem documents (rendered by the middleware); the contract is served at
//! `/api/v1/openapi.json` ([`super::openapi`]).
//!
//! Products are public. Orders and holds belong to their caller ([`super::limits::caller`]):
//! its idempotency keys are its own (stored as `<owner>:<key>`), and it reads, confirms and
//! releases only what it placed; anything else is answered 404, as if it did not exist.

pub mod drops;
pub mod holds;
pub mod orders;
pub mod payment;
mod place;
pub mod products;

use actix_web::HttpRequest;

use crate::error::AppError;
use crate::idempotency::IdempotencyKey;

/// Header that marks a response replayed from an idempotency record.
pub const REPLAYED_HEADER: &str = "Idempotency-Replayed";
/// The `Idempotency-Key` request header, as the contract describes it.
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Header)]
#[expect(
    dead_code,
    reason = "the contract's words for the header; `IdempotencyKey::parse` reads it"
)]
pub(crate) struct IdempotencyKeyHeader {
    /// A unique value per order (printable ASCII, up to 255 characters); send the same value
    /// when retrying it. Scoped to the API client. (HTTP drops spaces around a header's
    /// value, so the pattern leaves them out: a key of spaces arrives empty.)
    #[param(
        rename = "Idempotency-Key",
        min_length = 1,
        max_length = 255,
        pattern = "^[\\x21-\\x7e](?:[\\x20-\\x7e]{0,253}[\\x21-\\x7e])?$",
        example = "order-2026-0001"
    )]
    idempotency_key: String,
}

/// The `Idempotency-Key` header, required on every POST that creates something.
pub fn idempotency_key(req: &HttpRequest) -> Result<IdempotencyKey, AppError> {
    let value = req.headers().get("Idempotency-Key").ok_or_else(|| {
        AppError::BadRequest(
            "The Idempotency-Key header is required: send a unique value per order, \
             and the same value when you retry it."
                .into(),
        )
    })?;
    let text = value.to_str().map_err(|_| {
        AppError::BadRequest(
            "The Idempotency-Key may contain only printable ASCII characters.".into(),
        )
    })?;
    IdempotencyKey::parse(text)
        .map_err(|e| AppError::BadRequest(crate::error::sentence(&e.to_string())))
}
