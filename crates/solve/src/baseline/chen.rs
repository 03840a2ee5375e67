//! `chen-sqrt`: Chen et al.'s √L equal segments.

use pebble_schedule::{Schedule, View};

use super::{fastest_fitting, sequential_ops};
use crate::{Problem, SolveError, SolveOptions, Solver};

/// `checkpoint_sequential` with `k = ⌈√L⌉` segments, whatever the budget.
pub struct ChenSqrt;

/// Chen et al.'s segment count, `⌈√L⌉` (at least 1, at most `L`).
pub fn sqrt_segments(l: usize) -> usize {
    let mut k = (l as f64).sqrt() as usize;
    while k * k < l {
        k += 1;
    }
    while k > 1 && (k - 1) * (k - 1) >= l {
        k -= 1;
    }
    k.clamp(1, l.max(1))
}

impl Solver for ChenSqrt {
    fn name(&self) -> &'static str {
        "chen-sqrt"
    }

    fn description(&self) -> &'static str {
        "Chen et al.: ceil(sqrt(L)) equal segments, each recomputed once, independent of the budget"
    }

    fn solve(&self, problem: Problem<'_>, budget: u64, options: &SolveOptions) -> Result<Schedule, SolveError> {
        let l = problem.chain_for(self.name())?.len();
        let schedule = Schedule::new(View::Chain, sequential_ops(l, sqrt_segments(l)));
        fastest_fitting(problem, budget, options, "chen-sqrt", [schedule])
    }
}

inventory::submit!(crate::Registration(&ChenSqrt));

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ceil_sqrt() {
        let want = [(1, 1), (2, 2), (3, 2), (4, 2), (5, 3), (9, 3), (10, 4), (16, 4), (17, 5), (100, 10), (101, 11)];
        for (l, k) in want {
            assert_eq!(sqrt_segments(l), k, "L = {l}");
        }
    }
}
