//! The one application error. Handlers return `Result<_, AppError>` and use `?`; the status
//! mapping lives in [`AppError::status_code`], and the body (an HTML page or RFC 9457
//! problem+json, both carrying the request id) is rendered in one place,
//! [`crate::http::middleware`]. Server errors never show their cause to the client; it goes
//! to the log.

use actix_web::http::StatusCode;
use actix_web::http::header::{HeaderValue, RETRY_AFTER};
use actix_web::{HttpResponse, ResponseError};

/// Everything a request can fail with.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    /// 400: the request itself is malformed (a missing header, unreadable body).
    #[error("{0}")]
    BadRequest(String),
    /// 401: the API needs an admin session.
    #[error("{0}")]
    Unauthorized(String),
    /// 401 with `WWW-Authenticate: Bearer`: the API needs an API key (`invalid`: the one
    /// sent is unknown or revoked).
    #[error("{message}")]
    ApiKey { message: String, invalid: bool },
    /// 303 to the login page, for admin pages without a session.
    #[error("please log in")]
    LoginRequired { next: String },
    /// 403: refused (cross-site request, missing or wrong CSRF token).
    #[error("{0}")]
    Forbidden(String),
    /// 403: a hold or order of a drop's product without a valid pass; `details` names
    /// the drop's queue (`queue`, `drop_id`).
    #[error("{message}")]
    NeedsPass {
        message: String,
        details: serde_json::Value,
    },
    /// 429: too many attempts; retry after the given seconds.
    #[error("{message}")]
    TooManyRequests { message: String, retry_after: u64 },
    /// 402: the payment is missing, or the card was declined; `details` carries the
    /// provider's `decline_code` when it gave one.
    #[error("{message}")]
    PaymentRequired {
        message: String,
        details: Option<serde_json::Value>,
    },
    /// 404: nothing lives at this address.
    #[error("{0}")]
    NotFound(String),
    /// 405 with `Allow`: the address exists, but not for this method.
    #[error("{message}")]
    MethodNotAllowed { message: String, allow: String },
    /// 409: the request conflicts with the current state; retry later when `retry_after`.
    #[error("{message}")]
    Conflict {
        message: String,
        retry_after: Option<u64>,
        /// Extra problem+json members (e.g. which SKUs are short).
        details: Option<serde_json::Value>,
    },
    /// 408: the request body did not arrive in time; the connection is closed.
    #[error("{0}")]
    BodyTimeout(String),
    /// 413: the body is larger than allowed.
    #[error("{0}")]
    TooLarge(String),
    /// 415: the body is not in a format this endpoint reads.
    #[error("{0}")]
    UnsupportedMediaType(String),
    /// 422: well-formed but unacceptable values.
    #[error("{0}")]
    Unprocessable(String),
    /// 503: a dependency is down or busy; retry after the given seconds.
    #[error("{message}")]
    Unavailable { message: String, retry_after: u64 },
    /// 500 from the database; the cause is logged, never shown.
    #[error("database error")]
    Database(#[from] sqlx::Error),
    /// 500 for anything else unexpected.
    #[error("internal error")]
    Internal(#[from] anyhow::Error),
}

/// The shape of every API error body (`application/problem+json`, RFC 9457), as the API
/// contract ([`crate::http::openapi`]) describes it; the middleware renders it from the
/// error. Members may be added; these are always there.
#[derive(Debug, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
#[schema(as = Problem)]
pub struct ProblemDocument {
    /// Always `about:blank`: the status says what kind of problem it is.
    #[serde(rename = "type")]
    pub kind: String,
    /// A short title for the status (`Not found`, `Conflict`).
    pub title: String,
    /// The HTTP status, repeated.
    pub status: u16,
    /// What went wrong, in a sentence a person can act on.
    pub detail: String,
    /// The path the request was for.
    pub instance: String,
    /// The id of the request, as in the `X-Request-Id` header and the server's log.
    pub request_id: String,
    /// On 403 for a drop's product without a valid pass: the drop's queue, to join.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<String>,
    /// On 402 for a declined card: the provider's decline code (`card_declined`,
    /// `insufficient_funds`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decline_code: Option<String>,
    /// On 409 "Not enough stock": each SKU that is short, and what is left of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shortages: Option<Vec<crate::orders::Shortage>>,
}

impl AppError {
    pub fn not_found(what: impl Into<String>) -> Self {
        Self::NotFound(what.into())
    }

    /// 503 for a request cut off by its budget.
    pub fn over_budget() -> Self {
        Self::Unavailable {
            message: "This took too long and was stopped. Please try again in a moment; \
                      an order retried with the same Idempotency-Key is placed at most once."
                .into(),
            retry_after: 1,
        }
    }

    pub fn conflict(message: impl Into<String>) -> Self {
        Self::Conflict {
            message: message.into(),
            retry_after: None,
            details: None,
        }
    }

    /// A short title for the status, used as the problem `title` and the page heading.
    pub fn title(status: StatusCode) -> &'static str {
        match status.as_u16() {
            400 => "Bad request",
            401 => "Please log in",
            402 => "Payment required",
            403 => "Not allowed",
            404 => "Not found",
            405 => "Method not allowed",
            408 => "Request timeout",
            409 => "Conflict",
            413 => "Request too large",
            415 => "Unsupported content type",
            422 => "Cannot accept these values",
            429 => "Too many requests",
            503 => "Temporarily unavailable",
            s if s >= 500 => "Something went wrong",
            _ => "Request failed",
        }
    }

    /// The message a person may see; server errors say nothing internal.
    pub fn public_message(&self) -> String {
        match self {
            Self::Database(e) if is_transient(e) => crate::pg::transient_cause(e).into(),
            Self::Database(e) if is_check_violation(e) => {
                "Stock changed while this was being done, and the database refused it; \
                 nothing was changed. Please try again."
                    .into()
            }
            Self::Database(_) | Self::Internal(_) => {
                "Something went wrong on our side. Please try again; if it keeps happening, \
                 quote the request id below."
                    .into()
            }
            other => other.to_string(),
        }
    }

    pub fn details(&self) -> Option<&serde_json::Value> {
        match self {
            Self::Conflict { details, .. } => details.as_ref(),
            Self::NeedsPass { details, .. } => Some(details),
            Self::PaymentRequired { details, .. } => details.as_ref(),
            _ => None,
        }
    }
}

impl ResponseError for AppError {
    fn status_code(&self) -> StatusCode {
        match self {
            Self::BadRequest(_) => StatusCode::BAD_REQUEST,
            Self::Unauthorized(_) | Self::ApiKey { .. } => StatusCode::UNAUTHORIZED,
            Self::LoginRequired { .. } => StatusCode::SEE_OTHER,
            Self::Forbidden(_) | Self::NeedsPass { .. } => StatusCode::FORBIDDEN,
            Self::TooManyRequests { .. } => StatusCode::TOO_MANY_REQUESTS,
            Self::PaymentRequired { .. } => StatusCode::PAYMENT_REQUIRED,
            Self::NotFound(_) => StatusCode::NOT_FOUND,
            Self::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            Self::Conflict { .. } => StatusCode::CONFLICT,
            Self::BodyTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            Self::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            Self::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Self::Unprocessable(_) => StatusCode::UNPROCESSABLE_ENTITY,
            Self::Unavailable { .. } => StatusCode::SERVICE_UNAVAILABLE,
            Self::Database(e) if is_transient(e) => StatusCode::SERVICE_UNAVAILABLE,
            Self::Database(e) if is_check_violation(e) => StatusCode::CONFLICT,
            Self::Database(_) | Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The status and headers only; the middleware renders the body.
    fn error_response(&self) -> HttpResponse {
        let mut res = HttpResponse::new(self.status_code());
        if let Self::LoginRequired { next } = self {
            let location = format!("/admin/login?next={}", percent_encode(next));
            if let Ok(value) = HeaderValue::from_str(&location) {
                res.headers_mut()
                    .insert(actix_web::http::header::LOCATION, value);
            }
            return res;
        }
        if let Self::MethodNotAllowed { allow, .. } = self {
            if let Ok(value) = HeaderValue::from_str(allow) {
                res.headers_mut()
                    .insert(actix_web::http::header::ALLOW, value);
            }
            return res;
        }
        if let Self::ApiKey { invalid, .. } = self {
            let challenge = if *invalid {
                r#"Bearer error="invalid_token""#
            } else {
                "Bearer"
            };
            res.headers_mut().insert(
                actix_web::http::header::WWW_AUTHENTICATE,
                HeaderValue::from_static(challenge),
            );
            return res;
        }
        let retry_after = match self {
            Self::TooManyRequests { retry_after, .. } => Some(*retry_after),
            Self::Conflict { retry_after, .. } => *retry_after,
            Self::Unavailable { retry_after, .. } => Some(spread(*retry_after)),
            Self::Database(e) if is_transient(e) => Some(spread(1)),
            _ => None,
        };
        if let Some(secs) = retry_after {
            res.headers_mut()
                .insert(RETRY_AFTER, HeaderValue::from(secs.max(1)));
        }
        res
    }
}

/// `secs` plus a random 0–2 s, so clients shed together do not all return in the same
/// second.
fn spread(secs: u64) -> u64 {
    use rand::Rng;
    secs.max(1) + rand::rng().random_range(0..=2)
}

/// A CHECK constraint refused a write: the stock guard said no (only reachable through
/// the naive strategy's read-then-write, which can compute a stale value).
pub fn is_check_violation(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db) if db.code().as_deref() == Some("23514"))
}

/// Database failures that load or a passing fault causes (defined below the domain, which
/// asks the same question).
pub use crate::pg::is_transient;

impl From<crate::checkout::OrderError> for AppError {
    fn from(e: crate::checkout::OrderError) -> Self {
        use crate::checkout::OrderError as E;
        match e {
            E::UnknownSkus(_) | E::KeyReused | E::OverCap(_) => {
                Self::Unprocessable(sentence(&e.to_string()))
            }
            E::OverLimit(message) => Self::Conflict {
                message,
                retry_after: None,
                details: None,
            },
            E::InFlight => Self::Conflict {
                message: sentence(&e.to_string()),
                retry_after: Some(1),
                details: None,
            },
            E::Busy | E::TimedOut | E::Transient(_) => Self::Unavailable {
                message: sentence(&e.to_string()),
                retry_after: 1,
            },
            E::Database(e) => Self::Database(e),
        }
    }
}

impl From<crate::checkout::InvalidOrder> for AppError {
    fn from(e: crate::checkout::InvalidOrder) -> Self {
        Self::Unprocessable(sentence(&e.0))
    }
}

impl From<crate::inventory::change::Invalid> for AppError {
    fn from(e: crate::inventory::change::Invalid) -> Self {
        Self::Unprocessable(e.0)
    }
}

impl From<crate::text::InvalidText> for AppError {
    fn from(e: crate::text::InvalidText) -> Self {
        Self::Unprocessable(sentence(&e.to_string()))
    }
}

/// Messages made sentences (defined with the free-text rules, below the domain, which
/// words its messages the same way).
pub use crate::text::{capitalise, sentence};

impl From<crate::holds::HoldError> for AppError {
    fn from(e: crate::holds::HoldError) -> Self {
        use crate::holds::HoldError as E;
        match e {
            E::NotFound => Self::NotFound(sentence(&e.to_string())),
            E::Released | E::AlreadyConfirmed(_) => Self::conflict(sentence(&e.to_string())),
            E::OverLimit(message) => Self::conflict(message),
            E::TimedOut => Self::Unavailable {
                message: sentence(&e.to_string()),
                retry_after: 1,
            },
            E::Insufficient(ref shortages) => Self::Conflict {
                message: sentence(&e.to_string()),
                retry_after: None,
                details: Some(serde_json::json!({ "shortages": shortages })),
            },
            E::Database(e) => Self::Database(e),
        }
    }
}

/// Percent-encodes everything but unreserved characters (for a query value).
pub fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

impl From<crate::payments::flow::PayError> for AppError {
    fn from(e: crate::payments::flow::PayError) -> Self {
        use crate::holds::HoldState;
        use crate::payments::Status;
        use crate::payments::flow::PayError as E;
        let conflict = |message: &str| Self::conflict(message);
        match e {
            E::NotFound => Self::NotFound(
                "No such reservation: no hold with this id was placed by this caller.".into(),
            ),
            E::HoldOver(HoldState::Released) => conflict(
                "This reservation was cancelled, so it cannot be paid; nothing was charged.",
            ),
            E::HoldOver(HoldState::Confirmed) => conflict(
                "This reservation is already an order, placed without a payment step; nothing was charged.",
            ),
            E::HoldOver(_) => conflict(
                "This reservation has expired, so it cannot be paid; nothing was charged. \
                 Place a new hold.",
            ),
            E::Free => Self::Unprocessable(
                "This reservation costs nothing: confirm it without paying.".into(),
            ),
            E::Busy => Self::Conflict {
                message: "This payment is being processed; please wait a moment and try again."
                    .into(),
                retry_after: Some(1),
                details: None,
            },
            E::NoLease => Self::Unavailable {
                message: "Payments cannot be handled for a moment; nothing was charged by this \
                          request. Please try again shortly."
                    .into(),
                retry_after: 2,
            },
            E::Declined { code, message } => Self::PaymentRequired {
                message: format!(
                    "{} Nothing was charged, and the reservation is kept: pay again with \
                     another card.",
                    sentence(&message)
                ),
                details: Some(serde_json::json!({ "decline_code": code })),
            },
            E::BadMethod(message) => Self::Unprocessable(format!(
                "The payment provider would not take this payment method: {}",
                sentence(&message)
            )),
            E::NotPaid(payment) => {
                let missing = match payment.map(|p| (p.status, p.decline_message)) {
                    None => "no payment was started for it; pay with POST /api/v1/holds/{id}/payment".to_string(),
                    Some((Status::RequiresAction, _)) => {
                        "the card's bank asks the shopper to confirm the payment (3-D Secure) first"
                            .to_string()
                    }
                    Some((_, Some(declined))) => format!(
                        "the last card was declined ({}); pay again with another card",
                        declined.trim_end_matches('.')
                    ),
                    Some(_) => {
                        "no card has been accepted for it yet; pay with POST /api/v1/holds/{id}/payment"
                            .to_string()
                    }
                };
                Self::PaymentRequired {
                    message: format!("This reservation is not paid yet: {missing}."),
                    details: None,
                }
            }
            E::Cancelled => conflict(
                "The payment for this reservation was cancelled, and nothing was charged. \
                 Place a new hold to buy again.",
            ),
            E::Provider(e) => Self::Unavailable {
                message: format!(
                    "The payment provider did not answer as expected ({}). Nothing more is \
                     known yet; try again in a moment, and the same payment is used.",
                    match e {
                        crate::payments::CallError::Unanswered(why) => why,
                        other => other.to_string(),
                    }
                ),
                retry_after: 2,
            },
            E::Hold(e) => e.into(),
            E::Database(e) => Self::Database(e),
        }
    }
}
