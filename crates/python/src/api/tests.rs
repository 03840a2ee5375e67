use super::*;
use crate::error::Kind;

/// A three-stage chain by hand (rotor's format).
const CHAIN: &str = r#"{"ftime": [1, 2, 4], "btime": [10, 20, 30, 40], "x": [4, 3, 5, 2],
    "xbar": [4, 6, 9, 7], "ftmp": [2, 1, 3], "btmp": [3, 2, 4, 7], "static_bytes": 10}"#;

fn chain() -> String {
    format!(r#"{{"chain": {CHAIN}}}"#)
}

fn mlp_graph() -> String {
    let options = pebble_zoo::ModelOptions {
        layers: Some(3),
        width: Some(32),
        batch: Some(4),
        ..pebble_zoo::ModelOptions::default()
    };
    pebble_zoo::build("mlp", &options).unwrap().graph.to_json()
}

fn json(text: &str) -> Value {
    serde_json::from_str(text).unwrap()
}

#[test]
fn solvers_list_both_crates_and_auto() {
    let all = json(&solvers());
    let names: Vec<&str> = all.as_array().unwrap().iter().map(|s| s["name"].as_str().unwrap()).collect();
    for name in ["rotor", "checkmate", "auto", "hiremate", "dtr"] {
        assert!(names.contains(&name), "{name} not in {names:?}");
    }
    let checkmate = all.as_array().unwrap().iter().find(|s| s["name"] == "checkmate").unwrap();
    assert_eq!(checkmate["views"], json(r#"["graph"]"#));
}

#[test]
fn a_plan_fits_and_simulates_to_its_report() {
    let problem = chain();
    let out = json(&plan(&problem, "rotor", 40, "{}").unwrap());
    let peak = out["report"]["peak_bytes"].as_u64().unwrap();
    assert!(peak <= 40);
    let schedule = out["schedule"].to_string();
    let again = json(&simulate(&problem, &schedule, r#"{"budget": 40}"#).unwrap());
    assert_eq!(again["peak_bytes"].as_u64(), Some(peak));
    assert_eq!(again["makespan"], out["report"]["makespan"]);
    // One byte under the peak, the simulator refuses it.
    let e = simulate(&problem, &schedule, &format!(r#"{{"budget": {}}}"#, peak - 1)).unwrap_err();
    assert!(e.message.contains("rejects"), "{}", e.message);
    let lowered = json(&lower(&problem, &schedule).unwrap());
    assert_eq!(lowered["view"], "chain");
    assert_eq!(lowered["steps"].as_array().unwrap().len(), out["schedule"]["ops"].as_array().unwrap().len());
    assert_eq!(lowered["tensors"].as_array().unwrap().len(), 6 * 4);
}

#[test]
fn an_infeasible_budget_names_the_least_one_which_then_plans() {
    let problem = chain();
    let least = least_budget(&problem, "rotor", "").unwrap().unwrap();
    let e = plan(&problem, "rotor", least - 1, "").unwrap_err();
    assert_eq!(e.kind, Kind::Infeasible { least_budget: Some(least) });
    assert!(e.message.contains(&format!("{least} bytes")), "{}", e.message);
    let out = json(&plan(&problem, "rotor", least, "").unwrap());
    assert!(out["report"]["peak_bytes"].as_u64().unwrap() <= least);
}

#[test]
fn auto_reports_its_candidates_and_the_winner() {
    let graph = mlp_graph();
    let problem = format!(r#"{{"graph": {graph}}}"#);
    let store_all = json(&plan(&problem, "store-all", u64::MAX >> 2, "").unwrap());
    let peak = store_all["report"]["peak_bytes"].as_u64().unwrap();
    let out = json(&plan(&problem, "auto", peak, r#"{"time_limit": 20}"#).unwrap());
    let candidates = out["candidates"].as_array().unwrap();
    assert!(candidates.iter().any(|c| c["solver"] == "checkmate"));
    // At store-all's peak, store-all runs first and nothing is faster.
    assert_eq!(out["winner"], "store-all");
    assert_eq!(out["schedule"]["kept_from"], "store-all");
    assert_eq!(out["report"]["makespan"], store_all["report"]["makespan"]);
    let best = candidates.iter().filter_map(|c| c["time"].as_f64()).fold(f64::INFINITY, f64::min);
    assert_eq!(out["report"]["makespan"].as_f64(), Some(best));
    // Restricted to two solvers, with both views given.
    let chain = json(&to_chain(&graph).unwrap().unwrap())["chain"].to_string();
    let both = format!(r#"{{"graph": {graph}, "chain": {chain}}}"#);
    let out = json(&plan(&both, "auto", peak, r#"{"solvers": ["rotor", "dtr"]}"#).unwrap());
    let ran: Vec<(&str, &str)> = out["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["solver"].as_str().unwrap(), c["view"].as_str().unwrap()))
        .collect();
    assert_eq!(ran, [("dtr", "graph"), ("rotor", "chain")]);
    let e = plan(&both, "auto", peak, r#"{"solvers": ["rotr"]}"#).unwrap_err();
    assert!(e.message.contains("rotr") && e.message.contains("rotor"), "{}", e.message);
}

#[test]
fn a_chain_solver_plans_a_graph_through_its_chain_view() {
    let graph = mlp_graph();
    let problem = format!(r#"{{"graph": {graph}}}"#);
    let out = json(&plan(&problem, "rotor", u64::MAX >> 2, "").unwrap());
    assert_eq!(out["view"], "chain");
    let schedule = out["schedule"].to_string();
    let report = json(&simulate(&problem, &schedule, "").unwrap());
    assert_eq!(report["peak_bytes"], out["report"]["peak_bytes"]);
    let lowered = json(&lower(&problem, &schedule).unwrap());
    assert_eq!(lowered["view"], "chain");
    // A graph solver's plan lowers to the graph program.
    let out = json(&plan(&problem, "checkmate", u64::MAX >> 2, "").unwrap());
    let lowered = json(&lower(&problem, &out["schedule"].to_string()).unwrap());
    assert_eq!(lowered["view"], "graph");
    assert!(lowered["steps"].as_array().unwrap().iter().all(|s| s["fault"].is_null()));
}

#[test]
fn bad_input_names_the_field() {
    let e = |r: Result<String>| r.unwrap_err().message;
    let m = e(plan(r#"{"chain": {"ftime": [1], "btime": "x"}}"#, "rotor", 10, ""));
    assert!(m.starts_with("problem.chain") && m.contains("btime"), "{m}");
    let m = e(plan(r#"{"grph": {}}"#, "rotor", 10, ""));
    assert!(m.contains("grph"), "{m}");
    let m = e(plan("{", "rotor", 10, ""));
    assert!(m.starts_with("problem"), "{m}");
    let m = e(plan(&chain(), "rotorr", 10, ""));
    assert!(m.contains("rotorr") && m.contains("did you mean"), "{m}");
    let m = e(plan(&chain(), "checkmate", 10, ""));
    assert!(m.contains("checkmate") && m.contains("graph"), "{m}");
    let m = e(profile("v10"));
    assert!(m.contains("v10") && m.contains("v100"), "{m}");
    let m = e(simulate(&chain(), r#"{"version": 1, "view": "chain", "ops": [{"op": "fly"}]}"#, ""));
    assert!(m.starts_with("schedule"), "{m}");
    assert!(json(&profile("a100").unwrap())["machine"]["device_memory"].as_u64().is_some());
    assert_eq!(json(&profiles()).as_array().unwrap().len(), Profile::builtin().len());
    assert_eq!(parse_size("2KiB").unwrap(), 2048);
    assert_eq!(json(&parse_budget("50%").unwrap())["percent"], 50.0);
}
