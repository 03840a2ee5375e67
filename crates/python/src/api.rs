//! The JSON API that `pebble._core` exposes, in plain Rust: every function takes and
//! returns JSON text, and fails with an [`ApiError`] (never a panic) naming the argument
//! and field at fault. `lib.rs` wraps each in a Python function.

use pebble_graph::units::{parse_budget as parse_budget_spec, parse_size as parse_size_text, BudgetSpec};
use pebble_machine::Profile;
use pebble_schedule::lower::{self, Ids};
use pebble_schedule::{placement, Schedule, View};
use pebble_sim::SimConfig;
use pebble_solve::auto::{self, Candidate};
use pebble_solve::{Fit, Plan, PlanError, Problem, SolveError, SolveOptions, Solver};
use serde_json::{json, Value};

use crate::chain_view::chain_view;
use crate::error::{ApiError, Result};
use crate::options::{self, Call, Options};
use crate::problem::{self, Given, Subject};

/// JSON text of `value`.
fn text(value: &Value) -> String {
    serde_json::to_string(value).expect("JSON values serialize")
}

/// `value` as JSON.
fn to_value(value: &impl serde::Serialize) -> Value {
    serde_json::to_value(value).expect("pebble's types serialize")
}

/// Every registered solver: `[{"name", "description", "views": ["chain", "graph"]}]`,
/// sorted by name.
pub fn solvers() -> String {
    let all: Vec<Value> = pebble_solve::registry()
        .iter()
        .map(|s| json!({"name": s.name(), "description": s.description(), "views": to_value(&s.views())}))
        .collect();
    text(&Value::Array(all))
}

/// The built-in machine profiles, each as `profile` gives it.
pub fn profiles() -> String {
    text(&Value::Array(Profile::builtin().iter().map(to_value).collect()))
}

/// A built-in profile, or a JSON profile file's, as JSON (the form `Profile::from_json`
/// reads); an unknown name gets the CLI's did-you-mean message.
pub fn profile(name: &str) -> Result<String> {
    Ok(text(&to_value(&options::lookup_profile(name)?)))
}

/// A size as the CLI reads it (`6GiB`, `512MB`, `1024`), in bytes.
pub fn parse_size(size: &str) -> Result<u64> {
    parse_size_text(size).map_err(|e| ApiError::bad(format!("size: {e}")))
}

/// A budget as the CLI reads it: `{"bytes": n}` or `{"percent": p}` (`50%`).
pub fn parse_budget(budget: &str) -> Result<String> {
    match parse_budget_spec(budget).map_err(|e| ApiError::bad(format!("budget: {e}")))? {
        BudgetSpec::Bytes(b) => Ok(text(&json!({ "bytes": b }))),
        BudgetSpec::Percent(p) => Ok(text(&json!({ "percent": p }))),
    }
}

/// The solver called `name`.
fn find_solver(name: &str) -> Result<&'static dyn Solver> {
    pebble_solve::solver(name).map_err(|e| ApiError::bad(format!("solver: {e}")))
}

/// What a failed plan means to the caller.
fn plan_error(solver: &str, e: PlanError) -> ApiError {
    match e {
        PlanError::Solve(e @ (SolveError::NotApplicable { .. } | SolveError::TooLarge { .. })) => {
            ApiError::bad(format!("solver: {e}"))
        }
        PlanError::Solve(e @ SolveError::Unsupported { .. }) => ApiError::bad(format!("solver: {e}")),
        PlanError::Solve(e) => ApiError::failed(format!("solver `{solver}`: {e}")),
        e => ApiError::failed(e.to_string()),
    }
}

/// Plans `problem` with `solver` within `budget` bytes (what the simulator checks: no
/// runtime reserve is taken off). See the Python stub (`_core.pyi`) for the JSON.
pub fn plan(problem: &str, solver: &str, budget: u64, options: &str) -> Result<String> {
    let given = problem::parse(problem)?;
    let opts = options::parse(options, Call::Plan)?;
    let s = find_solver(solver)?;
    if s.name() == auto::AUTO.name() {
        return plan_auto(&given, budget, &opts);
    }
    if opts.solvers.is_some() {
        return Err(ApiError::bad("options.solvers: only `auto` takes a list of solvers"));
    }
    let view = given.view_for(s.name(), s.views())?;
    let subject = given.view(view)?;
    match pebble_solve::plan_or_least(s, subject.problem(), budget, &opts.solve) {
        Ok(Fit::Plan { plan, at }) => Ok(text(&plan_json(s.name(), view, budget, &plan, at, None, &[]))),
        Ok(Fit::Infeasible { min_budget }) => Err(ApiError::infeasible(s.name(), budget, min_budget, None)),
        Err(e) => Err(plan_error(s.name(), e)),
    }
}

/// `auto` on every view the problem gives.
fn plan_auto(given: &Given, budget: u64, opts: &Options) -> Result<String> {
    let views = given.views();
    let subjects: Vec<Subject<'_>> = views.iter().map(|&v| given.view(v)).collect::<Result<_>>()?;
    let problems: Vec<Problem<'_>> = subjects.iter().map(Subject::problem).collect();
    let only: Option<Vec<&str>> = opts.solvers.as_ref().map(|v| v.iter().map(String::as_str).collect());
    let out = auto::run_views(&problems, budget, &opts.solve, only.as_deref())
        .map_err(|e| ApiError::bad(format!("options.solvers: {e}")))?;
    match (&out.best, out.problem) {
        (Some(plan), Some(p)) => {
            Ok(text(&plan_json("auto", views[p], budget, plan, None, out.winner, &out.candidates)))
        }
        _ => {
            let least = least_auto(&problems, &opts.solve, only.as_deref())?;
            let tried: Vec<String> = out
                .candidates
                .iter()
                .map(|c| format!("{}: {}", c.solver, c.error.as_deref().unwrap_or("no plan")))
                .collect();
            let why = if tried.is_empty() { "no solver plans this problem".into() } else { tried.join("; ") };
            Err(ApiError::infeasible("auto", budget, least, Some(&why)))
        }
    }
}

/// `auto`'s least feasible budget over `problems`: the least of its own (one time limit
/// per view, see `pebble_solve::auto`), or of the solvers `only` names.
fn least_auto(problems: &[Problem<'_>], opts: &SolveOptions, only: Option<&[&str]>) -> Result<Option<u64>> {
    let mut least: Option<u64> = None;
    for &problem in problems {
        let solvers: Vec<&'static dyn Solver> = match only {
            None => vec![&auto::AUTO],
            Some(names) => auto::solvers_for(problem.view(), Some(names))
                .map_err(|e| ApiError::bad(format!("options.solvers: {e}")))?,
        };
        for s in solvers {
            let m = pebble_solve::min_feasible_budget(s, problem, opts).map_err(|e| plan_error(s.name(), e))?;
            least = match (least, m) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
    }
    Ok(least)
}

/// The JSON of a plan.
fn plan_json(
    solver: &str,
    view: View,
    budget: u64,
    plan: &Plan,
    at: Option<u64>,
    winner: Option<&str>,
    candidates: &[Candidate],
) -> Value {
    json!({
        "solver": solver,
        "winner": winner.unwrap_or(solver),
        "view": to_value(&view),
        "budget_bytes": budget,
        "planned_at_bytes": at,
        "schedule": to_value(&plan.schedule),
        "report": to_value(&plan.report),
        "solve_seconds": plan.solve_seconds,
        "optimal": plan.schedule.optimal,
        "kept_from": plan.schedule.kept_from,
        "moves": to_value(&plan.schedule.moves()),
        "candidates": candidates,
    })
}

/// The least budget in which `solver` plans `problem` (bisection, as
/// `pebble_solve::min_feasible_budget`), or `None` where none does.
pub fn least_budget(problem: &str, solver: &str, options: &str) -> Result<Option<u64>> {
    let given = problem::parse(problem)?;
    let opts = options::parse(options, Call::Plan)?;
    let s = find_solver(solver)?;
    if s.name() == auto::AUTO.name() {
        let views = given.views();
        let subjects: Vec<Subject<'_>> = views.iter().map(|&v| given.view(v)).collect::<Result<_>>()?;
        let problems: Vec<Problem<'_>> = subjects.iter().map(Subject::problem).collect();
        let only: Option<Vec<&str>> = opts.solvers.as_ref().map(|v| v.iter().map(String::as_str).collect());
        return least_auto(&problems, &opts.solve, only.as_deref());
    }
    if opts.solvers.is_some() {
        return Err(ApiError::bad("options.solvers: only `auto` takes a list of solvers"));
    }
    let subject = given.view(given.view_for(s.name(), s.views())?)?;
    pebble_solve::min_feasible_budget(s, subject.problem(), &opts.solve).map_err(|e| plan_error(s.name(), e))
}

/// Reads `schedule`.
fn read_schedule(schedule: &str) -> Result<Schedule> {
    Schedule::from_json(schedule).map_err(|e| ApiError::bad(format!("schedule: {e}")))
}

/// The program `schedule` means on `problem` (`pebble_schedule::lower`): the chain's
/// `ChainProgram` or the graph's `GraphProgram` as JSON, with `"view"`, and for a chain
/// `"tensors"`, each id's tensor and bytes. An op the lowering refuses is an error.
pub fn lower(problem: &str, schedule: &str) -> Result<String> {
    let given = problem::parse(problem)?;
    let schedule = read_schedule(schedule)?;
    let refused = |k: usize, why: &dyn std::fmt::Display| {
        let op = schedule.ops.get(k % schedule.ops.len().max(1)).map(|o| o.to_string()).unwrap_or_default();
        ApiError::bad(format!("schedule: op {k} ({op}) does not lower: {why}"))
    };
    let mut out = match given.view(schedule.view)? {
        Subject::Chain(chain) => {
            let ids = Ids::of_chain(&chain);
            let starts = placement::starts(&schedule, chain.len());
            let periods = if schedule.periodic { pebble_sim::PERIODS } else { 1 };
            let program = lower::lower_chain(&schedule.ops, ids, schedule.periodic, &starts, periods);
            if let Some((k, why)) = &program.refused {
                return Err(refused(*k, why));
            }
            let mut v = to_value(&program);
            let tensors: Vec<Value> = (0..ids.count())
                .map(|id| {
                    let t = ids.tensor(id);
                    json!({"tensor": to_value(&t), "bytes": lower::tensor_bytes(&chain, t), "exists": ids.of(t).is_some()})
                })
                .collect();
            v["tensors"] = Value::Array(tensors);
            v
        }
        Subject::Graph(graph) => {
            let program = lower::lower_graph(graph, &schedule.ops);
            if let Some((k, why)) = &program.refused {
                return Err(refused(*k, why));
            }
            to_value(&program)
        }
    };
    out["view"] = to_value(&schedule.view);
    Ok(text(&out))
}

/// The simulator's report on `schedule` (`pebble_solve::simulate`), under
/// `options.budget` if given; a schedule it rejects is an error saying why.
pub fn simulate(problem: &str, schedule: &str, options: &str) -> Result<String> {
    let given = problem::parse(problem)?;
    let schedule = read_schedule(schedule)?;
    let opts = options::parse(options, Call::Simulate)?;
    let subject = given.view(schedule.view)?;
    let config = SimConfig { budget: opts.budget, timeline: opts.timeline, ..opts.solve.sim_config() };
    let report = pebble_solve::simulate(subject.problem(), &schedule, &config)
        .map_err(|e| ApiError::bad(format!("schedule: the simulator rejects it: {e}")))?;
    Ok(text(&to_value(&report)))
}

/// The chain view of a training graph, `{"chain", "stages"}` (see [`chain_view`]), or
/// `None` where the graph is not a sequence of blocks.
pub fn to_chain(graph: &str) -> Result<Option<String>> {
    let g = pebble_graph::TrainingGraph::from_json(graph).map_err(|e| ApiError::bad(format!("graph: {e}")))?;
    Ok(chain_view(&g).ok().map(|(chain, stages)| text(&json!({"chain": to_value(&chain), "stages": stages}))))
}

#[cfg(test)]
mod tests;
