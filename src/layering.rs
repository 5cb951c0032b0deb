//! The module graph, checked: no two modules below `http` import each other, directly or
//! around a longer loop. Edges are every `crate::x` path in `src/` (use lines and inline
//! paths, comments left out); a loop shows as a strongly connected component.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Modules that may sit in a loop with each other: the HTTP layer and its wiring.
const ABOVE_THE_DOMAIN: &[&str] = &["http", "startup"];

/// `module → modules it names`, for every top-level module of `src/`.
fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut stack = vec![src.clone()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let rel = path.strip_prefix(&src).unwrap();
            let first = rel
                .components()
                .next()
                .unwrap()
                .as_os_str()
                .to_string_lossy();
            let from = first.trim_end_matches(".rs").to_string();
            let text = std::fs::read_to_string(&path).unwrap();
            let code: String = text
                .lines()
                .map(|l| l.split("//").next().unwrap_or(""))
                .collect::<Vec<_>>()
                .join("\n");
            let targets = edges.entry(from.clone()).or_default();
            for to in named_modules(&code) {
                if to != from {
                    targets.insert(to);
                }
            }
        }
    }
    edges
}

/// The top-level modules `code` names: `crate::a::…` and each item of `crate::{a, b::c}`.
fn named_modules(code: &str) -> BTreeSet<String> {
    let word = |s: &str| -> String {
        s.trim()
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut found = BTreeSet::new();
    for (i, _) in code.match_indices("crate::") {
        let rest = &code[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // Top-level items of the group, up to its closing brace.
            let (mut depth, mut item) = (0, String::new());
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        found.insert(word(&item));
                        item.clear();
                        continue;
                    }
                    _ => {}
                }
                item.push(c);
            }
            found.insert(word(&item));
        } else {
            found.insert(word(rest));
        }
    }
    found.retain(|m| !m.is_empty() && m.chars().next().is_some_and(|c| c.is_ascii_lowercase()));
    found
}

/// The strongly connected components of more than one module (Tarjan).
fn loops(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<BTreeSet<String>> {
    struct Walk<'a> {
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        found: Vec<BTreeSet<String>>,
    }
    fn visit<'a>(w: &mut Walk<'a>, v: &'a str) {
        let n = w.index.len();
        w.index.insert(v, n);
        w.low.insert(v, n);
        w.stack.push(v);
        for to in w.edges.get(v).into_iter().flatten() {
            let to = to.as_str();
            if !w.index.contains_key(to) {
                visit(w, to);
                let low = w.low[v].min(w.low[to]);
                w.low.insert(v, low);
            } else if w.stack.contains(&to) {
                let low = w.low[v].min(w.index[to]);
                w.low.insert(v, low);
            }
        }
        if w.low[v] == w.index[v] {
            let mut component = BTreeSet::new();
            while let Some(m) = w.stack.pop() {
                component.insert(m.to_string());
                if m == v {
                    break;
                }
            }
            if component.len() > 1 {
                w.found.push(component);
            }
        }
    }
    let mut w = Walk {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        found: Vec::new(),
    };
    for v in edges.keys() {
        if !w.index.contains_key(v.as_str()) {
            visit(&mut w, v);
        }
    }
    w.found
}

#[test]
fn no_two_modules_below_http_import_each_other() {
    let edges = graph();
    assert!(
        edges["checkout"].contains("orders") && edges["holds"].contains("orders"),
        "the walk found too little: {edges:?}"
    );
    let bad: Vec<_> = loops(&edges)
        .into_iter()
        .filter(|c| c.iter().any(|m| !ABOVE_THE_DOMAIN.contains(&m.as_str())))
        .collect();
    assert!(bad.is_empty(), "modules that import each other: {bad:?}");
}

#[test]
fn a_loop_is_found_however_long() {
    let edges: BTreeMap<String, BTreeSet<String>> =
        [("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")]
            .into_iter()
            .map(|(f, t)| (f.to_string(), BTreeSet::from([t.to_string()])))
            .fold(BTreeMap::new(), |mut m, (f, t)| {
                m.entry(f).or_insert_with(BTreeSet::new).extend(t);
                m
            });
    let found = loops(&edges);
    let abc: BTreeSet<String> = ["a", "b", "c"].map(String::from).into();
    assert_eq!(found, vec![abc]);
    assert_eq!(
        named_modules("use crate::{orders::{Order, db}, holds}; x = crate::pg::is_transient(e);"),
        ["holds", "orders", "pg"].map(String::from).into()
    );
}
