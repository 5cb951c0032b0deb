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

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use actix_web::{HttpResponse, web};
use utoipa::openapi::security::{ApiKey, ApiKeyValue, Http, HttpAuthScheme, SecurityScheme};
use utoipa::{Modify, OpenApi};

use super::AppState;
use super::admin::api as admin;
use super::api;
use super::contract::*;
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
            A method an address does not take is answered 405 with `Allow`. A whole number \
            (a quantity, a count, a rate) is written as one: `1.0` and `1e0` are refused with \
            422 where JSON Schema's `integer` alone would take them."
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
        api::payment::post_hold_payment,
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
            inputs::ShippingAddressInput,
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
            PaymentRequired,
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
    let mut routes: Vec<(String, String)> = super::routing::public_routes()
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
