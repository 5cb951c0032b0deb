//! What a query string or a web form that cannot be read is answered with: a sentence
//! naming the parameter, never serde's or actix's own words ("Query deserialize error:
//! duplicate field `q`"). Installed as the `QueryConfig` and `FormConfig` error handlers,
//! so every `web::Query` and `web::Form` answers the same way. And the parameters that the
//! catalogue page and the API's product list both read ([`BrowseParams`]).

use serde::Deserialize;

use crate::catalog::browse::{Browse, Sort};
use crate::error::{AppError, percent_encode};

/// 400 for a query string that does not fit its handler's parameters.
pub fn query_error(e: actix_web::error::QueryPayloadError) -> AppError {
    use actix_web::error::QueryPayloadError as E;
    let message = match e {
        E::Deserialize(e) => e.to_string(),
        _ => String::new(),
    };
    AppError::BadRequest(unreadable("the address", &message))
}

/// 413, 415 or 400 for a form that cannot be read.
pub fn form_error(e: actix_web::error::UrlencodedError) -> AppError {
    use actix_web::error::UrlencodedError as E;
    let why = match e {
        E::Overflow { limit, .. } => {
            return AppError::TooLarge(format!("The form is larger than {limit} bytes."));
        }
        E::ContentType => {
            return AppError::UnsupportedMediaType("Send the form as a web form.".into());
        }
        E::Parse(e) => match Fault::of(&e.to_string()) {
            Fault::Twice(name) => format!("{} is given twice", label(&name)),
            Fault::Missing(name) => format!("{} is missing", label(&name)),
            Fault::Other(why) => why.into(),
        },
        _ => "it did not arrive whole".into(),
    };
    AppError::BadRequest(format!(
        "The form could not be read: {why}. Please go back and try again."
    ))
}

/// A sentence for serde's `message` about the parameters in `place` ("the address").
fn unreadable(place: &str, message: &str) -> String {
    let capital = |name: &str| crate::error::capitalise(&label(name));
    match Fault::of(message) {
        Fault::Twice(name) => format!(
            "{} may be given once ({name} appears twice in {place}).",
            capital(&name)
        ),
        Fault::Missing(name) => format!("{} is missing from {place}.", capital(&name)),
        Fault::Other(why) => format!("The parameters in {place} could not be read: {why}."),
    }
}

/// What serde_urlencoded's message says went wrong.
enum Fault {
    Twice(String),
    Missing(String),
    Other(&'static str),
}

impl Fault {
    fn of(message: &str) -> Self {
        let named = |prefix: &str| {
            message
                .strip_prefix(prefix)
                .and_then(|rest| rest.strip_prefix('`'))
                .and_then(|rest| rest.split_once('`'))
                .map(|(name, _)| name.to_string())
        };
        if let Some(name) = named("duplicate field ") {
            return Self::Twice(name);
        }
        if let Some(name) = named("missing field ") {
            return Self::Missing(name);
        }
        Self::Other(match message {
            m if m.contains("invalid digit") || m.contains("number") => {
                "a number in it is not a whole number"
            }
            m if m.starts_with("unknown variant") => "one of its values is not a choice it offers",
            _ => "it does not fit this page",
        })
    }
}

/// What a parameter is called in a sentence.
fn label(name: &str) -> String {
    match name {
        "q" => "the search".into(),
        "category" => "the category".into(),
        "sort" => "the sort order".into(),
        "page" => "the page".into(),
        "status" => "the status".into(),
        other => format!("\"{}\"", other.chars().take(40).collect::<String>()),
    }
}

/// The catalogue's query parameters as sent, all optional; [`BrowseParams::parse`] checks
/// them (the page and the API read the same ones).
#[derive(Debug, Default, Deserialize)]
pub struct BrowseParams {
    pub q: Option<String>,
    pub category: Option<String>,
    pub sort: Option<String>,
    pub page: Option<String>,
}

impl BrowseParams {
    pub fn parse(&self) -> Result<Browse, AppError> {
        Browse::parse(
            self.q.as_deref(),
            self.category.as_deref(),
            self.sort.as_deref(),
            self.page.as_deref(),
        )
        .map_err(|e| AppError::Unprocessable(crate::error::sentence(&e.0)))
    }

    /// `path` with the query that asks for `browse` (defaults left out).
    pub fn url_for(path: &str, browse: &Browse) -> String {
        let mut params = Vec::new();
        if !browse.q.is_empty() {
            params.push(format!("q={}", percent_encode(&browse.q)));
        }
        if let Some(c) = &browse.category {
            params.push(format!("category={}", percent_encode(c)));
        }
        if browse.sort != Sort::Relevance {
            params.push(format!("sort={}", browse.sort.as_str()));
        }
        if browse.page != 1 {
            params.push(format!("page={}", browse.page));
        }
        match params.is_empty() {
            true => path.to_string(),
            false => format!("{path}?{}", params.join("&")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repeated_parameter_is_named_in_a_sentence() {
        assert_eq!(
            unreadable("the address", "duplicate field `q`"),
            "The search may be given once (q appears twice in the address)."
        );
        assert_eq!(
            unreadable("the address", "duplicate field `status`"),
            "The status may be given once (status appears twice in the address)."
        );
        assert_eq!(
            unreadable("the address", "missing field `sku`"),
            "\"sku\" is missing from the address."
        );
        assert_eq!(
            unreadable("the address", "invalid digit found in string"),
            "The parameters in the address could not be read: a number in it is not a whole \
             number."
        );
    }
}
