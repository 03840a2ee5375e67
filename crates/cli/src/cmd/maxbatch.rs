//! `pebble maxbatch`: the largest batch whose training step fits a device memory, under a
//! solver or a run-time policy, in simulation; and store-all's beside it, for the growth
//! DELTA's tables report.
//!
//! The batch doubles from 1 while it fits, then bisects between the last that fits and the
//! first that does not. That assumes feasibility is monotone in the batch, which holds for
//! store-all and the exact solvers; for a heuristic it is the largest batch this search
//! finds.

use std::process::ExitCode;

use pebble_graph::units::BudgetSpec;
use pebble_solve::{PlanError, SolveError, Solver};
use serde_json::json;

use super::plan::Setup;
use crate::error::{bad, Infeasible};
use crate::flags::{BatchArg, BudgetArgs, MaxbatchArgs, SourceArgs};
use crate::out;
use crate::source::{find_solver, solver_or_policy, Source};

/// One batch tried: its step time if it fits.
struct Tried {
    batch: usize,
    step: Option<f64>,
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
            return Ok(t.step);
        }
        self.progress.set_message(format!("{}: batch {batch}", self.solver.name()));
        let source_args = SourceArgs { chain: None, graph: None, model: Some(self.args.model.clone()), onnx: None };
        let mut opts = self.args.opts.clone();
        opts.size.batch = Some(BatchArg::Fixed(batch));
        let budget = BudgetArgs { budget: Some(self.args.memory), activation_budget: None };
        let (source, machine) = Source::load(&source_args, &opts)?;
        let subject = source.view_for(self.solver)?;
        let setup = Setup::new((&self.args.solve, &budget), &source, &machine, &subject)?;
        let step =
            match pebble_solve::plan(self.solver, subject.problem(), setup.resolved.planned_bytes, &setup.options) {
                Ok(plan) => Some(plan.report.makespan),
                Err(PlanError::Solve(SolveError::Infeasible { .. })) => None,
                Err(e) => return Err(e.into()),
            };
        self.tried.push(Tried { batch, step });
        Ok(step)
    }

    /// The largest batch up to `--max` that fits, and its step time; `None` if not even 1.
    fn largest(&mut self) -> anyhow::Result<Option<(usize, f64)>> {
        let max = self.args.max;
        let Some(mut best) = self.fits(1)? else { return Ok(None) };
        let (mut lo, mut hi) = (1, None);
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

pub fn run(args: &MaxbatchArgs) -> anyhow::Result<ExitCode> {
    let BudgetSpec::Bytes(memory) = args.memory else {
        return Err(bad(
            "--memory: give a size (`80GB`, `16GiB`): a percentage of store-all's peak changes with the batch",
        ));
    };
    if args.max == 0 {
        return Err(bad("--max: must be at least 1"));
    }
    let (name, is_policy) = solver_or_policy(&args.solver, &args.policy)?;
    let solver = find_solver(name, if is_policy { "--policy" } else { "--solver" })?;
    let store_all = find_solver("store-all", "--solver")?;
    let progress = crate::progress::spinner("largest batch");
    let mut search = Search { args, solver, tried: Vec::new(), progress: &progress };
    let found = search.largest()?;
    let mut reference = Search { args, solver: store_all, tried: Vec::new(), progress: &progress };
    let baseline = reference.largest()?;
    progress.finish_and_clear();
    let Some((batch, step)) = found else {
        return Err(Infeasible(format!("`{name}` fits no batch in {memory} bytes, not even 1")).into());
    };
    let capped = batch == args.max;
    let growth = baseline.map(|(b, _)| batch as f64 / b as f64);
    let tried: Vec<_> = search.tried.iter().map(|t| json!({ "batch": t.batch, "step_seconds": t.step })).collect();
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
        "tried": tried,
    });
    if args.json {
        out::print_json(&report)?;
        return Ok(ExitCode::SUCCESS);
    }
    let against = match baseline {
        Some((b, s)) => format!("store-all: {b} ({s:.4} s a step), {:.2}× its batch", batch as f64 / b as f64),
        None => "store-all fits no batch".into(),
    };
    out::print(&format!(
        "{} under `{name}`: batch {batch}{} ({step:.4} s a step, {:.1} samples/s); {against}\n",
        args.model,
        if capped { " (the --max cap)" } else { "" },
        batch as f64 / step,
    ))?;
    Ok(ExitCode::SUCCESS)
}
