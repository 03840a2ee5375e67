//! pebble's solvers.
//!
//! A [`Solver`] is a pure function of a problem ([`Problem::Chain`] or
//! [`Problem::Graph`]) and a device budget that returns a [`Schedule`]. It never
//! reports its own peak or time: [`plan`] runs it and scores the schedule with
//! `pebble-sim`. Each solver registers itself beside its own code with
//! `inventory::submit!`, and [`registry`] lists them all.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

use std::time::Instant;

use pebble_graph::{Chain, TrainingGraph};
use pebble_schedule::{Schedule, View};
use pebble_sim::{SimConfig, SimError, SimReport};
use thiserror::Error;

pub mod baseline;
pub mod brute;
mod discretize;
pub mod multichain;
pub mod revolve;
pub mod rk_rotor;
pub mod rotor;
pub mod rotor_optimal;
#[cfg(test)]
pub(crate) mod testkit;

/// What a solver plans.
#[derive(Debug, Clone, Copy)]
pub enum Problem<'a> {
    /// A chain (rotor's format).
    Chain(&'a Chain),
    /// A training graph.
    Graph(&'a TrainingGraph),
}

impl Problem<'_> {
    /// The view of the problem.
    pub fn view(&self) -> View {
        match self {
            Problem::Chain(_) => View::Chain,
            Problem::Graph(_) => View::Graph,
        }
    }
}

/// How finely a DP discretizes memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slots {
    /// Split the budget into this many slots, sizes rounded up (Rotor: 500).
    Count(usize),
    /// Use the chain's integer units as they are.
    Exact,
}

/// Options every solver may read.
#[derive(Debug, Clone, PartialEq)]
pub struct SolveOptions {
    /// Memory discretization of the DPs.
    pub slots: Slots,
    /// Wall-clock limit for MILP solvers, in seconds.
    pub time_limit: Option<f64>,
    /// Host↔device bandwidth (bytes per time unit) for offloading solvers and the simulator.
    pub bandwidth: f64,
}

impl Default for SolveOptions {
    fn default() -> Self {
        SolveOptions { slots: Slots::Count(500), time_limit: None, bandwidth: SimConfig::default().bandwidth }
    }
}

/// Why a solver returned no schedule.
#[derive(Debug, Error, Clone, PartialEq)]
#[non_exhaustive]
pub enum SolveError {
    /// No schedule of this solver fits the budget.
    #[error("no schedule fits in {budget} bytes: {reason}")]
    Infeasible {
        /// The budget asked for.
        budget: u64,
        /// Why, in words.
        reason: String,
    },
    /// The solver does not plan this view (a chain solver given a graph that has no partition).
    #[error("solver `{solver}` does not plan the {view:?} view")]
    NotApplicable {
        /// The solver.
        solver: &'static str,
        /// The view given.
        view: View,
    },
    /// The problem is too large for this solver (e.g. `brute` beyond 8 stages).
    #[error("solver `{solver}`: {why}")]
    TooLarge {
        /// The solver.
        solver: &'static str,
        /// Why.
        why: String,
    },
}

/// A rematerialization / offloading algorithm.
pub trait Solver: Sync {
    /// The name `--solver` takes, e.g. `rotor-optimal`.
    fn name(&self) -> &'static str;
    /// One line for `pebble plan --help` and the docs.
    fn description(&self) -> &'static str;
    /// The views it plans.
    fn views(&self) -> &'static [View];
    /// Plans the problem within `budget` bytes of device memory (everything resident counted).
    fn solve(&self, problem: Problem<'_>, budget: u64, options: &SolveOptions) -> Result<Schedule, SolveError>;
}

/// A registered solver. Submit one with `inventory::submit!(Registration(&MySolver))`.
pub struct Registration(pub &'static dyn Solver);
inventory::collect!(Registration);

/// Every registered solver, sorted by name.
pub fn registry() -> Vec<&'static dyn Solver> {
    let mut v: Vec<&'static dyn Solver> = inventory::iter::<Registration>.into_iter().map(|r| r.0).collect();
    v.sort_by_key(|s| s.name());
    v
}

/// The solver called `name`, if any.
pub fn solver(name: &str) -> Option<&'static dyn Solver> {
    registry().into_iter().find(|s| s.name() == name)
}

/// A solver's schedule with the simulator's verdict on it.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The schedule.
    pub schedule: Schedule,
    /// The simulator's report (peak, makespan) under the budget.
    pub report: SimReport,
    /// Wall-clock seconds the solver took.
    pub solve_seconds: f64,
}

/// Why [`plan`] failed.
#[derive(Debug, Error, Clone, PartialEq)]
#[non_exhaustive]
pub enum PlanError {
    /// The solver found nothing.
    #[error(transparent)]
    Solve(#[from] SolveError),
    /// The solver's schedule does not pass the simulator: a solver bug.
    #[error("solver `{solver}` produced an invalid schedule: {error}")]
    Invalid {
        /// The solver.
        solver: &'static str,
        /// The simulator's complaint.
        error: SimError,
    },
}

/// Runs `solver` and scores its schedule with the simulator under `budget`.
pub fn plan(solver: &dyn Solver, problem: Problem<'_>, budget: u64, options: &SolveOptions) -> Result<Plan, PlanError> {
    let start = Instant::now();
    let schedule = solver.solve(problem, budget, options)?.with_solver(solver.name());
    let solve_seconds = start.elapsed().as_secs_f64();
    let config = SimConfig { budget: Some(budget), bandwidth: options.bandwidth, timeline: false };
    let report =
        simulate(problem, &schedule, &config).map_err(|error| PlanError::Invalid { solver: solver.name(), error })?;
    Ok(Plan { schedule, report, solve_seconds })
}

/// Simulates a schedule on either view.
pub fn simulate(problem: Problem<'_>, schedule: &Schedule, config: &SimConfig) -> Result<SimReport, SimError> {
    match problem {
        Problem::Chain(c) => pebble_sim::simulate_chain(c, schedule, config),
        Problem::Graph(g) => pebble_sim::simulate_graph(g, schedule, config),
    }
}

/// The smallest budget at which [`plan`] with `solver` succeeds, by bisection.
///
/// The search starts from the peak of the store-all schedule (simulated without a
/// budget) and doubles it, up to `2^63`, until the solver succeeds; then it bisects
/// between 0 and there, assuming feasibility is monotone in the budget. The result is
/// a budget at which [`plan`] was seen to succeed. `None` when the solver fails even at
/// `2^63` bytes, or does not plan this problem at all (wrong view, too large).
pub fn min_feasible_budget(solver: &dyn Solver, problem: Problem<'_>, options: &SolveOptions) -> Option<u64> {
    const CAP: u64 = 1 << 63;
    // Some(true): feasible; Some(false): not at this budget; None: never.
    let ok = |budget: u64| match plan(solver, problem, budget, options) {
        Ok(_) => Some(true),
        Err(PlanError::Solve(SolveError::NotApplicable { .. } | SolveError::TooLarge { .. })) => None,
        Err(_) => Some(false),
    };
    let store_all = baseline::store_all::store_all_schedule(problem);
    let config = SimConfig { budget: None, bandwidth: options.bandwidth, timeline: false };
    let mut hi = simulate(problem, &store_all, &config).map(|r| r.peak_bytes).unwrap_or(1).clamp(1, CAP);
    loop {
        if ok(hi)? {
            break;
        }
        if hi >= CAP {
            return None;
        }
        hi = hi.saturating_mul(2).min(CAP);
    }
    if ok(0)? {
        return Some(0);
    }
    // Invariant: infeasible at `lo`, feasible at `hi`.
    let mut lo = 0u64;
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if ok(mid)? {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    Some(hi)
}
