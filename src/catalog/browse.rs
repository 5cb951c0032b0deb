//! Browsing the catalogue: what a shopper or API client asked for (words to search, a
//! category, an order, a page), parsed at the edge into a [`Browse`] so that nothing
//! unchecked reaches SQL.
//!
//! Search words become a prefix tsquery built here from letters and digits only
//! (`"Keyb alp"` → `keyb:* & alp:*`), so whatever a shopper types can never be read as
//! tsquery operators, and a half-typed word still finds the product.

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

    /// The order actually used: best match only means something with words to search.
    pub fn effective_sort(&self) -> Sort {
        match (self.sort, self.tsquery()) {
            (Sort::Relevance, None) => Sort::Name,
            (sort, _) => sort,
        }
    }
}

/// A category as an admin typed it: one line of 1 to 40 characters.
pub fn parse_category(raw: &str) -> Result<String, InvalidBrowse> {
    let c = raw.trim();
    crate::text::single_line("a category", c).map_err(|e| InvalidBrowse(e.to_string()))?;
    match c.chars().count() {
        1..=MAX_CATEGORY_CHARS => Ok(c.to_string()),
        n => Err(InvalidBrowse(format!(
            "a category is 1 to {MAX_CATEGORY_CHARS} characters; this one has {n}"
        ))),
    }
}

/// `"Keyb, alp!"` → `"keyb:* & alp:*"`: every run of letters and digits becomes a prefix
/// term, everything else separates them, so no tsquery syntax survives.
pub fn prefix_tsquery(q: &str) -> Option<String> {
    let terms: Vec<String> = q
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .take(MAX_WORDS)
        .map(|w| format!("{}:*", w.to_lowercase()))
        .collect();
    (!terms.is_empty()).then(|| terms.join(" & "))
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
            prefix_tsquery("a' | b:* & !c <-> (d)").as_deref(),
            Some("a:* & b:* & c:* & d:*")
        );
        assert_eq!(prefix_tsquery("café").as_deref(), Some("café:*"));
        assert_eq!(prefix_tsquery("  !!  "), None);
        assert_eq!(
            prefix_tsquery("a b c d e f g h i j")
                .unwrap()
                .matches(":*")
                .count(),
            8
        );
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
}
