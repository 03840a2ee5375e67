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
        for ell in 1..=l {
            uf[ell] = chain.ftime[ell - 1];
            of[ell] = chain.ftmp[ell - 1];
        }
        let mut ub = vec![0.0; n + 1];
        let mut ob = vec![0; n + 1];
        for ell in 1..=n {
            ub[ell] = chain.btime[ell - 1];
            ob[ell] = chain.btmp[ell - 1];
        }
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

/// The ordered no-wait schedule of an offload set (see the module docs): whole or
/// fractional offloads of `ā_ℓ` issued when `F_{ℓ+1}` (pebble's stage `ℓ`) starts, the
/// prefetches in decreasing order as late as the simulator allows. `Err` is the
/// simulator's verdict on the best placement found.
pub fn no_wait_schedule(
    chain: &Chain,
    offloads: &[Offloaded],
    budget: u64,
    config: &SimConfig,
) -> Result<Schedule, SimError> {
    let l = chain.len();
    let compute = keep_all_ops(l);
    // Position of each compute op in the compute sequence: forward i at i, loss at l,
    // backward i at 2l − i.
    let bwd_pos = |i: usize| 2 * l - i;
    let mut offs: Vec<Offloaded> = offloads.iter().copied().filter(|o| o.ell <= l && o.fraction > 0.0).collect();
    offs.sort_by_key(|o| o.ell);
    offs.dedup_by_key(|o| o.ell);
    // Nominal start times of the compute ops (no stall).
    let mut start = vec![0.0; compute.len() + 1];
    for (k, op) in compute.iter().enumerate() {
        let d = match *op {
            Op::Forward { stage, .. } => chain.ftime[stage],
            Op::Backward { stage } => chain.btime[stage],
            _ => 0.0,
        };
        start[k + 1] = start[k] + d;
    }
    // Prefetch of ā_ℓ: first read by B_ℓ (the loss for ℓ = L). Latest nominal start,
    // ordered by decreasing ℓ on one link, from the last one back.
    let mut issue = vec![0usize; offs.len()];
    let mut next_start = f64::INFINITY;
    for (j, o) in offs.iter().enumerate() {
        let size = if o.ell == 0 { chain.x[0] } else { chain.xbar[o.ell] } as f64 * o.fraction;
        let deadline = bwd_pos(o.ell);
        let end = start[deadline].min(next_start);
        let begin = end - config.machine.h2d.transfer_time(size);
        next_start = begin;
        // Issued after the last compute op that ends by `begin`, after its offload.
        let mut k = deadline;
        while k > o.ell + 1 && start[k] > begin + 1e-12 * start[k].abs() {
            k -= 1;
        }
        issue[j] = k.max(o.ell).min(deadline);
    }
    let mut tries = 0;
    loop {
        let schedule = assemble(&compute, &offs, &issue, l);
        let checked = SimConfig { budget: Some(budget), ..config.clone() };
        match pebble_sim::simulate_chain(chain, &schedule, &checked) {
            Ok(_) => return Ok(schedule),
            Err(SimError::BudgetExceeded { op, .. }) if tries < 4 * (offs.len() + 1) * (l + 1) => {
                // A prefetch over the budget: issue it one compute op later, if it can be.
                let moved = match schedule.ops.get(op) {
                    Some(Op::Prefetch { tensor, .. }) => {
                        offs.iter().position(|o| saved(o.ell) == *tensor).filter(|&j| issue[j] < bwd_pos(offs[j].ell))
                    }
                    _ => None,
                };
                let Some(j) = moved.or_else(|| {
                    // Otherwise the earliest-issued prefetch that can still move.
                    (0..offs.len()).filter(|&j| issue[j] < bwd_pos(offs[j].ell)).min_by_key(|&j| issue[j])
                }) else {
                    return pebble_sim::simulate_chain(chain, &schedule, &checked).map(|_| schedule);
                };
                issue[j] += 1;
                // Keep the order (decreasing ℓ): a prefetch of a smaller ℓ is issued no earlier.
                for i in 0..j {
                    issue[i] = issue[i].max(issue[j]).min(bwd_pos(offs[i].ell));
                }
                tries += 1;
            }
            Err(e) => return Err(e),
        }
    }
}

/// Interleaves the compute ops with the offloads (before `F_{ℓ}` of stage `ℓ`, i.e. when
/// `ā_ℓ`'s consumer starts) and the prefetches (before the compute op they are issued at,
/// in decreasing `ℓ`).
fn assemble(compute: &[Op], offs: &[Offloaded], issue: &[usize], l: usize) -> Schedule {
    let mut ops = Vec::with_capacity(compute.len() + 2 * offs.len());
    for (k, &op) in compute.iter().enumerate() {
        if k <= l {
            for o in offs.iter().filter(|o| o.ell == k) {
                ops.push(Op::Offload { tensor: saved(o.ell), fraction: o.fraction });
            }
        }
        for j in (0..offs.len()).rev().filter(|&j| issue[j] == k) {
            ops.push(Op::Prefetch { tensor: saved(offs[j].ell), fraction: offs[j].fraction });
        }
        ops.push(op);
    }
    Schedule::new(View::Chain, ops)
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

    fn views(&self) -> &'static [View] {
        &[View::Chain]
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

    fn views(&self) -> &'static [View] {
        &[View::Chain]
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
