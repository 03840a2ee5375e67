//! `sequential`: PyTorch's `checkpoint_sequential`, with the best segment count.

use pebble_schedule::{Schedule, View};

use super::{fastest_fitting, sequential_ops};
use crate::{Problem, SolveError, SolveOptions, Solver};

/// `checkpoint_sequential(k)` for every `k` in `1..=L` (`k = 1` is store-all); the
/// fastest schedule that fits (ties: the lower peak).
pub struct Sequential;

impl Solver for Sequential {
    fn name(&self) -> &'static str {
        "sequential"
    }

    fn description(&self) -> &'static str {
        "PyTorch's checkpoint_sequential: k equal segments, each recomputed once; the best k that fits"
    }

    fn solve(&self, problem: Problem<'_>, budget: u64, options: &SolveOptions) -> Result<Schedule, SolveError> {
        let l = problem.chain_for(self.name())?.len();
        let candidates = (1..=l).map(|k| Schedule::new(View::Chain, sequential_ops(l, k)));
        fastest_fitting(problem, budget, options, "checkpoint_sequential", candidates)
    }
}

inventory::submit!(crate::Registration(&Sequential));
