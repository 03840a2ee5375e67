//! Activation offloading on chains (Shilova's thesis, Part II, Ch. 3): keep every
//! activation (`F^all` everywhere, no recomputation), and move some saved sets `ā_ℓ` to
//! host memory during the forward pass and back before their backward.
//!
//! * [`lower_bound`] (`offload-bound`): Proposition 3, `max(Σu, Q/β↓ + Q/β↑)` with
//!   `Q = M_peak − M` the least data any schedule offloads (the thesis's `2Q/β` on one
//!   link of rate `β`; the OCR's "2^{…}" is a factor 2). A time, with no schedule.
//! * `offload-greedy`: GREEDY, the eager, ordered, no-wait schedule offloading whole
//!   `ā_0 … ā_k`, `k` the least index with `Σ_{ℓ≤k} ā_ℓ ≥ Q` (§3.3.1).
//! * `offload-dp`: DYNPROG, Algorithm 5 under O.7″ ([`dynprog`]), then the no-wait
//!   ordered schedule offloading whole the activations it picks.
//!
//! # The thesis's notation on pebble's chain
//!
//! Layers are `1..=n`, `n = L + 1` the loss; layer `ℓ` is pebble's stage `ℓ − 1`, so
//! `u_{F_ℓ} = ftime[ℓ−1]`, `o_{F_ℓ} = ftmp[ℓ−1]`, `u_{B_ℓ} = btime[ℓ−1]`,
//! `o_{B_ℓ} = btmp[ℓ−1]`, `ā_ℓ = xbar[ℓ]` (`ā_0 = a_0 = x[0]`), `δ_ℓ = x[ℓ]`. The loss runs
//! forward and backward in one op: `u_{F_n} = 0`, `o_{F_n} = 0`, `ā_n = δ_n = 0`. `M` is the
//! budget less the static bytes. (3.1)–(3.3):
//!
//! ```text
//! 𝓜_{F_ℓ} = o_{F_ℓ} + ā_ℓ          𝓜_{B_ℓ} = o_{B_ℓ} + ā_ℓ + δ_ℓ + δ_{ℓ−1}
//! M_peak  = max_ℓ ( max(𝓜_{F_ℓ}, 𝓜_{B_ℓ}) + Σ_{k<ℓ} ā_k )
//! ```
//!
//! # Schedules
//!
//! [`no_wait_schedule`] writes the ordered no-wait schedule of an offload set: the
//! offload of `ā_{ℓ−1}` is issued when `F_ℓ` starts (ops after it in program order run
//! while it moves; the simulator makes a compute op wait for memory, O.3), and the
//! prefetches run in decreasing order, each issued as late as the nominal timeline allows
//! (Proposition 1), then moved later while the simulator finds it over the budget.
//! Solvers never judge a schedule but through the simulator.

pub mod dynprog;
pub mod heuristics;
pub mod pofo;

use pebble_graph::Chain;
use pebble_machine::Machine;
use pebble_schedule::{ForwardMode, Op, Schedule, Tensor, View};
use pebble_sim::{SimConfig, SimError, TransferMemory};

use crate::{Problem, SolveError, SolveOptions, Solver};

/// A chain in the thesis's Part II notation (see the module docs); vectors are indexed
/// by the thesis's layer numbers, `uf[0]` and the like unused.
#[derive(Debug, Clone, PartialEq)]
pub struct OffChain {
    /// Layers, `L + 1` (the last is the loss).
    pub n: usize,
    /// `u_{F_ℓ}`, `ℓ = 1..=n`.
    pub uf: Vec<f64>,
    /// `u_{B_ℓ}`.
    pub ub: Vec<f64>,
    /// `o_{F_ℓ}`.
    pub of: Vec<u64>,
    /// `o_{B_ℓ}`.
    pub ob: Vec<u64>,
    /// `ā_ℓ`, `ℓ = 0..=n`.
    pub abar: Vec<u64>,
    /// `a_ℓ`, `ℓ = 0..=n` (what `F^ck` keeps; pofo needs it).
    pub a: Vec<u64>,
    /// `δ_ℓ`, `ℓ = 0..=n`.
    pub delta: Vec<u64>,
    /// `M`: the budget less the static bytes.
    pub memory: u64,
}

impl OffChain {
    /// The chain in the thesis's notation, for a budget of `budget` bytes (everything
    /// counted). `None` if the static bytes alone exceed the budget.
    pub fn new(chain: &Chain, budget: u64) -> Option<OffChain> {
        let l = chain.len();
        let n = l + 1;
        let memory = budget.checked_sub(chain.static_bytes)?;
        let mut uf = vec![0.0; n + 1];
        let mut of = vec![0; n + 1];
        uf[1..=l].copy_from_slice(&chain.ftime);
        of[1..=l].copy_from_slice(&chain.ftmp);
        let mut ub = vec![0.0; n + 1];
        let mut ob = vec![0; n + 1];
        ub[1..=n].copy_from_slice(&chain.btime);
        ob[1..=n].copy_from_slice(&chain.btmp);
        let mut abar = vec![0; n + 1];
        let mut a = vec![0; n + 1];
        let mut delta = vec![0; n + 1];
        for ell in 0..=l {
            abar[ell] = if ell == 0 { chain.x[0] } else { chain.xbar[ell] };
            a[ell] = chain.x[ell];
            delta[ell] = chain.x[ell];
        }
        Some(OffChain { n, uf, ub, of, ob, abar, a, delta, memory })
    }

    /// `𝓜_{F_ℓ}` (3.1).
    pub fn need_f(&self, ell: usize) -> u128 {
        u128::from(self.of[ell]) + u128::from(self.abar[ell])
    }

    /// `𝓜_{B_ℓ}` (3.2).
    pub fn need_b(&self, ell: usize) -> u128 {
        u128::from(self.ob[ell])
            + u128::from(self.abar[ell])
            + u128::from(self.delta[ell])
            + u128::from(self.delta[ell - 1])
    }

    /// `M_peak` (3.3): the peak of `F^all … B` with nothing offloaded, static bytes aside.
    pub fn peak(&self) -> u128 {
        let mut before = 0u128;
        let mut peak = 0u128;
        for ell in 1..=self.n {
            before += u128::from(self.abar[ell - 1]);
            peak = peak.max(self.need_f(ell).max(self.need_b(ell)) + before);
        }
        peak
    }

    /// `Σ_ℓ (u_{F_ℓ} + u_{B_ℓ})`.
    pub fn compute_time(&self) -> f64 {
        self.uf.iter().sum::<f64>() + self.ub.iter().sum::<f64>()
    }

    /// The least `M` any offloading schedule needs: each layer alone with its input
    /// `ā_{ℓ−1}` (3.8)–(3.9), everything else offloaded.
    pub fn least_memory(&self) -> u128 {
        (1..=self.n)
            .map(|ell| self.need_f(ell).max(self.need_b(ell)) + u128::from(self.abar[ell - 1]))
            .max()
            .unwrap_or(0)
    }

    /// Whether every layer fits alone, its input `ā_{ℓ−1}` resident (3.8)–(3.9) with
    /// nothing else on the device: otherwise no offloading schedule exists.
    pub fn each_layer_fits(&self) -> Result<(), String> {
        for ell in 1..=self.n {
            let input = u128::from(self.abar[ell - 1]);
            let need = self.need_f(ell).max(self.need_b(ell)) + input;
            if need > u128::from(self.memory) {
                return Err(format!(
                    "layer {ell} (stage {}) needs {need} bytes with its input alone, beyond the {} bytes left beside \
                     the static memory",
                    ell - 1,
                    self.memory
                ));
            }
        }
        Ok(())
    }
}

/// Proposition 3: no offloading schedule (without recomputation) of `chain` within
/// `budget` on `machine` takes less than `max(Σu, Q/β↓ + Q/β↑ + latencies)`, with
/// `Q = M_peak − M`. Infeasible if some layer does not fit even alone.
pub fn lower_bound(chain: &Chain, budget: u64, machine: &Machine) -> Result<f64, SolveError> {
    let infeasible = |reason: String| SolveError::Infeasible { budget, reason };
    let c = OffChain::new(chain, budget).ok_or_else(|| infeasible("the static memory alone exceeds it".into()))?;
    c.each_layer_fits().map_err(infeasible)?;
    let q = c.peak().saturating_sub(u128::from(c.memory));
    let sum = c.compute_time();
    if q == 0 {
        return Ok(sum);
    }
    let q = q as f64;
    Ok(sum.max(machine.d2h.transfer_time(q) + machine.h2d.transfer_time(q)))
}

/// The slot size of the offloading DPs over `memory` bytes: `M/N` rounded up for
/// `Slots::Count(N)`, one byte for `Slots::Exact`.
pub(crate) fn slot_size(memory: u64, slots: crate::Slots) -> u64 {
    match slots {
        crate::Slots::Count(k) => memory.div_ceil(k.max(1) as u64).max(1),
        crate::Slots::Exact => 1,
    }
}

/// The tensor that holds `ā_ℓ` in pebble's chain view.
fn saved(ell: usize) -> Tensor {
    if ell == 0 {
        Tensor::Activation(0)
    } else {
        Tensor::Saved(ell)
    }
}

/// The compute ops of the chain with everything kept: `F_0^all … F_{L−1}^all`, the loss,
/// `B_{L−1} … B_0`.
fn keep_all_ops(l: usize) -> Vec<Op> {
    let mut ops: Vec<Op> = (0..l).map(|i| Op::Forward { stage: i, mode: ForwardMode::KeepAll }).collect();
    ops.extend((0..=l).rev().map(|i| Op::Backward { stage: i }));
    ops
}

/// An offload of `fraction` of `ā_ℓ` (pebble's tensors, thesis's `ℓ`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Offloaded {
    /// `ℓ`, `0..=L`.
    pub ell: usize,
    /// The fraction moved, in `(0, 1]` (below 1 only under O.7′).
    pub fraction: f64,
}

/// An offload to place in a sequence of compute ops: `fraction` of `tensor`, issued just
/// before compute op `at` (when the op before it ends).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Transfer {
    /// Index in the compute ops of the op it is issued before.
    pub at: usize,
    /// The tensor.
    pub tensor: Tensor,
    /// The fraction moved, in `(0, 1]`.
    pub fraction: f64,
}

/// Whether chain op `op` may read `tensor` (`a_i` is read through `Activation(i)` or
/// `Saved(i)`, whichever is resident, so both count).
fn reads(op: &Op, tensor: Tensor, l: usize) -> bool {
    let a = |i: usize| tensor == Tensor::Activation(i) || (i > 0 && tensor == Tensor::Saved(i));
    match *op {
        Op::Forward { stage, .. } => a(stage),
        Op::Backward { stage } if stage == l => a(l),
        Op::Backward { stage } => a(stage) || tensor == Tensor::Saved(stage + 1) || tensor == Tensor::Grad(stage + 1),
        _ => false,
    }
}

/// Each offload of a tensor read again, with the index of the first compute op after it
/// that reads it (its prefetch's deadline), by deadline (ties: the later offload first).
pub(crate) fn prefetch_deadlines(chain: &Chain, compute: &[Op], offloads: &[Transfer]) -> Vec<(Transfer, usize)> {
    let l = chain.len();
    let mut pre: Vec<(Transfer, usize)> = offloads
        .iter()
        .filter_map(|o| {
            let next = (o.at + 1..compute.len()).find(|&k| reads(&compute[k], o.tensor, l))?;
            Some((*o, next))
        })
        .collect();
    pre.sort_by(|x, y| x.1.cmp(&y.1).then(y.0.at.cmp(&x.0.at)));
    pre
}

/// The ordered no-wait schedule of `compute` with `offloads` (Proposition 1): each
/// offload issued where it says, and each offloaded tensor prefetched before the first
/// compute op after its offload's op that reads it (none if none does), the prefetches in
/// the order of their deadlines, each issued as late as the nominal timeline (no stalls)
/// allows and moved later while the simulator finds it over the budget. `Err` is the
/// simulator's verdict on the last placement tried.
pub fn transfer_schedule(
    chain: &Chain,
    compute: &[Op],
    offloads: &[Transfer],
    budget: u64,
    config: &SimConfig,
) -> Result<Schedule, SimError> {
    let mut start = vec![0.0; compute.len() + 1];
    for (k, op) in compute.iter().enumerate() {
        let d = match *op {
            Op::Forward { stage, .. } => chain.ftime[stage],
            Op::Backward { stage } => chain.btime[stage],
            _ => 0.0,
        };
        start[k + 1] = start[k] + d;
    }
    let size = |t: Tensor| pebble_schedule::lower::tensor_bytes(chain, t) as f64;
    let pre = prefetch_deadlines(chain, compute, offloads);
    // Latest nominal starts, from the last prefetch back.
    let mut issue = vec![0usize; pre.len()];
    let mut next_start = f64::INFINITY;
    for j in (0..pre.len()).rev() {
        let (o, deadline) = pre[j];
        let end = start[deadline].min(next_start);
        let begin = end - config.machine.h2d.transfer_time(size(o.tensor) * o.fraction);
        next_start = begin;
        let mut k = deadline;
        while k > o.at + 1 && start[k] > begin + 1e-12 * start[k].abs() {
            k -= 1;
        }
        issue[j] = k;
    }
    // Keep the order: a later prefetch is issued no earlier.
    for j in 1..pre.len() {
        issue[j] = issue[j].max(issue[j - 1]);
    }
    let checked = SimConfig { budget: Some(budget), ..config.clone() };
    let mut tries = 0;
    loop {
        let schedule = assemble(compute, offloads, &pre, &issue);
        let verdict = pebble_sim::simulate_chain(chain, &schedule, &checked);
        let op = match verdict {
            Ok(_) => return Ok(schedule),
            Err(SimError::BudgetExceeded { op, .. }) if tries < 4 * (pre.len() + 1) * (compute.len() + 1) => op,
            Err(e) => return Err(e),
        };
        // A prefetch over the budget: issue it one compute op later, if it can be;
        // otherwise the earliest-issued prefetch that can still move.
        let movable = |j: usize| issue[j] < pre[j].1;
        let culprit = match schedule.ops.get(op) {
            Some(Op::Prefetch { tensor, .. }) => {
                pre.iter().position(|(o, _)| o.tensor == *tensor).filter(|&j| movable(j))
            }
            _ => None,
        };
        let Some(j) = culprit.or_else(|| (0..pre.len()).filter(|&j| movable(j)).min_by_key(|&j| issue[j])) else {
            return verdict.map(|_| schedule);
        };
        issue[j] += 1;
        for i in j + 1..pre.len() {
            issue[i] = issue[i].max(issue[j]).min(pre[i].1);
        }
        tries += 1;
    }
}

/// Interleaves the compute ops with the offloads and the prefetches issued before each.
fn assemble(compute: &[Op], offloads: &[Transfer], pre: &[(Transfer, usize)], issue: &[usize]) -> Schedule {
    let mut ops = Vec::with_capacity(compute.len() + offloads.len() + pre.len());
    for (k, &op) in compute.iter().enumerate() {
        for o in offloads.iter().filter(|o| o.at == k) {
            ops.push(Op::Offload { tensor: o.tensor, fraction: o.fraction });
        }
        for ((o, _), _) in pre.iter().zip(issue).filter(|&(_, &at)| at == k) {
            ops.push(Op::Prefetch { tensor: o.tensor, fraction: o.fraction });
        }
        ops.push(op);
    }
    Schedule::new(View::Chain, ops)
}

/// The ordered no-wait schedule of an offloading-only plan (see the module docs): the
/// compute ops of keep-all, the offload of `ā_ℓ` issued when pebble's stage `ℓ` starts.
pub fn no_wait_schedule(
    chain: &Chain,
    offloads: &[Offloaded],
    budget: u64,
    config: &SimConfig,
) -> Result<Schedule, SimError> {
    let l = chain.len();
    let mut offs: Vec<Offloaded> = offloads.iter().copied().filter(|o| o.ell <= l && o.fraction > 0.0).collect();
    offs.sort_by_key(|o| o.ell);
    offs.dedup_by_key(|o| o.ell);
    let transfers: Vec<Transfer> =
        offs.iter().map(|o| Transfer { at: o.ell, tensor: saved(o.ell), fraction: o.fraction }).collect();
    transfer_schedule(chain, &keep_all_ops(l), &transfers, budget, config)
}

/// GREEDY's offload set: whole `ā_0 … ā_k`, `k` the least index with `Σ_{ℓ≤k} ā_ℓ ≥ Q`;
/// under O.7′ (`fractional`), exactly `Q`, the last one in part (Theorem 8).
pub fn greedy_offloads(c: &OffChain, fractional: bool) -> Vec<Offloaded> {
    let q = c.peak().saturating_sub(u128::from(c.memory));
    let mut out = Vec::new();
    let mut moved = 0u128;
    for ell in 0..c.n {
        if moved >= q {
            break;
        }
        let size = u128::from(c.abar[ell]);
        if size == 0 {
            continue;
        }
        let fraction = if fractional && moved + size > q { (q - moved) as f64 / size as f64 } else { 1.0 };
        out.push(Offloaded { ell, fraction });
        moved += size;
    }
    out
}

/// The schedule of an offload set, or `Infeasible` with the simulator's reason.
fn schedule_or_infeasible(
    chain: &Chain,
    offloads: &[Offloaded],
    budget: u64,
    options: &SolveOptions,
) -> Result<Schedule, SolveError> {
    no_wait_schedule(chain, offloads, budget, &options.sim_config())
        .map_err(|e| SolveError::Infeasible { budget, reason: format!("the no-wait schedule does not fit: {e}") })
}

fn off_chain(chain: &Chain, budget: u64) -> Result<OffChain, SolveError> {
    let c = OffChain::new(chain, budget)
        .ok_or_else(|| SolveError::Infeasible { budget, reason: "the static memory alone exceeds it".into() })?;
    c.each_layer_fits().map_err(|reason| SolveError::Infeasible { budget, reason })?;
    Ok(c)
}

/// GREEDY (Shilova §3.3.1).
pub struct OffloadGreedy;

impl Solver for OffloadGreedy {
    fn name(&self) -> &'static str {
        "offload-greedy"
    }

    fn description(&self) -> &'static str {
        "offloading only: GREEDY, whole ā_0..ā_k eagerly (Shilova §3.3.1)"
    }

    fn solve(&self, problem: Problem<'_>, budget: u64, options: &SolveOptions) -> Result<Schedule, SolveError> {
        let chain = problem.chain_for(self.name())?;
        let c = off_chain(chain, budget)?;
        schedule_or_infeasible(chain, &greedy_offloads(&c, false), budget, options)
    }
}

inventory::submit!(crate::Registration(&OffloadGreedy));

/// DYNPROG (Shilova §3.3.2–3.3.3).
pub struct OffloadDp;

impl Solver for OffloadDp {
    fn name(&self) -> &'static str {
        "offload-dp"
    }

    fn description(&self) -> &'static str {
        "offloading only: DYNPROG, Algorithm 5 under O.7″ then the no-wait schedule (Shilova §3.3.2)"
    }

    fn solve(&self, problem: Problem<'_>, budget: u64, options: &SolveOptions) -> Result<Schedule, SolveError> {
        let chain = problem.chain_for(self.name())?;
        let c = off_chain(chain, budget)?;
        dynprog::solve(chain, &c, budget, options)
    }
}

inventory::submit!(crate::Registration(&OffloadDp));

/// The simulator's configuration for a relaxation check: progressive transfers.
pub fn relaxed(config: &SimConfig) -> SimConfig {
    SimConfig { transfers: TransferMemory::Progressive, ..config.clone() }
}

#[cfg(test)]
mod tests;
