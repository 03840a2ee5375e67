//! The `pebble` command-line contract: flags, JSON fields, messages and exit codes.
//! Every test runs the binary; models are kept small (ResNet-18 at batch 2 and image 64,
//! the MLP) so that the debug build stays fast.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

mod common;
use common::{ok, pebble, Run};

/// A fresh scratch directory for one test, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn join(&self, name: impl AsRef<Path>) -> PathBuf {
        self.0.join(name)
    }
}

impl std::ops::Deref for Scratch {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn scratch(test: &str) -> Scratch {
    let dir = std::env::temp_dir().join(format!("pebble-cli-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    Scratch(dir)
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// Writes `text` to `dir/name` and returns the path.
fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).expect("write");
    p
}

fn chain_text() -> String {
    std::fs::read_to_string(fixture("chain.json")).expect("fixture")
}

const SMALL: [&str; 6] = ["--model", "resnet18", "--batch", "2", "--image", "64"];

/// The concatenation of argument lists.
fn cat<'a>(parts: &[&[&'a str]]) -> Vec<&'a str> {
    parts.iter().flat_map(|p| p.iter().copied()).collect()
}

/// Expects exit code 2 and an `error:` message that contains every one of `needles`.
fn bad_input(args: &[&str], needles: &[&str]) -> Run {
    let run = pebble(args);
    assert_eq!(run.code, 2, "pebble {args:?} should exit 2; stderr:\n{}", run.stderr);
    assert!(run.stderr.starts_with("error: "), "pebble {args:?}: {}", run.stderr);
    for n in needles {
        assert!(run.stderr.contains(n), "pebble {args:?}: `{n}` not in:\n{}", run.stderr);
    }
    run
}

/// Like [`bad_input`], and the message is one line (ours, not clap's usage text).
fn bad_input_one_line(args: &[&str], needles: &[&str]) {
    let run = bad_input(args, needles);
    assert_eq!(run.stderr.trim_end().lines().count(), 1, "pebble {args:?}: more than one line:\n{}", run.stderr);
}

#[test]
fn malformed_chain_json_is_bad_input() {
    let dir = scratch("malformed-chain");
    let p = write(&dir, "c.json", "{\"ftime\": [1,");
    bad_input_one_line(
        &["plan", "--chain", s(&p), "--budget", "10", "--solver", "store-all"],
        &["--chain", "malformed chain"],
    );
}

#[test]
fn negative_size_names_the_field() {
    let dir = scratch("negative-size");
    let p = write(&dir, "c.json", &chain_text().replace("\"x\": [4, 5,", "\"x\": [4, -5,"));
    bad_input_one_line(
        &["plan", "--chain", s(&p), "--budget", "10", "--solver", "store-all"],
        &["field `x[1]`", "non-negative"],
    );
}

#[test]
fn wrong_btime_length_names_the_field() {
    let dir = scratch("btime-length");
    let p = write(&dir, "c.json", &chain_text().replace("[2, 3, 2, 4, 1]", "[2, 3, 2, 4]"));
    bad_input_one_line(
        &["plan", "--chain", s(&p), "--budget", "10", "--solver", "store-all"],
        &["field `btime` has length 4, expected 5"],
    );
}

#[test]
fn unknown_names_are_bad_input() {
    bad_input_one_line(&["info", "--model", "resnet9000"], &["unknown model `resnet9000`", "resnet18"]);
    // The executor's commands name the flag too.
    bad_input_one_line(
        &["train", "--model", "resnet9000", "--solver", "store-all", "--budget", "100%"],
        &["--model: unknown model `resnet9000`"],
    );
    let chain = fixture("chain.json");
    bad_input_one_line(
        &["plan", "--chain", s(&chain), "--budget", "10", "--solver", "magic"],
        &["--solver", "unknown solver `magic`", "store-all", "recompute-all"],
    );
    bad_input_one_line(
        &["sweep", "--chain", s(&chain), "--solvers", "store-all,magic"],
        &["--solvers", "unknown solver `magic`", "chen-sqrt"],
    );
    bad_input_one_line(
        &["info", "--model", "resnet18", "--profile", "tpu9"],
        &["--profile", "unknown device profile `tpu9`", "v100"],
    );
    // The experiments' --profile is the same flag, with the same exit code.
    let out = scratch("unknown-profile-reproduce");
    bad_input_one_line(
        &["reproduce", "hiremate", "--profile", "tpu9", "--out-dir", s(&out.join("new"))],
        &["--profile", "unknown device profile `tpu9`"],
    );
    // A typo gets the nearest known name; a name near none gets no guess.
    bad_input_one_line(
        &["plan", "--model", "GPT2small", "--budget", "50%", "--solver", "rotor"],
        &["--model: unknown model `GPT2small`", "; did you mean `gpt2-small`?"],
    );
    bad_input_one_line(
        &["plan", "--chain", s(&chain), "--budget", "10", "--solver", "rotr"],
        &["--solver: unknown solver `rotr`", "; did you mean `rotor`?"],
    );
    bad_input_one_line(&["info", "--model", "resnet18", "--profile", "v10"], &["; did you mean `v100`?"]);
    let magic = bad_input(&["plan", "--chain", s(&chain), "--budget", "10", "--solver", "magic"], &[]);
    assert!(!magic.stderr.contains("did you mean"), "a guess for `magic`: {}", magic.stderr);
}

#[test]
fn a_profile_file_that_is_not_json_is_named() {
    let dir = scratch("profile-not-json");
    let toml = write(&dir, "machine.toml", "[device]\nmemory = \"16GiB\"\n");
    let message = format!("--profile `{}`: not a JSON device profile", s(&toml));
    bad_input_one_line(&["info", "--model", "resnet18", "--profile", s(&toml)], &[&message]);
    bad_input_one_line(
        &["plan", "--model", "resnet18", "--profile", s(&toml), "--solver", "rotor", "--budget", "50%"],
        &[&message],
    );
}

#[test]
fn the_old_device_flag_of_the_planner_still_names_a_profile() {
    // `--device PROFILE` was the cost profile's flag on the planning commands; it still
    // works for one release, with a warning, and means exactly `--profile PROFILE`.
    let old = pebble(&["info", "--model", "resnet18", "--device", "a100", "--json"]);
    assert_eq!(old.code, 0, "{}", old.stderr);
    assert!(old.stderr.contains("warning: --device a100") && old.stderr.contains("--profile a100"), "{}", old.stderr);
    let new = ok(&["info", "--model", "resnet18", "--profile", "a100", "--json"]);
    assert!(new.stderr.is_empty(), "{}", new.stderr);
    assert_eq!(old.json(), new.json());
    assert_eq!(new.json()["profile"], "a100");
    // Both at once is ambiguous.
    let both = pebble(&["info", "--model", "resnet18", "--device", "a100", "--profile", "v100"]);
    assert_eq!(both.code, 2, "{}", both.stderr);
    // On train, `--device` is where to run: a device that is neither is bad input.
    let run = pebble(&["train", "--model", "mlp", "--device", "tpu", "--budget", "100%", "--solver", "store-all"]);
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(run.stderr.contains("--device") && run.stderr.contains("--profile"), "{}", run.stderr);
}

#[test]
fn options_a_model_does_not_take_are_bad_input() {
    bad_input_one_line(&["info", "--model", "resnet18", "--seq", "128"], &["--seq", "resnet18"]);
    bad_input_one_line(&["info", "--model", "resnet18", "--batch", "0"], &["--batch", "positive"]);
    // A model option without a model is a usage error.
    bad_input_one_line(
        &["plan", "--chain", s(&fixture("chain.json")), "--budget", "10", "--solver", "store-all", "--batch", "2"],
        &["--batch", "--model"],
    );
    bad_input_one_line(
        &["simulate", "--chain", s(&fixture("chain.json")), "--schedule", "s.json", "--view", "chain"],
        &["--view", "--model"],
    );
}

#[test]
fn bad_budgets_are_bad_input() {
    let chain = fixture("chain.json");
    for budget in ["lots", "-4GiB", "4XB", "-5%", "%"] {
        bad_input(&["plan", "--chain", s(&chain), "--solver", "store-all", "--budget", budget], &["--budget", budget]);
    }
    bad_input(
        &["plan", "--chain", s(&chain), "--solver", "store-all", "--activation-budget", "x%"],
        &["--activation-budget"],
    );
    // Exactly one of the two.
    bad_input(&["plan", "--chain", s(&chain), "--solver", "store-all"], &["--budget"]);
    bad_input(
        &["plan", "--chain", s(&chain), "--solver", "store-all", "--budget", "10", "--activation-budget", "10"],
        &["--activation-budget"],
    );
    bad_input(&["plan", "--chain", s(&chain), "--solver", "store-all", "--budget", "10", "--slots", "0"], &["--slots"]);
    bad_input(
        &["plan", "--chain", s(&chain), "--solver", "store-all", "--budget", "10", "--bandwidth", "-1"],
        &["--bandwidth"],
    );
    bad_input(&["sweep", "--chain", s(&chain), "--solvers", "store-all", "--points", "0"], &["--points"]);
}

#[test]
fn missing_files_are_bad_input() {
    let dir = scratch("missing");
    let nowhere = dir.join("nowhere.json");
    bad_input_one_line(
        &["plan", "--chain", s(&nowhere), "--budget", "10", "--solver", "store-all"],
        &["--chain", "nowhere.json", "cannot read"],
    );
    bad_input_one_line(
        &["plan", "--graph", s(&nowhere), "--budget", "10", "--solver", "store-all"],
        &["--graph", "cannot read"],
    );
    bad_input_one_line(
        &["simulate", "--schedule", s(&nowhere), "--chain", s(&fixture("chain.json"))],
        &["--schedule", "cannot read"],
    );
    bad_input_one_line(
        &["graph", "--model", "mlp", "-o", s(&dir.join("no/such/dir/g.json"))],
        &["--output", "cannot write"],
    );
}

#[test]
fn malformed_schedule_is_bad_input() {
    let dir = scratch("malformed-schedule");
    let chain = fixture("chain.json");
    let p =
        write(&dir, "s.json", "{\"version\": 1, \"view\": \"chain\", \"ops\": [{\"op\": \"forward\", \"stage\": -1}]}");
    bad_input_one_line(
        &["simulate", "--schedule", s(&p), "--chain", s(&chain)],
        &["--schedule", "malformed schedule", "ops[0]"],
    );
    let p = write(&dir, "t.json", "not json");
    bad_input_one_line(&["simulate", "--schedule", s(&p), "--chain", s(&chain)], &["--schedule", "malformed schedule"]);
}

#[test]
fn chain_only_solver_on_a_graph_without_stages_is_bad_input() {
    let dir = scratch("no-stages");
    let graph = ok(&["graph", "--model", "mlp", "--batch", "2", "--layers", "2"]).json();
    let mut graph = graph;
    for node in graph["compute"].as_array_mut().expect("compute") {
        node.as_object_mut().expect("node").remove("stage");
    }
    let p = write(&dir, "g.json", &graph.to_string());
    bad_input_one_line(
        &["plan", "--graph", s(&p), "--budget", "100%", "--solver", "chen-sqrt"],
        &["--graph", "not partitioned"],
    );
    // A graph solver still plans it.
    let run = ok(&["plan", "--graph", s(&p), "--budget", "100%", "--solver", "store-all", "--json"]).json();
    assert_eq!(run["view"], "graph");
    assert_eq!(run["overhead"], 0.0);
}

#[test]
fn usage_errors_exit_2() {
    assert_eq!(pebble(&[]).code, 2);
    assert_eq!(pebble(&["plan", "--model", "mlp", "--budget", "1GiB"]).code, 2, "no --solver");
    assert_eq!(pebble(&["frobnicate"]).code, 2);
    let help = ok(&["plan", "--help"]);
    for name in ["store-all", "sequential", "chen-sqrt", "revolve", "recompute-all"] {
        assert!(help.stdout.contains(name), "plan --help lists {name}");
    }
}

#[test]
fn plan_json_on_a_chain() {
    let chain = fixture("chain.json");
    let store_all = ok(&["plan", "--chain", s(&chain), "--budget", "100%", "--solver", "store-all", "--json"]).json();
    assert_eq!(store_all["solver"], "store-all");
    assert_eq!(store_all["view"], "chain");
    assert_eq!(store_all["feasible"], true);
    assert_eq!(store_all["overhead"], 0.0);
    assert_eq!(store_all["budget_bytes"], store_all["store_all_peak_bytes"]);
    let peak = store_all["predicted_peak_bytes"].as_u64().expect("predicted_peak_bytes");
    assert!(peak <= store_all["budget_bytes"].as_u64().expect("budget_bytes"));
    assert_eq!(store_all["predicted_time"], store_all["baseline_time"]);
    assert_eq!(store_all["predicted_time"], 19.0, "the chain's ideal time");
    assert!(store_all["solve_seconds"].as_f64().is_some());
    assert_eq!(store_all["ops"], 9);

    // recompute-all's peak, then one unit below it.
    let at_100 = ok(&["plan", "--chain", s(&chain), "--budget", "100%", "--solver", "recompute-all", "--json"]).json();
    let peak = at_100["predicted_peak_bytes"].as_u64().expect("peak");
    assert!(at_100["overhead"].as_f64().expect("overhead") > 0.0);
    let below = (peak - 1).to_string();
    let run = pebble(&["plan", "--chain", s(&chain), "--budget", &below, "--solver", "recompute-all", "--json"]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    let j = run.json();
    assert_eq!(j["feasible"], false);
    assert_eq!(j["budget_bytes"], peak - 1);
    assert_eq!(j["min_feasible_budget_bytes"], peak);
    assert!(j["solve_seconds"].as_f64().is_some());
    let expected = format!(
        "infeasible: no schedule of `recompute-all` fits in {}; the minimum feasible budget is {peak} (",
        peak - 1
    );
    assert!(run.stderr.starts_with(&expected), "{}", run.stderr);
    assert!(run.stderr.contains("% of store-all)"), "{}", run.stderr);

    // The same without --json: the message, nothing on stdout.
    let run = pebble(&["plan", "--chain", s(&chain), "--budget", &below, "--solver", "recompute-all"]);
    assert_eq!(run.code, 1);
    assert!(run.stdout.is_empty());
    assert!(run.stderr.starts_with(&expected));
}

#[test]
fn plan_summary_is_human() {
    let run = ok(&["plan", "--chain", s(&fixture("chain.json")), "--budget", "80%", "--solver", "chen-sqrt"]);
    assert!(run.stdout.contains("chen-sqrt"), "{}", run.stdout);
    assert!(run.stdout.contains("overhead +15.8%"), "{}", run.stdout);
    let run = ok(&cat(&[&["plan"], &SMALL, &["--budget", "100%", "--solver", "sequential"]]));
    assert!(run.stdout.contains("MiB"), "{}", run.stdout);
}

#[test]
fn activation_budget_adds_static_memory() {
    let plan = |flag: &str| {
        let run = pebble(&cat(&[&["plan"], &SMALL, &[flag, "50%", "--solver", "recompute-all", "--json"]]));
        assert!(run.code == 0 || run.code == 1, "{}", run.stderr);
        run.json()
    };
    let act = plan("--activation-budget");
    let static_bytes = act["static_bytes"].as_u64().expect("static");
    let activation_peak = act["activation_peak_bytes"].as_u64().expect("activation peak");
    let store_all_peak = act["store_all_peak_bytes"].as_u64().expect("store-all peak");
    // Parameters, their gradients and Adam's two states, in fp32: what `info` reports too.
    assert_eq!(static_bytes, 4 * 4 * 11_689_512);
    assert_eq!(activation_peak, store_all_peak - static_bytes);
    // Percentages are of what store-all needs to run: its peak plus the runtime's reserve
    // (64 KiB + 1% of the budget on the v100 profile), the one memory model of every command.
    let reference = act["store_all_budget_bytes"].as_u64().expect("what 100% is");
    let reserve = |b: u64| (64 << 10) + b / 100;
    assert!(reference - reserve(reference) >= store_all_peak, "{reference} leaves too little");
    assert!(reference - 1 - reserve(reference - 1) < store_all_peak, "{reference} is not the least");
    assert_eq!(act["budget_bytes"].as_u64(), Some(static_bytes + (reference - static_bytes) / 2));
    let budget = act["budget_bytes"].as_u64().expect("budget");
    assert_eq!(act["planned_bytes"].as_u64(), Some(budget - reserve(budget)));
    let all = plan("--budget");
    assert_eq!(all["budget_bytes"].as_u64(), Some(reference / 2));
    // An absolute activation budget is added to static memory as is.
    let run = pebble(&cat(&[&["plan"], &SMALL, &["--activation-budget", "1MiB", "--solver", "store-all", "--json"]]));
    assert_eq!(run.json()["budget_bytes"].as_u64(), Some(static_bytes + (1 << 20)));
}

#[test]
fn info_json() {
    let j = ok(&cat(&[&["info"], &SMALL, &["--json"]])).json();
    assert_eq!(j["params"], 11_689_512);
    assert_eq!(j["param_bytes"], 4 * 11_689_512);
    let peak = j["store_all_peak_bytes"].as_u64().expect("peak");
    let static_bytes = j["static_bytes"].as_u64().expect("static");
    // Adam: parameters, their gradients and two moments.
    assert_eq!(static_bytes, 4 * 4 * 11_689_512);
    assert_eq!(j["activation_peak_bytes"].as_u64(), Some(peak - static_bytes));
    assert!(j["flops"].as_f64().expect("flops") > 1e9);
    assert!(j["chain_length"].as_u64().expect("chain length") > 8);
    assert!(j["store_all_time"].as_f64().expect("time") > 0.0);
    // SGD keeps no state: static memory is parameters and gradients.
    let sgd =
        ok(&["info", "--model", "resnet18", "--batch", "2", "--image", "64", "--optimizer", "sgd", "--json"]).json();
    assert_eq!(sgd["static_bytes"], 2 * 4 * 11_689_512);
    // `adamw`, the name `train` takes, sizes the same two moments.
    let adamw =
        ok(&["info", "--model", "resnet18", "--batch", "2", "--image", "64", "--optimizer", "adamw", "--json"]).json();
    assert_eq!(adamw["static_bytes"], 4 * 4 * 11_689_512);
    let human = ok(&["info", "--model", "resnet18", "--batch", "2", "--image", "64"]);
    assert!(human.stdout.contains("11689512"), "{}", human.stdout);
}

#[test]
fn models_lists_the_catalog() {
    let j = ok(&["models", "--json"]).json();
    let models = j.as_array().expect("array");
    let r18 = models.iter().find(|m| m["name"] == "resnet18").expect("resnet18 listed");
    assert_eq!(r18["family"], "resnet");
    assert_eq!(r18["published_params"], 11_689_512);
    assert_eq!(r18["defaults"]["image"], 224);
    assert!(models.iter().any(|m| m["name"] == "mlp"));
    let table = ok(&["models"]);
    assert!(table.stdout.lines().count() > models.len(), "a header and one row per model");
}

#[test]
fn sweep_writes_a_table_and_an_svg() {
    let dir = scratch("sweep");
    let svg = dir.join("sweep.svg");
    let solvers = ["store-all", "sequential", "chen-sqrt", "revolve", "recompute-all"];
    let joined = solvers.join(",");
    let run = ok(&[
        "sweep",
        "--model",
        "resnet18",
        "--batch",
        "2",
        "--image",
        "64",
        "--solvers",
        &joined,
        "--points",
        "4",
        "--svg",
        s(&svg),
    ]);
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(lines.len(), 1 + 4, "a header and 4 rows:\n{}", run.stdout);
    for name in solvers {
        assert!(lines[0].contains(name), "{}", lines[0]);
    }
    // The last budget is the store-all peak, where store-all costs nothing.
    assert!(lines[4].contains("100.0"), "{}", lines[4]);
    assert!(lines[4].contains("+0.0%"), "{}", lines[4]);
    // The first is recompute-all's peak, where store-all does not fit.
    assert!(lines[1].contains('—'), "{}", lines[1]);
    let text = std::fs::read_to_string(&svg).expect("svg written");
    assert!(text.starts_with("<svg"), "an SVG");
    for name in solvers {
        assert!(text.contains(name), "legend names {name}");
    }
    assert!(text.contains("resnet18, image 64, batch 2, v100"), "the title names model, image side, batch and device");

    // JSON: one point per budget and solver.
    let j =
        ok(&["sweep", "--chain", s(&fixture("chain.json")), "--solvers", &joined, "--points", "3", "--json"]).json();
    assert_eq!(j["budgets"].as_array().expect("budgets").len(), 3);
    assert_eq!(j["store_all_peak_bytes"], 39);
    for solver in j["solvers"].as_array().expect("solvers") {
        assert_eq!(solver["points"].as_array().expect("points").len(), 3);
    }
    assert_eq!(j["solvers"][0]["points"][2]["overhead"], 0.0);
}

#[test]
fn plan_then_simulate_round_trips() {
    let dir = scratch("round-trip");
    let chain = fixture("chain.json");
    let chain_source = ["--chain", s(&chain)];
    let cases: [(&[&str], &str); 3] = [(&chain_source, "chen-sqrt"), (&SMALL, "sequential"), (&SMALL, "store-all")];
    for (i, (source, solver)) in cases.iter().enumerate() {
        let schedule = dir.join(format!("s{i}.json"));
        let plan =
            ok(&cat(&[&["plan"], source, &["--budget", "100%", "--solver", solver, "--json", "-o", s(&schedule)]]))
                .json();
        let timeline = dir.join(format!("t{i}.svg"));
        let sim =
            ok(&cat(&[&["simulate", "--schedule", s(&schedule), "--json", "--timeline", s(&timeline)], source])).json();
        assert_eq!(sim["valid"], true);
        assert_eq!(sim["peak_bytes"], plan["predicted_peak_bytes"], "{solver}");
        assert_eq!(sim["makespan"], plan["predicted_time"], "{solver}");
        assert_eq!(sim["view"], plan["view"]);
        assert!(sim["compute_ops"].as_u64().expect("compute ops") > 0);
        assert!(std::fs::read_to_string(&timeline).expect("timeline").starts_with("<svg"));
    }
}

#[test]
fn simulate_reports_invalid_schedules() {
    let dir = scratch("invalid-schedule");
    let chain = fixture("chain.json");
    // B0 before anything: the simulator's message, exit 1.
    let p = write(&dir, "s.json", r#"{"version": 1, "view": "chain", "ops": [{"op": "backward", "stage": 0}]}"#);
    let run = pebble(&["simulate", "--schedule", s(&p), "--chain", s(&chain)]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert!(run.stderr.starts_with("error: invalid schedule"), "{}", run.stderr);
    let run = pebble(&["simulate", "--schedule", s(&p), "--chain", s(&chain), "--json"]);
    assert_eq!(run.code, 1);
    let j = run.json();
    assert_eq!(j["valid"], false);
    assert!(j["error"].as_str().expect("error").contains("op 0"), "{j}");
    // A valid schedule over its budget.
    let schedule = dir.join("store-all.json");
    ok(&["plan", "--chain", s(&chain), "--budget", "100%", "--solver", "store-all", "-o", s(&schedule)]);
    let run = pebble(&["simulate", "--schedule", s(&schedule), "--chain", s(&chain), "--budget", "10", "--json"]);
    assert_eq!(run.code, 1);
    assert!(run.json()["error"].as_str().expect("error").contains("exceeds the budget 10"));
}

/// A schedule replayed on another model than the one it was planned for: the simulator's
/// complaint comes with what each was, as `plan` recorded it.
#[test]
fn simulate_says_what_a_mismatched_schedule_was_planned_for() {
    let dir = scratch("mismatched-schedule");
    let schedule = dir.join("gpt3.json");
    let gpt = |layers: &'static str| ["--model", "gpt", "--layers", layers];
    let mut args = vec!["plan", "--activation-budget", "80%", "--solver", "rotor", "-o", s(&schedule)];
    args.extend(gpt("3"));
    ok(&args);
    let written = std::fs::read_to_string(&schedule).expect("written");
    let planned = pebble_schedule::Schedule::from_json(&written).expect("a schedule").planned_for;
    assert_eq!(planned.as_deref(), Some("gpt, 3 layers, batch 4, v100 (chain of 5 stages)"));
    let mut args = vec!["simulate", "--schedule", s(&schedule)];
    args.extend(gpt("1"));
    let run = pebble(&args);
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert!(
        run.stderr.contains(
            "(it was planned for gpt, 3 layers, batch 4, v100 (chain of 5 stages); this is gpt, 1 layer, batch 4, v100 (chain of 3 stages))"
        ),
        "{}",
        run.stderr
    );
    // On the model it was planned for, no such line.
    let mut args = vec!["simulate", "--schedule", s(&schedule)];
    args.extend(gpt("3"));
    assert_eq!(pebble(&args).code, 0);
}

/// A schedule names each size and training option it was planned with that is not the
/// model's default, so that two plans of one model told apart only by a flag say which.
#[test]
fn a_schedule_names_the_options_it_was_planned_with() {
    let dir = scratch("planned-with");
    let schedule = dir.join("gpt.json");
    let base = ["plan", "--model", "gpt", "--activation-budget", "80%", "--solver", "rotor", "-o", s(&schedule)];
    let planned_for = |extra: &[&str]| {
        ok(&[&base[..], extra].concat());
        let written = std::fs::read_to_string(&schedule).expect("written");
        pebble_schedule::Schedule::from_json(&written).expect("a schedule").planned_for.expect("planned_for")
    };
    assert_eq!(planned_for(&[]), "gpt, batch 4, v100 (chain of 6 stages)");
    assert_eq!(
        planned_for(&["--dtype", "bf16", "--trainable", "0.07", "--seq", "64", "--heads", "1", "--force"]),
        "gpt, sequence 64, 1 head, bf16, 7% trainable, batch 4, v100 (chain of 6 stages)"
    );
    assert_eq!(
        planned_for(&["--trainable", "0.0001234", "--force"]),
        "gpt, 0.012% trainable, batch 4, v100 (chain of 6 stages)"
    );
}

#[test]
fn graph_writes_both_views() {
    let dir = scratch("graph");
    let chain_path = dir.join("chain.json");
    ok(&["graph", "--model", "mlp", "--batch", "2", "--view", "chain", "-o", s(&chain_path)]);
    let chain =
        pebble_graph::Chain::from_json(&std::fs::read_to_string(&chain_path).expect("written")).expect("a chain");
    assert_eq!(chain.len(), 4);
    let graph_path = dir.join("graph.json");
    ok(&["graph", "--model", "mlp", "--batch", "2", "-o", s(&graph_path)]);
    // What a user wrote is kept unless --force: graph, plan's -o and sweep's --svg alike.
    let before = std::fs::read_to_string(&chain_path).expect("written");
    bad_input(&["graph", "--model", "mlp", "-o", s(&chain_path)], &["--output", "exists", "--force"]);
    bad_input(
        &["plan", "--model", "mlp", "--budget", "100%", "--solver", "store-all", "-o", s(&chain_path)],
        &["--output", "exists", "--force"],
    );
    bad_input(&["sweep", "--model", "mlp", "--points", "2", "--svg", s(&chain_path)], &["--svg", "exists", "--force"]);
    assert_eq!(std::fs::read_to_string(&chain_path).expect("kept"), before);
    ok(&["graph", "--model", "mlp", "--batch", "2", "--view", "chain", "-o", s(&chain_path), "--force"]);
    pebble_graph::TrainingGraph::from_json(&std::fs::read_to_string(&graph_path).expect("written")).expect("a graph");
    // Both files plan: a chain solver on the graph file goes through its partition.
    let on_chain =
        ok(&["plan", "--chain", s(&chain_path), "--budget", "100%", "--solver", "chen-sqrt", "--json"]).json();
    let on_graph =
        ok(&["plan", "--graph", s(&graph_path), "--budget", "100%", "--solver", "chen-sqrt", "--json"]).json();
    assert_eq!(on_graph["view"], "chain");
    assert_eq!(on_chain["predicted_peak_bytes"], on_graph["predicted_peak_bytes"]);
}

#[test]
fn a_closed_stdout_is_no_failure() {
    // The graph of ResNet-18 is far larger than a pipe's buffer.
    let mut child = Command::new(env!("CARGO_BIN_EXE_pebble"))
        .args(["graph", "--model", "resnet18", "--batch", "2", "--image", "64"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut first = [0u8; 16];
    child.stdout.as_mut().expect("stdout").read_exact(&mut first).expect("some output");
    drop(child.stdout.take());
    let mut stderr = String::new();
    child.stderr.as_mut().expect("stderr").read_to_string(&mut stderr).expect("stderr");
    let status = child.wait().expect("exits");
    assert!(status.success(), "exit {status:?}, stderr:\n{stderr}");
    assert!(stderr.is_empty(), "{stderr}");
}

const TINY_GPT: [&str; 12] =
    ["--model", "gpt", "--layers", "2", "--width", "32", "--heads", "4", "--seq", "32", "--batch", "2"];

#[test]
fn train_json_has_the_contract_fields() {
    let args = cat(&[&["train"], &TINY_GPT, &["--budget", "100%", "--solver", "rotor", "--steps", "3", "--json"]]);
    let j = ok(&args).json();
    for field in [
        "losses",
        "step_seconds",
        "budget_bytes",
        "measured_peak_bytes",
        "predicted_peak_bytes",
        "store_all_predicted_peak_bytes",
        "store_all_predicted_time",
    ] {
        assert!(j.get(field).is_some(), "train --json lacks `{field}`: {j}");
    }
    assert_eq!(j["losses"].as_array().expect("losses").len(), 3);
    let measured = j["measured_peak_bytes"].as_u64().expect("the binary counts its allocations");
    assert!(measured <= j["budget_bytes"].as_u64().expect("budget"), "{j}");
}

/// An offloading plan's run prints its link and stall beside the simulated ones, and its
/// JSON has them per step.
#[test]
fn train_prints_transfers_beside_the_simulated_ones() {
    let plan = ["--budget", "95%", "--solver", "offload-greedy", "--costs", "profiled", "--bandwidth", "1e9"];
    let text = ok(&cat(&[&["train"], &TINY_GPT, &plan, &["--steps", "2"]])).stdout;
    for needle in ["simulated", "link      device→host busy", "compute stall", "host      peak"] {
        assert!(text.contains(needle), "no `{needle}` in:\n{text}");
    }
    let j = ok(&cat(&[&["train"], &TINY_GPT, &plan, &["--steps", "2", "--json"]])).json();
    assert!(j["predicted_d2h_busy"].as_f64().expect("predicted_d2h_busy") > 0.0, "{j}");
    assert_eq!(j["d2h_busy"].as_array().expect("d2h_busy").len(), 2, "{j}");
    let measured = j["measured_peak_bytes"].as_u64().expect("counting");
    assert!(measured <= j["budget_bytes"].as_u64().expect("budget"), "{j}");
}

#[test]
fn train_reports_bad_input_and_infeasible_budgets() {
    bad_input(&cat(&[&["train"], &TINY_GPT, &["--budget", "50%", "--solver", "nope"]]), &["--solver", "nope"]);
    bad_input(&["train", "--model", "nope", "--budget", "50%", "--solver", "rotor"], &["nope"]);
    bad_input(&cat(&[&["train"], &TINY_GPT, &["--image", "32", "--budget", "50%", "--solver", "rotor"]]), &["image"]);
    // Without the feature (or without a driver), CUDA is refused with a message, not a panic.
    bad_input(
        &cat(&[&["train"], &TINY_GPT, &["--budget", "100%", "--solver", "rotor", "--device", "cuda"]]),
        &["--device cuda"],
    );
    let run = pebble(&cat(&[&["train"], &TINY_GPT, &["--budget", "1KiB", "--solver", "rotor", "--steps", "1"]]));
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert!(run.stderr.contains("minimum feasible budget"), "{}", run.stderr);
}

#[test]
fn profile_writes_a_graph_the_planner_reads() {
    let dir = scratch("profile");
    let graph = dir.join("gpt.json");
    ok(&cat(&[&["profile"], &TINY_GPT, &["-o", s(&graph)]]));
    let j = ok(&["plan", "--graph", s(&graph), "--budget", "95%", "--solver", "rotor", "--json"]).json();
    assert_eq!(j["feasible"], true, "{j}");
}

/// `offload-bound` is taken where a solver is, and gives Proposition 3's time with no
/// schedule: on the fixture (Σu = 19, keep-all peak 39) at β = 0.25 unit per time unit,
/// budget 35 leaves Q = 4 to move both ways, 2·4/0.25 = 32; budget 30, 2·9/0.25 = 72;
/// below 26 some layer does not fit alone.
#[test]
fn offload_bound_is_a_time_without_a_schedule() {
    let chain = fixture("chain.json");
    let plan = |budget: &str, solver: &str| {
        pebble(&["plan", "--chain", s(&chain), "--budget", budget, "--solver", solver, "--bandwidth", "0.25", "--json"])
    };
    for (budget, time) in [("39", 19.0), ("35", 32.0), ("30", 72.0)] {
        let bound = plan(budget, "offload-bound");
        assert_eq!(bound.code, 0, "{}", bound.stderr);
        let j = bound.json();
        assert_eq!((j["bound"].clone(), j["predicted_time"].clone()), (true.into(), time.into()), "budget {budget}");
        let dp = plan(budget, "offload-dp").json();
        assert!(dp["predicted_time"].as_f64().expect("time") >= time, "offload-dp beats the bound at {budget}");
    }
    let run = plan("25", "offload-bound");
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert_eq!(run.json()["min_feasible_budget_bytes"], 26);
    bad_input(
        &["plan", "--chain", s(&chain), "--budget", "35", "--solver", "offload-bound", "--output", "x.json"],
        &["--output", "a bound"],
    );
    // In a sweep, the bound is a column beside the solvers, marked as one.
    let sweep =
        ok(&["sweep", "--chain", s(&chain), "--solvers", "offload-bound,offload-dp", "--points", "3", "--json"]).json();
    let names: Vec<_> = sweep["solvers"].as_array().expect("solvers").iter().map(|c| c["solver"].clone()).collect();
    assert_eq!(names, ["offload-dp", "offload-bound"]);
    assert_eq!(sweep["solvers"][1]["bound"], true);
    assert_eq!(sweep["solvers"][0]["bound"], false);
}

/// Weight offloading end to end on a chain with weights: the plan is a periodic
/// schedule, `simulate` replays it to the same period, and no method beats the bound.
#[test]
fn weight_offloading_plans_replay_and_stay_above_the_bound() {
    let dir = scratch("weights");
    let chain = write(
        &dir.0,
        "weights.json",
        r#"{"ftime":[1,1,1,1],"btime":[2,2,2,2,0],"x":[1,1,1,1,1],"xbar":[1,1,1,1,1],
            "ftmp":[0,0,0,0],"btmp":[0,0,0,0,0],"w":[10,10,10,10],"static_bytes":40}"#,
    );
    let schedule = dir.0.join("w.json");
    let plan = |solver: &str, extra: &[&str]| {
        let mut args = vec!["plan", "--chain", s(&chain), "--budget", "36", "--bandwidth", "10", "--solver", solver];
        args.extend_from_slice(extra);
        args.push("--json");
        let run = pebble(&args);
        assert_eq!(run.code, 0, "{solver}: {}", run.stderr);
        run.json()
    };
    let bound = plan("weight-offload-bound", &[]);
    assert_eq!(bound["bound"], true);
    let bound = bound["predicted_time"].as_f64().expect("a time");
    assert!(bound >= 12.0, "{bound}");
    let greedy = plan("weight-offload", &["-o", s(&schedule)]);
    let period = greedy["predicted_time"].as_f64().expect("a time");
    assert!(period >= bound - 1e-9, "{period} below the bound {bound}");
    assert!(greedy["predicted_peak_bytes"].as_u64().expect("a peak") <= 36);
    assert_eq!((greedy["periodic"].clone(), greedy["periods_simulated"].clone()), (true.into(), 6.into()));
    let saved = std::fs::read_to_string(&schedule).expect("schedule written");
    assert!(saved.contains("\"periodic\": true"), "{saved}");
    let replay = ok(&[
        "simulate",
        "--schedule",
        s(&schedule),
        "--chain",
        s(&chain),
        "--budget",
        "36",
        "--bandwidth",
        "10",
        "--json",
    ])
    .json();
    assert_eq!(replay["makespan"].as_f64(), Some(period));
    assert_eq!(replay["periodic"], true);
    // A sweep with a weight solver reaches down to what l2l needs, below recompute-all.
    let sweep = ok(&[
        "sweep",
        "--chain",
        s(&chain),
        "--solvers",
        "weight-offload,l2l",
        "--points",
        "3",
        "--bandwidth",
        "10",
        "--json",
    ])
    .json();
    let lowest = sweep["budgets"][0].as_u64().expect("budgets");
    assert!(lowest < 40, "the sweep starts at {lowest}, above the weights alone");
    for solver in ["l2l", "weight-offload-noreuse"] {
        let t = plan(solver, &[])["predicted_time"].as_f64().expect("a time");
        assert!(t >= bound - 1e-9, "{solver}: {t} below the bound {bound}");
    }
    // `train` runs such a plan: the executor moves the weights over the link.
    let mlp = ["--model", "mlp", "--batch", "4", "--activation-budget", "60%", "--solver", "l2l"];
    let trained = ok(&cat(&[&["train"], &mlp, &["--steps", "1", "--json"]])).json();
    assert!(trained["d2h_busy"][0].as_f64() > Some(0.0), "{trained}");
    // Below one layer with its weights and gradient, nothing fits, and the least budget
    // is named.
    let tight = pebble(&["plan", "--chain", s(&chain), "--budget", "15", "--solver", "l2l", "--json"]);
    assert_eq!(tight.code, 1, "{}", tight.stderr);
    assert!(tight.json()["min_feasible_budget_bytes"].as_u64().is_some());
}

/// `--allocator caching`: the plan's bytes as before, and what PyTorch's caching allocator
/// reserves for them: whole segments (2 MiB, 20 MiB, or a large request's own size in
/// 2 MiB steps), at least the allocated peak, which is at least the bytes (blocks round up
/// to 512). A budget the segments do not fit has no plan; an unknown model exits 2.
#[test]
fn the_caching_allocator_reserves_whole_segments() {
    let args = ["plan", "--model", "mlp", "--solver", "store-all", "--budget", "100%", "--json"];
    let plain: serde_json::Value = serde_json::from_str(&ok(&args).stdout).unwrap();
    assert!(plain["allocator"].is_null());
    let mut with = args.to_vec();
    with[6] = "1GiB";
    with.extend(["--allocator", "caching"]);
    let j: serde_json::Value = serde_json::from_str(&ok(&with).stdout).unwrap();
    let a = &j["allocator"];
    let (reserved, allocated) = (a["peak_reserved"].as_u64().unwrap(), a["peak_allocated"].as_u64().unwrap());
    assert_eq!(j["predicted_peak_bytes"], plain["predicted_peak_bytes"]);
    assert_eq!(reserved % (2 << 20), 0, "{a}");
    assert!(reserved >= allocated && allocated >= j["predicted_peak_bytes"].as_u64().unwrap(), "{a}");
    // At the bytes' own budget the segments do not fit.
    let peak = plain["budget_bytes"].as_u64().unwrap().to_string();
    let run = pebble(&["plan", "--model", "mlp", "--solver", "store-all", "--budget", &peak, "--allocator", "caching"]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert!(run.stdout.contains("infeasible") || run.stderr.contains("infeasible"), "{}", run.stdout);
    let run = pebble(&["plan", "--model", "mlp", "--solver", "rotor", "--budget", "50%", "--allocator", "cuda"]);
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains("--allocator"), "{}", run.stderr);
}
