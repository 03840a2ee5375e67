//! `pebble train`: plan a zoo model under a budget, run the plan for real, and set what
//! the run measured beside what the simulator predicted.

use std::process::ExitCode;

use pebble_train::{BudgetRequest, Costs, DeviceKind, OptimizerKind, TrainConfig, TrainError};
use pebble_zoo::ModelOptions;

use crate::error::{bad, Infeasible};
use crate::flags::{CostsArg, DeviceArg, RunModelOpts, TrainArgs, TrainOptimizerArg};
use crate::out;
use crate::source::solver_or_policy;

/// Where the executor's commands run (`--device`), and their zoo options, with the cost
/// profile `--profile` names (or the old `--device PROFILE`) looked up.
pub fn run_target(m: &RunModelOpts) -> anyhow::Result<(DeviceKind, ModelOptions)> {
    let (device, profile) = m.device_and_profile().map_err(bad)?;
    let profile = match profile {
        Some(name) => crate::source::lookup_profile("--profile", &name)?,
        None => ModelOptions::default().profile,
    };
    let device = match device {
        DeviceArg::Cpu => DeviceKind::Cpu,
        DeviceArg::Cuda => DeviceKind::Cuda,
    };
    let options = ModelOptions {
        batch: m.size.fixed_batch().map_err(bad)?,
        image: m.size.image,
        seq: m.size.seq,
        layers: m.size.layers,
        width: m.size.width,
        heads: m.size.heads,
        profile,
        ..ModelOptions::default()
    };
    Ok((device, options))
}

/// Turns a run's error into the CLI's outcomes: bad input (2), infeasible (1), failure (1).
pub fn lift(e: TrainError) -> anyhow::Error {
    match e {
        TrainError::Model(e) => bad(format!("--model: {e}")),
        TrainError::UnknownSolver(e) => bad(format!("--solver: {e}")),
        TrainError::IntWidth { .. } => bad(format!("--profile: {e}")),
        TrainError::Solver { ref solver, .. } => bad(format!("--solver {solver}: {e}")),
        TrainError::Device(u) => bad(format!("--device cuda: {u}")),
        TrainError::DeviceMemory { .. } => bad(format!("--device: {e}")),
        TrainError::Infeasible { .. } => Infeasible(e.to_string()).into(),
        TrainError::SolverBug(_) | TrainError::StoreAll(_) | TrainError::Runtime(_) => anyhow::Error::new(e),
    }
}

pub fn run(args: &TrainArgs) -> anyhow::Result<ExitCode> {
    let (name, online) = solver_or_policy(&args.solver, &args.policy)?;
    let budget = match (args.budget.budget, args.budget.activation_budget) {
        (Some(b), _) => BudgetRequest::Total(b),
        (None, Some(a)) => BudgetRequest::Activation(a),
        (None, None) => return Err(bad("give --budget or --activation-budget")),
    };
    let (device, options) = run_target(&args.model)?;
    // The solver, the simulator and the executor's link all use this machine: the
    // profile's, with `--bandwidth` applied.
    let solve = super::solve_options(&args.solve, &options.profile.machine);
    super::check_run_link(args.solve.bandwidth, &options.profile.machine)?;
    let config = TrainConfig {
        model: args.model.model.clone(),
        options,
        budget,
        solver: name.to_string(),
        online,
        steps: args.steps as usize,
        seed: args.model.seed,
        optimizer: match args.optimizer {
            TrainOptimizerArg::Sgd => OptimizerKind::Sgd { lr: args.lr },
            TrainOptimizerArg::Adam => OptimizerKind::AdamW { lr: args.lr, weight_decay: 0.0 },
            TrainOptimizerArg::Adamw => OptimizerKind::AdamW { lr: args.lr, weight_decay: 0.01 },
        },
        costs: match args.costs {
            CostsArg::Profiled => Costs::Profiled,
            CostsArg::Analytic => Costs::Analytic,
            CostsArg::Steps => Costs::Steps,
        },
        solve,
    };
    let report = pebble_train::train_on(device, &config).map_err(lift)?;
    let mib = |b: u64| format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64);
    if let Some(over) = report.measured_peak_bytes.filter(|&m| m > report.budget_bytes) {
        // A plan whose costs understate what the device allocates runs over its budget:
        // say so, and what would have foreseen it.
        let why = match args.costs {
            CostsArg::Analytic => {
                "the plan's costs are analytic (the profile's roofline and the ops' declared temporaries), \
                 and this device allocates more; `--costs profiled` plans on what it measures"
            }
            CostsArg::Profiled | CostsArg::Steps => "this run allocated more than the profiled ops did",
        };
        eprintln!(
            "warning: the measured peak, {}, is over the budget, {} (+{:.1}%): {why}",
            mib(over),
            mib(report.budget_bytes),
            100.0 * (over as f64 / report.budget_bytes as f64 - 1.0)
        );
    }
    if args.json {
        out::print_json(&serde_json::to_value(&report)?)?;
        return Ok(ExitCode::SUCCESS);
    }
    let mean = |v: &[f64]| if v.is_empty() { 0.0 } else { v.iter().sum::<f64>() / v.len() as f64 };
    let mut text = format!(
        "model     {} ({} parameters) on {}\n\
         solver    {} on the {} view ({} ops, solved in {:.3} s)\n\
         budget    {} ({} planned, {} kept by the runtime; store-all peak {})\n\
         peak      predicted {}, measured {}\n\
         step      {:.4} s mean over {} steps (simulated {:.4} s on the planned costs)\n",
        report.model,
        report.params,
        report.device,
        report.solver,
        report.view,
        report.schedule_ops,
        report.solve_seconds,
        mib(report.budget_bytes),
        mib(report.planned_bytes),
        mib(report.reserve_bytes),
        mib(report.store_all_predicted_peak_bytes),
        mib(report.predicted_peak_bytes),
        report.measured_peak_bytes.map_or("-".to_string(), mib),
        mean(&report.step_seconds),
        report.step_seconds.len(),
        report.predicted_time,
    );
    if let Some(replayed) = report.replayed_time {
        text.push_str(&format!("          {replayed:.4} s simulated on the compute times measured in these steps\n"));
    }
    if report.predicted_d2h_busy > 0.0 || report.d2h_busy.iter().any(|&b| b > 0.0) {
        // Per step, measured (mean) beside simulated.
        text.push_str(&format!(
            "link      device→host busy {:.4} s (simulated {:.4}), host→device {:.4} s ({:.4}); \
             compute stall {:.4} s ({:.4})\n\
             host      peak {} measured, {} simulated\n",
            mean(&report.d2h_busy),
            report.predicted_d2h_busy,
            mean(&report.h2d_busy),
            report.predicted_h2d_busy,
            mean(&report.compute_stall),
            report.predicted_compute_stall,
            report.measured_host_peak_bytes.map_or("-".to_string(), mib),
            mib(report.predicted_host_peak_bytes),
        ));
    }
    if report.offloads + report.reloads + report.recomputes + report.evictions.unwrap_or(0) > 0 {
        let evicted = report.evictions.map_or(String::new(), |e| format!("{e} evictions, "));
        text.push_str(&format!(
            "moves     {evicted}{} offloads, {} reloads, {} recomputations a step\n",
            report.offloads, report.reloads, report.recomputes
        ));
    }
    let first = report.losses.first().copied().unwrap_or(f32::NAN);
    let last = report.losses.last().copied().unwrap_or(f32::NAN);
    text.push_str(&format!("loss      {first:.4} → {last:.4}\n"));
    out::print(&text)?;
    Ok(ExitCode::SUCCESS)
}
