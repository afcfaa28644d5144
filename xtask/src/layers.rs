//! The import rule of docs/layout.md, checked from the sources: within a crate the modules'
//! imports form no cycle, and between its top-level modules they only go down the layers (a
//! capability never imports another one). `cargo xtask layers` prints what breaks it; `cargo
//! xtask test` runs it first.
//!
//! An import is any path a module names outside its tests (`use`, a path in code, a path of
//! two segments or more inside a macro call) that resolves to another module of the crate; it
//! points at the deepest module the path names. Tests are items under `#[cfg(test)]` and the
//! files only they declare. Not seen: a crate renamed by `use crate as x`, and paths written in
//! strings (`#[serde(default = "…")]`).

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
    path::{Path, PathBuf},
};

use anyhow::{Context, Result};
use proc_macro2::{TokenStream, TokenTree};
use syn::visit::Visit;

/// What a top-level module is to the rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Shared by what sits above: its modules may import one another (without a cycle).
    Shared,
    /// A capability's slice: it imports only lower layers, never another capability.
    Capability,
}

/// A crate's layers: each top-level module (by its name; "" is the crate root) with its layer
/// (higher imports lower) and kind.
pub struct Layers {
    pub name: &'static str,
    pub src: &'static str,
    pub layers: &'static [(&'static str, u8, Kind)],
}

use Kind::{Capability, Shared};

/// The daemon and the per-packet crate, as docs/layout.md draws them.
pub const CRATES: &[Layers] = &[
    Layers {
        name: "pirated",
        src: "pirated/src",
        layers: &[
            ("", 0, Shared),
            ("value", 0, Shared),
            ("rng", 0, Shared),
            ("clock", 0, Shared),
            ("psk", 0, Shared),
            ("parallel", 0, Shared),
            ("histogram", 0, Shared),
            ("background", 0, Shared),
            ("buffer", 0, Shared),
            ("json", 0, Shared),
            ("capture", 0, Shared),
            ("limit", 0, Shared),
            ("datapath", 1, Shared),
            ("pirate", 2, Capability),
            ("fridge", 2, Capability),
            ("segment", 2, Capability),
            ("lb", 2, Capability),
            ("rli", 2, Capability),
            ("config", 3, Shared),
            ("source", 4, Shared),
            ("metrics", 5, Shared),
            ("epoch", 6, Shared),
            ("main", 7, Shared),
        ],
    },
    Layers {
        name: "pirate_common",
        src: "pirate-common/src",
        layers: &[
            ("", 0, Shared),
            ("counters", 0, Shared),
            ("maps", 0, Shared),
            ("hash", 0, Shared),
            ("identity", 0, Shared),
            ("key", 0, Shared),
            ("ctx", 0, Shared),
            ("parse", 0, Shared),
            ("zero", 0, Shared),
            ("pirate", 1, Capability),
            ("fridge", 1, Capability),
            ("segment", 1, Capability),
            ("lb", 1, Capability),
            ("rli", 1, Capability),
        ],
    },
];

/// One import: `from` names `path`, which lies in module `to`.
#[derive(Clone, Debug)]
struct Edge {
    to: String,
    path: String,
}

/// What breaks the rule.
#[derive(Debug, PartialEq, Eq)]
pub enum Breach {
    /// Modules that import one another round, each with an import that closes the loop.
    Cycle(Vec<String>),
    /// An import between top-level modules that does not go down.
    Up { from: String, to: String, path: String },
    /// A top-level module the layers do not place.
    Unplaced(String),
}

impl fmt::Display for Breach {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Breach::Cycle(imports) => write!(f, "a cycle: {}", imports.join(", ")),
            Breach::Up { from, to, path } => write!(f, "{from} imports {to} ({path}), which is not below it"),
            Breach::Unplaced(m) => {
                write!(f, "module {m:?} has no layer: place it in xtask/src/layers.rs and docs/layout.md")
            }
        }
    }
}

/// Every breach of the rule in the crate at `root`/`layers.src`.
pub fn check(root: &Path, layers: &Layers) -> Result<Vec<Breach>> {
    let graph = graph(&root.join(layers.src), layers.name)?;
    let mut breaches: Vec<Breach> = cycles(&graph).into_iter().map(Breach::Cycle).collect();
    let top = |m: &str| m.split('/').next().unwrap_or("").to_string();
    let place =
        |m: &str| layers.layers.iter().find(|(name, ..)| *name == top(m)).map(|&(_, layer, kind)| (layer, kind));
    let mut unplaced = BTreeSet::new();
    for (from, edges) in &graph {
        let Some((layer, kind)) = place(from) else {
            unplaced.insert(top(from));
            continue;
        };
        for e in edges.iter().filter(|e| top(&e.to) != top(from)) {
            let Some((to_layer, _)) = place(&e.to) else { continue };
            if to_layer > layer || (to_layer == layer && kind == Capability) {
                breaches.push(Breach::Up { from: from.clone(), to: e.to.clone(), path: e.path.clone() });
            }
        }
    }
    breaches.extend(unplaced.into_iter().map(Breach::Unplaced));
    Ok(breaches)
}

/// Each module of the crate in `src` (by path: `pirate/estimate`, "" the root) with its imports.
fn graph(src: &Path, krate: &str) -> Result<BTreeMap<String, Vec<Edge>>> {
    let mut files = Vec::new();
    walk(src, &mut files)?;
    let modules: BTreeMap<String, PathBuf> = files
        .into_iter()
        .filter_map(|f| {
            let rel = f.strip_prefix(src).ok()?.with_extension("");
            let rel = rel.to_str()?.to_string();
            let module = match rel.as_str() {
                "lib" => String::new(),
                _ => rel.strip_suffix("/mod").unwrap_or(&rel).to_string(),
            };
            (!module.starts_with("bin/")).then_some((module, f))
        })
        .collect();
    let mut parsed = BTreeMap::new();
    for (module, file) in &modules {
        let text = std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
        let ast = syn::parse_file(&text).with_context(|| format!("parsing {}", file.display()))?;
        let mut paths = Paths::default();
        paths.visit_file(&ast);
        parsed.insert(module.as_str(), paths);
    }
    // Files only tests declare (`#[cfg(test)] mod tests;`), and what they hold, are tests too.
    let tests: Vec<String> = parsed
        .iter()
        .flat_map(|(module, paths)| paths.test_files.iter().map(move |child| child_of(module, child)))
        .collect();
    let is_test = |m: &str| tests.iter().any(|t| m == t || m.starts_with(&format!("{t}/")));
    let names: BTreeSet<&str> = modules.keys().map(String::as_str).filter(|m| !is_test(m)).collect();
    let mut out = BTreeMap::new();
    for (module, paths) in parsed.into_iter().filter(|(m, _)| !is_test(m)) {
        // The binary's root reaches the library by the crate's name.
        let own = if module == "main" { Some(krate) } else { None };
        let file: Vec<&str> = if module.is_empty() || module == "main" { vec![] } else { module.split('/').collect() };
        let mut edges: Vec<Edge> = Vec::new();
        for (inline, path) in &paths.found {
            // Within an inline module, `self` and `super` start from it.
            let here: Vec<&str> = file.iter().copied().chain(inline.iter().map(String::as_str)).collect();
            let Some(to) = resolve(&here, path, own, &names) else { continue };
            if to != module && !edges.iter().any(|e| e.to == to) {
                edges.push(Edge { to, path: path.join("::") });
            }
        }
        out.insert(module.to_string(), edges);
    }
    Ok(out)
}

/// Module `child` declared in module `parent`, as a path.
fn child_of(parent: &str, child: &str) -> String {
    match parent {
        "" | "main" => child.to_string(),
        _ => format!("{parent}/{child}"),
    }
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        if path.is_dir() {
            walk(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    Ok(())
}

/// The module (of `names`) that `path`, named in module `here`, lies in: the deepest one its
/// leading segments name. `None` for a path outside the crate.
fn resolve(here: &[&str], path: &[String], own: Option<&str>, names: &BTreeSet<&str>) -> Option<String> {
    let mut base: Vec<&str> = here.to_vec();
    let mut rest = path;
    match path.first().map(String::as_str)? {
        "crate" => {
            base.clear();
            rest = &path[1..];
        }
        first if Some(first) == own => {
            base.clear();
            rest = &path[1..];
        }
        "self" => rest = &path[1..],
        "super" => {
            while rest.first().is_some_and(|s| s == "super") {
                base.pop()?;
                rest = &rest[1..];
            }
        }
        // A child module named as in scope (`mod table;` then `table::FlowTable`; a lone name is
        // a value or a type).
        first => {
            let child: Vec<&str> = base.iter().copied().chain([first]).collect();
            if path.len() < 2 || !names.contains(child.join("/").as_str()) {
                return None;
            }
        }
    }
    let mut best = None;
    for k in 0..=rest.len() {
        let candidate: Vec<&str> = base.iter().copied().chain(rest[..k].iter().map(String::as_str)).collect();
        let candidate = candidate.join("/");
        if names.contains(candidate.as_str()) {
            best = Some(candidate);
        }
    }
    best
}

/// The paths a file names outside its tests, as segments (`use` trees expanded), each with the
/// inline modules (`mod x { … }`) it is named in; and the modules it declares for tests only.
#[derive(Default)]
struct Paths {
    found: Vec<(Vec<String>, Vec<String>)>,
    inline: Vec<String>,
    test_files: Vec<String>,
}

impl Paths {
    fn push(&mut self, path: Vec<String>) {
        self.found.push((self.inline.clone(), path));
    }
}

impl<'a> Visit<'a> for Paths {
    fn visit_item(&mut self, item: &'a syn::Item) {
        if !attrs(item).iter().any(is_cfg_test) {
            syn::visit::visit_item(self, item);
        } else if let syn::Item::Mod(m) = item {
            if m.content.is_none() {
                self.test_files.push(m.ident.to_string());
            }
        }
    }

    fn visit_item_mod(&mut self, m: &'a syn::ItemMod) {
        self.inline.push(m.ident.to_string());
        syn::visit::visit_item_mod(self, m);
        self.inline.pop();
    }

    fn visit_item_use(&mut self, item: &'a syn::ItemUse) {
        let mut paths = Vec::new();
        expand(&item.tree, &mut Vec::new(), &mut paths);
        paths.into_iter().for_each(|p| self.push(p));
    }

    fn visit_path(&mut self, path: &'a syn::Path) {
        self.push(path.segments.iter().map(|s| s.ident.to_string()).collect());
        syn::visit::visit_path(self, path);
    }

    /// `pub(super)` names no import.
    fn visit_visibility(&mut self, _: &'a syn::Visibility) {}

    fn visit_macro(&mut self, mac: &'a syn::Macro) {
        syn::visit::visit_macro(self, mac);
        let mut paths = Vec::new();
        tokens(mac.tokens.clone(), &mut paths);
        paths.into_iter().for_each(|p| self.push(p));
    }
}

/// An item's attributes.
fn attrs(item: &syn::Item) -> &[syn::Attribute] {
    use syn::Item;
    match item {
        Item::Const(i) => &i.attrs,
        Item::Enum(i) => &i.attrs,
        Item::ExternCrate(i) => &i.attrs,
        Item::Fn(i) => &i.attrs,
        Item::ForeignMod(i) => &i.attrs,
        Item::Impl(i) => &i.attrs,
        Item::Macro(i) => &i.attrs,
        Item::Mod(i) => &i.attrs,
        Item::Static(i) => &i.attrs,
        Item::Struct(i) => &i.attrs,
        Item::Trait(i) => &i.attrs,
        Item::TraitAlias(i) => &i.attrs,
        Item::Type(i) => &i.attrs,
        Item::Union(i) => &i.attrs,
        Item::Use(i) => &i.attrs,
        _ => &[],
    }
}

/// Whether an attribute is `#[cfg(test)]`.
fn is_cfg_test(attr: &syn::Attribute) -> bool {
    attr.path().is_ident("cfg") && attr.parse_args::<syn::Ident>().is_ok_and(|i| i == "test")
}

/// The paths of a `use` tree, each from the root of the statement.
fn expand(tree: &syn::UseTree, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    match tree {
        syn::UseTree::Path(p) => {
            prefix.push(p.ident.to_string());
            expand(&p.tree, prefix, out);
            prefix.pop();
        }
        syn::UseTree::Name(n) => out.push(prefix.iter().cloned().chain([n.ident.to_string()]).collect()),
        syn::UseTree::Rename(r) => out.push(prefix.iter().cloned().chain([r.ident.to_string()]).collect()),
        syn::UseTree::Glob(_) => out.push(prefix.clone()),
        syn::UseTree::Group(g) => g.items.iter().for_each(|t| expand(t, prefix, out)),
    }
}

/// Paths inside a macro call's tokens (a format argument, a path in `matches!`): runs of two
/// identifiers or more joined by `::`, which [`resolve`] keeps if they name a module of the crate.
fn tokens(stream: TokenStream, out: &mut Vec<Vec<String>>) {
    let trees: Vec<TokenTree> = stream.into_iter().collect();
    let mut i = 0;
    while i < trees.len() {
        match &trees[i] {
            TokenTree::Group(g) => {
                tokens(g.stream(), out);
                i += 1;
            }
            TokenTree::Ident(_) => {
                let mut path = Vec::new();
                while let Some(TokenTree::Ident(id)) = trees.get(i) {
                    path.push(id.to_string());
                    let colons = matches!((trees.get(i + 1), trees.get(i + 2)),
                        (Some(TokenTree::Punct(a)), Some(TokenTree::Punct(b))) if a.as_char() == ':' && b.as_char() == ':');
                    i += if colons { 3 } else { 1 };
                    if !colons {
                        break;
                    }
                }
                if path.len() > 1 {
                    out.push(path);
                }
            }
            _ => i += 1,
        }
    }
}

/// The graph's cycles (strongly connected components of two or more modules), each as the
/// imports between its members.
fn cycles(graph: &BTreeMap<String, Vec<Edge>>) -> Vec<Vec<String>> {
    let nodes: Vec<&String> = graph.keys().collect();
    let index: BTreeMap<&str, usize> = nodes.iter().enumerate().map(|(i, n)| (n.as_str(), i)).collect();
    let succ: Vec<Vec<usize>> =
        nodes.iter().map(|n| graph[*n].iter().filter_map(|e| index.get(e.to.as_str()).copied()).collect()).collect();
    let components = strongly_connected(&succ);
    components
        .into_iter()
        .filter(|c| c.len() > 1)
        .map(|c| {
            let inside: BTreeSet<usize> = c.iter().copied().collect();
            let mut imports = Vec::new();
            for &a in &c {
                for e in &graph[nodes[a]] {
                    if index.get(e.to.as_str()).is_some_and(|b| inside.contains(b)) {
                        imports.push(format!("{} -> {} ({})", nodes[a], e.to, e.path));
                    }
                }
            }
            imports.sort();
            imports
        })
        .collect()
}

/// Tarjan's strongly connected components of the graph `succ` (iterative: no recursion depth).
fn strongly_connected(succ: &[Vec<usize>]) -> Vec<Vec<usize>> {
    let n = succ.len();
    let (mut index, mut low, mut on) = (vec![usize::MAX; n], vec![0; n], vec![false; n]);
    let (mut stack, mut out, mut next) = (Vec::new(), Vec::new(), 0);
    for root in 0..n {
        if index[root] != usize::MAX {
            continue;
        }
        // (node, next successor to look at)
        let mut work = vec![(root, 0)];
        while let Some(&mut (v, ref mut i)) = work.last_mut() {
            if *i == 0 {
                index[v] = next;
                low[v] = next;
                next += 1;
                stack.push(v);
                on[v] = true;
            }
            if let Some(&w) = succ[v].get(*i) {
                *i += 1;
                if index[w] == usize::MAX {
                    work.push((w, 0));
                } else if on[w] {
                    low[v] = low[v].min(index[w]);
                }
                continue;
            }
            work.pop();
            if let Some(&(parent, _)) = work.last() {
                low[parent] = low[parent].min(low[v]);
            }
            if low[v] == index[v] {
                let mut component = Vec::new();
                while let Some(w) = stack.pop() {
                    on[w] = false;
                    component.push(w);
                    if w == v {
                        break;
                    }
                }
                out.push(component);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A crate of `files` (path, text) in a new directory under the system's temporary one.
    fn tree(name: &str, files: &[(&str, &str)]) -> PathBuf {
        let root = std::env::temp_dir().join(format!("layers-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        for (path, text) in files {
            let path = root.join("src").join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
        root
    }

    const LAYERS: &[(&str, u8, Kind)] =
        &[("", 0, Shared), ("leaf", 0, Shared), ("a", 1, Capability), ("b", 1, Capability), ("top", 2, Shared)];

    fn layers() -> Layers {
        Layers { name: "demo", src: "src", layers: LAYERS }
    }

    #[test]
    fn imports_down_the_layers_pass() {
        let root = tree(
            "down",
            &[
                ("lib.rs", "pub mod leaf; pub mod a; pub mod b; pub mod top;"),
                ("leaf.rs", "pub struct L;"),
                // In an inline module, `super` is the file's module: `a`'s child `top`, not the crate's.
                (
                    "a/mod.rs",
                    "mod x; mod top; use crate::leaf::L; pub const K: u8 = 0; pub fn f() -> L { x::g() } \
                     mod inner { use super::top::T; }",
                ),
                ("a/top.rs", "pub struct T;"),
                ("a/x.rs", "pub fn g() -> crate::leaf::L { crate::leaf::L }"),
                ("b.rs", "#[cfg(test)] mod tests { use crate::a::f; } #[cfg(test)] const C: u8 = crate::a::K; #[cfg(test)] mod more;"),
                // A file only tests declare is a test.
                ("b/more.rs", "use crate::a::f;"),
                ("top.rs", "use crate::{a, b}; fn h() { let _ = a::f(); }"),
            ],
        );
        assert_eq!(check(&root, &layers()).unwrap(), vec![]);
    }

    #[test]
    fn a_cycle_an_import_up_and_between_capabilities_are_caught() {
        let root = tree(
            "breaches",
            &[
                ("lib.rs", "pub mod leaf; pub mod a; pub mod b; pub mod top; pub mod stray;"),
                ("leaf.rs", "pub fn l() { let _ = format!(\"{:?}\", crate::top::T); }"),
                ("a/mod.rs", "mod x; pub struct S; pub fn f() { println!(\"{:?}\", x::G) }"),
                ("a/x.rs", "use super::S; pub const G: u8 = 0; pub fn g() { let _ = S; }"),
                ("b.rs", "use crate::a::S;"),
                ("top.rs", "#[derive(Debug)] pub struct T;"),
                ("stray.rs", ""),
            ],
        );
        let breaches = check(&root, &layers()).unwrap();
        // A child named only in a macro call closes the cycle too.
        let cycle = Breach::Cycle(vec!["a -> a/x (x::G)".into(), "a/x -> a (super::S)".into()]);
        assert!(breaches.contains(&cycle), "{breaches:?}");
        let up = Breach::Up { from: "leaf".into(), to: "top".into(), path: "crate::top::T".into() };
        assert!(breaches.contains(&up), "{breaches:?}");
        let across = Breach::Up { from: "b".into(), to: "a".into(), path: "crate::a::S".into() };
        assert!(breaches.contains(&across), "{breaches:?}");
        assert!(breaches.contains(&Breach::Unplaced("stray".into())), "{breaches:?}");
        assert_eq!(breaches.len(), 4, "{breaches:?}");
    }
}
