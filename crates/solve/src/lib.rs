//! pebble's solvers.
//!
//! A [`Solver`] is a pure function of a problem ([`Problem::Chain`] or
//! [`Problem::Graph`]) and a device budget that returns a [`Schedule`]. It never
//! reports its own peak or time: [`plan`] runs it and scores the schedule with
//! `pebble-sim`. Each solver registers itself beside its own code with
//! `inventory::submit!`, and [`registry`] lists them all.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

use std::sync::Arc;
use std::time::Instant;

use pebble_graph::{Chain, TrainingGraph};
use pebble_machine::Machine;
use pebble_schedule::{Schedule, View};
use pebble_sim::{SimConfig, SimError, SimReport};
use thiserror::Error;

pub mod auto;
pub mod baseline;
pub mod bound;
pub mod budget;
pub mod deadline;
mod discretize;
pub mod offload;
pub mod oracle;
pub mod pipeline;
pub mod policy;
pub mod remat;
pub mod sequence;
pub mod weights;

/// What a solver plans.
#[derive(Debug, Clone, Copy)]
pub enum Problem<'a> {
    /// A chain (rotor's format).
    Chain(&'a Chain),
    /// A training graph.
    Graph(&'a TrainingGraph),
}

impl<'a> Problem<'a> {
    /// The view of the problem.
    pub fn view(&self) -> View {
        match self {
            Problem::Chain(_) => View::Chain,
            Problem::Graph(_) => View::Graph,
        }
    }

    /// The chain of a chain-only solver's problem, or [`SolveError::NotApplicable`].
    pub fn chain_for(&self, solver: &'static str) -> Result<&'a Chain, SolveError> {
        match *self {
            Problem::Chain(c) => Ok(c),
            Problem::Graph(_) => Err(SolveError::NotApplicable { solver, view: View::Graph }),
        }
    }

    /// The graph of a graph-only solver's problem, or [`SolveError::NotApplicable`].
    pub fn graph_for(&self, solver: &'static str) -> Result<&'a TrainingGraph, SolveError> {
        match *self {
            Problem::Graph(g) => Ok(g),
            Problem::Chain(_) => Err(SolveError::NotApplicable { solver, view: View::Chain }),
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
    /// The machine: its links time transfers for offloading solvers and the simulator.
    pub machine: Machine,
    /// Where long solves report how far they are.
    pub progress: Progress,
    /// The simulator replays device memory through PyTorch's caching allocator (its
    /// capacity the budget): `None`, the default, counts allocated bytes only.
    pub allocator: Option<pebble_sim::allocator::AllocatorConfig>,
}

impl Default for SolveOptions {
    fn default() -> Self {
        SolveOptions {
            slots: Slots::Count(500),
            time_limit: None,
            machine: Machine::default(),
            progress: Progress::none(),
            allocator: None,
        }
    }
}

impl SolveOptions {
    /// The simulator's configuration for these options: no budget, no timeline.
    pub fn sim_config(&self) -> SimConfig {
        SimConfig { allocator: self.allocator, ..SimConfig::on(self.machine) }
    }
}

/// A callback for solves that take minutes: `(what, done, total)`, e.g. `("HiRemate:
/// solving clusters", 3, 17)`. Solvers call it and draw nothing themselves; the CLI draws
/// a bar. Two `Progress` values always compare equal: reporting is not an option that
/// changes a plan.
#[derive(Clone, Default)]
pub struct Progress(Option<Arc<ProgressFn>>);

/// What a [`Progress`] calls: `(what, done, total)`.
pub type ProgressFn = dyn Fn(&str, usize, usize) + Send + Sync;

impl Progress {
    /// Reports nothing.
    pub fn none() -> Progress {
        Progress(None)
    }

    /// Reports to `f`.
    pub fn new(f: impl Fn(&str, usize, usize) + Send + Sync + 'static) -> Progress {
        Progress(Some(Arc::new(f)))
    }

    /// `done` of `total` steps of `what` are finished.
    pub fn report(&self, what: &str, done: usize, total: usize) {
        if let Some(f) = &self.0 {
            f(what, done, total);
        }
    }
}

impl std::fmt::Debug for Progress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() { "Progress(callback)" } else { "Progress(none)" })
    }
}

impl PartialEq for Progress {
    fn eq(&self, _: &Progress) -> bool {
        true
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
    /// The problem lacks what this solver needs (e.g. a backward node that names no
    /// forward node, for the solvers that pair them).
    #[error("solver `{solver}` cannot plan this problem: {why}")]
    Unsupported {
        /// The solver.
        solver: &'static str,
        /// What it lacks.
        why: String,
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
    /// The views it plans: the chain unless it says otherwise.
    fn views(&self) -> &'static [View] {
        &[View::Chain]
    }
    /// Plans the problem within `budget` bytes of device memory (everything resident counted).
    /// The default prepares (see [`Solver::prepare`]) and plans at `budget`: a solver
    /// implements one of the two, `solve` or `prepare`, or both.
    fn solve(&self, problem: Problem<'_>, budget: u64, options: &SolveOptions) -> Result<Schedule, SolveError> {
        self.prepare(problem, options)?.solve(budget)
    }
    /// Does the work that does not depend on the budget once (Rockmate's block options,
    /// HiRemate's cluster options), for callers that solve one problem at many budgets:
    /// [`min_feasible_budget`]'s bisection, a sweep. The default does nothing ahead and
    /// calls [`Solver::solve`] at each budget. A solver that overrides it must give the
    /// same schedules as `solve`.
    fn prepare<'a>(
        &'a self,
        problem: Problem<'a>,
        options: &'a SolveOptions,
    ) -> Result<Box<dyn Prepared + 'a>, SolveError> {
        Ok(Box::new(Unprepared { solver: self.name(), solve: move |budget| self.solve(problem, budget, options) }))
    }
}

/// A solver bound to one problem and its options, ready to plan at any budget.
pub trait Prepared {
    /// The solver's name.
    fn solver(&self) -> &'static str;
    /// Plans within `budget` bytes, as [`Solver::solve`] would.
    fn solve(&self, budget: u64) -> Result<Schedule, SolveError>;
}

/// [`Solver::prepare`]'s default: nothing prepared, each budget solved from scratch.
struct Unprepared<F> {
    solver: &'static str,
    solve: F,
}

impl<F: Fn(u64) -> Result<Schedule, SolveError>> Prepared for Unprepared<F> {
    fn solver(&self) -> &'static str {
        self.solver
    }

    fn solve(&self, budget: u64) -> Result<Schedule, SolveError> {
        (self.solve)(budget)
    }
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

/// The solver called `name`.
pub fn solver(name: &str) -> Result<&'static dyn Solver, UnknownSolver> {
    let all = registry();
    all.iter()
        .copied()
        .find(|s| s.name() == name)
        .ok_or_else(|| UnknownSolver { name: name.to_string(), known: all.iter().map(|s| s.name()).collect() })
}

/// No registered solver has this name.
#[derive(Debug, Error, Clone, PartialEq)]
#[error(
    "unknown solver `{name}` (known: {}){}",
    known.join(", "),
    pebble_machine::names::did_you_mean(.name, .known.iter().copied())
)]
pub struct UnknownSolver {
    /// The name asked for.
    pub name: String,
    /// Every registered solver's name, sorted.
    pub known: Vec<&'static str>,
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
    let prepared = solver.prepare(problem, options)?;
    plan_prepared(prepared.as_ref(), problem, budget, options, start)
}

/// [`plan`] with a prepared solver; `start` is when solving began (preparation included).
fn plan_prepared(
    prepared: &dyn Prepared,
    problem: Problem<'_>,
    budget: u64,
    options: &SolveOptions,
    start: Instant,
) -> Result<Plan, PlanError> {
    let solver = prepared.solver();
    let schedule = prepared.solve(budget)?.with_solver(solver);
    let solve_seconds = start.elapsed().as_secs_f64();
    let config = SimConfig { budget: Some(budget), ..options.sim_config() };
    let report = simulate(problem, &schedule, &config).map_err(|error| match error {
        // Solvers plan bytes, not the caching allocator's segments: a plan whose segments
        // do not fit is no solver's bug, but no plan at this budget.
        SimError::OutOfMemory { .. } => PlanError::Solve(SolveError::Infeasible {
            budget,
            reason: format!("{solver}'s schedule fits in bytes, but not in the caching allocator's segments: {error}"),
        }),
        error => PlanError::Invalid { solver, error },
    })?;
    Ok(Plan { schedule, report, solve_seconds })
}

/// Plans one problem at several budgets, preparing the solver once (see
/// [`Solver::prepare`]). Each result is what [`plan`] would return at that budget.
pub fn plan_many(
    solver: &dyn Solver,
    problem: Problem<'_>,
    budgets: &[u64],
    options: &SolveOptions,
) -> Result<Vec<Result<Plan, PlanError>>, PlanError> {
    let prepared = solver.prepare(problem, options)?;
    Ok(budgets.iter().map(|&b| plan_prepared(prepared.as_ref(), problem, b, options, Instant::now())).collect())
}

/// Simulates a schedule on either view.
pub fn simulate(problem: Problem<'_>, schedule: &Schedule, config: &SimConfig) -> Result<SimReport, SimError> {
    match problem {
        Problem::Chain(c) => pebble_sim::simulate_chain(c, schedule, config),
        Problem::Graph(g) => pebble_sim::simulate_graph(g, schedule, config),
    }
}

/// Among schedules of `problem`, the fastest the simulator runs within `budget` (memory
/// waits included; the first of equals). `Err` holds the last simulator error, `None` if
/// there was no candidate. For solvers that build several candidates and let the
/// simulator pick.
pub fn fastest_within(
    problem: Problem<'_>,
    candidates: impl IntoIterator<Item = Schedule>,
    budget: u64,
    options: &SolveOptions,
) -> Result<Schedule, Option<SimError>> {
    let config = SimConfig { budget: Some(budget), ..options.sim_config() };
    let mut last = None;
    let mut best: Option<(f64, Schedule)> = None;
    for s in candidates {
        match simulate(problem, &s, &config) {
            Ok(r) if best.as_ref().is_none_or(|b| r.makespan < b.0) => best = Some((r.makespan, s)),
            Ok(_) => {}
            Err(e) => last = Some(e),
        }
    }
    best.map(|(_, s)| s).ok_or(last)
}

/// What [`plan_or_least`] found.
#[derive(Debug)]
pub enum Fit {
    /// A plan within the budget. `at`: the smaller budget it was made for, when the solver
    /// found nothing at the budget itself (its feasibility is not monotone: time-limited
    /// MILPs, discretized sizes).
    Plan {
        /// The plan (boxed: a plan is large beside the other variant).
        plan: Box<Plan>,
        /// The budget it was planned in, if not the one asked for.
        at: Option<u64>,
    },
    /// Nothing fits; the least budget that does ([`min_feasible_budget`]), if any.
    Infeasible {
        /// The least feasible budget.
        min_budget: Option<u64>,
    },
}

/// [`plan`] within `budget`, or, when the solver finds nothing there, the least budget it
/// fits. If that lies below `budget`, its plan fits `budget` too and is returned.
pub fn plan_or_least(
    solver: &dyn Solver,
    problem: Problem<'_>,
    budget: u64,
    options: &SolveOptions,
) -> Result<Fit, PlanError> {
    let start = Instant::now();
    // Prepared once for the three (HiRemate's cluster options take minutes).
    let prepared = solver.prepare(problem, options)?;
    match plan_prepared(prepared.as_ref(), problem, budget, options, start) {
        Ok(plan) => Ok(Fit::Plan { plan: Box::new(plan), at: None }),
        Err(PlanError::Solve(SolveError::Infeasible { .. })) => {
            least_below(prepared.as_ref(), problem, budget, options, start)
        }
        Err(e) => Err(e),
    }
}

/// [`plan_or_least`] for a caller that already found nothing at `budget` itself (the CLI's
/// `auto`, which keeps its candidates): the least budget, without planning at `budget`
/// again.
pub fn least_fit(
    solver: &dyn Solver,
    problem: Problem<'_>,
    budget: u64,
    options: &SolveOptions,
) -> Result<Fit, PlanError> {
    let start = Instant::now();
    let prepared = solver.prepare(problem, options)?;
    least_below(prepared.as_ref(), problem, budget, options, start)
}

/// The least budget `prepared` fits, and its plan if that lies below `budget`.
fn least_below(
    prepared: &dyn Prepared,
    problem: Problem<'_>,
    budget: u64,
    options: &SolveOptions,
    start: Instant,
) -> Result<Fit, PlanError> {
    let min_budget = min_feasible_prepared(prepared, problem, options)?;
    if let Some(m) = min_budget.filter(|&m| m < budget) {
        match plan_prepared(prepared, problem, m, options, start) {
            Ok(plan) => return Ok(Fit::Plan { plan: Box::new(plan), at: Some(m) }),
            Err(PlanError::Solve(SolveError::Infeasible { .. })) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(Fit::Infeasible { min_budget })
}

/// The smallest budget at which [`plan`] with `solver` succeeds, by bisection.
///
/// The search starts from the peak of the store-all schedule (simulated without a
/// budget) and doubles it, up to `2^63`, until the solver succeeds; then it bisects
/// between 0 and there, assuming feasibility is monotone in the budget. The solver is
/// prepared once ([`Solver::prepare`]). The result is a budget at which [`plan`] was seen
/// to succeed. `Ok(None)` when the solver fails even at `2^63` bytes, or does not plan
/// this problem at all (wrong view, too large).
///
/// [`SolveError::Infeasible`] counts as "does not fit": a schedule the simulator rejects
/// is a solver bug, returned as [`PlanError::Invalid`], never taken for a budget that is
/// too small. Below a budget where the solver succeeded, a solver that finds nothing in
/// its time limit (`TooLarge`: an ILP stopped without a plan, where tighter budgets make
/// it harder) does not fit there either: the least budget is where it finds a plan.
pub fn min_feasible_budget(
    solver: &dyn Solver,
    problem: Problem<'_>,
    options: &SolveOptions,
) -> Result<Option<u64>, PlanError> {
    let prepared = match solver.prepare(problem, options) {
        Ok(p) => p,
        Err(SolveError::NotApplicable { .. } | SolveError::TooLarge { .. } | SolveError::Unsupported { .. }) => {
            return Ok(None)
        }
        Err(e) => return Err(e.into()),
    };
    min_feasible_prepared(prepared.as_ref(), problem, options)
}

/// [`min_feasible_budget`] with a prepared solver.
fn min_feasible_prepared(
    prepared: &dyn Prepared,
    problem: Problem<'_>,
    options: &SolveOptions,
) -> Result<Option<u64>, PlanError> {
    const CAP: u64 = 1 << 63;
    // Ok(Some(true)): feasible; Ok(Some(false)): not at this budget; Ok(None): never.
    let ok = |budget: u64| match plan_prepared(prepared, problem, budget, options, Instant::now()) {
        Ok(_) => Ok(Some(true)),
        Err(PlanError::Solve(
            SolveError::NotApplicable { .. } | SolveError::TooLarge { .. } | SolveError::Unsupported { .. },
        )) => Ok(None),
        Err(PlanError::Solve(SolveError::Infeasible { .. })) => Ok(Some(false)),
        Err(e) => Err(e),
    };
    let mut hi = baseline::store_all::simulate_store_all(problem, &options.sim_config())
        .map(|r| r.peak_bytes)
        .unwrap_or(1)
        .clamp(1, CAP);
    loop {
        match ok(hi)? {
            None => return Ok(None),
            Some(true) => break,
            Some(false) if hi >= CAP => return Ok(None),
            Some(false) => hi = hi.saturating_mul(2).min(CAP),
        }
    }
    if ok(0)? == Some(true) {
        return Ok(Some(0));
    }
    // Invariant: no plan found at `lo`, one at `hi`.
    let mut lo = 0u64;
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        match ok(mid)? {
            Some(true) => hi = mid,
            None | Some(false) => lo = mid,
        }
    }
    Ok(Some(hi))
}
