//! A lower bound on weight offloading that orders each link's transfers around the ops
//! that wait for them (issue 48, Deliver 5): tight where the links are slow, where the
//! MILP of [`crate::weight_bound`] only charges the links' time to the period.
//!
//! **The bound.** Fix one operation `o` of the cycle and measure time from its start
//! (`σ_0 = 0`); the ops run in the cyclic order `o = j_0, j_1, …, j_{2L−1}` at starts
//! `σ_1, …, σ_{2L−1}`, and `o` again at `T`, the period. Device memory must hold at every
//! instant of `o`, in particular at its start `0` and just before its end `u_o`: at each,
//! the weights not on the device (neither resident, nor leaving on the offload link, nor
//! arriving on the prefetch link, whose buffer counts from the transfer's start) weigh at
//! least `E_o = Σ|w| + M_o − M` (`M_o` by [`WeightChain::op_memory`]), and `o`'s own layer
//! is not among them. Call `A` the set away at `0`, `A′` the set away at `u_o⁻`, and for a
//! layer `k` write `r_k` for the position of `B_k` and `n_k` for the first position
//! after `0` of `F_k` or `B_k`. Then, in any periodic schedule:
//!
//! 1. **Prefetches.** A weight of `A′` comes back by a transfer that starts after `u_o`,
//!    one of `A \ A′` by one that starts after `0`; each ends by its next use, `σ_{n_k}`.
//!    One link carries them one at a time, so for every position `n` and release `ρ`
//!    (`0` or `u_o`), the transfers released at or after `ρ` and due by `σ_n` fit in
//!    `[ρ, σ_n]`: `Σ_{k released ≥ ρ, n_k ≤ n} |w_k|/β↑ ≤ σ_n − ρ`.
//! 2. **Offloads.** A weight away at an instant holds its only up-to-date copy on the host,
//!    written by a transfer that started after its last update, the end of the previous
//!    period's `B_k`, at `σ_{r_k} + u_{r_k} − T`, and ended before the instant (`0` for
//!    `A`, `u_o` for `A′ \ A`). So for every position `q`, the offloads released after
//!    `B_q` ends and due by `d` (`0` or `u_o`) fit in between:
//!    `σ_q + u_q − T + Σ_{k due ≤ d, r_k ≥ q} |w_k|/β↓ ≤ d`.
//! 3. **The chain.** `σ_{j+1} ≥ σ_j + u_j`, `T = σ_{2L}`.
//!
//! Each layer is in `A ∩ A′` (`x_k`), `A \ A′` (`y_k`) or `A′ \ A` (`z_k`), or neither,
//! and `Σ (x+y)|w| ≥ E_o`, `Σ (x+z)|w| ≥ E_o`. Every periodic schedule gives its `σ`, `T`
//! and sets a point of this program, so its least `T`, or that of any relaxation of it
//! (the binaries in `[0, 1]`), is a lower bound on the period; so is the largest over the
//! ops. (Conditions 1 and 2 are the preemptive relaxation of each link's one-at-a-time
//! transfers: necessary, not sufficient.) The bound reads only the instance's arrays,
//! `op_memory` and the two bandwidths; latency would only add to the transfers. Where
//! `A` and `A′` differ the weight moved during `o`; a weight away at both instants is
//! in `A ∩ A′` even if it came and went in between (then it moved twice: counting once
//! keeps a lower bound).
//!
//! **Why it is tighter where the links are slow.** At `F_1`, every weight away must come
//! back before its forward, so the prefetch link must carry `E_{F_1}` bytes within the
//! forward pass: `T ≥ u_{F_1} + E/β↑ + (what runs after the last such forward)`; the MILP
//! lets each transfer overlap any interval and only sums the link's time over the period.
//!
//! **Cost.** One program per op with `E_o > 0`, solved as a linear program (`3L`
//! continuous `[0, 1]` columns, `2L` starts); the `integral_ops` ops with the largest
//! relaxed value are solved again with binaries, each within `time_limit`, and HiGHS's
//! answer less its relative gap (or its dual bound where it stops early) counts.

use pebble_solve::weights::{Accounting, WeightChain, WeightOp};

use crate::milp::{Lin, Milp, Outcome};
use crate::IlpError;

/// How to compute the bound.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OrderedBoundOptions {
    /// The memory accounting of `M_o` (see [`Accounting`]).
    pub accounting: Accounting,
    /// How many ops (those of the largest relaxed value) are solved again with binaries.
    pub integral_ops: usize,
    /// HiGHS's time limit for each program with binaries, in seconds.
    pub time_limit: Option<f64>,
}

impl Default for OrderedBoundOptions {
    fn default() -> Self {
        OrderedBoundOptions { accounting: Accounting::Consistent, integral_ops: 4, time_limit: Some(10.0) }
    }
}

/// The bound and the op that gives it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OrderedBound {
    /// A lower bound on the period (never below `Σu`).
    pub time: f64,
    /// The op whose program gives `time`; `None` where it is `Σu`.
    pub op: Option<WeightOp>,
}

/// HiGHS's relative gap for the programs with binaries: an answer reported optimal is
/// within it of the optimum, so the bound takes `(1 − MIP_GAP)` of it.
const MIP_GAP: f64 = 1e-7;

/// The ordered lower bound of the instance with `memory` bytes of device memory, `beta_out`
/// bytes per time unit on the offload link and `beta_in` on the prefetch link.
/// [`IlpError::InvalidGraph`] for a bandwidth that is not positive (`+∞` is allowed: that
/// link then costs nothing); [`IlpError::Infeasible`] where an op does not fit even with
/// every other layer's weights away.
pub fn ordered_bound(
    chain: &WeightChain,
    memory: u64,
    beta_out: f64,
    beta_in: f64,
    options: &OrderedBoundOptions,
) -> Result<OrderedBound, IlpError> {
    if !(beta_out > 0.0 && beta_in > 0.0) {
        return Err(IlpError::InvalidGraph(format!(
            "weight offloading needs positive link bandwidths, got {beta_out} and {beta_in}"
        )));
    }
    let total = chain.total_weights();
    let mut relaxed: Vec<(f64, WeightOp)> = Vec::new();
    for op in chain.ops() {
        let need = total + chain.op_memory(op, options.accounting);
        let Some(excess) = need.checked_sub(memory).filter(|&e| e > 0) else { continue };
        let others = total - chain.weight(op.layer());
        if excess > others {
            return Err(IlpError::Infeasible);
        }
        let program = OpProgram::new(chain, op, excess, (beta_out, beta_in));
        relaxed.push((program.solve(false, None)?, op));
    }
    relaxed.sort_by(|a, b| b.0.total_cmp(&a.0));
    let mut best = OrderedBound { time: chain.compute_time(), op: None };
    for (k, &(value, op)) in relaxed.iter().enumerate() {
        let mut value = value;
        if k < options.integral_ops {
            let excess = total + chain.op_memory(op, options.accounting) - memory;
            let program = OpProgram::new(chain, op, excess, (beta_out, beta_in));
            match program.solve(true, options.time_limit) {
                Ok(v) => value = value.max(v),
                // No incumbent within the limit: the relaxed value stands.
                Err(IlpError::NoSolution { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        if value > best.time {
            best = OrderedBound { time: value, op: Some(op) };
        }
    }
    Ok(best)
}

/// A layer that may be away at the op: its size (in units of the largest weight), its
/// transfer times out and in, the position of its `B_k`, and of its next use.
#[derive(Debug, Clone, Copy)]
struct Candidate {
    size: f64,
    out: f64,
    back: f64,
    release: usize,
    due: usize,
}

/// The program of one op (see the module's doc): the ops' times in cyclic order from it,
/// the layers that may be away, and `E_o` in units.
struct OpProgram {
    u: Vec<f64>,
    candidates: Vec<Candidate>,
    excess: f64,
}

impl OpProgram {
    fn new(chain: &WeightChain, op: WeightOp, excess: u64, (beta_out, beta_in): (f64, f64)) -> OpProgram {
        let ops = chain.ops();
        let n = ops.len();
        let first = chain.op_index(op);
        let position = |o: WeightOp| (chain.op_index(o) + n - first) % n;
        let u = (0..n).map(|j| chain.time(ops[(first + j) % n])).collect();
        let unit = chain.w.iter().copied().max().unwrap_or(1).max(1) as f64;
        let candidates = (1..=chain.len())
            .filter(|&k| k != op.layer() && chain.weight(k) > 0)
            .map(|k| {
                let w = chain.weight(k) as f64;
                let release = position(WeightOp::Backward(k));
                let due = position(WeightOp::Forward(k)).min(release);
                Candidate { size: w / unit, out: w / beta_out, back: w / beta_in, release, due }
            })
            .collect();
        OpProgram { u, candidates, excess: excess as f64 / unit }
    }

    /// The least `T` of the program, relaxed (`integral` false) or with binaries (then a
    /// lower bound on its optimum: HiGHS's answer less its gap, or its dual bound).
    fn solve(&self, integral: bool, time_limit: Option<f64>) -> Result<f64, IlpError> {
        let n = self.u.len();
        let (inf, u_o) = (f64::INFINITY, self.u[0]);
        let mut m = Milp::new();
        // σ_1 … σ_{n−1}, then T = σ_n.
        let sigma: Vec<_> = (1..=n).map(|j| m.continuous(if j == n { 1.0 } else { 0.0 }, 0.0, inf, 0.0)).collect();
        let s = |j: usize| sigma[j - 1];
        let t = s(n);
        // x (away at both instants), y (at the start only), z (at the end only); y and z
        // only where the op lasts.
        let kinds = if u_o > 0.0 { 3 } else { 1 };
        let var = |m: &mut Milp| if integral { m.binary(0.0, 0.0) } else { m.continuous(0.0, 0.0, 1.0, 0.0) };
        let sets: Vec<Vec<_>> = self.candidates.iter().map(|_| (0..kinds).map(|_| var(&mut m)).collect()).collect();
        // The chain.
        let mut first = Lin::default();
        first.add_col(s(1), 1.0);
        m.row(self.u[0], &first, inf);
        for j in 1..n {
            let mut e = Lin::default();
            e.add_col(s(j + 1), 1.0).add_col(s(j), -1.0);
            m.row(self.u[j], &e, inf);
        }
        // At most one kind per layer; E_o away at both instants.
        for v in &sets {
            let mut e = Lin::default();
            v.iter().for_each(|&c| {
                e.add_col(c, 1.0);
            });
            m.row(-inf, &e, 1.0);
        }
        for other in [1, 2] {
            let mut e = Lin::default();
            for (c, v) in self.candidates.iter().zip(&sets) {
                e.add_col(v[0], c.size);
                if let Some(&col) = v.get(other) {
                    e.add_col(col, c.size);
                }
            }
            m.row(self.excess, &e, inf);
        }
        self.links(&mut m, &sets, &sigma);
        let options: &[(&str, f64)] = if integral { &[("mip_rel_gap", MIP_GAP)] } else { &[] };
        let time = |x: &[f64]| x[t.index()];
        match m.solve(time_limit, false, options)? {
            Outcome::Optimal(x) if integral => Ok(time(&x) * (1.0 - MIP_GAP)),
            Outcome::Optimal(x) => Ok(time(&x)),
            Outcome::Incumbent(_, _, dual) => Ok(dual),
        }
    }

    /// Conditions 1 and 2 of the module's doc, at each position that is some layer's due
    /// or release.
    fn links(&self, m: &mut Milp, sets: &[Vec<highs::Col>], sigma: &[highs::Col]) {
        let n = self.u.len();
        let (inf, u_o) = (f64::INFINITY, self.u[0]);
        let t = sigma[n - 1];
        // Which kinds count: (prefetches released at 0: all; at u_o: x, z), (offloads due by
        // 0: x, y; by u_o: all).
        let all: &[usize] = &[0, 1, 2];
        let dues: std::collections::BTreeSet<usize> = self.candidates.iter().map(|c| c.due).collect();
        let releases: std::collections::BTreeSet<usize> = self.candidates.iter().map(|c| c.release).collect();
        for (kinds, release) in [(all, 0.0), (&[0, 2][..], u_o)] {
            for &q in &dues {
                let mut e = Lin::default();
                for (c, v) in self.candidates.iter().zip(sets).filter(|(c, _)| c.due <= q) {
                    kinds.iter().filter_map(|&k| v.get(k)).for_each(|&col| {
                        e.add_col(col, c.back);
                    });
                }
                e.add_col(sigma[q - 1], -1.0);
                m.row(-inf, &e, -release);
            }
        }
        for (kinds, due) in [(&[0, 1][..], 0.0), (all, u_o)] {
            for &q in &releases {
                let mut e = Lin::default();
                for (c, v) in self.candidates.iter().zip(sets).filter(|(c, _)| c.release >= q) {
                    kinds.iter().filter_map(|&k| v.get(k)).for_each(|&col| {
                        e.add_col(col, c.out);
                    });
                }
                e.add_col(sigma[q - 1], 1.0).add_col(t, -1.0);
                m.row(-inf, &e, due - self.u[q]);
            }
        }
    }
}

#[cfg(test)]
mod tests;
