//! `pebble maxbatch`: the largest batch whose training step fits a device memory, under a
//! solver or a run-time policy, in simulation; and store-all's beside it, for the growth
//! DELTA's tables report.
//!
//! The batch doubles from 1 (or from `--batch`) while it fits, halving first if the start
//! does not, then bisects between the last that fits and the first that does not. That
//! assumes feasibility is monotone in the batch, which holds for store-all and the exact
//! solvers; for a heuristic it is the largest batch this search finds.
//!
//! With `--allocator caching`, a batch fits when the plan's segments fit the memory: the
//! planner is given all of it, then 90%, 80% … 50% (`PLANNER_SHARES`), as a user of DTR
//! lowers its budget until the allocator stops running out.
//!
//! With `--run`, the answer is then checked for real: one training step at that batch,
//! the device pool capped at the memory, and a bisection below it with real steps if it
//! does not run within the memory (a step that cannot be planned does not run either, so
//! the real answer is never above the simulated one).

use std::process::ExitCode;

use pebble_graph::units::BudgetSpec;
use pebble_solve::{PlanError, SolveError, Solver};
use pebble_train::{BudgetRequest, Costs, DeviceKind, OptimizerKind, TrainConfig, TrainError};
use serde_json::json;

use super::plan::Setup;
use crate::error::{bad, Infeasible};
use crate::flags::{BatchArg, BudgetArgs, MaxbatchArgs, SourceArgs};
use crate::out;
use crate::source::{find_solver, solver_or_policy, Source, Subject};

/// One batch tried: how it fits, if it does.
struct Tried {
    batch: usize,
    fit: Option<Fit>,
}

/// A batch that fits: its step time; under `--allocator`, the planner's share of the
/// memory and what the allocator held.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Fit {
    pub step: f64,
    pub share: f64,
    pub allocator: Option<pebble_sim::allocator::AllocatorStats>,
}

/// The search for one solver.
struct Search<'a> {
    args: &'a MaxbatchArgs,
    solver: &'static dyn Solver,
    tried: Vec<Tried>,
    progress: &'a indicatif::ProgressBar,
}

impl Search<'_> {
    /// The simulated step time at `batch`, or `None` if no schedule fits the memory.
    fn fits(&mut self, batch: usize) -> anyhow::Result<Option<f64>> {
        if let Some(t) = self.tried.iter().find(|t| t.batch == batch) {
            return Ok(t.fit.map(|f| f.step));
        }
        self.progress.set_message(format!("{}: batch {batch}", self.solver.name()));
        let fit = self.at_batch(batch, |solver, subject, setup, _| fit_within(solver, subject, setup))?;
        self.tried.push(Tried { batch, fit });
        Ok(fit.map(|f| f.step))
    }

    /// The least memory a step at `batch` fits in under the solver (its least feasible
    /// budget, with the runtime's reserve), if any: what `--memory` would need to be.
    fn least_memory(&self, batch: usize) -> anyhow::Result<Option<u64>> {
        self.progress.set_message(format!("{}: the least memory for batch {batch}", self.solver.name()));
        self.at_batch(batch, |solver, subject, setup, machine| {
            super::plan::least_memory(solver, subject, &setup.options, machine)
        })
    }

    /// Calls `f` with the solver, the problem's view, the setup and the machine of
    /// `--model` at `batch`, under `--memory`.
    fn at_batch<T>(
        &self,
        batch: usize,
        f: impl FnOnce(&dyn Solver, &Subject, &Setup, &pebble_machine::Machine) -> anyhow::Result<T>,
    ) -> anyhow::Result<T> {
        let source_args = SourceArgs { chain: None, graph: None, model: Some(self.args.model.clone()), onnx: None };
        let mut opts = self.args.opts.clone();
        opts.size.batch = Some(BatchArg::Fixed(batch));
        let budget = BudgetArgs { budget: Some(self.args.memory), activation_budget: None };
        let (source, machine) = Source::load(&source_args, &opts)?;
        let subject = source.view_for(self.solver)?;
        let setup = Setup::new((&self.args.solve, &budget), &source, &machine, &subject)?;
        f(self.solver, &subject, &setup, &machine)
    }

    /// The largest batch up to `--max` that fits, and its step time; `None` if not even 1.
    /// The search starts at `--batch` (1 by default): doubling while it fits, halving
    /// while it does not, then bisecting; a start near the answer saves the slow solvers
    /// their probes far from it.
    fn largest(&mut self) -> anyhow::Result<Option<(usize, f64)>> {
        let max = self.args.max;
        let start = match self.args.opts.size.batch {
            Some(BatchArg::Fixed(b)) => b.clamp(1, max),
            _ => 1,
        };
        let (mut lo, mut hi) = (start, None);
        let mut best = match self.fits(start)? {
            Some(step) => step,
            None => loop {
                // Halve until a batch fits; the bisection then runs between it and the last
                // that did not.
                if lo == 1 {
                    return Ok(None);
                }
                hi = Some(lo);
                lo /= 2;
                if let Some(step) = self.fits(lo)? {
                    break step;
                }
            },
        };
        while hi.is_none() && lo < max {
            let next = (lo * 2).min(max);
            match self.fits(next)? {
                Some(step) => (lo, best) = (next, step),
                None => hi = Some(next),
            }
        }
        if let Some(mut hi) = hi {
            while hi - lo > 1 {
                let mid = lo + (hi - lo) / 2;
                match self.fits(mid)? {
                    Some(step) => (lo, best) = (mid, step),
                    None => hi = mid,
                }
            }
        }
        Ok(Some((lo, best)))
    }
}

/// Under `--allocator`, the shares of the memory the planner is given, in turn, until its
/// plan's segments fit the whole memory: a run-time policy's budget counts the bytes it
/// allocates, and what the allocator reserves beyond them must fit too.
const PLANNER_SHARES: [f64; 6] = [1.0, 0.9, 0.8, 0.7, 0.6, 0.5];

/// How `solver`'s plan fits the memory `setup` resolved, `None` if none does. Under
/// `--allocator`, the allocator's capacity is the memory, and the planner is given
/// [`PLANNER_SHARES`] of it in turn.
fn fit_within(solver: &dyn Solver, subject: &Subject, setup: &Setup) -> anyhow::Result<Option<Fit>> {
    let memory = setup.resolved.planned_bytes;
    let mut options = setup.options.clone();
    let shares: &[f64] = match &mut options.allocator {
        Some(a) => {
            a.capacity = Some(memory);
            &PLANNER_SHARES
        }
        None => &PLANNER_SHARES[..1],
    };
    for share in shares {
        let budget = (memory as f64 * share) as u64;
        match pebble_solve::plan(solver, subject.problem(), budget, &options) {
            Ok(plan) => {
                let allocator = plan.report.allocator;
                return Ok(Some(Fit { step: plan.report.makespan, share: *share, allocator }));
            }
            Err(PlanError::Solve(SolveError::Infeasible { .. })) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(None)
}

/// The largest batch up to `--max` whose step fits `--memory` under `solver` (with
/// `args`' model, options and start), and its simulated step time; `None` if not even 1.
pub(crate) fn largest_batch(
    args: &MaxbatchArgs,
    solver: &'static dyn Solver,
    progress: &indicatif::ProgressBar,
) -> anyhow::Result<Option<(usize, f64)>> {
    Ok(largest_fit(args, solver, progress)?.map(|(b, f)| (b, f.step)))
}

/// [`largest_batch`], with how it fits.
pub(crate) fn largest_fit(
    args: &MaxbatchArgs,
    solver: &'static dyn Solver,
    progress: &indicatif::ProgressBar,
) -> anyhow::Result<Option<(usize, Fit)>> {
    let mut search = Search { args, solver, tried: Vec::new(), progress };
    let found = search.largest()?;
    Ok(found.and_then(|(b, _)| Some((b, search.tried.iter().find(|t| t.batch == b)?.fit?))))
}

/// "1 real step tried", "3 real steps tried".
fn steps_tried(n: usize) -> String {
    format!("{n} real step{} tried", if n == 1 { "" } else { "s" })
}

/// One batch trained for real: its measured peak and step time if it ran within the memory.
struct RealTry {
    batch: usize,
    ran: Result<(u64, f64), String>,
}

/// `--run`: one real training step at each batch tried.
struct RealSearch<'a> {
    /// Everything of the step but its batch: the model, `--memory`, the planner, the cost
    /// profile and the solver options, resolved once.
    config: TrainConfig,
    memory: u64,
    device: DeviceKind,
    tried: Vec<RealTry>,
    progress: &'a indicatif::ProgressBar,
}

impl RealSearch<'_> {
    /// The step `--run` trains, at any batch.
    fn config(args: &MaxbatchArgs, name: &str, online: bool) -> anyhow::Result<TrainConfig> {
        let profile =
            crate::source::profile(&args.opts)?.unwrap_or_else(|| pebble_zoo::ModelOptions::default().profile);
        let size = &args.opts.size;
        let options = pebble_zoo::ModelOptions {
            image: size.image,
            seq: size.seq,
            layers: size.layers,
            width: size.width,
            heads: size.heads,
            ..pebble_zoo::ModelOptions { profile, ..Default::default() }
        };
        let solve = super::solve_options(&args.solve, &options.profile.machine);
        Ok(TrainConfig {
            model: args.model.clone(),
            options,
            budget: BudgetRequest::Total(args.memory),
            solver: name.to_string(),
            online,
            steps: 1,
            seed: 0,
            optimizer: OptimizerKind::AdamW { lr: 1e-3, weight_decay: 0.01 },
            // Op times and temporaries measured on the device: a declared temporary can
            // be smaller than what the backend takes.
            costs: Costs::Profiled,
            solve,
        })
    }

    /// Trains one step at `batch`: whether it ran within the memory.
    fn fits(&mut self, batch: usize) -> anyhow::Result<bool> {
        self.progress.set_message(format!("{}: batch {batch}, one real step", self.config.solver));
        self.config.options.batch = Some(batch);
        let config = &self.config;
        let ran = match pebble_train::train_on(self.device, config) {
            Ok(r) => match r.measured_peak_bytes {
                Some(peak) if peak > self.memory => Err(format!("measured peak {peak} bytes")),
                peak => Ok((peak.unwrap_or(0), r.step_seconds.iter().sum())),
            },
            Err(e @ (TrainError::Infeasible { .. } | TrainError::DeviceMemory { .. } | TrainError::Runtime(_))) => {
                Err(e.to_string())
            }
            Err(e) => return Err(super::train::lift(e)),
        };
        let fits = ran.is_ok();
        self.tried.push(RealTry { batch, ran });
        Ok(fits)
    }

    /// The largest batch up to `simulated` that runs: steps down from it by 1, 2, 4, …
    /// (the answer is usually close) until one runs, then bisects; `None` if not even 1.
    fn largest(&mut self, simulated: usize) -> anyhow::Result<Option<usize>> {
        if self.fits(simulated)? {
            return Ok(Some(simulated));
        }
        let (mut lo, mut hi, mut step) = (0, simulated, 1);
        while hi > 1 {
            let b = hi.saturating_sub(step).max(1);
            if self.fits(b)? {
                lo = b;
                break;
            }
            hi = b;
            step *= 2;
        }
        while lo > 0 && hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if self.fits(mid)? {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        Ok((lo > 0).then_some(lo))
    }
}

pub fn run(args: &MaxbatchArgs) -> anyhow::Result<ExitCode> {
    let BudgetSpec::Bytes(memory) = args.memory else {
        return Err(bad(
            "--memory: give a size (`80GB`, `16GiB`): a percentage of store-all's peak changes with the batch",
        ));
    };
    if args.max == 0 {
        return Err(bad("--max: must be at least 1"));
    }
    if args.max > pebble_zoo::MAX_BATCH {
        return Err(bad(format!("--max: at most {}, the largest batch a model takes", pebble_zoo::MAX_BATCH)));
    }
    // `--device cpu|cuda` says where `--run` trains; any other value is the old spelling
    // of `--profile`.
    let mut args = args.clone();
    let device = match args.opts.device.as_deref().map(str::to_ascii_lowercase).as_deref() {
        Some("cpu") => Some(DeviceKind::Cpu),
        Some("cuda" | "gpu") => Some(DeviceKind::Cuda),
        _ => None,
    };
    if device.is_some() {
        args.opts.device = None;
        if !args.run {
            return Err(bad("--device: where to train, which only `--run` does"));
        }
    }
    let args = &args;
    if args.run {
        let options = crate::source::model_options(&args.opts)?;
        super::check_run_link(args.solve.bandwidth, &options.profile.machine)?;
    }
    let (name, is_policy) = solver_or_policy(&args.solver, &args.policy)?;
    let solver = find_solver(name, if is_policy { "--policy" } else { "--solver" })?;
    let store_all = find_solver("store-all", "--solver")?;
    let progress = crate::progress::spinner("largest batch");
    let mut search = Search { args, solver, tried: Vec::new(), progress: &progress };
    let found = search.largest()?;
    let baseline = largest_batch(args, store_all, &progress)?;
    let Some((batch, step)) = found else {
        let least = search.least_memory(1)?;
        progress.finish_and_clear();
        let need = match least {
            Some(m) => format!("; batch 1 needs at least {}", pebble_graph::units::format_bytes(m)),
            None => String::new(),
        };
        return Err(Infeasible(format!(
            "`{name}` fits no batch in {}, not even 1{need}",
            pebble_graph::units::format_bytes(memory)
        ))
        .into());
    };
    let real = if args.run {
        let device = device.unwrap_or(DeviceKind::Cpu);
        let config = RealSearch::config(args, name, is_policy)?;
        let mut real = RealSearch { config, memory, device, tried: Vec::new(), progress: &progress };
        let found = real.largest(batch)?;
        Some((found, real.tried))
    } else {
        None
    };
    progress.finish_and_clear();
    let capped = batch == args.max;
    let growth = baseline.map(|(b, _)| batch as f64 / b as f64);
    let tried: Vec<_> =
        search.tried.iter().map(|t| json!({ "batch": t.batch, "step_seconds": t.fit.map(|f| f.step) })).collect();
    let fit = search.tried.iter().find(|t| t.batch == batch).and_then(|t| t.fit);
    let run = real.as_ref().map(|(found, tried)| {
        let at = |b: usize| tried.iter().find(|t| t.batch == b).and_then(|t| t.ran.as_ref().ok());
        json!({
            "max_batch": found,
            "measured_peak_bytes": found.and_then(at).map(|r| r.0),
            "step_seconds": found.and_then(at).map(|r| r.1),
            "tried": tried.iter().map(|t| match &t.ran {
                Ok((peak, step)) => json!({ "batch": t.batch, "measured_peak_bytes": peak, "step_seconds": step }),
                Err(why) => json!({ "batch": t.batch, "failed": why }),
            }).collect::<Vec<_>>(),
        })
    });
    let report = json!({
        "model": args.model,
        "planner": name,
        "memory_bytes": memory,
        "max_batch": batch,
        "capped": capped,
        "step_seconds": step,
        "samples_per_second": batch as f64 / step,
        "store_all_max_batch": baseline.map(|(b, _)| b),
        "store_all_step_seconds": baseline.map(|(_, s)| s),
        "growth": growth,
        "planner_share": fit.map(|f| f.share),
        "allocator": fit.and_then(|f| f.allocator),
        "tried": tried,
        "run": run,
    });
    if args.json {
        out::print_json(&report)?;
        return Ok(ExitCode::SUCCESS);
    }
    let against = match baseline {
        Some((b, s)) => format!("store-all: {b} ({s:.4} s a step), {:.2}× its batch", batch as f64 / b as f64),
        None => "store-all fits no batch".into(),
    };
    let mut text = format!(
        "{} under `{name}`: batch {batch}{} ({step:.4} s a step, {:.1} samples/s); {against}\n",
        args.model,
        if capped { " (the --max cap)" } else { "" },
        batch as f64 / step,
    );
    if let Some((found, tried)) = &real {
        let ran = |b: usize| tried.iter().find(|t| t.batch == b).and_then(|t| t.ran.as_ref().ok());
        text.push_str(&match found.and_then(|b| ran(b).map(|r| (b, r))) {
            Some((b, (peak, secs))) => format!(
                "for real: batch {b} ran within the memory (measured peak {:.1} MiB, one step {secs:.3} s); {}\n",
                *peak as f64 / (1u64 << 20) as f64,
                steps_tried(tried.len())
            ),
            None => format!("for real: no batch ran within the memory ({})\n", steps_tried(tried.len())),
        });
    }
    out::print(&text)?;
    Ok(ExitCode::SUCCESS)
}
