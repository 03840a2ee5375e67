//! DYNPROG: Shilova's Algorithm 5 (§3.3.2), optimal for OFF_comm (whole activations,
//! memory moved progressively, O.7″; Theorem 10), and its discretization (§3.3.3.2).
//!
//! State at layer `i` (thesis numbering, [`super::OffChain`]): `A` (kept `ā_0..ā_{i−2}`),
//! `Δ_F` (data of those still to offload after `F_{i−1}`; negative: link idle time × β)
//! and `Δ_B` (data to prefetch before `B_{i−1}`). Everything is counted in memory slots,
//! and the link's work during an op in slots too, so that the states are integers:
//!
//! ```text
//! M_F = A + Δ_F⁺ + ā_{i−1}      M_B = A + Δ_B⁺ + ā_{i−1}                      (3.4) (3.5)
//! e_F = (𝓜_{F_i} − M + M_F)⁺    e_B = (𝓜_{B_i} − M + M_B)⁺   (ε = e/β)         (3.6) (3.7)
//! feasible iff 𝓜_{F_i}, 𝓜_{B_i} ≤ M − A − ā_{i−1}                              (3.8) (3.9)
//! D_F = u_{F_i}β + e_F           D_B = u_{B_i}β + e_B
//! offload ā_{i−1}: (A, Δ_F⁺ + ā_{i−1} − D_F, (Δ_B − D_B)⁺ + ā_{i−1})       (3.10)–(3.12)
//! keep ā_{i−1}:    (A + ā_{i−1}, Δ_F − D_F, Δ_B − D_B)                        (3.13)–(3.15)
//! cost += u_{F_i} + ε_F + u_{B_i} + ε_B           (the OCR's "u_{B_i} ε_{B_i}" is a sum)
//! ```
//!
//! and at the end the idle time `ε_G` between the loss's forward and backward, (3.16)
//! and (3.17) (whose "Δ_{B_{L+1}}" means `L+2`). Offloads go at `β↓` (`d2h`), prefetches at
//! `β↑` (`h2d`). A negative `Δ` below `−M` means the same as `−M` (no more than `M` is
//! ever moved across the loss), so it is clamped there.
//!
//! Discretization (§3.3.3.2): slots of `M/N` bytes; `o` and `δ` rounded up; `uβ` rounded
//! down through prefix sums; `ā` rounded optimistically through its prefix sums, then,
//! while the no-wait schedule of the result does not fit in true sizes, the rounded-down
//! `ā_i` nearest its true value is rounded up and the DP runs again.

use std::collections::HashMap;

use pebble_graph::Chain;
use pebble_schedule::Schedule;

use super::{no_wait_schedule, slot_size, OffChain, Offloaded};
use crate::{SolveError, SolveOptions};

/// The problem in slots.
#[derive(Debug, Clone)]
pub struct Slotted {
    /// Layers.
    pub n: usize,
    /// `M` in slots.
    pub memory: i64,
    /// `ã_ℓ`, `ℓ = 0..=n`.
    pub abar: Vec<i64>,
    /// `𝓜_{F_ℓ}` in slots.
    pub need_f: Vec<i64>,
    /// `𝓜_{B_ℓ}` in slots.
    pub need_b: Vec<i64>,
    /// What the d2h link moves during `F_ℓ`, in slots.
    pub move_f: Vec<i64>,
    /// What the h2d link moves during `B_ℓ`, in slots.
    pub move_b: Vec<i64>,
    /// `o_{F_ℓ}`, `o_{B_ℓ}`, `δ_ℓ` in slots (for `ε_G`).
    pub of: Vec<i64>,
    /// See `of`.
    pub ob: Vec<i64>,
    /// See `of`.
    pub delta: Vec<i64>,
    /// `u_{F_ℓ}`, `u_{B_ℓ}`.
    pub uf: Vec<f64>,
    /// See `uf`.
    pub ub: Vec<f64>,
    /// Offload and prefetch rates, slots per time unit.
    pub beta_off: f64,
    /// See `beta_off`.
    pub beta_pre: f64,
}

impl Slotted {
    /// `c` in slots of `slot` bytes with `ã` given, links of `beta_off` and `beta_pre`
    /// bytes per time unit.
    pub fn new(c: &OffChain, slot: u64, abar: Vec<i64>, beta_off: f64, beta_pre: f64) -> Slotted {
        let n = c.n;
        let up = |v: u64| v.div_ceil(slot) as i64;
        let (bo, bp) = (beta_off / slot as f64, beta_pre / slot as f64);
        let prefix_down = |u: &[f64], rate: f64| {
            let mut out = vec![0i64; n + 1];
            let (mut sum, mut prev) = (0.0, 0i64);
            for ell in 1..=n {
                sum += u[ell];
                let now = (sum * rate * (1.0 + 1e-12)).floor().min(i64::MAX as f64 / 4.0) as i64;
                out[ell] = now - prev;
                prev = now;
            }
            out
        };
        let of: Vec<i64> = c.of.iter().map(|&v| up(v)).collect();
        let ob: Vec<i64> = c.ob.iter().map(|&v| up(v)).collect();
        let delta: Vec<i64> = c.delta.iter().map(|&v| up(v)).collect();
        let mut need_f = vec![0; n + 1];
        let mut need_b = vec![0; n + 1];
        for ell in 1..=n {
            need_f[ell] = of[ell] + abar[ell];
            need_b[ell] = ob[ell] + abar[ell] + delta[ell] + delta[ell - 1];
        }
        Slotted {
            n,
            memory: (c.memory / slot) as i64,
            move_f: prefix_down(&c.uf, bo),
            move_b: prefix_down(&c.ub, bp),
            abar,
            need_f,
            need_b,
            of,
            ob,
            delta,
            uf: c.uf.clone(),
            ub: c.ub.clone(),
            beta_off: bo,
            beta_pre: bp,
        }
    }

    /// `ε_G` (3.16)/(3.17) for a final state.
    fn epsilon_g(&self, a: i64, df: i64, db: i64) -> f64 {
        let (bo, bp) = (self.beta_off, self.beta_pre);
        match (df > 0, db > 0) {
            (false, false) => 0.0,
            (true, true) => df as f64 / bo + db as f64 / bp,
            // (3.16): offloading goes on into the first backward ops.
            (true, false) => {
                self.overrun(a, df, bo, -db as f64 / bp, |j| self.delta[j - 1] + self.delta[j] + self.ob[j], &self.ub)
            }
            // (3.17): prefetching starts during the last forward ops.
            (false, true) => self.overrun(a, db, bp, -df as f64 / bo, |j| self.of[j], &self.uf),
        }
    }

    /// (3.16) and (3.17), one the mirror of the other: one link still has `pending` slots
    /// to move at `rate` while the other has been idle for `idle`; the ops `j = n, n−1, …`
    /// that run within that idle time (taking `time[j]`, needing `need(j)` beside what is
    /// kept, less `Σ_{i ≥ j+1} ā_i`) each wait for what they cannot fit.
    fn overrun(&self, a: i64, pending: i64, rate: f64, idle: f64, need: impl Fn(usize) -> i64, time: &[f64]) -> f64 {
        let m = self.memory as f64;
        let held = (a + pending) as f64;
        let mut e = pending as f64 / rate - idle;
        // Σ_{i ≥ j+1} ā_i, walking j down from n, and the time of the ops after j.
        let (mut later, mut u) = (0i64, 0.0);
        for j in (1..=self.n).rev() {
            if u >= idle {
                break;
            }
            e = e.max(((need(j) - later) as f64 - m + held) / rate - u);
            u += time[j];
            later += self.abar[j];
        }
        e.max(0.0)
    }
}

/// A state `(A, Δ_F, Δ_B)`, in slots.
type State = (i64, i64, i64);

#[derive(Debug, Clone, Copy)]
struct Entry {
    cost: f64,
    parent: u32,
    offloaded: bool,
}

/// Algorithm 5 on `p`: the optimal value under O.7″ (in `p`'s discretization) and which
/// `ā_ℓ` (`ℓ = 0..n−1`) to offload; `None` if no schedule fits.
pub fn run(p: &Slotted) -> Option<(f64, Vec<bool>)> {
    let n = p.n;
    let m = p.memory;
    let floor = -m;
    let mut layers: Vec<Vec<(State, Entry)>> = Vec::with_capacity(n + 1);
    layers.push(vec![((0, 0, 0), Entry { cost: 0.0, parent: 0, offloaded: false })]);
    for i in 1..=n {
        let prev = &layers[i - 1];
        let mut next: HashMap<State, Entry> = HashMap::with_capacity(prev.len() * 2);
        let input = p.abar[i - 1];
        for (idx, &((a, df, db), e)) in prev.iter().enumerate() {
            let room = m - a - input;
            if p.need_f[i] > room || p.need_b[i] > room {
                continue;
            }
            let mf = a + df.max(0) + input;
            let mb = a + db.max(0) + input;
            let ef = (p.need_f[i] - m + mf).max(0);
            let eb = (p.need_b[i] - m + mb).max(0);
            let cost = e.cost + p.uf[i] + p.ub[i] + ef as f64 / p.beta_off + eb as f64 / p.beta_pre;
            let dfm = p.move_f[i] + ef;
            let dbm = p.move_b[i] + eb;
            let mut push = |key: State, offloaded: bool| {
                let key = (key.0, key.1.max(floor), key.2.max(floor));
                let entry = Entry { cost, parent: idx as u32, offloaded };
                next.entry(key)
                    .and_modify(|old| {
                        if cost < old.cost {
                            *old = entry
                        }
                    })
                    .or_insert(entry);
            };
            if input > 0 {
                push((a, df.max(0) + input - dfm, (db - dbm).max(0) + input), true);
            }
            push((a + input, df - dfm, db - dbm), false);
        }
        let mut v: Vec<_> = next.into_iter().collect();
        v.sort_by_key(|&(k, _)| k);
        layers.push(v);
    }
    let (best, value) = layers[n]
        .iter()
        .enumerate()
        .map(|(idx, &((a, df, db), e))| (idx, e.cost + p.epsilon_g(a, df, db), a))
        // Ties (up to rounding) go to the state that keeps the most: offload no more than needed.
        .min_by(|x, y| {
            let close = (x.1 - y.1).abs() <= 1e-9 * x.1.abs().max(y.1.abs());
            if close {
                y.2.cmp(&x.2)
            } else {
                x.1.total_cmp(&y.1)
            }
        })
        .map(|(idx, v, _)| (idx, v))?;
    let mut offloaded = vec![false; n];
    let mut idx = best;
    for i in (1..=n).rev() {
        let e = layers[i][idx].1;
        offloaded[i - 1] = e.offloaded;
        idx = e.parent as usize;
    }
    Some((value, offloaded))
}

/// `ã` by §3.3.3.2's optimistic start: the prefix sums of `ā` rounded up.
fn rounded_abar(c: &OffChain, slot: u64) -> Vec<i64> {
    let mut out = vec![0i64; c.n + 1];
    let (mut sum, mut prev) = (0u128, 0i64);
    for (ell, &v) in c.abar.iter().enumerate() {
        sum += u128::from(v);
        let now = sum.div_ceil(u128::from(slot)) as i64;
        out[ell] = now - prev;
        prev = now;
    }
    out
}

/// Most re-solves of the iterative rounding.
const ROUNDS: usize = 24;

/// The `offload-dp` solver: DP, then the no-wait schedule of its offload set, rounding
/// `ā` up one at a time while that schedule does not fit.
pub(crate) fn solve(chain: &Chain, c: &OffChain, budget: u64, options: &SolveOptions) -> Result<Schedule, SolveError> {
    let slot = slot_size(c.memory, options.slots);
    let mut abar = rounded_abar(c, slot);
    let machine = &options.machine;
    let mut last = None;
    for round in 0..ROUNDS {
        options.progress.report("offload-dp: rounding", round, ROUNDS);
        let p = Slotted::new(c, slot, abar.clone(), machine.d2h.bandwidth, machine.h2d.bandwidth);
        let Some((_, offloaded)) = run(&p) else { break };
        let offs: Vec<Offloaded> = offloaded
            .iter()
            .enumerate()
            .filter(|&(_, &o)| o)
            .map(|(ell, _)| Offloaded { ell, fraction: 1.0 })
            .collect();
        match no_wait_schedule(chain, &offs, budget, &options.sim_config()) {
            Ok(s) => return Ok(s),
            Err(e) => last = Some(e),
        }
        // Round up the rounded-down ā_i nearest its true value.
        let bump = (0..c.n)
            .filter(|&ell| (abar[ell] as u128) * u128::from(slot) < u128::from(c.abar[ell]))
            .min_by_key(|&ell| u128::from(c.abar[ell]) - abar[ell] as u128 * u128::from(slot));
        match bump {
            Some(ell) => abar[ell] += 1,
            None => break,
        }
    }
    Err(SolveError::Infeasible {
        budget,
        reason: match last {
            Some(e) => format!("DYNPROG's offload set does not fit once scheduled: {e}"),
            None => "DYNPROG finds no offloading schedule within the budget".into(),
        },
    })
}
