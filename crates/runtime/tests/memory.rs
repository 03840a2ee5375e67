//! The simulator predicts the real peak: on the CPU, with a counting allocator, the
//! measured peak of a step stays within the budget and within 10% of the simulated peak,
//! for every solver, when the planner works from profiled costs.
//!
//! One test in this binary: the allocation counters are global to the process.

use burn_flex::{Flex, FlexDevice};
use pebble_runtime::memory::CountingAlloc;
use pebble_runtime::profile::profile;
use pebble_runtime::train::{budget_for, lower, reserve};
use pebble_runtime::{OptimizerKind, Session};
use pebble_solve::{Problem, SolveOptions};
use pebble_zoo::ModelOptions;

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

const SOLVERS: [&str; 7] =
    ["store-all", "sequential", "chen-sqrt", "revolve", "recompute-all", "rotor", "rotor-optimal"];

fn check(model: &str, options: ModelOptions, report: &mut Vec<String>) {
    let optimizer = OptimizerKind::AdamW { lr: 1e-3, weight_decay: 0.01 };
    let mut options = options;
    options.optimizer = optimizer.planner();
    let first = lower::<Flex>(model, &options, None).expect("model");
    let measured = profile::<Flex>(&first.network, &FlexDevice, 1).expect("profile");
    drop(first);
    let lowered = lower::<Flex>(model, &options, Some(&measured)).expect("model");
    let chain = lowered.chain.clone();
    let problem = Problem::Chain(&chain);
    let solve = SolveOptions::default();
    let sim = pebble_sim::SimConfig { budget: None, bandwidth: 1e10, timeline: false };
    let top = pebble_solve::simulate(problem, &pebble_solve::baseline::store_all::store_all_schedule(problem), &sim)
        .expect("store-all")
        .peak_bytes;
    let mut session = Session::<Flex>::new(lowered.network, lowered.index, optimizer, 3, FlexDevice);
    for name in SOLVERS {
        let solver = pebble_solve::solver(name).expect("registered");
        let min = pebble_solve::min_feasible_budget(solver, problem, &solve).expect("some budget fits");
        let min = budget_for(min);
        let top = budget_for(top).max(min);
        for budget in [min, (min + top) / 2, top] {
            let Ok(plan) = pebble_solve::plan(solver, problem, budget - reserve(budget), &solve) else {
                panic!("{model} {name}: no plan at {budget}")
            };
            let predicted = plan.report.peak_bytes;
            // Two steps: the first warms up what the kernels keep between calls.
            let mut peak = 0;
            for _ in 0..2 {
                let r = session.step(&plan.schedule).expect("step");
                peak = peak.max(r.peak_bytes.expect("counting"));
            }
            let error = peak as f64 / predicted as f64 - 1.0;
            let ok = peak <= budget && error.abs() <= 0.10;
            report.push(format!(
                "{} {model} {name} budget {budget} predicted {predicted} measured {peak} ({:+.1}%)",
                if ok { "ok  " } else { "FAIL" },
                100.0 * error
            ));
        }
    }
}

#[test]
fn measured_peaks_follow_the_simulator() {
    let mut report = Vec::new();
    check(
        "gpt",
        ModelOptions {
            batch: Some(2),
            seq: Some(32),
            layers: Some(3),
            width: Some(64),
            heads: Some(4),
            ..ModelOptions::default()
        },
        &mut report,
    );
    check(
        "resnet",
        ModelOptions { batch: Some(2), image: Some(32), layers: Some(1), width: Some(8), ..ModelOptions::default() },
        &mut report,
    );
    check("mlp", ModelOptions { batch: Some(8), layers: Some(4), ..ModelOptions::default() }, &mut report);
    println!("{}", report.join("\n"));
    assert!(report.iter().all(|l| l.starts_with("ok")), "measured peaks off:\n{}", report.join("\n"));
}
