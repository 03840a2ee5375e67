//! Architecture invariant: no planner crate depends on Burn (or on the executor), so the
//! planner builds and tests in seconds. Checked over `cargo metadata`'s resolved graph.

use std::collections::{HashMap, HashSet};
use std::process::Command;

const PLANNER: [&str; 7] =
    ["pebble-graph", "pebble-schedule", "pebble-sim", "pebble-zoo", "pebble-solve", "pebble-ilp", "pebble-onnx"];

#[test]
fn planner_crates_do_not_depend_on_burn() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["metadata", "--format-version", "1"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo metadata runs");
    assert!(out.status.success(), "cargo metadata failed: {}", String::from_utf8_lossy(&out.stderr));
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).expect("metadata is JSON");
    let names: HashMap<&str, &str> = meta["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .map(|p| (p["id"].as_str().expect("id"), p["name"].as_str().expect("name")))
        .collect();
    let deps: HashMap<&str, Vec<&str>> = meta["resolve"]["nodes"]
        .as_array()
        .expect("resolve")
        .iter()
        .map(|n| {
            let ds = n["deps"]
                .as_array()
                .expect("deps")
                .iter()
                .filter(|d| d["dep_kinds"].as_array().is_some_and(|k| k.iter().any(|k| k["kind"].is_null())))
                .map(|d| d["pkg"].as_str().expect("pkg"))
                .collect();
            (n["id"].as_str().expect("id"), ds)
        })
        .collect();
    for planner in PLANNER {
        let root = names.iter().find(|(_, &n)| n == planner).map(|(&id, _)| id);
        let Some(root) = root else { panic!("{planner} is not in the workspace") };
        let mut seen = HashSet::new();
        let mut stack = vec![root];
        while let Some(id) = stack.pop() {
            if !seen.insert(id) {
                continue;
            }
            let name = names[id];
            assert!(
                !name.starts_with("burn") && name != "pebble-runtime" && name != "cubecl",
                "{planner} depends (normally, transitively) on {name}"
            );
            stack.extend(deps.get(id).into_iter().flatten());
        }
    }
}
