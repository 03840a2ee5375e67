//! pebble's MILP solvers, solved with HiGHS.
//!
//! The dynamic programs of `pebble-solve` are exact only on chains (or K chains joined at
//! the loss); an integer linear program plans any training graph, at the price of a solve
//! time that grows fast with the graph. This crate holds those ILPs:
//!
//! * [`checkmate`]: the original Checkmate ILP (Jain et al., MLSys 2020, as Zhao's thesis
//!   reproduces it in §2.1.1), solver `checkmate`.
//!
//! Rockmate's and HiRemate's ILPs will join it. They share [`milp`], a thin layer over the
//! `highs` crate: 0/1 terms that are either constants or binary columns, linear
//! expressions with constants, and a solve that honours a time limit and tells an optimal
//! solution from an incumbent found before the limit.
//!
//! Like every solver, these are pure functions of (problem, budget, options) that return a
//! schedule; the simulator scores it. An ILP works in real numbers with tolerances, so each
//! solver simulates its schedule before returning it and tightens its own budget when the
//! simulated peak exceeds the budget (see the architecture invariant on rounding).
//!
//! The solvers register themselves in `pebble-solve`'s registry; a binary that wants them
//! must link this crate (`use pebble_ilp as _;`).
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod checkmate;
pub mod hgraph;
pub mod hiremate;
pub mod hilp;
pub mod milp;
pub mod rockmate;
pub mod sequence;
pub mod subgraph;

use thiserror::Error;

pub use checkmate::Checkmate;
pub use hiremate::Hiremate;
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
