//! The workspace's shape, checked from its sources: the crate graph has the layers the README's
//! Architecture section draws (the backends are peers: neither depends on the other; the model
//! and kernel layers depend on no backend), and within each crate the top-level modules import
//! each other without circles.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Every workspace crate: its package name and directory.
fn crates() -> Vec<(String, PathBuf)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(workspace().join("crates")).expect("crates/ readable") {
        let dir = entry.expect("crates/ entry").path();
        let manifest = dir.join("Cargo.toml");
        if let Ok(text) = std::fs::read_to_string(&manifest) {
            let name = text
                .lines()
                .find_map(|l| l.strip_prefix("name = \""))
                .and_then(|l| l.strip_suffix('"'))
                .unwrap_or_else(|| panic!("{}: no package name", manifest.display()));
            out.push((name.to_owned(), dir));
        }
    }
    out.sort();
    out
}

/// The `spindle-*` crates in `[dependencies]` of `manifest` (not dev- or build-dependencies).
fn spindle_dependencies(manifest: &Path) -> BTreeSet<String> {
    let text = std::fs::read_to_string(manifest).expect("manifest readable");
    let mut deps = BTreeSet::new();
    let mut in_deps = false;
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            in_deps = line == "[dependencies]";
            continue;
        }
        if in_deps && line.starts_with("spindle-") {
            let name: String = line
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '-')
                .collect();
            deps.insert(name);
        }
    }
    deps
}

/// A circle in `graph`, if it has one (depth-first search).
fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|n| n == node) {
            let mut cycle = path[at..].to_vec();
            cycle.push(node.to_owned());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_owned());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, graph, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|node| visit(node, graph, &mut Vec::new(), &mut done))
}

#[test]
fn backends_are_peers_over_the_model_and_kernel_layers() {
    let graph: BTreeMap<String, BTreeSet<String>> = crates()
        .into_iter()
        .map(|(name, dir)| (name, spindle_dependencies(&dir.join("Cargo.toml"))))
        .collect();
    assert!(
        graph.contains_key("spindle-cpu"),
        "no spindle-cpu crate: {graph:?}"
    );
    assert!(
        graph.contains_key("spindle-cuda"),
        "no spindle-cuda crate: {graph:?}"
    );
    assert_eq!(find_cycle(&graph), None, "crate graph {graph:?}");
    for backend in ["spindle-cpu", "spindle-cuda"] {
        let deps = &graph[backend];
        for other in [
            "spindle-cpu",
            "spindle-cuda",
            "spindle-runtime",
            "spindle-server",
        ] {
            assert!(
                !deps.contains(other),
                "{backend} depends on {other}: {deps:?}"
            );
        }
    }
    for layer in ["spindle-model", "spindle-kernels", "spindle-text"] {
        let deps = &graph[layer];
        for backend in ["spindle-cpu", "spindle-cuda", "spindle-runtime"] {
            assert!(
                !deps.contains(backend),
                "{layer} depends on {backend}: {deps:?}"
            );
        }
    }
    assert!(
        !graph["spindle-model"].contains("spindle-kernels"),
        "the model layer must not depend on the CPU kernels"
    );
}

/// The top-level modules of a crate's `src/` and, for each, the top-level modules its files
/// name through `crate::` paths.
fn module_graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    fn rust_files(path: &Path, out: &mut Vec<PathBuf>) {
        if path.is_dir() {
            for entry in std::fs::read_dir(path).expect("source dir readable") {
                rust_files(&entry.expect("entry").path(), out);
            }
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path.to_owned());
        }
    }
    let mut modules = BTreeMap::<String, Vec<PathBuf>>::new();
    for entry in std::fs::read_dir(src).expect("src readable") {
        let path = entry.expect("entry").path();
        let stem = path
            .file_stem()
            .expect("file name")
            .to_string_lossy()
            .into_owned();
        if stem == "lib" || stem == "main" {
            continue;
        }
        let mut files = Vec::new();
        rust_files(&path, &mut files);
        if path.is_dir() || path.extension().is_some_and(|e| e == "rs") {
            modules.entry(stem).or_default().extend(files);
        }
    }
    let names: BTreeSet<String> = modules.keys().cloned().collect();
    modules
        .into_iter()
        .map(|(module, files)| {
            let mut uses = BTreeSet::new();
            for file in files {
                let text = std::fs::read_to_string(&file).expect("source readable");
                // Test modules may reach anywhere; only the shipped code's imports count.
                let text = text.split("#[cfg(test)]").next().unwrap_or("");
                for (at, _) in text.match_indices("crate::") {
                    let rest = &text[at + "crate::".len()..];
                    let used: String = rest
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_')
                        .collect();
                    if used != module && names.contains(&used) {
                        uses.insert(used);
                    }
                    // `use crate::{a, b::c}`
                    if rest.starts_with('{') {
                        let group = &rest[1..rest.find('}').unwrap_or(rest.len())];
                        for item in group.split(',') {
                            let used = item.trim().split("::").next().unwrap_or("").trim();
                            if used != module && names.contains(used) {
                                uses.insert(used.to_owned());
                            }
                        }
                    }
                }
            }
            (module, uses)
        })
        .collect()
}

/// The groups of modules that reach each other (strongly connected, more than one module).
fn circles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<BTreeSet<String>> {
    let reach = |from: &String| {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.clone()];
        while let Some(node) = todo.pop() {
            for next in graph.get(&node).into_iter().flatten() {
                if seen.insert(next.clone()) {
                    todo.push(next.clone());
                }
            }
        }
        seen
    };
    let reaches: BTreeMap<&String, BTreeSet<String>> =
        graph.keys().map(|m| (m, reach(m))).collect();
    let mut groups: Vec<BTreeSet<String>> = Vec::new();
    for (module, from) in &reaches {
        let group: BTreeSet<String> = from
            .iter()
            .filter(|other| reaches.get(other).is_some_and(|r| r.contains(*module)))
            .cloned()
            .collect();
        if group.len() > 1 && !groups.contains(&group) {
            groups.push(group);
        }
    }
    groups
}

#[test]
fn no_crate_has_module_import_circles() {
    let mut found = Vec::new();
    for (name, dir) in crates() {
        let graph = module_graph(&dir.join("src"));
        for group in circles(&graph) {
            let edges: Vec<String> = group
                .iter()
                .flat_map(|m| {
                    graph[m]
                        .iter()
                        .filter(|n| group.contains(*n))
                        .map(move |n| format!("{m} -> {n}"))
                })
                .collect();
            found.push(format!("{name}: {}", edges.join(", ")));
        }
    }
    assert!(
        found.is_empty(),
        "module import circles:\n{}",
        found.join("\n")
    );
}
