//! `multichain`: optimal rematerialization of K chains joined at the loss (Shilova,
//! Ch. 1, MULTI-b and Theorem 3), on the graph view.
//!
//! # The model (Shilova §1.1, Table 1.1)
//!
//! K branches of lengths `L = (L_1, …, L_K)`: `F_i^{(k)}(a_{i-1}) = a_i`,
//! `B_i^{(k)}(a_{i-1}, δ_i) = δ_{i-1}`, and one `Loss(a_{L_1}^{(1)}, …, a_{L_K}^{(K)}) =
//! (δ_{L_1}^{(1)}, …, δ_{L_K}^{(K)})`. Every value takes one of `m` slots; `F` and `Loss`
//! replace their inputs in place, `S_i` replicates `a_i` (a checkpoint), `B` consumes
//! its inputs, `D_i` / `D̄` discard `a_i` / `δ_0`; an op's working memory is outside the
//! slots (the thesis's "special buffer"). Costs `u_F`, `u_B`, `u_L`. The start state is
//! `{a_0^{(k)}}` and the end state `{δ_0^{(k)} : b_k = 1}`: `b_k` says whether chain `k`'s
//! last gradient must be kept (MULTI-δ is `b = 1⃗`, MULTI-∅ is `b = 0⃗`; inside the DP a
//! chain that was cut gets `b_k = 1`, since its `δ` feeds the rest of the chain).
//!
//! # What is here
//!
//! * [`m_min`] (Lemma 2), [`MultiChainDp`] (Theorem 3, memoized on the sorted `(L_k,
//!   b_k)` pairs and `m`, with its argmin and the reconstruction of an optimal canonical
//!   schedule as [`KOp`]s), and [`replay`], an independent checker of Table 1.1
//!   sequences.
//! * [`kjoin_graph`]: the K-join as a [`TrainingGraph`](pebble_graph::TrainingGraph),
//!   and [`KJoin`]: the detection of a K-join in any graph and the lowering of [`KOp`]s
//!   to graph ops (`Compute` + `Free`).
//! * The solver `multichain`.
//!
//! # The graph and the thesis's memory count
//!
//! The simulator charges a compute node its outputs while its inputs are still resident,
//! whereas the thesis's `F`, `B` and `Loss` work in place with the working memory outside
//! the slots. So a plain graph (one node per op, [`KJoinLayout::Plain`]) cannot show the
//! thesis's count: its peak is [`Replay::plain_peak`], the thesis's peak plus the values
//! an op creates around an in-place op (`+1` for `F`, `B`; `+K` at the loss with `K`
//! gradients). [`KJoinLayout::Staged`] reproduces the count exactly: each op writes a
//! zero-size staging tensor (the special buffer) and a zero-time node moves it into its
//! one-unit slot after the lowering has freed the consumed inputs. On a staged graph the
//! simulated peak equals [`Replay::peak`] and the simulated makespan equals `Opt_bm`, for
//! every schedule the DP produces (tested exhaustively on small instances).
//!
//! # The solver on other graphs
//!
//! [`KJoin::detect`] accepts graphs whose forward nodes form K disjoint chains from K
//! inputs (one value per layer; parameters allowed) into a head: the loss and any forward
//! nodes that join two or more branches before it (the Siamese model's concatenation and
//! classifier). The head runs as the thesis's `Loss`, with autograd's store-all inside.
//! Inputs read only by the head (labels) are chains of length 0. `b_k` is whether the
//! graph computes the gradient of chain `k`'s input. Anything else (a fork or a skip
//! connection inside a branch, a branch read twice) is `NotApplicable`; use
//! [`KJoin::detect`] for the reason.
//!
//! Sizes and times are made homogeneous: a slot stands for the largest value of any
//! branch (input, activation or gradient), and `u_F`, `u_B`, `u_L` are the mean layer
//! times and the head's time (the DP's choices depend on the counts of operations only,
//! so the costs only scale its value). Real backward nodes may read their layer's output
//! or saved tensors, which the model does not store: either such a layer's forward runs
//! again, with grad, right before its backward, or (`keep_saved`, see
//! [`KJoin::lower_with`]) its last forward before the backward runs with grad and what the
//! backward reads stays. A slot count says little about real memory (saved tensors,
//! temporary memory, values smaller than the slot, the head's store-all), so the solver
//! does not derive `m` from `budget / slot`: it simulates the lowered schedules for every
//! `m` in `[m_min, Σ (L_k + 1)]` (at most 96 values, evenly spread) and both lowerings,
//! and returns the fastest that fits the budget; `Infeasible` when none does. On a
//! [`kjoin_graph`] both lowerings coincide, and on a staged one the result is a schedule
//! of time `Opt_bm(L, budget, b)` (the simulated peak is the thesis's count there). `Slots` in the options is not
//! used: the DP is in slots already.

mod dp;
mod graph;
#[cfg(test)]
mod tests;

pub use dp::{lower_bound, m_min, opt_bm, replay, Costs, KOp, MultiChainDp, Replay};
pub use graph::{kjoin_graph, JoinChain, KJoin, KJoinLayout};

use pebble_graph::DataKind;
use pebble_schedule::{Schedule, View};
use pebble_sim::SimConfig;

use crate::{Problem, SolveError, SolveOptions, Solver};

/// The `multichain` solver (see the module docs).
pub struct MultiChain;

/// The most DP states the solver agrees to explore (`Π (L_k + 1) · 2^K · m`, roughly).
const MAX_STATES: f64 = 5e6;

/// The most slot counts the solver simulates (each with both lowerings).
const MAX_TRIES: usize = 96;

impl Solver for MultiChain {
    fn name(&self) -> &'static str {
        "multichain"
    }

    fn description(&self) -> &'static str {
        "Shilova's multi-chain DP (Theorem 3): K branches joined at the loss, homogeneous slots"
    }

    fn views(&self) -> &'static [View] {
        &[View::Graph]
    }

    fn solve(&self, problem: Problem<'_>, budget: u64, options: &SolveOptions) -> Result<Schedule, SolveError> {
        let g = problem.graph_for("multichain")?;
        let kj = KJoin::detect(g).map_err(|_| SolveError::NotApplicable { solver: "multichain", view: View::Graph })?;
        let lengths = kj.lengths();
        let b = kj.b();
        let states: f64 = lengths.iter().map(|&l| (l + 1) as f64).product::<f64>()
            * 2f64.powi(lengths.len() as i32)
            * (lengths.iter().map(|&l| l + 1).sum::<usize>() as f64);
        if states > MAX_STATES {
            return Err(SolveError::TooLarge {
                solver: "multichain",
                why: format!(
                    "branches of lengths {lengths:?} give about {states:.0} DP states (limit {MAX_STATES:.0})"
                ),
            });
        }
        let slot = kj.slot_size(g);
        let roots: Vec<usize> = kj.chains.iter().map(|c| c.acts[0]).collect();
        let fixed: u64 = g.static_bytes()
            + g.data
                .iter()
                .enumerate()
                .filter(|(d, n)| n.kind == DataKind::Input && !roots.contains(d))
                .map(|(_, n)| n.size)
                .sum::<u64>();
        let mmin = m_min(&lengths, &b);
        let describe = || {
            format!(
                "{}-join with L = {lengths:?}, b = {:?}, slot {slot} bytes",
                lengths.len(),
                b.iter().map(|&x| u8::from(x)).collect::<Vec<_>>()
            )
        };
        if budget < fixed {
            return Err(SolveError::Infeasible {
                budget,
                reason: format!("{}: static memory and other inputs take {fixed} bytes", describe()),
            });
        }
        let sat = mmin.max(lengths.iter().map(|&l| l + 1).sum());
        let mut dp = MultiChainDp::new(kj.costs(g));
        let config = SimConfig { budget: Some(budget), ..options.sim_config() };
        let mut last_err = String::new();
        let mut attempt = |m: usize, keep_saved: bool| -> Option<(Schedule, f64)> {
            let ops = dp.schedule(&lengths, m, &b)?;
            let schedule = match kj.lower_with(g, &ops, keep_saved) {
                Ok(o) => Schedule::new(View::Graph, o),
                Err(e) => {
                    last_err = format!("m = {m}: {e}");
                    return None;
                }
            };
            match pebble_sim::simulate_graph(g, &schedule, &config) {
                Ok(r) => Some((schedule, r.makespan)),
                Err(e) => {
                    last_err = format!("m = {m}: {e}");
                    None
                }
            }
        };
        // The fit is far from monotone in m on real graphs (which values the DP keeps
        // matters more than how many), so scan m over [m_min, Σ(L_k+1)] (at most
        // MAX_TRIES values, evenly spread), both lowerings, and keep the fastest fitting
        // schedule (the larger m on ties).
        let span = sat - mmin;
        let tries: Vec<usize> = if span < MAX_TRIES {
            (mmin..=sat).rev().collect()
        } else {
            let mut v: Vec<usize> = (0..MAX_TRIES).map(|j| sat - j * span / (MAX_TRIES - 1)).collect();
            v.dedup();
            v
        };
        let mut best: Option<(Schedule, f64)> = None;
        for m in tries {
            for keep_saved in [false, true] {
                if let Some(found) = attempt(m, keep_saved) {
                    if best.as_ref().is_none_or(|(_, t)| found.1 < *t) {
                        best = Some(found);
                    }
                }
            }
        }
        best.map(|(s, _)| s).ok_or_else(|| SolveError::Infeasible {
            budget,
            reason: format!("{}: no DP schedule with m_min = {mmin} ≤ m ≤ {sat} fits ({last_err})", describe()),
        })
    }
}

inventory::submit!(crate::Registration(&MultiChain));
