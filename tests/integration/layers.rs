//! The top-level modules of `src/` form a DAG (docs/architecture.md): a module uses only modules
//! below it. Counted as a reader sees it: a file with its folder is one module (`src/plan.rs`
//! and `src/plan/…` are `plan`), an edge is a `crate::<module>` path in code, and comments,
//! doc links and test code (`#[cfg(test)]` modules, inline or in their own files) are left
//! out. `main.rs` (the binary) and `lib.rs` (the list of modules) are not modules of the graph.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::common::repo;

/// Edges between top-level modules: (from, to) → the first `file:line` naming it.
type Graph = BTreeMap<(String, String), String>;

/// The top-level module a file under `src/` belongs to.
fn module_of(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).unwrap();
    let first = rel
        .components()
        .next()
        .unwrap()
        .as_os_str()
        .to_string_lossy();
    first.trim_end_matches(".rs").to_string()
}

/// Every `.rs` file under `dir`, sorted.
fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// The files `file` declares as `#[cfg(test)] mod name;` (test code in files of their own),
/// a `#[path = "…"]` between the two lines included (relative to `file`'s directory).
fn test_files(file: &Path, text: &str) -> Vec<PathBuf> {
    let lines: Vec<&str> = text.lines().map(str::trim).collect();
    let dir = if file.file_name().is_some_and(|n| n == "mod.rs") {
        file.parent().unwrap().to_path_buf()
    } else {
        file.with_extension("")
    };
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        if *line != "#[cfg(test)]" {
            continue;
        }
        let mut path = None;
        for next in &lines[i + 1..] {
            if let Some(p) = next
                .strip_prefix("#[path = \"")
                .and_then(|p| p.strip_suffix("\"]"))
            {
                path = Some(file.parent().unwrap().join(p));
                continue;
            }
            if next.starts_with("#[") {
                continue;
            }
            if let Some(name) = next
                .strip_prefix("mod ")
                .or_else(|| next.strip_prefix("pub mod "))
                .and_then(|n| n.strip_suffix(';'))
            {
                match path {
                    Some(p) => out.push(p),
                    None => {
                        out.push(dir.join(format!("{name}.rs")));
                        out.push(dir.join(name).join("mod.rs"));
                    }
                }
            }
            break;
        }
    }
    out
}

/// The code of a file without comments and without inline `#[cfg(test)] mod … { … }` blocks
/// (rustfmt puts the closing brace at the `mod` line's indentation), as (line number, text).
fn code_lines(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut skip_until: Option<String> = None;
    let mut test_attr = false;
    for (i, line) in text.lines().enumerate() {
        if let Some(close) = &skip_until {
            if line == close {
                skip_until = None;
            }
            continue;
        }
        let t = line.trim_start();
        if t == "#[cfg(test)]" {
            test_attr = true;
            continue;
        }
        if test_attr && (t.starts_with("mod ") || t.starts_with("pub mod ")) && t.ends_with('{') {
            let indent = &line[..line.len() - t.len()];
            skip_until = Some(format!("{indent}}}"));
            test_attr = false;
            continue;
        }
        test_attr = false;
        if t.starts_with("//") {
            continue;
        }
        // A trailing comment (a `//` outside a string literal is good enough here: no code
        // path of ours holds "crate::" inside a string).
        let code = match line.find("//") {
            Some(at) if !line[..at].contains('"') => &line[..at],
            _ => line,
        };
        out.push((i + 1, code.to_string()));
    }
    out
}

/// The top-level modules one line of code names through `crate::` (grouped `use crate::{a,
/// b::c}` included, when the group is on the line or the lines after it).
fn named(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        let before = rest[..at].chars().last();
        let after = &rest[at + "crate::".len()..];
        rest = after;
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$') {
            continue;
        }
        if let Some(group) = after.strip_prefix('{') {
            let mut depth = 0;
            let mut item = String::new();
            let mut items = Vec::new();
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => items.push(std::mem::take(&mut item)),
                    _ if depth == 0 => item.push(c),
                    _ => {}
                }
            }
            items.push(item);
            for i in items {
                let name: String = i
                    .trim()
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty() {
                    out.push(name);
                }
            }
            continue;
        }
        let name: String = after
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if !name.is_empty() {
            out.push(name);
        }
    }
    out
}

/// The module graph of `src`.
fn graph(src: &Path) -> (BTreeSet<String>, Graph) {
    let all = files(src);
    let mut tests = BTreeSet::new();
    let texts: Vec<(PathBuf, String)> = all
        .iter()
        .map(|f| (f.clone(), std::fs::read_to_string(f).unwrap()))
        .collect();
    for (f, text) in &texts {
        tests.extend(test_files(f, text));
    }
    let mut modules = BTreeSet::new();
    let mut edges = Graph::new();
    for (f, text) in &texts {
        let m = module_of(src, f);
        if m == "main" || m == "lib" {
            continue;
        }
        modules.insert(m.clone());
        if tests.contains(f) {
            continue;
        }
        // Multi-line `use crate::{…}` groups: join a line ending in `{` with what follows.
        let lines = code_lines(text);
        for (n, (line_no, code)) in lines.iter().enumerate() {
            let mut joined = code.clone();
            if code.trim_end().ends_with("crate::{") {
                for (_, more) in &lines[n + 1..] {
                    joined.push_str(more);
                    if more.contains('}') {
                        break;
                    }
                }
            }
            for to in named(&joined) {
                if to != m && to != "self" && to != "super" {
                    let rel = f.strip_prefix(src.parent().unwrap()).unwrap();
                    edges
                        .entry((m.clone(), to))
                        .or_insert_with(|| format!("{}:{line_no}", rel.display()));
                }
            }
        }
    }
    (modules, edges)
}

/// Strongly connected components with more than one module (Tarjan), each sorted.
fn knots(modules: &BTreeSet<String>, edges: &Graph) -> Vec<Vec<String>> {
    struct T<'a> {
        adj: BTreeMap<&'a str, Vec<&'a str>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        next: usize,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(t: &mut T<'a>, v: &'a str) {
        t.index.insert(v, t.next);
        t.low.insert(v, t.next);
        t.next += 1;
        t.stack.push(v);
        t.on.insert(v);
        for w in t.adj.get(v).cloned().unwrap_or_default() {
            if !t.index.contains_key(w) {
                visit(t, w);
                let l = t.low[v].min(t.low[w]);
                t.low.insert(v, l);
            } else if t.on.contains(w) {
                let l = t.low[v].min(t.index[w]);
                t.low.insert(v, l);
            }
        }
        if t.low[v] == t.index[v] {
            let mut comp = Vec::new();
            while let Some(w) = t.stack.pop() {
                t.on.remove(w);
                comp.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                t.out.push(comp);
            }
        }
    }
    let mut t = T {
        adj: BTreeMap::new(),
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        next: 0,
        out: Vec::new(),
    };
    for (from, to) in edges.keys() {
        if modules.contains(to) {
            t.adj.entry(from.as_str()).or_default().push(to.as_str());
        }
    }
    for m in modules {
        if !t.index.contains_key(m.as_str()) {
            visit(&mut t, m);
        }
    }
    t.out
}

/// Explains a knot: each of its edges with the place that makes it.
fn explain(knot: &[String], edges: &Graph) -> String {
    let mut s = format!("import cycle among {knot:?}:\n");
    for ((from, to), at) in edges {
        if knot.contains(from) && knot.contains(to) {
            s.push_str(&format!("  {from} -> {to}  ({at})\n"));
        }
    }
    s
}

#[test]
fn the_top_level_modules_form_a_dag() {
    let src = repo().join("src");
    let (modules, edges) = graph(&src);
    assert!(modules.len() > 10, "{modules:?}");
    let found = knots(&modules, &edges);
    let text: String = found.iter().map(|k| explain(k, &edges)).collect();
    assert!(found.is_empty(), "{text}");
}

/// The check can fail: a tree with a cycle (`a -> b -> a`, through a grouped `use` and a path
/// in code) is reported with both edges, while test code and comments naming `crate::a` are
/// not edges.
#[test]
fn a_cycle_is_reported_with_its_edges() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    std::fs::create_dir_all(src.join("b")).unwrap();
    std::fs::write(src.join("lib.rs"), "pub mod a;\npub mod b;\npub mod c;\n").unwrap();
    std::fs::write(src.join("a.rs"), "use crate::{\n    b::Thing,\n};\n").unwrap();
    std::fs::write(
        src.join("b.rs"),
        "//! See [`crate::c`].\nmod inner;\n#[cfg(test)]\nmod tests;\n#[cfg(test)]\n#[path = \"b_tests.rs\"]\nmod other;\n#[cfg(test)]\nmod more {\n    use crate::c::X;\n}\n",
    )
    .unwrap();
    std::fs::write(
        src.join("b/inner.rs"),
        "fn f() { crate::a::g(); } // crate::c\n",
    )
    .unwrap();
    std::fs::write(src.join("b/tests.rs"), "use crate::c::Y;\n").unwrap();
    std::fs::write(src.join("b_tests.rs"), "use crate::c::W;\n").unwrap();
    std::fs::write(src.join("c.rs"), "use crate::b::Z;\n").unwrap();
    let (modules, edges) = graph(&src);
    assert_eq!(modules.len(), 4, "{modules:?}");
    let found = knots(&modules, &edges);
    assert_eq!(found, [vec!["a".to_string(), "b".to_string()]]);
    let text = explain(&found[0], &edges);
    assert!(text.contains("a -> b  (src/a.rs:1)"), "{text}");
    assert!(text.contains("b -> a  (src/b/inner.rs:1)"), "{text}");
    assert!(
        !edges.contains_key(&("b".to_string(), "c".to_string())),
        "{edges:?}"
    );
}
