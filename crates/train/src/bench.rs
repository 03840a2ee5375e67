//! The side-by-side benchmark: Burn's autodiff (`NoCheckpointing`, `BalancedCheckpointing`)
//! against pebble's `store-all` and `rotor` at the peak `BalancedCheckpointing` reached,
//! on one model, one backend, one process.

use pebble_graph::units::BudgetSpec;
use pebble_runtime::autodiff::{autodiff_steps, Checkpointing};
use pebble_runtime::{Backend, OptimizerKind, RuntimeError, Session, StepReport};
use pebble_schedule::Schedule;
use pebble_solve::budget::BudgetRequest;
use pebble_solve::{Problem, SolveOptions};
use pebble_zoo::ModelOptions;
use serde::Serialize;

use crate::train::{lower, plan_within, Lowered};
use crate::TrainError;

/// One contender's figures.
#[derive(Debug, Clone, Serialize)]
pub struct Contender {
    /// What ran.
    pub name: String,
    /// Median step seconds (forward, backward and update), the first step excluded.
    pub step_seconds: f64,
    /// The largest measured peak over the steps (`null` where nothing counts).
    pub measured_peak_bytes: Option<u64>,
    /// The simulator's peak (pebble's plans only).
    pub predicted_peak_bytes: Option<u64>,
    /// The loss of each step.
    pub losses: Vec<f32>,
}

/// The whole comparison.
#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    /// The model.
    pub model: String,
    /// Backend and device.
    pub device: String,
    /// Steps per contender.
    pub steps: usize,
    /// The contenders, in the order they ran.
    pub contenders: Vec<Contender>,
}

fn summarize(name: &str, reports: &[StepReport], predicted: Option<u64>) -> Contender {
    let mut times: Vec<f64> = reports.iter().skip(usize::from(reports.len() > 1)).map(|r| r.seconds).collect();
    times.sort_by(f64::total_cmp);
    Contender {
        name: name.to_string(),
        step_seconds: times.get(times.len() / 2).copied().unwrap_or(0.0),
        measured_peak_bytes: reports.iter().filter_map(|r| r.peak_bytes).max(),
        predicted_peak_bytes: predicted,
        losses: reports.iter().map(|r| r.loss).collect(),
    }
}

/// Runs `steps` steps of Burn's autodiff with `strategy` on the network `lowered` holds.
fn autodiff<B: Backend>(
    name: &str,
    strategy: Checkpointing,
    lowered: &Lowered,
    optimizer: OptimizerKind,
    steps: usize,
    seed: u64,
    device: &B::Device,
) -> Result<Contender, TrainError> {
    let network = lowered.network.clone();
    let reports =
        autodiff_steps::<B>(strategy, network, lowered.index.clone(), optimizer, seed, steps, device.clone())?;
    Ok(summarize(name, &reports, None))
}

/// Runs the four contenders on `model` for `steps` steps each. pebble plans on costs
/// profiled on this device, for the machine of `options.profile`.
pub fn compare<B: Backend>(
    model: &str,
    options: &ModelOptions,
    steps: usize,
    seed: u64,
    device: B::Device,
) -> Result<BenchReport, TrainError> {
    let optimizer = OptimizerKind::AdamW { lr: 1e-3, weight_decay: 0.01 };
    let mut options = options.clone();
    options.optimizer = optimizer.planner();
    let machine = options.profile.machine;
    let solve = SolveOptions { machine, ..SolveOptions::default() };
    let first = lower::<B>(model, &options, None)?;
    let store_all =
        pebble_solve::baseline::store_all::simulate_store_all(Problem::Chain(&first.chain), &solve.sim_config())
            .map_err(TrainError::StoreAll)?;
    crate::check_device_holds("Burn's autodiff without checkpointing (store-all)", store_all.peak_bytes)?;
    let mut contenders = Vec::new();
    let none = "burn autodiff, NoCheckpointing";
    contenders.push(autodiff::<B>(none, Checkpointing::None, &first, optimizer, steps, seed, &device)?);
    let balanced = "burn autodiff, BalancedCheckpointing";
    let balanced = autodiff::<B>(balanced, Checkpointing::Balanced, &first, optimizer, steps, seed, &device)?;
    let target = balanced.measured_peak_bytes;
    contenders.push(balanced);
    // pebble plans on costs profiled on this device.
    let measured = pebble_runtime::profile::profile::<B>(&first.network, &device, seed)?;
    drop(first);
    let lowered = lower::<B>(model, &options, Some(&measured))?;
    let chain = lowered.chain.clone();
    let problem = Problem::Chain(&chain);
    let store_all = pebble_solve::baseline::store_all::store_all_schedule(problem);
    let predicted_store_all =
        pebble_solve::simulate(problem, &store_all, &solve.sim_config()).map_err(TrainError::StoreAll)?.peak_bytes;
    let rotor = pebble_solve::solver("rotor")?;
    // Rotor at the peak BalancedCheckpointing reached (or at 50% without a measurement),
    // the executor's reserve included, or at the least budget rotor fits in.
    let request = BudgetRequest::Total(target.map_or(BudgetSpec::Percent(50.0), BudgetSpec::Bytes));
    let mut budget = request.resolve(predicted_store_all, lowered.graph.static_bytes(), &machine.runtime);
    let min = pebble_solve::min_feasible_budget(rotor, problem, &solve).map_err(|e| TrainError::plan("rotor", e))?;
    if let Some(min) = min.filter(|&m| m > budget.planned_bytes) {
        let total = pebble_solve::budget::total_for(min, &machine.runtime);
        budget = pebble_solve::budget::Budget::of_total(total, budget.reference_bytes, &machine.runtime);
    }
    let plan = plan_within(rotor, problem, &budget, &solve, &machine.runtime)?;
    let device_name = B::name(&device);
    // A fresh session for each: the same parameters and batch, so the same losses.
    let run = |schedule: &Schedule| -> Result<Vec<StepReport>, RuntimeError> {
        let mut session =
            Session::<B>::new(lowered.network.clone(), lowered.index.clone(), optimizer, seed, device.clone());
        (0..steps).map(|_| session.step(schedule)).collect()
    };
    contenders.push(summarize("pebble store-all", &run(&store_all)?, Some(predicted_store_all)));
    contenders.push(summarize(
        "pebble rotor at BalancedCheckpointing's peak",
        &run(&plan.schedule)?,
        Some(plan.report.peak_bytes),
    ));
    Ok(BenchReport { model: model.to_string(), device: device_name, steps, contenders })
}
