//! `revolve`: the Revolve baseline of Rotor's paper.

use pebble_schedule::{Schedule, View};

use super::fastest_fitting;
use crate::remat::revolve::revolve_ops;
use crate::remat::revolve::Opt0Table;
use crate::{Problem, SolveError, SolveOptions, Solver};

/// Revolve on a chain treated as homogeneous: the `Opt_0` schedule with `c` checkpoint
/// slots (`m = c + 2` slots of Ch. 1: the `c` checkpoints, `a_0` among them, plus the
/// current forward value and the current gradient), checkpoints kept with `F_ck`, other
/// advances `F_∅`, and `F_i all` inserted right before each `B_i`. Every `c` in `1..=L`
/// is simulated (`c = 1` is recompute-all, `c = L` checkpoints every activation); the
/// fastest that fits wins (ties: the lower peak, then the larger `c`).
pub struct Revolve;

/// The Revolve schedule with `c ≥ 1` checkpoint slots on an `l`-stage chain.
pub fn revolve_schedule(table: &Opt0Table, l: usize, c: usize) -> Schedule {
    let seq = table.sequence(l, c + 2).expect("Opt_0 is feasible with at least 3 slots");
    Schedule::new(View::Chain, revolve_ops(l, &seq))
}

impl Solver for Revolve {
    fn name(&self) -> &'static str {
        "revolve"
    }

    fn description(&self) -> &'static str {
        "Revolve (binomial checkpointing) on the chain taken as homogeneous, with F_all inserted before each backward"
    }

    fn solve(&self, problem: Problem<'_>, budget: u64, options: &SolveOptions) -> Result<Schedule, SolveError> {
        let chain = problem.chain_for(self.name())?;
        let l = chain.len();
        // The schedules minimize the forward count, whatever the (positive) unit costs.
        let table = Opt0Table::new(l, l + 2, 1.0, 1.0);
        let candidates = (1..=l).rev().map(|c| revolve_schedule(&table, l, c));
        fastest_fitting(problem, budget, options, "revolve", candidates)
    }
}

inventory::submit!(crate::Registration(&Revolve));
