//! What a query string or a web form that cannot be read is answered with: a sentence
//! naming the parameter, never serde's or actix's own words ("Query deserialize error:
//! duplicate field `q`"). Installed as the `QueryConfig` and `FormConfig` error handlers,
//! so every `web::Query` and `web::Form` answers the same way.

use crate::error::AppError;

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
    match e {
        E::Overflow { limit, .. } => {
            AppError::TooLarge(format!("The form is larger than {limit} bytes."))
        }
        E::ContentType => AppError::UnsupportedMediaType("Send the form as a web form.".into()),
        E::Parse(e) => AppError::BadRequest(format!(
            "{} Please go back and try again.",
            unreadable("the form", &e.to_string())
        )),
        _ => {
            AppError::BadRequest("The form could not be read; please go back and try again.".into())
        }
    }
}

/// A sentence for serde's `message` about the parameters of `place` ("the address").
fn unreadable(place: &str, message: &str) -> String {
    let named = |prefix: &str| {
        message
            .strip_prefix(prefix)
            .and_then(|rest| rest.strip_prefix('`'))
            .and_then(|rest| rest.split_once('`'))
            .map(|(name, _)| name.to_string())
    };
    if let Some(name) = named("duplicate field ") {
        return format!(
            "{} may be given once ({name} appears twice in {place}).",
            crate::error::capitalise(&label(&name))
        );
    }
    if let Some(name) = named("missing field ") {
        return format!(
            "{} is missing from {place}.",
            crate::error::capitalise(&label(&name))
        );
    }
    let why = match message {
        m if m.contains("invalid digit") || m.contains("number") => {
            "a number in it is not a whole number".to_string()
        }
        m if m.starts_with("unknown variant") => {
            "one of its values is not a choice it offers".into()
        }
        _ => "it does not fit this page".into(),
    };
    format!("The parameters in {place} could not be read: {why}.")
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
            unreadable("the form", "duplicate field `quantity`"),
            "\"quantity\" may be given once (quantity appears twice in the form)."
        );
        assert_eq!(
            unreadable("the form", "missing field `sku`"),
            "\"sku\" is missing from the form."
        );
        assert_eq!(
            unreadable("the address", "invalid digit found in string"),
            "The parameters in the address could not be read: a number in it is not a whole \
             number."
        );
    }
}
