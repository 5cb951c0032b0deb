//! The contract's building blocks, below every handler: the problem+json responses the API
//! answers with, grouped by kind of operation (each handler's `responses(...)` names one
//! group), and the inputs it accepts ([`inputs`]). The document itself is assembled above
//! the handlers, in [`super::openapi`].

use std::collections::BTreeMap;

use utoipa::openapi::header::HeaderBuilder;
use utoipa::openapi::response::{Response, ResponseBuilder};
use utoipa::openapi::{ContentBuilder, Ref, RefOr, Type};
use utoipa::{IntoResponses, ToResponse};

pub mod inputs;

/// A problem+json response, with the headers named (each a string or integer).
fn problem(description: &str, headers: &[(&str, Type, &str)]) -> RefOr<Response> {
    let content = ContentBuilder::new()
        .schema(Some(Ref::from_schema_name("Problem")))
        .build();
    let mut response = ResponseBuilder::new()
        .description(description)
        .content("application/problem+json", content);
    for (name, kind, about) in headers {
        let header = HeaderBuilder::new()
            .schema(Some(utoipa::openapi::schema::Object::with_type(
                kind.clone(),
            )))
            .description(Some(*about))
            .build();
        response = response.header(*name, header);
    }
    response.build().into()
}

const RETRY_AFTER: (&str, Type, &str) = (
    "Retry-After",
    Type::Integer,
    "Seconds to wait before trying again.",
);

/// Declares a reusable error response: `name`, its status, its description, its headers.
macro_rules! problem_response {
    ($name:ident, $status:literal, $description:literal $(, $header:expr)*) => {
        #[doc = $description]
        pub struct $name;

        impl $name {
            pub const STATUS: u16 = $status;
        }

        impl<'r> ToResponse<'r> for $name {
            fn response() -> (&'r str, RefOr<Response>) {
                (stringify!($name), problem($description, &[$($header),*]))
            }
        }
    };
}

problem_response!(
    BadRequest,
    400,
    "The request is malformed: a required header is missing or unreadable, the body is not \
     JSON or names a member twice, or a query parameter is unreadable or given twice."
);
problem_response!(
    Unauthorized,
    401,
    "No API key, or one that is unknown or revoked.",
    (
        "WWW-Authenticate",
        Type::String,
        "`Bearer`, or `Bearer error=\"invalid_token\"` for a key that is not valid."
    )
);
problem_response!(
    Forbidden,
    403,
    "Refused: the request came from another site (its `Origin` or `Sec-Fetch-Site`), or it \
     holds or orders a product sold in a drop without a valid `Drop-Pass` (`queue` names the \
     drop's queue)."
);
problem_response!(
    PaymentRequired,
    402,
    "Payment is needed first: the card was declined (`decline_code` says how; the hold is \
     kept, pay again with another card), the hold is not paid yet (the detail says what is \
     missing), or the shop takes payment and orders need a paid hold."
);
problem_response!(
    NotFound,
    404,
    "Nothing with this id or SKU, or it belongs to another API client."
);
problem_response!(
    RequestTimeout,
    408,
    "The body did not arrive in time; the connection is closed."
);
problem_response!(
    Conflict,
    409,
    "The request conflicts with the current state: not enough stock (`shortages` names each \
     short SKU), a purchase limit reached, the hold already released or confirmed, or the same \
     Idempotency-Key still in flight (then with `Retry-After`).",
    RETRY_AFTER
);
problem_response!(TooLarge, 413, "The body is larger than allowed.");
problem_response!(
    UnsupportedMediaType,
    415,
    "The body is not sent as `application/json`."
);
problem_response!(
    Unprocessable,
    422,
    "Well-formed, but the values cannot be accepted (say which and why), or the \
     Idempotency-Key was used before with another body."
);
problem_response!(
    TooManyRequests,
    429,
    "Past this caller's rate limit for orders and holds, or past the wrong API keys one \
     address may send (`STOCKADE_API_KEY_MAX_FAILURES`).",
    RETRY_AFTER
);
problem_response!(
    Unavailable,
    503,
    "Busy or a dependency is down; nothing was changed that a retry with the same \
     Idempotency-Key would repeat.",
    RETRY_AFTER
);

/// Declares a group of error responses (each one of the above, by reference) for one kind
/// of operation.
macro_rules! error_group {
    ($(#[$doc:meta])* $name:ident: $($response:ident),+ $(,)?) => {
        $(#[$doc])*
        pub struct $name;

        impl IntoResponses for $name {
            fn responses() -> BTreeMap<String, RefOr<Response>> {
                BTreeMap::from([$((
                    $response::STATUS.to_string(),
                    Ref::from_response_name(stringify!($response)).into(),
                )),+])
            }
        }
    };
}

// The public API's kinds of operation.
error_group!(
    /// Searching the catalogue: its query parameters may be refused.
    SearchErrors: BadRequest, Unprocessable, Unavailable
);
error_group!(
    /// Reading one public thing by its id or SKU.
    LookupErrors: NotFound, Unavailable
);
error_group!(
    /// Reading one thing the calling client placed.
    OwnLookupErrors: Unauthorized, NotFound, TooManyRequests, Unavailable
);
error_group!(
    /// Placing an order or a hold: a client, a key, a JSON body, stock, a rate limit.
    PlaceErrors: BadRequest, Unauthorized, PaymentRequired, Forbidden, RequestTimeout, Conflict,
        TooLarge, UnsupportedMediaType, Unprocessable, TooManyRequests, Unavailable
);
error_group!(
    /// Confirming a hold the client placed, with an optional body.
    ConfirmErrors: BadRequest, Unauthorized, PaymentRequired, Forbidden, NotFound,
        RequestTimeout, Conflict, TooLarge, UnsupportedMediaType, Unprocessable, TooManyRequests,
        Unavailable
);
error_group!(
    /// Paying for a hold the client placed: the provider may decline, or not answer.
    PayErrors: BadRequest, Unauthorized, PaymentRequired, NotFound, RequestTimeout, Conflict,
        TooLarge, UnsupportedMediaType, Unprocessable, TooManyRequests, Unavailable
);
error_group!(
    /// Joining a drop's queue or reading a ticket: a client, a drop that may be closed or
    /// not open yet, a limit per address, Redis.
    QueueErrors: BadRequest, Unauthorized, NotFound, Conflict, Unprocessable, TooManyRequests,
        Unavailable
);
error_group!(
    /// Releasing a hold the client placed.
    ReleaseErrors: Unauthorized, Forbidden, NotFound, Conflict, TooManyRequests, Unavailable
);
// The admin API's kinds of operation (an admin session; writes carry its CSRF token).
error_group!(
    /// Reading the admin's figures or lists.
    AdminReadErrors: Unauthorized, Unavailable
);
error_group!(
    /// Reading a list the query narrows (a filter that may be refused).
    AdminListErrors: BadRequest, Unauthorized, Unavailable
);
error_group!(
    /// Creating something from a JSON body.
    AdminCreateErrors: BadRequest, Unauthorized, Forbidden, TooLarge, UnsupportedMediaType,
        Unprocessable, Unavailable
);
error_group!(
    /// Changing a product's settings from a JSON body.
    AdminEditErrors: BadRequest, Unauthorized, Forbidden, NotFound, TooLarge,
        UnsupportedMediaType, Unprocessable, Unavailable
);
error_group!(
    /// A stock change once per `Idempotency-Key`: also 409 when stock moved or the key is
    /// in flight.
    AdminStockErrors: BadRequest, Unauthorized, Forbidden, NotFound, Conflict, TooLarge,
        UnsupportedMediaType, Unprocessable, Unavailable
);
error_group!(
    /// An action on one thing by its id, with no body.
    AdminActionErrors: Unauthorized, Forbidden, NotFound, Unavailable
);

/// The `Drop-Shopper` request header, as the contract describes it.
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Header)]
#[expect(
    dead_code,
    reason = "the contract's words for the header; `gate::identity` reads it"
)]
pub(crate) struct ShopperHeader {
    /// For a client without a rate limit acting for many buyers: the buyer this is for.
    #[param(
        rename = "Drop-Shopper",
        min_length = 1,
        max_length = 64,
        pattern = "^[A-Za-z0-9_-]{1,64}$"
    )]
    drop_shopper: Option<String>,
}

/// The `Drop-Pass` request header, as the contract describes it.
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Header)]
#[expect(
    dead_code,
    reason = "the contract's words for the header; the gate reads it"
)]
pub(crate) struct PassHeader {
    /// The pass a drop's queue gave this caller (or this `Drop-Shopper`) when it let them
    /// in: needed for a product in a drop, from a few seconds after the drop is scheduled
    /// until it ends. Ignored for other products.
    #[param(rename = "Drop-Pass")]
    drop_pass: Option<String>,
}
