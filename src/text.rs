//! Free text from clients (names, emails, usernames, product fields, reasons): what every
//! parser into a domain type checks before the text goes anywhere near SQL. PostgreSQL
//! cannot store NUL in text, and control characters have no business in a name or a
//! ledger note, so both are refused with a message naming the field. A single line also
//! refuses invisible formatting characters (below), which would let two values that look
//! the same be different ("Desk" and "Desk" + a zero-width space), or turn the text
//! around it backwards (U+202E).

use unicode_properties::{GeneralCategory, UnicodeGeneralCategory};

/// Text that was refused; the message names the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field} must not contain {what}")]
pub struct InvalidText {
    pub field: String,
    what: &'static str,
}

/// One line of text: no control characters at all (C0, DEL, C1), and no invisible
/// formatting characters — Unicode's general category Cf: direction marks and overrides,
/// zero-width spaces and joiners, the byte-order mark, soft hyphens, tag characters.
///
/// One exception keeps real writing possible: a zero-width joiner or non-joiner (U+200D,
/// U+200C) between two non-ASCII characters that are not themselves formatting or spaces.
/// Persian, Hindi and other scripts spell words with them (می‌خواهم), and emoji sequences
/// are joined by them (👩‍💻). Next to ASCII, at either end, or doubled, a joiner is only
/// invisible, and is refused.
pub fn single_line(field: &str, value: &str) -> Result<(), InvalidText> {
    let refused = |what| {
        Err(InvalidText {
            field: field.to_string(),
            what,
        })
    };
    if value.chars().any(char::is_control) {
        return refused("control characters (such as NUL, tabs or escape codes)");
    }
    let chars: Vec<char> = value.chars().collect();
    let joins_writing = |i: usize| {
        let writing = |c: Option<&char>| {
            c.is_some_and(|&c| !c.is_ascii() && !c.is_whitespace() && !is_format(c))
        };
        matches!(chars[i], '\u{200C}' | '\u{200D}')
            && writing(i.checked_sub(1).and_then(|j| chars.get(j)))
            && writing(chars.get(i + 1))
    };
    match (0..chars.len()).any(|i| is_format(chars[i]) && !joins_writing(i)) {
        true => refused(
            "invisible formatting characters (such as zero-width spaces, joiners or \
             direction marks)",
        ),
        false => Ok(()),
    }
}

/// A format character (general category Cf): it changes how text around it is shown,
/// and shows nothing itself.
pub fn is_format(c: char) -> bool {
    c.general_category() == GeneralCategory::Format
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
            what: "control characters (such as NUL, tabs or escape codes); line breaks are fine",
        }),
        false => Ok(()),
    }
}

/// A whole number as forms and addresses give it (a cart's quantity, `?page=`): ASCII
/// digits only, around which spaces are ignored — no sign, point or exponent, so `+1`,
/// `1.0` and `1e0` are refused everywhere, as the API refuses them in JSON. `None` for
/// anything else, and for more than 18 digits (beyond any count, and beyond `i64`).
pub fn whole_number(raw: &str) -> Option<i64> {
    let digits = raw.trim();
    match (1..=18).contains(&digits.len()) && digits.bytes().all(|b| b.is_ascii_digit()) {
        true => digits.parse().ok(),
        false => None,
    }
}

/// Most characters of a client's text that a message repeats.
const QUOTED_CHARS: usize = 40;

/// A client's text as a message repeats it to them: in plain double quotes, cut to 40
/// characters (then `…`), with control and bidirectional-formatting characters shown as
/// `�`, so what is echoed can neither run on nor rearrange the sentence around it. (Rust's
/// `{:?}` would show escapes such as `\u{202e}`, or a wrapper's name such as `Path(…)`.)
pub fn quoted(raw: &str) -> String {
    let shown: String = raw
        .chars()
        .take(QUOTED_CHARS)
        .map(|c| match c.is_control() || is_bidi_control(c) {
            true => '\u{FFFD}',
            false => c,
        })
        .collect();
    let cut = match raw.chars().nth(QUOTED_CHARS) {
        Some(_) => "…",
        None => "",
    };
    format!("\"{shown}{cut}\"")
}

/// Characters that reorder the text around them (U+061C, U+200E/F, U+202A–E, U+2066–9).
fn is_bidi_control(c: char) -> bool {
    matches!(c, '\u{061C}' | '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
}

/// Units that read as one with the number before them ("2 m", "250 g", "90 × 40 cm").
const UNITS: &[&str] = &[
    "mm", "cm", "m", "km", "in", "ft", "g", "kg", "oz", "lb", "ml", "l", "L", "W", "kW", "V",
    "mAh", "Wh", "Hz", "kHz", "GB", "TB", "MB", "Gbit", "Mbit", "gsm", "°C", "°F", "%", "×", "x",
    "pcs", "h", "min", "s",
];

/// A product name as displayed: the space between a number and its unit becomes a
/// no-break space, so a narrow screen never leaves "2" at the end of one line and "m" at
/// the start of the next. The stored name is left as typed.
pub fn keep_units_together(name: &str) -> String {
    let words: Vec<&str> = name.split(' ').collect();
    let mut out = String::with_capacity(name.len() + 8);
    for (i, word) in words.iter().enumerate() {
        if i > 0 {
            let before = words[i - 1];
            let unit: &str = word.trim_end_matches([',', '.', ';', ':', ')', '/']);
            let unit = unit.split('/').next().unwrap_or(unit);
            let glued = before.ends_with(|c: char| c.is_ascii_digit()) && UNITS.contains(&unit);
            // "90 × 40": the number after a multiplication sign stays with it too.
            let times = before == "×" && word.starts_with(|c: char| c.is_ascii_digit());
            out.push(if glued || times { '\u{a0}' } else { ' ' });
        }
        out.push_str(word);
    }
    out
}

/// `"no product"` → `"No product"`.
pub fn capitalise(s: &str) -> String {
    let mut chars = s.chars();
    match chars.next() {
        Some(first) => first.to_uppercase().chain(chars).collect(),
        None => String::new(),
    }
}

/// `"no product"` → `"No product."`.
pub fn sentence(s: &str) -> String {
    let s = capitalise(s);
    if s.ends_with(['.', '!', '?']) {
        s
    } else {
        s + "."
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_numbers_are_digits_only() {
        assert_eq!(whole_number("2"), Some(2));
        assert_eq!(whole_number(" 10 "), Some(10));
        assert_eq!(whole_number("0"), Some(0));
        for bad in [
            "+1",
            "-1",
            "1.0",
            "1e0",
            "",
            " ",
            "0x1",
            "١",
            "1 000",
            "9999999999999999999",
        ] {
            assert_eq!(whole_number(bad), None, "{bad:?} accepted");
        }
    }

    #[test]
    fn quoted_text_is_plain_short_and_cannot_rearrange_its_sentence() {
        assert_eq!(quoted("xx yy"), "\"xx yy\"");
        assert_eq!(quoted("a\u{202E}b\nc"), "\"a\u{FFFD}b\u{FFFD}c\"");
        let long = "x".repeat(100);
        assert_eq!(quoted(&long), format!("\"{}…\"", "x".repeat(40)));
    }

    #[test]
    fn numbers_keep_their_units_on_the_same_line() {
        let nb = |s: &str| s.replace('~', "\u{a0}");
        assert_eq!(
            keep_units_together("Braided USB-C Cable, 2 m"),
            nb("Braided USB-C Cable, 2~m")
        );
        assert_eq!(
            keep_units_together("Screws 10 mm, 50 pcs"),
            nb("Screws 10~mm, 50~pcs")
        );
        assert_eq!(
            keep_units_together("Stoneware Mug, 350 ml"),
            nb("Stoneware Mug, 350~ml")
        );
        assert_eq!(keep_units_together("Mat 90 × 40 cm"), nb("Mat 90~×~40~cm"));
        assert_eq!(
            keep_units_together("Cable 240 W/40 Gbit/s"),
            nb("Cable 240~W/40~Gbit/s")
        );
        // Words that merely follow a number, and units without one, are left alone.
        assert_eq!(keep_units_together("Top 10 mugs"), "Top 10 mugs");
        assert_eq!(keep_units_together("m and g"), "m and g");
        assert_eq!(
            keep_units_together("Alpine 75 Keyboard"),
            "Alpine 75 Keyboard"
        );
        assert_eq!(keep_units_together(""), "");
    }

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
        // Invisible formatting characters too, whatever the field.
        for bad in [
            "Desk\u{200B}",
            "\u{202E}kseD",
            "\u{FEFF}Desk",
            "De\u{200D}sk",
            "soft\u{AD}hyphen",
            "tag\u{E0041}",
            "\u{2066}isolate\u{2069}",
            "می\u{200C}",
            "👩\u{200D}\u{200D}💻",
        ] {
            let err = single_line("a category", bad).unwrap_err();
            assert_eq!(
                err.to_string(),
                "a category must not contain invisible formatting characters (such as \
                 zero-width spaces, joiners or direction marks)",
                "{bad:?}"
            );
        }
        // Joiners inside words of the scripts that spell with them, and inside emoji.
        single_line("name", "می\u{200C}خواهم").unwrap();
        single_line("name", "क्\u{200D}ष").unwrap();
        single_line("name", "👩\u{200D}💻 Ada").unwrap();
        multi_line("description", "line one\r\nline two\tindented").unwrap();
        let err = multi_line("description", "nul\0here").unwrap_err();
        assert!(err.to_string().starts_with("description must not"), "{err}");
        assert!(err.to_string().contains("line breaks are fine"), "{err}");
    }
}
