//! `cargo xtask layers`: the import graph between the top-level modules of each crate, checked
//! for circles, and the order it allows printed from the top down; then the same between files
//! (`files`). `lint` runs it, so a change that makes two modules or two files need each other
//! fails CI with the references that tie them.
//!
//! It reads source text, not the compiler's view: an edge `a -> b` is a reference to `crate::b`
//! from a file of module `a` (a `use` line or a path in the code; comments are skipped). Test
//! modules count too: a test that needs a higher layer is as much a tie as code that does.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
};

use anyhow::{Context as _, bail};

use crate::cmd::workspace_root;

mod files;

/// The crates whose modules are checked (each crate's `src/`).
const CRATES: &[&str] = &[
    "ipam-common",
    "ipam-core",
    "ipam-etcd",
    "ipam-kube",
    "ipam-api",
    "ipam-netlink",
    "ipam-gossip",
    "ipam-sim",
    "ipam-cni",
    "ipam-migrate",
    "ipam-config",
    "ipam-store",
    "ipam-datapath",
    "ipam-daemon",
    "ipamctl",
];

/// Crates whose files are checked for circles but whose modules are not layered (tools and the
/// test kit, with no layers to keep).
const FILES_ONLY: &[&str] = &["xtask", "tests"];

/// For each module, the modules it references, with one file that does for each.
type Graph = BTreeMap<String, BTreeMap<String, PathBuf>>;

pub(crate) fn run() -> anyhow::Result<()> {
    let root = workspace_root();
    let mut circles = Vec::new();
    for name in CRATES {
        let src = root.join(name).join("src");
        let graph = graph_of(&src).with_context(|| format!("reading {}", src.display()))?;
        match layers(&graph) {
            Ok(order) => println!("{name}: {}", order.join(" > ")),
            Err(circle) => circles.push(describe(name, &circle, &graph)),
        }
    }
    if !circles.is_empty() {
        bail!(
            "modules that need each other (move what both need below them, or merge them):\n{}",
            circles.join("\n")
        );
    }
    println!("layers: no circle between the top-level modules of any crate");
    let mut file_circles = Vec::new();
    for name in CRATES.iter().chain(FILES_ONLY) {
        let src = root.join(name).join("src");
        file_circles
            .extend(files::circles(&src).with_context(|| format!("reading {}", src.display()))?);
    }
    if !file_circles.is_empty() {
        bail!(
            "files that need each other (move what both need into a file below them):\n{}",
            file_circles.join("\n")
        );
    }
    println!("layers: no circle between the files of any crate");
    Ok(())
}

/// The graph of `src`'s top-level modules (a file directly in `src/` is its own module, the
/// crate root and binaries aside).
fn graph_of(src: &Path) -> anyhow::Result<Graph> {
    let mut graph = Graph::new();
    for file in rust_files(src)? {
        let relative = file.strip_prefix(src).expect("under src");
        let Some(module) = top_module(relative) else {
            continue;
        };
        graph.entry(module.clone()).or_default();
        let text = std::fs::read_to_string(&file)?;
        for target in references(&text) {
            if target != module {
                graph
                    .entry(module.clone())
                    .or_default()
                    .entry(target)
                    .or_insert_with(|| relative.to_owned());
            }
        }
    }
    // Only modules of this crate: `crate::Cidr` (a re-export at the root) is not a module.
    let modules: BTreeSet<String> = graph.keys().cloned().collect();
    for targets in graph.values_mut() {
        targets.retain(|t, _| modules.contains(t));
    }
    Ok(graph)
}

fn rust_files(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            files.extend(rust_files(&path)?);
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
    Ok(files)
}

/// `pod/agent.rs` -> `pod`, `config.rs` -> `config`; the crate root, `main.rs` and binaries
/// have none (they sit above every module).
fn top_module(relative: &Path) -> Option<String> {
    let first = relative.components().next()?.as_os_str().to_str()?;
    if first == "bin" {
        return None;
    }
    let name = first.strip_suffix(".rs").unwrap_or(first);
    (!matches!(name, "lib" | "main")).then(|| name.to_owned())
}

/// The top-level modules `text` names as `crate::<module>`, in paths or `use crate::{..}`
/// groups, outside comments.
fn references(text: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for line in text.lines() {
        let code = line.split("//").next().unwrap_or("");
        let mut rest = code;
        while let Some(at) = rest.find("crate::") {
            let after = &rest[at + "crate::".len()..];
            if after.starts_with('{') {
                found.extend(group_heads(after));
            } else {
                found.insert(ident(after).to_owned());
            }
            rest = after;
        }
    }
    // A `use crate::{` group spread over lines: its heads are the first identifier of each
    // line at the group's first level.
    let mut in_group = 0usize;
    for line in text.lines() {
        let code = line.split("//").next().unwrap_or("").trim();
        if in_group == 0 {
            if code.starts_with("use crate::{") && !code.ends_with("};") {
                in_group = 1;
            }
            continue;
        }
        if in_group == 1 {
            let head = ident(code);
            if !head.is_empty() && head != "self" {
                found.insert(head.to_owned());
            }
        }
        in_group += code.matches('{').count();
        in_group -= code.matches('}').count().min(in_group);
    }
    found.retain(|m| !m.is_empty() && m.chars().next().is_some_and(char::is_lowercase));
    found
}

/// The first-level names of a one-line `{a::x, b, c::{..}}` group.
fn group_heads(group: &str) -> Vec<String> {
    let mut heads = Vec::new();
    let mut depth = 0;
    let mut start = true;
    for (i, c) in group.char_indices() {
        match c {
            '{' => {
                depth += 1;
                start = depth == 1;
            }
            '}' => {
                depth -= 1;
                if depth == 0 {
                    break;
                }
            }
            ',' if depth == 1 => start = true,
            c if start && depth == 1 && !c.is_whitespace() => {
                heads.push(ident(&group[i..]).to_owned());
                start = false;
            }
            _ => {}
        }
    }
    heads
}

fn ident(text: &str) -> &str {
    let end = text
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(text.len());
    &text[..end]
}

/// The modules from the top down (a module before everything it references), or a circle.
fn layers(graph: &Graph) -> Result<Vec<String>, Vec<String>> {
    let mut order = Vec::new();
    let mut state: BTreeMap<&str, bool> = BTreeMap::new(); // false: on the path, true: done
    for start in graph.keys() {
        let mut path = Vec::new();
        visit(start, graph, &mut state, &mut path, &mut order)?;
    }
    order.reverse();
    Ok(order)
}

fn visit<'g>(
    node: &'g str,
    graph: &'g Graph,
    state: &mut BTreeMap<&'g str, bool>,
    path: &mut Vec<&'g str>,
    order: &mut Vec<String>,
) -> Result<(), Vec<String>> {
    match state.get(node) {
        Some(true) => return Ok(()),
        Some(false) => {
            let from = path.iter().position(|n| *n == node).unwrap_or(0);
            let mut circle: Vec<String> = path[from..].iter().map(|n| (*n).to_owned()).collect();
            circle.push(node.to_owned());
            return Err(circle);
        }
        None => {}
    }
    state.insert(node, false);
    path.push(node);
    for next in graph[node].keys() {
        visit(next, graph, state, path, order)?;
    }
    path.pop();
    state.insert(node, true);
    order.push(node.to_owned());
    Ok(())
}

fn describe(krate: &str, circle: &[String], graph: &Graph) -> String {
    let ties: Vec<String> = circle
        .windows(2)
        .map(|w| {
            let file = &graph[&w[0]][&w[1]];
            format!("  {} -> {} (in {krate}/src/{})", w[0], w[1], file.display())
        })
        .collect();
    format!("{krate}: {}\n{}", circle.join(" -> "), ties.join("\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_in_paths_groups_and_multi_line_groups() {
        let text = "use crate::{a::X, b};\nuse crate::{\n    c::{Y, Z},\n    d,\n};\nfn f() { crate::e::g(); } // crate::nope\n";
        let found: Vec<String> = references(text).into_iter().collect();
        assert_eq!(found, ["a", "b", "c", "d", "e"]);
    }

    #[test]
    fn a_circle_is_found_and_an_order_otherwise() {
        let edge =
            |a: &str, b: &str| (a.to_owned(), [(b.to_owned(), PathBuf::from("f.rs"))].into());
        let mut graph: Graph = [edge("top", "mid"), edge("mid", "low")].into();
        graph.insert("low".into(), BTreeMap::new());
        assert_eq!(layers(&graph).unwrap(), ["top", "mid", "low"]);
        graph.insert(
            "low".into(),
            [("top".to_owned(), PathBuf::from("g.rs"))].into(),
        );
        let circle = layers(&graph).unwrap_err();
        assert_eq!(circle.first(), circle.last());
        assert_eq!(circle.len(), 4);
    }
}
