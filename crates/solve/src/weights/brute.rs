//! The exact optimum of weight offloading on tiny instances, by brute force, written from
//! the paper's definitions alone (Beaumont et al. 2022 §3–4; digest `seed000-004.md`
//! A.1): the oracle of Algorithm 2 ([`super::schedule`]) and of the MILP bound
//! (`pebble-ilp`'s `weight_bound`).
//!
//! **Model** (everything in integers: times in time units, sizes in bytes, `β` bytes per
//! time unit, each `|w_k|` a multiple of `β`). One period of length `T` runs `F_1 … F_L,
//! B_L … B_1` on the device in that order, with an idle gap after each. Each layer's
//! weights either stay, or leave between `F_k` and `B_k` (`(k,1)`), between `B_k` and the
//! next `F_k` (`(k,0)`), or both. A weight leaves by a transfer to the host that starts
//! after its last update (`B_k`'s end) and is freed at the later of that transfer's end and
//! the end of its last use; it comes back by a transfer from the host that ends by its next
//! use; with both choices one transfer out serves both (the discount). Each link carries
//! one transfer at a time, `|w_k|/β` long. Device memory at every instant: the weights on
//! the device, a prefetch's buffer from its start, an outgoing weight until its transfer
//! ends, plus eq. (1) less the layer's own weights: `Σ_{j≤i} |a^j|` while `F_i` runs or
//! after it, that plus `|δw_i| = |w_i|` while `B_i` runs, `Σ_{j<i} |a^j|` after `B_i`
//! (`δ^{i−1}` in place of `a^{i−1}`). At equal times, frees come first.
//!
//! **Search.** For each period `T` from `Σu` up, each way of spreading the idle time `T −
//! Σu` over the `2L` gaps, each choice per layer, and each cyclic order of the transfers on
//! each link, the schedule is made canonical: transfers to the host as early as their
//! windows and order allow, transfers from the host as late as their deadlines and order
//! allow (an earlier offload only frees memory and the link sooner; a later prefetch only
//! takes memory later: neither can make a feasible schedule infeasible). The first `T`
//! where one canonical schedule fits is the optimum over schedules whose events fall on
//! whole time units, which every schedule of integer data that starts each transfer at an
//! event (Algorithm 2's) is. Cost: `(T − Σu + 1)^{2L}` idle spreads, `4^L` choices (pruned
//! by Algorithm 1's necessary condition), `(n−1)!` orders per link: 2–4 layers only.
//!
//! **What it shares with the code it checks:** nothing but the instance's four arrays
//! `w`, `a`, `uf`, `ub` (it reads no `WeightChain` method, no `op_memory`, no selection, no
//! scheduler, no simulator, no MILP). It and they read the same paper, so a
//! misreading of the paper common to both would pass unseen; the gadget of the paper's
//! Theorem 1 (whose optimum the proof gives) checks this reading on its own.

/// A weight-offloading instance in integer units (the paper's symbols, layer `i` at index
/// `i − 1`, `a^0 … a^L` at `0 … L`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instance {
    /// `|w_i|`, each a multiple of `beta`.
    pub w: Vec<u64>,
    /// `|a^i|`, `L + 1` of them.
    pub a: Vec<u64>,
    /// `u_{F_i}`.
    pub uf: Vec<u64>,
    /// `u_{B_i}`.
    pub ub: Vec<u64>,
    /// Bytes per time unit, each direction.
    pub beta: u64,
    /// `M_GPU`.
    pub memory: u64,
}

/// Where a layer's weights are away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Away {
    Never,
    /// `(k,1)`: between `F_k` and `B_k`.
    AfterForward,
    /// `(k,0)`: between `B_k` and the next `F_k`.
    AfterBackward,
    Both,
}

const AWAY: [Away; 4] = [Away::Never, Away::AfterForward, Away::AfterBackward, Away::Both];

/// A transfer: its layer, the window of its start (to the host) or end (from the host),
/// `[lo, lo + slack]` in the layer's own frame, and its length.
#[derive(Debug, Clone, Copy)]
struct Job {
    layer: usize,
    lo: i64,
    slack: i64,
    len: i64,
}

/// Memory besides the weights on each unit `[t, t + 1)` of a period, and at each op of no
/// duration (its time, its index in [`Instance::ops`], its memory).
type Memory = (Vec<u64>, Vec<(i64, usize, u64)>);

/// The smallest `s ≥ t` in some `[lo + kT, lo + kT + slack]`.
fn fit(t: i64, lo: i64, slack: i64, period: i64) -> i64 {
    let base = lo + (t - lo).div_euclid(period) * period;
    if t <= base + slack {
        t
    } else {
        base + period
    }
}

/// The earliest starts, in each job's own frame, of `jobs` run one at a time on one link
/// in the cyclic `order`, each within its window; `None` if they do not fit.
fn earliest(jobs: &[Job], order: &[usize], period: i64) -> Option<Vec<i64>> {
    if jobs.is_empty() {
        return Some(Vec::new());
    }
    let first = jobs[order[0]];
    let mut s0 = first.lo;
    loop {
        let mut starts = vec![0; jobs.len()];
        starts[order[0]] = s0;
        let mut t = s0 + first.len;
        for &i in &order[1..] {
            starts[i] = fit(t, jobs[i].lo, jobs[i].slack, period);
            t = starts[i] + jobs[i].len;
        }
        let need = fit(t - period, first.lo, first.slack, period);
        if need <= s0 {
            return Some(starts.iter().zip(jobs).map(|(&s, j)| j.lo + (s - j.lo).rem_euclid(period)).collect());
        }
        if need > first.lo + first.slack {
            return None;
        }
        s0 = need;
    }
}

/// The cyclic orders of `0..n` (the first fixed).
fn cyclic_orders(n: usize) -> Vec<Vec<usize>> {
    fn permute(rest: &mut Vec<usize>, k: usize, out: &mut Vec<Vec<usize>>) {
        if k == rest.len() {
            out.push(std::iter::once(0).chain(rest.iter().copied()).collect());
            return;
        }
        for i in k..rest.len() {
            rest.swap(k, i);
            permute(rest, k + 1, out);
            rest.swap(k, i);
        }
    }
    if n == 0 {
        return vec![Vec::new()];
    }
    let mut out = Vec::new();
    permute(&mut (1..n).collect(), 0, &mut out);
    out
}

/// Every way to spread `idle` over `gaps` gaps.
fn spreads(idle: i64, gaps: usize) -> Vec<Vec<i64>> {
    if gaps == 1 {
        return vec![vec![idle]];
    }
    (0..=idle)
        .flat_map(|x| {
            spreads(idle - x, gaps - 1).into_iter().map(move |mut v| {
                v.insert(0, x);
                v
            })
        })
        .collect()
}

impl Instance {
    fn l(&self) -> usize {
        self.w.len()
    }

    /// `Σ_{j ≤ i} |a^j|`.
    fn acts(&self, i: usize) -> u64 {
        self.a[..=i].iter().sum()
    }

    /// The ops in order, `F_1 … F_L, B_L … B_1`, as (layer, is backward).
    fn ops(&self) -> Vec<(usize, bool)> {
        let l = self.l();
        (1..=l).map(|i| (i, false)).chain((1..=l).rev().map(|i| (i, true))).collect()
    }

    /// Memory besides the weights while the op runs, and after it.
    fn op_memory(&self, (i, back): (usize, bool)) -> (u64, u64) {
        if back {
            (self.acts(i) + self.w[i - 1], self.acts(i - 1))
        } else {
            (self.acts(i), self.acts(i))
        }
    }

    fn time(&self, (i, back): (usize, bool)) -> i64 {
        (if back { self.ub[i - 1] } else { self.uf[i - 1] }) as i64
    }

    /// Algorithm 1's necessary condition: at each op, the weights that cannot be away
    /// (their choices do not cover it) fit beside its memory.
    fn could_fit(&self, away: &[Away]) -> bool {
        self.ops().into_iter().all(|(i, back)| {
            let resident: u64 = (1..=self.l())
                .filter(|&k| {
                    let covered = match away[k - 1] {
                        Away::Never => false,
                        Away::AfterForward => i > k,
                        Away::AfterBackward => i < k,
                        Away::Both => i != k,
                    };
                    !covered
                })
                .map(|k| self.w[k - 1])
                .sum();
            resident + self.op_memory((i, back)).0 <= self.memory
        })
    }

    /// The least period of any schedule, if one is at most `max_period`.
    ///
    /// # Panics
    ///
    /// On arrays of the wrong lengths, `β = 0` or a weight not a multiple of `β`.
    pub fn optimum(&self, max_period: u64) -> Option<u64> {
        let l = self.l();
        assert!(self.a.len() == l + 1 && self.uf.len() == l && self.ub.len() == l && self.beta > 0);
        assert!(self.w.iter().all(|w| w % self.beta == 0), "each |w| a multiple of β");
        let compute: u64 = self.uf.iter().chain(&self.ub).sum();
        let mut sets: Vec<Vec<Away>> = vec![Vec::new()];
        for k in 1..=l {
            let kinds: &[Away] = if self.w[k - 1] == 0 { &AWAY[..1] } else { &AWAY };
            sets = sets.into_iter().flat_map(|s| kinds.iter().map(move |&c| [s.clone(), vec![c]].concat())).collect();
        }
        sets.retain(|s| self.could_fit(s));
        let orders: Vec<Vec<Vec<usize>>> = (0..=2 * l).map(cyclic_orders).collect();
        for period in compute..=max_period {
            for gaps in spreads((period - compute) as i64, 2 * l) {
                let starts = self.starts(&gaps);
                let base = self.base_memory(&starts, period as i64);
                if sets.iter().any(|s| self.fits(s, &starts, period as i64, &base, &orders)) {
                    return Some(period);
                }
            }
        }
        None
    }

    /// Each op's start, in [`Instance::ops`]' order, with `gaps[j]` idle after op `j`.
    fn starts(&self, gaps: &[i64]) -> Vec<i64> {
        let mut t = 0;
        self.ops()
            .into_iter()
            .zip(gaps)
            .map(|(o, g)| {
                let s = t;
                t += self.time(o) + g;
                s
            })
            .collect()
    }

    /// Whether some order of the transfers of `away` fits this timeline.
    fn fits(&self, away: &[Away], starts: &[i64], period: i64, base: &Memory, orders: &[Vec<Vec<usize>>]) -> bool {
        let l = self.l();
        let (mut outs, mut ins) = (Vec::new(), Vec::new());
        for k in 1..=l {
            let (f, b) = (starts[k - 1], starts[2 * l - k]);
            let (fe, be) = (f + self.uf[k - 1] as i64, b + self.ub[k - 1] as i64);
            let len = (self.w[k - 1] / self.beta) as i64;
            let window = |lo: i64, hi: i64| (hi >= lo).then_some(Job { layer: k, lo, slack: hi - lo, len });
            // Out after B_k (this period's, or the last one's for (k,1) alone); in by F_k of
            // the next period or by B_k. Ends of transfers in are negated: the latest
            // ends are the earliest starts of the mirror image.
            let back = |lo: i64, hi: i64| window(-hi, -lo);
            let jobs = match away[k - 1] {
                Away::Never => continue,
                Away::AfterBackward => (window(be, f + period - 2 * len), vec![back(be + 2 * len, f + period)]),
                Away::AfterForward => (window(be - period, b - 2 * len), vec![back(fe + len, b)]),
                Away::Both => (
                    window(be, f + period - 2 * len),
                    vec![back(be + 2 * len, f + period), back(fe + period + len, b + period)],
                ),
            };
            outs.push(jobs.0);
            ins.extend(jobs.1);
        }
        let (Some(outs), Some(ins)) =
            (outs.into_iter().collect::<Option<Vec<_>>>(), ins.into_iter().collect::<Option<Vec<_>>>())
        else {
            return false;
        };
        let load = |jobs: &[Job]| jobs.iter().map(|j| j.len).sum::<i64>();
        if load(&outs) > period || load(&ins) > period {
            return false;
        }
        for out_order in &orders[outs.len()] {
            let Some(out_starts) = earliest(&outs, out_order, period) else { continue };
            for in_order in &orders[ins.len()] {
                let Some(in_ends) = earliest(&ins, in_order, period) else { continue };
                let in_ends: Vec<i64> = in_ends.iter().map(|e| -e).collect();
                if self.memory_holds(away, starts, period, base, (&outs, &out_starts), (&ins, &in_ends)) {
                    return true;
                }
            }
        }
        false
    }

    /// Memory besides the weights on each unit `[t, t + 1)` of the period, and at each
    /// op of no duration.
    fn base_memory(&self, starts: &[i64], period: i64) -> Memory {
        let ops = self.ops();
        let mut level = vec![0; period as usize];
        let mut instants = Vec::new();
        for (j, &o) in ops.iter().enumerate() {
            let (run, after) = self.op_memory(o);
            let end = starts[j] + self.time(o);
            let next = starts.get(j + 1).copied().unwrap_or(period);
            if end == starts[j] {
                instants.push((starts[j], j, run));
            }
            for t in starts[j]..end {
                level[t as usize] = run;
            }
            for t in end..next {
                level[t as usize] = after;
            }
        }
        (level, instants)
    }

    /// Whether the canonical schedule is valid: each weight leaves after its transfer out
    /// and comes back after it left, and memory holds at every instant.
    fn memory_holds(
        &self,
        away: &[Away],
        starts: &[i64],
        period: i64,
        (level, instants): &Memory,
        (outs, out_starts): (&[Job], &[i64]),
        (ins, in_ends): (&[Job], &[i64]),
    ) -> bool {
        let l = self.l();
        // Per layer, the spans `[from, to)` it is off the device, and whether it leaves
        // when `F_k` ends (rather than when its transfer out does).
        let mut gone: Vec<(usize, i64, i64, bool)> = Vec::new();
        for k in 1..=l {
            let Some(o) = outs.iter().position(|j| j.layer == k) else { continue };
            let out_end = out_starts[o] + outs[o].len;
            let back: Vec<i64> =
                (0..ins.len()).filter(|&i| ins[i].layer == k).map(|i| in_ends[i] - ins[i].len).collect();
            let fe = starts[k - 1] + self.uf[k - 1] as i64;
            let spans = match away[k - 1] {
                Away::Never => unreachable!(),
                Away::AfterBackward => vec![(out_end, back[0], false)],
                Away::AfterForward => vec![(out_end.max(fe), back[0], out_end <= fe)],
                Away::Both => vec![(out_end, back[0], false), (fe + period, back[1], true)],
            };
            for (from, to, at_forward) in spans {
                if from > to {
                    return false;
                }
                gone.push((k, from, to, at_forward));
            }
        }
        // On a unit `[t, t + 1)`: frees at `t` come first, then what starts at `t`.
        let on_unit = |t: i64| -> u64 {
            let away_at =
                |k: usize| gone.iter().any(|&(g, from, to, _)| g == k && (t - from).rem_euclid(period) < to - from);
            (1..=l).filter(|&k| !away_at(k)).map(|k| self.w[k - 1]).sum()
        };
        // At an op of no duration at `t`, op `j`: a weight that leaves at `t` is gone
        // (unless it leaves when its own `F_k`, at `t`, ends and op `j` is not after it);
        // a transfer in that starts at `t` starts after the ops of no duration at `t`.
        let at_instant = |t: i64, j: usize| -> u64 {
            let away_at = |k: usize| {
                gone.iter().any(|&(g, from, to, at_forward)| {
                    let rel = (t - from).rem_euclid(period);
                    g == k && rel <= to - from && !(rel == 0 && at_forward && j < k)
                })
            };
            (1..=l).filter(|&k| !away_at(k)).map(|k| self.w[k - 1]).sum()
        };
        (0..period).all(|t| on_unit(t) + level[t as usize] <= self.memory)
            && instants.iter().all(|&(t, j, m)| at_instant(t, j) + m <= self.memory)
    }
}

#[cfg(test)]
mod tests;
