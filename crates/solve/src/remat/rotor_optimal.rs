//! `rotor-optimal`: Shilova's floating-persistence DP `C_FL` (Algorithms 1 and 2, §2.3.2),
//! completed with the transition the thesis misses, so that it is optimal over all
//! schedules of Table 2.1's operations (checked against [`crate::oracle::brute`]).
//!
//! # The DP, in this crate's 0-based indexing
//!
//! `C(s, t, ℓ, m)`, for `0 ≤ s ≤ ℓ ≤ t ≤ L`, is the least time to run `B_t … B_ℓ` when
//! only `a_s` (counted outside `m`) and `δ_{t+1}` are resident, ending with only `δ_ℓ`:
//! when `ℓ > s`, the "floating" activation `a_s` is gone too (only `F_s^∅` releases it).
//! Memory terms are those of [`crate::remat::rotor`]. The transitions:
//!
//! * **C1** (`ℓ = s < t`, "`F_s^all` first"):
//!   `ftime[s] + C(s+1, t, s+1, m − ā(s+1)) + btime[s]` if `m ≥ m_all(s, t)`.
//! * **C2** (`ℓ < t`, "`F_s^ck` first"): `F_s^ck, F_{s+1}^∅ … F_{j−1}^∅` stores `a_j`; the
//!   right part runs `B_t … B_{t'}` with `a_j` floating (`C(j, t, t', m − x[j])`,
//!   `s < j ≤ t'`, `ℓ < t' ≤ t`), then the left part runs `B_{t'−1} … B_ℓ`
//!   (`C(s, t'−1, ℓ, m)`). Its time is `Σ_{k=s}^{j−1} ftime[k]` plus both parts.
//! * **C3** (`s < ℓ`, "move the floating activation"): `F_s^∅ … F_{r−1}^∅` (releasing
//!   `a_s`), then `C(r, t, ℓ, m + x[s] − x[r])`, for `s < r ≤ ℓ`. This is the transition
//!   the printed recurrence lacks (the research digest, §2.5): without it,
//!   `C(s, t, t, m) = ∞` for every `s < t`, and some instances get a worse time than the
//!   optimum. With it, C2 needs no "`F^∅` first" parameter (`r = s` suffices).
//! * the base case `C(s, s, s, m) = ftime[s] + btime[s]` if `m ≥ m_all(s, s)`.
//!
//! Two deliberate departures from the printed formulas, both of which only admit more
//! valid schedules: the memory conditions are exact (C2 checks the `F^∅` steps it runs,
//! `h < j`, rather than all of `m_∅(s, t)`; C3 checks `F_s^∅` with `a_s` held and the later
//! steps without it), and C3 does not require `x[r] ≥ x[s]` (the table is filled by chain
//! length, so a reference to more memory on a shorter chain is fine).
//!
//! The answer is `C(0, L, 0, m)`. Every reference is to a strictly shorter chain, so the
//! table is filled by chain length. C2 is split through
//! `D(s, t, t', m) = min_j Σ_{k=s}^{j−1} ftime[k] + C(j, t, t', m − x[j])`, which does not
//! depend on `ℓ`: the whole DP costs `O(S·L⁴)`. Choices are not stored: the
//! reconstruction (Algorithm 2) recomputes the candidates of the few states it visits,
//! with the very same floating-point expressions. At L = 100 it takes about 0.6 s with
//! 50 slots, 1.3–1.6 s with 100 and 3 s with 200 (release build, one core); tables above
//! 2²⁶ entries are refused ([`SolveError::TooLarge`]): use fewer slots, or `rotor`.
//!
//! The printed recurrence itself (no C3, "`F^∅` first" inside C2) is kept, test-only, as
//! `printed_value`, to measure what C3 changes: on random small chains it is worse than
//! the completed DP on about 1 budget in 400.

use pebble_graph::Chain;
use pebble_schedule::{ForwardMode, Op, Schedule, View};

use crate::discretize::{discretize, first_fitting, store_all_if_it_fits, Discrete};
use crate::{Problem, Slots, SolveError, SolveOptions, Solver};

/// Shilova's floating DP (Algorithm 1) with the missing "move the floating activation"
/// transition: optimal over all Table 2.1 schedules, up to the memory discretization.
pub struct RotorOptimal;

impl Solver for RotorOptimal {
    fn name(&self) -> &'static str {
        "rotor-optimal"
    }

    fn description(&self) -> &'static str {
        "Shilova's optimal non-persistent DP (Alg. 1, completed); O(S·L⁴), for short chains or few slots"
    }

    fn solve(&self, problem: Problem<'_>, budget: u64, options: &SolveOptions) -> Result<Schedule, SolveError> {
        let chain = problem.chain_for(self.name())?;
        let (_, ops) = floating(chain, budget, options.slots)?;
        Ok(Schedule::new(View::Chain, ops))
    }
}

inventory::submit!(crate::Registration(&RotorOptimal));

const INF: f64 = f64::INFINITY;
/// Largest value table (entries of eight bytes: 512 MiB) the solver allocates.
const MAX_ENTRIES: usize = 1 << 26;

/// Solves `C_FL` (with C3) for `chain` within `budget`: the DP's value (the schedule's
/// time) and the schedule's ops.
pub(crate) fn floating(chain: &Chain, budget: u64, slots: Slots) -> Result<(f64, Vec<Op>), SolveError> {
    if let Some(found) = store_all_if_it_fits(chain, budget) {
        return Ok(found);
    }
    let d = discretize(chain, budget, slots)?;
    let n = d.l + 1;
    let states = n * (n + 1) * (n + 2) / 6;
    if states.saturating_mul(d.memory + 1) > MAX_ENTRIES {
        return Err(SolveError::TooLarge {
            solver: "rotor-optimal",
            why: format!(
                "{states} sub-problems × {} memory slots is too large a table; use fewer slots or `rotor`",
                d.memory + 1
            ),
        });
    }
    let dp = Floating::run(&d);
    let found = first_fitting(chain, &d, budget, |m| {
        let v = dp.get(0, d.l, 0, m);
        (v < INF).then(|| (v, dp.reconstruct(m)))
    });
    found.ok_or_else(|| SolveError::Infeasible {
        budget,
        reason: format!(
            "the optimal DP finds no schedule within {} slots of {} bytes beyond static memory and a_0",
            d.base, d.slot
        ),
    })
}

/// The value of `C_FL` exactly as the thesis prints it (Eqs. 2.4–2.8): no C3, C2 over
/// `(r, s', t')` with "`F^∅` first" (`a_{r−1} ≥ a_{s−1}`), the memory conditions `m_all`
/// and `m_∅` (all `h = s..t`, `a_{s−1}` held). `O(S·L⁶)`: for comparisons on small chains.
/// `None` when it finds no schedule. (Test-only: it exists to show what C3 changes.)
#[cfg(test)]
pub(crate) fn printed_value(chain: &Chain, budget: u64, slots: Slots) -> Result<Option<f64>, SolveError> {
    let d = discretize(chain, budget, slots)?;
    let n = d.l + 1;
    let w = d.memory + 1;
    let (x, xb, ft, bt) = (&d.x, &d.xbar, &d.ftmp, &d.btmp);
    let idx = |s: usize, t: usize, l: usize, m: usize| ((s * n + t) * n + l) * w + m;
    let mut c = vec![INF; n * n * n * w];
    let mut f = vec![0.0; n + 1];
    for i in 0..n {
        f[i + 1] = f[i] + d.ftime[i];
    }
    let m_all = |s: usize, t: usize| (x[t + 1] + xb[s + 1] + ft[s]).max(xb[s + 1] + x[s + 1] + x[s] + bt[s]);
    let m_nul = |s: usize, t: usize| {
        let h = (s + 1..=t).map(|h| x[h] + x[h + 1] + ft[h]).max().unwrap_or(0);
        x[t + 1] + h.max(x[s + 1] + ft[s])
    };
    for len in 0..n {
        for s in 0..n - len {
            let t = s + len;
            for l in s..=t {
                for m in 0..w {
                    let mut best = INF;
                    if len == 0 {
                        if m >= m_all(s, s) {
                            best = d.ftime[s] + d.btime[s];
                        }
                    } else {
                        if l == s && m >= m_all(s, t) {
                            best = best.min(d.ftime[s] + c[idx(s + 1, t, s + 1, m - xb[s + 1])] + d.btime[s]);
                        }
                        if l < t && m >= m_nul(s, t) {
                            // F_s^∅ … F_{r−1}^∅, F_r^ck, F_{r+1}^∅ … F_{j−1}^∅ (0-based r).
                            for r in s..=l {
                                if x[r] < x[s] || m + x[s] < x[r] {
                                    continue;
                                }
                                let m2 = m + x[s] - x[r];
                                for tp in l + 1..=t {
                                    let left = c[idx(r, tp - 1, l, m2)];
                                    if left == INF {
                                        continue;
                                    }
                                    for j in r + 1..=tp {
                                        if m2 >= x[j] {
                                            let v = (f[j] - f[s]) + c[idx(j, t, tp, m2 - x[j])] + left;
                                            best = best.min(v);
                                        }
                                    }
                                }
                            }
                        }
                    }
                    c[idx(s, t, l, m)] = best;
                }
            }
        }
    }
    let v = c[idx(0, d.l, 0, d.memory)];
    Ok((v < INF).then_some(v))
}

/// `out[m] ← min(out[m], add + sub[m])`.
#[inline]
fn min_into(out: &mut [f64], sub: &[f64], add: f64) {
    for (o, &c) in out.iter_mut().zip(sub) {
        let v = add + c;
        *o = if v < *o { v } else { *o };
    }
}

/// Index of the sub-chain `(s, t)`, `s ≤ t`, in a column-major triangle.
#[inline]
pub(crate) fn tri(s: usize, t: usize) -> usize {
    t * (t + 1) / 2 + s
}

struct Floating<'a> {
    d: &'a Discrete,
    n: usize,
    /// `M + 1`: the length of one memory row.
    w: usize,
    /// Start of the block of `(s, t)`: `(t − s + 1)` rows (one per `ℓ`) of `w` entries.
    base: Vec<usize>,
    c: Vec<f64>,
    /// Prefix sums of the forward times.
    f: Vec<f64>,
}

impl<'a> Floating<'a> {
    fn idx(&self, s: usize, t: usize, l: usize) -> usize {
        self.base[tri(s, t)] + (l - s) * self.w
    }

    fn get(&self, s: usize, t: usize, l: usize, m: usize) -> f64 {
        self.c[self.idx(s, t, l) + m]
    }

    /// `e(h)`: memory of `F_h^∅` (`h ≥ 1` not the first step), `δ` excluded.
    fn e(&self, h: usize) -> usize {
        let d = self.d;
        d.x[h] + d.x[h + 1] + d.ftmp[h]
    }

    /// `m_all(s, t)`: `F_s^all` with `δ_{t+1}` resident, and `B_s`.
    fn m_all(&self, s: usize, t: usize) -> usize {
        let d = self.d;
        (d.x[t + 1] + d.xbar[s + 1] + d.ftmp[s]).max(d.xbar[s + 1] + d.x[s + 1] + d.x[s] + d.btmp[s])
    }

    /// Thresholds of C2 for `j = s+1..=t`: `F_s^ck` and `F_h^∅` for `s < h < j`, `a_s` held.
    fn thr2(&self, s: usize, t: usize) -> Vec<usize> {
        let d = self.d;
        let dt = d.x[t + 1];
        let mut out = vec![0; t + 1];
        let mut g = d.x[s + 1] + d.ftmp[s];
        for (j, o) in out.iter_mut().enumerate().skip(s + 1) {
            if j > s + 1 {
                g = g.max(self.e(j - 1));
            }
            *o = (dt + g).max(d.x[j]);
        }
        out
    }

    /// Thresholds of C3 for `r = s+1..=t`: `F_s^∅` with `a_s` held, then `F_h^∅` for
    /// `s < h < r` without it.
    fn thr3(&self, s: usize, t: usize) -> Vec<usize> {
        let d = self.d;
        let dt = d.x[t + 1];
        let first = dt + d.x[s + 1] + d.ftmp[s];
        let mut out = vec![0; t + 1];
        let mut g = 0usize;
        for (r, o) in out.iter_mut().enumerate().skip(s + 1) {
            if r > s + 1 {
                g = g.max(dt + self.e(r - 1));
            }
            *o = first.max(g.saturating_sub(d.x[s]));
        }
        out
    }

    #[allow(clippy::needless_range_loop)] // indices are the DP's stage numbers
    fn run(d: &'a Discrete) -> Floating<'a> {
        let n = d.l + 1;
        let w = d.memory + 1;
        let mut base = vec![0usize; n * (n + 1) / 2];
        let mut total = 0usize;
        for t in 0..n {
            for s in 0..=t {
                base[tri(s, t)] = total;
                total += (t - s + 1) * w;
            }
        }
        let mut f = vec![0.0; n + 1];
        for i in 0..n {
            f[i + 1] = f[i] + d.ftime[i];
        }
        let mut dp = Floating { d, n, w, base, c: vec![INF; total], f };
        let mm = d.memory;
        let mut dtab = vec![INF; n * w];
        let mut cur = vec![INF; w];
        for len in 0..n {
            for s in 0..n - len {
                let t = s + len;
                if len == 0 {
                    let thr = dp.m_all(s, s);
                    let v = d.ftime[s] + d.btime[s];
                    let o = dp.idx(s, s, s);
                    for m in thr.min(w)..w {
                        dp.c[o + m] = v;
                    }
                    continue;
                }
                let thr2 = dp.thr2(s, t);
                let thr3 = dp.thr3(s, t);
                // D[t'][m], t' = s+1..=t (row t' − s − 1).
                for tp in s + 1..=t {
                    let row = &mut dtab[(tp - s - 1) * w..(tp - s) * w];
                    row.fill(INF);
                    for j in s + 1..=tp {
                        let pf = dp.f[j] - dp.f[s];
                        let src = dp.idx(j, t, tp);
                        let lo = thr2[j];
                        if lo >= w {
                            continue;
                        }
                        // row[m] ← min(row[m], pf + C(j, t, t', m − x[j])), m ≥ lo ≥ x[j].
                        let sub = &dp.c[src + lo - d.x[j]..src + w - d.x[j]];
                        min_into(&mut row[lo..], sub, pf);
                    }
                }
                for l in s..=t {
                    cur.fill(INF);
                    if l == s {
                        let thr = dp.m_all(s, t);
                        let src = dp.idx(s + 1, t, s + 1);
                        let xb = d.xbar[s + 1];
                        for m in thr.min(w)..w {
                            let v = d.ftime[s] + dp.c[src + m - xb] + d.btime[s];
                            if v < cur[m] {
                                cur[m] = v;
                            }
                        }
                    }
                    if l < t {
                        for tp in l + 1..=t {
                            let row = &dtab[(tp - s - 1) * w..(tp - s) * w];
                            let src = dp.idx(s, tp - 1, l);
                            let left = &dp.c[src..src + w];
                            for ((c, &a), &b) in cur.iter_mut().zip(row).zip(left) {
                                let v = a + b;
                                *c = if v < *c { v } else { *c };
                            }
                        }
                    }
                    if l > s {
                        for r in s + 1..=l {
                            let pf = dp.f[r] - dp.f[s];
                            let src = dp.idx(r, t, l);
                            let (xs, xr) = (d.x[s], d.x[r]);
                            if xs > mm + xr {
                                continue;
                            }
                            let lo = thr3[r].max(xr.saturating_sub(xs));
                            let hi = (mm + xr - xs).min(mm);
                            if lo <= hi {
                                // cur[m] ← min(cur[m], pf + C(r, t, ℓ, m + x[s] − x[r])).
                                let sub = &dp.c[src + lo + xs - xr..=src + hi + xs - xr];
                                min_into(&mut cur[lo..=hi], sub, pf);
                            }
                        }
                    }
                    let o = dp.idx(s, t, l);
                    dp.c[o..o + w].copy_from_slice(&cur);
                }
            }
        }
        dp
    }

    /// `D(s, t, t', m)` and its first argmin `j`, computed as [`Floating::run`] does.
    #[allow(clippy::needless_range_loop)] // indices are the DP's stage numbers
    fn d_value(&self, s: usize, t: usize, tp: usize, m: usize, thr2: &[usize]) -> (f64, usize) {
        let mut best = (INF, 0);
        for j in s + 1..=tp {
            if m < thr2[j] {
                continue;
            }
            let v = (self.f[j] - self.f[s]) + self.get(j, t, tp, m - self.d.x[j]);
            if v < best.0 {
                best = (v, j);
            }
        }
        best
    }

    /// Algorithm 2 (OptRecFL), iteratively, recomputing each visited state's candidates.
    #[allow(clippy::needless_range_loop)] // indices are the DP's stage numbers
    fn reconstruct(&self, memory: usize) -> Vec<Op> {
        enum Task {
            Solve(usize, usize, usize, usize),
            Emit(Op),
        }
        let d = self.d;
        let last = self.n - 1;
        let fwd = |stage, mode| Op::Forward { stage, mode };
        let mut ops = Vec::new();
        let mut stack = vec![Task::Solve(0, last, 0, memory)];
        while let Some(task) = stack.pop() {
            let (s, t, l, m) = match task {
                Task::Emit(op) => {
                    ops.push(op);
                    continue;
                }
                Task::Solve(s, t, l, m) => (s, t, l, m),
            };
            let v = self.get(s, t, l, m);
            assert!(v < INF, "a feasible DP state refers to an infeasible one: ({s}, {t}, {l}, {m})");
            if s == t {
                if s < last {
                    ops.push(fwd(s, ForwardMode::KeepAll));
                }
                ops.push(Op::Backward { stage: s });
                continue;
            }
            // C1.
            if l == s && m >= self.m_all(s, t) {
                let c1 = d.ftime[s] + self.get(s + 1, t, s + 1, m - d.xbar[s + 1]) + d.btime[s];
                if c1 == v {
                    ops.push(fwd(s, ForwardMode::KeepAll));
                    stack.push(Task::Emit(Op::Backward { stage: s }));
                    stack.push(Task::Solve(s + 1, t, s + 1, m - d.xbar[s + 1]));
                    continue;
                }
            }
            // C2.
            let thr2 = self.thr2(s, t);
            let mut found = false;
            for tp in l + 1..=t {
                let (dv, j) = self.d_value(s, t, tp, m, &thr2);
                if dv < INF && dv + self.get(s, tp - 1, l, m) == v {
                    ops.push(fwd(s, ForwardMode::Checkpoint));
                    ops.extend((s + 1..j).map(|h| fwd(h, ForwardMode::Discard)));
                    stack.push(Task::Solve(s, tp - 1, l, m));
                    stack.push(Task::Solve(j, t, tp, m - d.x[j]));
                    found = true;
                    break;
                }
            }
            if found {
                continue;
            }
            // C3.
            let thr3 = self.thr3(s, t);
            for r in s + 1..=l {
                let m2 = m + d.x[s];
                if m < thr3[r] || m2 < d.x[r] || m2 - d.x[r] > d.memory {
                    continue;
                }
                let m2 = m2 - d.x[r];
                if (self.f[r] - self.f[s]) + self.get(r, t, l, m2) == v {
                    ops.extend((s..r).map(|h| fwd(h, ForwardMode::Discard)));
                    stack.push(Task::Solve(r, t, l, m2));
                    found = true;
                    break;
                }
            }
            assert!(found, "no transition of ({s}, {t}, {l}, {m}) reaches its value {v}");
        }
        ops
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::oracle::brute::brute_force;
    use crate::oracle::brute::tests::{check, same, BIG};
    use crate::remat::rotor::persistent;
    use pebble_testkit::{small_chain, Rng};

    /// Shilova's persistence counterexample (§2.3.1, Fig. 2.3) in this crate's format.
    ///
    /// The thesis has `L = n+2` stages `1..L` and the loss `L+1`; `a_0 = a_{L+1} = 0`,
    /// `a_1 = 1`, `a_L = 4`, every other `a_ℓ = 3`, `ā = δ = a`, `u_{F_1} = n−2`,
    /// `u_{F_2} = 2`, every other time 0, no overheads, `M = 15`. Here stage `i` is the
    /// thesis's `i+1` and `x[i]` is its `a_i`: `x = [0, 1, 3, …, 3, 4]` (`L+1` entries, the
    /// thesis's `a_{L+1}` being the loss's output, which this format does not have), and
    /// the loss is stage `L` with time 0.
    pub(crate) fn counterexample(n: usize) -> Chain {
        let l = n + 2;
        let mut x = vec![3u64; l + 1];
        x[0] = 0;
        x[1] = 1;
        x[l] = 4;
        let mut ftime = vec![0.0; l];
        ftime[0] = (n - 2) as f64;
        ftime[1] = 2.0;
        let name = Some(format!("shilova-counterexample-{n}"));
        Chain { name, ftime, xbar: x.clone(), x, ..Chain::homogeneous(l, 0.0, 0.0, 0) }
    }

    #[test]
    fn persistence_counterexample() {
        for n in 4..=7 {
            let chain = counterexample(n);
            let (tp, ops) = persistent(&chain, 15, Slots::Exact).unwrap();
            check(&chain, 15, &ops, tp, "rotor");
            assert_eq!(tp, (3 * n - 2) as f64, "rotor, n = {n}");
            let (to, ops) = floating(&chain, 15, Slots::Exact).unwrap();
            check(&chain, 15, &ops, to, "rotor-optimal");
            assert_eq!(to, (2 * n + 2) as f64, "rotor-optimal, n = {n}");
            // L = n + 2 = 9 stages at n = 7: beyond the registered solver's limit.
            let (tb, ops) = brute_force(&chain, 15, 9).unwrap();
            check(&chain, 15, &ops, tb, "brute");
            assert_eq!(tb, (2 * n + 2) as f64, "brute, n = {n}");
            // The default discretization changes nothing here (15 bytes, one per slot).
            let (t, _) = persistent(&chain, 15, Slots::Count(500)).unwrap();
            assert_eq!(t, tp);
        }
    }

    #[test]
    fn discretized_schedules_fit_and_bracket_the_optimum() {
        let mut rng = Rng::new(4242);
        for k in 0..200 {
            let mut chain = small_chain(&mut rng, 1 + k % 6, true);
            // Byte-like sizes, so that a few slots really round.
            let scale = 1 + rng.range(0, 1000);
            for v in chain.x.iter_mut().chain(&mut chain.xbar).chain(&mut chain.ftmp).chain(&mut chain.btmp) {
                *v = *v * scale + rng.range(0, scale - 1) * u64::from(*v > 0);
            }
            for v in chain.xbar.iter_mut().zip(&chain.x).skip(1) {
                *v.0 = (*v.0).max(*v.1);
            }
            chain.xbar[0] = chain.x[0];
            chain.validate().unwrap();
            let sa = crate::baseline::store_all_ops(chain.len());
            let sp = pebble_sim::simulate_chain(&chain, &Schedule::new(View::Chain, sa), &Default::default())
                .unwrap()
                .peak_bytes;
            for frac in [0.3, 0.5, 0.7, 0.9, 1.0, 1.3] {
                let budget = (sp as f64 * frac) as u64;
                let best = brute_force(&chain, budget, 8).ok().map(|r| r.0);
                for slots in [Slots::Count(7), Slots::Count(40), Slots::Count(500)] {
                    let p = persistent(&chain, budget, slots);
                    let o = floating(&chain, budget, slots);
                    // Each DP keeps the first of its own schedules that fits the bytes
                    // (the headroom above the rounded memory), so under rounding either
                    // may find a schedule the other misses; with exact sizes the floating
                    // DP is never worse (`dps_match_brute_force_on_small_random_chains`).
                    if let Ok((tp, ops)) = &p {
                        check(&chain, budget, ops, *tp, "rotor");
                        assert!(*tp >= best.expect("a schedule fits, so brute finds one") - 1e-9);
                    }
                    if let Ok((to, ops)) = &o {
                        check(&chain, budget, ops, *to, "rotor-optimal");
                        assert!(*to >= best.expect("a schedule fits, so brute finds one") - 1e-9);
                    }
                }
            }
        }
    }

    #[test]
    fn unbounded_memory_is_store_all() {
        let mut rng = Rng::new(99);
        for k in 0..60 {
            let mut chain = small_chain(&mut rng, 1 + k % 12, false);
            for t in chain.ftime.iter_mut() {
                *t += 0.5;
            }
            let l = chain.len();
            for slots in [Slots::Exact, Slots::Count(500)] {
                for (who, (t, ops)) in [
                    ("rotor", persistent(&chain, BIG, slots).unwrap()),
                    ("rotor-optimal", floating(&chain, BIG, slots).unwrap()),
                ] {
                    assert!(same(t, chain.ideal_time()), "{who}");
                    assert_eq!(ops, crate::baseline::store_all_ops(l), "{who}");
                    check(&chain, BIG, &ops, t, who);
                }
            }
        }
    }

    /// The printed recurrence (no C3) is never better than the completed one and sometimes
    /// worse (as the research digest found: 2 of its 1,500 instances); on the persistence
    /// counterexample it already reaches the optimum `2n + 2` (its "`F^∅` first" C2 moves
    /// the floating activation there).
    #[test]
    fn printed_recurrence_is_worse_without_c3() {
        let mut rng = Rng::new(2024);
        let (mut worse, mut total) = (0, 0);
        for k in 0..300 {
            let chain = small_chain(&mut rng, 1 + k % 5, true);
            let l = chain.len();
            let sp = pebble_sim::simulate_chain(
                &chain,
                &Schedule::new(View::Chain, crate::baseline::store_all_ops(l)),
                &Default::default(),
            )
            .unwrap()
            .peak_bytes;
            for budget in [sp / 2, sp * 2 / 3, sp * 5 / 6, sp] {
                let fixed = floating(&chain, budget, Slots::Exact).ok().map(|r| r.0);
                // A size that cannot fit at all is infeasible before any DP runs.
                let printed = match printed_value(&chain, budget, Slots::Exact) {
                    Ok(v) => v,
                    Err(crate::SolveError::Infeasible { .. }) => None,
                    Err(e) => panic!("{e}"),
                };
                total += 1;
                match (printed, fixed) {
                    (Some(p), Some(f)) => {
                        assert!(p >= f - 1e-9, "{chain:?} at {budget}: printed {p} < completed {f}");
                        if p > f + 1e-9 {
                            worse += 1;
                        }
                    }
                    (Some(p), None) => panic!("printed {p} where the completed DP finds nothing: {chain:?}"),
                    (None, Some(_)) => worse += 1,
                    (None, None) => {}
                }
            }
        }
        eprintln!("printed recurrence worse than the completed one on {worse} of {total} cases");
        assert!(worse > 0);
        for n in 4..=7 {
            let v = printed_value(&counterexample(n), 15, Slots::Exact).unwrap();
            assert_eq!(v, Some((2 * n + 2) as f64));
        }
    }

    #[test]
    fn registered() {
        let s = crate::solver("rotor-optimal").unwrap();
        assert_eq!(s.views(), &[View::Chain]);
        let chain = counterexample(6);
        let p = crate::plan(s, Problem::Chain(&chain), 15, &SolveOptions::default()).unwrap();
        assert_eq!(p.report.makespan, 14.0);
        let r = crate::solver("rotor").unwrap();
        assert_eq!(r.description(), "Rotor's persistent DP (Shilova Alg. 3)");
        let p = crate::plan(r, Problem::Chain(&chain), 15, &SolveOptions::default()).unwrap();
        assert_eq!(p.report.makespan, 16.0);
        assert!(matches!(
            r.solve(Problem::Chain(&chain), 13, &SolveOptions::default()),
            Err(SolveError::Infeasible { .. })
        ));
    }
}
