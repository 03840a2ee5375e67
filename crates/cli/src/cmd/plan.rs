//! `pebble plan`: one solver, one budget; the simulator's verdict on the schedule.

use std::path::Path;
use std::process::ExitCode;

use pebble_machine::Machine;
use pebble_sim::{SimConfig, SimReport};
use pebble_solve::auto::Candidate;
use pebble_solve::budget::Budget;
use pebble_solve::{Fit, Plan, PlanError, SolveError, SolveOptions, Solver};
use serde_json::json;

use super::{budget_json, check_timeline, overhead, percent_of, resolve_budget, solve_options, timeline_bars};
use crate::error::{bad, Infeasible};
use crate::flags::{BatchArg, BudgetArgs, PlanArgs, SolveArgs};
use crate::out;
use crate::plot;
use crate::source::{find_solver, view_name, Source, Subject};

/// The batch sizes `--batch auto` tries, in turn, until one does not fit.
const AUTO_BATCHES: [usize; 14] = [1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 24, 32, 48, 64];

/// What a plan on one subject starts from: the solve options on the machine, store-all's
/// simulation (the reference of percentages and overheads), the static bytes, and the
/// budget resolved against them (the one memory model of every command).
pub(crate) struct Setup {
    pub(crate) options: SolveOptions,
    pub(crate) store_all: SimReport,
    pub(crate) static_bytes: u64,
    pub(crate) resolved: Budget,
}

/// The least memory a step of `subject` fits in under `solver`: its least feasible
/// budget with the runtime's reserve, as `--budget` would have to give it; `None` if no
/// budget does.
pub(crate) fn least_memory(
    solver: &dyn Solver,
    subject: &Subject,
    options: &SolveOptions,
    machine: &Machine,
) -> anyhow::Result<Option<u64>> {
    let planned = pebble_solve::min_feasible_budget(solver, subject.problem(), options)?;
    Ok(planned.map(|p| pebble_solve::budget::total_for(p, &machine.runtime)))
}

impl Setup {
    pub(crate) fn new(
        (solve, budget): (&SolveArgs, &BudgetArgs),
        source: &Source,
        machine: &Machine,
        subject: &Subject,
    ) -> anyhow::Result<Setup> {
        let options = solve_options(solve, machine);
        let store_all = subject.store_all(&options.machine)?;
        let static_bytes = source.param_state_bytes(subject);
        let resolved = resolve_budget(budget, store_all.peak_bytes, static_bytes, machine)?;
        Ok(Setup { options, store_all, static_bytes, resolved })
    }
}

pub fn run(args: &PlanArgs) -> anyhow::Result<ExitCode> {
    if let Some(bound) = pebble_solve::bound::bound(&args.solver) {
        return run_bound(args, bound);
    }
    if args.opts.size.batch == Some(BatchArg::Auto) {
        let batch = auto_batch(args)?;
        let mut fixed = args.clone();
        fixed.opts.size.batch = Some(BatchArg::Fixed(batch));
        return run(&fixed);
    }
    let solver = find_solver(&args.solver, "--solver")?;
    check_timeline(&args.timeline)?;
    if let Some(path) = &args.output {
        crate::source::check_new_file(path, "--output", args.timeline.force)?;
    }
    let (source, machine) = Source::load(&args.source, &args.opts)?;
    let subject = source.view_for(solver)?;
    // `--budget` counts everything resident; `--activation-budget` all but static memory.
    // Solvers plan in what the executor's reserve leaves of it.
    let setup = Setup::new((&args.solve, &args.budget), &source, &machine, &subject)?;
    let cx = Context { args, solver, source: &source, machine: &machine, subject: &subject, setup: &setup };
    let (units, planned) = (source.units(), setup.resolved.planned_bytes);
    let report = cx.head_json();
    let start = std::time::Instant::now();
    let (fit, candidates) = fit(solver, subject.problem(), planned, &setup.options);
    let mut plan = match fit {
        Ok(Fit::Plan { plan, at }) => {
            if let Some(m) = at {
                eprintln!(
                    "note: `{}` found no schedule at {} itself, but one at {} (its feasibility is not monotone \
                     in the budget): that one is reported",
                    solver.name(),
                    units.size(planned),
                    units.size(m)
                );
            }
            *plan
        }
        Ok(Fit::Infeasible { min_budget }) => return cx.infeasible(report, min_budget, start),
        Err(PlanError::Solve(
            e @ (SolveError::NotApplicable { .. } | SolveError::TooLarge { .. } | SolveError::Unsupported { .. }),
        )) => {
            return Err(bad(format!("--solver: {e}")));
        }
        Err(e) => return Err(e.into()),
    };
    if let Some(path) = &args.output {
        plan.schedule.planned_for = Some(source.describe(&subject));
        let mut text = plan.schedule.to_json();
        text.push('\n');
        crate::source::write_new_file(path, "--output", &text, args.timeline.force)?;
    }
    if let Some(path) = &args.timeline.timeline {
        cx.draw_timeline(path, &plan)?;
    }
    // `offload-bound` (Shilova's Proposition 3): no schedule that offloads without
    // recomputing is faster; a time, with no schedule.
    let bound = match &subject {
        Subject::Chain(chain) => pebble_solve::offload::lower_bound(chain, planned, &setup.options.machine).ok(),
        Subject::Graph(_) => None,
    };
    if args.json {
        let mut report = cx.plan_json(report, &plan, bound);
        if let Some(c) = &candidates {
            extend(&mut report, json!({ "candidates": c }));
        }
        out::print_json(&report)?;
        return Ok(ExitCode::SUCCESS);
    }
    let mut text = cx.text(&plan, bound);
    if let Some(c) = &candidates {
        text.push_str(&candidates_text(c, source.units()));
    }
    out::print(&text)?;
    Ok(ExitCode::SUCCESS)
}

/// Plans with `solver`, or finds the least budget where it fails. For `auto`, also its
/// candidates: its run at `budget` is kept, and where it finds nothing, only the least
/// budget is searched.
fn fit(
    solver: &'static dyn Solver,
    problem: pebble_solve::Problem<'_>,
    budget: u64,
    options: &SolveOptions,
) -> (Result<Fit, PlanError>, Option<Vec<Candidate>>) {
    if solver.name() != pebble_solve::auto::AUTO.name() {
        return (pebble_solve::plan_or_least(solver, problem, budget, options), None);
    }
    let out = pebble_solve::auto::run(problem, budget, options);
    match out.best {
        Some(plan) => (Ok(Fit::Plan { plan: Box::new(plan), at: None }), Some(out.candidates)),
        None => (pebble_solve::least_fit(solver, problem, budget, options), Some(out.candidates)),
    }
}

/// `auto`'s candidates, one line each: its time or why it has none, and its solve time.
fn candidates_text(candidates: &[Candidate], units: crate::source::Units) -> String {
    let mut text = String::from("candidates (simulated time; solve time)\n");
    for c in candidates {
        let what = match (c.time, &c.error) {
            (Some(t), _) => units.time(t),
            (None, Some(e)) => e.clone(),
            (None, None) => "no plan".into(),
        };
        text.push_str(&format!("  {:<24} {what} ({:.2} s)\n", c.solver, c.solve_seconds));
    }
    text
}

/// What `pebble plan` plans: the flags, the solver, the source with the view the solver
/// plans, the machine, and the budget with its references.
struct Context<'a> {
    args: &'a PlanArgs,
    solver: &'static dyn Solver,
    source: &'a Source,
    machine: &'a Machine,
    subject: &'a Subject,
    setup: &'a Setup,
}

impl Context<'_> {
    /// The report's fields known before planning: the solver, the view, the references
    /// and the budget.
    fn head_json(&self) -> serde_json::Value {
        let Setup { store_all, static_bytes, resolved, .. } = self.setup;
        let mut report = json!({
            "solver": self.solver.name(),
            "view": view_name(self.subject.view()),
            "static_bytes": static_bytes,
            "store_all_peak_bytes": store_all.peak_bytes,
            "activation_peak_bytes": store_all.peak_bytes.saturating_sub(*static_bytes),
            "baseline_time": store_all.makespan,
        });
        extend(&mut report, budget_json(resolved, self.machine));
        report
    }

    /// No schedule fits: the message, with the least budget the solver fits (`min_planned`,
    /// planned bytes), printed in the report under `--json`; the error to exit with.
    fn infeasible(
        &self,
        mut report: serde_json::Value,
        min_planned: Option<u64>,
        start: std::time::Instant,
    ) -> anyhow::Result<ExitCode> {
        let (units, resolved) = (self.source.units(), &self.setup.resolved);
        let min = min_planned.map(|planned| pebble_solve::budget::total_for(planned, &self.machine.runtime));
        let message = match min {
            Some(m) => format!(
                "infeasible: no schedule of `{}` fits in {}; the minimum feasible budget is {} ({} of store-all)",
                self.solver.name(),
                units.size(resolved.total_bytes),
                units.size(m),
                percent_of(m, resolved.reference_bytes)
            ),
            None => format!(
                "infeasible: no schedule of `{}` fits in {}, nor in any budget",
                self.solver.name(),
                units.size(resolved.total_bytes)
            ),
        };
        if self.args.json {
            extend(
                &mut report,
                json!({
                    "feasible": false,
                    "predicted_peak_bytes": null,
                    "predicted_time": null,
                    "overhead": null,
                    "solve_seconds": start.elapsed().as_secs_f64(),
                    "min_feasible_budget_bytes": min,
                    "error": message,
                }),
            );
            out::print_json(&report)?;
        }
        Err(Infeasible(message).into())
    }

    /// Draws the plan's timeline to `path` (`--timeline`): its own simulation, again, with
    /// the spans and the memory curve recorded.
    fn draw_timeline(&self, path: &Path, plan: &Plan) -> anyhow::Result<()> {
        let (units, resolved, problem) = (self.source.units(), &self.setup.resolved, self.subject.problem());
        let budget = resolved.total_bytes;
        let config =
            SimConfig { budget: Some(resolved.planned_bytes), timeline: true, ..self.setup.options.sim_config() };
        let report = pebble_solve::simulate(problem, &plan.schedule, &config)
            .map_err(|error| PlanError::Invalid { solver: self.solver.name(), error })?;
        let (planned, line) = if resolved.reserve_bytes > 0 {
            (format!(" ({} planned)", units.size(resolved.planned_bytes)), "budget (the share solvers plan in)")
        } else {
            (String::new(), "budget")
        };
        let chart = plot::Timeline {
            title: format!(
                "{} on {}, budget {}{planned}, {} of store-all",
                self.solver.name(),
                self.source.label(),
                units.size(budget),
                percent_of(budget, resolved.reference_bytes)
            ),
            units,
            bars: timeline_bars(problem, &plan.schedule, &report.spans),
            moves: plan.schedule.moves(),
            report: &report,
            budget: Some((resolved.planned_bytes, line.to_string())),
        };
        plot::timeline(path, self.args.timeline.force, &chart)
    }

    /// The `--json` report of a plan: `report`'s fields and the simulator's figures.
    fn plan_json(&self, mut report: serde_json::Value, plan: &Plan, bound: Option<f64>) -> serde_json::Value {
        let time = plan.report.makespan;
        extend(
            &mut report,
            json!({
                "feasible": true,
                "predicted_peak_bytes": plan.report.peak_bytes,
                "predicted_time": time,
                "overhead": overhead(time, self.setup.store_all.makespan),
                "solve_seconds": plan.solve_seconds,
                "optimal": plan.schedule.optimal,
                "kept_from": plan.schedule.kept_from,
                "ops": plan.schedule.ops.len(),
                "compute_ops": plan.report.compute_ops,
                "peak_host_bytes": plan.report.peak_host_bytes,
                "d2h_busy": plan.report.d2h_busy,
                "h2d_busy": plan.report.h2d_busy,
                "cpu_busy": plan.report.cpu_busy,
                "compute_stall": plan.report.compute_stall,
                "offload_bound_time": bound,
                "periodic": plan.schedule.periodic,
                "periods_simulated": plan.report.periods,
                "moves": plan.schedule.moves(),
                "allocator": plan.report.allocator,
            }),
        );
        report
    }

    /// The text report of a plan: what was planned, in what budget, its peak and time,
    /// then what applies (periods, transfers, host CPU, the offload bound, a kept plan).
    fn text(&self, plan: &Plan, bound: Option<f64>) -> String {
        let (units, resolved, store_all) = (self.source.units(), &self.setup.resolved, &self.setup.store_all);
        let (budget, time) = (resolved.total_bytes, plan.report.makespan);
        let mut text = format!(
            "solver    {} on the {} view of {} ({} ops)\n\
             budget    {} ({} of what store-all needs, {}; {} planned, {} kept by the runtime)\n\
             peak      {}\n\
             time      {} (store-all {}): overhead {:+.1}%\n",
            self.solver.name(),
            view_name(self.subject.view()),
            self.source.label(),
            plan.schedule.ops.len(),
            units.size(budget),
            percent_of(budget, resolved.reference_bytes),
            units.size(resolved.reference_bytes),
            units.size(resolved.planned_bytes),
            units.size(resolved.reserve_bytes),
            units.size(plan.report.peak_bytes),
            units.time(time),
            units.time(store_all.makespan),
            100.0 * overhead(time, store_all.makespan),
        );
        if plan.schedule.periodic {
            text.push_str(&format!(
                "periodic  the time is the steady-state period, after {} periods simulated; link times are per period\n",
                plan.report.periods
            ));
        }
        if plan.report.peak_host_bytes > 0 {
            text.push_str(&format!(
                "transfers host peak {}; links busy {} to the host, {} back; compute stalled {}\n",
                units.size(plan.report.peak_host_bytes),
                units.time(plan.report.d2h_busy),
                units.time(plan.report.h2d_busy),
                units.time(plan.report.compute_stall)
            ));
        }
        text.push_str(&super::allocator_text(&plan.report, units));
        if plan.report.cpu_busy > 0.0 {
            text.push_str(&format!(
                "cpu       optimizer steps on the host CPU busy {}\n",
                units.time(plan.report.cpu_busy)
            ));
        }
        if let Some(b) = bound {
            text.push_str(&format!("bound     offloading alone (no recomputation) takes at least {}\n", units.time(b)));
        }
        if let Some(from) = &plan.schedule.kept_from {
            text.push_str(&format!(
                "plan      `{from}`'s (`{}` keeps another solver's plan where it runs faster than its own)\n",
                self.solver.name()
            ));
        }
        let proof = match plan.schedule.optimal {
            Some(true) => " (every MILP to optimality)",
            Some(false) => " (a MILP stopped at its time limit: the best solution found, not proven optimal)",
            None => "",
        };
        text.push_str(&format!("solved in {:.3} s{proof}\n", plan.solve_seconds));
        if let Some(path) = &self.args.output {
            text.push_str(&format!("schedule written to {}\n", path.display()));
        }
        if let Some(path) = &self.args.timeline.timeline {
            text.push_str(&format!("timeline written to {}\n", path.display()));
        }
        text
    }
}

/// Adds the fields of `more` (an object) to `report` (an object).
fn extend(report: &mut serde_json::Value, more: serde_json::Value) {
    if let (Some(r), serde_json::Value::Object(m)) = (report.as_object_mut(), more) {
        r.extend(m);
    }
}

/// `pebble plan --solver BOUND`: the bound's time at the budget, with no schedule, so
/// `--output` and `--timeline` are refused.
fn run_bound(args: &PlanArgs, bound: &pebble_solve::bound::Bound) -> anyhow::Result<ExitCode> {
    for (given, flag) in [(args.output.is_some(), "--output"), (args.timeline.timeline.is_some(), "--timeline")] {
        if given {
            return Err(bad(format!("{flag}: `{}` is a bound: it gives a time, not a schedule", bound.name)));
        }
    }
    let (source, machine) = Source::load(&args.source, &args.opts)?;
    let subject = source.view(pebble_schedule::View::Chain)?;
    let Subject::Chain(chain) = &subject else { unreachable!("asked for the chain view") };
    let units = source.units();
    let Setup { options, store_all, static_bytes, resolved } =
        Setup::new((&args.solve, &args.budget), &source, &machine, &subject)?;
    let mut report = json!({
        "solver": bound.name,
        "bound": true,
        "view": "chain",
        "static_bytes": static_bytes,
        "store_all_peak_bytes": store_all.peak_bytes,
        "activation_peak_bytes": store_all.peak_bytes.saturating_sub(static_bytes),
        "baseline_time": store_all.makespan,
    });
    extend(&mut report, budget_json(&resolved, &machine));
    let time = match (bound.time)(chain, resolved.planned_bytes, &options.machine) {
        Ok(time) => time,
        Err(SolveError::Infeasible { .. }) => {
            let family = find_solver(bound.feasibility, "--solver")?;
            let min = pebble_solve::min_feasible_budget(family, subject.problem(), &options)?
                .map(|planned| pebble_solve::budget::total_for(planned, &machine.runtime));
            let message = match min {
                Some(m) => format!(
                    "infeasible: no schedule bounded by `{}` fits in {}; the minimum feasible budget is {} ({} of store-all)",
                    bound.name,
                    units.size(resolved.total_bytes),
                    units.size(m),
                    percent_of(m, resolved.reference_bytes)
                ),
                None => format!("infeasible: no schedule bounded by `{}` fits in any budget", bound.name),
            };
            if args.json {
                extend(
                    &mut report,
                    json!({ "feasible": false, "predicted_time": null, "min_feasible_budget_bytes": min, "error": message }),
                );
                out::print_json(&report)?;
            }
            return Err(Infeasible(message).into());
        }
        Err(e) => return Err(bad(format!("--solver: {e}"))),
    };
    let over = overhead(time, store_all.makespan);
    if args.json {
        extend(&mut report, json!({ "feasible": true, "predicted_time": time, "overhead": over }));
        out::print_json(&report)?;
        return Ok(ExitCode::SUCCESS);
    }
    out::print(&format!(
        "bound     {} on the chain view of {}\n\
         budget    {} ({} of what store-all needs, {}; {} planned)\n\
         time      at least {} (store-all {}): overhead at least {:+.1}%; a bound, no schedule\n",
        bound.name,
        source.label(),
        units.size(resolved.total_bytes),
        percent_of(resolved.total_bytes, resolved.reference_bytes),
        units.size(resolved.reference_bytes),
        units.size(resolved.planned_bytes),
        units.time(time),
        units.time(store_all.makespan),
        100.0 * over,
    ))?;
    Ok(ExitCode::SUCCESS)
}

/// `--batch auto` (OffMate's batch selection, Zhao §4.7, by search rather than the
/// linearized MILP): plans at each of [`AUTO_BATCHES`] within the same budget in bytes,
/// stopping at the first batch that does not fit, and returns the batch of most samples
/// per second (the simulator's step time). A percentage budget changes with the batch, so
/// it is refused.
fn auto_batch(args: &PlanArgs) -> anyhow::Result<usize> {
    use pebble_graph::units::BudgetSpec;
    let solver = find_solver(&args.solver, "--solver")?;
    if args.source.model.is_none() {
        return Err(bad("--batch auto: needs a zoo model (`--model`), whose batch can change"));
    }
    if args.budget.activation_budget.is_some() || !matches!(args.budget.budget, Some(BudgetSpec::Bytes(_))) {
        return Err(bad(
            "--batch auto: give --budget in bytes (`10GB`): a percentage or an activation budget changes with the batch",
        ));
    }
    let mut best: Option<(usize, f64)> = None;
    let mut least_for_first = None;
    let mut tried = Vec::new();
    let bar = crate::progress::bar(AUTO_BATCHES.len() as u64, "batch sizes");
    for &b in &AUTO_BATCHES {
        let mut opts = args.opts.clone();
        opts.size.batch = Some(BatchArg::Fixed(b));
        let (source, machine) = match Source::load(&args.source, &opts) {
            Ok(x) => x,
            Err(_) => break,
        };
        let subject = source.view_for(solver)?;
        let Setup { options, resolved, .. } = Setup::new((&args.solve, &args.budget), &source, &machine, &subject)?;
        bar.inc(1);
        match pebble_solve::plan(solver, subject.problem(), resolved.planned_bytes, &options) {
            Ok(plan) => {
                let rate = b as f64 / plan.report.makespan;
                tried.push(format!("{b}: {rate:.3}/s"));
                if best.is_none_or(|(_, r)| rate > r) {
                    best = Some((b, rate));
                }
            }
            Err(PlanError::Solve(SolveError::Infeasible { .. })) => {
                tried.push(format!("{b}: does not fit"));
                if best.is_none() {
                    least_for_first = Some((b, least_memory(solver, &subject, &options, &machine)?));
                }
                break;
            }
            Err(e) => return Err(e.into()),
        }
    }
    bar.finish_and_clear();
    match best {
        Some((b, _)) => {
            eprintln!("--batch auto: {b} (samples per second at each batch: {})", tried.join(", "));
            Ok(b)
        }
        None => {
            let need = match least_for_first {
                Some((b, Some(m))) => format!("; batch {b} needs at least {}", pebble_graph::units::format_bytes(m)),
                _ => String::new(),
            };
            Err(Infeasible(format!(
                "--batch auto: `{}` fits no batch size in the budget, not even {}{need}",
                solver.name(),
                AUTO_BATCHES[0]
            ))
            .into())
        }
    }
}
