//! Circles of files: the same check as between top-level modules, one level finer. Two files
//! that need each other are one thing in two places (a type both use lives in one of them):
//! the mend is to move what both need below them.
//!
//! Each file is a module; a reference is a path in a `use` or in the code that starts at
//! `crate::`, `super::`, `self::` or at a child module's name, resolved to the deepest file of
//! the modules it names (`crate::lb::resources::Selector` to `lb/resources.rs`). Three kinds of
//! reference make no tie: a file's re-exports (`pub use`), which name its children's items for
//! others; references from a file's inline `mod tests`, which drive the file through real
//! neighbours (the lease's tests run on the embedded store, whose tests run the lease's
//! conformance suite); and one between a module's file and its direct children's (a `mod.rs`
//! that runs its children and holds the types they share is one module in several files,
//! Rust's own way). Test files of their own (`assign_tests.rs`) count like any file. Binaries
//! under `src/bin/` are crates of their own and are checked each on its own.
//!
//! Like the module check it reads text, relying on rustfmt's layout for inline modules (opened
//! by `mod name {` at the end of a line, closed by `}` at the same indent).

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use super::{Graph, layers, rust_files};

/// A module path: `["lb", "resources"]`; the crate root is empty.
type ModulePath = Vec<String>;

/// One crate's files: each file's module path, and the file of each module.
struct Tree {
    /// The folder module paths are relative to (`src/`, or `src/bin/<name>/`).
    root: PathBuf,
    modules: BTreeMap<ModulePath, PathBuf>,
}

/// The circles among the files of the crate whose sources are in `src`, each a list of files
/// ending where it started, with what ties each step. Empty when there is none.
pub(super) fn circles(src: &Path) -> anyhow::Result<Vec<String>> {
    let mut found = Vec::new();
    for tree in trees(src)? {
        let graph = graph_of(&tree)?;
        if let Err(circle) = layers(&graph) {
            found.push(describe(&tree, &circle, &graph));
        }
    }
    Ok(found)
}

/// The crate under `src/` and each binary under `src/bin/`.
fn trees(src: &Path) -> anyhow::Result<Vec<Tree>> {
    let mut roots = vec![src.to_owned()];
    let bin = src.join("bin");
    if bin.is_dir() {
        for entry in std::fs::read_dir(&bin)? {
            let path = entry?.path();
            if path.is_dir() {
                roots.push(path);
            }
        }
    }
    let mut trees = Vec::new();
    for root in roots {
        let mut modules = BTreeMap::new();
        for file in rust_files(&root)? {
            let relative = file.strip_prefix(&root).expect("under its root");
            if root == src && relative.starts_with("bin") {
                continue;
            }
            modules.insert(module_path(relative), file);
        }
        trees.push(Tree { root, modules });
    }
    Ok(trees)
}

/// `lb/resources.rs` -> `[lb, resources]`; `lb/mod.rs` -> `[lb]`; `lib.rs`, `main.rs` -> `[]`.
fn module_path(relative: &Path) -> ModulePath {
    let mut parts: ModulePath = relative
        .iter()
        .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_owned())
        .collect();
    if matches!(parts.last().map(String::as_str), Some("mod")) {
        parts.pop();
    }
    if parts.len() == 1 && matches!(parts[0].as_str(), "lib" | "main") {
        parts.clear();
    }
    parts
}

/// Every file's references to other files, keyed by path relative to the tree's root; each
/// edge keeps the first path that makes it.
fn graph_of(tree: &Tree) -> anyhow::Result<Graph> {
    let mut graph = Graph::new();
    for (module, file) in &tree.modules {
        let name = tree.name(file);
        graph.entry(name.clone()).or_default();
        let text = std::fs::read_to_string(file)?;
        for (at, path) in references(&text) {
            if at.first().is_some_and(|m| m == "tests") {
                continue;
            }
            let scope = module.iter().chain(&at).cloned().collect::<ModulePath>();
            let Some(target) = tree.resolve(&scope, &path) else {
                continue;
            };
            // A parent and its children are one module: no tie.
            if target == *module || is_parent(&target, module) || is_parent(module, &target) {
                continue;
            }
            graph
                .entry(name.clone())
                .or_default()
                .entry(tree.name(&tree.modules[&target]))
                .or_insert_with(|| PathBuf::from(path.join("::")));
        }
    }
    Ok(graph)
}

impl Tree {
    fn name(&self, file: &Path) -> String {
        file.strip_prefix(&self.root)
            .expect("under its root")
            .display()
            .to_string()
    }

    /// The module (one with a file) `path` leads to from inside module `scope`: the deepest one
    /// it names. `None` for paths into other crates.
    fn resolve(&self, scope: &[String], path: &[String]) -> Option<ModulePath> {
        let (mut absolute, rest): (ModulePath, &[String]) = match path.first()?.as_str() {
            "crate" => (Vec::new(), &path[1..]),
            "self" => (scope.to_vec(), &path[1..]),
            "super" => {
                let mut at = scope.to_vec();
                let mut rest = path;
                while rest.first().is_some_and(|p| p == "super") {
                    at.pop();
                    rest = &rest[1..];
                }
                (at, rest)
            }
            // A child module of the scope, named bare (`use handover::Handover`).
            _ => (scope.to_vec(), path),
        };
        let bare = !matches!(path[0].as_str(), "crate" | "self" | "super");
        if bare {
            let mut child = absolute.clone();
            child.push(rest.first()?.clone());
            if !self.modules.contains_key(&child) {
                return None;
            }
        }
        let mut deepest = self
            .modules
            .contains_key(&absolute)
            .then(|| absolute.clone());
        for part in rest {
            absolute.push(part.clone());
            if !self.modules.contains_key(&absolute) {
                break;
            }
            deepest = Some(absolute.clone());
        }
        deepest
    }
}

/// Whether `parent` is the module just above `child`.
fn is_parent(parent: &[String], child: &[String]) -> bool {
    child.len() == parent.len() + 1 && child.starts_with(parent)
}

/// The paths `text` references, each with the inline modules (`mod tests`) it sits in.
fn references(text: &str) -> Vec<(ModulePath, Vec<String>)> {
    let mut found = Vec::new();
    let mut inline: Vec<(usize, String)> = Vec::new(); // (indent, name)
    let mut statement: Option<(bool, String)> = None; // a `use` spread over lines: (pub, text)
    for line in text.lines() {
        let code = line.split("//").next().unwrap_or("");
        let indent = code.len() - code.trim_start().len();
        let trimmed = code.trim();
        if inline
            .last()
            .is_some_and(|(at, _)| *at == indent && trimmed == "}")
        {
            inline.pop();
            continue;
        }
        if let Some(name) = inline_module(trimmed) {
            inline.push((indent, name));
            continue;
        }
        let at: ModulePath = inline.iter().map(|(_, n)| n.clone()).collect();
        if let Some((public, mut text)) = statement.take() {
            text.push(' ');
            text.push_str(trimmed);
            if text.ends_with(';') {
                if !public {
                    found.extend(use_paths(&text).into_iter().map(|p| (at.clone(), p)));
                }
            } else {
                statement = Some((public, text));
            }
            continue;
        }
        if let Some((public, tree)) = use_statement(trimmed) {
            if tree.ends_with(';') {
                if !public {
                    found.extend(use_paths(tree).into_iter().map(|p| (at.clone(), p)));
                }
            } else {
                statement = Some((public, tree.to_owned()));
            }
            continue;
        }
        found.extend(code_paths(code).into_iter().map(|p| (at.clone(), p)));
    }
    found
}

/// `mod tests {` (with any visibility) opens an inline module: its name.
fn inline_module(line: &str) -> Option<String> {
    let rest = line.strip_suffix('{')?.trim_end();
    let rest = rest.strip_prefix("pub ").unwrap_or(rest);
    let rest = match rest.strip_prefix("pub(") {
        Some(after) => after.split_once(") ")?.1,
        None => rest,
    };
    let name = rest.strip_prefix("mod ")?;
    (!name.is_empty() && name.chars().all(|c| c.is_alphanumeric() || c == '_'))
        .then(|| name.to_owned())
}

/// A `use` line: whether it re-exports, and the tree after `use`.
fn use_statement(line: &str) -> Option<(bool, &str)> {
    if let Some(tree) = line.strip_prefix("use ") {
        return Some((false, tree));
    }
    let rest = line.strip_prefix("pub")?;
    let rest = match rest.strip_prefix('(') {
        Some(after) => after.split_once(')')?.1,
        None => rest,
    };
    Some((true, rest.trim_start().strip_prefix("use ")?))
}

/// The paths of a use tree (`a::{b::C, d}` -> `a::b::C`, `a::d`), without `as` renames.
fn use_paths(tree: &str) -> Vec<Vec<String>> {
    // Renames go first (`e as f`), then every space.
    let words: Vec<&str> = tree.trim_end_matches(';').split_whitespace().collect();
    let mut kept = String::new();
    let mut i = 0;
    while i < words.len() {
        if words[i] == "as" {
            // `as f,` or `as f}`: keep what follows the new name.
            let renamed = words.get(i + 1).copied().unwrap_or("");
            kept.push_str(renamed.trim_start_matches(|c: char| c.is_alphanumeric() || c == '_'));
            i += 2;
        } else {
            kept.push_str(words[i]);
            i += 1;
        }
    }
    let tree = kept;
    let mut paths = Vec::new();
    expand(&tree, &[], &mut paths);
    paths
}

fn expand(tree: &str, prefix: &[String], out: &mut Vec<Vec<String>>) {
    for item in split_top(tree) {
        let mut path = prefix.to_vec();
        let mut rest = item;
        loop {
            if let Some(group) = rest.strip_prefix('{') {
                expand(group.strip_suffix('}').unwrap_or(group), &path, out);
                break;
            }
            let (head, tail) = match rest.split_once("::") {
                Some((head, tail)) => (head, Some(tail)),
                None => (rest, None),
            };
            if head != "*" && !head.is_empty() {
                path.push(head.to_owned());
            }
            match tail {
                Some(tail) => rest = tail,
                None => {
                    if !path.is_empty() {
                        out.push(path);
                    }
                    break;
                }
            }
        }
    }
}

/// `a, b::{c, d}, e` split at the commas outside braces.
fn split_top(tree: &str) -> Vec<&str> {
    let mut items = Vec::new();
    let (mut depth, mut start) = (0usize, 0);
    for (i, c) in tree.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                items.push(&tree[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(&tree[start..]);
    items.retain(|i| !i.is_empty());
    items
}

/// Paths in code that start at `crate`, `super` or `self`, or at a lowercase name followed by
/// `::` (a child module, kept only if the tree has one by that name); a called function's name
/// is left out.
fn code_paths(code: &str) -> Vec<Vec<String>> {
    let mut paths = Vec::new();
    let bytes = code.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let starts_word = i == 0 || !is_ident(bytes[i - 1]) && bytes[i - 1] != b':';
        if starts_word && bytes[i].is_ascii_lowercase() {
            let mut path = Vec::new();
            let mut j = i;
            loop {
                let end = (j..bytes.len())
                    .find(|&k| !is_ident(bytes[k]))
                    .unwrap_or(bytes.len());
                path.push(code[j..end].to_owned());
                if code[end..].starts_with("::")
                    && end + 2 < bytes.len()
                    && is_ident(bytes[end + 2])
                {
                    j = end + 2;
                } else {
                    i = end;
                    break;
                }
            }
            if path.len() > 1 {
                // A call names a function, never a module, even one of a module's name
                // (`cilium_bgp::peering_policy(..)` where `peering_policy` is both).
                if code[i..].starts_with('(') {
                    path.pop();
                }
                paths.push(path);
            }
        }
        i += 1;
    }
    paths
}

fn is_ident(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

fn describe(tree: &Tree, circle: &[String], graph: &Graph) -> String {
    let ties: Vec<String> = circle
        .windows(2)
        .map(|w| format!("  {} -> {} ({})", w[0], w[1], graph[&w[0]][&w[1]].display()))
        .collect();
    let root = crate::cmd::workspace_root();
    format!(
        "{}: {}\n{}",
        tree.root
            .strip_prefix(&root)
            .unwrap_or(&tree.root)
            .display(),
        circle.join(" -> "),
        ties.join("\n")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(parts: &[&str]) -> Vec<String> {
        parts.iter().map(|p| (*p).to_owned()).collect()
    }

    #[test]
    fn use_trees_expand_to_their_paths() {
        let paths = use_paths("crate::{a::{B, c::D}, e as f, g::*};");
        assert_eq!(
            paths,
            [
                strings(&["crate", "a", "B"]),
                strings(&["crate", "a", "c", "D"]),
                strings(&["crate", "e"]),
                strings(&["crate", "g"]),
            ]
        );
    }

    #[test]
    fn references_know_their_inline_module_and_skip_reexports() {
        let text = "pub use child::Thing;\nuse super::sibling::X;\nfn f() { crate::a::g(); }\n\n#[cfg(test)]\nmod tests {\n    use super::*;\n}\nfn h() { self::b::K }\n";
        let found = references(text);
        assert_eq!(
            found,
            [
                (vec![], strings(&["super", "sibling", "X"])),
                (vec![], strings(&["crate", "a"])),
                (strings(&["tests"]), strings(&["super"])),
                (vec![], strings(&["self", "b", "K"])),
            ]
        );
    }

    #[test]
    fn paths_resolve_to_the_deepest_file_they_name() {
        let files = [
            "lib.rs",
            "lb/mod.rs",
            "lb/resources.rs",
            "pod/mod.rs",
            "pod/pool.rs",
        ];
        let tree = Tree {
            root: PathBuf::from("src"),
            modules: files
                .iter()
                .map(|f| (module_path(Path::new(f)), PathBuf::from("src").join(f)))
                .collect(),
        };
        let resolve = |scope: &[&str], path: &[&str]| {
            tree.resolve(&strings(scope), &strings(path))
                .map(|m| tree.name(&tree.modules[&m]))
        };
        let selector = ["crate", "lb", "resources", "Selector"];
        assert_eq!(
            resolve(&["pod", "pool"], &selector).unwrap(),
            "lb/resources.rs"
        );
        assert_eq!(
            resolve(&["pod", "pool"], &["super", "super", "lb", "X"]).unwrap(),
            "lb/mod.rs"
        );
        assert_eq!(
            resolve(&["lb"], &["resources", "X"]).unwrap(),
            "lb/resources.rs"
        );
        // The tests of `pod/pool.rs` reach back into it.
        assert_eq!(
            resolve(&["pod", "pool", "tests"], &["super"]).unwrap(),
            "pod/pool.rs"
        );
        // Other crates, and names that are no child module, are not files here.
        assert_eq!(resolve(&["lb"], &["std", "fmt"]), None);
        assert_eq!(resolve(&["lb"], &["serde_json", "json"]), None);
        assert_eq!(resolve(&[], &["crate", "Cidr"]).unwrap(), "lib.rs");
    }
}
