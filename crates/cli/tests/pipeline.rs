//! `pebble pipeline` (issue 14): the thesis's instances as chain files, the JSON fields
//! the issue fixes, the Gantt chart and the exports, and bad input.

mod common;

use common::{ok, pebble};

/// Thm 17's warm-up chain: layer costs (1, 2, 1), forward and backward halves, no
/// activations; `w` as given.
fn t1_chain(dir: &std::path::Path, w: [u64; 3]) -> std::path::PathBuf {
    let path = dir.join(format!("t1-{}{}{}.json", w[0], w[1], w[2]));
    let chain = serde_json::json!({
        "ftime": [0.5, 1.0, 0.5], "btime": [0.5, 1.0, 0.5, 0.0],
        "x": [0, 0, 0, 0], "xbar": [0, 0, 0, 0], "ftmp": [0, 0, 0], "btmp": [0, 0, 0, 0],
        "w": w, "static_bytes": w.iter().sum::<u64>(),
    });
    std::fs::write(&path, chain.to_string()).unwrap();
    path
}

fn tempdir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("pebble-pipeline-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn t1_on_two_devices_gives_the_contiguous_three_and_its_json() {
    let dir = tempdir("t1");
    let chain = t1_chain(&dir, [0, 0, 0]);
    let c = chain.to_str().unwrap();
    let run = ok(&[
        "pipeline",
        "--chain",
        c,
        "--devices",
        "2",
        "--memory",
        "inf",
        "--bandwidth",
        "inf",
        "--solver",
        "pipedream",
        "--json",
    ]);
    let j = run.json();
    assert_eq!(j["feasible"], true);
    assert!((j["period"].as_f64().unwrap() - 3.0).abs() < 1e-9, "{j}");
    assert!((j["throughput"].as_f64().unwrap() - 1.0 / 3.0).abs() < 1e-9);
    let allocation: Vec<u64> = serde_json::from_value(j["allocation"].clone()).unwrap();
    assert!(allocation == [0, 0, 1] || allocation == [0, 1, 1], "{allocation:?}");
    assert_eq!(j["peak_bytes_per_device"].as_array().unwrap().len(), 2);
    assert!(j["bubble"].as_f64().unwrap() > 0.0, "an unbalanced split idles one device");
    // The text summary names the period and each device's layers.
    let text = ok(&["pipeline", "--chain", c, "--devices", "2", "--solver", "1f1b"]).stdout;
    assert!(text.contains("period 3.000 per micro-batch"), "{text}");
    assert!(text.contains("device"), "{text}");
}

#[test]
fn an_infeasible_memory_is_a_verdict_with_exit_code_one() {
    let dir = tempdir("t2");
    let chain = t1_chain(&dir, [1, 2, 1]);
    let c = chain.to_str().unwrap();
    let args = [
        "pipeline",
        "--chain",
        c,
        "--devices",
        "2",
        "--memory",
        "2",
        "--weight-versions",
        "1",
        "--solver",
        "pipedream",
    ];
    let run = pebble(&args);
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert!(run.stdout.contains("finds no pipeline") || run.stderr.contains("finds no pipeline"), "{}", run.stderr);
    let mut json_args = args.to_vec();
    json_args.push("--json");
    let run = pebble(&json_args);
    assert_eq!(run.code, 1);
    assert_eq!(run.json()["feasible"], false);
}

#[test]
fn gantt_and_exports_are_written_and_never_overwritten_unasked() {
    let dir = tempdir("files");
    let chain = t1_chain(&dir, [0, 0, 0]);
    let c = chain.to_str().unwrap();
    let gantt = dir.join("g.svg");
    let csv = dir.join("plan.csv");
    let g = gantt.to_str().unwrap();
    let o = csv.to_str().unwrap();
    let args =
        ["pipeline", "--chain", c, "--devices", "2", "--solver", "1f1b", "--gantt", g, "--export", "torch", "-o", o];
    ok(&args);
    let svg = std::fs::read_to_string(&gantt).unwrap();
    assert!(svg.contains("device 0") && svg.contains("device 1"), "one row per device");
    let text = std::fs::read_to_string(&csv).unwrap();
    assert_eq!(text.lines().count(), 2, "one row per rank: {text}");
    assert!(text.starts_with("0F0"), "{text}");
    // Both files exist now: refused without --force, nothing written.
    let run = pebble(&args);
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(run.stderr.contains("--force"), "{}", run.stderr);
    let mut forced = args.to_vec();
    forced.push("--force");
    ok(&forced);
    // pebble's own format loads back with `pebble simulate`'s reader.
    let json = ok(&["pipeline", "--chain", c, "--devices", "2", "--solver", "1f1b", "--export", "pebble"]).stdout;
    let schedule = pebble_schedule::Schedule::from_json(&json).unwrap();
    assert_eq!(schedule.version, 2);
    assert_eq!(schedule.devices, Some(2));
    // ... and `pebble simulate` replays it to the same period.
    let plan = dir.join("plan.json");
    std::fs::write(&plan, &json).unwrap();
    let sim = ok(&["simulate", "--schedule", plan.to_str().unwrap(), "--chain", c, "--json"]).json();
    assert!((sim["period"].as_f64().unwrap() - 3.0).abs() < 1e-9, "{sim}");
    let tight = pebble(&["simulate", "--schedule", plan.to_str().unwrap(), "--chain", c, "--budget", "0", "--json"]);
    assert_eq!(tight.code, 0, "no memory at all is needed here: {}", tight.stderr);
}

#[test]
fn bad_input_names_the_flag_with_exit_code_two() {
    let dir = tempdir("bad");
    let chain = t1_chain(&dir, [0, 0, 0]);
    let c = chain.to_str().unwrap();
    for (args, needle) in [
        (vec!["--devices", "0", "--solver", "1f1b"], "--devices"),
        (vec!["--devices", "2", "--solver", "nope"], "unknown solver `nope`"),
        (vec!["--devices", "2", "--solver", "1f1b", "--memory", "-3GB"], "--memory"),
        (vec!["--devices", "2", "--solver", "1f1b", "--bandwidth", "fast"], "--bandwidth"),
        (vec!["--devices", "2", "--solver", "1f1b", "--microbatches", "0"], "--microbatches"),
        // Beyond any pipeline: 10^8 micro-batches used to be listed until memory ran out.
        (vec!["--devices", "2", "--solver", "gpipe", "--microbatches", "99999999"], "--microbatches: 99999999"),
        (vec!["--devices", "2", "--solver", "interleaved-1f1b", "--virtual-stages", "65"], "at most 64"),
    ] {
        let mut full = vec!["pipeline", "--chain", c];
        full.extend(args);
        let run = pebble(&full);
        assert_eq!(run.code, 2, "{full:?}: {}", run.stderr);
        assert!(run.stderr.contains(needle), "{full:?}: {}", run.stderr);
    }
}

#[test]
fn run_executes_a_plan_with_one_devices_losses_within_the_memory() {
    let gpt = ["--model", "gpt", "--batch", "2", "--seq", "16", "--layers", "3", "--width", "32", "--heads", "4"];
    let mut args = vec!["pipeline"];
    args.extend(gpt);
    args.extend(["--optimizer", "sgd", "--devices", "2", "--solver", "madpipe", "--memory", "2MiB", "--run", "--json"]);
    let j = ok(&args).json();
    assert_eq!(j["losses_equal"], true, "{j}");
    assert!(j["max_relative_gradient_difference"].as_f64().unwrap() < 1e-5, "{j}");
    assert_eq!(j["within_memory"], true, "{j}");
    for peak in j["measured_peak_bytes_per_device"].as_array().unwrap() {
        assert!(peak.as_u64().unwrap() <= 2 << 20, "{j}");
    }
    // Too little memory: the planner's verdict, exit code 1.
    let tight: Vec<&str> = args.iter().map(|a| if *a == "2MiB" { "0.5MiB" } else { a }).collect();
    assert_eq!(pebble(&tight).code, 1);
}

#[test]
fn a_shift_of_a_billion_periods_is_bad_input_not_an_abort() {
    // Once unrolled over 4·10^9 periods: 3 GiB allocated, then an abort.
    let dir = tempdir("shift");
    let chain = t1_chain(&dir, [0, 0, 0]);
    let run = |micro: i64, pass: &str| serde_json::json!({ "op": "run", "device": 0, "stage": 0, "micro": micro, "pass": pass });
    let schedule = serde_json::json!({
        "version": 2, "view": "pipeline", "periodic": true, "devices": 1, "microbatches": 1,
        "stages": [{ "first": 0, "last": 2, "device": 0 }],
        "ops": [run(1_000_000_000, "F"), run(0, "B")],
    });
    let path = dir.join("shifted.json");
    std::fs::write(&path, schedule.to_string()).unwrap();
    let out = pebble(&["simulate", "--schedule", path.to_str().unwrap(), "--chain", chain.to_str().unwrap()]);
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert_eq!(out.stderr.trim_end().lines().count(), 1, "{}", out.stderr);
    assert!(
        out.stderr.contains("field `ops[0].micro`: micro-batch shift 1000000000 is out of range"),
        "{}",
        out.stderr
    );
}

#[test]
fn run_checks_the_same_limits_and_refuses_what_it_cannot_honour() {
    // Each refused before the model is built or a worker spawned (5000 devices panicked).
    let gpt = ["--model", "gpt", "--batch", "2", "--seq", "16", "--layers", "3", "--width", "32", "--heads", "4"];
    for (extra, needle) in [
        (vec!["--microbatches", "5000"], "--microbatches: 5000 is more than any pipeline uses (at most 4096)"),
        (vec!["--devices", "5000"], "--devices 5000: at most 1024"),
        (vec!["--devices", "0"], "--devices: must be at least 1"),
        (vec!["--bandwidth", "1e9"], "--bandwidth: --run plans on the profile's interconnect"),
        (vec!["--virtual-stages", "3"], "--virtual-stages: --run plans with 2"),
        (vec!["--weight-versions", "2"], "--weight-versions: --run keeps one weight version"),
        (vec!["--time-limit", "5"], "--time-limit: --run gives the ILPs 60 s"),
    ] {
        let mut args = vec!["pipeline"];
        args.extend(gpt);
        args.extend(["--solver", "1f1b", "--run"]);
        args.extend(&extra);
        let out = pebble(&args);
        assert_eq!(out.code, 2, "{extra:?}: {}", out.stderr);
        assert!(out.stderr.contains(needle), "{extra:?}: {}", out.stderr);
    }
}
