//! The one middleware around every request: gives it an id, logs it once when it finishes
//! (method, route pattern, status, latency), renders error bodies (an HTML page, or
//! problem+json under `/api/`), and sets the security headers.

use std::time::Instant;

use actix_web::body::{BoxBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::StatusCode;
use actix_web::http::header::{self, HeaderName, HeaderValue};
use actix_web::middleware::Next;
use actix_web::{HttpMessage, HttpRequest, HttpResponse, web};
use askama::Template;
use tracing::Instrument;

use super::{AppState, Chrome, csrf};
use crate::error::AppError;

/// The id of one request, shown on error pages and in every log line of the request.
#[derive(Debug, Clone)]
pub struct RequestId(pub String);

/// Response header carrying the request id.
pub const REQUEST_ID_HEADER: &str = "x-request-id";

/// A fresh request id: 16 hex digits.
pub(super) fn new_request_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()[..16].to_string()
}

/// Wraps every request; install with `actix_web::middleware::from_fn(around_request)`.
pub async fn around_request(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<BoxBody>, actix_web::Error> {
    let started = Instant::now();
    let request_id = new_request_id();
    req.extensions_mut().insert(RequestId(request_id.clone()));
    // Pages carry the storefront's CSRF cookie for their forms; the JSON API has none.
    let token = match super::is_api(req.path()) || super::is_webhook(req.path()) {
        true => None,
        false => csrf::ensure_token(&req),
    };
    let new_csrf_cookie = token.map(|token| {
        super::cookie(
            req.request(),
            csrf::CSRF_COOKIE,
            token,
            actix_web::cookie::SameSite::Strict,
        )
        .to_string()
    });
    let no_store = personal(req.path());
    // The metrics listener serves `/metrics` and nothing else.
    let state = req.app_data::<web::Data<AppState>>().cloned();
    if state
        .as_ref()
        .is_some_and(|s| s.on_metrics_listener(req.request()))
        && req.path() != "/metrics"
    {
        let res = req.error_response(AppError::not_found("This address serves only /metrics."));
        let mut res = render_error(res.map_into_boxed_body(), &request_id);
        set_headers(res.headers_mut(), &request_id, None, false);
        return Ok(res);
    }
    if let Some(why) = csrf::cross_site(&req) {
        let message = format!("This request was refused because {why}.");
        let res = req.error_response(AppError::Forbidden(message));
        let mut res = render_error(res.map_into_boxed_body(), &request_id);
        set_headers(res.headers_mut(), &request_id, None, no_store);
        tracing::warn!(request_id, why, "cross-site request refused");
        return Ok(res);
    }
    // While the database is known to be out of reach, what needs it is refused at once
    // rather than each request opening a connection that fails (see `pg::outage`).
    if state.as_ref().is_some_and(|s| s.outage.is_down()) && needs_database(req.path()) {
        let res = req.error_response(AppError::Unavailable {
            message: "The shop's database cannot be reached right now, so this request was \
                      not carried out. Please retry in a moment."
                .into(),
            retry_after: 1,
        });
        let mut res = render_error(res.map_into_boxed_body(), &request_id);
        set_headers(res.headers_mut(), &request_id, None, no_store);
        return Ok(res);
    }
    let mut req = req;
    let body_timeout = state.as_ref().map(|s| s.settings.body_timeout);
    let body_timed_out = body_timeout.map(|t| super::body::limit(&mut req, t));
    // The route's pattern (`/orders/{id}`), not the path: log lines group by route, and an
    // order's or checkout's unguessable id stays out of the logs.
    let route = req.match_pattern();
    let span = tracing::info_span!(
        "request",
        method = %req.method(),
        route = route.as_deref().unwrap_or("(no route)"),
        request_id = %request_id,
    );
    // Every request answers within its budget: whatever still waits on the database or
    // Redis then is dropped (connections it held are checked before reuse, an order's
    // idempotency key is released) and the client is told to retry.
    let budget = req
        .app_data::<web::Data<AppState>>()
        .map(|state| state.settings.request_budget);
    if let Some(budget) = budget {
        req.extensions_mut()
            .insert(AnswerBy(std::time::Instant::now() + budget));
    }
    // The request itself goes to the handler (and cannot be cloned before routing), so
    // what the answer to a cut-off request needs is taken now.
    let cut_off = budget.map(|_| CutOff::prepare(req.request(), &request_id));
    let call = next.call(req).instrument(span.clone());
    // Handler errors arrive as responses carrying the error; only a failing inner
    // middleware returns `Err`, and there is none.
    let res = match (budget, cut_off) {
        (Some(budget), Some(cut_off)) => match crate::pg::cut_off(budget, call).await {
            Ok(res) => res?.map_into_boxed_body(),
            Err(_) => {
                span.in_scope(|| {
                    tracing::warn!(
                        budget_ms = budget.as_millis() as u64,
                        "request cut off by its budget"
                    )
                });
                return Err(cut_off.into());
            }
        },
        _ => call.await?.map_into_boxed_body(),
    };
    // A body that did not arrive in time: 408 whatever the handler made of the broken
    // read, and the connection is closed (the rest of the body is never waited for).
    let timed_out = body_timed_out.as_ref().is_some_and(|f| f.happened());
    let res = match body_timeout {
        Some(timeout) if timed_out => {
            let (req, _) = res.into_parts();
            let error = AppError::BodyTimeout(format!(
                "The request body did not arrive within {} ms; the connection is closed. \
                 Send the whole body promptly.",
                timeout.as_millis()
            ));
            ServiceResponse::new(req, HttpResponse::from_error(error))
        }
        _ => res,
    };
    // The cause of a server error goes to the log, never to the client.
    let cause = (res.status().is_server_error())
        .then(|| res.response().error().map(|e| format!("{e:?}")))
        .flatten();
    let mut res = if needs_error_body(&res) {
        render_error(res, &request_id)
    } else {
        res
    };
    // A response shared caches may keep is served to other browsers too: it carries no
    // cookie, or one shopper's CSRF token would be handed to everyone behind the cache.
    let new_csrf_cookie = new_csrf_cookie.filter(|_| !shared_cacheable(res.headers()));
    set_headers(
        res.headers_mut(),
        &request_id,
        new_csrf_cookie.as_deref(),
        no_store,
    );
    if timed_out {
        res.response_mut()
            .head_mut()
            .set_connection_type(actix_web::http::ConnectionType::Close);
    }

    let status = res.status().as_u16();
    // The span carries the method, route and request id.
    let latency_ms = started.elapsed().as_secs_f64() * 1e3;
    span.in_scope(|| {
        if status == 503 {
            // Shed or cut off: expected under overload and faults, and said to the client.
            tracing::warn!(status, latency_ms, cause, "request refused for now");
        } else if status >= 500 {
            tracing::error!(status, latency_ms, cause, "request failed");
        } else {
            tracing::info!(status, latency_ms, "request finished");
        }
    });
    Ok(res)
}

/// Error responses that came from an `Err`, or that have no body (actix's own 404/405).
fn needs_error_body(res: &ServiceResponse<BoxBody>) -> bool {
    use actix_web::body::BodySize;
    let status = res.status();
    (status.is_client_error() || status.is_server_error())
        && (res.response().error().is_some()
            || matches!(
                res.response().body().size(),
                BodySize::None | BodySize::Sized(0)
            ))
}

/// What an error page or problem document says.
struct Problem {
    status: StatusCode,
    message: String,
    details: Option<serde_json::Value>,
}

impl Problem {
    fn of(res: &ServiceResponse<BoxBody>) -> Self {
        let status = res.status();
        let app_error = res
            .response()
            .error()
            .and_then(|e| e.as_error::<AppError>());
        let message = match (app_error, res.response().error()) {
            (Some(app), _) => app.public_message(),
            (None, Some(e)) if status.is_client_error() => e.to_string(),
            _ if status == StatusCode::NOT_FOUND => {
                "There is nothing at this address. It may have moved, or the link is mistyped."
                    .into()
            }
            _ if status == StatusCode::METHOD_NOT_ALLOWED => {
                "This address does not accept that kind of request.".into()
            }
            _ => AppError::Internal(anyhow::anyhow!("unknown")).public_message(),
        };
        Self {
            status,
            message,
            details: app_error.and_then(|e| e.details().cloned()),
        }
    }
}

#[derive(Template)]
#[template(path = "errors/error.html")]
struct ErrorPage {
    chrome: Chrome,
    status: u16,
    title: &'static str,
    message: String,
    request_id: String,
}

/// When a request is cut off by its budget (a request extension): work done for it
/// after that must not start a transaction, since its client was answered already.
#[derive(Debug, Clone, Copy)]
pub struct AnswerBy(pub std::time::Instant);

/// When `req` is cut off by its budget (a budget from now outside the middleware).
pub fn answer_by(req: &actix_web::HttpRequest, budget: std::time::Duration) -> std::time::Instant {
    use actix_web::HttpMessage as _;
    req.extensions()
        .get::<AnswerBy>()
        .map_or_else(|| std::time::Instant::now() + budget, |a| a.0)
}

/// The answer to a request cut off by its budget: a 503 rendered like every other error,
/// prepared before the request went to its handler. It travels as the middleware's
/// `Err`, which actix turns into the response.
#[derive(Debug)]
struct CutOff {
    path: String,
    chrome: Option<Chrome>,
    request_id: String,
}

impl CutOff {
    fn prepare(req: &HttpRequest, request_id: &str) -> Self {
        let json = wants_json(req);
        Self {
            path: req.path().to_string(),
            chrome: (!json).then(|| Chrome::new(req)),
            request_id: request_id.to_string(),
        }
    }
}

impl std::fmt::Display for CutOff {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} was cut off by its budget", self.path)
    }
}

impl actix_web::ResponseError for CutOff {
    fn status_code(&self) -> StatusCode {
        StatusCode::SERVICE_UNAVAILABLE
    }

    fn error_response(&self) -> HttpResponse {
        let error = AppError::over_budget();
        let problem = Problem {
            status: self.status_code(),
            message: error.public_message(),
            details: None,
        };
        let mut res = match &self.chrome {
            Some(chrome) => error_page(&problem, chrome.clone(), &self.request_id),
            None => problem_document(&self.path, &problem, &self.request_id),
        };
        for (name, value) in actix_web::ResponseError::error_response(&error).headers() {
            res.headers_mut().insert(name.clone(), value.clone());
        }
        set_headers(
            res.headers_mut(),
            &self.request_id,
            None,
            personal(&self.path),
        );
        res
    }
}

fn render_error(res: ServiceResponse<BoxBody>, request_id: &str) -> ServiceResponse<BoxBody> {
    let problem = Problem::of(&res);
    let (req, old) = res.into_parts();
    let body = if wants_json(&req) {
        problem_document(req.path(), &problem, request_id)
    } else {
        error_page(&problem, Chrome::new(&req), request_id)
    };
    let mut new = body;
    for (name, value) in old.headers() {
        if name != header::CONTENT_TYPE && name != header::CONTENT_LENGTH {
            new.headers_mut().insert(name.clone(), value.clone());
        }
    }
    ServiceResponse::new(req, new)
}

/// Whether answering `path` may need the database: everything but the health checks
/// (`/readyz` asks the database itself, and says so), metrics and static files.
fn needs_database(path: &str) -> bool {
    !(matches!(path, "/healthz" | "/readyz" | "/metrics") || path.starts_with("/static/"))
}

fn wants_json(req: &HttpRequest) -> bool {
    super::is_api(req.path())
        || super::is_webhook(req.path())
        || req.path() == "/readyz"
        || req
            .headers()
            .get(header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.contains("json") && !v.contains("html"))
}

/// A problem+json response for `req`, for handlers that answer a problem with headers of
/// their own (such as `Idempotency-Replayed`).
pub fn problem_response(
    req: &HttpRequest,
    status: StatusCode,
    detail: &str,
    details: Option<serde_json::Value>,
) -> HttpResponse {
    let problem = Problem {
        status,
        message: detail.to_string(),
        details,
    };
    problem_document(req.path(), &problem, &request_id(req))
}

/// An RFC 9457 problem document, as sent: the standard members, then the problem's own
/// (`shortages`, `on_hand`, …).
#[derive(serde::Serialize)]
struct ProblemDocument<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    title: &'static str,
    status: u16,
    detail: &'a str,
    instance: &'a str,
    request_id: &'a str,
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    details: Option<&'a serde_json::Map<String, serde_json::Value>>,
}

/// An RFC 9457 problem document about the request for `path`.
fn problem_document(path: &str, problem: &Problem, request_id: &str) -> HttpResponse {
    let details = problem
        .details
        .as_ref()
        .and_then(serde_json::Value::as_object);
    let text = problem_json(problem.status, &problem.message, path, request_id, details);
    HttpResponse::build(problem.status)
        .content_type("application/problem+json")
        .body(text)
}

/// The text of a problem document with the standard members only, for an answer written
/// outside actix ([`super::head`]).
pub(super) fn problem_text(
    status: StatusCode,
    detail: &str,
    path: &str,
    request_id: &str,
) -> String {
    problem_json(status, detail, path, request_id, None)
}

fn problem_json(
    status: StatusCode,
    detail: &str,
    path: &str,
    request_id: &str,
    details: Option<&serde_json::Map<String, serde_json::Value>>,
) -> String {
    let doc = ProblemDocument {
        kind: "about:blank",
        title: AppError::title(status),
        status: status.as_u16(),
        detail,
        instance: path,
        request_id,
        details,
    };
    serde_json::to_string(&doc).expect("problem documents serialise")
}

fn error_page(problem: &Problem, chrome: Chrome, request_id: &str) -> HttpResponse {
    let page = ErrorPage {
        chrome,
        status: problem.status.as_u16(),
        title: AppError::title(problem.status),
        message: problem.message.clone(),
        request_id: request_id.to_string(),
    };
    match page.render() {
        Ok(html) => HttpResponse::build(problem.status)
            .content_type("text/html; charset=utf-8")
            .body(html),
        Err(e) => {
            tracing::error!(error = %e, "error page failed to render");
            HttpResponse::build(problem.status)
                .content_type("text/plain; charset=utf-8")
                .body(format!("{}\nrequest id: {request_id}\n", problem.message))
        }
    }
}

/// A strict content security policy: everything from this origin, no inline script.
pub const CSP: &str = "default-src 'self'; img-src 'self' data:; object-src 'none'; \
                   base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

/// Pages and answers that must not be kept by browsers or proxies: the admin, and
/// everything showing a shopper's order, checkout or cart (names, emails, what they buy).
fn personal(path: &str) -> bool {
    [
        "/admin",
        "/api/v1/admin",
        "/orders/",
        "/api/v1/orders",
        "/checkout",
        "/api/v1/holds",
        "/cart",
    ]
    .iter()
    .any(|prefix| path.starts_with(prefix))
}

/// Whether `headers` let a shared cache (a proxy, a CDN) keep the response: its
/// `Cache-Control` says `public` or gives an `s-maxage`.
fn shared_cacheable(headers: &actix_web::http::header::HeaderMap) -> bool {
    headers
        .get_all(header::CACHE_CONTROL)
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|d| d.trim().to_ascii_lowercase())
        .any(|d| d == "public" || d.starts_with("s-maxage"))
}

/// Every powerful feature off, for this origin and any frame.
const PERMISSIONS_POLICY: &str = "accelerometer=(), camera=(), geolocation=(), gyroscope=(), \
     magnetometer=(), microphone=(), payment=(), usb=()";

/// The headers every answer carries (the security headers, `X-Request-Id`), with
/// `Cache-Control: no-store` when `no_store` and a new CSRF cookie when there is one.
pub(super) fn set_headers(
    headers: &mut actix_web::http::header::HeaderMap,
    request_id: &str,
    new_csrf_cookie: Option<&str>,
    no_store: bool,
) {
    if let Some(cookie) = new_csrf_cookie
        && let Ok(value) = HeaderValue::from_str(cookie)
    {
        headers.append(header::SET_COOKIE, value);
    }
    if no_store {
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    // A page that loads the payment provider's script says so in a policy of its own.
    if !headers.contains_key(header::CONTENT_SECURITY_POLICY) {
        headers.insert(
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(CSP),
        );
    }
    let fixed = [
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::REFERRER_POLICY, "same-origin"),
        (header::X_FRAME_OPTIONS, "DENY"),
        // The shop asks for none of the browser's powerful features; naming them here
        // keeps a script that found its way in (or a frame) from asking either.
        (
            header::HeaderName::from_static("permissions-policy"),
            PERMISSIONS_POLICY,
        ),
    ];
    for (name, value) in fixed {
        headers.insert(name, HeaderValue::from_static(value));
    }
    if let Ok(value) = HeaderValue::from_str(request_id) {
        headers.insert(HeaderName::from_static(REQUEST_ID_HEADER), value);
    }
}

/// The request id of `req`, set by [`around_request`].
pub fn request_id(req: &HttpRequest) -> String {
    req.extensions()
        .get::<RequestId>()
        .map(|r| r.0.clone())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use actix_web::{App, test};

    use super::*;

    /// Collects what the subscriber writes.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[actix_web::test]
    async fn request_logs_name_the_route_pattern_and_leave_the_path_out() {
        let captured = Captured::default();
        let writer = captured.clone();
        let subscriber = tracing_subscriber::fmt()
            .json()
            .with_current_span(true)
            .with_writer(move || writer.clone())
            .finish();
        let _guard = tracing::subscriber::set_default(subscriber);
        let app = test::init_service(
            App::new()
                .wrap(actix_web::middleware::from_fn(around_request))
                .route("/orders/{id}", web::get().to(|| async { "an order" })),
        )
        .await;
        let secret_id = "7f3c9a51d2e84b0c";
        let req = test::TestRequest::get()
            .uri(&format!("/orders/{secret_id}"))
            .to_request();
        let res = test::call_service(&app, req).await;
        assert_eq!(res.status(), StatusCode::OK);

        let logged = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
        let line: serde_json::Value = logged
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .find(|l: &serde_json::Value| l["fields"]["message"] == "request finished")
            .unwrap_or_else(|| panic!("no `request finished` line in {logged}"));
        assert_eq!(line["span"]["route"], "/orders/{id}", "{line}");
        assert_eq!(line["span"]["method"], "GET", "{line}");
        assert!(!logged.contains(secret_id), "the path was logged: {logged}");
    }
}
