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
pub mod weight_order_bound;

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

/// A point of a budget grid: a peak budget and, maybe, a save budget (bytes).
pub type Budgets = (u64, Option<u64>);

/// Rockmate's and HiRemate's budget grid (thesis §2.6): `np` peak budgets evenly spaced
/// from `min_peak` to `max_peak`, each with `ns` save budgets from `min_save` (the peak,
/// if smaller) to the peak; with `ns` ≤ 1 no save budget (one at the peak would bound
/// nothing the peak does not).
pub(crate) fn budget_grid(min_peak: u64, max_peak: u64, min_save: u64, (np, ns): (usize, usize)) -> Vec<Budgets> {
    let peaks = if np == 0 { Vec::new() } else { linspace(min_peak, max_peak.max(min_peak), np) };
    peaks
        .into_iter()
        .flat_map(|peak| match ns {
            0 | 1 => vec![(peak, None)],
            _ => linspace(min_save.min(peak), peak, ns).into_iter().map(|s| (peak, Some(s))).collect(),
        })
        .collect()
}

/// The H-ILP's answers over Rockmate's and HiRemate's budget grids, kept so that an ILP
/// whose answer is already known is not solved again. The H-ILP at `(P′, S′)` is the one
/// at `(P, S)` with tighter bounds when `P′ ≤ P` and `S′ ≤ S`: its solutions are a subset.
/// So an optimal solution at `(P, S)` that uses at most `P′` and `S′` is optimal at
/// `(P′, S′)` too, and infeasibility at `(P, S)` is infeasibility there.
///
/// Points are solved loosest first, up to `threads` at a time: first those no other point
/// of the batch can settle, then, to keep the threads busy, the next open ones. Which
/// points are solved depends on the answers and `threads` alone, never on timing, so a
/// grid gives the same options on every run where its ILPs end optimal.
pub struct GridAnswers {
    answers: Vec<(Budgets, Result<hilp::HSolution, IlpError>)>,
    threads: usize,
    /// ILPs actually solved.
    pub solved: usize,
}

/// Whether `inner` is `outer` or tighter.
fn within(inner: Budgets, outer: Budgets) -> bool {
    let save_within = match (inner.1, outer.1) {
        (_, None) => true,
        (None, Some(_)) => false,
        (Some(a), Some(b)) => a <= b,
    };
    inner.0 <= outer.0 && save_within
}

impl GridAnswers {
    /// No answers yet; ILPs solved `threads` at a time (at least one).
    pub fn new(threads: usize) -> GridAnswers {
        GridAnswers { answers: Vec::new(), threads: threads.max(1), solved: 0 }
    }

    /// The answer at `at` that an earlier answer proves: an optimal solution that fits
    /// it, or infeasibility.
    fn known(&self, at: Budgets) -> Option<Result<hilp::HSolution, IlpError>> {
        self.answers.iter().find_map(|(point, answer)| {
            if !within(at, *point) {
                return None;
            }
            match answer {
                Ok(sol) if sol.optimal && sol.peak <= at.0 && at.1.is_none_or(|s| sol.save <= s) => {
                    Some(Ok(sol.clone()))
                }
                Err(IlpError::Infeasible) => Some(Err(IlpError::Infeasible)),
                _ => None,
            }
        })
    }

    /// The answer at each point of `points`, in their order: a known one, or `solve`'s.
    /// `solve` may decline a point (`None`, e.g. once a time budget is spent); it is then
    /// left out of the answers.
    pub fn solve(
        &mut self,
        points: &[Budgets],
        solve: impl Fn(Budgets) -> Option<Result<hilp::HSolution, IlpError>> + Sync,
    ) -> Vec<Result<hilp::HSolution, IlpError>> {
        let mut order: Vec<usize> = (0..points.len()).collect();
        // Loosest first: larger peaks, then larger saves (none is the largest).
        order.sort_by_key(|&i| std::cmp::Reverse((points[i].0, points[i].1.map_or(u128::MAX, u128::from))));
        let mut out: Vec<Option<Option<Result<hilp::HSolution, IlpError>>>> = vec![None; points.len()];
        loop {
            // The first points still open that no other one of the batch can settle.
            let mut batch: Vec<usize> = Vec::new();
            for &i in &order {
                if out[i].is_some() {
                    continue;
                }
                if let Some(answer) = self.known(points[i]) {
                    out[i] = Some(Some(answer));
                    continue;
                }
                if batch.len() < self.threads && !batch.iter().any(|&b| within(points[i], points[b])) {
                    batch.push(i);
                }
            }
            if batch.is_empty() {
                break;
            }
            // Then the next open ones, which an answer of the batch might have settled.
            for &i in &order {
                if batch.len() < self.threads && out[i].is_none() && !batch.contains(&i) {
                    batch.push(i);
                }
            }
            let solve = &solve;
            let answers: Vec<_> = std::thread::scope(|s| {
                let deadline = pebble_solve::deadline::current();
                let others: Vec<_> = batch[1..]
                    .iter()
                    .map(|&i| s.spawn(move || pebble_solve::deadline::within(deadline, || solve(points[i]))))
                    .collect();
                let first = solve(points[batch[0]]);
                std::iter::once(first)
                    .chain(others.into_iter().map(|h| h.join().expect("a solver thread panicked")))
                    .collect()
            });
            for (&i, answer) in batch.iter().zip(answers) {
                if let Some(a) = &answer {
                    self.solved += 1;
                    self.answers.push((points[i], a.clone()));
                }
                out[i] = Some(answer);
            }
        }
        out.into_iter().flatten().flatten().collect()
    }
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
