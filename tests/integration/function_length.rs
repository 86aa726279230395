//! No production function of `src/` runs over [`MAX_LINES`] lines, except one whose body is a
//! single flat `match` (a table, read row by row): the pure cores and the daemon are kept in
//! steps whose names say what they decide (docs/contributing.md, "Code shape").
//!
//! Counted as a reader sees the function: from the line of its `fn` keyword to the line of its
//! closing brace (doc comments and attributes above it not counted). Every free function,
//! method and trait method with a body in the library's production files (those rustc reaches
//! from `src/lib.rs`, see [`crate::layers::production_files`]) and in `src/main.rs`; items
//! under `#[cfg(test)]` are skipped.

use std::path::Path;

use syn::visit::{self, Visit};

use crate::common::repo;
use crate::layers::{production_files, test_only};

/// The longest a production function may be, in lines.
const MAX_LINES: usize = 80;

/// Collects every function over the limit in one file.
struct Lengths<'a> {
    file: &'a str,
    over: Vec<String>,
}

impl Lengths<'_> {
    fn check(&mut self, attrs: &[syn::Attribute], sig: &syn::Signature, block: &syn::Block) {
        if test_only(attrs) {
            return;
        }
        let first = sig.fn_token.span.start().line;
        let last = block.brace_token.span.close().end().line;
        let lines = last + 1 - first;
        if lines > MAX_LINES && !flat_match(block) {
            self.over.push(format!(
                "{}:{first} fn {}: {lines} lines",
                self.file, sig.ident
            ));
        }
    }
}

/// Whether a body is one `match` expression and nothing else.
fn flat_match(block: &syn::Block) -> bool {
    matches!(
        block.stmts.as_slice(),
        [syn::Stmt::Expr(syn::Expr::Match(_), _)]
    )
}

impl<'ast> Visit<'ast> for Lengths<'_> {
    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        self.check(&f.attrs, &f.sig, &f.block);
        visit::visit_item_fn(self, f);
    }

    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        self.check(&f.attrs, &f.sig, &f.block);
        visit::visit_impl_item_fn(self, f);
    }

    fn visit_trait_item_fn(&mut self, f: &'ast syn::TraitItemFn) {
        if let Some(block) = &f.default {
            self.check(&f.attrs, &f.sig, block);
        }
        visit::visit_trait_item_fn(self, f);
    }

    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        if !test_only(&m.attrs) {
            visit::visit_item_mod(self, m);
        }
    }

    fn visit_item_impl(&mut self, i: &'ast syn::ItemImpl) {
        if !test_only(&i.attrs) {
            visit::visit_item_impl(self, i);
        }
    }
}

/// Every function over the limit in these files, as `file:line fn name: N lines`.
fn too_long(root: &Path, files: &[std::path::PathBuf]) -> Vec<String> {
    let mut over = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(file).unwrap();
        let ast = syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let rel = file
            .strip_prefix(root)
            .unwrap_or(file)
            .display()
            .to_string();
        let mut l = Lengths {
            file: &rel,
            over: Vec::new(),
        };
        l.visit_file(&ast);
        over.extend(l.over);
    }
    over
}

#[test]
fn no_production_function_runs_over_80_lines_but_a_flat_match() {
    let root = repo();
    let src = root.join("src");
    let mut files = production_files(&src);
    files.push(src.join("main.rs"));
    assert!(files.len() > 50, "the walk found {} files", files.len());
    let over = too_long(&root, &files);
    assert!(
        over.is_empty(),
        "split these into steps whose names say what they decide:\n{}",
        over.join("\n")
    );
}

/// The count itself: an 81-line function is reported with its place, an 80-line one and an
/// 81-line flat `match` are not, nor an 81-line one under `#[cfg(test)]`.
#[test]
fn an_81_line_function_is_reported_and_a_flat_match_is_not() {
    let body = |n: usize| "    let _x = 1;\n".repeat(n);
    let arms = |n: usize| "        _ if false => {}\n".repeat(n);
    let text = format!(
        "fn long() {{\n{}}}\n\nfn fits() {{\n{}}}\n\nfn table(v: u32) {{\n    match v {{\n{}        _ => {{}}\n    }}\n}}\n\n#[cfg(test)]\nfn in_tests() {{\n{}}}\n",
        body(79),
        body(78),
        arms(76),
        body(79),
    );
    let dir = std::env::temp_dir().join(format!("slicelet-fnlen-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("x.rs");
    std::fs::write(&file, text).unwrap();
    let over = too_long(&dir, &[file]);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(over, vec!["x.rs:1 fn long: 81 lines".to_string()]);
}
