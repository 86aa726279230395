//! The top-level modules of `src/` in layers: docs/architecture.md's table of layers is read
//! here, and a module may use only modules of its own layer or a layer below; the modules form a
//! DAG (no cycle, within a layer either).
//!
//! Counted as rustc sees the crate: the module tree is followed from `lib.rs` through every `mod`
//! item (`#[path]` included), a file with its folder is one module (`src/plan.rs` and
//! `src/plan/…` are `plan`), and an edge is a path in code that reaches another top-level
//! module: a `use` tree (`use crate::{a::X, b::{Y, Z}}` names `a` and `b`), a path anywhere in
//! an item, an expression, a type or a pattern (`crate::a::f()`), a `super::…` chain that climbs
//! to the crate root and down into another module, and `crate::a` (or `$crate::a`) in the tokens
//! of a macro call or a `macro_rules!` body. Not edges: comments and doc links, and test code
//! (items under `#[cfg(test)]`, inline or in files of their own, which the walk never enters).
//! `lib.rs` is the list of modules and holds nothing else; `main.rs`, the binary, sits above
//! every layer and is a crate of its own (it reaches the library as `slicelet::…`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use proc_macro2::{TokenStream, TokenTree};
use syn::visit::{self, Visit};

use crate::common::repo;

/// Edges between modules: (from, to) → a `file:line` that makes it (the first path, in path
/// order, from one to the other).
type Graph = BTreeMap<(String, String), String>;

/// The layers, bottom first: each one's top-level modules.
type Layers = Vec<Vec<String>>;

/// Whether a `cfg` predicate holds only in test builds (`test`, `all(test, …)`, `any` of such).
fn test_only_predicate(meta: &syn::Meta) -> bool {
    match meta {
        syn::Meta::Path(p) => p.is_ident("test"),
        syn::Meta::List(list) => {
            let nested = list
                .parse_args_with(
                    syn::punctuated::Punctuated::<syn::Meta, syn::Token![,]>::parse_terminated,
                )
                .unwrap_or_default();
            if list.path.is_ident("all") {
                nested.iter().any(test_only_predicate)
            } else if list.path.is_ident("any") {
                !nested.is_empty() && nested.iter().all(test_only_predicate)
            } else {
                false
            }
        }
        syn::Meta::NameValue(_) => false,
    }
}

/// Whether attributes put an item in test builds only (`#[cfg(test)]` and the like).
pub(crate) fn test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && a.parse_args::<syn::Meta>()
                .is_ok_and(|m| test_only_predicate(&m))
    })
}

/// The file a `#[path = "…"]` attribute names, if any.
fn path_attr(attrs: &[syn::Attribute]) -> Option<String> {
    attrs.iter().find_map(|a| match &a.meta {
        syn::Meta::NameValue(nv) if nv.path.is_ident("path") => match &nv.value {
            syn::Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Str(s),
                ..
            }) => Some(s.value()),
            _ => None,
        },
        _ => None,
    })
}

/// A module file still to read: its path, its module path and the folder its own `mod x;`
/// items resolve in.
struct Pending {
    file: PathBuf,
    module: Vec<String>,
    dir: PathBuf,
}

/// Walks one file: records the module paths its code names and queues the files of its `mod`
/// items.
struct Walker<'a> {
    /// `src/`'s parent, for the `file:line` of an edge.
    root: &'a Path,
    file: &'a Path,
    /// The module path of the item being visited (inline modules pushed onto the file's).
    module: Vec<String>,
    /// The folder a `mod x;` resolves in, per inline module depth.
    dirs: Vec<PathBuf>,
    out: &'a mut Walk,
}

/// What a walk of the crate found.
#[derive(Default)]
struct Walk {
    /// Every module path outside test code (`["dra", "slices"]`).
    modules: BTreeSet<Vec<String>>,
    /// (from module, absolute path named) → the first `file:line` naming it.
    uses: BTreeMap<(Vec<String>, Vec<String>), String>,
    pending: Vec<Pending>,
    /// Every file read, `lib.rs` first: the library's production source.
    files: Vec<PathBuf>,
    errors: Vec<String>,
}

impl Walker<'_> {
    fn at(&self, span: proc_macro2::Span) -> String {
        let rel = self.file.strip_prefix(self.root).unwrap_or(self.file);
        format!("{}:{}", rel.display(), span.start().line)
    }

    /// Records an absolute path (from the crate root) that the current module names.
    fn name(&mut self, path: Vec<String>, span: proc_macro2::Span) {
        let at = self.at(span);
        self.out
            .uses
            .entry((self.module.clone(), path))
            .or_insert(at);
    }

    /// A path given as its segments, made absolute: `crate::a…` is `a…`, `self::x` and each
    /// leading `super` are taken from the current module. Other paths (a dependency, a name in
    /// scope) are no module path of their own: a `use` brought the name in and counted.
    fn segments(&mut self, segs: &[String], span: proc_macro2::Span) {
        let Some(first) = segs.first() else { return };
        let path = match first.as_str() {
            "crate" => segs[1..].to_vec(),
            "self" => [&self.module[..], &segs[1..]].concat(),
            "super" => {
                let ups = segs.iter().take_while(|s| *s == "super").count();
                if ups > self.module.len() {
                    return;
                }
                [&self.module[..self.module.len() - ups], &segs[ups..]].concat()
            }
            _ => return,
        };
        self.name(path, span);
    }

    /// `crate :: a :: …` (and `$crate :: a`) in a macro's tokens.
    fn tokens(&mut self, tokens: TokenStream) {
        let trees: Vec<TokenTree> = tokens.into_iter().collect();
        for (i, t) in trees.iter().enumerate() {
            match t {
                TokenTree::Group(g) => self.tokens(g.stream()),
                TokenTree::Ident(id) if id == "crate" => {
                    let mut path = Vec::new();
                    let mut j = i + 1;
                    while let (
                        Some(TokenTree::Punct(a)),
                        Some(TokenTree::Punct(b)),
                        Some(TokenTree::Ident(next)),
                    ) = (trees.get(j), trees.get(j + 1), trees.get(j + 2))
                    {
                        if a.as_char() != ':' || b.as_char() != ':' {
                            break;
                        }
                        path.push(next.to_string());
                        j += 3;
                    }
                    if !path.is_empty() {
                        self.name(path, id.span());
                    }
                }
                _ => {}
            }
        }
    }

    /// Every path a `use` tree spells out, with `prefix` before it; each at the line of its
    /// last name (in a group rustfmt wrapped, the line that names it).
    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(prefix, &p.tree);
                prefix.pop();
            }
            syn::UseTree::Name(syn::UseName { ident })
            | syn::UseTree::Rename(syn::UseRename { ident, .. }) => {
                prefix.push(ident.to_string());
                let path = prefix.clone();
                self.segments(&path, ident.span());
                prefix.pop();
            }
            syn::UseTree::Glob(g) => {
                let path = prefix.clone();
                self.segments(&path, g.star_token.spans[0]);
            }
            syn::UseTree::Group(g) => {
                for t in &g.items {
                    self.use_tree(prefix, t);
                }
            }
        }
    }
}

impl<'ast> Visit<'ast> for Walker<'_> {
    fn visit_item(&mut self, i: &'ast syn::Item) {
        let attrs = match i {
            syn::Item::Const(x) => &x.attrs,
            syn::Item::Enum(x) => &x.attrs,
            syn::Item::ExternCrate(x) => &x.attrs,
            syn::Item::Fn(x) => &x.attrs,
            syn::Item::ForeignMod(x) => &x.attrs,
            syn::Item::Impl(x) => &x.attrs,
            syn::Item::Macro(x) => &x.attrs,
            syn::Item::Mod(x) => &x.attrs,
            syn::Item::Static(x) => &x.attrs,
            syn::Item::Struct(x) => &x.attrs,
            syn::Item::Trait(x) => &x.attrs,
            syn::Item::TraitAlias(x) => &x.attrs,
            syn::Item::Type(x) => &x.attrs,
            syn::Item::Union(x) => &x.attrs,
            syn::Item::Use(x) => &x.attrs,
            _ => return visit::visit_item(self, i),
        };
        if !test_only(attrs) {
            visit::visit_item(self, i);
        }
    }

    fn visit_impl_item(&mut self, i: &'ast syn::ImplItem) {
        let attrs = match i {
            syn::ImplItem::Const(x) => &x.attrs,
            syn::ImplItem::Fn(x) => &x.attrs,
            syn::ImplItem::Type(x) => &x.attrs,
            syn::ImplItem::Macro(x) => &x.attrs,
            _ => return visit::visit_impl_item(self, i),
        };
        if !test_only(attrs) {
            visit::visit_impl_item(self, i);
        }
    }

    fn visit_stmt(&mut self, s: &'ast syn::Stmt) {
        let test = match s {
            syn::Stmt::Local(l) => test_only(&l.attrs),
            syn::Stmt::Macro(m) => test_only(&m.attrs),
            _ => false,
        };
        if !test {
            visit::visit_stmt(self, s);
        }
    }

    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        if test_only(&m.attrs) {
            return;
        }
        let name = m.ident.to_string();
        let dir = self.dirs.last().unwrap().clone();
        let mut module = self.module.clone();
        module.push(name.clone());
        self.out.modules.insert(module.clone());
        match &m.content {
            None => {
                let (file, child_dir) = match path_attr(&m.attrs) {
                    // Relative to the declaring file's folder (outside inline modules, the
                    // only place src/ uses it); the file then resolves `mod x;` beside itself.
                    Some(p) => {
                        let f = self.file.parent().unwrap().join(p);
                        let d = f.parent().unwrap().to_path_buf();
                        (f, d)
                    }
                    None => {
                        let flat = dir.join(format!("{name}.rs"));
                        if flat.exists() {
                            (flat, dir.join(&name))
                        } else {
                            (dir.join(&name).join("mod.rs"), dir.join(&name))
                        }
                    }
                };
                if file.exists() {
                    self.out.pending.push(Pending {
                        file,
                        module,
                        dir: child_dir,
                    });
                } else {
                    let at = self.at(m.ident.span());
                    self.out
                        .errors
                        .push(format!("{at}: `mod {}` has no file", module.join("::")));
                }
            }
            Some((_, items)) => {
                self.module.push(name.clone());
                self.dirs.push(dir.join(&name));
                for item in items {
                    self.visit_item(item);
                }
                self.dirs.pop();
                self.module.pop();
            }
        }
    }

    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        if u.leading_colon.is_none() {
            self.use_tree(&mut Vec::new(), &u.tree);
        }
    }

    fn visit_path(&mut self, p: &'ast syn::Path) {
        if p.leading_colon.is_none() {
            let segs: Vec<String> = p.segments.iter().map(|s| s.ident.to_string()).collect();
            self.segments(&segs, p.segments[0].ident.span());
        }
        visit::visit_path(self, p);
    }

    fn visit_macro(&mut self, m: &'ast syn::Macro) {
        visit::visit_macro(self, m);
        self.tokens(m.tokens.clone());
    }
}

/// Walks the crate rooted at `src/lib.rs`: every module outside test code and every path
/// each one names.
fn walk(src: &Path) -> Walk {
    let root = src.parent().unwrap();
    let lib = src.join("lib.rs");
    let text = std::fs::read_to_string(&lib).unwrap();
    let ast = syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", lib.display()));
    let mut out = Walk::default();
    out.files.push(lib.clone());
    for item in &ast.items {
        if let syn::Item::Mod(m) = item {
            let mut w = Walker {
                root,
                file: &lib,
                module: Vec::new(),
                dirs: vec![src.to_path_buf()],
                out: &mut out,
            };
            w.visit_item_mod(m);
        } else {
            out.errors.push(
                "src/lib.rs holds only the list of modules (an item or a re-export there would \
                 be in no layer)"
                    .to_string(),
            );
        }
    }
    while let Some(p) = out.pending.pop() {
        out.files.push(p.file.clone());
        let text = std::fs::read_to_string(&p.file).unwrap();
        let ast = syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", p.file.display()));
        let mut w = Walker {
            root,
            file: &p.file,
            module: p.module,
            dirs: vec![p.dir],
            out: &mut out,
        };
        w.visit_file(&ast);
    }
    assert!(out.errors.is_empty(), "{}", out.errors.join("\n"));
    out
}

/// The files of the library's production code, as rustc reaches them from `src/lib.rs`
/// (`#[path]` followed, modules under `#[cfg(test)]` never entered).
pub(crate) fn production_files(src: &Path) -> Vec<PathBuf> {
    walk(src).files
}

/// The modules directly inside `scope` (the crate root: `[]`) and the edges between them: a
/// path named from inside one child that leads into another (a path to `scope` itself, such as
/// a re-export of the parent, is no edge).
fn graph_in(walk: &Walk, scope: &[&str]) -> (BTreeSet<String>, Graph) {
    let child = |path: &[String]| -> Option<String> {
        (path.len() > scope.len() && path.iter().zip(scope).all(|(a, b)| a == b))
            .then(|| path[scope.len()].clone())
    };
    let modules = walk
        .modules
        .iter()
        .filter(|m| m.len() == scope.len() + 1)
        .filter_map(|m| child(m))
        .collect();
    let mut edges = Graph::new();
    for ((from, to), at) in &walk.uses {
        if let (Some(f), Some(t)) = (child(from), child(to)) {
            if f != t {
                edges.entry((f, t)).or_insert_with(|| at.clone());
            }
        }
    }
    (modules, edges)
}

/// The top-level modules of the crate rooted at `src/lib.rs`, and the edges between them.
fn graph(src: &Path) -> (BTreeSet<String>, Graph) {
    graph_in(&walk(src), &[])
}

/// The table of layers in a Markdown text: the rows after the header `| layer | modules |…`,
/// numbered 1, 2, … bottom first, each naming its modules in backquotes.
fn layers_in(doc: &str) -> Layers {
    let mut lines = doc
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("| layer | modules |"));
    assert!(lines.next().is_some(), "no `| layer | modules |` table");
    lines.next(); // |---|---|
    let mut out = Layers::new();
    for row in lines.take_while(|l| l.trim_start().starts_with('|')) {
        let cells: Vec<&str> = row.trim().trim_matches('|').split('|').collect();
        assert_eq!(
            cells[0].trim(),
            (out.len() + 1).to_string(),
            "layers are numbered from 1 up: {row}"
        );
        let names: Vec<String> = cells[1]
            .split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_string)
            .collect();
        assert!(!names.is_empty(), "a layer with no module: {row}");
        out.push(names);
    }
    out
}

/// Everything wrong with `edges` against `layers`: a module in no layer or in two, a listed
/// module that does not exist, an edge to a name that is no module, and each edge that points
/// up a layer, with the place that makes it.
fn misplaced(modules: &BTreeSet<String>, layers: &Layers, edges: &Graph) -> Vec<String> {
    let mut out = Vec::new();
    let mut layer_of = BTreeMap::new();
    for (n, names) in layers.iter().enumerate() {
        for name in names {
            if let Some(before) = layer_of.insert(name.as_str(), n + 1) {
                out.push(format!("`{name}` is in layers {before} and {}", n + 1));
            }
            if !modules.contains(name) {
                out.push(format!("layer {}: `{name}` is no module of src/", n + 1));
            }
        }
    }
    for m in modules {
        if !layer_of.contains_key(m.as_str()) {
            out.push(format!("`{m}` (src/{m}.rs or src/{m}/) is in no layer"));
        }
    }
    for ((from, to), at) in edges {
        match (layer_of.get(from.as_str()), layer_of.get(to.as_str())) {
            (_, None) if !modules.contains(to) => {
                out.push(format!("{from} -> {to}: no such module  ({at})"));
            }
            (Some(f), Some(t)) if t > f => out.push(format!(
                "{from} (layer {f}) -> {to} (layer {t}) points up  ({at})"
            )),
            _ => {}
        }
    }
    out
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

/// Every failure of a tree against its table: misplaced modules, upward edges, cycles.
fn check(src: &Path, doc: &str) -> Vec<String> {
    let (modules, edges) = graph(src);
    let layers = layers_in(doc);
    let mut out = misplaced(&modules, &layers, &edges);
    out.extend(knots(&modules, &edges).iter().map(|k| explain(k, &edges)));
    out
}

#[test]
fn the_top_level_modules_keep_to_the_architecture_docs_layers() {
    let doc = std::fs::read_to_string(repo().join("docs/architecture.md")).unwrap();
    let layers = layers_in(&doc);
    assert!(layers.len() >= 5, "{layers:?}");
    let (modules, _) = graph(&repo().join("src"));
    assert!(modules.len() > 20, "{modules:?}");
    let failures = check(&repo().join("src"), &doc);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Within each module too: its submodules form a DAG (in `dra/`, the health map and the
/// slices once imported each other; the pool both enumerate is now below them).
#[test]
fn the_submodules_of_every_module_form_a_dag() {
    let walk = walk(&repo().join("src"));
    let (dra, _) = graph_in(&walk, &["dra"]);
    assert!(dra.contains("slices") && dra.contains("pool"), "{dra:?}");
    let mut text = String::new();
    for m in graph_in(&walk, &[]).0 {
        let (modules, edges) = graph_in(&walk, &[m.as_str()]);
        for k in knots(&modules, &edges) {
            text.push_str(&format!("in {m}: {}", explain(&k, &edges)));
        }
    }
    assert!(text.is_empty(), "{text}");
}

/// A tree with everything the walk counts and leaves out, its table of layers beside it.
fn write_tree(src: &Path, files: &[(&str, &str)]) {
    for (path, text) in files {
        let p = src.join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }
}

/// The check can fail: an edge up a layer and a cycle within one are each reported with the
/// place that makes them, whether the path is in a rustfmt-wrapped `use` group, in code, in a
/// macro's tokens or a `super` chain; test code, comments and doc links naming a module are not
/// edges.
#[test]
fn an_upward_edge_and_a_cycle_are_reported_with_their_places() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    write_tree(
        &src,
        &[
            ("lib.rs", "//! [`crate::e`]\npub mod a;\npub mod b;\npub mod c;\npub mod d;\npub mod e;\n"),
            // rustfmt's wrapped group: `c` after the first `}`.
            ("a.rs", "use crate::{\n    b::{X, Y},\n    c::Z,\n};\n"),
            (
                "b.rs",
                "//! See [`crate::e`].\nmod inner;\n#[cfg(test)]\nmod tests;\n#[cfg(test)]\n\
                 #[path = \"b_tests.rs\"]\nmod other;\n#[cfg(test)]\nmod more {\n    use crate::e::X;\n}\n\
                 #[cfg(all(test, unix))]\nfn t() { crate::e::f(); }\n",
            ),
            ("b/inner.rs", "mod deeper;\nfn f() { crate::a::g(); } // crate::e\n"),
            ("b/inner/deeper.rs", "fn g() { let _ = super::super::super::d::X; }\n"),
            ("b/tests.rs", "use crate::e::Y;\n"),
            ("b_tests.rs", "use crate::e::W;\n"),
            (
                "c.rs",
                "fn f() { tracing::info!(\"{}\", crate::d::N); }\n\
                 macro_rules! m { () => { $crate::e::X }; }\n",
            ),
            ("d.rs", "pub const N: u8 = 1;\n"),
            ("e.rs", "fn f() -> crate::d::T { todo!() }\n"),
        ],
    );
    let (modules, edges) = graph(&src);
    assert_eq!(modules.len(), 5, "{modules:?}");
    let keys: Vec<(&str, &str)> = edges
        .keys()
        .map(|(f, t)| (f.as_str(), t.as_str()))
        .collect();
    assert_eq!(
        keys,
        [
            ("a", "b"),
            ("a", "c"),
            ("b", "a"),
            ("b", "d"),
            ("c", "d"),
            ("c", "e"),
            ("e", "d")
        ]
    );
    // a and b in one layer (their cycle is still one), c above a: a -> c points up.
    let doc = "| layer | modules | what |\n|---|---|---|\n| 1 | `d`, `e` | leaves |\n\
               | 2 | `a`, `b` | middle |\n| 3 | `c` | top |\n";
    let failures = check(&src, doc);
    assert_eq!(failures.len(), 2, "{failures:#?}");
    assert_eq!(
        failures[0],
        "a (layer 2) -> c (layer 3) points up  (src/a.rs:3)"
    );
    assert!(
        failures[1].contains("a -> b  (src/a.rs:2)"),
        "{}",
        failures[1]
    );
    assert!(
        failures[1].contains("b -> a  (src/b/inner.rs:2)"),
        "{}",
        failures[1]
    );
    // A module in no layer, a layer naming no module.
    let doc = "| layer | modules | what |\n|---|---|---|\n| 1 | `d`, `e`, `f` | leaves |\n\
               | 2 | `a`, `b`, `c` | the rest |\n";
    let (modules, edges) = graph(&src);
    let failures = misplaced(&modules, &layers_in(doc), &edges);
    assert_eq!(failures, ["layer 1: `f` is no module of src/"]);
    let doc = "| layer | modules | what |\n|---|---|---|\n| 1 | `d`, `e` | leaves |\n\
               | 2 | `a`, `b` | the rest |\n";
    let failures = misplaced(&modules, &layers_in(doc), &edges);
    assert_eq!(failures, ["`c` (src/c.rs or src/c/) is in no layer"]);
}
