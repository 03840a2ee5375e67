//! Architecture invariants, checked over `cargo metadata`'s resolved graph and the source:
//! * no planner crate depends on Burn or on the executor, so the planner builds and tests
//!   in seconds;
//! * the edges between pebble's crates are exactly the listed ones (a new edge is a
//!   decision: add it here, and to ARCHITECTURE.md);
//! * no crate has a cycle between modules: between the submodules of any module, each
//!   file one (with its own submodules), down to nested modules; a module's own file
//!   (`mod.rs`, the crate root) wires its submodules and is none of them.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Command;

const PLANNER: [&str; 9] = [
    "pebble-machine",
    "pebble-graph",
    "pebble-schedule",
    "pebble-sim",
    "pebble-zoo",
    "pebble-solve",
    "pebble-ilp",
    "pebble-onnx",
    // The Python module: the planner for pebble.torch, which runs plans in PyTorch.
    "pebble-python",
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
    ("cli", "testkit"),
    ("python", "machine"),
    ("python", "graph"),
    ("python", "schedule"),
    ("python", "sim"),
    ("python", "solve"),
    ("python", "ilp"),
    ("python", "zoo"),
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

/// A crate's source files: each file's name relative to `src/` and its module path
/// (`lib.rs`, `main.rs` → `[]`; `a.rs`, `a/mod.rs` → `[a]`; `a/b.rs` → `[a, b]`).
fn source_files(src: &Path) -> Vec<(String, Vec<String>)> {
    fn walk(dir: &Path, src: &Path, out: &mut Vec<(String, Vec<String>)>) {
        let mut entries: Vec<PathBuf> =
            std::fs::read_dir(dir).expect("readable dir").flatten().map(|e| e.path()).collect();
        entries.sort();
        for path in entries {
            if path.is_dir() {
                walk(&path, src, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let name = path.strip_prefix(src).expect("under src").to_string_lossy().replace('\\', "/");
                let mut module: Vec<String> = name.trim_end_matches(".rs").split('/').map(str::to_string).collect();
                if matches!(module.last().map(String::as_str), Some("mod")) || module == ["lib"] || module == ["main"] {
                    module.pop();
                }
                out.push((name, module));
            }
        }
    }
    let mut out = Vec::new();
    walk(src, src, &mut out);
    out
}

/// Rust source as tokens: identifiers (keywords among them), `::`, and single punctuation
/// characters. Comments and literals are left out, so that a doc link or a message naming
/// a path makes no edge.
fn tokens(text: &str) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    let at = |i: usize| chars.get(i).copied().unwrap_or('\0');
    let is_ident = |c: char| c.is_alphanumeric() || c == '_';
    // The index after a string literal whose opening quote is at `i` (`hashes` for raw strings).
    let string_end = |mut i: usize, raw: Option<usize>| {
        i += 1;
        while i < chars.len() {
            match (chars[i], raw) {
                ('\\', None) => i += 2,
                ('"', None) => return i + 1,
                ('"', Some(n)) if (1..=n).all(|k| at(i + k) == '#') => return i + 1 + n,
                _ => i += 1,
            }
        }
        i
    };
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
        } else if c == '/' && at(i + 1) == '/' {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && at(i + 1) == '*' {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && at(i + 1) == '*' {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && at(i + 1) == '/' {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if c == '"' {
            i = string_end(i, None);
        } else if c == '\'' {
            // A character literal, or a lifetime (whose name then reads as an identifier).
            if at(i + 1) == '\\' {
                i += 3;
                while i < chars.len() && chars[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if at(i + 2) == '\'' {
                i += 3;
            } else {
                i += 1;
            }
        } else if is_ident(c) {
            let start = i;
            while is_ident(at(i)) {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let hashes = (i..).take_while(|&k| at(k) == '#').count();
            match word.as_str() {
                "r" | "br" | "cr" if at(i + hashes) == '"' => i = string_end(i + hashes, Some(hashes)),
                // A raw identifier, `r#name`: the name is read next.
                "r" if hashes == 1 => i += 1,
                // A byte or C string's prefix: the literal is read next.
                "b" | "c" if matches!(at(i), '"' | '\'') => {}
                // A number.
                _ if c.is_ascii_digit() => {}
                _ => out.push(word),
            }
        } else if c == ':' && at(i + 1) == ':' {
            out.push("::".to_string());
            i += 2;
        } else {
            out.push(c.to_string());
            i += 1;
        }
    }
    out
}

/// The index of the `}` that closes the `{` at `open`.
fn closing_brace(tokens: &[String], open: usize) -> usize {
    let mut depth = 0;
    for (i, t) in tokens.iter().enumerate().skip(open) {
        match t.as_str() {
            "{" => depth += 1,
            "}" => {
                depth -= 1;
                if depth == 0 {
                    return i;
                }
            }
            _ => {}
        }
    }
    tokens.len()
}

/// `tokens` without the items under `#[cfg(test)]` (test code may reach anywhere), and the
/// module files those items declare (`#[cfg(test)] mod tests;`).
fn without_tests(tokens: &[String]) -> (Vec<String>, Vec<String>) {
    const CFG_TEST: [&str; 7] = ["#", "[", "cfg", "(", "test", ")", "]"];
    let (mut kept, mut test_modules) = (Vec::new(), Vec::new());
    let mut i = 0;
    while i < tokens.len() {
        if tokens.len() - i < CFG_TEST.len() || !tokens[i..].iter().zip(CFG_TEST).all(|(t, c)| t == c) {
            kept.push(tokens[i].clone());
            i += 1;
            continue;
        }
        // The item runs to its `;` or to the end of its first block, outside brackets.
        let start = i + CFG_TEST.len();
        let (mut end, mut depth) = (start, 0);
        while end < tokens.len() {
            match tokens[end].as_str() {
                "(" | "[" => depth += 1,
                ")" | "]" => depth -= 1,
                ";" if depth == 0 => break,
                "{" if depth == 0 => {
                    end = closing_brace(tokens, end);
                    break;
                }
                _ => {}
            }
            end += 1;
        }
        let item = &tokens[start..end.min(tokens.len())];
        if let Some(w) = item.windows(2).find(|w| w[0] == "mod") {
            if tokens.get(end).is_some_and(|t| t == ";") {
                test_modules.push(w[1].clone());
            }
        }
        i = end + 1;
    }
    (kept, test_modules)
}

/// Every path in `tokens`, with the inline modules (`mod name { … }`) it sits in. A path
/// starts at an identifier followed by `::` and not preceded by `::` or `.`; a `use`
/// group (`a::{b::C, d::{self, E}}`) gives one path per leaf.
fn paths(tokens: &[String]) -> Vec<(Vec<String>, Vec<String>)> {
    /// The paths of the tree starting at `i` under `prefix`, and the index after it.
    fn tree(tokens: &[String], mut i: usize, prefix: Vec<String>) -> (Vec<Vec<String>>, usize) {
        let tok = |i: usize| tokens.get(i).map(String::as_str).unwrap_or("");
        let mut path = prefix;
        let mut out = Vec::new();
        loop {
            match tok(i) {
                "{" => {
                    i += 1;
                    while i < tokens.len() && tok(i) != "}" {
                        let (leaves, next) = tree(tokens, i, path.clone());
                        out.extend(leaves);
                        i = next;
                        while i < tokens.len() && tok(i) != "," && tok(i) != "}" {
                            i += 1; // `as name`
                        }
                        if tok(i) == "," {
                            i += 1;
                        }
                    }
                    return (out, i + 1);
                }
                "*" => return (vec![path], i + 1),
                "self" if !path.is_empty() => i += 1,
                t if t.starts_with(|c: char| c.is_alphabetic() || c == '_') => {
                    path.push(t.to_string());
                    i += 1;
                }
                _ => break,
            }
            if tok(i) != "::" {
                break;
            }
            i += 1;
        }
        out.push(path);
        (out, i)
    }
    let tok = |i: usize| tokens.get(i).map(String::as_str).unwrap_or("");
    let mut out = Vec::new();
    // The inline modules open at `i`, each with the brace depth outside it.
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0;
    let mut i = 0;
    while i < tokens.len() {
        let t = tok(i);
        let starts_path = t.starts_with(|c: char| c.is_alphabetic() || c == '_')
            && tok(i + 1) == "::"
            && (i == 0 || (tok(i - 1) != "::" && tok(i - 1) != "."));
        if starts_path {
            let (leaves, next) = tree(tokens, i, Vec::new());
            let scope: Vec<String> = inline.iter().map(|(m, _)| m.clone()).collect();
            out.extend(leaves.into_iter().map(|p| (scope.clone(), p)));
            i = next;
            continue;
        }
        match t {
            "{" => {
                if i >= 2 && tok(i - 2) == "mod" {
                    inline.push((tok(i - 1).to_string(), depth));
                }
                depth += 1;
            }
            "}" => {
                depth -= 1;
                if inline.last().is_some_and(|&(_, d)| d == depth) {
                    inline.pop();
                }
            }
            _ => {}
        }
        i += 1;
    }
    out
}

/// The module of `known` a path in `module` names: the longest prefix of the path that is
/// one, read from the root for `crate::a::b::C`, from the parent for `super::x`, and from
/// `module` itself for `self::x` and a bare `x::…` (so a bare path that starts with no
/// child module, an external crate's or a type's, names `module` itself).
fn resolve(module: &[String], path: &[String], known: &BTreeSet<Vec<String>>) -> Option<Vec<String>> {
    let supers = path.iter().take_while(|s| *s == "super").count();
    let mut full: Vec<String> = match path.first().map(String::as_str) {
        Some("crate") => path[1..].to_vec(),
        Some("self") => module.iter().chain(&path[1..]).cloned().collect(),
        Some("super") => module[..module.len().checked_sub(supers)?].iter().chain(&path[supers..]).cloned().collect(),
        _ => module.iter().chain(path).cloned().collect(),
    };
    while !known.contains(&full) {
        full.pop()?;
    }
    Some(full)
}

/// The module edges of a crate, at every level of its module tree: `a → b` when non-test
/// code of a file in `a` names a path into `b` (`crate::m::n::X`, `super::x`, `self::x`, a
/// child module's `x::Y`, through `use` groups), `a` and `b` being submodules of one module
/// (each with its own submodules). A module's own file, `mod.rs` or the crate root, is no
/// node among its submodules: it declares and wires them, and they may use what it
/// defines. A module is named by its file, or by its directory (`pipeline/`) when it has
/// submodules; each edge carries the first path that makes it, with its file. Comments
/// and strings do not count; test code (items under `#[cfg(test)]`, and the module files
/// they declare) may reach anywhere.
fn module_edges(src: &Path) -> BTreeMap<String, BTreeMap<String, String>> {
    /// A source file as the scanner reads it: its name, module path, tokens without test
    /// code, and the module files its test code declares.
    struct File {
        name: String,
        module: Vec<String>,
        code: Vec<String>,
        tests: Vec<String>,
    }
    let files: Vec<File> = source_files(src)
        .into_iter()
        .map(|(name, module)| {
            let text = std::fs::read_to_string(src.join(&name)).expect("readable source");
            let (code, tests) = without_tests(&tokens(&text));
            File { name, module, code, tests }
        })
        .collect();
    let test_modules: Vec<Vec<String>> =
        files.iter().flat_map(|f| f.tests.iter().map(|t| f.module.iter().chain([t]).cloned().collect())).collect();
    let files: Vec<File> =
        files.into_iter().filter(|f| !test_modules.iter().any(|t| f.module.starts_with(t))).collect();
    let known: BTreeSet<Vec<String>> = files.iter().map(|f| f.module.clone()).collect();
    let node = |module: &[String]| match files.iter().find(|f| f.module == module) {
        Some(f) if !known.iter().any(|m| m.len() > module.len() && m.starts_with(module)) => f.name.clone(),
        _ => format!("{}/", module.join("/")),
    };
    let mut edges: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for File { name, module, code, .. } in &files {
        for (scope, path) in paths(code) {
            let here: Vec<String> = module.iter().chain(&scope).cloned().collect();
            let Some(to) = resolve(&here, &path, &known) else { continue };
            // Below the modules' common ancestor, the submodules each is in.
            let common = module.iter().zip(&to).take_while(|(a, b)| a == b).count();
            if common == module.len() || common == to.len() {
                continue; // a module and one of its own submodules
            }
            let evidence = format!("`{}` in {name}", path.join("::"));
            let targets = edges.entry(node(&module[..=common])).or_default();
            targets.entry(node(&to[..=common])).or_insert(evidence);
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

/// Cycles of `edges`, each found with [`find_cycle`] and then broken at its last edge, until
/// none is left: every cycle of `edges` shares an edge with one of them.
fn cycles(edges: &BTreeMap<String, BTreeMap<String, String>>) -> Vec<Vec<String>> {
    let mut graph: BTreeMap<String, BTreeSet<String>> =
        edges.iter().map(|(from, to)| (from.clone(), to.keys().cloned().collect())).collect();
    let mut found = Vec::new();
    while let Some(cycle) = find_cycle(&graph) {
        let [.., last, first] = cycle.as_slice() else { unreachable!("a cycle has an edge") };
        graph.get_mut(last).expect("on the cycle").remove(first);
        found.push(cycle);
    }
    found
}

#[test]
fn no_crate_has_a_module_cycle() {
    let meta = metadata();
    let mut found = Vec::new();
    for (name, dir) in &meta.dirs {
        let src = dir.join("src");
        if !src.is_dir() {
            continue;
        }
        let edges = module_edges(&src);
        for cycle in cycles(&edges) {
            // Each step with the path that makes it.
            let steps: Vec<String> = cycle.windows(2).map(|w| format!("{} ({})", w[1], edges[&w[0]][&w[1]])).collect();
            found.push(format!("{name}: {} → {}", cycle[0], steps.join(" → ")));
        }
    }
    assert!(
        found.is_empty(),
        "module cycles (move what both sides need into a module both use):\n{}",
        found.join("\n")
    );
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
}

#[test]
fn the_scanner_sees_paths_between_files() {
    let dir = std::env::temp_dir().join(format!("pebble-arch-{}", std::process::id()));
    let files = [
        // The root and `a/mod.rs` wire their submodules: no edge either way.
        ("lib.rs", "mod a; mod b; mod c; mod d; pub use a::X; fn f() { b::g() }"),
        ("a/mod.rs", "mod x; mod y; pub use x::X; pub fn helper() {}"),
        // Siblings, through a `use` group with `self`; a comment and a string name no path.
        ("a/x.rs", "use super::y::{self, Y}; // crate::b::z\nfn f() { let _ = \"crate::b::z\"; }"),
        // Into another module's subtree: the edge is `a/ → b/`.
        ("a/y.rs", "use crate::{a::helper, b::{z::Z}};\npub struct Y;"),
        ("b/mod.rs", "mod z; #[cfg(test)]\nmod tests;"),
        ("b/z.rs", "pub fn g() { crate::a::x::f() }\n#[cfg(test)]\nmod t { use crate::c; }"),
        // Test code reaches anywhere.
        ("b/tests.rs", "use crate::d;"),
        // An inline module's `super` is its file's module.
        ("c.rs", "mod inner { use super::super::d::D; }"),
        ("d.rs", "fn f<'a>(s: &'a str) { let _ = ('\"', r#\"crate::c\"#); self::g() }\nfn g() {}"),
    ];
    for (name, text) in files {
        let path = dir.join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
    let e = module_edges(&dir);
    std::fs::remove_dir_all(&dir).unwrap();
    let found: Vec<(&str, &str)> =
        e.iter().flat_map(|(a, to)| to.keys().map(move |b| (a.as_str(), b.as_str()))).collect();
    assert_eq!(found, [("a/", "b/"), ("a/x.rs", "a/y.rs"), ("b/", "a/"), ("c.rs", "d.rs")]);
    assert_eq!(e["a/"]["b/"], "`crate::b::z::Z` in a/y.rs");
    assert_eq!(cycles(&e), [["a/", "b/", "a/"]]);
}
