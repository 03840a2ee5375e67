//! `checkmate`: the original Checkmate ILP (Jain et al., MLSys 2020), as Zhao's thesis
//! reproduces it (§2.1.1; the research digest, §2.1), on pebble's training graph.
//!
//! # The ILP
//!
//! Checkmate's nodes `v_0 … v_{n−1}` are the graph's compute nodes in list order (a
//! topological order: forwards, the loss, backwards). The schedule is unrolled into
//! `T = n` stages; stage `t` runs node `t` and may run again any forward node before it,
//! each at most once, in list order (the frontier-advancing stages of the paper:
//! `R[t,t] = 1`, `R[t,i] = 0` for `i > t`). Variables:
//!
//! * `R[t,i]`: node `i` runs in stage `t`. Backward nodes and the loss run exactly once,
//!   in their own stage (the simulator rejects a second run: a gradient would accumulate
//!   twice), so only `R[t,i]`, `i < t`, of forward nodes are free: forward nodes may be
//!   recomputed. A forward node is pinned to its own stage too if it writes a gradient,
//!   a parameter gradient or a tensor with several producers.
//! * `S[t,d]`: data node `d` is resident from stage `t − 1` into stage `t`.
//! * `FREE[t,d,k]`: `d` is freed in stage `t` right after node `k` (its allocator or a
//!   node that reads it), and `U[t,k]`: the memory in use right after node `k` runs in
//!   stage `t`, before the frees that follow it.
//!
//! The objective is `Σ C_i R[t,i]`, the makespan (node times; the simulator runs compute
//! ops back to back). Constraints, with `a(d)` the allocator of `d`:
//!
//! * dependencies: `R[t,j] ≤ R[t,a(d)] + S[t,d]` for each `d` node `j` reads;
//! * persistence: `S[t+1,d] ≤ S[t,d] + R[t,a(d)]` (`S[0,·] = 0` since `S[t,d] = 0` for
//!   `t ≤ a(d)`);
//! * `R[t,a(d)] + S[t,d] ≤ 1`: a forward node is not recomputed while one of its outputs
//!   is still resident (the simulator calls that `AlreadyResident`);
//! * `FREE[t,d,k] = R[t,k] · (1 − S[t+1,d]) · Π_{u ∈ USERS[d], k < u ≤ t} (1 − R[t,u])`,
//!   linearized as in the paper: with `h = (1 − R[t,k]) + S[t+1,d] + Σ_{u > k} R[t,u]`
//!   and `κ` the largest value `h` can take, `1 − FREE ≤ h` and `κ (1 − FREE) ≥ h`; plus
//!   one row per hazard (`FREE ≤ R[t,k]`, `FREE ≤ 1 − S[t+1,d]`, `FREE ≤ 1 − R[t,u]`),
//!   which admit the same integer points but a much tighter relaxation;
//! * memory: `U[t,k] = U[t,k⁻] − Σ_d M_d FREE[t,d,k⁻] + R[t,k] A_k` (`k⁻` the previous node
//!   that may run in stage `t`; the first `U` of a stage is `Σ_d M_d S[t,d] + R[t,k] A_k`),
//!   and `U[t,k] + tmp_k R[t,k] ≤ budget − fixed`, where `fixed` is what is resident from
//!   the start, never freed: the static memory (parameters, their gradients, optimizer
//!   states) and the step's inputs (`TrainingGraph::fixed_bytes`).
//!
//! This is exactly the simulator's count: its peak is the maximum over compute ops of
//! what is resident before the op, plus the op's outputs, plus its temporary memory.
//!
//! # From the paper's nodes to pebble's graph
//!
//! A Checkmate node has one output of size `M_i`. A compute node here has several (a
//! forward's activation and the tensors it saves for its backward; a backward's input
//! gradient and parameter gradients), with different lifetimes: an activation may die
//! at the next forward while the saved tensors live until the backward. So `S` and
//! `FREE` are per data node, and `M_i` becomes `A_k`, the size of the non-static outputs
//! node `k` allocates. With one output per node this is the paper's ILP. Also:
//!
//! * a gradient with several producers is allocated by the first and accumulated into
//!   by the others, which therefore read it (they are in `USERS[d]`) and allocate
//!   nothing; since backward nodes run once, it stays resident from its first producer
//!   to its last reader;
//! * a gradient nobody reads (an input's) is an output of the step: resident from its
//!   producer to the end, as in `store-all`;
//! * parameters, parameter gradients, optimizer states and inputs are never freed; but
//!   parameter gradients that the backward makes (`param_grads_from_backward`, as
//!   pebble.torch's captures say) count from their first producer on, as the simulator
//!   counts them, like the input's gradient.
//!
//! Two exact reductions keep the ILP smaller: a forward node `i` can usefully run in stage
//! `t` only if some reader of its outputs can still run at or after `t` (so `R[t,i] = 0`
//! past that), and `S[t,d] = 0` past the last stage a reader of `d` can run in.
//!
//! # Schedule
//!
//! Stage by stage, the nodes with `R[t,i] = 1` run in list order, forward nodes with grad
//! (so their saved outputs exist). Each data node is freed right after its last use before
//! it is produced again (or the step ends): where `FREE` says, except that a tensor the
//! ILP carries into a stage where nobody reads it and then drops (which the ILP counts
//! until the end of that stage) is freed earlier. The schedule's memory is thus never
//! above the ILP's count. The solver simulates it anyway (ILPs solve in floating point
//! with tolerances) and, should the simulated peak exceed the budget, solves again with
//! the excess taken off the budget.
//!
//! # Solving
//!
//! HiGHS solves the ILP, under `SolveOptions::time_limit`, from a warm start: a
//! recompute-only plan that fits the budget in the ILP's own count, given as values of
//! `R` and `S` (`FREE` and `U` are what they imply) where it satisfies every row; HiGHS
//! checks it and keeps it as its incumbent, so Checkmate's plan is never worse in the
//! ILP's objective than the start. When the store-all schedule fits, it is the start (it
//! is then optimal: no recomputation). Otherwise the start is the faster of two plans put
//! in stages, each where it fits: DTR's replay (stage `t` reruns, in list order and once
//! each, the nodes DTR reruns between the first runs of nodes `t − 1` and `t`; with grad,
//! so its count is not DTR's), and recompute-all (each stage reruns every forward node it
//! may); each pruned: every rerun dropped, costliest first, that the budget still allows.
//! Without a start, HiGHS found no feasible point at tight budgets on small captured
//! graphs (a U-Net of 63 nodes in 10 s, transformers' GPT-2 of 73 in 120 s) where DTR has
//! plans. At the time limit the best incumbent is returned (not proven optimal); with
//! none (no start fits), `TooLarge` (the problem is beyond this solver in that time;
//! `Infeasible` would send `pebble plan` bisecting for the least feasible budget, one ILP
//! per probe). `Infeasible` means proven: by HiGHS, or before any solve because some node
//! alone (its inputs, outputs and temporary memory on top of the fixed memory) exceeds
//! the budget. The ILP has `O(n · |E|)` binaries: `docs/benchmarks.md` shows how the
//! solve time grows with depth.

use std::collections::HashMap;
use std::time::Instant;

use highs::Col;
use pebble_graph::{ComputeKind, DataKind, TrainingGraph};
use pebble_schedule::{Op, Schedule, Tensor, View};
use pebble_solve::baseline::dtr::dtr_schedule;
use pebble_solve::{Problem, SolveError, SolveOptions, Solver};

use crate::milp::{Bin, Lin, Milp, Outcome};
use crate::IlpError;

/// The Checkmate ILP (see the module docs).
pub struct Checkmate;

/// The most columns the solver agrees to build.
pub const MAX_COLUMNS: usize = 2_000_000;

impl Solver for Checkmate {
    fn name(&self) -> &'static str {
        "checkmate"
    }

    fn description(&self) -> &'static str {
        "Checkmate's ILP (Jain et al. 2020): recompute forward nodes in n stages, solved with HiGHS"
    }

    fn views(&self) -> &'static [View] {
        &[View::Graph]
    }

    fn solve(&self, problem: Problem<'_>, budget: u64, options: &SolveOptions) -> Result<Schedule, SolveError> {
        let g = problem.graph_for("checkmate")?;
        solve_graph(g, budget, options)
    }
}

inventory::submit!(pebble_solve::Registration(&Checkmate));

/// Plans `g` within `budget` bytes with the Checkmate ILP.
pub fn solve_graph(g: &TrainingGraph, budget: u64, options: &SolveOptions) -> Result<Schedule, SolveError> {
    let started = Instant::now();
    let infeasible = |reason: String| SolveError::Infeasible { budget, reason };
    let inst = Instance::new(g).map_err(|e| infeasible(e.to_string()))?;
    if let Some(reason) = inst.obviously_infeasible(budget) {
        return Err(infeasible(reason));
    }
    let size = inst.size();
    if size > MAX_COLUMNS {
        return Err(SolveError::TooLarge {
            solver: "checkmate",
            why: format!("the ILP of {} nodes would have about {size} columns (limit {MAX_COLUMNS})", inst.n),
        });
    }
    let gave_up = |slack| {
        format!("the ILP's schedules exceed the budget in simulation even {slack} bytes below it (numerical tolerance)")
    };
    // Rounding: each retry takes the excess off the budget and solves again, within what
    // is left of the time limit.
    crate::within_budget(g, budget, options, gave_up, |slack| {
        let remaining = options.time_limit.map(|l| (l - started.elapsed().as_secs_f64()).max(0.0));
        match inst.solve(budget.saturating_sub(slack), remaining) {
            Ok((seq, optimal)) => Ok(inst.schedule(&seq).with_optimal(optimal)),
            Err(IlpError::Infeasible) => Err(infeasible(format!(
                "the Checkmate ILP ({} stages) has no solution ({} bytes are fixed: static memory and inputs)",
                inst.n, inst.fixed
            ))),
            Err(e @ IlpError::NoSolution { .. }) => Err(SolveError::TooLarge {
                solver: "checkmate",
                why: format!(
                    "its ILP ({} stages) hit its time limit without a plan ({e}), and Checkmate keeps no incumbent \
                     at this budget (none of its warm starts fits: store-all, DTR's plan or recompute-all, in its \
                     stages): give it more time, or plan with hiremate, which keeps Rockmate's and PyTorch's plans",
                    inst.n
                ),
            }),
            Err(e) => Err(infeasible(e.to_string())),
        }
    })
}

/// Checkmate's warm start at `budget` as a schedule, where one fits (see # Solving): a
/// plan in tenths of a second, which HiRemate keeps as an incumbent. `None` where none
/// fits, or the graph is beyond Checkmate ([`MAX_COLUMNS`]).
pub fn start_schedule(g: &TrainingGraph, budget: u64) -> Option<Schedule> {
    let inst = Instance::new(g).ok()?;
    if inst.size() > MAX_COLUMNS || inst.obviously_infeasible(budget).is_some() {
        return None;
    }
    let start = inst.warm_start(budget);
    (inst.start_peak(&start) <= budget).then(|| inst.schedule(&start.sequence()))
}

/// Why no recomputing plan fits `budget`, where some compute node alone, at its run with
/// grad (which every plan has: the backward reads what the forward saves), needs more: its
/// inputs, outputs and temporary memory on top of the fixed memory and the gradients kept
/// to the end. `None` where each fits, or the graph is invalid.
pub fn below_every_plan(g: &TrainingGraph, budget: u64) -> Option<String> {
    Instance::new(g).ok()?.obviously_infeasible(budget)
}

/// What the ILP knows of a graph: which nodes may run again, who allocates and who
/// reads each data node.
pub(crate) struct Instance<'g> {
    g: &'g TrainingGraph,
    /// Compute nodes (= stages).
    n: usize,
    /// Runs exactly once, in its own stage.
    once: Vec<bool>,
    /// The last stage in which the node may usefully run.
    last: Vec<usize>,
    /// For a tracked data node (not resident from the start): its allocator, the first producer.
    alloc: Vec<Option<usize>>,
    /// Nodes that read each tracked data node or accumulate into it, sorted.
    users: Vec<Vec<usize>>,
    /// A gradient nobody reads, or a parameter gradient made by the backward: resident
    /// from its (first) producer to the end.
    pinned: Vec<bool>,
    /// The last stage into which a tracked data node may be carried.
    s_last: Vec<usize>,
    /// The tracked data each node allocates.
    allocates: Vec<Vec<usize>>,
    /// The tracked data that must be resident for each node (its inputs, and the gradients
    /// it accumulates into).
    needs: Vec<Vec<usize>>,
    /// Fixed bytes: what is resident from the start (`TrainingGraph::fixed_bytes`).
    fixed: u64,
}

/// The ILP's columns for `R` and `S`.
struct Cols {
    /// `r[k][t − k − 1]`: `R[t,k]` for `k < t ≤ last[k]` (recomputable nodes only).
    r: Vec<Vec<Col>>,
    /// `s[d][t − a(d) − 1]`: `S[t,d]` for `a(d) < t ≤ s_last[d]` (not pinned).
    s: Vec<Vec<Col>>,
}

impl<'g> Instance<'g> {
    pub(crate) fn new(g: &'g TrainingGraph) -> Result<Instance<'g>, IlpError> {
        g.validate().map_err(|e| IlpError::InvalidGraph(e.to_string()))?;
        let n = g.compute.len();
        let nd = g.data.len();
        let tracked = |d: usize| !g.resident_from_start(d);
        let mut producers: Vec<Vec<usize>> = vec![Vec::new(); nd];
        for (k, c) in g.compute.iter().enumerate() {
            for &d in &c.outputs {
                if producers[d].last() != Some(&k) {
                    producers[d].push(k);
                }
            }
        }
        let mut once: Vec<bool> = g.compute.iter().map(|c| c.kind != ComputeKind::Forward).collect();
        let mut alloc = vec![None; nd];
        let mut users: Vec<Vec<usize>> = vec![Vec::new(); nd];
        let mut allocates: Vec<Vec<usize>> = vec![Vec::new(); n];
        let mut needs: Vec<Vec<usize>> = vec![Vec::new(); n];
        for (d, p) in producers.iter().enumerate() {
            let kind = g.data[d].kind;
            if p.len() > 1 || matches!(kind, DataKind::Gradient | DataKind::ParamGrad) {
                for &k in p {
                    once[k] = true;
                }
            }
            if !tracked(d) {
                continue;
            }
            if let Some((&first, rest)) = p.split_first() {
                alloc[d] = Some(first);
                allocates[first].push(d);
                for &k in rest {
                    users[d].push(k);
                    needs[k].push(d);
                }
            }
        }
        for (k, c) in g.compute.iter().enumerate() {
            for &d in &c.inputs {
                if tracked(d) && !needs[k].contains(&d) {
                    users[d].push(k);
                    needs[k].push(d);
                }
            }
        }
        for u in &mut users {
            u.sort_unstable();
            u.dedup();
        }
        let pinned: Vec<bool> = (0..nd)
            .map(|d| {
                let kind = g.data[d].kind;
                alloc[d].is_some() && (kind == DataKind::ParamGrad || users[d].is_empty() && kind == DataKind::Gradient)
            })
            .collect();
        // The last useful stage, from the end: a backward node's is its own; a forward
        // node's is the last of the readers of what it allocates.
        let mut last: Vec<usize> = (0..n).collect();
        for k in (0..n).rev() {
            if once[k] {
                continue;
            }
            let readers = allocates[k].iter().flat_map(|&d| users[d].iter());
            last[k] = readers.map(|&u| last[u]).fold(k, usize::max);
        }
        let s_last: Vec<usize> = (0..nd).map(|d| users[d].iter().map(|&u| last[u]).max().unwrap_or(0)).collect();
        let fixed = g.fixed_bytes();
        Ok(Instance { g, n, once, last, alloc, users, pinned, s_last, allocates, needs, fixed })
    }

    fn size_of(&self, d: usize) -> u64 {
        self.g.data[d].size
    }

    /// `A_k`: the bytes node `k` allocates.
    fn alloc_bytes(&self, k: usize) -> u64 {
        self.allocates[k].iter().map(|&d| self.size_of(d)).sum()
    }

    /// Whether `R[t,k]` may be 1.
    fn may_run(&self, t: usize, k: usize) -> bool {
        k == t || (k < t && !self.once[k] && t <= self.last[k])
    }

    /// The nodes that may run in stage `t`, in order.
    fn active(&self, t: usize) -> Vec<usize> {
        (0..=t).filter(|&k| self.may_run(t, k)).collect()
    }

    fn r(&self, cols: &Cols, t: usize, k: usize) -> Bin {
        if k == t {
            Bin::One
        } else if self.may_run(t, k) {
            Bin::Var(cols.r[k][t - k - 1])
        } else {
            Bin::Zero
        }
    }

    fn s(&self, cols: &Cols, t: usize, d: usize) -> Bin {
        match self.alloc[d] {
            Some(a) if t > a && self.pinned[d] => Bin::One,
            Some(a) if t > a && t <= self.s_last[d] => Bin::Var(cols.s[d][t - a - 1]),
            _ => Bin::Zero,
        }
    }

    /// A reason the budget is infeasible that needs no ILP: some node, at its first run,
    /// needs more than the budget for its inputs, outputs and temporary memory on top of
    /// the fixed memory and the gradients that stay to the end.
    fn obviously_infeasible(&self, budget: u64) -> Option<String> {
        for (k, c) in self.g.compute.iter().enumerate() {
            let pinned: u64 = (0..self.g.data.len())
                .filter(|&d| self.pinned[d] && self.alloc[d].is_some_and(|a| a < k))
                .map(|d| self.size_of(d))
                .sum();
            let reads: u64 = self.needs[k].iter().map(|&d| self.size_of(d)).sum();
            let need = self.fixed + pinned + reads + self.alloc_bytes(k) + c.tmp;
            if need > budget {
                return Some(format!(
                    "compute node {k} `{}` alone needs {need} bytes: {} fixed (static memory and inputs), {reads} of \
                     tensors it reads, {} it allocates, {} temporary{}",
                    c.name,
                    self.fixed,
                    self.alloc_bytes(k),
                    c.tmp,
                    if pinned > 0 { format!(", {pinned} of gradients kept to the end") } else { String::new() }
                ));
            }
        }
        None
    }

    /// About how many columns the ILP has.
    fn size(&self) -> usize {
        let stages = |k: usize| if self.once[k] { 1 } else { self.last[k] - k + 1 };
        let r: usize = (0..self.n).map(|k| stages(k) - 1).sum();
        let s: usize =
            (0..self.g.data.len()).filter_map(|d| self.alloc[d].map(|a| self.s_last[d].saturating_sub(a))).sum();
        let per_stage: usize =
            (0..self.n).map(|k| stages(k) * (1 + self.allocates[k].len() + self.needs[k].len())).sum();
        r + s + per_stage
    }

    /// Builds and solves the ILP for `budget` bytes from [`Instance::warm_start`].
    fn solve(&self, budget: u64, time_limit: Option<f64>) -> Result<(Vec<usize>, bool), IlpError> {
        self.solve_from(&self.warm_start(budget), budget, time_limit)
    }

    /// Builds and solves the ILP for `budget` bytes, HiGHS given `start` if it satisfies
    /// every row; returns the compute sequence, and whether HiGHS proved it optimal. The
    /// constraint families go stage by stage, in the order below (HiGHS's search can
    /// depend on the order of the rows).
    fn solve_from(&self, start: &Start, budget: u64, time_limit: Option<f64>) -> Result<(Vec<usize>, bool), IlpError> {
        let mut ilp = CheckmateIlp::new(self, budget, start)?;
        for t in 0..self.n {
            let act = self.active(t);
            ilp.dependencies(t, &act);
            ilp.persistence(t);
            ilp.memory(t, &act);
        }
        ilp.solve(time_limit)
    }

    /// The schedule of a compute sequence: each node with grad, each tracked data node
    /// freed right after its last use before it is allocated again (pinned gradients,
    /// inputs and static data never). Frees after one node come in data-id order.
    pub(crate) fn schedule(&self, seq: &[usize]) -> Schedule {
        let nd = self.g.data.len();
        let mut frees_after: Vec<Vec<usize>> = vec![Vec::new(); seq.len()];
        let mut last_event: Vec<Option<usize>> = vec![None; nd];
        for (p, &k) in seq.iter().enumerate() {
            for &d in &self.allocates[k] {
                if let Some(q) = last_event[d].replace(p) {
                    if !self.pinned[d] {
                        frees_after[q].push(d);
                    }
                }
            }
            for &d in &self.needs[k] {
                last_event[d] = Some(p);
            }
        }
        for (d, q) in last_event.iter().enumerate() {
            if let (Some(q), false) = (q, self.pinned[d]) {
                frees_after[*q].push(d);
            }
        }
        let mut ops = Vec::with_capacity(seq.len() * 2);
        for (&k, frees) in seq.iter().zip(&mut frees_after) {
            frees.sort_unstable();
            ops.push(Op::Compute { node: k, no_grad: false });
            ops.extend(frees.iter().map(|&d| Op::Free { tensor: Tensor::Data(d) }));
        }
        Schedule::new(View::Graph, ops)
    }
}

/// A plan the ILP starts from: the nodes each stage runs (`R`) and the data resident
/// before each stage (`S`), in the ILP's own terms.
struct Start {
    /// `stages[t]`: the nodes stage `t` runs, in list order (node `t` last).
    stages: Vec<Vec<usize>>,
    /// `resident[d][t]`: `S[t,d]`, for `t` in `0..=n` (pinned gradients included).
    resident: Vec<Vec<bool>>,
}

impl Start {
    /// Whether stage `t` runs node `k`: `R[t,k]`.
    fn runs(&self, t: usize, k: usize) -> bool {
        self.stages[t].binary_search(&k).is_ok()
    }

    /// The compute sequence.
    fn sequence(&self) -> Vec<usize> {
        self.stages.concat()
    }
}

impl Instance<'_> {
    /// The ILP's start at `budget` (see the module doc, # Solving): store-all's where it
    /// fits; else the faster of DTR's plan and recompute-all, each in stages, fitting the
    /// budget in the ILP's count, and pruned ([`Instance::prune`]); else store-all's
    /// (which does not fit, and HiGHS does not get).
    fn warm_start(&self, budget: u64) -> Start {
        let store_all = self.start_of((0..self.n).map(|t| vec![t]).collect());
        if self.start_peak(&store_all) <= budget {
            return store_all;
        }
        let recompute_all = (0..self.n).map(|t| self.active(t)).collect();
        let time = |s: &Start| s.sequence().iter().map(|&k| self.g.compute[k].time).sum::<f64>();
        [self.dtr_stages(budget), Some(recompute_all)]
            .into_iter()
            .flatten()
            .map(|stages| self.start_of(stages))
            .filter(|s| self.start_peak(s) <= budget)
            .map(|s| self.prune(s, budget))
            .min_by(|a, b| time(a).total_cmp(&time(b)))
            .unwrap_or(store_all)
    }

    /// DTR's plan at `budget` in stages ([`Instance::staged`]); `None` if DTR has none.
    fn dtr_stages(&self, budget: u64) -> Option<Vec<Vec<usize>>> {
        let replayed = dtr_schedule(self.g, budget).ok()?;
        let seq: Vec<usize> = (replayed.ops.iter())
            .filter_map(|op| if let Op::Compute { node, .. } = op { Some(*node) } else { None })
            .collect();
        self.staged(&seq)
    }

    /// A compute sequence (first runs in list order, recomputations between them) in
    /// stages: stage `t` reruns, in list order and once each, the nodes rerun between
    /// the first runs of nodes `t − 1` and `t`, less those that may not run in it (no
    /// reader of their outputs is left). `None` if the first runs are out of order or a
    /// node that runs once runs again.
    fn staged(&self, seq: &[usize]) -> Option<Vec<Vec<usize>>> {
        let mut stages: Vec<Vec<usize>> = vec![Vec::new(); self.n];
        let mut t = 0;
        for &k in seq {
            if k == t {
                stages[t].push(k);
                t += 1;
            } else if k > t || self.once[k] {
                return None;
            } else if t < self.n && self.may_run(t, k) {
                stages[t].push(k);
            }
        }
        if t < self.n {
            return None;
        }
        for run in &mut stages {
            run.sort_unstable();
            run.dedup();
        }
        Some(stages)
    }

    /// Drops the reruns of `start`, costliest first, each that `budget` still allows (the
    /// data it made then stays from its previous run): a faster start, as valid. A rerun
    /// changes `S` of what its node reads and makes only, so each try recounts those and
    /// the stages where they change.
    fn prune(&self, mut start: Start, budget: u64) -> Start {
        let time = |k: usize| self.g.compute[k].time;
        let mut reruns: Vec<(usize, usize)> =
            (0..self.n).flat_map(|t| start.stages[t].iter().filter(move |&&k| k < t).map(move |&k| (t, k))).collect();
        reruns.sort_by(|a, b| time(b.1).total_cmp(&time(a.1)));
        let mut peaks: Vec<u64> = (0..self.n).map(|t| self.stage_peak(&start, t)).collect();
        for (t, k) in reruns {
            let i = start.stages[t].binary_search(&k).expect("a rerun of the start");
            start.stages[t].remove(i);
            let mut touched: Vec<usize> = self.allocates[k].iter().chain(&self.needs[k]).copied().collect();
            touched.sort_unstable();
            touched.dedup();
            let before: Vec<Vec<bool>> = touched
                .iter()
                .map(|&d| std::mem::replace(&mut start.resident[d], self.resident_of(&start.stages, d)))
                .collect();
            // Stage `u`'s count reads `S[u]` and `S[u+1]`.
            let mut hit = vec![t];
            for (&d, old) in touched.iter().zip(&before) {
                let changed = (0..=self.n).filter(|&u| old[u] != start.resident[d][u]);
                hit.extend(changed.flat_map(|u| [u.saturating_sub(1), u]).filter(|&u| u < self.n));
            }
            hit.sort_unstable();
            hit.dedup();
            let old_peaks: Vec<u64> =
                hit.iter().map(|&u| std::mem::replace(&mut peaks[u], self.stage_peak(&start, u))).collect();
            if self.fixed + peaks.iter().max().copied().unwrap_or(0) > budget {
                start.stages[t].insert(i, k);
                touched.iter().zip(before).for_each(|(&d, old)| start.resident[d] = old);
                hit.iter().zip(old_peaks).for_each(|(&u, p)| peaks[u] = p);
            }
        }
        start
    }

    /// The start that runs `stages` ([`Instance::resident_of`]).
    fn start_of(&self, stages: Vec<Vec<usize>>) -> Start {
        let resident = (0..self.g.data.len()).map(|d| self.resident_of(&stages, d)).collect();
        Start { stages, resident }
    }

    /// `S[·,d]` for `stages`: `d` resident from the stage after each production to its
    /// last use before it is produced again (a pinned gradient to the end).
    fn resident_of(&self, stages: &[Vec<usize>], d: usize) -> Vec<bool> {
        let mut kept = vec![false; self.n + 1];
        let Some(a) = self.alloc[d] else { return kept };
        let runs = |t: usize, k: usize| stages[t].binary_search(&k).is_ok();
        // The latest production's stage, and its last use's since.
        let mut open: Option<(usize, usize)> = None;
        let mut close = |(from, to): (usize, usize)| kept[from + 1..=to].fill(true);
        for t in a..self.n {
            // The allocator precedes every user in list order, so in a stage too.
            if runs(t, a) {
                if let Some(o) = open.replace((t, t)) {
                    close(o);
                }
            }
            if let Some((_, used)) = &mut open {
                if self.users[d].iter().any(|&u| runs(t, u)) {
                    *used = t;
                }
            }
        }
        if let Some((from, used)) = open {
            close((from, if self.pinned[d] { self.n } else { used }));
        }
        kept
    }

    /// The most memory the ILP counts for `start`, fixed bytes included.
    fn start_peak(&self, start: &Start) -> u64 {
        self.fixed + (0..self.n).map(|t| self.stage_peak(start, t)).max().unwrap_or(0)
    }

    /// The most memory the ILP counts in stage `t` of `start`, fixed bytes excluded: what
    /// is resident before the stage, plus what each node allocates and its temporary
    /// memory, less what `FREE` frees after each node (the rows of [`CheckmateIlp::memory`]).
    fn stage_peak(&self, start: &Start, t: usize) -> u64 {
        let (run, resident) = (&start.stages[t], &start.resident);
        // The position in the stage of the last node that reads each data node.
        let mut last_read: HashMap<usize, usize> = HashMap::new();
        for (i, &k) in run.iter().enumerate() {
            last_read.extend(self.needs[k].iter().map(|&d| (d, i)));
        }
        let mut mem: u64 = (0..self.g.data.len()).filter(|&d| resident[d][t]).map(|d| self.size_of(d)).sum();
        let mut peak = 0;
        for (i, &k) in run.iter().enumerate() {
            mem += self.alloc_bytes(k);
            peak = peak.max(mem + self.g.compute[k].tmp);
            for &d in self.allocates[k].iter().chain(&self.needs[k]) {
                let read_later = last_read.get(&d).is_some_and(|&j| j > i);
                if !(self.pinned[d] || resident[d][t + 1] || read_later) {
                    mem = mem.saturating_sub(self.size_of(d));
                }
            }
        }
        peak
    }
}

/// The ILP of [`Instance::solve`] under construction: the model, the columns `R` and `S`
/// (a [`Start`]'s values their warm start), and the units. Each method adds one family of
/// the module doc's constraints for one stage.
struct CheckmateIlp<'a, 'g> {
    inst: &'a Instance<'g>,
    m: Milp,
    cols: Cols,
    /// Bytes per memory unit: the budget is about 10⁴ units (HiGHS's tolerances are
    /// absolute).
    mu: f64,
    /// The budget less the fixed bytes, in units.
    cap: f64,
    /// Whether the start's values satisfy every row so far: then HiGHS starts from them.
    start_fits: bool,
    /// Whether a constant row breaks: the ILP has no solution.
    structural: bool,
}

impl<'a, 'g> CheckmateIlp<'a, 'g> {
    /// The units, and the columns `R` (recomputable nodes only) and `S` (not pinned), at
    /// `start`'s values.
    fn new(inst: &'a Instance<'g>, budget: u64, start: &Start) -> Result<CheckmateIlp<'a, 'g>, IlpError> {
        let (n, nd) = (inst.n, inst.g.data.len());
        let avail = budget.checked_sub(inst.fixed).ok_or(IlpError::Infeasible)?;
        // Units: memory so that the budget is about 10⁴ units, time so that the slowest
        // node takes 1 (HiGHS's tolerances are absolute).
        let largest = (0..nd).filter(|&d| inst.alloc[d].is_some()).map(|d| inst.size_of(d)).max().unwrap_or(0);
        let mu = (avail.max(largest) as f64 / 1e4).max(1.0);
        let tu = inst.g.compute.iter().map(|c| c.time).fold(0.0, f64::max);
        let tu = if tu > 0.0 { tu } else { 1.0 };

        let mut m = Milp::new();
        let mut cols = Cols { r: Vec::with_capacity(n), s: Vec::with_capacity(nd) };
        let bit = |b: bool| f64::from(u8::from(b));
        for k in 0..n {
            let last = if inst.once[k] { k } else { inst.last[k] };
            let cost = inst.g.compute[k].time / tu;
            cols.r.push((k + 1..=last).map(|t| m.binary(cost, bit(start.runs(t, k)))).collect());
        }
        for d in 0..nd {
            let v = match inst.alloc[d] {
                Some(a) if !inst.pinned[d] => {
                    (a + 1..=inst.s_last[d]).map(|t| m.binary(0.0, bit(start.resident[d][t]))).collect()
                }
                _ => Vec::new(),
            };
            cols.s.push(v);
        }
        Ok(CheckmateIlp { inst, m, cols, mu, cap: avail as f64 / mu, start_fits: true, structural: false })
    }

    /// `bytes` in memory units.
    fn mem(&self, bytes: u64) -> f64 {
        bytes as f64 / self.mu
    }

    fn r(&self, t: usize, k: usize) -> Bin {
        self.inst.r(&self.cols, t, k)
    }

    fn s(&self, t: usize, d: usize) -> Bin {
        self.inst.s(&self.cols, t, d)
    }

    /// Adds `lo ≤ e ≤ hi`, or checks it when `e` is constant; and checks the start on it,
    /// to about 10⁻⁹ (HiGHS's own check of the start allows 10⁻⁶).
    fn row(&mut self, lo: f64, e: &Lin, hi: f64) {
        let v = e.eval(self.m.start_values());
        let tol = 1e-9 + 1e-12 * v.abs();
        self.start_fits &= lo - tol <= v && v <= hi + tol;
        if e.is_constant() {
            self.structural |= !Milp::holds(lo, e, hi);
        } else {
            self.m.row(lo, e, hi);
        }
    }

    /// Dependencies in stage `t`, `R[t,j] ≤ R[t,a(d)] + S[t,d]`, and no recomputation
    /// over a resident output, `R[t,a(d)] + S[t,d] ≤ 1`.
    fn dependencies(&mut self, t: usize, act: &[usize]) {
        let inst = self.inst;
        for &j in act {
            for &d in &inst.needs[j] {
                let Some(a) = inst.alloc[d] else { continue };
                let mut e = Lin::default();
                e.add_bin(self.r(t, j), 1.0).add_bin(self.r(t, a), -1.0).add_bin(self.s(t, d), -1.0);
                self.row(f64::NEG_INFINITY, &e, 0.0);
            }
            if j < t {
                for &d in &inst.allocates[j] {
                    let mut e = Lin::default();
                    e.add_bin(self.r(t, j), 1.0).add_bin(self.s(t, d), 1.0);
                    self.row(f64::NEG_INFINITY, &e, 1.0);
                }
            }
        }
    }

    /// Persistence into stage `t + 1`: `S[t+1,d] ≤ S[t,d] + R[t,a(d)]`.
    fn persistence(&mut self, t: usize) {
        for d in 0..self.inst.g.data.len() {
            if let (Some(a), Bin::Var(next)) = (self.inst.alloc[d], self.s(t + 1, d)) {
                let mut e = Lin::default();
                e.add_col(next, 1.0).add_bin(self.s(t, d), -1.0).add_bin(self.r(t, a), -1.0);
                self.row(f64::NEG_INFINITY, &e, 0.0);
            }
        }
    }

    /// Memory along stage `t`: `U[t,k]`, what is resident after node `k` runs (before
    /// the frees that follow it), one column per node; `U[t,k] + tmp_k R[t,k]` within the
    /// budget; then `FREE[t,d,k]` for what `k` allocates or reads.
    fn memory(&mut self, t: usize, act: &[usize]) {
        let inst = self.inst;
        let mut prev = Lin::default();
        for d in 0..inst.g.data.len() {
            prev.add_bin(self.s(t, d), self.mem(inst.size_of(d)));
        }
        for &k in act {
            let rk = self.r(t, k);
            let mut e = prev.clone();
            e.add_bin(rk, self.mem(inst.alloc_bytes(k)));
            let u = self.m.continuous(0.0, 0.0, f64::INFINITY, e.eval(self.m.start_values()));
            let mut def = e.clone();
            def.add_col(u, -1.0);
            self.row(0.0, &def, 0.0);
            let mut peak = Lin::default();
            peak.add_col(u, 1.0).add_bin(rk, self.mem(inst.g.compute[k].tmp));
            self.row(f64::NEG_INFINITY, &peak, self.cap);
            prev = Lin::default();
            prev.add_col(u, 1.0);
            for &d in inst.allocates[k].iter().chain(&inst.needs[k]) {
                if inst.pinned[d] {
                    continue;
                }
                let free = self.free(t, k, d);
                prev.add_bin(free, -self.mem(inst.size_of(d)));
            }
        }
    }

    /// `FREE[t,d,k]`, linearized with `h` and `κ`, plus one row per hazard.
    fn free(&mut self, t: usize, k: usize, d: usize) -> Bin {
        let rk = self.r(t, k);
        // h = (1 − R[t,k]) + S[t+1,d] + Σ_{u ∈ USERS[d], k < u ≤ t} R[t,u]
        let mut h = Lin::constant(1.0);
        h.add_bin(rk, -1.0).add_bin(self.s(t + 1, d), 1.0);
        for &u in self.inst.users[d].iter().filter(|&&u| u > k && u <= t) {
            h.add_bin(self.r(t, u), 1.0);
        }
        if h.is_constant() {
            return if h.constant.abs() < 0.5 { Bin::One } else { Bin::Zero };
        }
        let start = f64::from(u8::from(h.eval(self.m.start_values()).abs() < 0.5));
        let f = self.m.binary(0.0, start);
        let kappa = h.max_binary();
        // 1 − FREE ≤ h  and  κ (1 − FREE) ≥ h.
        let mut lo = h.clone();
        lo.add_col(f, 1.0);
        self.row(1.0, &lo, f64::INFINITY);
        let mut hi = h.clone();
        hi.add_col(f, kappa);
        self.row(f64::NEG_INFINITY, &hi, kappa);
        // The same upper bound, one hazard at a time: FREE ≤ 1 − x for
        // each hazard x of h (valid, and far tighter in the relaxation).
        for &(x, coef) in &h.terms {
            let mut e = Lin::default();
            e.add_col(f, 1.0).add_col(x, coef);
            let bound = if coef > 0.0 { 1.0 } else { 1.0 + coef };
            self.row(f64::NEG_INFINITY, &e, bound);
        }
        Bin::Var(f)
    }

    /// Solves under `time_limit`, and reads the compute sequence off the solution.
    fn solve(self, time_limit: Option<f64>) -> Result<(Vec<usize>, bool), IlpError> {
        if self.structural {
            return Err(IlpError::Infeasible);
        }
        // HiGHS's default gaps, stated: optimal within 0.01% of the recomputation time, or
        // within a millionth of the slowest node's time (the objective's unit).
        let options = [("mip_rel_gap", 1e-4), ("mip_abs_gap", 1e-6)];
        let (cols_values, optimal) = match self.m.solve(time_limit, self.start_fits, &options)? {
            Outcome::Optimal(v) => (v, true),
            Outcome::Incumbent(v, ..) => (v, false),
        };
        let mut seq = Vec::new();
        for t in 0..self.inst.n {
            for k in self.inst.active(t) {
                if self.inst.r(&self.cols, t, k).value(&cols_values) {
                    seq.push(k);
                }
            }
        }
        Ok((seq, optimal))
    }
}

#[cfg(test)]
mod tests;
