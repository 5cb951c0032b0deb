//! axe-core's WCAG 2.1 A and AA rules, run in the page the browser shows.
//!
//! The script is the `axe-core` package pinned in `tools/axe/package-lock.json`, which
//! `make deps-test` installs (`npm ci`); WebDriver evaluates it in the page, so the
//! page's Content-Security-Policy, which allows no inline script, does not stand in
//! its way. A page passes with no serious or critical violation; the moderate and minor
//! ones are printed with the test's output.

use std::sync::OnceLock;

use serde::Deserialize;

/// The rules run: WCAG 2.0 and 2.1, levels A and AA.
const TAGS: [&str; 4] = ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa"];

/// One rule a page breaks, with the elements that break it.
#[derive(Debug, Deserialize)]
pub struct Violation {
    pub id: String,
    /// `minor`, `moderate`, `serious` or `critical`.
    pub impact: String,
    pub help: String,
    /// A CSS selector per offending element.
    pub targets: Vec<String>,
}

impl Violation {
    /// Serious and critical violations fail a page.
    pub fn blocks(&self) -> bool {
        matches!(self.impact.as_str(), "serious" | "critical")
    }
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} ({}): {} — {}",
            self.id,
            self.impact,
            self.help,
            self.targets.join(", ")
        )
    }
}

/// axe-core's script, read once per run.
fn script() -> &'static str {
    static SCRIPT: OnceLock<String> = OnceLock::new();
    SCRIPT.get_or_init(|| {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tools/axe/node_modules/axe-core/axe.min.js");
        let script = std::fs::read_to_string(&path).unwrap_or_else(|e| {
            panic!(
                "{}: {e}; `make deps-test` installs axe-core (npm ci in tools/axe)",
                path.display()
            )
        });
        assert!(script.starts_with("/*! axe v4."), "axe-core 4.x");
        script
    })
}

/// The WCAG A/AA violations of the page the browser shows now.
pub async fn violations(b: &fantoccini::Client) -> Vec<Violation> {
    violations_except(b, None).await
}

/// [`violations`] outside the element `exclude` matches (a payment provider's card
/// fields, which are the provider's markup, not the shop's).
pub async fn violations_except(b: &fantoccini::Client, exclude: Option<&str>) -> Vec<Violation> {
    // Loaded once per document: a page that already has it (the same page audited at
    // another window size) keeps its copy.
    let loaded = b
        .execute("return typeof window.axe === 'object';", vec![])
        .await
        .unwrap();
    if loaded != serde_json::Value::Bool(true) {
        b.execute(&format!("{}\nreturn true;", script()), vec![])
            .await
            .expect("axe-core loads");
    }
    let found = b
        .execute_async(
            "const [tags, exclude, done] = arguments;
             const context = exclude ? {exclude: [[exclude]]} : document;
             axe.run(context, {runOnly: {type: 'tag', values: tags}, resultTypes: ['violations']})
               .then(r => done({violations: r.violations.map(v => ({
                   id: v.id, impact: v.impact || 'minor', help: v.help,
                   targets: v.nodes.map(n => n.target.join(' '))}))}))
               .catch(e => done({error: String(e)}));",
            vec![serde_json::json!(TAGS), serde_json::json!(exclude)],
        )
        .await
        .unwrap();
    assert!(found.get("error").is_none(), "axe-core failed: {found}");
    serde_json::from_value(found["violations"].clone()).unwrap()
}

/// What every page has besides axe-core's rules: the skip link as its first Tab stop,
/// leading to the content, and a label on every form field.
async fn structure(b: &fantoccini::Client) -> Vec<String> {
    let found = b
        .execute(
            r##"
            const out = [];
            const stops = [...document.querySelectorAll(
              'a[href], button, input:not([type=hidden]), select, textarea, [tabindex]')]
              .filter(el => el.tabIndex >= 0 && !el.disabled);
            const first = stops[0];
            if (!first || !first.matches('a.skip[href="#main"]') ||
                first.textContent.trim() !== 'Skip to content')
              out.push(`the first Tab stop is ${first ? first.outerHTML.slice(0, 100) : 'missing'}`);
            if (!document.getElementById('main')) out.push('no #main to skip to');
            for (const field of document.querySelectorAll('input:not([type=hidden]), select, textarea'))
              if (field.labels.length === 0 && !field.getAttribute('aria-label'))
                out.push(`${field.outerHTML.slice(0, 100)} has no label`);
            return out;
            "##,
            vec![],
        )
        .await
        .unwrap();
    serde_json::from_value(found).unwrap()
}

/// Runs axe-core on the page shown as `page`, prints what it finds, and returns the
/// serious and critical violations, and what [`structure`] misses, as lines of a report.
pub async fn audit(b: &fantoccini::Client, page: &str) -> Vec<String> {
    let missing = structure(b).await;
    let found = violations(b).await;
    let counts = |blocking: bool| found.iter().filter(|v| v.blocks() == blocking).count();
    println!(
        "axe {page}: {} serious or critical, {} moderate or minor",
        counts(true),
        counts(false)
    );
    for v in found.iter().filter(|v| !v.blocks()) {
        println!("  {v}");
    }
    found
        .iter()
        .filter(|v| v.blocks())
        .map(|v| v.to_string())
        .chain(missing)
        .map(|v| format!("{page}: {v}"))
        .collect()
}
