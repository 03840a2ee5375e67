//! `--onnx FILE`: the ONNX test suite's "light" models through the `pebble` binary.
//! The models are fetched once into `models/onnx/` by `scripts/fetch-onnx-models.sh`.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use serde_json::Value;

mod common;
use common::{ok, pebble};

fn ok_json(args: &[&str]) -> Value {
    ok(args).json()
}

/// Expects bad input: exit code 2 and one line on standard error holding every part.
fn bad_input(args: &[&str], parts: &[&str]) {
    let run = pebble(args);
    assert_eq!(run.code, 2, "pebble {args:?}: expected exit 2, got {}:\n{}", run.code, run.stderr);
    assert_eq!(run.stderr.trim().lines().count(), 1, "one line expected:\n{}", run.stderr);
    for part in parts {
        assert!(run.stderr.contains(part), "`{part}` not in:\n{}", run.stderr);
    }
}

/// A light model, fetched once with the other eight if missing.
fn light(name: &str) -> String {
    static FETCHED: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let dir = FETCHED.get_or_init(|| pebble_onnx::fetch_light_models(&root)).clone().unwrap_or_else(|e| panic!("{e}"));
    dir.join(format!("light_{name}.onnx")).to_str().expect("utf-8 path").to_string()
}

#[test]
fn plan_an_onnx_resnet50_with_rotor() {
    let file = light("resnet50");
    let args = ["plan", "--onnx", &file, "--batch", "8", "--solver", "rotor", "--activation-budget", "50%", "--json"];
    let report = ok_json(&args);
    assert_eq!(report["feasible"], true, "{report}");
    assert_eq!(report["view"], "chain");
    let budget = report["budget_bytes"].as_u64().expect("budget");
    let peak = report["predicted_peak_bytes"].as_u64().expect("peak");
    let activation = report["activation_peak_bytes"].as_u64().expect("activation peak");
    let static_bytes = report["static_bytes"].as_u64().expect("static");
    let planned = report["planned_bytes"].as_u64().expect("planned");
    // 50% of what store-all needs to run (its peak plus the runtime's reserve) less static
    // memory; the solver plans in what the reserve leaves of that.
    let reference = report["store_all_budget_bytes"].as_u64().expect("what 100% is");
    assert!(reference > activation + static_bytes, "{report}");
    assert!(peak <= planned && planned < budget, "{report}");
    assert_eq!(budget, (reference - static_bytes) / 2 + static_bytes, "{report}");
    // Parameters, gradients and Adam's two moments: 4 × 25,557,032 floats.
    assert_eq!(static_bytes, 4 * 4 * 25_557_032);
}

#[test]
fn info_and_graph_take_an_onnx_file() {
    let file = light("resnet50");
    let onnx = ok_json(&["info", "--onnx", &file, "--batch", "8", "--json"]);
    let zoo = ok_json(&["info", "--model", "resnet50", "--batch", "8", "--json"]);
    assert_eq!(onnx["model"], "light_resnet50");
    assert_eq!(onnx["family"], "onnx");
    assert_eq!(onnx["batch"], 8);
    assert_eq!(onnx["image"], 224);
    assert_eq!(onnx["params"], 25_557_032);
    // The same network as the zoo's, op for op in memory.
    for field in ["static_bytes", "store_all_peak_bytes", "activation_peak_bytes"] {
        assert_eq!(onnx[field], zoo[field], "{field}");
    }
    let graph = ok_json(&["graph", "--onnx", &light("squeezenet"), "--batch", "2", "--view", "chain"]);
    assert!(graph["x"].as_array().is_some_and(|x| x.len() > 10), "{graph}");
}

#[test]
fn sweep_and_store_all_on_onnx_models() {
    let file = light("bvlc_alexnet");
    let sweep = ok_json(&[
        "sweep",
        "--onnx",
        &file,
        "--batch",
        "4",
        "--solvers",
        "store-all,chen-sqrt",
        "--points",
        "3",
        "--json",
    ]);
    assert_eq!(sweep["source"], "light_bvlc_alexnet, batch 4, v100");
    assert_eq!(sweep["budgets"].as_array().map(Vec::len), Some(3));
    let plan =
        ok_json(&["plan", "--onnx", &file, "--batch", "4", "--solver", "store-all", "--budget", "100%", "--json"]);
    assert_eq!(plan["feasible"], true);
}

#[test]
fn bad_onnx_files_are_bad_input() {
    let dir = std::env::temp_dir().join(format!("pebble-cli-onnx-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let garbage = dir.join("garbage.onnx");
    std::fs::write(&garbage, b"\xff\xfe definitely not a protobuf \x00\x01").expect("write");
    let g = garbage.to_str().expect("utf-8");
    bad_input(&["plan", "--onnx", g, "--solver", "rotor", "--budget", "50%"], &["--onnx", g, "not an ONNX model"]);
    bad_input(&["info", "--onnx", g], &["--onnx", g]);
    let missing = dir.join("missing.onnx");
    let m = missing.to_str().expect("utf-8");
    bad_input(&["info", "--onnx", m], &["--onnx", m, "cannot read"]);
    let _ = std::fs::remove_dir_all(&dir);
    // The zoo's size options do not apply to a file with its own sizes.
    bad_input(&["info", "--onnx", &light("resnet50"), "--image", "64"], &["--image", "--onnx"]);
    bad_input(&["info", "--onnx", &light("resnet50"), "--batch", "0"], &["--onnx", "batch size must be positive"]);
}

/// HiRemate plans graphs that are not sequential: SqueezeNet's fire modules (two branches
/// joined by a concat, whose gradient two backward nodes accumulate into).
#[test]
fn hiremate_plans_an_onnx_squeezenet() {
    let model = light("squeezenet");
    let j = ok_json(&[
        "plan",
        "--onnx",
        &model,
        "--batch",
        "1",
        "--solver",
        "hiremate",
        "--activation-budget",
        "70%",
        // Each ILP within half a second (the default 10 s lets the save axes take
        // minutes; the default's plans are the benchmarks').
        "--time-limit",
        "0.5",
        "--json",
    ]);
    assert_eq!(j["feasible"], true);
    assert_eq!(j["view"], "graph");
    let peak = j["predicted_peak_bytes"].as_u64().expect("predicted_peak_bytes");
    assert!(peak <= j["budget_bytes"].as_u64().expect("budget_bytes"));
}
