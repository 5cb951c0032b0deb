//! Browsing the catalogue: what a shopper or API client asked for (words to search, a
//! category, an order, a page), parsed at the edge into a [`Browse`] so that nothing
//! unchecked reaches SQL.
//!
//! Search words become a prefix tsquery built here from letters and digits only
//! (`"Keyb alp"` → `keyb:* & alp:*`), so whatever a shopper types can never be read as
//! tsquery operators, and a half-typed word still finds the product. A number glued to its
//! unit also finds the two apart (`240w` → `(240w:* | 240:* <-> w:*)`: "240W" and "240 W"),
//! and the words PostgreSQL's `english` configuration leaves out (`a`, `the`, `with`) are
//! left out here, so a search knows before it runs whether it has anything to look for
//! ([`Search`]): one with nothing (`the`, `!!`, an emoji) finds nothing and says so, rather
//! than showing the whole catalogue.

use unicode_normalization::UnicodeNormalization;

/// Products per page on the storefront and on an API page.
pub const PER_PAGE: i64 = 24;
/// The longest search, in characters.
pub const MAX_QUERY_CHARS: usize = 100;
/// The longest category name, in characters (the column's CHECK says the same).
pub const MAX_CATEGORY_CHARS: usize = 40;
/// Pages past this are refused: nobody pages this far, and the offset would cost.
pub const MAX_PAGE: i64 = 10_000;
/// At most this many words of a search are used.
const MAX_WORDS: usize = 8;

/// The order of a listing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Sort {
    /// Best match first (with words to search; otherwise by name).
    Relevance,
    Name,
    PriceLow,
    PriceHigh,
    Newest,
}

impl Sort {
    pub const ALL: [Sort; 5] = [
        Sort::Relevance,
        Sort::Name,
        Sort::PriceLow,
        Sort::PriceHigh,
        Sort::Newest,
    ];

    /// The value in a URL (`?sort=price-low`).
    pub fn as_str(self) -> &'static str {
        match self {
            Sort::Relevance => "relevance",
            Sort::Name => "name",
            Sort::PriceLow => "price-low",
            Sort::PriceHigh => "price-high",
            Sort::Newest => "newest",
        }
    }

    /// What a shopper reads in the sort menu.
    pub fn label(self) -> &'static str {
        match self {
            Sort::Relevance => "Best match",
            Sort::Name => "Name",
            Sort::PriceLow => "Price, low to high",
            Sort::PriceHigh => "Price, high to low",
            Sort::Newest => "Newest",
        }
    }
}

/// Why a listing request was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidBrowse(pub String);

/// A checked listing request.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Browse {
    /// The search as typed, trimmed (empty: no search).
    pub q: String,
    pub category: Option<String>,
    pub sort: Sort,
    /// From 1.
    pub page: i64,
}

impl Default for Browse {
    fn default() -> Self {
        Self {
            q: String::new(),
            category: None,
            sort: Sort::Relevance,
            page: 1,
        }
    }
}

impl Browse {
    /// Checks the raw query parameters; absent or empty ones take their defaults.
    pub fn parse(
        q: Option<&str>,
        category: Option<&str>,
        sort: Option<&str>,
        page: Option<&str>,
    ) -> Result<Self, InvalidBrowse> {
        let q = q.unwrap_or("").trim();
        crate::text::single_line("the search", q).map_err(|e| InvalidBrowse(e.to_string()))?;
        if q.chars().count() > MAX_QUERY_CHARS {
            return Err(InvalidBrowse(format!(
                "a search is at most {MAX_QUERY_CHARS} characters; this one has {}",
                q.chars().count()
            )));
        }
        let category = match category.map(str::trim).filter(|c| !c.is_empty()) {
            None => None,
            Some(c) => Some(parse_category(c)?),
        };
        let sort = match sort.map(str::trim).filter(|s| !s.is_empty()) {
            None => Sort::Relevance,
            Some(raw) => Sort::ALL
                .into_iter()
                .find(|s| s.as_str() == raw)
                .ok_or_else(|| {
                    InvalidBrowse(format!(
                        "{:?} is not a sort order: use one of {}",
                        raw.chars().take(40).collect::<String>(),
                        Sort::ALL.map(Sort::as_str).join(", ")
                    ))
                })?,
        };
        let page = match page.map(str::trim).filter(|p| !p.is_empty()) {
            None => 1,
            // Digits only, as the API's pattern for `page` says (`+1` is not a page).
            Some(raw) => crate::text::whole_number(raw)
                .filter(|p| (1..=MAX_PAGE).contains(p))
                .ok_or_else(|| {
                    InvalidBrowse(format!(
                        "{:?} is not a page: pages are numbered from 1 to {MAX_PAGE}",
                        raw.chars().take(40).collect::<String>()
                    ))
                })?,
        };
        Ok(Self {
            q: q.to_string(),
            category,
            sort,
            page,
        })
    }

    /// The tsquery text for the search words, or `None` when there are none to search.
    pub fn tsquery(&self) -> Option<String> {
        prefix_tsquery(&self.q)
    }

    /// What the search asks for: everything (no search), nothing, or these terms.
    pub fn search(&self) -> Search {
        match (self.q.is_empty(), self.tsquery()) {
            (true, _) => Search::Everything,
            (false, None) => Search::Nothing,
            (false, Some(terms)) => Search::Terms(terms),
        }
    }

    /// A search was typed, but nothing in it can be searched for (only words such as
    /// "the", or only signs and emoji): it finds nothing, and the page says why.
    pub fn nothing_to_search(&self) -> bool {
        self.search() == Search::Nothing
    }

    /// The order actually used: best match only means something with words to search.
    pub fn effective_sort(&self) -> Sort {
        match (self.sort, self.tsquery()) {
            (Sort::Relevance, None) => Sort::Name,
            (sort, _) => sort,
        }
    }
}

/// What a listing's search asks for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Search {
    /// No search: every product (of the category).
    Everything,
    /// A search with no term to look for: no product.
    Nothing,
    /// The tsquery text of the terms ([`prefix_tsquery`]).
    Terms(String),
}

/// A category as an admin typed it (or a shopper asks for it): one line of 1 to 40
/// characters, without invisible formatting characters ([`crate::text::single_line`]),
/// and NFKC-normalised, so that what reads as one name is one category: a composed and a
/// decomposed "Café", or a full-width "Ｄｅｓｋ" and "Desk". (Spellings that differ only
/// in case are one category too: [`super::db::set_category`] keeps the shelf's spelling.)
pub fn parse_category(raw: &str) -> Result<String, InvalidBrowse> {
    crate::text::single_line("a category", raw).map_err(|e| InvalidBrowse(e.to_string()))?;
    let normalised: String = raw.nfkc().collect();
    let c = normalised.trim();
    match c.chars().count() {
        1..=MAX_CATEGORY_CHARS => Ok(c.to_string()),
        n => Err(InvalidBrowse(format!(
            "a category is 1 to {MAX_CATEGORY_CHARS} characters; this one has {n}"
        ))),
    }
}

/// The words PostgreSQL's `english` text-search configuration leaves out of a query
/// (its `english.stop`): a term made of one of them finds nothing, so it is dropped here,
/// as PostgreSQL would, and a search of nothing else has nothing to search for.
/// (`every_stop_word_is_one_postgresql_leaves_out` in the integration tests holds the two
/// lists together.)
pub const STOP_WORDS: &[&str] = &[
    "i",
    "me",
    "my",
    "myself",
    "we",
    "our",
    "ours",
    "ourselves",
    "you",
    "your",
    "yours",
    "yourself",
    "yourselves",
    "he",
    "him",
    "his",
    "himself",
    "she",
    "her",
    "hers",
    "herself",
    "it",
    "its",
    "itself",
    "they",
    "them",
    "their",
    "theirs",
    "themselves",
    "what",
    "which",
    "who",
    "whom",
    "this",
    "that",
    "these",
    "those",
    "am",
    "is",
    "are",
    "was",
    "were",
    "be",
    "been",
    "being",
    "have",
    "has",
    "had",
    "having",
    "do",
    "does",
    "did",
    "doing",
    "a",
    "an",
    "the",
    "and",
    "but",
    "if",
    "or",
    "because",
    "as",
    "until",
    "while",
    "of",
    "at",
    "by",
    "for",
    "with",
    "about",
    "against",
    "between",
    "into",
    "through",
    "during",
    "before",
    "after",
    "above",
    "below",
    "to",
    "from",
    "up",
    "down",
    "in",
    "out",
    "on",
    "off",
    "over",
    "under",
    "again",
    "further",
    "then",
    "once",
    "here",
    "there",
    "when",
    "where",
    "why",
    "how",
    "all",
    "any",
    "both",
    "each",
    "few",
    "more",
    "most",
    "other",
    "some",
    "such",
    "no",
    "nor",
    "not",
    "only",
    "own",
    "same",
    "so",
    "than",
    "too",
    "very",
    "s",
    "t",
    "can",
    "will",
    "just",
    "don",
    "should",
    "now",
];

/// `"Keyb, alp!"` → `"keyb:* & alp:*"`: every run of letters and digits (after NFKC, so a
/// full-width "ｍｕｇ" is "mug") becomes a prefix term, everything else separates them, so
/// no tsquery syntax survives. Stop words are dropped; `None` when no term is left.
///
/// A word where digits are followed by letters (`2m`, `240w`, `12v`) is a number and its
/// unit, which product names write either way: it matches as typed or as the phrase of its
/// parts (`(2m:* | 2:* <-> m:*)`), so "2m" finds "Cable, 2 m" and "240w" finds "240 W".
pub fn prefix_tsquery(q: &str) -> Option<String> {
    let q: String = q.nfkc().collect::<String>().to_lowercase();
    let terms: Vec<String> = q
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty() && !STOP_WORDS.contains(w))
        .take(MAX_WORDS)
        .map(|w| {
            let parts = number_and_unit(w);
            match parts.len() {
                1 => format!("{w}:*"),
                _ => {
                    let phrase: Vec<String> = parts.iter().map(|p| format!("{p}:*")).collect();
                    format!("({w}:* | {})", phrase.join(" <-> "))
                }
            }
        })
        .collect();
    (!terms.is_empty()).then(|| terms.join(" & "))
}

/// `word` cut where a digit is followed by a letter: `240w` → `["240", "w"]`, `a4` and
/// `usb` stay whole (a letter before a digit is a model name, not a quantity).
fn number_and_unit(word: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut start = 0;
    let mut previous: Option<char> = None;
    for (i, c) in word.char_indices() {
        if previous.is_some_and(|p| p.is_numeric()) && c.is_alphabetic() {
            parts.push(&word[start..i]);
            start = i;
        }
        previous = Some(c);
    }
    parts.push(&word[start..]);
    parts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn search_words_become_prefix_terms_and_nothing_else() {
        assert_eq!(prefix_tsquery("keyb").as_deref(), Some("keyb:*"));
        assert_eq!(
            prefix_tsquery("  Keyb, ALP! ").as_deref(),
            Some("keyb:* & alp:*")
        );
        assert_eq!(
            prefix_tsquery("x' | b:* & !c <-> (d)").as_deref(),
            Some("x:* & b:* & c:* & d:*")
        );
        assert_eq!(prefix_tsquery("café").as_deref(), Some("café:*"));
        assert_eq!(prefix_tsquery("  !!  "), None);
        assert_eq!(prefix_tsquery("ｍｕｇ").as_deref(), Some("mug:*"));
        assert_eq!(
            prefix_tsquery("a b c d e f g h i j")
                .unwrap()
                .matches(":*")
                .count(),
            8
        );
    }

    #[test]
    fn numbers_glued_to_units_also_match_apart() {
        assert_eq!(
            prefix_tsquery("2m").as_deref(),
            Some("(2m:* | 2:* <-> m:*)")
        );
        assert_eq!(
            prefix_tsquery("cable 240W").as_deref(),
            Some("cable:* & (240w:* | 240:* <-> w:*)")
        );
        assert_eq!(
            prefix_tsquery("12v2").as_deref(),
            Some("(12v2:* | 12:* <-> v2:*)")
        );
        assert_eq!(prefix_tsquery("a4 usb3").as_deref(), Some("a4:* & usb3:*"));
        assert_eq!(prefix_tsquery("240").as_deref(), Some("240:*"));
    }

    #[test]
    fn a_search_of_only_stop_words_or_signs_has_nothing_to_search_for() {
        for nothing in ["a", "the", "with", "The A, with!", "🙂", "🙂🙂 ✓", "—"] {
            assert_eq!(prefix_tsquery(nothing), None, "{nothing:?}");
            let b = Browse::parse(Some(nothing), None, None, None).unwrap();
            assert_eq!(b.search(), Search::Nothing, "{nothing:?}");
            assert!(b.nothing_to_search());
        }
        assert_eq!(
            prefix_tsquery("mug with a handle").as_deref(),
            Some("mug:* & handle:*")
        );
        assert_eq!(Browse::default().search(), Search::Everything);
        assert!(!Browse::default().nothing_to_search());
    }

    #[test]
    fn listing_parameters_are_checked() {
        let b = Browse::parse(None, None, None, None).unwrap();
        assert_eq!(b, Browse::default());
        assert_eq!(b.effective_sort(), Sort::Name);
        let b =
            Browse::parse(Some(" mug "), Some("Coffee"), Some("price-high"), Some("2")).unwrap();
        assert_eq!(b.q, "mug");
        assert_eq!(b.category.as_deref(), Some("Coffee"));
        assert_eq!(b.sort, Sort::PriceHigh);
        assert_eq!(b.page, 2);
        assert_eq!(
            Browse::parse(Some("mug"), None, None, None)
                .unwrap()
                .effective_sort(),
            Sort::Relevance
        );

        let err = |q: Option<&str>, c: Option<&str>, s: Option<&str>, p: Option<&str>| {
            Browse::parse(q, c, s, p).unwrap_err().0
        };
        assert!(err(None, None, Some("cheapest"), None).contains("not a sort order"));
        assert!(err(None, None, None, Some("0")).contains("not a page"));
        assert!(err(None, None, None, Some("-1")).contains("not a page"));
        assert!(err(None, None, None, Some("x")).contains("not a page"));
        assert!(err(None, None, None, Some("10001")).contains("not a page"));
        let long = "k".repeat(101);
        assert!(err(Some(&long), None, None, None).contains("at most 100"));
        assert!(err(Some("a\0b"), None, None, None).contains("control characters"));
        let long = "c".repeat(41);
        assert!(err(None, Some(&long), None, None).contains("1 to 40"));
    }

    #[test]
    fn categories_that_read_the_same_are_the_same() {
        assert_eq!(parse_category(" Cafe\u{301} ").unwrap(), "Café");
        assert_eq!(parse_category("Café").unwrap(), "Café");
        assert_eq!(parse_category("Ｄｅｓｋ").unwrap(), "Desk");
        let err = parse_category("Desk\u{200B}").unwrap_err().0;
        assert!(
            err.starts_with("a category must not contain invisible formatting"),
            "{err}"
        );
    }
}
