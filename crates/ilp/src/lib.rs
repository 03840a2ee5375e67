//! pebble's MILP solvers, solved with HiGHS.
//!
//! The dynamic programs of `pebble-solve` are exact only on chains (or K chains joined at
//! the loss); an integer linear program plans any training graph, at the price of a solve
//! time that grows fast with the graph. This crate holds those ILPs:
//!
//! * [`checkmate`]: the original Checkmate ILP (Jain et al., MLSys 2020, as Zhao's thesis
//!   reproduces it in §2.1.1), solver `checkmate`;
//! * [`rockmate`] and [`hiremate`]: Zhao's Rockmate (solvers `rockmate`, `rk-checkmate`)
//!   and HiRemate (solver `hiremate`);
//! * [`pipeline`]: Shilova's Ch. 6 ILP for pipelined model parallelism (solver
//!   `pipeline-ilp`) and MadPipe's phase 2 (solver `madpipe`).
//!
//! They share [`milp`], a thin layer over the `highs` crate: 0/1 terms that are either
//! constants or binary columns, linear expressions with constants, and a solve that
//! honours a time limit and tells an optimal solution from an incumbent found before the
//! limit.
//!
//! Like every solver, these are pure functions of (problem, budget, options) that return a
//! schedule; the simulator scores it. An ILP works in real numbers with tolerances, so each
//! solver simulates its schedule before returning it and tightens its own budget when the
//! simulated peak exceeds the budget (see the architecture invariant on rounding).
//! Rockmate and HiRemate build most of what they solve (block and cluster options) without
//! the budget: they do it in [`pebble_solve::Solver::prepare`], once for every budget the
//! caller then asks for, and report how far they are through
//! [`pebble_solve::SolveOptions::progress`]. Nothing is kept between calls.
//!
//! The solvers register themselves in `pebble-solve`'s registry; a binary that wants them
//! must link this crate (`use pebble_ilp as _;`).
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod checkmate;
pub mod hgraph;
pub mod hilp;
pub mod hiremate;
pub mod milp;
pub mod offmate;
pub mod pipeline;
#[cfg(test)]
mod prepare_tests;
pub mod rockmate;
pub use pebble_solve::sequence;
pub mod subgraph;
pub mod weight_bound;

use thiserror::Error;

pub use checkmate::Checkmate;
pub use hiremate::Hiremate;
pub use offmate::Offmate;
pub use pipeline::{MadPipe, PipelineIlp};
pub use rockmate::{RkCheckmate, Rockmate};

/// Why an ILP solver returned no schedule. Converted into a
/// [`pebble_solve::SolveError`] at the [`pebble_solve::Solver`] boundary.
#[derive(Debug, Error, Clone, PartialEq)]
#[non_exhaustive]
pub enum IlpError {
    /// The problem handed to the solver is not a valid training graph.
    #[error("invalid training graph: {0}")]
    InvalidGraph(String),
    /// HiGHS refused the model or failed while solving it.
    #[error("HiGHS failed to {what}: {status}")]
    Highs {
        /// What was asked of it.
        what: &'static str,
        /// The status it returned, in words.
        status: String,
    },
    /// HiGHS proved that no solution fits.
    #[error("the ILP is infeasible")]
    Infeasible,
    /// HiGHS stopped (time limit, memory limit, …) before finding a feasible solution.
    #[error("HiGHS stopped ({status}) after {seconds:.1} s without a feasible solution")]
    NoSolution {
        /// Why it stopped, in words.
        status: String,
        /// Seconds spent.
        seconds: f64,
    },
}

/// How many times a solver tightens its budget when the simulator finds its schedule above
/// the budget.
const RETRIES: usize = 3;

/// Evenly spaced budgets from `lo` to `hi`, both included, without repeats (one value if
/// `n` is 1 or the range is empty): the grids Rockmate's blocks and HiRemate's clusters
/// are solved over.
pub(crate) fn linspace(lo: u64, hi: u64, n: usize) -> Vec<u64> {
    if n <= 1 || hi <= lo {
        return vec![hi.max(lo)];
    }
    let mut v: Vec<u64> = (0..n).map(|i| lo + ((hi - lo) as f64 * i as f64 / (n - 1) as f64).round() as u64).collect();
    v.dedup();
    v
}

/// Rockmate's and HiRemate's budget grid (thesis §2.6): `np` peak budgets evenly spaced
/// from `min_peak` to `max_peak`, each with `ns` save budgets from `min_save` (the peak,
/// if smaller) to the peak; with `ns` ≤ 1 no save budget (one at the peak would bound
/// nothing the peak does not).
pub(crate) fn budget_grid(
    min_peak: u64,
    max_peak: u64,
    min_save: u64,
    (np, ns): (usize, usize),
) -> Vec<(u64, Option<u64>)> {
    let peaks = if np == 0 { Vec::new() } else { linspace(min_peak, max_peak.max(min_peak), np) };
    peaks
        .into_iter()
        .flat_map(|peak| match ns {
            0 | 1 => vec![(peak, None)],
            _ => linspace(min_save.min(peak), peak, ns).into_iter().map(|s| (peak, Some(s))).collect(),
        })
        .collect()
}

/// `items.iter().map(f)`, the first half on a second thread (a grid's ILPs are
/// independent; this machine class has two cores).
pub(crate) fn on_two_threads<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    std::thread::scope(|s| {
        let (a, b) = items.split_at(items.len().div_ceil(2));
        let f = &f;
        let first = s.spawn(move || a.iter().map(f).collect::<Vec<_>>());
        let rest: Vec<R> = b.iter().map(f).collect();
        let mut out = first.join().expect("a solver thread panicked");
        out.extend(rest);
        out
    })
}

/// Runs `solve(memory)` on the memory left after the fixed bytes and frees the sequence
/// it returns by liveness; see [`within_budget`], whose retries it takes part in (an
/// ILP's tolerance, a DP's rounding). The architecture invariant on rounding, in one
/// place for Zhao's solvers.
pub(crate) fn sequence_within_budget(
    g: &pebble_graph::TrainingGraph,
    budget: u64,
    options: &pebble_solve::SolveOptions,
    mut solve: impl FnMut(u64) -> Result<Vec<sequence::Step>, pebble_solve::SolveError>,
) -> Result<pebble_schedule::Schedule, pebble_solve::SolveError> {
    let fixed = g.fixed_bytes();
    let live = sequence::Liveness::new(g);
    let gave_up = |slack| format!("the schedules exceed the budget in simulation even {slack} bytes below it");
    within_budget(g, budget, options, gave_up, |slack| {
        let memory = budget.checked_sub(fixed + slack).ok_or_else(|| pebble_solve::SolveError::Infeasible {
            budget,
            reason: format!("{fixed} bytes are fixed (static memory and inputs)"),
        })?;
        Ok(live.schedule(&solve(memory)?))
    })
}

/// Runs `solve(slack)`, which plans within `budget − slack` bytes, from a slack of 0;
/// simulates the schedule and, should its peak exceed `budget`, solves again with the
/// excess added to the slack, up to [`RETRIES`] times (`gave_up(slack)` then says why
/// no schedule came back). A schedule the simulator rejects is returned as it is, for
/// `plan` to report the solver's bug. The architecture invariant on rounding, in one
/// place for every ILP solver.
pub(crate) fn within_budget(
    g: &pebble_graph::TrainingGraph,
    budget: u64,
    options: &pebble_solve::SolveOptions,
    gave_up: impl FnOnce(u64) -> String,
    mut solve: impl FnMut(u64) -> Result<pebble_schedule::Schedule, pebble_solve::SolveError>,
) -> Result<pebble_schedule::Schedule, pebble_solve::SolveError> {
    let config = options.sim_config();
    let mut slack = 0u64;
    for _ in 0..=RETRIES {
        let schedule = solve(slack)?;
        match pebble_sim::simulate_graph(g, &schedule, &config) {
            Ok(r) if r.peak_bytes > budget => slack += r.peak_bytes - budget,
            // Fits, or a solver bug that `plan` reports.
            _ => return Ok(schedule),
        }
    }
    Err(pebble_solve::SolveError::Infeasible { budget, reason: gave_up(slack) })
}

/// What Rockmate and HiRemate prepare once per graph: a plan at any budget.
pub(crate) trait Schedules {
    /// The schedule within `budget` bytes.
    fn schedule(
        &self,
        budget: u64,
        options: &pebble_solve::SolveOptions,
    ) -> Result<pebble_schedule::Schedule, pebble_solve::SolveError>;
}

/// Another solver's preparation ([`pebble_solve::Solver::prepare`], bound to the same
/// options): one of the candidates HiRemate keeps the fastest of.
impl Schedules for Box<dyn pebble_solve::Prepared + '_> {
    fn schedule(
        &self,
        budget: u64,
        _options: &pebble_solve::SolveOptions,
    ) -> Result<pebble_schedule::Schedule, pebble_solve::SolveError> {
        self.solve(budget)
    }
}

/// Rockmate's or HiRemate's preparation bound to its options: their
/// [`pebble_solve::Prepared`].
pub(crate) struct Ready<'a, P> {
    pub(crate) solver: &'static str,
    pub(crate) prepared: P,
    pub(crate) options: &'a pebble_solve::SolveOptions,
}

impl<P: Schedules> pebble_solve::Prepared for Ready<'_, P> {
    fn solver(&self) -> &'static str {
        self.solver
    }

    fn solve(&self, budget: u64) -> Result<pebble_schedule::Schedule, pebble_solve::SolveError> {
        self.prepared.schedule(budget, self.options)
    }
}

/// What [`pebble_solve::Solver::prepare`] returns when the preparation itself failed
/// (an invalid graph): each budget then fails as [`pebble_solve::Solver::solve`] would,
/// [`pebble_solve::SolveError::Infeasible`] with the reason.
pub(crate) struct Failed {
    pub(crate) solver: &'static str,
    pub(crate) reason: String,
}

impl pebble_solve::Prepared for Failed {
    fn solver(&self) -> &'static str {
        self.solver
    }

    fn solve(&self, budget: u64) -> Result<pebble_schedule::Schedule, pebble_solve::SolveError> {
        Err(pebble_solve::SolveError::Infeasible { budget, reason: self.reason.clone() })
    }
}

/// Rockmate's and HiRemate's blocks and clusters pair each backward node with the forward
/// node it differentiates; a graph whose backward nodes do not name theirs is one they
/// cannot plan (rather than a schedule that silently leaves those nodes out).
pub(crate) fn require_forward_links(
    g: &pebble_graph::TrainingGraph,
    solver: &'static str,
) -> Result<(), pebble_solve::SolveError> {
    match g
        .compute
        .iter()
        .enumerate()
        .find(|(_, c)| c.kind == pebble_graph::ComputeKind::Backward && c.forward.is_none())
    {
        Some((i, c)) => Err(pebble_solve::SolveError::Unsupported {
            solver,
            why: format!("backward node {i} `{}` names no forward node (compute[{i}].forward)", c.name),
        }),
        None => Ok(()),
    }
}
