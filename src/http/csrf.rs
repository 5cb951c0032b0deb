//! Cross-site request forgery defences, for every form in the shop and the admin:
//! - unsafe requests (POST, PUT, PATCH, DELETE) whose `Sec-Fetch-Site` says `cross-site`,
//!   or whose `Origin` is not this site, are refused with 403 before any handler runs;
//! - every form carries a token: storefront forms the value of a per-browser `csrf` cookie
//!   (SameSite=Strict, so another site can neither read nor send it), admin forms their
//!   session's token. A missing or wrong token is refused with 403.

use actix_web::dev::ServiceRequest;
use actix_web::{HttpMessage, HttpRequest};

use crate::error::AppError;

/// A form that carries nothing but its CSRF token.
#[derive(serde::Deserialize)]
pub struct TokenForm {
    #[serde(default)]
    pub csrf: String,
}

/// The storefront's CSRF cookie (its name: [`super::cookie_name`]).
pub const CSRF_COOKIE: &str = "csrf";

/// This request's storefront CSRF token (from its cookie, or new).
#[derive(Debug, Clone)]
pub struct CsrfToken(pub String);

/// Puts the request's token into its extensions; returns a new one to set as a cookie when
/// the browser had none.
pub fn ensure_token(req: &ServiceRequest) -> Option<String> {
    let existing = req
        .cookie(super::cookie_name(req.request(), CSRF_COOKIE))
        .map(|c| c.value().to_string())
        .filter(|v| v.len() == 64 && v.bytes().all(|b| b.is_ascii_hexdigit()));
    let (token, new) = match existing {
        Some(token) => (token, None),
        None => {
            let token = crate::admin::random_token();
            (token.clone(), Some(token))
        }
    };
    req.extensions_mut().insert(CsrfToken(token));
    new
}

/// The storefront token of `req` (for rendering forms).
pub fn token(req: &HttpRequest) -> String {
    req.extensions()
        .get::<CsrfToken>()
        .map(|t| t.0.clone())
        .unwrap_or_default()
}

/// Equal, in time that does not depend on where they differ.
pub fn same(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && !a.is_empty()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

/// Checks a storefront form's token against the browser's cookie.
pub fn check_storefront(req: &HttpRequest, submitted: &str) -> Result<(), AppError> {
    let cookie = req
        .cookie(super::cookie_name(req, CSRF_COOKIE))
        .map(|c| c.value().to_string());
    match cookie {
        Some(cookie) if same(&cookie, submitted) => Ok(()),
        _ => Err(refused()),
    }
}

/// Checks an admin form's (or header's) token against the session's.
pub fn check_admin(admin: &crate::admin::Admin, submitted: &str) -> Result<(), AppError> {
    if same(&admin.csrf, submitted) {
        Ok(())
    } else {
        Err(refused())
    }
}

fn refused() -> AppError {
    AppError::Forbidden(
        "This form has expired or did not come from this site. Go back, reload the page and try again."
            .into(),
    )
}

/// Why an unsafe request must be refused as cross-site, if it must.
pub fn cross_site(req: &ServiceRequest) -> Option<&'static str> {
    use actix_web::http::Method;
    if matches!(*req.method(), Method::GET | Method::HEAD | Method::OPTIONS) {
        return None;
    }
    let header = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    if header("sec-fetch-site").as_deref() == Some("cross-site") {
        return Some("it came from another site");
    }
    if let Some(origin) = header("origin") {
        // Our origin as `asked_for` decides it: X-Forwarded-Host/-Proto only from a
        // trusted proxy, or a client could name its own site as ours.
        let settings = req
            .app_data::<actix_web::web::Data<super::AppState>>()
            .map(|s| s.settings.clone());
        let ours = super::asked_for(req.request(), settings.as_deref()).origin();
        if !origin.eq_ignore_ascii_case(&ours) {
            return Some("its Origin is another site");
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_compare_exactly() {
        assert!(same("abc", "abc"));
        assert!(!same("abc", "abd"));
        assert!(!same("abc", "abcd"));
        assert!(!same("", ""), "an empty token never matches");
    }
}
