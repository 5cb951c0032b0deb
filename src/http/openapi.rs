//! The API's contract: an OpenAPI 3.1 document generated from the code and served at
//! `GET /api/v1/openapi.json`.
//!
//! Each operation is described by the `#[utoipa::path]` attribute on its handler (in
//! [`super::api`]): parameters, body, every status it answers and the headers that come
//! with them. The bodies are the types the handlers return (`ToSchema` derives on
//! [`crate::orders::Order`], [`crate::holds::Hold`] …); every error is the problem
//! document [`ProblemDocument`]. The error responses shared by many operations are defined
//! once here ([`NotFound`], [`Conflict`] …). A unit test below checks that every `/api/`
//! route of [`super::public_routes`] and [`super::admin::routes`] is in the document and
//! nothing else is; the integration test `openapi.rs` fuzzes the running app against it
//! with schemathesis. The admin API's handlers are annotated in [`super::admin::api`].

use std::sync::OnceLock;

use actix_web::HttpResponse;
use utoipa::openapi::header::HeaderBuilder;
use utoipa::openapi::response::{Response, ResponseBuilder};
use utoipa::openapi::security::{ApiKey, ApiKeyValue, Http, HttpAuthScheme, SecurityScheme};
use utoipa::openapi::{ContentBuilder, Ref, RefOr, Type};
use utoipa::{Modify, OpenApi, ToResponse};

use super::admin::api as admin;
use super::api;
use crate::error::ProblemDocument;

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
    ),
    components(
        schemas(ProblemDocument),
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
        .filter(|(_, path, _)| path.starts_with("/api/"))
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

/// The document, built once.
pub fn document_json() -> &'static str {
    static JSON: OnceLock<String> = OnceLock::new();
    JSON.get_or_init(|| {
        ApiDoc::openapi()
            .to_pretty_json()
            .expect("the OpenAPI document serialises")
    })
}

/// This API's OpenAPI 3.1 document.
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
pub async fn get_openapi_json() -> HttpResponse {
    HttpResponse::Ok()
        .content_type("application/json")
        .body(document_json())
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

/// Declares a reusable error response: `name`, its description, its headers.
macro_rules! problem_response {
    ($name:ident, $description:literal $(, $header:expr)*) => {
        #[doc = $description]
        pub struct $name;

        impl<'r> ToResponse<'r> for $name {
            fn response() -> (&'r str, RefOr<Response>) {
                (stringify!($name), problem($description, &[$($header),*]))
            }
        }
    };
}

problem_response!(
    BadRequest,
    "The request is malformed: a required header is missing or unreadable, or the body is \
     not JSON."
);
problem_response!(
    Unauthorized,
    "No API key, or one that is unknown or revoked.",
    (
        "WWW-Authenticate",
        Type::String,
        "`Bearer`, or `Bearer error=\"invalid_token\"` for a key that is not valid."
    )
);
problem_response!(
    Forbidden,
    "Refused: the request came from another site (its `Origin` or `Sec-Fetch-Site`)."
);
problem_response!(
    NotFound,
    "Nothing with this id or SKU, or it belongs to another API client."
);
problem_response!(
    RequestTimeout,
    "The body did not arrive in time; the connection is closed."
);
problem_response!(
    Conflict,
    "The request conflicts with the current state: not enough stock (`shortages` names each \
     short SKU), a purchase limit reached, the hold already released or confirmed, or the same \
     Idempotency-Key still in flight (then with `Retry-After`).",
    RETRY_AFTER
);
problem_response!(TooLarge, "The body is larger than allowed.");
problem_response!(
    UnsupportedMediaType,
    "The body is not sent as `application/json`."
);
problem_response!(
    Unprocessable,
    "Well-formed, but the values cannot be accepted (say which and why), or the \
     Idempotency-Key was used before with another body."
);
problem_response!(
    TooManyRequests,
    "Past this caller's rate limit for orders and holds.",
    RETRY_AFTER
);
problem_response!(
    Unavailable,
    "Busy or a dependency is down; nothing was changed that a retry with the same \
     Idempotency-Key would repeat.",
    RETRY_AFTER
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_api_route_is_documented_and_nothing_else() {
        let doc: serde_json::Value = serde_json::from_str(document_json()).unwrap();
        let routes = api_routes();
        assert!(routes.len() >= 18, "{routes:?}");
        assert_eq!(operations(&doc), routes);
    }

    #[test]
    fn the_document_is_openapi_3_1_with_problem_errors_and_bearer_auth() {
        let doc: serde_json::Value = serde_json::from_str(document_json()).unwrap();
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
        let problem = &doc["components"]["responses"]["NotFound"]["content"];
        assert_eq!(
            problem["application/problem+json"]["schema"]["$ref"],
            "#/components/schemas/Problem"
        );
    }
}
