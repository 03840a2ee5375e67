//! `auto`: every registered solver that plans the problem, within one time limit; the
//! fastest plan the simulator runs within the budget wins.
//!
//! The candidates come from the registry at run time ([`crate::registry`]), so the MILP
//! solvers of `pebble-ilp` take part wherever that crate is linked (the CLI, the Python
//! module) and this crate needs no dependency on it. `auto` itself and the exhaustive
//! oracles (`brute`, whose search blows up past a few stages) are never run.
//!
//! * **Order**: cheapest first: the fixed policies and the fast DPs ([`FAST`]), then the
//!   heavier DPs and any solver this file does not know, then the MILPs ([`MILP`]); in
//!   the listed order within each tier (others by name), and, given several views
//!   ([`run_views`]), tier by tier across the views.
//! * **Time**: one limit for the whole run: `SolveOptions::time_limit`, or
//!   [`DEFAULT_TIME_LIMIT`] seconds. Each solver gets what is left, shared evenly among
//!   the solvers of the slower tiers not yet run, as its own `time_limit` (which the MILP
//!   solvers honour per MILP). Once the time is spent, no solver beyond the first tier
//!   starts; the first tier's take milliseconds and always run, so that `auto` has a plan
//!   wherever one of them does. A solver that has started is not stopped (a solver is a
//!   pure function and cannot be interrupted), but every MILP it runs ends by its share's
//!   end ([`crate::deadline`]): HiRemate's hundreds of MILPs no longer take their own
//!   limit each.
//! * **Score**: each schedule is scored by [`crate::plan`] (the simulator at the budget);
//!   the fastest simulated time wins, the first of equals (so the cheaper solver). Once a
//!   plan runs in store-all's time (simulated with no budget), which no schedule beats,
//!   the rest are not run ([`UNBEATEN`]): a budget store-all fits is planned at once. A
//!   solver that finds nothing, refuses the problem, panics, or whose schedule the
//!   simulator rejects is recorded as a [`Candidate`] with its error; it never fails the
//!   run.
//!
//! The plan keeps the winner's schedule, with `kept_from` naming the winner.
//!
//! Through [`Solver::prepare`] (bisection for the least feasible budget), the limit covers
//! the prepared solver's whole life, every budget it is asked: the first budgets get the
//! slow solvers, the rest the first tier only, so the bisection ends in about the limit
//! and the budget it finds is one `auto` was seen to plan.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

use pebble_schedule::{Schedule, View};

use crate::{plan, registry, Plan, PlanError, Prepared, Problem, SolveError, SolveOptions, Solver, UnknownSolver};

/// The time limit of a whole `auto` run when the options give none, in seconds.
pub const DEFAULT_TIME_LIMIT: f64 = 60.0;

/// The first tier: fixed policies, run-time policies replayed, and DPs that take
/// milliseconds on any model the zoo builds. They run even once the time is spent.
pub const FAST: &[&str] = &[
    "store-all",
    "sequential",
    "recompute-all",
    "chen-sqrt",
    "revolve",
    "revolve-optimal",
    "rotor",
    "knapsack",
    "pytorch-mincut",
    "multichain",
    "dtr",
    "dtr-eq",
    "delta",
    "lru",
    "largest",
    "offload-greedy",
    "autocapper",
    "opportunist",
    "zero-offload",
    "zero-infinity",
    "paged-adam",
    "weight-offload",
    "weight-offload-noreuse",
    "l2l",
];

/// The last tier: the MILP solvers (in `pebble-ilp`), in the order they run.
pub const MILP: &[&str] = &["rockmate", "rk-checkmate", "hiremate", "offmate", "checkmate"];

/// Never run: `auto` itself, and the exhaustive oracles.
fn excluded(name: &str) -> bool {
    name == AUTO.name() || name.contains("brute") || name.contains("exhaustive")
}

/// 0: [`FAST`]; 1: the heavier DPs (`rotor-optimal`, `offload-dp`, `pofo`) and any
/// solver not listed; 2: [`MILP`].
fn tier(name: &str) -> usize {
    if FAST.contains(&name) {
        0
    } else if MILP.contains(&name) {
        2
    } else {
        1
    }
}

/// Where a solver runs: by tier, then in the order [`FAST`] and [`MILP`] list them (so
/// store-all, first, wins the ties at a loose budget), then by name.
fn order(name: &str) -> (usize, usize, &str) {
    let listed = FAST.iter().chain(MILP).position(|n| *n == name).unwrap_or(usize::MAX);
    (tier(name), listed, name)
}

/// One solver's result in an `auto` run (its JSON, in `plan --json` and Python's
/// report, names `peak` `peak_bytes`).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Candidate {
    /// The solver.
    pub solver: &'static str,
    /// The view it planned.
    pub view: View,
    /// The simulated time of its plan within the budget; `None` if it has none.
    pub time: Option<f64>,
    /// The simulated peak of its plan, bytes.
    #[serde(rename = "peak_bytes")]
    pub peak: Option<u64>,
    /// Wall-clock seconds it took (0 when not run).
    pub solve_seconds: f64,
    /// Whether the MILPs behind its plan were solved to optimality (see
    /// `Schedule::optimal`), where it says.
    pub optimal: Option<bool>,
    /// The solver whose plan it returned, where not its own (see `Schedule::kept_from`).
    pub kept_from: Option<String>,
    /// Why it has no plan: infeasible, unsupported, invalid, panicked, or not run because
    /// the time was spent.
    pub error: Option<String>,
}

/// What [`run`] found.
#[derive(Debug, Clone)]
pub struct AutoOutcome {
    /// The fastest plan within the budget, its schedule's `kept_from` naming the winner;
    /// `None` when no solver fits.
    pub best: Option<Plan>,
    /// The solver of `best`.
    pub winner: Option<&'static str>,
    /// Which of the problems given to [`run_views`] `best` plans (0 for [`run`]).
    pub problem: Option<usize>,
    /// Every solver considered, in the order they ran (those not run at the end).
    pub candidates: Vec<Candidate>,
    /// Wall-clock seconds of the whole run.
    pub seconds: f64,
}

impl AutoOutcome {
    /// `best`, or [`SolveError::Infeasible`] listing why each candidate has no plan.
    pub fn into_plan(self, budget: u64) -> Result<Plan, SolveError> {
        match self.best {
            Some(plan) => Ok(plan),
            None => Err(SolveError::Infeasible { budget, reason: no_fit(&self.candidates) }),
        }
    }
}

/// Why no candidate fits, in words: each solver with its error.
fn no_fit(candidates: &[Candidate]) -> String {
    if candidates.is_empty() {
        return "no solver plans this view".to_string();
    }
    let each: Vec<String> =
        candidates.iter().map(|c| format!("{}: {}", c.solver, c.error.as_deref().unwrap_or("no plan"))).collect();
    format!("no solver's plan fits ({})", each.join("; "))
}

/// The solvers `auto` runs on `view`, in the order it runs them: `only` (names, checked
/// against the registry) or every registered one, less `auto` and the oracles.
pub fn solvers_for(view: View, only: Option<&[&str]>) -> Result<Vec<&'static dyn Solver>, UnknownSolver> {
    let all: Vec<&'static dyn Solver> = match only {
        Some(names) => names.iter().map(|n| crate::solver(n)).collect::<Result<_, _>>()?,
        None => registry(),
    };
    let mut v: Vec<&'static dyn Solver> =
        all.into_iter().filter(|s| !excluded(s.name()) && s.views().contains(&view)).collect();
    v.sort_by_key(|s| order(s.name()));
    v.dedup_by_key(|s| s.name());
    Ok(v)
}

/// The time limit of a run under `options`.
fn limit(options: &SolveOptions) -> Duration {
    let secs = options.time_limit.filter(|t| t.is_finite() && *t >= 0.0).unwrap_or(DEFAULT_TIME_LIMIT);
    Duration::from_secs_f64(secs)
}

/// Plans `problem` within `budget` with every applicable solver (see the module's
/// documentation) and keeps the fastest simulated plan.
pub fn run(problem: Problem<'_>, budget: u64, options: &SolveOptions) -> AutoOutcome {
    run_views(&[problem], budget, options, None).expect("no names to look up")
}

/// [`run`] over several views of one model (its graph and its chain, say), one time
/// limit for all, and, with `only`, over those solvers alone (an unknown name is an
/// error). The winner may plan any of the problems: [`AutoOutcome::problem`] says which.
pub fn run_views(
    problems: &[Problem<'_>],
    budget: u64,
    options: &SolveOptions,
    only: Option<&[&str]>,
) -> Result<AutoOutcome, UnknownSolver> {
    let start = Instant::now();
    let deadline = start + limit(options);
    let mut jobs = Vec::new();
    for (p, problem) in problems.iter().enumerate() {
        jobs.extend(solvers_for(problem.view(), only)?.into_iter().map(|s| (p, *problem, s)));
    }
    // Stable: tier by tier, each view's solvers in their own order.
    jobs.sort_by_key(|(_, _, s)| tier(s.name()));
    let mut out = run_jobs(&jobs, budget, options, deadline);
    out.seconds = start.elapsed().as_secs_f64();
    Ok(out)
}

/// Runs `jobs` (problem index, problem, solver) in order until `deadline`.
fn run_jobs(
    jobs: &[(usize, Problem<'_>, &'static dyn Solver)],
    budget: u64,
    options: &SolveOptions,
    deadline: Instant,
) -> AutoOutcome {
    let mut out = AutoOutcome { best: None, winner: None, problem: None, candidates: Vec::new(), seconds: 0.0 };
    let floor = floor(jobs, options);
    for (k, &(p, problem, solver)) in jobs.iter().enumerate() {
        let name = solver.name();
        let mut candidate = Candidate {
            solver: name,
            view: problem.view(),
            time: None,
            peak: None,
            solve_seconds: 0.0,
            optimal: None,
            kept_from: None,
            error: None,
        };
        if floor.is_some_and(|f| out.best.as_ref().is_some_and(|b| b.report.makespan <= f * (1.0 + FLOOR_REL))) {
            candidate.error = Some(UNBEATEN.into());
            out.candidates.push(candidate);
            continue;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() && tier(name) > 0 {
            candidate.error = Some("not run: the time limit was spent".into());
            out.candidates.push(candidate);
            continue;
        }
        let slow_left = jobs[k..].iter().filter(|(_, _, s)| tier(s.name()) > 0).count().max(1);
        let share = if tier(name) > 0 { left / slow_left as u32 } else { left };
        let opts = SolveOptions { time_limit: Some(share.as_secs_f64()), ..options.clone() };
        let started = Instant::now();
        // The slower tiers' MILPs end with the share (`crate::deadline`).
        let until = (tier(name) > 0).then(|| started + share);
        let result =
            catch_unwind(AssertUnwindSafe(|| crate::deadline::within(until, || plan(solver, problem, budget, &opts))));
        candidate.solve_seconds = started.elapsed().as_secs_f64();
        match result {
            Ok(Ok(plan)) => {
                candidate.time = Some(plan.report.makespan);
                candidate.peak = Some(plan.report.peak_bytes);
                candidate.optimal = plan.schedule.optimal;
                candidate.kept_from = plan.schedule.kept_from.clone();
                let faster = out.best.as_ref().is_none_or(|b| plan.report.makespan < b.report.makespan);
                if faster {
                    let mut plan = plan;
                    plan.schedule.kept_from = Some(name.to_string());
                    out.best = Some(plan);
                    out.winner = Some(name);
                    out.problem = Some(p);
                }
            }
            Ok(Err(PlanError::Solve(e))) => candidate.error = Some(e.to_string()),
            Ok(Err(e)) => candidate.error = Some(format!("{e} (a solver bug)")),
            Err(panic) => candidate.error = Some(format!("panicked (a solver bug): {}", panic_message(&*panic))),
        }
        out.candidates.push(candidate);
    }
    if let Some(best) = &mut out.best {
        best.solve_seconds = out.candidates.iter().map(|c| c.solve_seconds).sum();
    }
    out
}

/// Why a candidate did not run once a plan as fast as store-all was found.
pub const UNBEATEN: &str = "not run: a plan as fast as store-all, which no schedule beats, was found";

/// Relative slack on "as fast as store-all" (sums in another order).
const FLOOR_REL: f64 = 1e-9;

/// The least of store-all's times (simulated with no budget) over the jobs' problems:
/// no plan of any of them is faster. `None` where one does not simulate.
fn floor(jobs: &[(usize, Problem<'_>, &'static dyn Solver)], options: &SolveOptions) -> Option<f64> {
    let mut seen = Vec::new();
    let mut floor = f64::INFINITY;
    for &(p, problem, _) in jobs {
        if !seen.contains(&p) {
            seen.push(p);
            let r = crate::baseline::store_all::simulate_store_all(problem, &options.sim_config()).ok()?;
            floor = floor.min(r.makespan);
        }
    }
    floor.is_finite().then_some(floor)
}

/// The `auto` solver, for the registry (`pebble plan --solver auto`).
pub struct Auto;

/// The registered instance.
pub static AUTO: Auto = Auto;

impl Solver for Auto {
    fn name(&self) -> &'static str {
        "auto"
    }

    fn description(&self) -> &'static str {
        "Every solver that plans the view, cheapest first, within --time-limit in all (default 60 s); keeps the \
         fastest plan the simulator runs within the budget"
    }

    fn views(&self) -> &'static [View] {
        &[View::Graph, View::Chain]
    }

    fn prepare<'a>(
        &'a self,
        problem: Problem<'a>,
        options: &'a SolveOptions,
    ) -> Result<Box<dyn Prepared + 'a>, SolveError> {
        let jobs: Vec<(usize, Problem<'a>, &'static dyn Solver)> = solvers_for(problem.view(), None)
            .expect("no names to look up")
            .into_iter()
            .map(|s| (0, problem, s))
            .collect();
        if jobs.is_empty() {
            return Err(SolveError::NotApplicable { solver: "auto", view: problem.view() });
        }
        Ok(Box::new(AutoPrepared { jobs, options, deadline: Instant::now() + limit(options) }))
    }
}

inventory::submit!(crate::Registration(&AUTO));

/// `auto` on one problem, its time limit running from preparation on.
struct AutoPrepared<'a> {
    jobs: Vec<(usize, Problem<'a>, &'static dyn Solver)>,
    options: &'a SolveOptions,
    deadline: Instant,
}

impl Prepared for AutoPrepared<'_> {
    fn solver(&self) -> &'static str {
        "auto"
    }

    fn solve(&self, budget: u64) -> Result<Schedule, SolveError> {
        run_jobs(&self.jobs, budget, self.options, self.deadline).into_plan(budget).map(|p| p.schedule)
    }
}

/// What a caught panic says (its `&str` or `String` payload).
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cheap_solvers_run_first_and_the_oracles_never() {
        let chain = solvers_for(View::Chain, None).unwrap();
        let names: Vec<&str> = chain.iter().map(|s| s.name()).collect();
        assert!(!names.contains(&"auto") && !names.contains(&"brute"), "{names:?}");
        assert!(names.contains(&"rotor"));
        let tiers: Vec<usize> = names.iter().map(|n| tier(n)).collect();
        assert!(tiers.windows(2).all(|w| w[0] <= w[1]), "{names:?}");
        let graph = solvers_for(View::Graph, None).unwrap();
        assert!(graph.iter().all(|s| s.views().contains(&View::Graph)));
        assert!(graph.iter().any(|s| s.name() == "dtr"));
        assert!(solvers_for(View::Chain, Some(&["rotor", "nope"])).is_err());
    }

    #[test]
    fn no_time_left_runs_the_first_tier_only() {
        let chain = pebble_testkit::hand_chain();
        // A slow link: no offloading plan is as fast as store-all below its peak.
        let machine = pebble_machine::Machine::default().with_bandwidth(1e-3);
        let options = SolveOptions { time_limit: Some(0.0), machine, ..SolveOptions::default() };
        let problem = Problem::Chain(&chain);
        let peak = crate::baseline::store_all::simulate_store_all(problem, &options.sim_config()).unwrap().peak_bytes;
        // Below store-all's peak, so that no plan is as fast as store-all.
        let out = run(problem, peak - 1, &options);
        for c in &out.candidates {
            let not_run = c.error.as_deref().is_some_and(|e| e.starts_with("not run: the time limit"));
            assert_eq!(not_run, tier(c.solver) > 0, "{c:?}");
        }
        assert!(out.best.is_some());
        // At store-all's peak, store-all runs first and nothing after it.
        let out = run(problem, peak, &options);
        assert_eq!(out.winner, Some("store-all"));
        assert!(out.candidates[1..].iter().all(|c| c.error.as_deref() == Some(UNBEATEN)));
    }
}
