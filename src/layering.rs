//! The module graph, checked: no two modules of one folder import each other, directly or
//! around a longer loop, at any depth — the crate's top-level modules, and the files and
//! subfolders inside each folder. So each folder runs one way, and a new loop fails the
//! build. A folder's own module (`mod.rs`) composes its children and re-exports them; its
//! children may name its items, and its arrows down are not counted.
//!
//! Edges are every path in `src/` (use lines and inline paths, comments and `#[cfg(test)]`
//! modules left out), `crate::…`, `super::…` and `self::…` alike, resolved to a module.
//! Between two modules of one folder, a path that names a sibling module is an edge to it;
//! one that names an item of the folder's own module (or something it re-exports) is an
//! edge to that module. A loop shows as a strongly connected component.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// A module's path from the crate root: `["checkout", "batch", "db"]`.
type ModPath = Vec<String>;

/// The name a folder's own module goes by among its children.
const OWN: &str = "mod";

/// Every module of `src/` with its code (comments and test modules left out).
fn modules() -> BTreeMap<ModPath, String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut found = BTreeMap::new();
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
            let rel = path.strip_prefix(&src).unwrap().with_extension("");
            let mut module: ModPath = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if matches!(
                module.last().map(String::as_str),
                Some("mod" | "lib" | "main")
            ) {
                module.pop();
            }
            let text = std::fs::read_to_string(&path).unwrap();
            found.insert(module, code_of(&text));
        }
    }
    found
}

/// `text` without comments and without its `#[cfg(test)]` modules (whose `super` is the
/// file's own module, not its parent).
fn code_of(text: &str) -> String {
    let mut code = String::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        if line.trim() == "#[cfg(test)]"
            && lines
                .peek()
                .is_some_and(|next| next.trim_start().starts_with("mod ") && next.ends_with('{'))
        {
            // Skip the module: up to the line that closes it at its own indentation.
            let indent = line.len() - line.trim_start().len();
            let close = format!("{}}}", " ".repeat(indent));
            for inner in lines.by_ref() {
                if inner == close {
                    break;
                }
            }
            continue;
        }
        code.push_str(line.split("//").next().unwrap_or(""));
        code.push('\n');
    }
    code
}

/// The paths `code` names, as written from `module`, made absolute: `crate::a::{b, c::d}`
/// gives `a::b` and `a::c::d`; `super::x` in `a::b` gives `a::x`; `c::x`, where `c` is one
/// of `module`'s `children`, gives `a::b::c::x`.
fn named_paths(module: &[String], code: &str, children: &BTreeSet<String>) -> Vec<ModPath> {
    let ident = |s: &str| -> usize {
        s.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(s.len())
    };
    let mut found = Vec::new();
    let bytes = code.as_bytes();
    let mut i = 0;
    while i < code.len() {
        let rest = &code[i..];
        let at_start = i == 0
            || !(bytes[i - 1].is_ascii_alphanumeric()
                || bytes[i - 1] == b'_'
                || bytes[i - 1] == b':');
        let root = if !at_start {
            None
        } else if let Some(r) = rest.strip_prefix("crate::") {
            Some((Vec::new(), r))
        } else if rest.starts_with("super::") {
            let mut base = module.to_vec();
            let mut r = rest;
            while let Some(after) = r.strip_prefix("super::") {
                base.pop();
                r = after;
            }
            Some((base, r))
        } else if let Some(r) = rest.strip_prefix("self::") {
            Some((module.to_vec(), r))
        } else if children.contains(&rest[..ident(rest)]) && rest[ident(rest)..].starts_with("::") {
            Some((module.to_vec(), rest))
        } else {
            None
        };
        let Some((base, tail)) = root else {
            i += rest.chars().next().map_or(1, char::len_utf8);
            continue;
        };
        expand(&base, tail, &ident, &mut found);
        i = (code.len() - tail.len()).max(i + 1);
    }
    found
}

/// Adds to `found` the paths `tail` spells after `base`, groups expanded.
fn expand(base: &[String], tail: &str, ident: &dyn Fn(&str) -> usize, found: &mut Vec<ModPath>) {
    let mut path = base.to_vec();
    let mut rest = tail;
    loop {
        if let Some(group) = rest.strip_prefix('{') {
            // Each top-level item of the group, up to its closing brace.
            let (mut depth, mut start) = (0, 0);
            for (j, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => {
                        expand(&path, group[start..j].trim_start(), ident, found);
                        return;
                    }
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        expand(&path, group[start..j].trim_start(), ident, found);
                        start = j + 1;
                    }
                    _ => {}
                }
            }
            return;
        }
        let n = ident(rest);
        if n == 0 {
            break;
        }
        if &rest[..n] != "self" {
            path.push(rest[..n].to_string());
        }
        match rest[n..].strip_prefix("::") {
            Some(after) => rest = after,
            None => break,
        }
    }
    if path.len() > base.len() {
        found.push(path);
    }
}

/// `folder → (module → modules it names)`: for each folder (the crate is `[]`), the edges
/// between its children, by child name ([`OWN`] for the folder's own module).
fn graphs() -> BTreeMap<ModPath, BTreeMap<String, BTreeSet<String>>> {
    let modules = modules();
    let mut graphs: BTreeMap<ModPath, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for (from, code) in &modules {
        let children: BTreeSet<String> = modules
            .keys()
            .filter(|m| m.len() == from.len() + 1 && m.starts_with(from))
            .map(|m| m[from.len()].clone())
            .collect();
        for target in named_paths(from, code, &children) {
            // The deepest folder holding both; then which of its children each is in.
            let common = from.iter().zip(&target).take_while(|(a, b)| a == b).count();
            if common == target.len() {
                continue; // an ancestor of `from` (or itself), as `super::*` names
            }
            let folder: ModPath = from[..common].to_vec();
            let child = |path: &[String]| -> String {
                match path.get(common) {
                    Some(name) if modules.contains_key(&path[..=common]) => name.clone(),
                    _ => OWN.to_string(),
                }
            };
            let (a, b) = (child(from), child(&target));
            // The folder's own module composes its children (and re-exports them): its
            // arrows down are how a folder is built, not a loop.
            if a != b && a != OWN {
                graphs
                    .entry(folder)
                    .or_default()
                    .entry(a)
                    .or_default()
                    .insert(b);
            }
        }
    }
    graphs
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
fn no_two_modules_of_one_folder_import_each_other() {
    let graphs = graphs();
    let top = &graphs[&Vec::new()];
    let checkout = &graphs[&vec!["checkout".to_string()]];
    assert!(
        top["checkout"].contains("orders")
            && top["holds"].contains("orders")
            && !checkout.is_empty(),
        "the walk found too little: {graphs:?}"
    );
    let bad: Vec<String> = graphs
        .iter()
        .flat_map(|(folder, edges)| {
            let at = if folder.is_empty() {
                "src".to_string()
            } else {
                format!("src/{}", folder.join("/"))
            };
            loops(edges).into_iter().map(move |c| {
                let arrows: Vec<String> = c
                    .iter()
                    .flat_map(|from| {
                        edges[from]
                            .iter()
                            .filter(|to| c.contains(*to))
                            .map(move |to| format!("{from} → {to}"))
                    })
                    .collect();
                format!("{at}: {}", arrows.join(", "))
            })
        })
        .collect();
    assert!(
        bad.is_empty(),
        "modules that import each other:\n{}",
        bad.join("\n")
    );
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
}

#[test]
fn paths_are_read_as_written_from_where_they_are() {
    let at: ModPath = ["checkout", "batch", "decide"].map(String::from).to_vec();
    let code = "use crate::{orders::{Order, db}, holds};\nuse super::{self, db::Row};\n\
                x = crate::pg::is_transient(e); y = super::super::place::MAX; rows::read(); db::x";
    let children = BTreeSet::from(["rows".to_string()]);
    let named: BTreeSet<String> = named_paths(&at, code, &children)
        .into_iter()
        .map(|p| p.join("::"))
        .collect();
    let want = [
        "orders::Order",
        "orders::db",
        "holds",
        "pg::is_transient",
        "checkout::batch::db::Row",
        "checkout::place::MAX",
        "checkout::batch::decide::rows::read",
    ];
    assert_eq!(named, want.map(String::from).into());
    let tested = "fn a() {}\n#[cfg(test)]\nmod tests {\n    use super::*;\n    use crate::x::y;\n}\nuse crate::z;\n";
    assert_eq!(code_of(tested), "fn a() {}\nuse crate::z;\n");
}
