//! Static files, compiled into the binary so it runs from any folder.

use actix_web::http::header;
use actix_web::{HttpResponse, web};

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

pub async fn get_asset(file: web::Path<String>) -> Result<HttpResponse, AppError> {
    let (_, content_type, body) = ASSETS
        .iter()
        .find(|(name, _, _)| *name == file.as_str())
        .ok_or_else(|| AppError::not_found("No such file."))?;
    Ok(HttpResponse::Ok()
        .content_type(*content_type)
        .insert_header((header::CACHE_CONTROL, "public, max-age=3600"))
        .body(*body))
}
