//! The simulator predicts the real peak: on the CPU, with a counting allocator, the
//! measured peak of a step stays within the budget and within 5% of the simulated peak,
//! for every solver (chain solvers on the chain, graph store-all and the ILP solvers of
//! `pebble-ilp` on the training graph, and the run-time policies deciding inside the
//! step), when the planner works from profiled costs.
//!
//! One test in this binary: the allocation counters are global to the process.

use burn_flex::{Flex, FlexDevice};
use pebble_ilp as _;
use pebble_runtime::memory::CountingAlloc;
use pebble_runtime::{OptimizerKind, Session, StageTemporaries};
use pebble_solve::budget::total_for;
use pebble_solve::policy::replay::replay;
use pebble_solve::{Problem, SolveOptions};
use pebble_train::{drive_policy, lower_profiled, transfer_options};
use pebble_zoo::ModelOptions;

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

const SOLVERS: [&str; 12] = [
    "store-all",
    "sequential",
    "chen-sqrt",
    "revolve",
    "recompute-all",
    "rotor",
    "rotor-optimal",
    // Offloading: the pool capped at the planned budget, the link the profile's, as
    // `train` sets them, so transfers overlap compute as the simulator times them.
    "offload-greedy",
    "offload-dp",
    "pofo",
    "autocapper",
    "opportunist",
];

/// The ILP solvers, on the training graph. rk-Checkmate runs on the MLP only, and
/// HiRemate not on the GPT: its top ILP there takes 20 s to a minute per budget with
/// profiled costs (the gradient tests run it on the GPT, with analytic costs).
const GRAPH_SOLVERS: [&str; 2] = ["rockmate", "hiremate"];

/// Runs two steps of `plan` and reports its measured peak against the simulated one.
fn measure(
    session: &mut Session<Flex>,
    plan: &pebble_solve::Plan,
    budget: u64,
    what: String,
    report: &mut Vec<String>,
) {
    let predicted = plan.report.peak_bytes;
    // Two steps: the first warms up what the kernels keep between calls.
    let mut peak = 0;
    for _ in 0..2 {
        let r = session.step(&plan.schedule).unwrap_or_else(|e| panic!("{what}: {e}"));
        peak = peak.max(r.peak_bytes.expect("counting"));
    }
    let error = peak as f64 / predicted as f64 - 1.0;
    let ok = peak <= budget && error.abs() <= 0.05;
    let offloads: Vec<String> = plan
        .schedule
        .ops
        .iter()
        .filter(|op| matches!(op, pebble_schedule::Op::Offload { .. }))
        .map(|op| op.to_string())
        .collect();
    report.push(format!(
        "{} {what} budget {budget} predicted {predicted} measured {peak} ({:+.1}%){}",
        if ok { "ok  " } else { "FAIL" },
        100.0 * error,
        if offloads.is_empty() { String::new() } else { format!(" [{}]", offloads.join(", ")) }
    ));
}

fn check(model: &str, options: ModelOptions, graph_solvers: &[&str], report: &mut Vec<String>) {
    let optimizer = OptimizerKind::AdamW { lr: 1e-3, weight_decay: 0.01 };
    let mut options = options;
    options.optimizer = optimizer.planner();
    let lowered = lower_profiled::<Flex>(model, &options, 1, &FlexDevice).expect("model");
    let chain = lowered.chain.clone();
    let problem = Problem::Chain(&chain);
    // The executor's reserve, as the profile describes it: solvers plan in the rest.
    let overhead = options.profile.machine.runtime;
    let budget_for = |planned: u64| total_for(planned, &overhead);
    let reserve = |budget: u64| overhead.reserve(budget);
    let solve = SolveOptions { machine: options.profile.machine, ..SolveOptions::default() };
    let sim = solve.sim_config();
    let top = pebble_solve::simulate(problem, &pebble_solve::baseline::store_all::store_all_schedule(problem), &sim)
        .expect("store-all")
        .peak_bytes;
    let mut session = Session::<Flex>::new(lowered.network, lowered.index, optimizer, 3, FlexDevice);
    for name in SOLVERS {
        let solver = pebble_solve::solver(name).expect("registered");
        let min = pebble_solve::min_feasible_budget(solver, problem, &solve).unwrap().expect("some budget fits");
        let min = budget_for(min);
        let top = budget_for(top).max(min);
        for budget in [min, (min + top) / 2, top] {
            let Ok(plan) = pebble_solve::plan(solver, problem, budget - reserve(budget), &solve) else {
                panic!("{model} {name}: no plan at {budget}")
            };
            // The pool holds the schedule to its simulated peak, as `train` does.
            session.set_transfers(transfer_options(&solve.machine, Some(plan.report.peak_bytes)));
            session.set_temporaries(StageTemporaries::of_views(&chain, &lowered.graph));
            measure(&mut session, &plan, budget, format!("{model} {name}"), report);
        }
    }
    // The graph solvers, with store-all's graph schedule as the baseline. Profiled
    // temporaries can dwarf the activations (the MLP's first backward matmul holds 8 MB),
    // so the budgets are fractions of the memory above the largest single node's
    // footprint: the tightest of 60%, 70%, 80%, 90% that the solver meets (the gradient
    // tests run the ILP solvers at a second, looser budget).
    let graph = &lowered.graph;
    let problem = Problem::Graph(graph);
    let (top, floor) = graph_range(graph, &sim);
    let mut measure_at = |name: &str, pct: u64| {
        let solver = pebble_solve::solver(name).expect("registered");
        let budget = budget_for(floor + (top - floor) * pct / 100);
        match pebble_solve::plan(solver, problem, budget - reserve(budget), &solve) {
            Ok(plan) => {
                session.set_transfers(transfer_options(&solve.machine, Some(plan.report.peak_bytes)));
                measure(&mut session, &plan, budget, format!("{model} graph {name} at {pct}%"), report);
                true
            }
            Err(e) if pct < 90 => {
                println!("{model} graph {name} at {pct}%: {e}");
                false
            }
            Err(e) => panic!("{model} graph {name} at {pct}%: {e}"),
        }
    };
    assert!(measure_at("store-all", 100));
    for &name in graph_solvers {
        assert!([60, 70, 80, 90].into_iter().any(|pct| measure_at(name, pct)), "{model} {name}: no plan at 90%");
    }
}

/// The run-time policies on `model`, deciding inside the step, on a link 1000 times
/// slower than the one they decide for: the pool holds the step to the replay's simulated
/// peak, so the offloads that lag cost time (the compute waits for them), not memory.
/// The budget is the tightest of 50%, 60%, ..., 90% of the memory above the largest
/// node's footprint that the policy meets.
fn policies(model: &str, options: ModelOptions, report: &mut Vec<String>) {
    let optimizer = OptimizerKind::AdamW { lr: 1e-3, weight_decay: 0.01 };
    let mut options = options;
    options.optimizer = optimizer.planner();
    let lowered = lower_profiled::<Flex>(model, &options, 1, &FlexDevice).expect("model");
    let overhead = options.profile.machine.runtime;
    let budget_for = |planned: u64| total_for(planned, &overhead);
    let reserve = |budget: u64| overhead.reserve(budget);
    let solve = SolveOptions { machine: options.profile.machine, ..SolveOptions::default() };
    let sim = solve.sim_config();
    let graph = &lowered.graph;
    let problem = Problem::Graph(graph);
    let (top, floor) = graph_range(graph, &sim);
    let mut session = Session::<Flex>::new(lowered.network.clone(), lowered.index.clone(), optimizer, 3, FlexDevice);
    session.set_temporaries(StageTemporaries::of_views(&lowered.chain, graph));
    let mut offloaded = false;
    for name in ["delta", "dtr"] {
        let p = pebble_solve::policy::policy(name, solve.machine.d2h.bandwidth).expect("a policy");
        let Some((pct, budget, replayed)) = [50, 60, 70, 80, 90].into_iter().find_map(|pct| {
            let budget = budget_for(floor + (top - floor) * pct / 100);
            replay(graph, budget - reserve(budget), p.as_ref()).ok().map(|r| (pct, budget, r))
        }) else {
            panic!("{model} {name}: no budget up to 90% fits")
        };
        // Timed as `train` does: the compute waits for offloads in flight to release memory.
        let config = pebble_sim::SimConfig { budget: Some(budget - reserve(budget)), ..sim.clone() };
        let predicted = pebble_solve::simulate(problem, &replayed.schedule, &config).expect("the replay").peak_bytes;
        let mut slow = solve.machine;
        for link in [&mut slow.d2h, &mut slow.h2d] {
            link.bandwidth /= 1000.0;
        }
        session.set_transfers(transfer_options(&slow, Some(predicted)));
        let mut peak = 0;
        let mut stall = 0.0;
        for _ in 0..2 {
            let mut logged = None;
            let mut drive = drive_policy(graph, budget - reserve(budget), p.as_ref(), &mut logged);
            let r = session.step_driven(&mut drive).unwrap_or_else(|e| panic!("{model} {name}: {e}"));
            peak = peak.max(r.peak_bytes.expect("counting"));
            stall += r.transfers.compute_stall;
        }
        offloaded |= replayed.counts.offloads > 0;
        let error = peak as f64 / predicted as f64 - 1.0;
        report.push(format!(
            "{} {model} policy {name} at {pct}% budget {budget} predicted {predicted} measured {peak} ({:+.1}%), \
             {} offloads, compute stall {stall:.4} s on the slow link",
            if peak <= budget && error.abs() <= 0.05 { "ok  " } else { "FAIL" },
            100.0 * error,
            replayed.counts.offloads,
        ));
    }
    assert!(offloaded, "{model}: no policy offloaded, so the slow link was not tested");
}

/// Store-all's simulated peak on `graph`, and the floor below which no schedule goes
/// ([`pebble_testkit::least_graph_memory`]): budgets are taken between the two.
fn graph_range(graph: &pebble_graph::TrainingGraph, sim: &pebble_sim::SimConfig) -> (u64, u64) {
    let problem = Problem::Graph(graph);
    let top = pebble_solve::simulate(problem, &pebble_solve::baseline::store_all::store_all_schedule(problem), sim)
        .expect("store-all")
        .peak_bytes;
    (top, pebble_testkit::least_graph_memory(graph))
}

#[test]
fn measured_peaks_follow_the_simulator() {
    let mut report = Vec::new();
    let gpt = ModelOptions {
        batch: Some(2),
        seq: Some(32),
        layers: Some(3),
        width: Some(64),
        heads: Some(4),
        ..ModelOptions::default()
    };
    check("gpt", gpt.clone(), &GRAPH_SOLVERS[..1], &mut report);
    policies("gpt", gpt, &mut report);
    let resnet =
        ModelOptions { batch: Some(2), image: Some(32), layers: Some(1), width: Some(8), ..ModelOptions::default() };
    check("resnet", resnet.clone(), &GRAPH_SOLVERS, &mut report);
    policies("resnet", resnet, &mut report);
    // Deep and narrow, so that activations outweigh the matmuls' temporaries.
    let mlp = ModelOptions { batch: Some(1024), layers: Some(24), width: Some(128), ..ModelOptions::default() };
    policies("mlp", mlp, &mut report);
    let all = [GRAPH_SOLVERS[0], GRAPH_SOLVERS[1], "rk-checkmate"];
    check("mlp", ModelOptions { batch: Some(8), layers: Some(4), ..ModelOptions::default() }, &all, &mut report);
    println!("{}", report.join("\n"));
    assert!(report.iter().all(|l| l.starts_with("ok")), "measured peaks off:\n{}", report.join("\n"));
}
