//! Post/Redirect/Get for every form: a page that answers a form (a refused field, a sold-out
//! line, a wrong password) is kept for a while and the browser is sent to it with 303, so
//! the page it shows sits at a GET address. Back and reload then never send the form again;
//! reload shows the same answer, with the same status (422 stays 422) and the page's own
//! Content-Security-Policy.
//!
//! The page is kept in Redis (any process behind the proxy serves it), for [`KEPT_FOR`],
//! and only for the browser that sent the form: its CSRF cookie, which every form needs,
//! and its admin session, if any, are the page's key (so an admin's page is gone at
//! logout). What all kept pages may take is bounded ([`BUDGET_BYTES`] per [`KEPT_FOR`], so
//! at most twice that at once, however many forms are sent); past it, or when Redis does
//! not answer, the page is answered at the form's address as before.
//!
//! Refusals made before a form is read stay where they are: an unreadable form (400), a
//! forged or cross-site post (403), an address no route takes (404, 405), a body too large
//! or too slow (413, 408), throttling (429) and the server's own trouble (5xx), and any
//! page that asks to be sent again (`Retry-After`): reloading is the retry such a page
//! asks for.

use actix_web::body::{BoxBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::{Method, StatusCode, header};
use actix_web::middleware::Next;
use actix_web::{HttpRequest, HttpResponse, web};
use sha2::Digest;

use super::AppState;
use super::paths::{IdPath, Names};
use crate::error::AppError;

/// How long an answer to a form stays to be shown again.
pub const KEPT_FOR: std::time::Duration = std::time::Duration::from_secs(10 * 60);

/// The bytes of pages kept per [`KEPT_FOR`].
pub const BUDGET_BYTES: usize = 32 << 20;

/// Keeps a page (`KEYS[1]`: the page, `KEYS[2]`: the bytes kept in this window) for
/// `ARGV[2]` ms when the window's `ARGV[3]` bytes allow it; 1 if kept.
const KEEP: &str = r"
local used = tonumber(redis.call('GET', KEYS[2]) or '0')
if used + #ARGV[1] > tonumber(ARGV[3]) then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
redis.call('INCRBY', KEYS[2], #ARGV[1])
if redis.call('PTTL', KEYS[2]) < 0 then redis.call('PEXPIRE', KEYS[2], ARGV[2]) end
return 1
";

/// Marks a response to be answered where it stands, never kept: a page showing a secret
/// once (a new API key) must not sit in Redis or at an address.
pub struct NotKept;

/// Wraps every request, outside [`super::middleware::around_request`] so that it sees the
/// finished page with its headers.
pub async fn redirect_form_answers(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<BoxBody>, actix_web::Error> {
    // Only a form a route takes: a post to no route (404, 405) is not worth keeping, and
    // costs the budget nothing.
    let routed = req.match_pattern().is_some();
    let binding = (routed && is_form_post(&req))
        .then(|| browser(req.request()))
        .flatten();
    let res = next.call(req).await?.map_into_boxed_body();
    let Some(binding) = binding else {
        return Ok(res);
    };
    let is_page = res
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/html"));
    // A page that asks to be sent again (`Retry-After`: the first send still running, the
    // database busy) stays at the form's address, where reloading is that retry.
    let retry = res.headers().contains_key(header::RETRY_AFTER);
    if !is_page
        || retry
        || !kept_status(res.status())
        || res.response().extensions().contains::<NotKept>()
    {
        return Ok(res);
    }
    let Some(state) = res.request().app_data::<web::Data<AppState>>().cloned() else {
        return Ok(res);
    };
    let (req, res) = res.into_parts();
    let (head, body) = res.into_parts();
    // Pages are rendered whole into memory; reading one back cannot wait or fail.
    let body = actix_web::body::to_bytes(body)
        .await
        .map_err(|e| AppError::Internal(anyhow::anyhow!("reading a page back: {e}")))?;
    let id = crate::admin::random_token();
    // The page's own policy (the checkout's lets the payment provider's script in) comes
    // back with it; every other header is the GET's own.
    let policy = head
        .headers()
        .get(header::CONTENT_SECURITY_POLICY)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let kept = format!("{}\n{binding}\n{policy}\n", head.status().as_u16());
    let mut value = kept.into_bytes();
    value.extend_from_slice(&body);
    static SCRIPT: std::sync::LazyLock<redis::Script> =
        std::sync::LazyLock::new(|| redis::Script::new(KEEP));
    let mut keep = SCRIPT.key(key(&state, &id));
    keep.key(state.redis.key("shown-bytes"))
        .arg(value)
        .arg(KEPT_FOR.as_millis() as u64)
        .arg(BUDGET_BYTES);
    let mut conn = state.redis.conn();
    let stored = state
        .redis
        .call(
            "keeping a form's answer",
            keep.invoke_async::<i64>(&mut conn),
        )
        .await
        == Some(1);
    if !stored {
        return Ok(ServiceResponse::new(req, head.set_body(BoxBody::new(body))));
    }
    let mut redirect = HttpResponse::SeeOther().finish();
    for (name, value) in head.headers() {
        if name != header::CONTENT_TYPE && name != header::CONTENT_LENGTH {
            redirect.headers_mut().append(name.clone(), value.clone());
        }
    }
    redirect.headers_mut().insert(
        header::LOCATION,
        header::HeaderValue::from_str(&format!("/shown/{id}")).expect("hex is a header value"),
    );
    Ok(ServiceResponse::new(req, redirect))
}

/// The address of a kept page: `/shown/{id}`, 64 hex digits.
pub struct KeptPage;

/// A kept page's id, as its address names it.
pub struct KeptId(String);

impl std::str::FromStr for KeptId {
    type Err = ();
    fn from_str(s: &str) -> Result<Self, ()> {
        let hex = s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit());
        hex.then(|| KeptId(s.to_string())).ok_or(())
    }
}

impl Names for KeptPage {
    type Id = KeptId;
    fn missing(_: &str) -> AppError {
        AppError::not_found(format!(
            "This page answered a form and is kept for {} minutes, for the browser that sent \
             it; it is no longer here. Go back to the page with the form and send it again.",
            KEPT_FOR.as_secs() / 60
        ))
    }
}

/// `GET /shown/{id}`: the page that answered this browser's form.
pub async fn get_shown(
    req: HttpRequest,
    state: web::Data<AppState>,
    address: IdPath<KeptPage>,
) -> Result<HttpResponse, AppError> {
    let gone = || KeptPage::missing("");
    let KeptId(id) = address.id()?;
    let mut cmd = redis::cmd("GET");
    cmd.arg(key(&state, &id));
    let mut conn = state.redis.conn();
    let kept = state
        .redis
        .call(
            "reading a form's answer",
            cmd.query_async::<Option<Vec<u8>>>(&mut conn),
        )
        .await
        .ok_or_else(|| AppError::Unavailable {
            message: "This page cannot be read back right now. Please reload in a moment.".into(),
            retry_after: 1,
        })?
        .ok_or_else(gone)?;
    let page = split(&kept).ok_or_else(gone)?;
    if browser(&req).is_none_or(|b| !super::csrf::same(&b, page.binding)) {
        return Err(gone());
    }
    let mut res = HttpResponse::build(page.status);
    res.content_type("text/html; charset=utf-8")
        .insert_header((header::CACHE_CONTROL, "no-store"));
    if !page.policy.is_empty() {
        res.insert_header((header::CONTENT_SECURITY_POLICY, page.policy));
    }
    Ok(res.body(page.body.to_vec()))
}

/// Whether an answer with `status` is kept and redirected to: the pages a form's handler
/// made (a refused field, a conflict, a wrong password, a page with the result), not the
/// refusals made before the form was read (unreadable, forged, unknown address, too large,
/// too slow, throttled) nor the server's own trouble.
fn kept_status(status: StatusCode) -> bool {
    let before_the_form = [
        StatusCode::BAD_REQUEST,
        StatusCode::FORBIDDEN,
        StatusCode::NOT_FOUND,
        StatusCode::METHOD_NOT_ALLOWED,
        StatusCode::REQUEST_TIMEOUT,
        StatusCode::PAYLOAD_TOO_LARGE,
        StatusCode::TOO_MANY_REQUESTS,
    ];
    !status.is_redirection() && !status.is_server_error() && !before_the_form.contains(&status)
}

/// A form sent by a browser page (not the JSON API, not a provider's webhook).
fn is_form_post(req: &ServiceRequest) -> bool {
    let form = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.starts_with("application/x-www-form-urlencoded")
                || v.starts_with("multipart/form-data")
        });
    req.method() == Method::POST
        && form
        && !super::is_api(req.path())
        && !super::is_webhook(req.path())
}

/// Who may see a kept page: a digest of the browser's CSRF cookie, which only it sends
/// (one the app would replace is no binding: the page is answered where it stands), and of
/// its admin session, if any: an admin's page is gone once its session is (logout).
fn browser(req: &HttpRequest) -> Option<String> {
    let csrf = req.cookie(super::cookie_name(req, super::csrf::CSRF_COOKIE))?;
    let csrf = csrf.value();
    if csrf.len() != 64 || !csrf.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let session = req.cookie(super::cookie_name(req, super::ADMIN_SESSION_COOKIE));
    let mut digest = sha2::Sha256::new();
    digest.update(csrf.as_bytes());
    digest.update(b"\n");
    digest.update(session.as_ref().map_or("", |c| c.value()).as_bytes());
    Some(hex::encode(digest.finalize()))
}

fn key(state: &AppState, id: &str) -> String {
    state.redis.key(&format!("shown:{id}"))
}

/// A kept page, as read back.
struct Kept<'a> {
    status: StatusCode,
    binding: &'a str,
    policy: &'a str,
    body: &'a [u8],
}

/// A kept page's status, binding, policy and body (a line each, then the body).
fn split(kept: &[u8]) -> Option<Kept<'_>> {
    let mut parts = kept.splitn(4, |&b| b == b'\n');
    let mut line = || std::str::from_utf8(parts.next()?).ok();
    let status = StatusCode::from_u16(line()?.parse().ok()?).ok()?;
    let (binding, policy) = (line()?, line()?);
    Some(Kept {
        status,
        binding,
        policy,
        body: parts.next()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kept_page_splits_into_status_binding_policy_and_body() {
        let kept = split(b"422\nabc\nscript-src 'self'\n<p>one\ntwo</p>").unwrap();
        assert_eq!(kept.status, StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(kept.binding, "abc");
        assert_eq!(kept.policy, "script-src 'self'");
        assert_eq!(kept.body, b"<p>one\ntwo</p>");
        assert!(split(b"nope").is_none());
        assert!(split(b"422\nabc\n").is_none());
    }
}
