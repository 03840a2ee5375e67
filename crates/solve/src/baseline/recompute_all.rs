//! `recompute-all`: keep only `a_0`, recompute from it before every backward.

use pebble_schedule::{Schedule, View};

use super::{fastest_fitting, recompute_all_ops};
use crate::{Problem, SolveError, SolveOptions, Solver};

/// The least-memory baseline: only `a_0` is kept; before each `B_i` the chain is
/// recomputed from `a_0` and `F_i` runs with its graph kept.
pub struct RecomputeAll;

impl Solver for RecomputeAll {
    fn name(&self) -> &'static str {
        "recompute-all"
    }

    fn description(&self) -> &'static str {
        "keep only the input a_0; recompute the chain from it before every backward (quadratic time)"
    }

    fn solve(&self, problem: Problem<'_>, budget: u64, options: &SolveOptions) -> Result<Schedule, SolveError> {
        let l = problem.chain_for(self.name())?.len();
        fastest_fitting(problem, budget, options, "recompute-all", [Schedule::new(View::Chain, recompute_all_ops(l))])
    }
}

inventory::submit!(crate::Registration(&RecomputeAll));
