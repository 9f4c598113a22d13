//! The code's shape, measured on the parsed source (`syn`): no non-test
//! source file over 400 lines, no function over 80 lines in the operator
//! and its balancer, no import circle between the files of a crate.
//!
//! Where the code does not meet a bound yet, [`KNOWN_LONG`] names each
//! exception with its present length: the test fails when one of them
//! grows, when a new one appears, and when one is back within the bound
//! (take it off the list), so the list can only shrink.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use syn::spanned::Spanned;
use syn::visit::Visit;

/// Lines a non-test source file may have (test modules not counted).
const FILE_LINES: usize = 400;
/// Lines a function may have, from `fn` to its closing brace.
const FN_LINES: usize = 80;

/// Files exempt from the file bound: the CRD types (one schema per type,
/// documented field by field).
const EXEMPT_FILES: &[&str] = &["crds/src/job.rs"];

/// Functions over [`FN_LINES`] today, with their length: work still to do.
const KNOWN_LONG: &[(&str, usize)] = &[
    ("operator/kubectl-plugin/src/main.rs::main", 100),
    (
        "operator/kubectl-plugin/src/render/profile.rs::profile",
        131,
    ),
];

/// Files over [`FILE_LINES`] today, with their length: work still to do.
const KNOWN_BIG: &[(&str, usize)] = &[
    ("e2e/src/bench/mod.rs", 459),
    ("e2e/src/bench/report.rs", 492),
    ("e2e/src/bench/scale.rs", 514),
    ("e2e/src/bench/session.rs", 437),
    ("e2e/src/system/mod.rs", 448),
    ("trainer-image/src/c10d/mod.rs", 475),
    ("trainer-image/src/profile.rs", 428),
    ("trainer-image/src/train/mod.rs", 422),
    ("trainer-image/src/train/step.rs", 525),
];

/// The crates whose files are measured: their source roots, and whether
/// their functions are held to [`FN_LINES`].
const CRATES: &[(&str, bool)] = &[
    ("operator/src", true),
    ("operator/balancer/src", true),
    ("operator/kubectl-plugin/src", true),
    ("trainer-image/src", false),
    ("e2e/src", false),
    ("crds/src", false),
];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root")
        .to_path_buf()
}

/// Every `.rs` file below `dir`, sorted.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let entries = std::fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display()));
        for entry in entries {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                todo.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// Test code: a `tests` directory, `tests.rs` or `*_tests.rs`.
fn is_test_file(rel: &str) -> bool {
    let name = rel.rsplit('/').next().unwrap_or(rel);
    rel.split('/').any(|c| c == "tests") || name == "tests.rs" || name.ends_with("_tests.rs")
}

fn is_cfg_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && a.parse_args::<syn::Meta>()
                .is_ok_and(|m| m.path().is_ident("test"))
    })
}

/// One parsed non-test source file.
struct Source {
    rel: String,
    file: syn::File,
    lines: usize,
}

fn parse(root: &Path, path: &Path) -> Source {
    let rel = path
        .strip_prefix(root)
        .expect("below the root")
        .to_string_lossy()
        .replace('\\', "/");
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{rel}: {e}"));
    let file = syn::parse_file(&text).unwrap_or_else(|e| panic!("{rel}: {e}"));
    // Lines outside `#[cfg(test)]` items.
    let test_lines: usize = file
        .items
        .iter()
        .filter(|i| is_cfg_test(item_attrs(i)))
        .map(|i| {
            let s = i.span();
            s.end().line + 1 - s.start().line
        })
        .sum();
    let lines = text.lines().count() - test_lines;
    Source { rel, file, lines }
}

fn item_attrs(item: &syn::Item) -> &[syn::Attribute] {
    match item {
        syn::Item::Mod(m) => &m.attrs,
        syn::Item::Fn(f) => &f.attrs,
        syn::Item::Impl(i) => &i.attrs,
        syn::Item::Use(u) => &u.attrs,
        syn::Item::Const(c) => &c.attrs,
        syn::Item::Struct(s) => &s.attrs,
        _ => &[],
    }
}

fn sources() -> Vec<(Source, bool, &'static str)> {
    let root = repo();
    let mut out = Vec::new();
    for &(dir, fn_bound) in CRATES {
        for path in rust_files(&root.join(dir)) {
            let rel = path.strip_prefix(&root).expect("below the root");
            if !is_test_file(&rel.to_string_lossy()) {
                out.push((parse(&root, &path), fn_bound, dir));
            }
        }
    }
    assert!(out.len() > 100, "only {} source files found", out.len());
    out
}

/// Functions (free, in impls and traits) with their line counts, test
/// modules skipped.
#[derive(Default)]
struct Functions {
    found: Vec<(String, usize)>,
}

impl Functions {
    fn add(&mut self, name: &syn::Ident, fn_token: &syn::token::Fn, body: &syn::Block) {
        let lines = body.span().end().line + 1 - fn_token.span.start().line;
        self.found.push((name.to_string(), lines));
    }
}

impl<'ast> Visit<'ast> for Functions {
    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        if !is_cfg_test(&m.attrs) {
            syn::visit::visit_item_mod(self, m);
        }
    }
    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        if !is_cfg_test(&f.attrs) {
            self.add(&f.sig.ident, &f.sig.fn_token, &f.block);
            syn::visit::visit_item_fn(self, f);
        }
    }
    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        if !is_cfg_test(&f.attrs) {
            self.add(&f.sig.ident, &f.sig.fn_token, &f.block);
            syn::visit::visit_impl_item_fn(self, f);
        }
    }
    fn visit_trait_item_fn(&mut self, f: &'ast syn::TraitItemFn) {
        if let Some(body) = &f.default {
            self.add(&f.sig.ident, &f.sig.fn_token, body);
        }
        syn::visit::visit_trait_item_fn(self, f);
    }
}

/// Compares what was measured with the known exceptions: a new one, one
/// grown or one back within the bound is a failure.
fn ratchet(what: &str, bound: usize, measured: &BTreeMap<String, usize>, known: &[(&str, usize)]) {
    let known: BTreeMap<&str, usize> = known.iter().copied().collect();
    let mut problems = Vec::new();
    for (name, &n) in measured {
        match known.get(name.as_str()) {
            None => problems.push(format!("{name}: {n} lines (at most {bound})")),
            Some(&was) if n > was => problems.push(format!(
                "{name}: grew to {n} lines (known {was}, at most {bound})"
            )),
            Some(_) => {}
        }
    }
    for (name, was) in &known {
        if !measured.contains_key(*name) {
            problems.push(format!(
                "{name}: now within {bound} lines (known {was}): take it off the list"
            ));
        }
    }
    assert!(problems.is_empty(), "{what}:\n{}", problems.join("\n"));
}

#[test]
fn no_source_file_over_400_lines() {
    let big: BTreeMap<String, usize> = sources()
        .into_iter()
        .filter(|(s, _, _)| s.lines > FILE_LINES && !EXEMPT_FILES.contains(&s.rel.as_str()))
        .map(|(s, _, _)| (s.rel, s.lines))
        .collect();
    ratchet("non-test source files", FILE_LINES, &big, KNOWN_BIG);
}

#[test]
fn no_function_over_80_lines_in_the_operator() {
    let mut long = BTreeMap::new();
    let mut counted = 0;
    for (s, fn_bound, _) in sources() {
        if !fn_bound {
            continue;
        }
        let mut f = Functions::default();
        f.visit_file(&s.file);
        counted += f.found.len();
        for (name, n) in f.found {
            if n > FN_LINES {
                long.insert(format!("{}::{name}", s.rel), n);
            }
        }
    }
    assert!(counted > 500, "only {counted} functions found");
    ratchet("functions", FN_LINES, &long, KNOWN_LONG);
}

/// The module path of a file below its crate's source root.
fn module_of(rel_to_root: &str) -> Vec<String> {
    let mut parts: Vec<String> = rel_to_root
        .trim_end_matches(".rs")
        .split('/')
        .map(str::to_string)
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts
}

/// Every path a file names (`use` trees and paths in code), as segments,
/// test modules skipped.
#[derive(Default)]
struct Paths {
    found: Vec<Vec<String>>,
}

impl Paths {
    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(prefix, &p.tree);
                prefix.pop();
            }
            syn::UseTree::Name(n) => {
                let mut path = prefix.clone();
                path.push(n.ident.to_string());
                self.found.push(path);
            }
            syn::UseTree::Rename(r) => {
                let mut path = prefix.clone();
                path.push(r.ident.to_string());
                self.found.push(path);
            }
            syn::UseTree::Glob(_) => self.found.push(prefix.clone()),
            syn::UseTree::Group(g) => {
                for t in &g.items {
                    self.use_tree(prefix, t);
                }
            }
        }
    }
}

impl<'ast> Visit<'ast> for Paths {
    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        if !is_cfg_test(&m.attrs) {
            syn::visit::visit_item_mod(self, m);
        }
    }
    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        if !is_cfg_test(&u.attrs) {
            self.use_tree(&mut Vec::new(), &u.tree);
        }
    }
    fn visit_path(&mut self, p: &'ast syn::Path) {
        self.found
            .push(p.segments.iter().map(|s| s.ident.to_string()).collect());
        syn::visit::visit_path(self, p);
    }
}

/// The file module a path names from module `from`, if any: `crate::`,
/// `super::` and `self::` paths, and paths that start with a child module.
/// An item of a parent module reached as `super::Item` names no module:
/// a module and its submodules are one unit (the parent declares them and
/// holds what they share), so only paths to other files count.
fn resolve(
    path: &[String],
    from: &[String],
    modules: &BTreeSet<Vec<String>>,
) -> Option<Vec<String>> {
    let (mut base, rest): (Vec<String>, &[String]) = match path.first().map(String::as_str) {
        Some("crate") => (Vec::new(), &path[1..]),
        Some("self") => (from.to_vec(), &path[1..]),
        Some("super") => {
            let supers = path.iter().take_while(|s| *s == "super").count();
            let keep = from.len().checked_sub(supers)?;
            (from[..keep].to_vec(), &path[supers..])
        }
        _ => (from.to_vec(), path),
    };
    let mut best = None;
    for seg in rest {
        base.push(seg.clone());
        if modules.contains(&base) {
            best = Some(base.clone());
        }
    }
    best.filter(|m| m.as_slice() != from)
}

/// A circle through `start`, if one exists, as module names.
fn circle_through(
    start: &[String],
    edges: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
) -> Option<Vec<String>> {
    let mut stack = vec![(start.to_vec(), vec![start.join("::")])];
    let mut seen = BTreeSet::new();
    while let Some((m, trail)) = stack.pop() {
        for next in edges.get(&m).into_iter().flatten() {
            if next.as_slice() == start {
                return Some(trail);
            }
            if seen.insert(next.clone()) {
                let mut t = trail.clone();
                t.push(next.join("::"));
                stack.push((next.clone(), t));
            }
        }
    }
    None
}

#[test]
fn no_import_circle_between_files() {
    let mut by_crate: BTreeMap<&str, Vec<Source>> = BTreeMap::new();
    for (s, _, dir) in sources() {
        by_crate.entry(dir).or_default().push(s);
    }
    let mut circles = Vec::new();
    for (dir, files) in by_crate {
        let rel = |s: &Source| s.rel[dir.len() + 1..].to_string();
        // Binaries are crates of their own.
        let files: Vec<&Source> = files
            .iter()
            .filter(|s| !rel(s).starts_with("bin/"))
            .collect();
        let modules: BTreeSet<Vec<String>> = files.iter().map(|s| module_of(&rel(s))).collect();
        let mut edges: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
        for s in &files {
            let from = module_of(&rel(s));
            let mut paths = Paths::default();
            paths.visit_file(&s.file);
            let to: BTreeSet<Vec<String>> = paths
                .found
                .iter()
                .filter_map(|p| resolve(p, &from, &modules))
                // The crate root only declares and re-exports.
                .filter(|m| !m.is_empty())
                .collect();
            edges.insert(from, to);
        }
        for m in &modules {
            if let Some(c) = circle_through(m, &edges) {
                circles.push(format!("{dir}: {}", c.join(" -> ")));
            }
        }
    }
    assert!(
        circles.is_empty(),
        "import circles:\n{}",
        circles.join("\n")
    );
}

#[test]
fn the_measures_see_what_they_measure() {
    // A long function, a circle and test code, parsed as the tests do.
    let body = "    let x = 1;\n".repeat(FN_LINES);
    let file: syn::File = syn::parse_str(&format!(
        "fn long() {{\n{body}}}\n#[cfg(test)]\nmod tests {{ fn t() {{}} }}"
    ))
    .expect("parses");
    let mut f = Functions::default();
    f.visit_file(&file);
    assert_eq!(f.found, vec![("long".to_string(), FN_LINES + 2)]);
    let modules: BTreeSet<Vec<String>> = [vec!["a".to_string()], vec!["b".to_string()]]
        .into_iter()
        .collect();
    let a = vec!["a".to_string()];
    let to_b = resolve(&["crate".into(), "b".into(), "f".into()], &a, &modules);
    assert_eq!(to_b, Some(vec!["b".to_string()]));
    let edges: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = [
        (a.clone(), [vec!["b".to_string()]].into_iter().collect()),
        (vec!["b".to_string()], [a.clone()].into_iter().collect()),
    ]
    .into_iter()
    .collect();
    assert_eq!(
        circle_through(&a, &edges),
        Some(vec!["a".to_string(), "b".to_string()])
    );
    assert!(is_test_file("operator/src/lifecycle/tests/restarts.rs"));
    assert!(is_test_file("operator/src/scrape/limit_tests.rs"));
    assert!(!is_test_file("operator/src/lifecycle/mod.rs"));
}
