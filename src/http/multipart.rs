//! Just enough `multipart/form-data` (RFC 7578) for the admin's picture upload: the body
//! is read whole, up to a cap, and split at its boundary into named parts. Browsers send
//! this form in one shape (CRLF line breaks, a quoted `name` in `Content-Disposition`), and
//! that is the shape read; anything else is refused as a malformed form.

use actix_web::HttpRequest;
use actix_web::http::header;
use actix_web::web::{self, BytesMut};
use futures_util::StreamExt;

use crate::error::AppError;

/// One part of a form: its field name and its bytes.
#[derive(Debug, PartialEq, Eq)]
pub struct Part {
    pub name: String,
    pub data: Vec<u8>,
}

/// Reads the whole body, refusing it (413) as soon as it passes `cap` bytes, and splits it.
pub async fn read(
    req: &HttpRequest,
    mut payload: web::Payload,
    cap: usize,
    too_large: &str,
) -> Result<Vec<Part>, AppError> {
    let boundary = boundary(req)?;
    let mut body = BytesMut::new();
    while let Some(chunk) = payload.next().await {
        let chunk =
            chunk.map_err(|e| AppError::BadRequest(format!("The upload broke off: {e}.")))?;
        if body.len() + chunk.len() > cap {
            return Err(AppError::TooLarge(too_large.to_string()));
        }
        body.extend_from_slice(&chunk);
    }
    parse(&body, &boundary).ok_or_else(malformed)
}

fn malformed() -> AppError {
    AppError::BadRequest("The upload is not a well-formed multipart/form-data form.".into())
}

/// The boundary named in `Content-Type: multipart/form-data; boundary=…`.
fn boundary(req: &HttpRequest) -> Result<String, AppError> {
    let content_type = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let (kind, params) = content_type.split_once(';').unwrap_or((content_type, ""));
    if !kind.trim().eq_ignore_ascii_case("multipart/form-data") {
        return Err(AppError::UnsupportedMediaType(
            "Send the picture as a multipart/form-data form (the upload form does).".into(),
        ));
    }
    params
        .split(';')
        .filter_map(|p| p.trim().split_once('='))
        .find(|(k, _)| k.eq_ignore_ascii_case("boundary"))
        .map(|(_, v)| v.trim_matches('"').to_string())
        .filter(|b| (1..=70).contains(&b.len()))
        .ok_or_else(malformed)
}

/// Splits `body` at `--boundary`; `None` when it is not a form of that boundary.
pub fn parse(body: &[u8], boundary: &str) -> Option<Vec<Part>> {
    let delimiter = format!("--{boundary}");
    let delimiter = delimiter.as_bytes();
    let mut rest = body.strip_prefix(delimiter)?;
    let mut parts = Vec::new();
    loop {
        if rest.starts_with(b"--") {
            return Some(parts); // the closing delimiter
        }
        rest = rest.strip_prefix(b"\r\n")?;
        let head_end = find(rest, b"\r\n\r\n")?;
        let head = std::str::from_utf8(&rest[..head_end]).ok()?;
        let after_head = &rest[head_end + 4..];
        let mut closing = b"\r\n".to_vec();
        closing.extend_from_slice(delimiter);
        let data_end = find(after_head, &closing)?;
        parts.push(Part {
            name: field_name(head)?,
            data: after_head[..data_end].to_vec(),
        });
        rest = &after_head[data_end + closing.len()..];
    }
}

/// The `name="…"` of a part's `Content-Disposition: form-data` header.
fn field_name(head: &str) -> Option<String> {
    let disposition = head.lines().find_map(|line| {
        let (key, value) = line.split_once(':')?;
        key.trim()
            .eq_ignore_ascii_case("content-disposition")
            .then_some(value)
    })?;
    disposition.split(';').find_map(|p| {
        let (k, v) = p.trim().split_once('=')?;
        (k == "name").then(|| v.trim_matches('"').to_string())
    })
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_browser_form_splits_into_its_fields() {
        let body = b"--XyZ\r\nContent-Disposition: form-data; name=\"csrf\"\r\n\r\ntoken\r\n\
--XyZ\r\nContent-Disposition: form-data; name=\"image\"; filename=\"a.png\"\r\n\
Content-Type: image/png\r\n\r\n\x89PNG\r\n--X\r\n--XyZ--\r\n";
        let parts = parse(body, "XyZ").unwrap();
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[0].name, "csrf");
        assert_eq!(parts[0].data, b"token");
        assert_eq!(parts[1].name, "image");
        assert_eq!(
            parts[1].data, b"\x89PNG\r\n--X",
            "data may hold CRLF and dashes"
        );
    }

    #[test]
    fn malformed_forms_are_refused() {
        assert_eq!(parse(b"", "XyZ"), None);
        assert_eq!(parse(b"--Other\r\n", "XyZ"), None);
        assert_eq!(parse(b"--XyZ\r\nno head end", "XyZ"), None);
        assert_eq!(
            parse(
                b"--XyZ\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\nunterminated",
                "XyZ"
            ),
            None
        );
        assert_eq!(
            parse(
                b"--XyZ\r\nContent-Type: text/plain\r\n\r\nx\r\n--XyZ--",
                "XyZ"
            ),
            None,
            "a part without a name"
        );
    }
}
