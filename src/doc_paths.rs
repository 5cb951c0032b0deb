//! The docs name real files: every repository path in backticks (`src/…`, `tests/…`, …)
//! and every relative link in `README.md`, `ARCHITECTURE.md` and `docs/*.md` exists, so a
//! move or a rename that leaves a guide behind fails the build.

use std::path::{Path, PathBuf};

/// Where paths the docs name start.
const ROOTS: &[&str] = &[
    "src/",
    "tests/",
    "scripts/",
    "migrations/",
    "deploy/",
    "static/",
    "templates/",
    "docs/",
    ".ci/",
    ".sqlx/",
];

fn docs(root: &Path) -> Vec<PathBuf> {
    let mut found = vec![root.join("README.md"), root.join("ARCHITECTURE.md")];
    for entry in std::fs::read_dir(root.join("docs")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "md") {
            found.push(path);
        }
    }
    found
}

/// The repository paths `text` names in backticks (up to a `:line`, `#anchor` or `(`),
/// and its relative link targets (without their `#anchor`).
fn named(text: &str) -> (Vec<String>, Vec<String>) {
    let mut paths = Vec::new();
    for (i, span) in text.split('`').enumerate() {
        if i % 2 == 1 && ROOTS.iter().any(|r| span.starts_with(r)) && !span.contains(' ') {
            let end = span
                .find([':', '#', '(', '*', '{', '<'])
                .unwrap_or(span.len());
            paths.push(span[..end].to_string());
        }
    }
    let mut links = Vec::new();
    for (i, _) in text.match_indices("](") {
        let rest = &text[i + 2..];
        let target = &rest[..rest.find(')').unwrap_or(rest.len())];
        let target = target.split('#').next().unwrap_or("");
        if !target.is_empty() && !target.contains("://") && !target.starts_with("mailto:") {
            links.push(target.to_string());
        }
    }
    (paths, links)
}

#[test]
fn every_path_and_link_in_the_docs_exists() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut missing = Vec::new();
    let mut seen = 0;
    for doc in docs(root) {
        let text = std::fs::read_to_string(&doc).unwrap();
        let (paths, links) = named(&text);
        seen += paths.len() + links.len();
        let name = doc.strip_prefix(root).unwrap().display().to_string();
        for path in paths {
            if !root.join(&path).exists() {
                missing.push(format!("{name}: `{path}`"));
            }
        }
        for link in links {
            if !doc.parent().unwrap().join(&link).exists() {
                missing.push(format!("{name}: link to {link}"));
            }
        }
    }
    assert!(
        seen > 50,
        "the docs name too few paths to be read right ({seen})"
    );
    assert!(
        missing.is_empty(),
        "the docs name what does not exist:\n{}",
        missing.join("\n")
    );
}

#[test]
fn paths_and_links_are_read_as_written() {
    let (paths, links) = named(
        "see `src/checkout/place.rs:40`, `tests/api/` and `cargo test`; [a](docs/x.md#y) [b](https://e.org)",
    );
    assert_eq!(paths, ["src/checkout/place.rs", "tests/api/"]);
    assert_eq!(links, ["docs/x.md"]);
}
