//! The side-by-side benchmark: Burn's autodiff (`NoCheckpointing`, `BalancedCheckpointing`)
//! against pebble's `store-all` and `rotor` at the peak `BalancedCheckpointing` reached,
//! on one model, one backend, one process.

use burn_autodiff::checkpoint::strategy::{BalancedCheckpointing, CheckpointStrategy, NoCheckpointing};
use burn_autodiff::Autodiff;
use burn_backend::Backend;
use pebble_graph::units::BudgetSpec;
use pebble_schedule::Schedule;
use pebble_solve::{Problem, SolveOptions};
use pebble_zoo::ModelOptions;
use serde::Serialize;

use crate::session::{OptimizerKind, Session, StepReport};
use crate::train::{lower, TrainError};
use crate::RuntimeError;

/// One contender's figures.
#[derive(Debug, Clone, Serialize)]
pub struct Contender {
    /// What ran.
    pub name: String,
    /// Median step seconds (forward and backward), the first step excluded.
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

fn autodiff<B: Backend, C: CheckpointStrategy>(
    name: &str,
    model: &str,
    options: &ModelOptions,
    optimizer: OptimizerKind,
    steps: usize,
    seed: u64,
    device: &B::Device,
) -> Result<Contender, TrainError> {
    let lowered = lower::<Autodiff<B, C>>(model, options, None)?;
    let mut session = Session::<Autodiff<B, C>>::new(lowered.network, lowered.index, optimizer, seed, device.clone());
    let reports = (0..steps).map(|_| session.autodiff_step()).collect::<Result<Vec<_>, RuntimeError>>()?;
    Ok(summarize(name, &reports, None))
}

/// Runs the four contenders on `model` for `steps` steps each.
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
    let mut contenders = Vec::new();
    contenders.push(autodiff::<B, NoCheckpointing>(
        "burn autodiff, NoCheckpointing",
        model,
        &options,
        optimizer,
        steps,
        seed,
        &device,
    )?);
    let balanced = autodiff::<B, BalancedCheckpointing>(
        "burn autodiff, BalancedCheckpointing",
        model,
        &options,
        optimizer,
        steps,
        seed,
        &device,
    )?;
    let target = balanced.measured_peak_bytes;
    contenders.push(balanced);
    // pebble plans on costs profiled on this device.
    let first = lower::<B>(model, &options, None)?;
    let profile = crate::profile::profile::<B>(&first.network, &device, seed)?;
    drop(first);
    let lowered = lower::<B>(model, &options, Some(&profile))?;
    let chain = lowered.chain.clone();
    let problem = Problem::Chain(&chain);
    let solve = SolveOptions::default();
    let store_all = pebble_solve::baseline::store_all::store_all_schedule(problem);
    let sim = pebble_sim::SimConfig { budget: None, bandwidth: solve.bandwidth, timeline: false };
    let top = pebble_solve::simulate(problem, &store_all, &sim)
        .map_err(|e| RuntimeError::Other(format!("simulator: {e}")))?
        .peak_bytes;
    let rotor = pebble_solve::solver("rotor").expect("registered");
    // Rotor at the peak BalancedCheckpointing reached (or at 50% without a measurement).
    let budget = target.unwrap_or_else(|| BudgetSpec::Percent(50.0).resolve(top));
    let budget = budget.max(pebble_solve::min_feasible_budget(rotor, problem, &solve).unwrap_or(budget));
    let plan = pebble_solve::plan(rotor, problem, budget, &solve)
        .map_err(|e| TrainError::Input(format!("rotor at {budget} bytes: {e}")))?;
    let device_name = B::name(&device);
    // A fresh session for each: the same parameters and batch, so the same losses.
    let run = |schedule: &Schedule| -> Result<Vec<StepReport>, RuntimeError> {
        let mut session =
            Session::<B>::new(lowered.network.clone(), lowered.index.clone(), optimizer, seed, device.clone());
        (0..steps).map(|_| session.step(schedule)).collect()
    };
    let predicted_store_all = pebble_solve::simulate(problem, &store_all, &sim).ok().map(|r| r.peak_bytes);
    contenders.push(summarize("pebble store-all", &run(&store_all)?, predicted_store_all));
    contenders.push(summarize(
        "pebble rotor at BalancedCheckpointing's peak",
        &run(&plan.schedule)?,
        Some(plan.report.peak_bytes),
    ));
    Ok(BenchReport { model: model.to_string(), device: device_name, steps, contenders })
}
