//! The CLI contract of the graph solvers `rockmate`, `hiremate` and `rk-checkmate`.

use serde_json::Value;

mod common;

fn pebble(args: &[&str]) -> (i32, Value, String) {
    let run = common::pebble(args);
    (run.code, serde_json::from_str(&run.stdout).unwrap_or(Value::Null), run.stderr)
}

const GPT: [&str; 10] = ["--model", "gpt", "--layers", "2", "--width", "64", "--seq", "32", "--batch", "1"];

#[test]
fn rockmate_and_hiremate_plan_within_the_budget_and_beat_rotor() {
    let mut rotor = None;
    for solver in ["rotor", "rockmate", "hiremate", "rk-checkmate"] {
        let mut args = vec!["plan", "--solver", solver, "--activation-budget", "85%", "--json"];
        args.extend(GPT);
        let (code, j, err) = pebble(&args);
        assert_eq!(code, 0, "{solver}: {err}");
        assert_eq!(j["solver"], solver);
        assert_eq!(j["feasible"], true);
        let peak = j["predicted_peak_bytes"].as_u64().expect("predicted_peak_bytes");
        assert!(peak <= j["budget_bytes"].as_u64().expect("budget_bytes"), "{solver}");
        let overhead = j["overhead"].as_f64().expect("overhead");
        // Whether every MILP was solved to optimality: said by the ILP solvers only.
        assert_eq!(j["optimal"], if solver == "rotor" { Value::Null } else { Value::Bool(true) }, "{solver}");
        if solver == "rotor" {
            rotor = Some(overhead);
        } else {
            assert_eq!(j["view"], "graph");
            // Recomputing single cheap ops beats recomputing whole blocks.
            assert!(overhead <= rotor.expect("rotor first") + 1e-9, "{solver}: {overhead} vs rotor's {rotor:?}");
        }
    }
}

/// A MILP stopped by `--time-limit` before proving its answer: the plan says so.
#[test]
fn a_time_limited_plan_is_not_called_optimal() {
    let mut args = vec!["plan", "--solver", "hiremate", "--activation-budget", "100%", "--time-limit", "0.001"];
    args.extend(GPT);
    let run = common::pebble(&args);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(run.stdout.contains("not proven optimal"), "{}", run.stdout);
    args.push("--json");
    let (code, j, err) = pebble(&args);
    assert_eq!(code, 0, "{err}");
    assert_eq!(j["optimal"], false);
}

#[test]
fn an_infeasible_budget_reports_the_least_feasible_one() {
    let mut args = vec!["plan", "--solver", "rockmate", "--activation-budget", "1%", "--json"];
    args.extend(GPT);
    let (code, j, err) = pebble(&args);
    assert_eq!(code, 1, "{err}");
    assert_eq!(j["feasible"], false);
    let min = j["min_feasible_budget_bytes"].as_u64().expect("a minimum");
    assert!(min > j["budget_bytes"].as_u64().unwrap());
    assert!(err.contains("the minimum feasible budget is"), "{err}");
    // And that budget is feasible.
    let min = min.to_string();
    let mut args = vec!["plan", "--solver", "rockmate", "--budget", &min, "--json"];
    args.extend(GPT);
    let (code, j, err) = pebble(&args);
    assert_eq!(code, 0, "{err}");
    assert_eq!(j["feasible"], true);
}

#[test]
fn hiremate_plans_the_encoder_decoder_transformer() {
    let (code, j, err) = pebble(&[
        "plan",
        "--model",
        "transformer",
        "--layers",
        "2",
        "--seq",
        "16",
        "--batch",
        "1",
        "--solver",
        "hiremate",
        "--activation-budget",
        "90%",
        // Each ILP within half a second (the default 10 s lets the save axes take
        // minutes); crates/ilp/tests/rockmate.rs checks the plans on this graph.
        "--time-limit",
        "0.5",
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(j["feasible"], true);
    let peak = j["predicted_peak_bytes"].as_u64().expect("predicted_peak_bytes");
    assert!(peak <= j["budget_bytes"].as_u64().expect("budget_bytes"));
}

#[test]
fn a_chain_is_not_for_graph_solvers() {
    let dir = std::env::temp_dir().join(format!("pebble-graph-solvers-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let chain = dir.join("c.json");
    std::fs::write(&chain, r#"{"ftime":[1,1],"btime":[1,1,0],"x":[1,1,1],"xbar":[1,1,1],"ftmp":[0,0],"btmp":[0,0,0]}"#)
        .unwrap();
    for solver in ["rockmate", "hiremate"] {
        let (code, _, err) =
            pebble(&["plan", "--chain", chain.to_str().unwrap(), "--solver", solver, "--budget", "10"]);
        assert_eq!(code, 2, "{solver}: {err}");
        assert!(err.contains(solver), "{err}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// `auto` lists every candidate with its simulated time and solve time, keeps the
/// fastest, and ends with its time limit: each MILP it runs stops by its solver's share
/// (HiRemate ran hundreds of MILPs of the whole limit each: 54 s for `--time-limit 10`).
#[test]
fn auto_reports_its_candidates_and_keeps_its_time_limit() {
    let args = ["plan", "--model", "gpt", "--layers", "4", "--solver", "auto", "--activation-budget", "50%"];
    let mut args = args.to_vec();
    args.extend(["--time-limit", "3", "--json"]);
    let started = std::time::Instant::now();
    let (code, j, err) = pebble(&args);
    let seconds = started.elapsed().as_secs_f64();
    assert_eq!(code, 0, "{err}");
    let candidates = j["candidates"].as_array().expect("candidates");
    let times: Vec<f64> = candidates.iter().filter_map(|c| c["time"].as_f64()).collect();
    assert!(times.len() >= 3, "{candidates:?}");
    let best = times.iter().copied().fold(f64::INFINITY, f64::min);
    assert_eq!(j["predicted_time"].as_f64(), Some(best));
    let winner = candidates.iter().find(|c| c["time"].as_f64() == Some(best)).unwrap();
    assert_eq!(j["kept_from"], winner["solver"]);
    for c in candidates {
        assert!(c["solve_seconds"].as_f64().is_some() && c["view"] == "graph", "{c}");
        assert!(c["time"].is_number() != c["error"].is_string(), "a time or an error: {c}");
    }
    // The limit is soft (a solver's work outside MILPs is not stopped), but not by much.
    assert!(seconds < 10.0, "auto took {seconds:.1} s with --time-limit 3");
    // The text report lists them too.
    let run = common::pebble(&args[..args.len() - 1]);
    assert!(run.stdout.contains("candidates") && run.stdout.contains("  hiremate"), "{}", run.stdout);
}
