//! The budget holds (issue 47): on the default (analytic) costs, every model the executor
//! runs, under every chain and graph solver and every run-time policy, at 30–100% of the
//! activation memory in steps of 10, trains one step whose measured peak is at most its
//! budget and at least 90% of the simulator's peak. A budget no plan fits is a verdict,
//! not a failure; `train` names the least one.
//!
//! The whole grid (`PEBBLE_SWEEP=all`, 1,216 runs; docs/benchmarks.md, "The budget holds
//! on burn-flex") takes 25 minutes in a release build: no run goes over its budget, and 10
//! or 11 stay below 90% of the prediction, each named in [`KNOWN_GAPS`] with what was measured.
//! CI runs a seeded sample of [`CI_CASES`] runs, the same on every machine (about a minute
//! in the test build);
//! `PEBBLE_SWEEP=N` runs another N, `PEBBLE_SWEEP_SEED` picks the draw, and
//! `PEBBLE_SWEEP_ONLY=a,b` keeps the cases whose line (`gpt policy dtr at 30%`) contains
//! `a` or `b`.
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

impl Case {
    /// `gpt policy dtr at 30%`: what a line of the report and `PEBBLE_SWEEP_ONLY` match.
    fn describe(&self) -> String {
        let policy = if self.online { "policy " } else { "" };
        format!("{} {policy}{} at {}%", self.model, self.solver, self.percent)
    }
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
    if let Ok(only) = std::env::var("PEBBLE_SWEEP_ONLY") {
        all.retain(|c| only.split(',').any(|w| c.describe().contains(w.trim())));
    }
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
    Ran { measured: u64, budget: u64, predicted: u64, replayed: Option<u64> },
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
            replayed: r.replayed_peak_bytes,
        }),
        Err(TrainError::Infeasible { .. }) => Ok(Outcome::Infeasible),
        // The solver's verdict on the problem (not its view, too large, no plan within
        // its time limit), not the executor's.
        Err(TrainError::Solver { .. }) => Ok(Outcome::NoPlan),
        Err(e) => Err(e),
    }
}

/// Cases that break the check today, each with what was measured (docs/benchmarks.md,
/// "The budget holds on burn-flex"): reported as `GAP`, not failed. One that passes is
/// reported too, so that the list can shrink.
const KNOWN_GAPS: &[(&str, &str)] = &[
    (
        "mlp zero-infinity at",
        "0.88 of the prediction: the device pool, which counts as the simulator does, reaches the predicted \
         26.05 MB at B1 (W0's prefetch beside W1 and the offload of stage 2's gradient), where the allocator \
         measures 3.2 MB, W0's bytes, less: not isolated",
    ),
    ("gpt opportunist at 60%", OPPORTUNIST_GAP),
    ("gpt opportunist at 70%", OPPORTUNIST_GAP),
    (
        "resnet paged-adam at 70%",
        "0.855-0.901 of the prediction from run to run (173.6-183.0 MB against 203.0): where the pages' transfers \
         end beside this CPU's compute varies; not isolated further",
    ),
];

const OPPORTUNIST_GAP: &str = "0.87 of the prediction: the plan's link holds ā_3 on the device through four ops \
    while it offloads it; the executor's offload ends within the first (its compute is slower than the roofline), \
    and its prefetch waits for B4 as the plan has it, where the replay on the run's compute times brings ā_3 back \
    at once";

/// Whether a run passes: at most its budget, and at least 90% of the simulator's peak,
/// on the planner's costs or (chain schedules) on the compute times the run measured,
/// whichever is lower: where transfers overlap compute, a CPU slower than the profile's
/// roofline lets them end before ops the simulator ran beside them.
fn passes(measured: u64, budget: u64, predicted: u64, replayed: Option<u64>) -> bool {
    let expected = replayed.map_or(predicted, |r| r.min(predicted));
    measured <= budget && measured as f64 >= 0.9 * expected as f64
}

/// One case's line of the report, and whether it breaks the check (not a known gap).
fn judge(what: &str, outcome: Result<Outcome, TrainError>, seconds: f64) -> (String, bool) {
    let gap = KNOWN_GAPS.iter().find(|(case, _)| what.contains(case)).map(|(_, why)| *why);
    match outcome {
        Ok(Outcome::Ran { measured, budget, predicted, replayed }) => {
            let ok = passes(measured, budget, predicted, replayed);
            let tag = match (ok, gap) {
                (true, None) => "ok  ",
                (true, Some(_)) => "ok   (a known gap passed)",
                (false, None) => "FAIL",
                (false, Some(_)) => "GAP ",
            };
            let replayed = replayed.map_or(String::new(), |r| format!(" (on its compute times {r})"));
            let over = 100.0 * (measured as f64 / budget as f64 - 1.0);
            let why = gap.filter(|_| !ok).map_or(String::new(), |w| format!(": {w}"));
            let line = format!(
                "{tag} {what}: budget {budget} predicted {predicted}{replayed} measured {measured} ({over:+.1}% of the \
                 budget) {seconds:.1}s{why}"
            );
            (line, !ok && gap.is_none())
        }
        Ok(Outcome::Infeasible) => (format!("--   {what}: no plan fits {seconds:.1}s"), false),
        Ok(Outcome::NoPlan) => (format!("--   {what}: the solver plans nothing here {seconds:.1}s"), false),
        Err(e) => (format!("ERR  {what}: {e}"), true),
    }
}

#[test]
fn measured_peaks_stay_within_the_budget_and_near_the_prediction() {
    let cases = chosen();
    let (mut counts, mut failed) = (std::collections::BTreeMap::<String, usize>::new(), Vec::new());
    let start = std::time::Instant::now();
    for case in &cases {
        let t = std::time::Instant::now();
        let (line, broke) = judge(&case.describe(), run(case), t.elapsed().as_secs_f64());
        println!("{line}");
        *counts.entry(line[..4].to_string()).or_default() += 1;
        if broke {
            failed.push(line);
        }
    }
    let ran = cases.len() - counts.get("--  ").copied().unwrap_or(0);
    println!("{} cases in {:.0} s: {counts:?} ({ran} ran)", cases.len(), start.elapsed().as_secs_f64());
    assert!(ran >= cases.len() / 4, "only {ran} of {} cases had a plan", cases.len());
    assert!(
        failed.is_empty(),
        "{} of {ran} runs broke the budget or the prediction:\n{}",
        failed.len(),
        failed.join("\n")
    );
}
