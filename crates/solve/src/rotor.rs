//! `rotor`: Rotor's persistent dynamic program `C_MP` (Shilova's thesis, Algorithms 3 and 4,
//! §2.3.3), the algorithm Rotor runs by default.
//!
//! # The DP, in this crate's 0-based indexing
//!
//! The thesis numbers stages `1..L+1` (the loss is `L+1`); here stage `i` maps `a_i` to
//! `a_{i+1}` and the loss is stage `L`. `C(s, t, m)`, for `0 ≤ s ≤ t ≤ L`, is the least
//! time to run the backward steps `B_t … B_s` when only `a_s` (the input, counted outside
//! `m`) and `δ_{t+1}` are resident, with `m` slots available; afterwards only `δ_s` is
//! left (and `a_s` if it is part of a saved set). Writing `X(i) = x[i]` (`0` for `i = L+1`:
//! the loss has no output, so `δ_{L+1}` is empty), `ā(i) = xbar[i]` (`0` for `i = L+1`),
//! the loss's forward being free (time 0, no memory, saves nothing):
//!
//! * `F_s^all` with `δ_{t+1}` resident: `X(t+1) + ā(s+1) + ftmp[s]`;
//! * `F_s^ck`: `X(t+1) + X(s+1) + ftmp[s]`; `F_h^∅` for `h > s` (`a_s` still held):
//!   `X(t+1) + x[h] + X(h+1) + ftmp[h]`;
//! * `B_s`: `ā(s+1) + X(s+1) + x[s] + btmp[s]` (`δ_{s+1}` and `ā_{s+1}` in, `δ_s` out; for
//!   the loss, `x[L] + btmp[L]`);
//! * `m_∅(s, t)` = the largest `F^∅`/`F^ck` term for `h = s..t` (the thesis's range,
//!   `h` up to `t` included; Rotor's C code stops at `t − 1`), `m_all(s, t)` = the larger of
//!   the `F_s^all` and `B_s` terms.
//!
//! ```text
//! C(s, s, m) = ftime[s] + btime[s]                             if m ≥ m_all(s, s)
//! C(s, t, m) = min( C1, C2 )                                   for s < t
//! C1 = ftime[s] + C(s+1, t, m − ā(s+1)) + btime[s]             if m ≥ m_all(s, t)
//! C2 = min_{j = s+1..t} Σ_{k=s}^{j−1} ftime[k] + C(j, t, m − x[j]) + C(s, j−1, m)
//!                                                              if m ≥ m_∅(s, t)
//! ```
//!
//! `C2` is `F_s^ck, F_{s+1}^∅ … F_{j−1}^∅` (storing `a_j`), the right part `j..t` with
//! `a_j` held, then the left part `s..j−1` with `δ_j`. The answer is `C(0, L, m)` with
//! `m = M − static − a_0` in slots (see `discretize.rs`: sizes rounded up to whole slots).
//!
//! Ties go to `C2`, as in Rotor's code. Rotor's own C/Python code differs from the thesis in
//! three ways (research digest §8.2): its `m_∅` stops at `h = t − 1`, it applies `m_∅` to
//! both branches, and it checks `F_s^all` with `δ_s` rather than `δ_{t+1}`. This solver
//! follows the thesis.
//!
//! # Implementation
//!
//! Every reference is to a strictly shorter sub-chain with the same memory, or to a
//! smaller memory, so the table is filled one memory slice at a time (`m` ascending).
//! Only the last `1 + max ā` slices of values are kept (a ring, row-major triangles); the
//! choice made at every `(s, t, m)` is kept for all `m` as a `u16` (`0` infeasible,
//! `u16::MAX` the `F^all` branch, else the `j` of `C2`), which is all OptRecP needs.
//!
//! * Before each slice the right-hand terms `G[t][j] = F[j] + C(j, t, m − x[j])` (`F` the
//!   prefix sums of `ftime`, so `Σ_{k=s}^{j−1} ftime[k] = F[j] − F[s]`) are gathered into a
//!   column-major triangle, so that `C2` is a contiguous min-plus reduction of column `t`
//!   of `G` against row `s` of the current slice: a vectorized minimum, then a search
//!   for its first position.
//! * Pruning: `C2`'s term for `j` is at least `F[j] − F[s] + LB(s, t)` (`LB` = every stage
//!   once), and `C(s, t, m) ≤ min(C1, C(s, t, m−1))`, so the reduction stops at the first
//!   `j` whose bound exceeds that. A cell whose value at `m − 1` already was `LB(s, t)` keeps
//!   its choice.
//! * Rows are dealt in groups of four to up to eight worker threads (when the
//!   table is large and no size is zero: with zero sizes, rows of one slice depend on each
//!   other); within a slice each row depends only on itself and on earlier slices, so the
//!   workers meet once per slice. The result does not depend on the number of workers.
//!
//! The cost is `O(S·L³)` additions; ResNet-1001's chain (L = 339) at 500 slots solves in
//! 0.8–0.9 s on two idle cores of a 2.6 GHz Xeon VM (1.7 s with one worker; the code is
//! SSE2-only, as `unsafe` and `-C target-cpu` are both off the table). The command that
//! measures it is in `docs/benchmarks.md`.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use pebble_graph::Chain;
use pebble_schedule::{ForwardMode, Op, Schedule, View};

use crate::baseline::chain_of;
use crate::discretize::{discretize, first_fitting, ops_time, store_all_if_it_fits, Discrete};
use crate::{Problem, Slots, SolveError, SolveOptions, Solver};

/// Rotor's persistent DP (Shilova, Algorithm 3): optimal among schedules in which an
/// activation, once stored, stays until its backward.
pub struct Rotor;

impl Solver for Rotor {
    fn name(&self) -> &'static str {
        "rotor"
    }

    fn description(&self) -> &'static str {
        "Rotor's persistent DP (Shilova Alg. 3)"
    }

    fn views(&self) -> &'static [View] {
        &[View::Chain]
    }

    fn solve(&self, problem: Problem<'_>, budget: u64, options: &SolveOptions) -> Result<Schedule, SolveError> {
        let chain = chain_of(problem, self.name())?;
        let (_, ops) = persistent(chain, budget, options.slots)?;
        Ok(Schedule::new(View::Chain, ops))
    }
}

inventory::submit!(crate::Registration(&Rotor));

const INF: f64 = f64::INFINITY;
const ARG_NONE: u16 = 0;
const ARG_ALL: u16 = u16::MAX;
/// Largest table of choices (entries of two bytes) the solver allocates.
const MAX_ENTRIES: usize = 1 << 28;
/// Largest ring of values (entries of eight bytes) the solver allocates.
const MAX_RING: usize = 1 << 26;

/// Solves `C_MP` for `chain` within `budget`: the DP's value (the schedule's time) and
/// the schedule's ops.
pub(crate) fn persistent(chain: &Chain, budget: u64, slots: Slots) -> Result<(f64, Vec<Op>), SolveError> {
    persistent_with(chain, budget, slots, None)
}

/// [`persistent`] with `threads` workers (where the table allows more than one), or as
/// many as the machine has.
pub(crate) fn persistent_with(
    chain: &Chain,
    budget: u64,
    slots: Slots,
    threads: Option<usize>,
) -> Result<(f64, Vec<Op>), SolveError> {
    if let Some(found) = store_all_if_it_fits(chain, budget) {
        return Ok(found);
    }
    let d = discretize(chain, budget, slots)?;
    let l = d.l;
    let n = l + 1;
    if n >= (ARG_ALL - 1) as usize {
        return Err(SolveError::TooLarge { solver: "rotor", why: format!("{l} stages (at most 65000)") });
    }
    let tsize = n * (n + 1) / 2;
    let w = 1 + d.xbar[1..=l].iter().copied().max().unwrap_or(0);
    if (d.memory + 1).saturating_mul(tsize) > MAX_ENTRIES || w.min(d.memory + 1).saturating_mul(tsize) > MAX_RING {
        return Err(SolveError::TooLarge {
            solver: "rotor",
            why: format!(
                "{} memory slots × {tsize} sub-chains is too large a table; use fewer slots (--slots)",
                d.memory + 1
            ),
        });
    }
    let dp = Dp::run(&d, threads);
    let top = dp.value(d.memory, l);
    let found = first_fitting(chain, &d, budget, |m| {
        if dp.arg(0, l, m) == ARG_NONE {
            return None;
        }
        let ops = dp.reconstruct(&d, m);
        // Only the last slice's values are kept; below it the time is the ops' sum.
        let value = if m == d.memory { top.expect("a feasible slice has a value") } else { ops_time(chain, &ops) };
        Some((value, ops))
    });
    found.ok_or_else(|| {
        // C is non-increasing in m, so nothing fits below d.base either.
        let reason = format!(
            "the persistent DP finds no schedule within {} slots of {} bytes beyond static memory and a_0",
            d.base, d.slot
        );
        SolveError::Infeasible { budget, reason }
    })
}

/// Index of `(s, t)`, `s ≤ t`, in a column-major triangle.
#[inline]
fn tt(t: usize, s: usize) -> usize {
    t * (t + 1) / 2 + s
}

struct Dp {
    n: usize,
    tsize: usize,
    /// The last `w` slices of values (`f64` bits), row-major triangles.
    ring: Vec<AtomicU64>,
    /// Start of row `s` in a row-major triangle.
    rowoff: Vec<usize>,
    w: usize,
    /// Row `s` is worker [`owner`]`(s, threads)`'s.
    threads: usize,
    /// Per worker, the choices of its rows for every slice: slice `m`, then row by row.
    args: Vec<Vec<u16>>,
    /// Per worker, its slice size and the offset of each of its rows.
    layout: Vec<(usize, Vec<usize>)>,
}

/// `(min_k a[k] + b[k], its first k)` over the `k` with `key[k] ≤ limit` (a prefix:
/// `key` is non-decreasing), or more `k` (whole chunks); `(∞, 0)` if none is finite. A
/// vectorized minimum over chunks of lanes, then a search for its first position.
#[inline]
fn min_arg(a: &[f64], b: &[f64], key: &[f64], limit: f64) -> (f64, usize) {
    const LANES: usize = 8;
    let n = a.len().min(b.len()).min(key.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [INF; LANES];
    let mut end = 0;
    for (ca, cb) in a.chunks_exact(LANES).zip(b.chunks_exact(LANES)) {
        if key[end] > limit {
            break;
        }
        for k in 0..LANES {
            let v = ca[k] + cb[k];
            acc[k] = if v < acc[k] { v } else { acc[k] };
        }
        end += LANES;
    }
    let mn = |x: f64, y: f64| if x < y { x } else { y };
    let mut best = mn(mn(mn(acc[0], acc[1]), mn(acc[2], acc[3])), mn(mn(acc[4], acc[5]), mn(acc[6], acc[7])));
    let split = end;
    if end == n - n % LANES {
        while end < n && key[end] <= limit {
            let v = a[end] + b[end];
            if v < best {
                best = v;
            }
            end += 1;
        }
    }
    if best == INF {
        return (INF, 0);
    }
    for (c, (ca, cb)) in a[..split].chunks_exact(LANES).zip(b[..split].chunks_exact(LANES)).enumerate() {
        let v: [f64; LANES] = std::array::from_fn(|k| ca[k] + cb[k]);
        if mn(mn(mn(v[0], v[1]), mn(v[2], v[3])), mn(mn(v[4], v[5]), mn(v[6], v[7]))) == best {
            let k = (0..LANES).find(|&k| ca[k] + cb[k] == best).expect("a hit");
            return (best, c * LANES + k);
        }
    }
    let k = (split..end).find(|&k| a[k] + b[k] == best).expect("the minimum is one of the sums");
    (best, k)
}

/// A barrier for a few threads that spin briefly, then yield.
struct SpinBarrier {
    count: AtomicUsize,
    generation: AtomicUsize,
    n: usize,
}

impl SpinBarrier {
    fn wait(&self) {
        if self.n == 1 {
            return;
        }
        let generation = self.generation.load(Ordering::Acquire);
        if self.count.fetch_add(1, Ordering::AcqRel) + 1 == self.n {
            self.count.store(0, Ordering::Relaxed);
            self.generation.fetch_add(1, Ordering::Release);
        } else {
            let mut spins = 0u32;
            while self.generation.load(Ordering::Acquire) == generation {
                spins += 1;
                if spins < 2000 {
                    std::hint::spin_loop();
                } else {
                    std::thread::yield_now();
                }
            }
        }
    }
}

/// What every worker reads.
struct Setup<'a> {
    d: &'a Discrete,
    n: usize,
    tsize: usize,
    w: usize,
    threads: usize,
    /// Prefix sums of the forward times: `Σ_{k=s}^{j−1} ftime[k] = f[j] − f[s]`.
    f: Vec<f64>,
    /// Prefix sums of all times: `LB(s, t) = lb[t+1] − lb[s]` is the least time of `s..t`.
    lb: Vec<f64>,
    /// `m_∅(s, t)` and `m_all(s, t)`, row-major triangles.
    mnul: Vec<usize>,
    mall: Vec<usize>,
    /// The least `m` at which `C(s, t, m)` is finite, row-major.
    mlo: Vec<usize>,
    /// Start of row `s` in a row-major triangle (row `s` holds `t = s..=L`).
    rowoff: Vec<usize>,
    /// Start of column `t` in a column-major triangle (column `t` holds `s = 0..=t`).
    colbase: Vec<usize>,
    /// The last `w` slices of values (`f64` bits), row-major triangles.
    ring: Vec<AtomicU64>,
    barrier: SpinBarrier,
}

/// Largest number of worker threads.
const MAX_THREADS: usize = 8;
/// Below this many additions, one thread.
const PARALLEL_WORK: usize = 20_000_000;

/// Rows are dealt to the workers in groups of this many consecutive rows; a worker runs
/// the cells of a group column by column, so that the column of `G` they share stays in
/// the L1 cache.
const GROUP: usize = 4;

/// The worker that computes row `s`.
#[inline]
fn owner(s: usize, threads: usize) -> usize {
    (s / GROUP) % threads
}

impl Setup<'_> {
    /// Worker `p`: its groups of rows (see [`owner`]), every slice. Returns its choices.
    fn work(&self, p: usize, layout: &(usize, Vec<usize>)) -> Vec<u16> {
        let d = self.d;
        let (n, tsize, w) = (self.n, self.tsize, self.w);
        let (x, xb) = (&d.x, &d.xbar);
        let f = &self.f;
        let ring = &self.ring;
        let load = |i: usize| f64::from_bits(ring[i].load(Ordering::Relaxed));
        let (size, offs) = layout;
        let mm = d.memory;
        let mut args = vec![ARG_NONE; (mm + 1) * size];
        let mut g = vec![INF; tsize];
        // This worker's rows in this slice and the previous one, laid out as its choices.
        let mut mine = vec![INF; *size];
        let mut prev = vec![INF; *size];
        // Per row of the current group, indexed by t: C(s+1, t, m − ā(s+1)), copied from
        // the ring in one sweep.
        let mut right = vec![INF; GROUP * n];
        // Ring offset of slice m − k, for k < w.
        let mut back = vec![0usize; w];
        let groups: Vec<(usize, usize)> = (0..n.div_ceil(GROUP))
            .filter(|&k| k % self.threads == p)
            .map(|k| (k * GROUP, ((k + 1) * GROUP).min(n)))
            .collect();
        for m in 0..=mm {
            let cm = m % w;
            for (k, b) in back.iter_mut().enumerate().take((m + 1).min(w)) {
                *b = if k <= cm { cm - k } else { cm + w - k } * tsize;
            }
            let cur = back[0];
            // G[t][j] = f[j] + C(j, t, m − x[j]). With x[j] = 0 this reads a stale
            // slice; such entries are refreshed below before they are read (one worker).
            for j in 1..n {
                if x[j] <= m {
                    let src = back[x[j]] + self.rowoff[j] - j;
                    for t in j..n {
                        g[self.colbase[t] + j] = f[j] + load(src + t);
                    }
                } else {
                    for t in j..n {
                        g[self.colbase[t] + j] = INF;
                    }
                }
            }
            let (done, rest) = args.split_at_mut(m * *size);
            let slice_args = &mut rest[..*size];
            let prev_args = if m >= 1 { &done[(m - 1) * *size..] } else { &[][..] };
            // Groups, and rows within a group, in decreasing order: with zero sizes, row s
            // reads rows s+1.. of this slice (column by column).
            for &(lo, hi) in groups.iter().rev() {
                for s in lo..hi {
                    let i = (s - lo) * n;
                    if s + 1 < n && xb[s + 1] <= m && xb[s + 1] > 0 {
                        let src = back[xb[s + 1]] + self.rowoff[s + 1] - (s + 1);
                        for (t, v) in right[i + s + 1..i + n].iter_mut().enumerate() {
                            *v = load(src + s + 1 + t);
                        }
                    }
                }
                for t in lo..n {
                    let cb = self.colbase[t];
                    for s in (lo..hi.min(t + 1)).rev() {
                        let i = (s - lo) * n;
                        let o = offs[s];
                        let ts = self.rowoff[s] + (t - s);
                        let (v, a) = if m < self.mlo[ts] {
                            (INF, ARG_NONE)
                        } else if s == t {
                            if m >= self.mall[ts] {
                                (d.ftime[s] + d.btime[s], ARG_ALL)
                            } else {
                                (INF, ARG_NONE)
                            }
                        } else if m >= 1
                            && prev[o + t - s] < INF
                            && prev[o + t - s] - (self.lb[t + 1] - self.lb[s]) <= 1e-12 * prev[o + t - s]
                        {
                            // Saturated: with one slot less, (s, t) already ran in its least
                            // time LB(s, t) (every stage once); the same choice still does.
                            (prev[o + t - s], prev_args[o + (t - s)])
                        } else {
                            let c1 = if m >= self.mall[ts] {
                                // With ā(s+1) = 0, C(s+1, t) is this slice's, just computed.
                                let sub = if xb[s + 1] == 0 {
                                    load(cur + self.rowoff[s + 1] + (t - s - 1))
                                } else {
                                    right[i + t]
                                };
                                d.ftime[s] + sub + d.btime[s]
                            } else {
                                INF
                            };
                            let (mut best, mut arg) = if c1 < INF { (c1, ARG_ALL) } else { (INF, ARG_NONE) };
                            if m >= self.mnul[ts] {
                                // Pruning: C2 with j costs at least Σ_{k=s}^{j−1} ftime[k] +
                                // LB(s, t), and C(s, t, m) ≤ min(C1, C(s, t, m−1)), so only a
                                // prefix of the j can reach the minimum.
                                let mut upper = c1;
                                if m >= 1 {
                                    upper = upper.min(prev[o + t - s]);
                                }
                                let mut limit = INF;
                                if upper < INF {
                                    let slack = upper - (self.lb[t + 1] - self.lb[s]);
                                    limit = f[s] + slack + 1e-9 * upper;
                                }
                                let (low, at) =
                                    min_arg(&g[cb + s + 1..=cb + t], &mine[o..o + (t - s)], &f[s + 1..=t], limit);
                                // Ties go to C2, as in Rotor.
                                if low < INF && low - f[s] <= best {
                                    best = low - f[s];
                                    arg = (s + 1 + at) as u16;
                                }
                            }
                            (best, arg)
                        };
                        mine[o + t - s] = v;
                        ring[cur + ts].store(v.to_bits(), Ordering::Relaxed);
                        slice_args[o + (t - s)] = a;
                        if s >= 1 && x[s] == 0 {
                            g[cb + s] = f[s] + v;
                        }
                    }
                }
            }
            std::mem::swap(&mut mine, &mut prev);
            self.barrier.wait();
        }
        args
    }
}

impl Dp {
    fn run(d: &Discrete, threads: Option<usize>) -> Dp {
        let l = d.l;
        let n = l + 1;
        let tsize = n * (n + 1) / 2;
        let mm = d.memory;
        let (x, xb, ft, bt) = (&d.x, &d.xbar, &d.ftmp, &d.btmp);
        let mut f = vec![0.0; n + 1];
        let mut lb = vec![0.0; n + 1];
        for i in 0..n {
            f[i + 1] = f[i] + d.ftime[i];
            lb[i + 1] = lb[i] + d.ftime[i] + d.btime[i];
        }
        let mut rowoff = vec![0usize; n + 1];
        for s in 0..n {
            rowoff[s + 1] = rowoff[s] + (n - s);
        }
        let mut mnul = vec![0usize; tsize];
        let mut mall = vec![0usize; tsize];
        for s in 0..n {
            // max(X(s+1) + ftmp[s], max_{s<h≤t} x[h] + X(h+1) + ftmp[h]), grown with t.
            let mut g = x[s + 1] + ft[s];
            for t in s..n {
                if t > s {
                    g = g.max(x[t] + x[t + 1] + ft[t]);
                }
                let dt = x[t + 1];
                let ts = rowoff[s] + (t - s);
                mnul[ts] = dt + g;
                mall[ts] = (dt + xb[s + 1] + ft[s]).max(xb[s + 1] + x[s + 1] + x[s] + bt[s]);
            }
        }
        // The least memory at which each sub-chain is feasible. Feasibility is a threshold
        // in m (each branch's conditions are), so it follows the recurrence with `max` for
        // "and" and `min` for "or"; cells below it are skipped without a scan.
        let mut mlo = vec![usize::MAX; tsize];
        for len in 0..n {
            for s in 0..n - len {
                let t = s + len;
                let ts = rowoff[s] + len;
                mlo[ts] = if len == 0 {
                    mall[ts]
                } else {
                    let right = |j: usize| mlo[rowoff[j] + (t - j)];
                    let mut best = mall[ts].max(right(s + 1).saturating_add(xb[s + 1]));
                    for j in s + 1..=t {
                        let left = mlo[rowoff[s] + (j - 1 - s)];
                        best = best.min(mnul[ts].max(right(j).saturating_add(x[j])).max(left));
                    }
                    best
                };
            }
        }
        let w = (1 + xb[1..=l].iter().copied().max().unwrap_or(0)).min(mm + 1);
        // Zero sizes make rows of a slice depend on each other: one worker then.
        let zero = x[1..=l].contains(&0) || xb[1..=l].contains(&0);
        let work = (mm + 1).saturating_mul(n * n * n / 6);
        let threads = match threads {
            _ if zero => 1,
            Some(k) => k.clamp(1, n.div_ceil(GROUP)),
            None if work < PARALLEL_WORK => 1,
            None => std::thread::available_parallelism().map_or(1, |p| p.get()).clamp(1, MAX_THREADS),
        };
        let layout: Vec<(usize, Vec<usize>)> = (0..threads)
            .map(|p| {
                let mut offs = vec![usize::MAX; n];
                let mut size = 0;
                for (s, o) in offs.iter_mut().enumerate() {
                    if owner(s, threads) == p {
                        *o = size;
                        size += n - s;
                    }
                }
                (size, offs)
            })
            .collect();
        let setup = Setup {
            d,
            n,
            tsize,
            w,
            threads,
            f,
            lb,
            mnul,
            mall,
            mlo,
            rowoff: rowoff.clone(),
            colbase: (0..n).map(|t| tt(t, 0)).collect(),
            ring: (0..w * tsize).map(|_| AtomicU64::new(INF.to_bits())).collect(),
            barrier: SpinBarrier { count: AtomicUsize::new(0), generation: AtomicUsize::new(0), n: threads },
        };
        let args = if threads == 1 {
            vec![setup.work(0, &layout[0])]
        } else {
            std::thread::scope(|scope| {
                let handles: Vec<_> = (1..threads)
                    .map(|p| {
                        scope.spawn({
                            let (setup, layout) = (&setup, &layout);
                            move || setup.work(p, &layout[p])
                        })
                    })
                    .collect();
                let mut all = vec![setup.work(0, &layout[0])];
                all.extend(handles.into_iter().map(|h| h.join().expect("a rotor worker panicked")));
                all
            })
        };
        Dp { n, tsize, ring: setup.ring, rowoff, w, threads, args, layout }
    }

    fn arg(&self, s: usize, t: usize, m: usize) -> u16 {
        let p = owner(s, self.threads);
        let (size, offs) = &self.layout[p];
        self.args[p][m * size + offs[s] + (t - s)]
    }

    /// `C(0, top, m)` if finite (only the last slices' values are at hand: `m` must be the last).
    fn value(&self, m: usize, top: usize) -> Option<f64> {
        let v = f64::from_bits(self.ring[(m % self.w) * self.tsize + self.rowoff[0] + top].load(Ordering::Relaxed));
        (v < INF).then_some(v)
    }

    /// Algorithm 4 (OptRecP), iteratively.
    fn reconstruct(&self, d: &Discrete, memory: usize) -> Vec<Op> {
        enum Task {
            Solve(usize, usize, usize),
            Emit(Op),
        }
        let l = self.n - 1;
        let fwd = |stage, mode| Op::Forward { stage, mode };
        let mut ops = Vec::new();
        let mut stack = vec![Task::Solve(0, l, memory)];
        while let Some(task) = stack.pop() {
            let (s, t, m) = match task {
                Task::Emit(op) => {
                    ops.push(op);
                    continue;
                }
                Task::Solve(s, t, m) => (s, t, m),
            };
            let a = self.arg(s, t, m);
            assert_ne!(a, ARG_NONE, "a feasible DP state refers to an infeasible one: (s, t, m) = ({s}, {t}, {m})");
            if s == t {
                if s < l {
                    ops.push(fwd(s, ForwardMode::KeepAll));
                }
                ops.push(Op::Backward { stage: s });
            } else if a == ARG_ALL {
                ops.push(fwd(s, ForwardMode::KeepAll));
                stack.push(Task::Emit(Op::Backward { stage: s }));
                stack.push(Task::Solve(s + 1, t, m - d.xbar[s + 1]));
            } else {
                let j = a as usize;
                ops.push(fwd(s, ForwardMode::Checkpoint));
                ops.extend((s + 1..j).map(|h| fwd(h, ForwardMode::Discard)));
                stack.push(Task::Solve(s, j - 1, m));
                stack.push(Task::Solve(j, t, m - d.x[j]));
            }
        }
        ops
    }
}

#[cfg(test)]
mod tests {

    use super::*;
    use crate::brute::tests::check;
    use crate::testkit::{random_chain, Rng};
    use pebble_sim::{simulate_chain, SimConfig};

    fn store_all_peak(chain: &Chain) -> u64 {
        let s = Schedule::new(View::Chain, crate::baseline::store_all_ops(chain.len()));
        simulate_chain(chain, &s, &SimConfig::default()).unwrap().peak_bytes
    }

    fn recompute_all_peak(chain: &Chain) -> u64 {
        let s = Schedule::new(View::Chain, crate::baseline::recompute_all_ops(chain.len()));
        simulate_chain(chain, &s, &SimConfig::default()).unwrap().peak_bytes
    }

    #[test]
    fn medium_chains_are_valid_and_monotone() {
        let mut rng = Rng::new(31);
        for _ in 0..6 {
            let chain = random_chain(&mut rng, 40);
            let (lo, hi) = (recompute_all_peak(&chain), store_all_peak(&chain));
            let (mut last, mut last_exact) = (f64::INFINITY, f64::INFINITY);
            for k in 0..=10 {
                let budget = lo + (hi - lo) * k / 10;
                // Rounding up may make the least budgets infeasible.
                if let Ok((t, ops)) = persistent(&chain, budget, Slots::Count(100)) {
                    check(&chain, budget, &ops, t, "rotor");
                    assert!(t <= last + 1e-9, "more memory, more time");
                    last = t;
                }
                let (te, ops) = persistent(&chain, budget, Slots::Exact).unwrap();
                check(&chain, budget, &ops, te, "rotor (exact)");
                assert!(te <= last + 1e-9, "rounding up can only cost time");
                assert!(te <= last_exact + 1e-9, "more memory, more time");
                last_exact = te;
            }
            assert_eq!(last_exact, chain.ideal_time());
            assert!(last < f64::INFINITY);
        }
    }

    #[test]
    fn workers_agree() {
        let mut rng = Rng::new(8);
        for l in [9, 30, 61] {
            let chain = random_chain(&mut rng, l);
            let (lo, hi) = (recompute_all_peak(&chain), store_all_peak(&chain));
            for k in [1, 3, 6] {
                let budget = lo + (hi - lo) * k / 8;
                let one = persistent_with(&chain, budget, Slots::Count(120), Some(1)).unwrap();
                check(&chain, budget, &one.1, one.0, "rotor");
                for threads in [2, 3, 5] {
                    let many = persistent_with(&chain, budget, Slots::Count(120), Some(threads)).unwrap();
                    assert_eq!(many, one, "{threads} workers, L = {l}");
                }
            }
        }
    }
}
