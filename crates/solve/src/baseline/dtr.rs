//! The run-time policies replayed offline on the training graph, as solvers:
//! [`policy::replay`](crate::policy::replay) runs the program in its eager order and
//! writes down what the policy did, so the result is an ordinary graph schedule that the
//! simulator scores like any other.
//!
//! * `dtr`: Dynamic Tensor Rematerialization (Kirisame et al., ICLR 2021), eviction only.
//! * `delta`, `lru`, `largest`: DELTA (evict or offload, early start, prefetcher) and its
//!   filter ablations, on the machine's host→device link.

use pebble_graph::TrainingGraph;
use pebble_schedule::{Schedule, View};

use crate::policy;
use crate::policy::replay::replay;
use crate::{Problem, SolveError, SolveOptions, Solver};

/// A run-time policy, replayed offline.
pub struct Replayed(&'static str);

impl Solver for Replayed {
    fn name(&self) -> &'static str {
        self.0
    }

    fn description(&self) -> &'static str {
        // The policy's own words; the link speed does not change them.
        policy::policy(self.0, 1.0).expect("a known policy").description()
    }

    fn views(&self) -> &'static [View] {
        &[View::Graph]
    }

    fn solve(&self, problem: Problem<'_>, budget: u64, options: &SolveOptions) -> Result<Schedule, SolveError> {
        let g = super::valid_graph(problem, self.0)?;
        let policy = policy::policy(self.0, options.machine.d2h.bandwidth).expect("a known policy");
        Ok(replay(g, budget, policy.as_ref())?.schedule)
    }
}

inventory::submit!(crate::Registration(&Replayed("dtr")));
inventory::submit!(crate::Registration(&Replayed("dtr-eq")));
inventory::submit!(crate::Registration(&Replayed("delta")));
inventory::submit!(crate::Registration(&Replayed("lru")));
inventory::submit!(crate::Registration(&Replayed("largest")));

/// DTR's schedule for `g` under `budget`, or `Infeasible` when eviction cannot make room.
pub fn dtr_schedule(g: &TrainingGraph, budget: u64) -> Result<Schedule, SolveError> {
    Ok(replay(g, budget, &policy::Dtr)?.schedule)
}
