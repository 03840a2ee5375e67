//! The budget holds (issue 47): on the default (analytic) costs, every model the executor
//! runs, under every chain and graph solver and every run-time policy, at 30–100% of the
//! activation memory in steps of 10, trains one step whose measured peak is at most its
//! budget and at least 90% of the simulator's peak. A budget no plan fits is a verdict,
//! not a failure; `train` names the least one.
//!
//! The whole grid (`PEBBLE_SWEEP=all`, 1,216 runs; docs/benchmarks.md, "The budget holds
//! on burn-flex") takes 22 minutes in a release build, and does not pass yet (33 runs). CI runs a seeded sample of
//! [`CI_CASES`] runs, the same on every machine (about a minute in the test build);
//! `PEBBLE_SWEEP=N` runs another N, `PEBBLE_SWEEP_SEED` picks the draw.
//!
//! One test in this binary: the allocation counters are global to the process.

use burn_flex::{Flex, FlexDevice};
use pebble_graph::units::BudgetSpec;
use pebble_ilp as _;
use pebble_runtime::memory::CountingAlloc;
use pebble_schedule::View;
use pebble_solve::SolveOptions;
use pebble_testkit::Rng;
use pebble_train::train::train;
use pebble_train::{BudgetRequest, Costs, OptimizerKind, TrainConfig, TrainError};
use pebble_zoo::ModelOptions;

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

/// Runs in CI's sample.
const CI_CASES: usize = 24;

/// The models the executor runs, sized for a CPU.
fn models() -> Vec<(&'static str, ModelOptions)> {
    let o = ModelOptions::default;
    vec![
        (
            "gpt",
            ModelOptions { layers: Some(4), width: Some(128), heads: Some(4), seq: Some(256), batch: Some(8), ..o() },
        ),
        ("gpt2-small", ModelOptions { layers: Some(2), seq: Some(128), batch: Some(2), ..o() }),
        ("resnet", ModelOptions { layers: Some(2), image: Some(64), batch: Some(8), ..o() }),
        ("mlp", ModelOptions { layers: Some(4), batch: Some(256), ..o() }),
    ]
}

/// One point of the grid: a model, a solver or policy, a percentage.
#[derive(Debug, Clone)]
struct Case {
    model: &'static str,
    options: ModelOptions,
    solver: &'static str,
    online: bool,
    percent: u32,
}

fn grid() -> Vec<Case> {
    let mut solvers: Vec<(&'static str, bool)> = Vec::new();
    for view in [View::Chain, View::Graph] {
        let names = pebble_solve::auto::solvers_for(view, None).expect("no names to look up");
        solvers.extend(names.into_iter().map(|s| (s.name(), false)));
    }
    solvers.extend(pebble_solve::policy::NAMES.iter().map(|&p| (p, true)));
    let mut cases = Vec::new();
    for (model, options) in models() {
        for &(solver, online) in &solvers {
            for percent in (30..=100).step_by(10) {
                cases.push(Case { model, options: options.clone(), solver, online, percent });
            }
        }
    }
    cases
}

/// The cases this run takes: all of them, or a seeded sample.
fn chosen() -> Vec<Case> {
    let mut all = grid();
    let want = std::env::var("PEBBLE_SWEEP").ok();
    if want.as_deref() == Some("all") {
        return all;
    }
    let n = want.and_then(|w| w.parse().ok()).unwrap_or(CI_CASES).min(all.len());
    let seed = std::env::var("PEBBLE_SWEEP_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(47);
    let mut rng = Rng::new(seed);
    // A partial Fisher–Yates shuffle: the first `n` are a uniform sample.
    for i in 0..n {
        let j = i + rng.below((all.len() - i) as u64) as usize;
        all.swap(i, j);
    }
    all.truncate(n);
    all
}

/// What one run showed.
enum Outcome {
    /// Measured peak, budget, predicted peak, in bytes.
    Ran { measured: u64, budget: u64, predicted: u64 },
    /// No plan fits this budget.
    Infeasible,
    /// The solver plans no schedule of this model (another view, too large, out of time).
    NoPlan,
}

fn run(case: &Case) -> Result<Outcome, TrainError> {
    let options = case.options.clone();
    let config = TrainConfig {
        model: case.model.into(),
        solve: SolveOptions { machine: options.profile.machine, time_limit: Some(1.0), ..SolveOptions::default() },
        options,
        budget: BudgetRequest::Activation(BudgetSpec::Percent(case.percent as f64)),
        solver: case.solver.into(),
        online: case.online,
        steps: 1,
        seed: 1,
        optimizer: OptimizerKind::AdamW { lr: 1e-3, weight_decay: 0.01 },
        costs: Costs::Analytic,
    };
    match train::<Flex>(&config, FlexDevice) {
        Ok(r) => Ok(Outcome::Ran {
            measured: r.measured_peak_bytes.expect("counting allocator"),
            budget: r.budget_bytes,
            predicted: r.predicted_peak_bytes,
        }),
        Err(TrainError::Infeasible { .. }) => Ok(Outcome::Infeasible),
        // The solver's verdict on the problem (not its view, too large, no plan within
        // its time limit), not the executor's.
        Err(TrainError::Solver { .. }) => Ok(Outcome::NoPlan),
        Err(e) => Err(e),
    }
}

#[test]
fn measured_peaks_stay_within_the_budget_and_near_the_prediction() {
    let cases = chosen();
    let (mut ran, mut infeasible, mut unplanned, mut failed) = (0, 0, 0, Vec::new());
    let start = std::time::Instant::now();
    for case in &cases {
        let what =
            format!("{} {}{} at {}%", case.model, if case.online { "policy " } else { "" }, case.solver, case.percent);
        let t = std::time::Instant::now();
        match run(case) {
            Ok(Outcome::Ran { measured, budget, predicted }) => {
                ran += 1;
                let ok = measured <= budget && measured as f64 >= 0.9 * predicted as f64;
                let line = format!(
                    "{} {what}: budget {budget} predicted {predicted} measured {measured} ({:+.1}% of the budget) {:.1}s",
                    if ok { "ok  " } else { "FAIL" },
                    100.0 * (measured as f64 / budget as f64 - 1.0),
                    t.elapsed().as_secs_f64()
                );
                println!("{line}");
                if !ok {
                    failed.push(line);
                }
            }
            Ok(Outcome::Infeasible) => {
                infeasible += 1;
                println!("--   {what}: no plan fits {:.1}s", t.elapsed().as_secs_f64());
            }
            Ok(Outcome::NoPlan) => {
                unplanned += 1;
                println!("--   {what}: the solver plans nothing here {:.1}s", t.elapsed().as_secs_f64());
            }
            Err(e) => failed.push(format!("ERR  {what}: {e}")),
        }
    }
    println!(
        "{} cases in {:.0} s: {ran} ran, {infeasible} infeasible, {unplanned} not planned, {} failed",
        cases.len(),
        start.elapsed().as_secs_f64(),
        failed.len()
    );
    assert!(ran >= cases.len() / 4, "only {ran} of {} cases had a plan", cases.len());
    assert!(
        failed.is_empty(),
        "{} of {ran} runs broke the budget or the prediction:\n{}",
        failed.len(),
        failed.join("\n")
    );
}
