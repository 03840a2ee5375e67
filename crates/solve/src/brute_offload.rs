//! `brute_offload`: exhaustive search over Shilova's Table 2.1 operations plus whole-tensor
//! offloads and prefetches, the test oracle of the offloading solvers (`pofo`,
//! `offload-dp`).
//!
//! Unlike [`crate::brute`], the cost of a schedule is not a sum of op durations: transfers
//! overlap compute and the device waits for memory (O.3). Every candidate is therefore
//! scored by the simulator itself ([`pebble_sim::simulate_chain`] under the budget, on the
//! machine's links, with the default whole-transfer memory model O.7), and the answer is
//! the least simulated makespan over the space below.
//!
//! # The space
//!
//! A schedule is a *compute sequence* with transfers interleaved.
//!
//! * **Compute sequences** are the paths of [`crate::brute`]'s state graph from `{a_0}` to
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
//! and a limit on the partial compute sequences bound it (`TooLarge`).

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use pebble_graph::Chain;
use pebble_machine::Machine;
use pebble_schedule::{ForwardMode, Op, Schedule, Tensor, View};
use pebble_sim::{simulate_chain, SimConfig, SimError};

use crate::brute::Cost;
use crate::SolveError;

/// The largest chain [`brute_offload`] accepts.
pub const MAX_STAGES: usize = 4;

/// Partial compute sequences the enumeration may hold before it gives up (`TooLarge`).
const MAX_NODES: usize = 4_000_000;

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
}

impl Default for Search {
    fn default() -> Self {
        Search { recompute: true, cuts: true, max_simulations: 50_000_000 }
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
            if arena.len() >= MAX_NODES {
                return Err(SolveError::TooLarge {
                    solver: "brute-offload",
                    why: format!("more than {MAX_NODES} partial compute sequences"),
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

struct Best {
    makespan: f64,
    ops: Option<Vec<Op>>,
    /// Schedules and prefixes simulated, and the most allowed.
    simulations: usize,
    limit: usize,
}

/// A partial compute sequence: the state after its last op (bit `i` of `act` is
/// `Activation(i)`, of `sav` `Saved(i)`; the `unread` bits, outputs no op has read yet),
/// its compute time `g`, and the two running maxima of the transfer bound
/// (`m1 = max_k (A_k − P_k)`, `m2 = max_k (A_k + B_k)` with `A_k = max(P_k, Q̂_k/β↓)`,
/// `B_k = Q̂_k/β↑`; see the module docs).
#[derive(Clone, Copy)]
struct Node {
    parent: u32,
    op: Op,
    act: u32,
    sav: u32,
    unread_act: u32,
    unread_sav: u32,
    f: usize,
    g: f64,
    m1: f64,
    m2: f64,
}

fn sequence(arena: &[Node], mut id: u32) -> Vec<Op> {
    let mut ops = Vec::new();
    while arena[id as usize].parent != u32::MAX {
        ops.push(arena[id as usize].op);
        id = arena[id as usize].parent;
    }
    ops.reverse();
    ops
}

/// The chain, the budget and the links.
struct Ctx<'a> {
    chain: &'a Chain,
    l: usize,
    budget: u64,
    machine: Machine,
    /// Whether both links can move data at all.
    links: bool,
    recompute: bool,
}

impl<'a> Ctx<'a> {
    fn new(chain: &'a Chain, budget: u64, machine: &Machine, how: Search) -> Ctx<'a> {
        let ok = |b: f64, lat: f64| b > 0.0 && b.is_finite() && lat >= 0.0 && lat.is_finite();
        let links = ok(machine.d2h.bandwidth, machine.d2h.latency) && ok(machine.h2d.bandwidth, machine.h2d.latency);
        Ctx { chain, l: chain.len(), budget, machine: *machine, links, recompute: how.recompute }
    }

    fn off_time(&self, bytes: u64) -> f64 {
        self.machine.d2h.transfer_time(bytes as f64)
    }

    fn pre_time(&self, bytes: u64) -> f64 {
        self.machine.h2d.transfer_time(bytes as f64)
    }

    /// Everything resident in state `n` beside static memory: its activations and saved
    /// sets, and `δ_f`.
    fn resident(&self, n: &Node) -> u64 {
        let c = self.chain;
        let mut total = 0;
        for i in 0..=self.l {
            if n.act >> i & 1 == 1 {
                total += c.x[i];
            }
            if i >= 1 && n.sav >> i & 1 == 1 {
                total += c.xbar[i];
            }
        }
        if n.f <= self.l {
            total += c.x[n.f];
        }
        total
    }

    /// The compute time still needed: every backward to come, and `F_i^all` for each
    /// `B_i` to come whose `ā_{i+1}` is not held.
    fn heuristic(&self, n: &Node) -> f64 {
        let c = self.chain;
        let back: f64 = c.btime[..n.f.min(self.l + 1)].iter().sum();
        let fwd: f64 = (0..n.f.min(self.l)).filter(|&i| n.sav >> (i + 1) & 1 == 0).map(|i| c.ftime[i]).sum();
        back + fwd
    }

    /// A lower bound on the makespan of every schedule whose compute sequence starts
    /// with `n`'s: with `cuts`, the compute time to come and the transfer bound of the
    /// ops so far; without, the compute time alone.
    fn priority(&self, n: &Node, cuts: bool) -> f64 {
        let compute = n.g + self.heuristic(n);
        if cuts {
            (compute + n.m1.max(0.0)).max(n.m2)
        } else {
            compute
        }
    }

    /// The moves from `n`: each op with the state after it (its `parent` unset) and the
    /// bytes `Q̂` its excess needs moved.
    fn moves(&self, n: &Node, out: &mut Vec<(Op, Node, u64)>) {
        let c = self.chain;
        let l = self.l;
        let f = n.f;
        let held = self.resident(n) + c.static_bytes;
        let grad = if f <= l { c.x[f] } else { 0 };
        // The input `a_i`: read from `Activation(i)` (true) or `Saved(i)` (false).
        let input = |i: usize| -> Option<bool> {
            if n.act >> i & 1 == 1 {
                Some(true)
            } else if i >= 1 && n.sav >> i & 1 == 1 {
                Some(false)
            } else {
                None
            }
        };
        // Marks `a_i` read.
        let read = |s: &mut Node, i: usize, from_act: bool| {
            if from_act {
                s.unread_act &= !(1 << i);
            } else {
                s.unread_sav &= !(1 << i);
            }
        };
        let size_of = |act: u32, sav: u32| -> Vec<u64> {
            let mut v = Vec::new();
            for i in 0..=l {
                if act >> i & 1 == 1 {
                    v.push(c.x[i]);
                }
                if i >= 1 && sav >> i & 1 == 1 {
                    v.push(c.xbar[i]);
                }
            }
            v
        };
        // `reads`: the tensors the op reads (bits of `act`, `sav`).
        let mut push = |op: Op, mut s: Node, dt: f64, reads: (u32, u32), allocs: u64, tmp: u64| {
            // What never leaves the device during the op, then what must have left: whole
            // tensors held and not read, at least `q` bytes.
            let pinned: u64 = size_of(reads.0, reads.1).iter().sum();
            if c.static_bytes + grad + pinned + allocs + tmp > self.budget {
                return;
            }
            let full = held + allocs + tmp;
            let q = least_cover(&size_of(n.act & !reads.0, n.sav & !reads.1), full.saturating_sub(self.budget));
            let (a, b) = if q == 0 {
                (n.g, 0.0)
            } else if !self.links {
                return;
            } else {
                (n.g.max(self.off_time(q)), self.pre_time(q))
            };
            s.m1 = n.m1.max(a - n.g);
            s.m2 = n.m2.max(a + b);
            s.g = n.g + dt;
            out.push((op, s, q));
        };
        let mask = |i: usize, from_act: bool| if from_act { (1u32 << i, 0) } else { (0, 1u32 << i) };
        for i in 0..l.min(f) {
            let Some(from_act) = input(i) else { continue };
            let r = mask(i, from_act);
            let mut base = *n;
            read(&mut base, i, from_act);
            if self.recompute && n.act >> (i + 1) & 1 == 0 {
                let mut s = base;
                s.act |= 1 << (i + 1);
                s.unread_act |= 1 << (i + 1);
                push(Op::Forward { stage: i, mode: ForwardMode::Checkpoint }, s, c.ftime[i], r, c.x[i + 1], c.ftmp[i]);
                if from_act {
                    s.act &= !(1 << i);
                }
                push(Op::Forward { stage: i, mode: ForwardMode::Discard }, s, c.ftime[i], r, c.x[i + 1], c.ftmp[i]);
            }
            if n.sav >> (i + 1) & 1 == 0 {
                let mut s = base;
                s.sav |= 1 << (i + 1);
                s.unread_sav |= 1 << (i + 1);
                push(Op::Forward { stage: i, mode: ForwardMode::KeepAll }, s, c.ftime[i], r, c.xbar[i + 1], c.ftmp[i]);
            }
        }
        if f == l + 1 {
            if let Some(from_act) = input(l) {
                let mut s = *n;
                read(&mut s, l, from_act);
                s.act &= !(1 << l);
                s.f = l;
                push(Op::Backward { stage: l }, s, c.btime[l], mask(l, from_act), c.x[l], c.btmp[l]);
            }
        } else if f >= 1 {
            let i = f - 1;
            if let (Some(from_act), true) = (input(i), n.sav >> (i + 1) & 1 == 1) {
                // An `Activation(i+1)` released unread was a dead output.
                if n.unread_act >> (i + 1) & 1 == 0 {
                    let mut s = *n;
                    read(&mut s, i, from_act);
                    s.unread_sav &= !(1 << (i + 1));
                    let gone = !((1u32 << (i + 1)) | (1 << i));
                    s.act &= gone;
                    s.sav &= !(1 << (i + 1));
                    s.unread_act &= gone;
                    s.f = i;
                    // δ_f is counted in `grad`; B_i reads ā_{i+1} and a_i.
                    let (ra, rs) = mask(i, from_act);
                    push(Op::Backward { stage: i }, s, c.btime[i], (ra, rs | 1 << (i + 1)), c.x[i], c.btmp[i]);
                }
            }
        }
        // Nothing may be released unread; at the end nothing is left.
        out.retain(|(_, s, _)| s.f > 0 || (s.act | s.sav) == 0);
    }
}

/// The least sum of some of `sizes` that reaches `q` (`q` itself if none does or `q` is 0):
/// what must move when `q` bytes must leave the device, tensors moving whole.
fn least_cover(sizes: &[u64], q: u64) -> u64 {
    if q == 0 {
        return 0;
    }
    let total: u64 = sizes.iter().sum();
    if total < q {
        return q;
    }
    // Subset sums up to `total`, as a bit set.
    let mut sums = vec![false; total as usize + 1];
    sums[0] = true;
    for &s in sizes {
        for v in (s as usize..=total as usize).rev() {
            if sums[v - s as usize] {
                sums[v] = true;
            }
        }
    }
    (q..=total).find(|&v| sums[v as usize]).unwrap_or(q)
}

/// Lower bounds on the rest of a schedule from each state of the compute-sequence graph
/// (`act`, `sav`, `f`; which tensors are unread dropped, a relaxation): for each level
/// `q`, `h[q][s]` is the least compute time from `s` to the end with no op whose excess
/// needs more than `q` bytes moved (`Q̂`, see the module docs; Dijkstra backwards from the
/// end). A completion whose largest `Q̂` is `Q` takes at least its compute time, and at
/// least `max(g, Q/β↓) + Q/β↑` (the transfer bound at that op).
struct Future {
    index: rustc_hash::FxHashMap<u32, usize>,
    levels: Vec<u64>,
    h: Vec<Vec<f64>>,
}

impl Future {
    fn key(n: &Node) -> u32 {
        n.act | n.sav << 8 | (n.f as u32) << 16
    }

    fn new(ctx: &Ctx<'_>, root: &Node) -> Future {
        let mut index = rustc_hash::FxHashMap::default();
        let mut states = vec![*root];
        index.insert(Self::key(root), 0);
        let mut edges: Vec<(usize, usize, f64, u64)> = Vec::new();
        let mut moves = Vec::new();
        let mut k = 0;
        while k < states.len() {
            let n = states[k];
            moves.clear();
            ctx.moves(&n, &mut moves);
            for &(_, next, q) in &moves {
                let next = Node { unread_act: 0, unread_sav: 0, g: 0.0, m1: 0.0, m2: 0.0, ..next };
                let id = *index.entry(Self::key(&next)).or_insert_with(|| {
                    states.push(next);
                    states.len() - 1
                });
                edges.push((k, id, next.g - n.g, q));
            }
            k += 1;
        }
        // Edge durations: the moves' `g` increments (from a zero start).
        let mut levels: Vec<u64> = edges.iter().map(|e| e.3).collect();
        levels.push(0);
        levels.sort_unstable();
        levels.dedup();
        if levels.len() > 48 {
            let last = *levels.last().unwrap();
            let step = levels.len() as f64 / 47.0;
            let mut thin: Vec<u64> = (0..47).map(|i| levels[(i as f64 * step) as usize]).collect();
            thin.push(last);
            thin.dedup();
            levels = thin;
        }
        let mut into: Vec<Vec<(usize, f64, u64)>> = vec![Vec::new(); states.len()];
        for &(a, b, d, q) in &edges {
            into[b].push((a, d, q));
        }
        let h = levels
            .iter()
            .map(|&level| {
                let mut dist = vec![f64::INFINITY; states.len()];
                let mut heap = BinaryHeap::new();
                for (i, s) in states.iter().enumerate() {
                    if s.f == 0 {
                        dist[i] = 0.0;
                        heap.push(Reverse((Cost(0.0), i)));
                    }
                }
                while let Some(Reverse((Cost(d), b))) = heap.pop() {
                    if d > dist[b] {
                        continue;
                    }
                    for &(a, dt, q) in &into[b] {
                        if q <= level && d + dt < dist[a] {
                            dist[a] = d + dt;
                            heap.push(Reverse((Cost(d + dt), a)));
                        }
                    }
                }
                dist
            })
            .collect();
        Future { index, levels, h }
    }

    /// A lower bound on the makespan of every completion of `n`.
    fn bound(&self, ctx: &Ctx<'_>, n: &Node) -> f64 {
        let Some(&s) = self.index.get(&Self::key(n)) else { return f64::INFINITY };
        let mut lb = f64::INFINITY;
        for i in 0..self.levels.len() {
            let rest = self.h[i][s];
            if rest == f64::INFINITY {
                continue;
            }
            let transfer = if i == 0 {
                0.0
            } else {
                let q = self.levels[i - 1] + 1;
                n.g.max(ctx.off_time(q)) + ctx.pre_time(q)
            };
            lb = lb.min((n.g + rest).max(transfer));
        }
        lb
    }
}

/// One tensor instance of a compute sequence: a tensor from its production to its release.
#[derive(Debug, Clone)]
struct Inst {
    tensor: Tensor,
    size: u64,
    /// The gap its offload is issued in: right after its producer (`a_0`: 0).
    off_gap: usize,
    /// The compute ops that read it, in order.
    readers: Vec<usize>,
}

impl Inst {
    fn last_reader(&self) -> usize {
        self.readers.last().copied().unwrap_or(0)
    }
}

/// A compute sequence's instances, reads and memory, as the simulator sees them.
struct Layout {
    insts: Vec<Inst>,
    /// The instances op `k` reads.
    reads: Vec<Vec<usize>>,
    /// The instance op `k` produces.
    output: Vec<Option<usize>>,
    /// Everything on the device when op `k` allocates, nothing offloaded.
    full: Vec<u64>,
    /// The instance whose offload may be issued in gap `g` (`g = 0..=n`).
    gap_offload: Vec<Option<usize>>,
}

impl Layout {
    /// `Err` says why `ops` is not a compute sequence of the space (see the module docs).
    fn new(chain: &Chain, ops: &[Op]) -> Result<Layout, String> {
        let l = chain.len();
        let mut insts = vec![Inst { tensor: Tensor::Activation(0), size: chain.x[0], off_gap: 0, readers: vec![] }];
        let mut act: Vec<Option<usize>> = vec![None; l + 1];
        let mut sav: Vec<Option<usize>> = vec![None; l + 1];
        act[0] = Some(0);
        let mut grad: Option<usize> = None;
        let mut f = l + 1;
        let mut reads = Vec::new();
        let mut output = Vec::new();
        let mut full = Vec::new();
        let mut gap_offload = vec![Some(0)];
        let alive = |act: &[Option<usize>], sav: &[Option<usize>], insts: &[Inst]| -> u64 {
            act.iter().chain(sav.iter()).flatten().map(|&j| insts[j].size).sum()
        };
        let input = |i: usize, act: &[Option<usize>], sav: &[Option<usize>]| -> Result<(usize, bool), String> {
            match (act[i], sav[i]) {
                (Some(j), _) => Ok((j, true)),
                (None, Some(j)) => Ok((j, false)),
                _ => Err(format!("a_{i} is not available")),
            }
        };
        for (k, op) in ops.iter().enumerate() {
            let held = alive(&act, &sav, &insts) + grad.map_or(0, |i| chain.x[i]) + chain.static_bytes;
            let (r, out, tmp): (Vec<usize>, Option<(Tensor, u64)>, u64);
            let mut released: Vec<usize> = Vec::new();
            match *op {
                Op::Forward { stage: i, mode } => {
                    if i >= l.min(f) {
                        return Err(format!("op {k} ({op}): forward of a stage whose backward is done or the loss"));
                    }
                    let (j, from_act) = input(i, &act, &sav).map_err(|e| format!("op {k} ({op}): {e}"))?;
                    let (tensor, size) = if mode == ForwardMode::KeepAll {
                        (Tensor::Saved(i + 1), chain.xbar[i + 1])
                    } else {
                        (Tensor::Activation(i + 1), chain.x[i + 1])
                    };
                    let slot = if mode == ForwardMode::KeepAll { &sav[i + 1] } else { &act[i + 1] };
                    if slot.is_some() {
                        return Err(format!("op {k} ({op}) produces {tensor:?}, which is held"));
                    }
                    if mode == ForwardMode::Discard && from_act {
                        released.push(j);
                    }
                    (r, out, tmp) = (vec![j], Some((tensor, size)), chain.ftmp[i]);
                }
                Op::Backward { stage } if stage == l && f == l + 1 => {
                    let (j, _) = input(l, &act, &sav).map_err(|e| format!("op {k} ({op}): {e}"))?;
                    released.extend(act[l]);
                    (r, out, tmp) = (vec![j], None, chain.btmp[l]);
                }
                Op::Backward { stage } if f <= l && stage + 1 == f => {
                    let i = stage;
                    let s = sav[i + 1].ok_or_else(|| format!("op {k} ({op}): ā_{} is not available", i + 1))?;
                    let (j, _) = input(i, &act, &sav).map_err(|e| format!("op {k} ({op}): {e}"))?;
                    released.extend([sav[i + 1], act[i + 1], act[i]].into_iter().flatten());
                    (r, out, tmp) = (vec![s, j], None, chain.btmp[i]);
                }
                _ => return Err(format!("op {k} ({op}) is not a move of the space")),
            }
            for &j in &r {
                insts[j].readers.push(k);
            }
            let mut allocs = tmp;
            let produced = out.map(|(tensor, size)| {
                insts.push(Inst { tensor, size, off_gap: k + 1, readers: vec![] });
                allocs += size;
                insts.len() - 1
            });
            if let Op::Backward { stage } = *op {
                allocs += chain.x[stage];
            }
            full.push(held + allocs);
            reads.push(r);
            output.push(produced);
            gap_offload.push(produced);
            for j in released {
                if insts[j].readers.is_empty() {
                    return Err(format!("op {k} ({op}) releases {:?}, which nothing read", insts[j].tensor));
                }
                for slot in act.iter_mut().chain(sav.iter_mut()) {
                    if *slot == Some(j) {
                        *slot = None;
                    }
                }
            }
            if let Some(j) = produced {
                match insts[j].tensor {
                    Tensor::Saved(i) => sav[i] = Some(j),
                    Tensor::Activation(i) => act[i] = Some(j),
                    _ => unreachable!(),
                }
            }
            if let Op::Backward { stage } = *op {
                grad = Some(stage);
                f = stage;
            }
        }
        if f != 0 {
            return Err("δ_0 is never computed".into());
        }
        if let Some(j) = act.iter().chain(sav.iter()).flatten().next() {
            return Err(format!("{:?} is still held at the end", insts[*j].tensor));
        }
        Ok(Layout { insts, reads, output, full, gap_offload })
    }
}

/// The timeline without waits for memory: a lower bound on the simulator's.
#[derive(Debug, Clone, Copy)]
struct Clock {
    cursor: f64,
    d2h: f64,
    h2d: f64,
}

/// The transfer search over one compute sequence.
struct Plan<'a, 'b> {
    ctx: &'a Ctx<'a>,
    ops: &'a [Op],
    lay: Layout,
    dur: Vec<f64>,
    /// `suffix[k]`: compute time of ops `k..`.
    suffix: Vec<f64>,
    cuts: bool,
    best: &'b mut Best,
    /// Per instance: offloaded, and the gap of its prefetch.
    off: Vec<bool>,
    pre: Vec<Option<usize>>,
    ready: Vec<f64>,
    host_ready: Vec<f64>,
    /// The memory bound of each op already placed.
    mem: Vec<u64>,
    /// Per instance offloaded and not prefetched: the ops from its offload gap up to here
    /// count it (read since, so held).
    counted: Vec<usize>,
    out: Vec<Op>,
    config: SimConfig,
    simulated: usize,
    accepted: usize,
    prefixes: usize,
}

impl<'a, 'b> Plan<'a, 'b> {
    fn new(ctx: &'a Ctx<'a>, ops: &'a [Op], cuts: bool, best: &'b mut Best) -> Plan<'a, 'b> {
        let c = ctx.chain;
        let lay = Layout::new(c, ops).expect("the enumeration yields sequences of the space");
        let dur: Vec<f64> = ops
            .iter()
            .map(|op| match *op {
                Op::Forward { stage, .. } => c.ftime[stage],
                Op::Backward { stage } => c.btime[stage],
                _ => 0.0,
            })
            .collect();
        let mut suffix = vec![0.0; ops.len() + 1];
        for k in (0..ops.len()).rev() {
            suffix[k] = suffix[k + 1] + dur[k];
        }
        let m = lay.insts.len();
        Plan {
            ctx,
            ops,
            dur,
            suffix,
            cuts,
            best,
            off: vec![false; m],
            pre: vec![None; m],
            ready: vec![0.0; m],
            host_ready: vec![0.0; m],
            mem: vec![0; ops.len()],
            counted: lay.insts.iter().map(|i| i.off_gap).collect(),
            out: Vec::with_capacity(3 * ops.len()),
            config: SimConfig { budget: Some(ctx.budget), ..SimConfig::on(ctx.machine) },
            lay,
            simulated: 0,
            accepted: 0,
            prefixes: 0,
        }
    }

    fn run(&mut self, bound: f64) {
        if self.cuts && no_better(bound, self.best.makespan) {
            return;
        }
        self.gap(0, Clock { cursor: 0.0, d2h: 0.0, h2d: 0.0 });
    }

    fn offloadable(&self, j: usize) -> bool {
        let inst = &self.lay.insts[j];
        self.ctx.links && inst.size > 0 && inst.last_reader() > inst.off_gap
    }

    /// Gap `g`: the offload of what op `g − 1` produced, or not.
    fn gap(&mut self, g: usize, t: Clock) {
        if self.best.simulations > self.best.limit {
            return;
        }
        let cand = self.lay.gap_offload[g].filter(|&j| self.offloadable(j));
        self.prefetches(g, t);
        if let Some(j) = cand {
            let size = self.lay.insts[j].size;
            let start = t.cursor.max(t.d2h).max(self.ready[j]);
            let end = start + self.ctx.off_time(size);
            self.host_ready[j] = end;
            self.off[j] = true;
            self.out.push(Op::Offload { tensor: self.lay.insts[j].tensor, fraction: 1.0 });
            self.prefetches(g, Clock { d2h: end, ..t });
            self.out.pop();
            self.off[j] = false;
        }
    }

    /// Instances offloaded before gap `g` and not prefetched yet.
    fn pending(&self, g: usize) -> impl Iterator<Item = usize> + '_ {
        (0..self.lay.insts.len())
            .filter(move |&j| self.off[j] && self.pre[j].is_none() && self.lay.insts[j].off_gap < g)
    }

    /// The prefetches of gap `g` after those already placed there: stop (unless an
    /// instance whose last reader is op `g` is still on the host), or prefetch one more.
    fn prefetches(&mut self, g: usize, t: Clock) {
        let pending: Vec<usize> = self.pending(g).collect();
        if g == self.ops.len() {
            if pending.is_empty() {
                self.leaf(t);
            }
            return;
        }
        if pending.iter().all(|&j| self.lay.insts[j].last_reader() > g) {
            self.compute(g, t);
        }
        for j in pending {
            let size = self.lay.insts[j].size;
            let start = t.cursor.max(t.h2d).max(self.host_ready[j]);
            let end = start + self.ctx.pre_time(size);
            let saved = self.ready[j];
            self.ready[j] = end;
            self.pre[j] = Some(g);
            self.out.push(Op::Prefetch { tensor: self.lay.insts[j].tensor, fraction: 1.0 });
            self.prefetches(g, Clock { h2d: end, ..t });
            self.out.pop();
            self.pre[j] = None;
            self.ready[j] = saved;
        }
    }

    /// Whether instance `j` may be off the device when op `k` starts, as far as the
    /// decisions so far tell: offloaded, not read by `k`, and not prefetched and read since.
    fn maybe_off(&self, j: usize, k: usize) -> bool {
        if !self.off[j] || self.lay.reads[k].contains(&j) {
            return false;
        }
        match self.pre[j] {
            None => true,
            Some(h) => !self.lay.insts[j].readers.iter().any(|&r| h <= r && r <= k),
        }
    }

    /// Compute op `g`, then gap `g + 1`.
    fn compute(&mut self, g: usize, t: Clock) {
        let budget = self.ctx.budget;
        let mut start = t.cursor;
        for &j in &self.lay.reads[g] {
            start = start.max(self.ready[j]);
        }
        let mut off: Vec<usize> = (0..self.lay.insts.len()).filter(|&j| self.maybe_off(j, g)).collect();
        let freed: u64 = off.iter().map(|&j| self.lay.insts[j].size).sum();
        self.mem[g] = self.lay.full[g] - freed;
        // A read of an offloaded tensor not prefetched yet holds its device copy from the
        // offload on: the ops in between, counted without it, now count it.
        let mut recounted: Vec<(usize, usize)> = Vec::new();
        let mut fits = self.mem[g] <= budget;
        for &j in &self.lay.reads[g] {
            if self.off[j] && self.pre[j].is_none() {
                let size = self.lay.insts[j].size;
                recounted.push((j, self.counted[j]));
                for k in self.counted[j]..g {
                    if !self.lay.reads[k].contains(&j) {
                        self.mem[k] += size;
                        fits &= self.mem[k] <= budget;
                    }
                }
                self.counted[j] = g;
            }
        }
        if !self.cuts || fits {
            self.compute_placed(g, t, start, &mut off);
        }
        for (j, from) in recounted.into_iter().rev() {
            let size = self.lay.insts[j].size;
            for k in from..self.counted[j] {
                if !self.lay.reads[k].contains(&j) {
                    self.mem[k] -= size;
                }
            }
            self.counted[j] = from;
        }
    }

    /// Compute op `g` once its memory bound holds: its start, the cuts, gap `g + 1`.
    fn compute_placed(&mut self, g: usize, t: Clock, start: f64, off: &mut [usize]) {
        let budget = self.ctx.budget;
        let mut start = start;
        let mut t = t;
        let mut raised: Vec<(usize, f64)> = Vec::new();
        if self.cuts {
            // What exceeds the budget must be off the device when the op starts: released,
            // so offloaded (an offload's end is at least its `host_ready`).
            let mut q = self.lay.full[g].saturating_sub(budget);
            off.sort_by(|&a, &b| self.host_ready[a].total_cmp(&self.host_ready[b]));
            for &j in off.iter() {
                if q == 0 {
                    break;
                }
                start = start.max(self.host_ready[j]);
                q = q.saturating_sub(self.lay.insts[j].size);
            }
            // A prefetched tensor that cannot be on the device beside the op's memory (held
            // until the op ends) starts coming back only when the op ends.
            let end = start + self.dur[g];
            for &j in off.iter() {
                let size = self.lay.insts[j].size;
                if self.pre[j].is_some() && self.mem[g] + size > budget {
                    let arrival = end + self.ctx.pre_time(size);
                    if arrival > self.ready[j] {
                        raised.push((j, self.ready[j]));
                        self.ready[j] = arrival;
                        t.h2d = t.h2d.max(arrival);
                    }
                }
            }
        }
        let end = start + self.dur[g];
        t.cursor = end;
        let mut go = true;
        let ahead = if self.cuts { self.lookahead(g, end) } else { 0.0 };
        if self.cuts && (no_better(ahead, self.best.makespan) || self.prefix_fails(g, end)) {
            go = false;
        } else if self.cuts {
            let mut lb = (end + self.suffix[g + 1]).max(t.d2h).max(t.h2d).max(ahead);
            let mut queued = 0.0;
            for j in 0..self.lay.insts.len() {
                if !self.off[j] {
                    continue;
                }
                let inst = &self.lay.insts[j];
                match self.pre[j] {
                    None if inst.off_gap <= g => {
                        let p = self.ctx.pre_time(inst.size);
                        queued += p;
                        lb = lb.max(end.max(self.host_ready[j]) + p + self.suffix[inst.last_reader()]);
                    }
                    Some(h) => {
                        if let Some(&r) = inst.readers.iter().find(|&&r| r >= h && r > g) {
                            lb = lb.max(self.ready[j] + self.suffix[r]);
                        }
                    }
                    None => {}
                }
            }
            lb = lb.max(end.max(t.h2d) + queued);
            go = !no_better(lb, self.best.makespan);
        }
        if go {
            let saved = self.lay.output[g].map(|j| (j, self.ready[j]));
            if let Some((j, _)) = saved {
                self.ready[j] = end;
            }
            self.out.push(self.ops[g]);
            self.gap(g + 1, t);
            self.out.pop();
            if let Some((j, r)) = saved {
                self.ready[j] = r;
            }
        }
        for (j, r) in raised.into_iter().rev() {
            self.ready[j] = r;
        }
    }

    /// A lower bound on the makespan from the ops after `g` (which ends at `end` or
    /// later), or infinity if they cannot fit:
    ///
    /// * an op that exceeds the budget needs its excess off the device when it starts:
    ///   tensors alive then, not read by it, and offloaded (so far, or produced from op `g`
    ///   on and not decided yet), each released no earlier than its offload ends;
    /// * a tensor on the host comes back for a reader `r`, and its prefetch cannot hold
    ///   memory during an op before `r` that would then exceed the budget even with
    ///   everything else that may be off the device: it starts after that op ends.
    fn lookahead(&self, g: usize, end: f64) -> f64 {
        let n = self.ops.len();
        let budget = self.ctx.budget;
        let m = self.lay.insts.len();
        // When op `k` (after `g`) starts and ends at the earliest.
        let start_of = |k: usize| end + self.suffix[g + 1] - self.suffix[k];
        // Whether instance `i` may be off the device at future op `k`, and when its
        // memory is released at the earliest.
        let may_leave = |i: usize, k: usize| -> Option<f64> {
            let inst = &self.lay.insts[i];
            if inst.off_gap > k || inst.last_reader() < k || self.lay.reads[k].contains(&i) {
                return None;
            }
            if inst.off_gap <= g {
                self.maybe_off(i, k).then_some(self.host_ready[i])
            } else if self.offloadable(i) {
                Some(start_of(inst.off_gap) + self.ctx.off_time(inst.size))
            } else {
                None
            }
        };
        let mut lb: f64 = 0.0;
        let mut cands: Vec<(f64, u64)> = Vec::new();
        // `slack[k]`: the budget less what op `k` surely holds (negative: it cannot fit).
        let mut slack = vec![0i128; n];
        for (k, room) in slack.iter_mut().enumerate().skip(g + 1) {
            cands.clear();
            cands.extend((0..m).filter_map(|i| may_leave(i, k).map(|t| (t, self.lay.insts[i].size))));
            let off: u64 = cands.iter().map(|c| c.1).sum();
            *room = budget as i128 - (self.lay.full[k] as i128 - off as i128);
            if *room < 0 {
                return f64::INFINITY;
            }
            let Some(q) = self.lay.full[k].checked_sub(budget).filter(|&q| q > 0) else { continue };
            cands.sort_by(|a, b| a.0.total_cmp(&b.0));
            let (mut left, mut at) = (q, start_of(k));
            for &(avail, size) in &cands {
                if left == 0 {
                    break;
                }
                at = at.max(avail);
                left = left.saturating_sub(size);
            }
            lb = lb.max(at + self.suffix[k]);
        }
        // Prefetches to come or not read yet.
        for j in 0..m {
            if !self.off[j] {
                continue;
            }
            let inst = &self.lay.insts[j];
            let size = inst.size as i128;
            let (first, earliest) = match self.pre[j] {
                None => (g + 1, end.max(self.host_ready[j])),
                Some(h) => match inst.readers.iter().find(|&&r| r >= h) {
                    Some(&r) if r > g => (r, self.ready[j] - self.ctx.pre_time(inst.size)),
                    _ => continue,
                },
            };
            // The readers that may be the first after the prefetch, and the latest op
            // before each that cannot hold it.
            let mut best = f64::INFINITY;
            let mut after = earliest;
            for (k, &room) in slack.iter().enumerate().skip(g + 1) {
                if k >= first && inst.readers.contains(&k) {
                    best = best.min(after + self.ctx.pre_time(inst.size) + self.suffix[k]);
                    if self.pre[j].is_some() {
                        break;
                    }
                }
                if k > inst.last_reader() {
                    break;
                }
                let counted = may_leave(j, k).is_some();
                if room - if counted { size } else { 0 } < 0 {
                    after = after.max(start_of(k + 1));
                }
            }
            lb = lb.max(best);
        }
        lb
    }

    /// Whether the schedule so far, with compute op `g` (which ends at `end` or later),
    /// exceeds the budget before `end` whatever follows: later ops only allocate after
    /// it, and their reads only hold memory longer. Simulated only while a prefetch has
    /// yet to be read (what the memory bound cannot see: a transfer that found no room).
    fn prefix_fails(&mut self, g: usize, end: f64) -> bool {
        let unread = (0..self.lay.insts.len())
            .any(|j| self.pre[j].is_some_and(|h| !self.lay.insts[j].readers.iter().any(|&r| h <= r && r < g)));
        if !unread {
            return false;
        }
        self.out.push(self.ops[g]);
        let verdict = simulate_chain(self.ctx.chain, &Schedule::new(View::Chain, self.out.clone()), &self.config);
        self.out.pop();
        self.prefixes += 1;
        self.best.simulations += 1;
        let fails = matches!(verdict, Err(SimError::BudgetExceeded { time, .. }) if time < end);
        fails
    }

    fn leaf(&mut self, t: Clock) {
        let lb = t.cursor.max(t.d2h).max(t.h2d);
        if self.cuts && no_better(lb, self.best.makespan) {
            return;
        }
        self.simulated += 1;
        self.best.simulations += 1;
        let schedule = Schedule::new(View::Chain, self.out.clone());
        match simulate_chain(self.ctx.chain, &schedule, &self.config) {
            Ok(r) => {
                self.accepted += 1;
                debug_assert!(r.makespan >= lb * (1.0 - 1e-9), "simulated {} below the bound {lb}", r.makespan);
                if r.makespan < self.best.makespan {
                    self.best.makespan = r.makespan;
                    self.best.ops = Some(schedule.ops);
                }
            }
            Err(SimError::BudgetExceeded { .. }) => {}
            Err(e) => panic!("brute-offload built an invalid schedule {}: {e}", schedule.to_notation()),
        }
    }
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

#[cfg(test)]
mod tests {
    use pebble_testkit::{random_chain, Rng};

    use super::*;
    use crate::brute::brute_force;
    use crate::offload::{lower_bound, OffChain};
    use crate::{plan, solver, Problem, Slots, SolveOptions};

    fn machine(beta: f64) -> Machine {
        Machine::default().with_bandwidth(beta)
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
    }

    /// The simulated makespan of `schedule` within `budget` (it must pass).
    fn simulated(chain: &Chain, budget: u64, beta: f64, schedule: &Schedule) -> f64 {
        let config = SimConfig { budget: Some(budget), ..SimConfig::on(machine(beta)) };
        simulate_chain(chain, schedule, &config)
            .unwrap_or_else(|e| panic!("{} rejected: {e}", schedule.to_notation()))
            .makespan
    }

    /// `name`'s schedule (exact sizes) and its simulated makespan, or `None` if infeasible.
    fn solve(name: &str, chain: &Chain, budget: u64, beta: f64) -> Option<(f64, Schedule)> {
        let options = SolveOptions { slots: Slots::Exact, machine: machine(beta), ..SolveOptions::default() };
        match plan(solver(name).unwrap(), Problem::Chain(chain), budget, &options) {
            Ok(p) => Some((p.report.makespan, p.schedule)),
            Err(crate::PlanError::Solve(SolveError::Infeasible { .. })) => None,
            Err(e) => panic!("{name} at {budget}: {e}"),
        }
    }

    /// `count` random chains of 2, 3, 4, 2, … stages, each at budgets from the least any
    /// offloading schedule needs (each layer alone with its input, (3.8)–(3.9)) to
    /// keep-all's peak: the `k`-th chain, its budget.
    fn instances(seed: u64, count: usize, fractions: &[f64]) -> Vec<(usize, Chain, u64)> {
        let mut rng = Rng::new(seed);
        let mut out = Vec::new();
        for k in 0..count {
            let chain = random_chain(&mut rng, 2 + k % 3);
            let c = OffChain::new(&chain, u64::MAX).unwrap();
            let hi = c.peak() as u64 + chain.static_bytes;
            let lo = (c.least_memory() as u64 + chain.static_bytes).min(hi);
            let mut budgets: Vec<u64> = fractions.iter().map(|&f| lo + ((hi - lo) as f64 * f) as u64).collect();
            budgets.dedup();
            out.extend(budgets.into_iter().map(|b| (k, chain.clone(), b)));
        }
        out
    }

    /// Links slow, medium and fast for these chains: a typical tensor (10 to 35 bytes)
    /// takes 20 to 70, 5 to 18, 1 to 4 time units to move; a stage computes in 1 to 9.
    const BETAS: [f64; 3] = [0.5, 2.0, 8.0];

    /// How far above the optimum pofo's simulated makespan may be. No theorem bounds it:
    /// with exact sizes pofo's DP is exact for its own model, but that model is narrower
    /// (persistent schedules, each stage's input offloaded whole as the stage starts and
    /// prefetched once) and relaxed (memory moving progressively, O.7″, where the
    /// simulator holds a buffer for its whole transfer, O.7), and its prefetches are
    /// placed by a heuristic. On nine seeds of these 30 chains (about 2,200 instances)
    /// every gap but three was below 26%, the mean about 1%; 30% catches a regression
    /// without flagging the model's known slack.
    const POFO_TOL: f64 = 0.30;

    /// Where pofo is further than [`POFO_TOL`] from the optimum (chain, budget, β).
    /// Chain 22 at its least budget, β = 0.5: rotor finds nothing, pofo 119 (its DP says
    /// 109), the optimum 67 with `[offload a_0] F0ck F1∅ F2all B3 B2 F0all F1all B1
    /// [prefetch a_0] B0`: `a_0` leaves during the forward, but the simulator keeps the
    /// device copy for the readers issued after the offload (`F0all`), so it is freed
    /// only once the recomputation has read it, for `F1all` and `B1`, and comes back for
    /// `B0`. Pofo's model has no such copy: an offloaded input is gone until its one
    /// prefetch, so it offloads `a_1` as well, at a slow link.
    const KNOWN_GAPS: &[(usize, u64, f64)] = &[(22, 76, 0.5)];

    /// Which instances [`check_solvers`] leaves out.
    #[derive(Clone, Copy, PartialEq)]
    enum Skip {
        /// None.
        Nothing,
        /// 4 stages where no Table 2.1 schedule fits: offloading is needed, the optimum is
        /// well above the compute time, and the search takes seconds (up to a minute).
        NeededOffloadingOnFourStages,
    }

    /// The optimum of the space is at most what pofo, rotor and offload-dp achieve
    /// (their schedules lie in it), pofo is close to it, and the offloading-only optimum
    /// respects Proposition 3.
    #[test]
    fn brute_offload_bounds_the_offloading_solvers() {
        check_solvers(11, Skip::NeededOffloadingOnFourStages);
    }

    /// [`brute_offload_bounds_the_offloading_solvers`] on every instance (a few minutes).
    #[test]
    #[ignore]
    fn brute_offload_bounds_the_offloading_solvers_everywhere() {
        check_solvers(11, Skip::Nothing);
    }

    fn check_solvers(seed: u64, skip: Skip) {
        let start = std::time::Instant::now();
        let (mut solved, mut compared, mut outside, mut infeasible) = (0, 0, 0, 0);
        let (mut gaps, mut rotor_gaps, mut below_bound) = (Vec::new(), Vec::new(), 0);
        let mut over = Vec::new();
        let mut skipped = 0;
        for (k, chain, budget) in instances(seed, 30, &[0.0, 0.3, 0.6]) {
            let remat = brute_force(&chain, budget, 8).ok().map(|r| r.0);
            if skip == Skip::NeededOffloadingOnFourStages && chain.len() == 4 && remat.is_none() {
                skipped += BETAS.len();
                continue;
            }
            for beta in BETAS {
                let who = format!("chain {k} ({}) at {budget}, β = {beta}", chain.to_json());
                let found = match brute_offload(&chain, budget, &machine(beta)) {
                    Ok(f) => Some(f),
                    Err(SolveError::Infeasible { .. }) => None,
                    Err(SolveError::TooLarge { why, .. }) if skip == Skip::Nothing => {
                        eprintln!("too large ({why}): {who}");
                        skipped += 1;
                        continue;
                    }
                    Err(e) => panic!("{e}: {who}"),
                };
                if let Some((t, s)) = &found {
                    solved += 1;
                    in_space(&chain, s).unwrap_or_else(|e| panic!("{e}: {who}"));
                    assert!(close(simulated(&chain, budget, beta, s), *t), "{who}");
                    let sum = OffChain::new(&chain, budget).unwrap().compute_time();
                    assert!(*t >= sum * (1.0 - 1e-12), "{t} below the compute time {sum}: {who}");
                } else {
                    infeasible += 1;
                }
                let brute = found.as_ref().map(|f| f.0);
                // The special cases, and pofo, which takes the best of them and its DP.
                for name in ["rotor", "offload-greedy", "offload-dp", "pofo"] {
                    let Some((time, schedule)) = solve(name, &chain, budget, beta) else { continue };
                    if let Err(why) = in_space(&chain, &schedule) {
                        outside += 1;
                        eprintln!("{name}'s schedule is outside the space ({why}): {who}");
                        continue;
                    }
                    compared += 1;
                    let b = brute.unwrap_or_else(|| panic!("{name} fits where brute-offload does not: {who}"));
                    assert!(b <= time * (1.0 + 1e-9), "brute-offload {b} > {name} {time}: {who}");
                    if name == "pofo" {
                        let gap = time / b - 1.0;
                        gaps.push(gap);
                        if gap > POFO_TOL {
                            over.push((k, budget, beta));
                            eprintln!(
                                "pofo {time} vs brute-offload {b} (+{:.0}%): {who}\n  pofo  {}\n  brute {}",
                                100.0 * gap,
                                schedule.to_notation(),
                                found.as_ref().unwrap().1.to_notation()
                            );
                        }
                    }
                    if let (Some(opt), "rotor") = (remat, name) {
                        // Persistence alone, without transfers: rotor against Table 2.1's optimum.
                        rotor_gaps.push(time / opt - 1.0);
                    }
                }
                // Offloading alone (keep-all's compute sequence): Proposition 3 bounds it,
                // and it bounds offload-dp's (whose schedules are keep-all's with offloads).
                let alone = search(&chain, budget, &machine(beta), Search { recompute: false, ..Search::default() });
                let bound = lower_bound(&chain, budget, &machine(beta)).unwrap();
                match alone {
                    Ok(f) => {
                        assert!(f.makespan >= bound * (1.0 - 1e-12), "{} below Prop. 3's {bound}: {who}", f.makespan);
                        assert!(brute.is_some_and(|b| b <= f.makespan * (1.0 + 1e-12)), "{who}");
                        if let Some((dp, _)) = solve("offload-dp", &chain, budget, beta) {
                            assert!(
                                f.makespan <= dp * (1.0 + 1e-9),
                                "offloading alone {} > offload-dp {dp}: {who}",
                                f.makespan
                            );
                        }
                    }
                    Err(SolveError::Infeasible { .. }) => {
                        assert!(solve("offload-dp", &chain, budget, beta).is_none(), "{who}");
                    }
                    Err(e) => panic!("{e}: {who}"),
                }
                if brute.is_some_and(|b| b < bound * (1.0 - 1e-12)) {
                    // Recomputation beats any offloading-only schedule.
                    below_bound += 1;
                }
            }
        }
        let stats = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            (v.last().copied().unwrap_or(0.0), v.iter().sum::<f64>() / v.len().max(1) as f64, v[v.len() / 2])
        };
        let (max, mean, median) = stats(&mut gaps);
        let (rmax, rmean, _) = stats(&mut rotor_gaps);
        eprintln!(
            "{solved} solved, {infeasible} infeasible, {skipped} skipped; {compared} solver schedules compared, {outside} outside the space; \
             pofo over {}: gap max {max:.4}, mean {mean:.4}, median {median:.4}; rotor over Table 2.1's optimum: max \
             {rmax:.4}, mean {rmean:.4}; brute-offload below Prop. 3 (recomputation pays) {below_bound}; {:.1}s",
            gaps.len(),
            start.elapsed().as_secs_f64()
        );
        assert!(solved > 200 && gaps.len() > 200 && outside == 0, "{solved} {} {outside}", gaps.len());
        assert!(skipped < 40, "{skipped} skipped");
        for o in &over {
            assert!(KNOWN_GAPS.contains(o), "pofo further than {POFO_TOL} from the optimum: {o:?}");
        }
        assert!(mean < 0.03, "pofo's mean gap {mean}");
    }

    /// Without transfers worth making (β → 0), the space's optimum is `brute`'s, Table
    /// 2.1's optimum: every schedule with a transfer takes about `1/β`. (Where Table 2.1
    /// has no schedule, every candidate needs a transfer of `1/β`, and the search, which
    /// then has no good bound, is not run.)
    #[test]
    fn without_bandwidth_brute_offload_is_brute() {
        let beta = 1e-6;
        let (mut equal, mut skipped) = (0, 0);
        for (_, chain, budget) in instances(12, 30, &[0.0, 0.3, 0.6, 1.0]) {
            let who = format!("{} at {budget}", chain.to_json());
            let Ok((t, _)) = brute_force(&chain, budget, 8) else {
                skipped += 1;
                continue;
            };
            let (u, s) = brute_offload(&chain, budget, &machine(beta)).unwrap_or_else(|e| panic!("{e}: {who}"));
            assert!(close(t, u), "brute {t}, brute-offload {u} ({}): {who}", s.to_notation());
            assert!(!s.ops.iter().any(|op| matches!(op, Op::Offload { .. })), "{}", s.to_notation());
            equal += 1;
        }
        assert!(equal > 60 && skipped > 0, "{equal} {skipped}");
    }

    /// The cuts only remove what cannot beat the best: with them and without (every
    /// candidate whose compute time is below the best simulated), the same optimum, on
    /// `count` chains of 2 and 3 stages; the searches without cuts that simulate more
    /// than `limit` candidates are left out.
    fn check_cuts(seed: u64, count: usize, limit: usize) -> (usize, usize) {
        let (mut compared, mut left_out) = (0, 0);
        let mut rng = Rng::new(seed);
        for k in 0..count {
            let chain = random_chain(&mut rng, 2 + k % 2);
            let c = OffChain::new(&chain, u64::MAX).unwrap();
            let hi = c.peak() as u64 + chain.static_bytes;
            let lo = (c.least_memory() as u64 + chain.static_bytes).min(hi);
            for budget in [lo, lo + (hi - lo) / 3, lo + 2 * (hi - lo) / 3] {
                for beta in BETAS {
                    let how = Search { cuts: false, max_simulations: limit, ..Search::default() };
                    let exhaustive = match search(&chain, budget, &machine(beta), how) {
                        Err(SolveError::TooLarge { .. }) => {
                            left_out += 1;
                            continue;
                        }
                        r => r.map(|f| f.makespan).ok(),
                    };
                    let cut = brute_offload(&chain, budget, &machine(beta)).map(|f| f.0).ok();
                    assert_eq!(cut, exhaustive, "{} at {budget}, β = {beta}", chain.to_json());
                    compared += 1;
                }
            }
        }
        (compared, left_out)
    }

    #[test]
    fn the_cuts_keep_the_optimum() {
        let (compared, left_out) = check_cuts(31, 10, 30_000);
        assert!(compared > 50, "{compared} compared, {left_out} left out");
    }

    /// [`the_cuts_keep_the_optimum`] on more and larger searches (several minutes).
    #[test]
    #[ignore]
    fn the_cuts_keep_the_optimum_everywhere() {
        let (compared, left_out) = check_cuts(9, 60, 5_000_000);
        eprintln!("{compared} compared, {left_out} left out");
    }

    /// A 2-stage chain whose loss needs a lot of temporary memory (the simulator's own
    /// offloading example). Keep-all (`F0all F1all L B1 B0`, 10 time units) peaks at 18
    /// during the loss: `a_0` 1 + `ā_1` 4 + `ā_2` 2 + `δ_2` 1 + 10.
    #[test]
    fn offloading_a_0_beats_recomputation_on_a_hand_example() {
        let chain = Chain {
            name: None,
            ftime: vec![1.0, 2.0],
            btime: vec![2.0, 2.0, 3.0],
            x: vec![1, 4, 1],
            xbar: vec![1, 4, 2],
            ftmp: vec![0, 0],
            btmp: vec![0, 0, 10],
            w: None,
            g: None,
            o: None,
            static_bytes: 0,
        };
        let time = |budget: u64, beta: f64| {
            brute_offload(&chain, budget, &machine(beta)).map(|(t, s)| {
                assert_eq!(simulated(&chain, budget, beta, &s), t);
                (t, s.to_notation())
            })
        };
        // At 17, Table 2.1 alone recomputes F1 (`F0all F1ck L F1all B1 B0`, 12). Offloading
        // `a_0` during F0 ([0, 1/β], released when F0 ends at 1 if the offload has) lets
        // keep-all run with no wait: its prefetch, issued when the loss ends at 6, is back
        // by 8 when B0 needs it for β ≥ 0.5. At β = 0.25 the loss waits for the release
        // (4, not 3) and B0 for the prefetch (7 to 11): 13, worse than recomputing.
        assert!(brute_force(&chain, 17, 8).is_ok_and(|r| r.0 == 12.0));
        for beta in [4.0, 1.0, 0.5] {
            let (t, s) = time(17, beta).unwrap();
            assert_eq!(t, 10.0, "β = {beta}: {s}");
            assert!(s.contains("offload Activation(0)"), "{s}");
        }
        assert_eq!(time(17, 0.25).unwrap().0, 12.0);
        // At 12 nothing of Table 2.1 fits (the loss holds a_0, a_2, δ_2 and 10), but
        // `[offload a_0] F0ck F1∅ L [prefetch a_0] F0all F1all B1 B0` does: at β = 1 the
        // offload ends at 1, the loss runs [3, 6], the prefetch [6, 7], then F0all, F1all,
        // B1, B0 back to back: 14. At β = 0.1 the loss waits for the offload ([0, 10]) and
        // F0all for the prefetch ([13, 23]): 30.
        assert!(brute_force(&chain, 12, 8).is_err());
        assert_eq!(
            time(12, 1.0).unwrap(),
            (
                14.0,
                "[offload Activation(0) 1] F0ck F1none L [prefetch Activation(0) 1] F0all F1all B1 B0"
                    .replace(" L ", " B2 ")
            )
        );
        assert_eq!(time(12, 0.1).unwrap().0, 30.0);
        // At 11 not even the loss fits: a_2 1 + δ_2 1 + 10.
        assert!(matches!(time(11, 4.0), Err(SolveError::Infeasible { .. })));
        let five = Chain::homogeneous(5, 1.0, 1.0, 1);
        assert!(matches!(brute_offload(&five, 100, &machine(1.0)), Err(SolveError::TooLarge { .. })));
    }

    /// What the space excludes, [`in_space`] rejects.
    #[test]
    fn in_space_rejects_what_the_space_excludes() {
        let chain = Chain::homogeneous(2, 1.0, 1.0, 1);
        let s = |text: &str, extra: &[(usize, Op)]| {
            let mut ops = Schedule::from_notation(View::Chain, text).unwrap().resolve_loss(2).ops;
            for &(at, op) in extra.iter().rev() {
                ops.insert(at, op);
            }
            Schedule::new(View::Chain, ops)
        };
        let off = |t: Tensor| Op::Offload { tensor: t, fraction: 1.0 };
        let pre = |t: Tensor| Op::Prefetch { tensor: t, fraction: 1.0 };
        let a0 = Tensor::Activation(0);
        let s1 = Tensor::Saved(1);
        assert_eq!(in_space(&chain, &s("F0all F1all L B1 B0", &[])), Ok(()));
        assert_eq!(in_space(&chain, &s("F0all F1all L B1 B0", &[(0, off(a0)), (4, pre(a0))])), Ok(()));
        assert_eq!(in_space(&chain, &s("F0all F1all L B1 B0", &[(1, off(s1)), (4, pre(s1))])), Ok(()));
        // Offloaded later than right after its producer.
        assert!(in_space(&chain, &s("F0all F1all L B1 B0", &[(2, off(s1)), (4, pre(s1))])).is_err());
        // Never prefetched; prefetched after its last reader; part of it.
        assert!(in_space(&chain, &s("F0all F1all L B1 B0", &[(0, off(a0))])).is_err());
        assert!(in_space(&chain, &s("F0all F1all L B1 B0", &[(1, off(s1)), (5, pre(s1))])).is_err());
        let half = Op::Offload { tensor: a0, fraction: 0.5 };
        assert!(in_space(&chain, &s("F0all F1all L B1 B0", &[(0, half), (4, pre(a0))])).is_err());
        // A dead output (a_2 recomputed after the loss, which nothing reads), a free, an
        // incomplete schedule.
        assert_eq!(in_space(&chain, &s("F0ck F0all F1all L B1 B0", &[])), Ok(()));
        assert!(in_space(&chain, &s("F0all F1all L F1ck B1 B0", &[])).is_err());
        assert!(in_space(&chain, &s("F0all F1all L B1 B0", &[(3, Op::Free { tensor: s1 })])).is_err());
        assert!(in_space(&chain, &s("F0all F1all L B1", &[])).is_err());
    }
}
