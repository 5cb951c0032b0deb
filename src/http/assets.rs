//! Static files, compiled into the binary so it runs from any folder.
//!
//! Pages link each file with its version, a digest of its bytes
//! (`/static/style.css?v=…`, [`url`]), so a browser may keep it for a year: a changed file
//! is a new address. A request without the current version (an old page, a hand-typed
//! address) gets the file too, kept for an hour only.

use std::collections::HashMap;
use std::sync::OnceLock;

use actix_web::http::header;
use std::future::{Ready, ready};

use actix_web::dev::Payload;
use actix_web::{FromRequest, HttpRequest, HttpResponse, web};

use crate::error::AppError;

const ASSETS: &[(&str, &str, &str)] = &[
    (
        "style.css",
        "text/css; charset=utf-8",
        include_str!("../../static/style.css"),
    ),
    (
        "app.js",
        "text/javascript; charset=utf-8",
        include_str!("../../static/app.js"),
    ),
    (
        "pay.js",
        "text/javascript; charset=utf-8",
        include_str!("../../static/pay.js"),
    ),
    (
        "admin.js",
        "text/javascript; charset=utf-8",
        include_str!("../../static/admin.js"),
    ),
    (
        "favicon.svg",
        "image/svg+xml",
        include_str!("../../static/favicon.svg"),
    ),
];

/// Each file's version: the first 12 hex digits of its SHA-256.
fn versions() -> &'static HashMap<&'static str, String> {
    static VERSIONS: OnceLock<HashMap<&'static str, String>> = OnceLock::new();
    VERSIONS.get_or_init(|| {
        use sha2::{Digest, Sha256};
        ASSETS
            .iter()
            .map(|(name, _, body)| (*name, hex::encode(Sha256::digest(body))[..12].to_string()))
            .collect()
    })
}

/// The address pages link `file` by: `/static/{file}?v={version}`.
pub fn url(file: &str) -> String {
    match versions().get(file) {
        Some(v) => format!("/static/{file}?v={v}"),
        None => format!("/static/{file}"),
    }
}

/// `public, max-age=…, immutable` for an address naming the current version (`?v=`),
/// an hour's caching for any other.
pub fn cache_control(req: &HttpRequest, version: &str) -> &'static str {
    let current = web::Query::<HashMap<String, String>>::from_query(req.query_string())
        .is_ok_and(|q| q.get("v").is_some_and(|v| v == version));
    match current {
        true => "public, max-age=31536000, immutable",
        false => "public, max-age=3600",
    }
}

/// A static file named by the address's `{file}`, found on the way in: any other name is
/// 404 in words (nothing else is checked before it).
pub struct Asset(&'static (&'static str, &'static str, &'static str));

impl FromRequest for Asset {
    type Error = AppError;
    type Future = Ready<Result<Self, AppError>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        let file = req.match_info().get("file").unwrap_or_default();
        let found = ASSETS.iter().find(|(name, _, _)| *name == file);
        ready(
            found
                .map(Asset)
                .ok_or_else(|| AppError::not_found("No such file.")),
        )
    }
}

pub async fn get_asset(req: HttpRequest, file: Asset) -> HttpResponse {
    let (name, content_type, body) = file.0;
    HttpResponse::Ok()
        .content_type(*content_type)
        .insert_header((
            header::CACHE_CONTROL,
            cache_control(&req, &versions()[name]),
        ))
        .body(*body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_linked_with_its_version_is_kept_a_year_and_otherwise_an_hour() {
        let link = url("style.css");
        let version = link.strip_prefix("/static/style.css?v=").unwrap();
        assert_eq!(version.len(), 12);
        let ask = |query: &str| {
            let req = actix_web::test::TestRequest::get()
                .uri(&format!("/static/style.css{query}"))
                .to_http_request();
            cache_control(&req, version)
        };
        assert_eq!(
            ask(&format!("?v={version}")),
            "public, max-age=31536000, immutable"
        );
        assert_eq!(ask("?v=000000000000"), "public, max-age=3600");
        assert_eq!(ask(""), "public, max-age=3600");
        assert_eq!(url("no-such-file"), "/static/no-such-file");
    }
}
