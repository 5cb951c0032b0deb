//! The API's contract: an OpenAPI 3.1 document generated from the code and served at
//! `GET /api/v1/openapi.json`.
//!
//! Each operation is described by the `#[utoipa::path]` attribute on its handler (in
//! [`super::api`]): parameters, body, every status it answers and the headers that come
//! with them. The bodies are the types the handlers return (`ToSchema` derives on
//! [`crate::orders::Order`], [`crate::holds::Hold`] …); every error is the problem
//! document [`ProblemDocument`]. Each error response is defined once here with its status
//! ([`NotFound`], [`Conflict`] …), and the errors an operation answers are one group named
//! for its kind ([`PlaceErrors`], [`AdminStockErrors`] …), so an annotation lists its
//! success responses and one group: `responses((status = 201, …), PlaceErrors)`. A unit
//! test below checks that every `/api/` route of [`super::public_routes`] and
//! [`super::admin::routes`] is in the document and nothing else is, and that every error
//! an operation lists is declared; the integration test `openapi.rs` fuzzes the running
//! app against it with schemathesis. The admin API's handlers are annotated in
//! [`super::admin::api`].

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, OnceLock};

use actix_web::{HttpResponse, web};
use utoipa::openapi::header::HeaderBuilder;
use utoipa::openapi::response::{Response, ResponseBuilder};
use utoipa::openapi::security::{ApiKey, ApiKeyValue, Http, HttpAuthScheme, SecurityScheme};
use utoipa::openapi::{ContentBuilder, Ref, RefOr, Type};
use utoipa::{IntoResponses, Modify, OpenApi, ToResponse};

use super::AppState;
use super::admin::api as admin;
use super::api;
use crate::error::ProblemDocument;

pub mod inputs;

/// Name of the security scheme of API clients (`Authorization: Bearer sk_…`).
pub const API_KEY_SCHEME: &str = "api_key";

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Stockade API",
        description = "Products, orders and checkout holds. Errors are RFC 9457 problem \
            documents (`application/problem+json`). Orders and holds need an API client's key \
            (`Authorization: Bearer sk_…`) and an `Idempotency-Key`: a retried request with \
            the same key and body is answered from the first one and never orders twice. \
            A method an address does not take is answered 405 with `Allow`."
    ),
    paths(
        api::products::get_products,
        api::products::get_product,
        api::orders::post_orders,
        api::orders::get_order,
        api::holds::post_holds,
        api::holds::get_hold,
        api::holds::delete_hold,
        api::holds::post_hold_confirm,
        api::drops::get_drop,
        api::drops::post_queue,
        api::drops::get_queue_ticket,
        get_openapi_json,
        admin::get_dashboard_json,
        admin::patch_api_product,
        admin::post_api_restock,
        admin::post_api_adjust,
        admin::get_api_webhooks,
        admin::post_api_webhooks,
        admin::delete_api_webhook,
        admin::get_api_deliveries,
        admin::post_api_resend_delivery,
        admin::drops::get_api_drops,
        admin::drops::post_api_drops,
        admin::drops::get_api_drop,
        admin::drops::post_api_drop_change,
    ),
    components(
        schemas(
            ProblemDocument,
            inputs::SkuInput,
            inputs::Email,
            inputs::CustomerName,
            inputs::SearchWords,
            inputs::CategoryFilter,
            inputs::CategoryName,
            inputs::SortOrder,
            inputs::PageNumber,
            inputs::Reason,
            inputs::EndpointDescription,
            inputs::EventTypeName,
            inputs::DeliveryStatus,
            inputs::WebhookUrl,
            inputs::ProductSettingsPatch
        ),
        responses(
            BadRequest,
            Unauthorized,
            Forbidden,
            NotFound,
            RequestTimeout,
            Conflict,
            TooLarge,
            UnsupportedMediaType,
            Unprocessable,
            TooManyRequests,
            Unavailable
        )
    ),
    modifiers(&ApiKeyScheme),
    tags(
        (name = "products", description = "The catalogue: public, may lag a moment behind stock."),
        (name = "orders", description = "Placing and reading orders."),
        (name = "holds", description = "Checkout holds: stock reserved for a while, then \
            confirmed into an order or released."),
        (name = "drops", description = "A product released at a set time through a \
            waiting room: join its queue, poll the ticket, and send the pass given at your \
            turn as `Drop-Pass` with the hold or order."),
        (name = "admin", description = "The admin API: an admin's session cookie, and on \
            writes the session's `X-CSRF-Token`."),
        (name = "contract", description = "This document."),
    )
)]
pub struct ApiDoc;

/// Name of the admin's session scheme (the session cookie the admin login sets).
pub const ADMIN_SCHEME: &str = "admin_session";

/// Adds the bearer scheme API clients authenticate with, and the admin's session cookie.
struct ApiKeyScheme;

impl Modify for ApiKeyScheme {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        let mut http = Http::new(HttpAuthScheme::Bearer);
        http.bearer_format = Some("sk_…".into());
        http.description = Some(
            "An API client's key, made on the admin's API clients page or with \
             `stockade api-key`."
                .into(),
        );
        components.add_security_scheme(API_KEY_SCHEME, SecurityScheme::Http(http));
        let cookie = ApiKeyValue::with_description(
            crate::http::admin::SESSION_COOKIE,
            "The session cookie `POST /admin/login` sets (`__Host-` prefixed with \
             STOCKADE_SECURE_COOKIES).",
        );
        components
            .add_security_scheme(ADMIN_SCHEME, SecurityScheme::ApiKey(ApiKey::Cookie(cookie)));
    }
}

/// `(METHOD, path)` of every route of the API in the application's route table (what the
/// document must describe).
pub fn api_routes() -> Vec<(String, String)> {
    let mut routes: Vec<(String, String)> = super::public_routes()
        .into_iter()
        .chain(super::admin::routes())
        .filter(|(_, path, _)| super::is_api(path))
        .map(|(method, path, _)| (method.to_string(), path.to_string()))
        .collect();
    routes.sort();
    routes
}

/// `(METHOD, path)` of every operation in an OpenAPI document.
pub fn operations(doc: &serde_json::Value) -> Vec<(String, String)> {
    let mut ops = Vec::new();
    let paths = doc["paths"].as_object().into_iter().flatten();
    for (path, item) in paths {
        for method in item.as_object().into_iter().flatten().map(|(m, _)| m) {
            ops.push((method.to_uppercase(), path.clone()));
        }
    }
    ops.sort();
    ops
}

/// The settings the document depends on: the most units per line of an order, and per SKU
/// of a hold (`STOCKADE_MAX_LINE_QUANTITY`, `STOCKADE_HOLD_MAX_PER_SKU`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Limits {
    pub line_quantity: i32,
    pub hold_per_sku: i32,
}

impl Limits {
    pub fn of(settings: &crate::config::Settings) -> Self {
        Self {
            line_quantity: settings.max_line_quantity,
            hold_per_sku: settings.hold_max_per_sku,
        }
    }
}

/// The document for a server running with `limits`, as JSON.
///
/// What the annotations cannot say is set here: the quantity bounds come from the settings
/// (a hold's line is capped by both), and the confirmation's body is optional without
/// being nullable (utoipa would write `oneOf [ConfirmBody, null]` for an `Option`, and the
/// server refuses a `null` body).
pub fn document(limits: Limits) -> serde_json::Value {
    let mut doc = serde_json::to_value(ApiDoc::openapi()).expect("the OpenAPI document serialises");
    let schemas = &mut doc["components"]["schemas"];
    let hold = limits.line_quantity.min(limits.hold_per_sku);
    for (line, max) in [("LineBody", limits.line_quantity), ("HoldLineBody", hold)] {
        let quantity = &mut schemas[line]["properties"]["quantity"];
        assert!(quantity.is_object(), "{line} has a quantity");
        quantity["maximum"] = max.into();
    }
    let confirm = &mut doc["paths"]["/api/v1/holds/{id}/confirm"]["post"]["requestBody"];
    assert!(confirm.is_object(), "the confirmation takes a body");
    confirm["required"] = false.into();
    doc
}

/// The document for `limits`, serialised once per distinct limits (one, in a server).
pub fn document_json(limits: Limits) -> std::sync::Arc<str> {
    static DOCS: OnceLock<Mutex<HashMap<Limits, Arc<str>>>> = OnceLock::new();
    let mut docs = DOCS
        .get_or_init(Default::default)
        .lock()
        .expect("not poisoned");
    docs.entry(limits)
        .or_insert_with(|| {
            serde_json::to_string_pretty(&document(limits))
                .expect("the OpenAPI document serialises")
                .into()
        })
        .clone()
}

/// This API's OpenAPI 3.1 document, for the settings it runs with.
#[utoipa::path(
    get,
    path = "/api/v1/openapi.json",
    tag = "contract",
    responses(
        (status = 200, description = "The OpenAPI document.", body = Object,
            content_type = "application/json"),
        (status = 503, response = Unavailable),
    )
)]
pub async fn get_openapi_json(state: web::Data<AppState>) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("application/json")
        .body(document_json(Limits::of(&state.settings)).to_string())
}

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
    PlaceErrors: BadRequest, Unauthorized, Forbidden, RequestTimeout, Conflict, TooLarge,
        UnsupportedMediaType, Unprocessable, TooManyRequests, Unavailable
);
error_group!(
    /// Confirming a hold the client placed, with an optional body.
    ConfirmErrors: BadRequest, Unauthorized, Forbidden, NotFound, RequestTimeout, Conflict,
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The settings' defaults.
    const DEFAULTS: Limits = Limits {
        line_quantity: 10,
        hold_per_sku: 5,
    };

    #[test]
    fn every_api_route_is_documented_and_nothing_else() {
        let doc = document(DEFAULTS);
        let routes = api_routes();
        assert!(routes.len() >= 18, "{routes:?}");
        assert_eq!(operations(&doc), routes);
    }

    #[test]
    fn the_document_is_openapi_3_1_with_problem_errors_and_bearer_auth() {
        let doc = document(DEFAULTS);
        assert_eq!(doc["openapi"], "3.1.0");
        assert_eq!(
            doc["components"]["securitySchemes"][API_KEY_SCHEME]["scheme"],
            "bearer"
        );
        let post_orders = &doc["paths"]["/api/v1/orders"]["post"];
        let header = post_orders["parameters"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == "Idempotency-Key")
            .expect("POST /api/v1/orders takes an Idempotency-Key");
        assert_eq!(header["in"], "header");
        assert_eq!(header["required"], true);
        // Every error an operation lists (through its group) is a declared response.
        let declared = doc["components"]["responses"].as_object().unwrap();
        for (path, item) in doc["paths"].as_object().unwrap() {
            for (method, op) in item.as_object().unwrap() {
                for (status, response) in op["responses"].as_object().unwrap() {
                    let Some(name) = response["$ref"].as_str() else {
                        continue;
                    };
                    let name = name.trim_start_matches("#/components/responses/");
                    assert!(
                        declared.contains_key(name),
                        "{method} {path} answers {status} with {name}, which is not declared"
                    );
                }
            }
        }
        let problem = &doc["components"]["responses"]["NotFound"]["content"];
        assert_eq!(
            problem["application/problem+json"]["schema"]["$ref"],
            "#/components/schemas/Problem"
        );
    }
}
