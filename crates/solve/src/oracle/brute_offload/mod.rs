//! `brute_offload`: exhaustive search over Shilova's Table 2.1 operations plus whole-tensor
//! offloads and prefetches, the test oracle of the offloading solvers (`pofo`,
//! `offload-dp`).
//!
//! Unlike [`crate::oracle::brute`], the cost of a schedule is not a sum of op durations: transfers
//! overlap compute and the device waits for memory (O.3). Every candidate is therefore
//! scored by the simulator itself ([`pebble_sim::simulate_chain`] under the budget, on the
//! machine's links, with the default whole-transfer memory model O.7), and the answer is
//! the least simulated makespan over the space below.
//!
//! # The space
//!
//! A schedule is a *compute sequence* with transfers interleaved.
//!
//! * **Compute sequences** are the paths of [`crate::oracle::brute`]'s state graph from `{a_0}` to
//!   `δ_0`: `F_i^ck`, `F_i^∅`, `F_i^all` for `i < f` (`f` the backward frontier) when `a_i`
//!   is available, the loss, `B_{f−1}`; no op produces a tensor that is still held, on the
//!   device or on the host. Memory does not restrict the moves (offloading may make room)
//!   beyond what can never leave the device: an op whose static bytes, `δ_f`, reads,
//!   outputs and temporary memory exceed the budget is not taken. One restriction: **no
//!   dead outputs**, every tensor a forward produces is read by a later compute op before
//!   it is released (an unread output only costs time and memory, but for an `F^∅` run
//!   to drop its input, which `brute` allows and this space does not). The state graph is
//!   acyclic and finite, so each stage's forward runs a bounded number of times, and
//!   chains have at most [`MAX_STAGES`] stages.
//! * **Transfers**: each *instance* of `Activation(i)` or `Saved(i)` (`a_0` from the
//!   start, any other from the op that produces it to the op that releases it, its last
//!   reader) of nonzero size may be offloaded **once, whole** (`fraction` 1), issued
//!   **right after its producer** (before the first compute op for `a_0`), and is then
//!   prefetched **once, whole**, before any compute op after the offload's up to and
//!   including its last reader. Compute ops between the offload and the prefetch read
//!   the device copy, which the simulator keeps until they end. In one gap between two
//!   compute ops the offload comes first, then the prefetches **in every order**.
//!   Gradients never move (nor do they in pofo's model).
//!
//! The d2h link serves offloads in program order; for a given order, issuing one earlier
//! only makes its transfer start, end and release memory no later (the readers in between
//! hold the copy either way). So the space issues each offload right after its producer,
//! and the link serves them in production order. Rotor's schedules (no transfer) and
//! pofo's, offload-dp's and offload-greedy's (the offload of a stage's input just before
//! the stage, prefetches placed by [`crate::offload::transfer_schedule`]) lie in this
//! space; [`in_space`] checks a schedule, and the tests check theirs on every instance.
//!
//! # The search
//!
//! Compute sequences come out of a best-first enumeration of the paths, in increasing
//! order of a lower bound on the makespan of every schedule built on them; the search stops
//! when that bound reaches the best makespan simulated. The bound is the largest of
//!
//! * the compute time so far and still to come (every backward, and `F_i^all` for each
//!   `ā_{i+1}` not held);
//! * the transfer bound of each op `k` so far: if its memory exceeds the budget by `Q_k`,
//!   whole tensors it holds and does not read, `Q̂_k ≥ Q_k` bytes in all (the least sum of
//!   their sizes that covers `Q_k`), left the device before `k` started and come back
//!   after, so the makespan is at least `max(P_k, Q̂_k/β↓) + max(S_k, Q̂_k/β↑)`, `P_k` and
//!   `S_k` the compute times before and from `k`;
//! * the same for the ops to come: for each level `q`, the least compute time from the
//!   state to the end with no op's `Q̂` above `q` (Dijkstra backwards over the states).
//!
//! For each compute sequence a depth-first search over the gaps between compute ops
//! chooses the offloads and prefetches. A branch is cut when
//!
//! * an op's memory, counting only what is surely on the device when it starts, exceeds
//!   the budget (now, or for an op to come with everything that may leave gone);
//! * a lower bound on the makespan reaches the best: the simulator's timeline without its
//!   waits for memory (which only delay), with the starts that an op's excess (covered by
//!   offloads that have ended) and a prefetch's lack of room (it cannot start before an op
//!   that would then exceed the budget ends) force, now and for the ops to come;
//! * the simulator finds the schedule so far over the budget before its last compute op
//!   ends (the ops that follow only allocate later, and only hold memory longer).
//!
//! Every complete candidate that survives is simulated under the budget. The cuts discard
//! only candidates over the budget or no faster than the best found (to a relative 1e-12);
//! a test checks that the search finds the same optimum without them.
//!
//! # Cost
//!
//! Exact, hence exponential: milliseconds on chains of 2 or 3 stages; on 4 stages up to a
//! few seconds, and up to a minute where no schedule of Table 2.1 alone fits (offloading
//! is needed, and the optimum is well above the compute time). [`Search::max_simulations`]
//! and [`Search::max_nodes`] bound it (`TooLarge`).

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use pebble_graph::Chain;
use pebble_machine::Machine;
use pebble_schedule::{Op, Schedule, View};

use crate::oracle::brute::Cost;
use crate::SolveError;
use future::Future;
use layout::Layout;
use sequences::{sequence, Ctx, Node};
use transfers::Plan;

mod future;
mod layout;
mod scoring;
mod sequences;
mod transfers;

/// The largest chain [`brute_offload`] accepts.
pub const MAX_STAGES: usize = 4;

/// Partial compute sequences the enumeration may hold before it gives up (`TooLarge`),
/// unless [`Search::max_nodes`] says fewer.
pub const MAX_NODES: usize = 4_000_000;

/// What the search did, beside its answer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Compute sequences whose transfers were searched.
    pub sequences: usize,
    /// Complete schedules simulated.
    pub simulated: usize,
    /// Of which the simulator accepted.
    pub accepted: usize,
    /// Prefixes simulated (to cut a branch over the budget early).
    pub prefixes: usize,
    /// Partial compute sequences enumerated.
    pub nodes: usize,
}

/// The optimum of the space (see the module docs).
#[derive(Debug, Clone)]
pub struct Found {
    /// The least simulated makespan.
    pub makespan: f64,
    /// A schedule that achieves it.
    pub schedule: Schedule,
    /// What the search did.
    pub stats: Stats,
}

/// How [`search`] searches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Search {
    /// Whether forwards may run in the modes that recompute (`F^ck`, `F^∅`); without, the
    /// only compute sequence is keep-all's, and the space is offloading alone (Part II,
    /// Ch. 3, where Proposition 3's bound holds).
    pub recompute: bool,
    /// Whether to cut branches by the bounds of the module docs; without, every candidate
    /// whose compute time is below the best found is simulated (to test the cuts).
    pub cuts: bool,
    /// The most schedules and prefixes to simulate before giving up (`TooLarge`).
    pub max_simulations: usize,
    /// The most partial compute sequences to enumerate before giving up (`TooLarge`);
    /// at most [`MAX_NODES`].
    pub max_nodes: usize,
}

impl Default for Search {
    fn default() -> Self {
        Search { recompute: true, cuts: true, max_simulations: 50_000_000, max_nodes: MAX_NODES }
    }
}

/// The least simulated makespan of `chain` within `budget` on `machine` over the space of
/// the module docs, with a schedule that achieves it.
pub fn brute_offload(chain: &Chain, budget: u64, machine: &Machine) -> Result<(f64, Schedule), SolveError> {
    search(chain, budget, machine, Search::default()).map(|f| (f.makespan, f.schedule))
}

/// [`brute_offload`] as `how` says, with its statistics.
pub fn search(chain: &Chain, budget: u64, machine: &Machine, how: Search) -> Result<Found, SolveError> {
    let cuts = how.cuts;
    let max_nodes = how.max_nodes.min(MAX_NODES);
    let l = chain.len();
    if l > MAX_STAGES {
        return Err(SolveError::TooLarge {
            solver: "brute-offload",
            why: format!("{l} stages; the exhaustive search takes at most {MAX_STAGES}"),
        });
    }
    let ctx = Ctx::new(chain, budget, machine, how);
    if chain.static_bytes.saturating_add(chain.x[0]) > budget {
        return Err(SolveError::Infeasible { budget, reason: "static memory and a_0 alone exceed it".into() });
    }
    let mut best = Best { makespan: f64::INFINITY, ops: None, simulations: 0, limit: how.max_simulations };
    let mut stats = Stats::default();
    let mut arena: Vec<Node> = Vec::new();
    let mut heap = BinaryHeap::new();
    let root = Node {
        parent: u32::MAX,
        op: Op::Backward { stage: usize::MAX },
        act: 1,
        sav: 0,
        unread_act: 0,
        unread_sav: 0,
        f: l + 1,
        g: 0.0,
        m1: 0.0,
        m2: 0.0,
    };
    arena.push(root);
    let future = Future::new(&ctx, &root);
    heap.push(Reverse((Cost(ctx.priority(&root, cuts)), 0u32)));
    let mut moves = Vec::new();
    while let Some(Reverse((Cost(p), id))) = heap.pop() {
        if no_better(p, best.makespan) {
            break;
        }
        let node = arena[id as usize];
        if node.f == 0 {
            let ops = sequence(&arena, id);
            stats.sequences += 1;
            let mut plan = Plan::new(&ctx, &ops, cuts, &mut best);
            plan.run(p);
            stats.simulated += plan.simulated;
            stats.accepted += plan.accepted;
            stats.prefixes += plan.prefixes;
            if best.simulations > best.limit {
                return Err(SolveError::TooLarge {
                    solver: "brute-offload",
                    why: format!("more than {} simulations", best.limit),
                });
            }
            continue;
        }
        moves.clear();
        ctx.moves(&node, &mut moves);
        for &(op, next, _) in &moves {
            if arena.len() >= max_nodes {
                return Err(SolveError::TooLarge {
                    solver: "brute-offload",
                    why: format!("more than {max_nodes} partial compute sequences"),
                });
            }
            let next = Node { parent: id, op, ..next };
            let p = ctx.priority(&next, cuts).max(if cuts { future.bound(&ctx, &next) } else { 0.0 });
            if p == f64::INFINITY {
                continue;
            }
            arena.push(next);
            heap.push(Reverse((Cost(p), (arena.len() - 1) as u32)));
        }
    }
    stats.nodes = arena.len();
    match best.ops {
        Some(ops) => Ok(Found { makespan: best.makespan, schedule: Schedule::new(View::Chain, ops), stats }),
        None => Err(SolveError::Infeasible {
            budget,
            reason: "no schedule of Table 2.1's operations with whole offloads and prefetches fits (exhaustive \
                     search)"
                .into(),
        }),
    }
}

/// Whether a candidate whose makespan is at least `lb` cannot beat `best`: ties are cut,
/// and so is a gain below a relative 1e-12 (the bounds sum times in another order than the
/// simulator), so the answer is optimal to that precision.
fn no_better(lb: f64, best: f64) -> bool {
    lb >= best * (1.0 - 1e-12)
}

/// The best candidate so far, and the count of simulations against their limit.
struct Best {
    makespan: f64,
    ops: Option<Vec<Op>>,
    /// Schedules and prefixes simulated, and the most allowed.
    simulations: usize,
    limit: usize,
}

/// Whether `schedule` lies in the search space of the module docs (the budget aside);
/// `Err` says why not.
pub fn in_space(chain: &Chain, schedule: &Schedule) -> Result<(), String> {
    if schedule.view != View::Chain {
        return Err("not a chain schedule".into());
    }
    let compute: Vec<Op> = schedule.ops.iter().copied().filter(Op::is_compute).collect();
    let lay = Layout::new(chain, &compute)?;
    let m = lay.insts.len();
    let mut off = vec![false; m];
    let mut pre = vec![false; m];
    let mut k = 0;
    let mut prefetched_here = false;
    for op in &schedule.ops {
        match *op {
            Op::Offload { tensor, fraction } => {
                let j = lay.gap_offload[k].filter(|&j| lay.insts[j].tensor == tensor).ok_or_else(|| {
                    format!("offload of {tensor:?} before compute op {k}: not right after its producer")
                })?;
                let inst = &lay.insts[j];
                if fraction != 1.0 || inst.size == 0 || inst.last_reader() <= inst.off_gap || prefetched_here || off[j]
                {
                    return Err(format!("offload of {tensor:?} before compute op {k} is not one of the space"));
                }
                off[j] = true;
            }
            Op::Prefetch { tensor, fraction } => {
                let j = (0..m)
                    .find(|&j| off[j] && !pre[j] && lay.insts[j].tensor == tensor && lay.insts[j].off_gap < k)
                    .ok_or_else(|| format!("prefetch of {tensor:?} before compute op {k}: nothing to prefetch"))?;
                if fraction != 1.0 || k > lay.insts[j].last_reader() {
                    return Err(format!("prefetch of {tensor:?} before compute op {k} is not one of the space"));
                }
                pre[j] = true;
                prefetched_here = true;
            }
            Op::Free { .. } | Op::Compute { .. } => return Err(format!("{op} is not an op of the space")),
            _ => {
                k += 1;
                prefetched_here = false;
            }
        }
    }
    match (0..m).find(|&j| off[j] && !pre[j]) {
        Some(j) => Err(format!("{:?} is offloaded and never prefetched", lay.insts[j].tensor)),
        None => Ok(()),
    }
}
