//! Free text from clients (names, emails, usernames, product fields, reasons): what every
//! parser into a domain type checks before the text goes anywhere near SQL. PostgreSQL
//! cannot store NUL in text, and control characters have no business in a name or a
//! ledger note, so both are refused with a message naming the field.

/// Text that was refused; the message names the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field} must not contain control characters (such as NUL, tabs or escape codes){allowed}")]
pub struct InvalidText {
    pub field: String,
    allowed: &'static str,
}

/// One line of text: no control characters at all (C0, DEL, C1).
pub fn single_line(field: &str, value: &str) -> Result<(), InvalidText> {
    match value.chars().any(char::is_control) {
        true => Err(InvalidText {
            field: field.to_string(),
            allowed: "",
        }),
        false => Ok(()),
    }
}

/// Several lines (a description): line breaks and tabs are allowed, other control
/// characters are not.
pub fn multi_line(field: &str, value: &str) -> Result<(), InvalidText> {
    match value
        .chars()
        .any(|c| c.is_control() && !matches!(c, '\n' | '\r' | '\t'))
    {
        true => Err(InvalidText {
            field: field.to_string(),
            allowed: "; line breaks are fine",
        }),
        false => Ok(()),
    }
}

impl From<InvalidText> for crate::error::AppError {
    fn from(e: InvalidText) -> Self {
        Self::Unprocessable(crate::error::sentence(&e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_refused_naming_the_field() {
        single_line("name", "Ada Lovelace — ünïcode ✓").unwrap();
        for bad in [
            "a\0b",
            "a\nb",
            "\u{1b}[31m",
            "tab\there",
            "del\u{7f}",
            "c1\u{85}",
        ] {
            let err = single_line("name", bad).unwrap_err();
            assert!(
                err.to_string().starts_with("name must not"),
                "{bad:?}: {err}"
            );
        }
        multi_line("description", "line one\r\nline two\tindented").unwrap();
        let err = multi_line("description", "nul\0here").unwrap_err();
        assert!(err.to_string().starts_with("description must not"), "{err}");
        assert!(err.to_string().contains("line breaks are fine"), "{err}");
    }
}
