//! Architecture invariants, checked over `cargo metadata`'s resolved graph and the source:
//! * no planner crate depends on Burn or on the executor, so the planner builds and tests
//!   in seconds;
//! * the edges between pebble's crates are exactly the listed ones (a new edge is a
//!   decision: add it here, and to ARCHITECTURE.md);
//! * no crate has a cycle between its top-level modules.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Command;

const PLANNER: [&str; 8] = [
    "pebble-machine",
    "pebble-graph",
    "pebble-schedule",
    "pebble-sim",
    "pebble-zoo",
    "pebble-solve",
    "pebble-ilp",
    "pebble-onnx",
];

/// Every allowed edge between pebble crates, of any kind (normal, dev, build), as
/// `(from, to)` without the `pebble-` prefix.
const ALLOWED: &[(&str, &str)] = &[
    ("schedule", "graph"),
    ("sim", "machine"),
    ("sim", "graph"),
    ("sim", "schedule"),
    ("sim", "testkit"),
    ("zoo", "machine"),
    ("zoo", "graph"),
    ("solve", "machine"),
    ("solve", "graph"),
    ("solve", "schedule"),
    ("solve", "sim"),
    ("solve", "zoo"),
    ("solve", "testkit"),
    ("ilp", "graph"),
    ("ilp", "schedule"),
    ("ilp", "sim"),
    ("ilp", "solve"),
    ("ilp", "zoo"),
    ("ilp", "testkit"),
    ("onnx", "zoo"),
    ("onnx", "graph"),
    ("onnx", "solve"),
    ("runtime", "graph"),
    ("runtime", "schedule"),
    ("runtime", "zoo"),
    ("train", "machine"),
    ("train", "graph"),
    ("train", "schedule"),
    ("train", "sim"),
    ("train", "solve"),
    ("train", "ilp"),
    ("train", "zoo"),
    ("train", "runtime"),
    ("train", "testkit"),
    ("testkit", "graph"),
    ("testkit", "zoo"),
    ("cli", "machine"),
    ("cli", "graph"),
    ("cli", "schedule"),
    ("cli", "sim"),
    ("cli", "solve"),
    ("cli", "ilp"),
    ("cli", "zoo"),
    ("cli", "onnx"),
    ("cli", "runtime"),
    ("cli", "train"),
];

struct Metadata {
    /// Package id → name.
    names: HashMap<String, String>,
    /// Package id → (dependency id, normal dependency?).
    deps: HashMap<String, Vec<(String, bool)>>,
    /// Workspace package name → manifest directory.
    dirs: BTreeMap<String, PathBuf>,
}

fn metadata() -> Metadata {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["metadata", "--format-version", "1"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo metadata runs");
    assert!(out.status.success(), "cargo metadata failed: {}", String::from_utf8_lossy(&out.stderr));
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).expect("metadata is JSON");
    let packages = meta["packages"].as_array().expect("packages");
    let names = packages
        .iter()
        .map(|p| (p["id"].as_str().expect("id").to_string(), p["name"].as_str().expect("name").to_string()))
        .collect();
    let members: HashSet<&str> =
        meta["workspace_members"].as_array().expect("members").iter().map(|m| m.as_str().expect("id")).collect();
    let dirs = packages
        .iter()
        .filter(|p| members.contains(p["id"].as_str().expect("id")))
        .map(|p| {
            let manifest = PathBuf::from(p["manifest_path"].as_str().expect("manifest"));
            (p["name"].as_str().expect("name").to_string(), manifest.parent().expect("dir").to_path_buf())
        })
        .collect();
    let deps = meta["resolve"]["nodes"]
        .as_array()
        .expect("resolve")
        .iter()
        .map(|n| {
            let ds = n["deps"]
                .as_array()
                .expect("deps")
                .iter()
                .map(|d| {
                    let normal = d["dep_kinds"].as_array().is_some_and(|k| k.iter().any(|k| k["kind"].is_null()));
                    (d["pkg"].as_str().expect("pkg").to_string(), normal)
                })
                .collect();
            (n["id"].as_str().expect("id").to_string(), ds)
        })
        .collect();
    Metadata { names, deps, dirs }
}

#[test]
fn planner_crates_do_not_depend_on_burn() {
    let meta = metadata();
    for planner in PLANNER {
        let root = meta.names.iter().find(|(_, n)| n.as_str() == planner).map(|(id, _)| id.clone());
        let Some(root) = root else { panic!("{planner} is not in the workspace") };
        let mut seen = HashSet::new();
        let mut stack = vec![root];
        while let Some(id) = stack.pop() {
            if !seen.insert(id.clone()) {
                continue;
            }
            let name = &meta.names[&id];
            assert!(
                !name.starts_with("burn") && name != "pebble-runtime" && name != "pebble-train" && name != "cubecl",
                "{planner} depends (normally, transitively) on {name}"
            );
            let normal = meta.deps.get(&id).into_iter().flatten().filter(|(_, normal)| *normal);
            stack.extend(normal.map(|(d, _)| d.clone()));
        }
    }
}

#[test]
fn crate_edges_are_the_listed_ones() {
    let meta = metadata();
    let short = |name: &str| name.strip_prefix("pebble-").map(str::to_string);
    let mut found = BTreeSet::new();
    for (id, deps) in &meta.deps {
        let Some(from) = short(&meta.names[id]) else { continue };
        for (dep, _) in deps {
            if let Some(to) = short(&meta.names[dep]) {
                found.insert((from.clone(), to));
            }
        }
    }
    let allowed: BTreeSet<(String, String)> = ALLOWED.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect();
    let extra: Vec<_> = found.difference(&allowed).collect();
    assert!(extra.is_empty(), "edges not in ALLOWED (add them deliberately): {extra:?}");
    // The executor only executes: it never plans, simulates or solves.
    for forbidden in ["solve", "sim", "ilp", "train", "onnx"] {
        assert!(!found.contains(&("runtime".to_string(), forbidden.to_string())), "runtime depends on {forbidden}");
    }
    // The list holds no stale entry either, so that it stays the map of the workspace.
    let stale: Vec<_> = allowed.difference(&found).collect();
    assert!(stale.is_empty(), "ALLOWED lists edges that no longer exist: {stale:?}");
}

/// The top-level modules of a crate: `src/NAME.rs` or `src/NAME/`, with every `.rs` file
/// of each; `lib.rs`/`main.rs` (the root, which wires modules together) are left out.
fn modules(src: &Path) -> BTreeMap<String, Vec<PathBuf>> {
    fn files(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).expect("readable dir").flatten() {
            let path = entry.path();
            if path.is_dir() {
                files(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let mut mods: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
    for entry in std::fs::read_dir(src).expect("src").flatten() {
        let path = entry.path();
        let stem = path.file_stem().expect("name").to_string_lossy().to_string();
        if path.is_dir() {
            let mut v = Vec::new();
            files(&path, &mut v);
            mods.entry(stem).or_default().extend(v);
        } else if path.extension().is_some_and(|e| e == "rs") && stem != "lib" && stem != "main" {
            mods.entry(stem).or_default().push(path);
        }
    }
    mods
}

/// The module edges of a crate: `a → b` when a non-test line of module `a` names
/// `crate::b`, or `super::b` from `a`'s top file. Comments (doc links) do not count, and
/// test code (files named `tests.rs`, everything after a `#[cfg(test)]` line) may reach
/// anywhere.
fn module_edges(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mods = modules(src);
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (m, files) in &mods {
        for file in files {
            if file.file_name().is_some_and(|n| n == "tests.rs" || n == "solver_tests.rs") {
                continue;
            }
            let text = std::fs::read_to_string(file).expect("readable source");
            let code: String = text
                .split("#[cfg(test)]")
                .next()
                .unwrap_or("")
                .lines()
                .filter(|l| !l.trim_start().starts_with("//"))
                .collect::<Vec<_>>()
                .join("\n");
            let code = code.as_str();
            let top_file = file.parent() == Some(src);
            for (prefix, applies) in [("crate::", true), ("super::", top_file)] {
                if !applies {
                    continue;
                }
                for (i, _) in code.match_indices(prefix) {
                    let rest = &code[i + prefix.len()..];
                    let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                    if name != *m && mods.contains_key(&name) {
                        edges.entry(m.clone()).or_default().insert(name);
                    }
                }
                // `use crate::{a::X, b::Y}`.
                for (i, _) in code.match_indices(&format!("{prefix}{{")) {
                    let rest = &code[i + prefix.len() + 1..];
                    let group = &rest[..rest.find('}').unwrap_or(rest.len())];
                    for item in group.split(',') {
                        let name: String =
                            item.trim().chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                        if name != *m && mods.contains_key(&name) {
                            edges.entry(m.clone()).or_default().insert(name);
                        }
                    }
                }
            }
        }
    }
    edges
}

/// A cycle of `edges`, if any, as the modules along it.
fn find_cycle(edges: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        state: &mut HashMap<String, u8>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        state.insert(node.to_string(), 1);
        path.push(node.to_string());
        for next in edges.get(node).into_iter().flatten() {
            match state.get(next.as_str()) {
                Some(1) => {
                    let start = path.iter().position(|p| p == next).expect("on the path");
                    let mut cycle = path[start..].to_vec();
                    cycle.push(next.clone());
                    return Some(cycle);
                }
                Some(_) => {}
                None => {
                    if let Some(c) = visit(next, edges, state, path) {
                        return Some(c);
                    }
                }
            }
        }
        path.pop();
        state.insert(node.to_string(), 2);
        None
    }
    let mut state = HashMap::new();
    for node in edges.keys() {
        if !state.contains_key(node.as_str()) {
            if let Some(c) = visit(node, edges, &mut state, &mut Vec::new()) {
                return Some(c);
            }
        }
    }
    None
}

#[test]
fn no_crate_has_a_module_cycle() {
    let meta = metadata();
    for (name, dir) in &meta.dirs {
        let src = dir.join("src");
        if !src.is_dir() {
            continue;
        }
        let edges = module_edges(&src);
        assert!(find_cycle(&edges).is_none(), "{name}: module cycle {:?}", find_cycle(&edges));
    }
}

#[test]
fn the_cycle_finder_finds_cycles() {
    let edges = |list: &[(&str, &str)]| {
        let mut m: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (a, b) in list {
            m.entry(a.to_string()).or_default().insert(b.to_string());
        }
        m
    };
    assert_eq!(find_cycle(&edges(&[("a", "b"), ("b", "c")])), None);
    assert_eq!(
        find_cycle(&edges(&[("a", "b"), ("b", "c"), ("c", "a")])),
        Some(vec!["a".into(), "b".into(), "c".into(), "a".into()])
    );
    // The scanner sees `crate::x` paths and `use crate::{x::A, y::B}` groups.
    let dir = std::env::temp_dir().join(format!("pebble-arch-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("x.rs"), "use crate::{y::B, z};\n#[cfg(test)]\nuse crate::w;\n").unwrap();
    std::fs::write(dir.join("y.rs"), "fn f() { crate::x::g() }\n").unwrap();
    std::fs::write(dir.join("z.rs"), "").unwrap();
    std::fs::write(dir.join("w.rs"), "").unwrap();
    let e = module_edges(&dir);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(e["x"], ["y", "z"].iter().map(|s| s.to_string()).collect());
    assert!(find_cycle(&e).is_some());
}
