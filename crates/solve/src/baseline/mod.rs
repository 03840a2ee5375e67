//! The baseline solvers: what PyTorch and the literature before Rotor do.
//!
//! * [`store_all`]: plain autograd (`store-all`), on chains and graphs;
//! * [`sequential`]: PyTorch's `checkpoint_sequential` with the best segment count;
//! * [`chen`]: Chen et al.'s √L equal segments (`chen-sqrt`);
//! * [`recompute_all`]: keep only `a_0`, recompute everything before each backward;
//! * [`revolve`]: Revolve's homogeneous schedule with `F_all` before each backward.
//!
//! Chain schedules follow Shilova's Table 2.1 with 0-based stages (see
//! [`pebble_schedule::ForwardMode`]); no chain baseline emits `Free` ops, since the
//! forward modes and the backwards release what they consume. The builders of the op
//! sequences are public so that tests and other solvers can reuse them; the solvers
//! judge memory only through the simulator.

pub mod chen;
pub mod dtr;
pub mod knapsack;
pub mod mincut;
pub mod paged_adam;
mod partitioner;
pub mod recompute_all;
pub mod revolve;
pub mod sequential;
pub mod store_all;
pub mod zero;

#[cfg(test)]
mod solver_tests;

use pebble_schedule::{ForwardMode, Op, Schedule};
use pebble_sim::{SimError, SimReport};

use crate::{Prepared, Problem, SolveError, SolveOptions};

/// The graph of `problem`, checked: the baselines and policies index it freely, so an
/// invalid graph (an id out of range, a tensor with no producer) is refused here, with the
/// reason, rather than panicking (`conformance.rs`,
/// `every_graph_solver_refuses_an_invalid_graph_without_panicking`).
pub(crate) fn valid_graph<'a>(
    problem: Problem<'a>,
    solver: &'static str,
) -> Result<&'a pebble_graph::TrainingGraph, SolveError> {
    let g = problem.graph_for(solver)?;
    g.validate().map_err(|e| SolveError::Unsupported { solver, why: format!("invalid training graph: {e}") })?;
    Ok(g)
}

pub(crate) fn fwd(stage: usize, mode: ForwardMode) -> Op {
    Op::Forward { stage, mode }
}

pub(crate) fn bwd(stage: usize) -> Op {
    Op::Backward { stage }
}

/// Simulates with no budget, to learn a schedule's peak and makespan.
pub(crate) fn simulate_unbounded(
    problem: Problem<'_>,
    schedule: &Schedule,
    options: &SolveOptions,
) -> Result<SimReport, SimError> {
    let config = options.sim_config();
    crate::simulate(problem, schedule, &config)
}

/// Whether two makespans are equal up to rounding.
pub(crate) fn same_time(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1e-300)
}

/// A fixed policy's candidate schedules, each simulated once without a budget (its
/// makespan and peak, or the simulator's rejection); [`Candidates::pick`] (and so
/// [`Prepared::solve`]) then chooses at any budget: the fastest that fits (ties: the lower
/// peak, then the earlier candidate). If none fits, [`SolveError::Infeasible`] whose
/// reason reads "`solver` needs at least `P` bytes …", `P` the lowest peak, the minimum
/// budget; a candidate the simulator rejects (a solver bug) is returned as is when nothing
/// fits, so that [`crate::plan`] reports it.
pub struct Candidates {
    solver: &'static str,
    scored: Vec<(Schedule, Option<(f64, u64)>)>,
}

impl Candidates {
    /// Simulates each of `schedules` on `problem` (no budget).
    pub fn score(
        solver: &'static str,
        problem: Problem<'_>,
        options: &SolveOptions,
        schedules: impl IntoIterator<Item = Schedule>,
    ) -> Candidates {
        let scored = schedules
            .into_iter()
            .map(|s| {
                let score = simulate_unbounded(problem, &s, options).ok().map(|r| (r.makespan, r.peak_bytes));
                (s, score)
            })
            .collect();
        Candidates { solver, scored }
    }

    /// The lowest simulated peak among the candidates: the least budget at which one fits.
    pub fn min_budget(&self) -> Option<u64> {
        self.scored.iter().filter_map(|(_, s)| s.map(|(_, p)| p)).min()
    }

    /// The fastest candidate within `budget` (see the type's docs).
    pub fn pick(&self, budget: u64) -> Result<&Schedule, SolveError> {
        let mut best: Option<(&Schedule, f64, u64)> = None;
        for (s, score) in &self.scored {
            let Some((t, p)) = *score else { continue };
            if p > budget {
                continue;
            }
            let better = match best {
                None => true,
                Some((_, bt, bp)) => {
                    if same_time(t, bt) {
                        p < bp
                    } else {
                        t < bt
                    }
                }
            };
            if better {
                best = Some((s, t, p));
            }
        }
        if let Some((s, _, _)) = best {
            return Ok(s);
        }
        if let Some((s, _)) = self.scored.iter().find(|(_, score)| score.is_none()) {
            return Ok(s);
        }
        let reason = match (self.min_budget(), self.scored.len()) {
            (Some(p), 1) => format!("{} needs at least {p} bytes", self.solver),
            (Some(p), n) => {
                format!("{} needs at least {p} bytes (the lowest peak among its {n} schedules)", self.solver)
            }
            (None, _) => format!("{} has no schedule for this problem", self.solver),
        };
        Err(SolveError::Infeasible { budget, reason })
    }
}

impl Prepared for Candidates {
    fn solver(&self) -> &'static str {
        self.solver
    }

    fn solve(&self, budget: u64) -> Result<Schedule, SolveError> {
        self.pick(budget).cloned()
    }
}

/// Among `candidates`, the fastest whose simulated peak fits `budget`: [`Candidates`]
/// scored and picked at once.
pub(crate) fn fastest_fitting(
    problem: Problem<'_>,
    budget: u64,
    options: &SolveOptions,
    solver: &'static str,
    candidates: impl IntoIterator<Item = Schedule>,
) -> Result<Schedule, SolveError> {
    let scored = Candidates::score(solver, problem, options, candidates);
    scored.pick(budget).cloned()
}

/// Plain autograd on a chain (the schedule crate's, which the DPs start from too).
pub use pebble_schedule::store_all_ops;

/// The first stages of PyTorch's `checkpoint_sequential` segments: `k` segments of
/// `L / k` stages, the last one taking the rest. Panics unless `1 ≤ k ≤ L`.
pub fn pytorch_segments(l: usize, k: usize) -> Vec<usize> {
    assert!((1..=l).contains(&k), "checkpoint_sequential needs 1 ≤ k ≤ L (k = {k}, L = {l})");
    let size = l / k;
    (0..k).map(|j| j * size).collect()
}

/// A segmented (single-recomputation) schedule: `starts` are the first stages of the
/// segments, increasing, beginning with 0.
///
/// Forward: every segment but the last runs `F_ck` on its first stage and `F_∅` on the
/// rest; the last segment runs `F_all`. Then the loss and the last segment's backwards.
/// Then, for each earlier segment from the end, `F_all` over its stages (its first
/// stage's input is the stored checkpoint) followed by its backwards in reverse.
pub fn segmented_ops(l: usize, starts: &[usize]) -> Vec<Op> {
    assert!(!starts.is_empty() && starts[0] == 0, "segments must start at stage 0");
    assert!(starts.windows(2).all(|w| w[0] < w[1]) && *starts.last().unwrap() < l, "bad segment starts {starts:?}");
    let k = starts.len();
    let segs: Vec<(usize, usize)> =
        starts.iter().enumerate().map(|(j, &s)| (s, if j + 1 < k { starts[j + 1] } else { l })).collect();
    let (last, earlier) = segs.split_last().expect("at least one segment");
    let mut ops = Vec::new();
    for &(s, e) in earlier {
        ops.push(fwd(s, ForwardMode::Checkpoint));
        ops.extend((s + 1..e).map(|i| fwd(i, ForwardMode::Discard)));
    }
    ops.extend((last.0..l).map(|i| fwd(i, ForwardMode::KeepAll)));
    ops.extend((last.0..=l).rev().map(bwd));
    for &(s, e) in earlier.iter().rev() {
        ops.extend((s..e).map(|i| fwd(i, ForwardMode::KeepAll)));
        ops.extend((s..e).rev().map(bwd));
    }
    ops
}

/// PyTorch's `checkpoint_sequential(k)` on `L` stages.
pub fn sequential_ops(l: usize, k: usize) -> Vec<Op> {
    segmented_ops(l, &pytorch_segments(l, k))
}

/// Keep only `a_0`: `F0ck F1none … F(L−1)none`, the loss, then for `i = L−1 … 0`
/// recompute `F0ck F1none … F(i−1)none`, run `F_i all` and `B_i` (for `i = 0`, just
/// `F0all B0`).
pub fn recompute_all_ops(l: usize) -> Vec<Op> {
    let mut ops = Vec::new();
    let advance = |ops: &mut Vec<Op>, upto: usize| {
        for j in 0..upto {
            ops.push(fwd(j, if j == 0 { ForwardMode::Checkpoint } else { ForwardMode::Discard }));
        }
    };
    advance(&mut ops, l);
    ops.push(bwd(l));
    for i in (0..l).rev() {
        advance(&mut ops, i);
        ops.push(fwd(i, ForwardMode::KeepAll));
        ops.push(bwd(i));
    }
    ops
}

#[cfg(test)]
mod tests {
    use super::*;

    fn notation(ops: Vec<Op>) -> String {
        Schedule::new(pebble_schedule::View::Chain, ops).to_notation()
    }

    #[test]
    fn op_sequences_by_hand() {
        assert_eq!(notation(store_all_ops(3)), "F0all F1all F2all B3 B2 B1 B0");
        assert_eq!(pytorch_segments(4, 2), vec![0, 2]);
        assert_eq!(pytorch_segments(7, 3), vec![0, 2, 4]);
        assert_eq!(pytorch_segments(5, 5), vec![0, 1, 2, 3, 4]);
        assert_eq!(notation(sequential_ops(4, 2)), "F0ck F1none F2all F3all B4 B3 B2 F0all F1all B1 B0");
        assert_eq!(notation(sequential_ops(3, 1)), notation(store_all_ops(3)));
        // Shilova's (2.1), 1-based there: segments {1,2}, {3}, {4}.
        assert_eq!(notation(segmented_ops(4, &[0, 2, 3])), "F0ck F1none F2ck F3all B4 B3 F2all B2 F0all F1all B1 B0");
        assert_eq!(notation(sequential_ops(3, 3)), "F0ck F1ck F2all B3 B2 F1all B1 F0all B0");
        assert_eq!(notation(recompute_all_ops(3)), "F0ck F1none F2none B3 F0ck F1none F2all B2 F0ck F1all B1 F0all B0");
        assert_eq!(notation(recompute_all_ops(1)), "F0ck B1 F0all B0");
    }

    #[test]
    fn revolve_ops_match_shilova_2_2() {
        // (2.2), 1-based there: F1ck F2∅ F3ck F4ck F5all B5 F4all B4 F3all B3 F1ck F2all B2 F1all B1.
        use crate::remat::revolve::RevolveAction::*;
        let seq = [
            Advance { stage: 0, keep_input: true },
            Advance { stage: 1, keep_input: false },
            Advance { stage: 2, keep_input: true },
            Advance { stage: 3, keep_input: true },
            Reverse { stage: 4 },
            Reverse { stage: 3 },
            Reverse { stage: 2 },
            Advance { stage: 0, keep_input: true },
            Reverse { stage: 1 },
            Reverse { stage: 0 },
        ];
        assert_eq!(
            notation(crate::remat::revolve::revolve_ops(4, &seq)),
            "F0ck F1none F2ck F3ck B4 F3all B3 F2all B2 F0ck F1all B1 F0all B0"
        );
        // With three slots Revolve is recompute-all.
        for l in 1..8 {
            let seq = crate::remat::revolve::opt0_sequence(l, 3).unwrap();
            assert_eq!(crate::remat::revolve::revolve_ops(l, &seq), recompute_all_ops(l), "L = {l}");
        }
    }
}
