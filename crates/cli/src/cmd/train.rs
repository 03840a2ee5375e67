//! `pebble train`: plan a zoo model under a budget, run the plan for real, and set what
//! the run measured beside what the simulator predicted.

use std::process::ExitCode;

use pebble_runtime::backend::{self, DeviceKind};
use pebble_runtime::train::{Budget, Costs, TrainConfig, TrainError};
use pebble_runtime::OptimizerKind;
use pebble_zoo::ModelOptions;

use crate::error::{bad, Infeasible};
use crate::flags::{CostsArg, DeviceArg, RunModelOpts, TrainArgs, TrainOptimizerArg};
use crate::out;

/// The zoo options of the executor's commands.
pub fn run_model_options(m: &RunModelOpts) -> ModelOptions {
    ModelOptions {
        batch: m.size.batch,
        image: m.size.image,
        seq: m.size.seq,
        layers: m.size.layers,
        width: m.size.width,
        heads: m.size.heads,
        ..ModelOptions::default()
    }
}

/// The device of the executor's commands.
pub fn device_kind(d: DeviceArg) -> DeviceKind {
    match d {
        DeviceArg::Cpu => DeviceKind::Cpu,
        DeviceArg::Cuda => DeviceKind::Cuda,
    }
}

/// Turns a runtime error into the CLI's outcomes: bad input (2), infeasible (1), failure (1).
pub fn lift(e: TrainError) -> anyhow::Error {
    match e {
        TrainError::Input(m) => bad(m),
        TrainError::Infeasible { message, .. } => Infeasible(message).into(),
        TrainError::Runtime(r) => anyhow::Error::new(r),
    }
}

pub fn run(args: &TrainArgs) -> anyhow::Result<ExitCode> {
    if pebble_solve::solver(&args.solver).is_none() {
        let known: Vec<&str> = pebble_solve::registry().iter().map(|s| s.name()).collect();
        return Err(bad(format!("--solver: unknown solver `{}` (known: {})", args.solver, known.join(", "))));
    }
    let budget = match (args.budget.budget, args.budget.activation_budget) {
        (Some(b), _) => Budget::Total(b),
        (None, Some(a)) => Budget::Activation(a),
        (None, None) => return Err(bad("give --budget or --activation-budget")),
    };
    let defaults = pebble_solve::SolveOptions::default();
    let config = TrainConfig {
        model: args.model.model.clone(),
        options: run_model_options(&args.model),
        budget,
        solver: args.solver.clone(),
        steps: args.steps as usize,
        seed: args.model.seed,
        optimizer: match args.optimizer {
            TrainOptimizerArg::Sgd => OptimizerKind::Sgd { lr: args.lr },
            TrainOptimizerArg::Adamw => OptimizerKind::AdamW { lr: args.lr, weight_decay: 0.01 },
        },
        costs: match args.costs {
            CostsArg::Profiled => Costs::Profiled,
            CostsArg::Analytic => Costs::Analytic,
        },
        solve: pebble_solve::SolveOptions {
            slots: args.slots.unwrap_or(defaults.slots),
            time_limit: args.time_limit,
            ..defaults
        },
    };
    let report = backend::train_on(device_kind(args.model.device), &config).map_err(lift)?;
    if args.json {
        out::print_json(&serde_json::to_value(&report)?)?;
        return Ok(ExitCode::SUCCESS);
    }
    let mib = |b: u64| format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64);
    let mean = |v: &[f64]| if v.is_empty() { 0.0 } else { v.iter().sum::<f64>() / v.len() as f64 };
    let mut text = format!(
        "model     {} ({} parameters) on {}\n\
         solver    {} on the {} view ({} ops, solved in {:.3} s)\n\
         budget    {} (store-all peak {})\n\
         peak      predicted {}, measured {}\n\
         step      {:.4} s mean over {} steps\n",
        report.model,
        report.params,
        report.device,
        report.solver,
        report.view,
        report.schedule_ops,
        report.solve_seconds,
        mib(report.budget_bytes),
        mib(report.store_all_predicted_peak_bytes),
        mib(report.predicted_peak_bytes),
        report.measured_peak_bytes.map_or("-".to_string(), mib),
        mean(&report.step_seconds),
        report.step_seconds.len(),
    );
    let first = report.losses.first().copied().unwrap_or(f32::NAN);
    let last = report.losses.last().copied().unwrap_or(f32::NAN);
    text.push_str(&format!("loss      {first:.4} → {last:.4}\n"));
    out::print(&text)?;
    Ok(ExitCode::SUCCESS)
}
