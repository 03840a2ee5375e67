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
//! choice made at every `(s, t, m)` is kept for all `m`, a byte each (`0` infeasible, `254`
//! the `F^all` branch, else `j − s` for the `j` of `C2`; the rare `j − s ≥ 254`, on chains
//! of more than 254 stages, are kept aside in a sorted list), which is all OptRecP needs.
//!
//! * Before each slice the right-hand terms `G[t][j] = F[j] + C(j, t, m − x[j])` (`F` the
//!   prefix sums of `ftime`, so `Σ_{k=s}^{j−1} ftime[k] = F[j] − F[s]`) are gathered into a
//!   column-major triangle, so that `C2` is a contiguous min-plus reduction of column `t`
//!   of `G` against row `s` of the current slice (kept indexed by `j`, to line up with the
//!   column). It runs over chunks of 16 terms (`G`'s columns are padded with `∞`, so that
//!   every chunk is whole): a vectorized minimum per chunk, the first chunk that reaches
//!   the least, and a search for the first position in that chunk only.
//! * Pruning: `C2`'s term for `j` is at least `F[j] − F[s] + LB(s, t)` (`LB` = every stage
//!   once), and `C(s, t, m) ≤ min(C1, C(s, t, m−1))`, so the reduction stops at the first
//!   chunk whose first `j` has a bound above that. A cell whose value at `m − 1` already was
//!   `LB(s, t)` keeps its choice.
//! * Rows are dealt in groups of four to up to eight worker threads, back and forth (when
//!   the table is large and no size is zero: with zero sizes, rows of one slice depend on
//!   each other); within a slice each row depends only on itself and on earlier slices, so
//!   the workers meet once per slice. The result does not depend on the number of workers.
//!   A worker runs its groups column by column, in the same order every slice, with what
//!   it needs of each cell laid out in that order; when a group starts, the values `C1`
//!   reads, `C(s+1, t, m − ā(s+1))`, are copied out of the ring a row at a time (read cell
//!   by cell, they miss the caches and stall the worker).
//!
//! The cost is `O(S·L³)` additions; ResNet-1001's chain (L = 339) at 500 slots solves in
//! 0.33–0.55 s (70% down to 20% of the activation memory) on two idle cores of a 2.6 GHz
//! Xeon VM (the code is SSE2-only, as `unsafe` and `-C target-cpu` are both off the
//! table). The command that measures it is in `docs/benchmarks.md`.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use pebble_graph::Chain;
use pebble_schedule::{ForwardMode, Op, Schedule, View};

use crate::discretize::{discretize, first_fitting, ops_time, store_all_if_it_fits, Discrete};
use crate::{Problem, Progress, Slots, SolveError, SolveOptions, Solver};

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

    fn solve(&self, problem: Problem<'_>, budget: u64, options: &SolveOptions) -> Result<Schedule, SolveError> {
        let chain = problem.chain_for(self.name())?;
        let (_, ops) = persistent_with(chain, budget, options.slots, None, &options.progress)?;
        Ok(Schedule::new(View::Chain, ops))
    }
}

inventory::submit!(crate::Registration(&Rotor));

const INF: f64 = f64::INFINITY;
const ARG_NONE: u16 = 0;
const ARG_ALL: u16 = u16::MAX;
/// The choices as the table keeps them, a byte each: `0` infeasible ([`ARG_NONE`]),
/// `CODE_ALL` the `F^all` branch ([`ARG_ALL`]), `CODE_FAR` a `j` with `j − s ≥ CODE_ALL`
/// (kept aside), else `j − s`.
const CODE_ALL: u8 = 254;
const CODE_FAR: u8 = 255;
/// Largest table of choices (entries of a byte) the solver allocates.
const MAX_ENTRIES: usize = 1 << 28;
/// Largest ring of values (entries of eight bytes) the solver allocates.
const MAX_RING: usize = 1 << 26;

/// Solves `C_MP` for `chain` within `budget`: the DP's value (the schedule's time) and
/// the schedule's ops.
pub(crate) fn persistent(chain: &Chain, budget: u64, slots: Slots) -> Result<(f64, Vec<Op>), SolveError> {
    persistent_with(chain, budget, slots, None, &Progress::none())
}

/// [`persistent`] with `threads` workers (where the table allows more than one), or as
/// many as the machine has, reporting the memory slices done to `progress`.
pub(crate) fn persistent_with(
    chain: &Chain,
    budget: u64,
    slots: Slots,
    threads: Option<usize>,
    progress: &Progress,
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
    let dp = Dp::run(&d, threads, progress);
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
    /// Per worker, the choices of its cells for every slice (coded, see [`CODE_FAR`]): slice
    /// `m`, then cell by cell in the order the worker computes them.
    args: Vec<Vec<u8>>,
    /// Per worker, the `(index in args, j)` of its choices coded [`CODE_FAR`], in index order.
    far: Vec<Vec<(u32, u16)>>,
    /// Per worker, its number of cells.
    sizes: Vec<usize>,
    /// Per cell `(s, t)` (row-major), its place among its worker's cells.
    at: Vec<u32>,
}

/// Chunk width of `C2`'s reduction.
const LANES: usize = 16;

/// The lesser of `x` and `y` (`y` if they are equal), as `minpd` computes it.
#[inline]
fn mn(x: f64, y: f64) -> f64 {
    if x < y {
        x
    } else {
        y
    }
}

/// `min_k a[k] + b[k]` over the `k < key.len()` with `key[k] ≤ limit` (a prefix: `key` is
/// non-decreasing), or more `k` (whole chunks of [`LANES`]), and the first chunk that holds
/// it; `∞` if no sum is finite. `a` and `b` hold whole chunks, `a` padded with `∞` past
/// `key.len()`. Chunk by chunk, while the chunk's first key passes: a vectorized minimum
/// of the chunk's sums.
#[inline]
fn min_low(a: &[f64], b: &[f64], key: &[f64], limit: f64) -> (f64, usize) {
    let chunks = key.len().div_ceil(LANES);
    let (a, b) = (&a[..chunks * LANES], &b[..chunks * LANES]);
    let mut best = INF;
    let mut hit = 0;
    for (c, (ca, cb)) in a.chunks_exact(LANES).zip(b.chunks_exact(LANES)).enumerate() {
        if key[c * LANES] > limit {
            break;
        }
        let v: [f64; LANES] = std::array::from_fn(|k| ca[k] + cb[k]);
        let v: [f64; 8] = std::array::from_fn(|k| mn(v[k], v[k + 8]));
        let v: [f64; 4] = std::array::from_fn(|k| mn(v[k], v[k + 4]));
        let low = mn(mn(v[0], v[2]), mn(v[1], v[3]));
        if low < best {
            hit = c;
        }
        best = mn(low, best);
    }
    (best, hit)
}

/// The first `k` in chunk `hit` (see [`min_low`]) with `a[k] + b[k] == low`, which the
/// chunk holds.
#[inline]
fn first_at(a: &[f64], b: &[f64], hit: usize, low: f64) -> usize {
    let (ca, cb) = (&a[hit * LANES..(hit + 1) * LANES], &b[hit * LANES..(hit + 1) * LANES]);
    let mask = (0..LANES).fold(0u32, |mask, k| mask | (u32::from(ca[k] + cb[k] == low) << k));
    hit * LANES + mask.trailing_zeros() as usize
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

/// What a worker knows of one of its cells `(s, t)`, in the order it computes them.
#[derive(Clone, Copy)]
struct Cell {
    s: u32,
    t: u32,
    /// Index of `(s, t)` in a row-major triangle.
    ts: u32,
    /// The least `m` at which `C(s, t, m)` is finite (saturated).
    mlo: u32,
    /// `m_all(s, t)` and `m_∅(s, t)` (saturated).
    mall: u32,
    mnul: u32,
    /// `LB(s, t)`, the least time of `s..t` (every stage once).
    lb: f64,
}

/// What every worker reads.
struct Setup<'a> {
    d: &'a Discrete,
    n: usize,
    tsize: usize,
    w: usize,
    /// Prefix sums of the forward times: `Σ_{k=s}^{j−1} ftime[k] = f[j] − f[s]`.
    f: Vec<f64>,
    /// Start of row `s` in a row-major triangle (row `s` holds `t = s..=L`).
    rowoff: Vec<usize>,
    /// Start of column `t` of `G` (column `t` holds `j = 0..=t`, then [`LANES`] times `∞`).
    colbase: Vec<usize>,
    /// The last `w` slices of values (`f64` bits), row-major triangles.
    ring: Vec<AtomicU64>,
    barrier: SpinBarrier,
    /// Whether some size is zero (rows of a slice then depend on each other).
    zero: bool,
    /// Where the first worker reports the slices done.
    progress: &'a Progress,
}

/// Largest number of worker threads.
const MAX_THREADS: usize = 8;
/// Below this many additions, one thread.
const PARALLEL_WORK: usize = 20_000_000;

/// Rows are dealt to the workers in groups of this many consecutive rows; a worker runs
/// the cells of a group column by column, so that the column of `G` they share stays in
/// the L1 cache.
const GROUP: usize = 4;

/// The worker that computes row `s`: groups are dealt back and forth (0, 1, 1, 0, 0, 1, …
/// for two workers), which balances their shrinking costs.
#[inline]
fn owner(s: usize, threads: usize) -> usize {
    let (round, i) = ((s / GROUP) / threads, (s / GROUP) % threads);
    if round % 2 == 0 {
        i
    } else {
        threads - 1 - i
    }
}

/// Worker `p`'s groups of rows, `(first, end)`, in the order it computes them (see
/// `work`).
fn groups(n: usize, threads: usize, p: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..n.div_ceil(GROUP))
        .rev()
        .filter(move |&k| owner(k * GROUP, threads) == p)
        .map(move |k| (k * GROUP, ((k + 1) * GROUP).min(n)))
}

impl Setup<'_> {
    /// A worker: its cells (see [`owner`] and [`groups`]), every slice, in the order of
    /// `cells`. Returns its choices, slice by slice in that order (coded, see
    /// [`CODE_FAR`]), and those coded `CODE_FAR`. The worker that `reports` tells
    /// [`Setup::progress`] of every hundredth of the slices.
    fn work(&self, cells: &[Cell], reports: bool) -> (Vec<u8>, Vec<(u32, u16)>) {
        let d = self.d;
        let (n, tsize, w) = (self.n, self.tsize, self.w);
        let (x, xb) = (&d.x, &d.xbar);
        let (ftime, btime) = (&d.ftime[..n], &d.btime[..n]);
        let f = &self.f;
        let ring = &self.ring;
        let load = |i: usize| f64::from_bits(ring[i].load(Ordering::Relaxed));
        let size = cells.len();
        let mm = d.memory;
        let mut args = vec![0u8; (mm + 1) * size];
        let mut g = vec![INF; self.colbase[n]];
        // Choices coded CODE_FAR: (index in args, j).
        let mut far: Vec<(u32, u16)> = Vec::new();
        // This worker's cells in this slice and the previous one, in the order of `cells`.
        let mut mine = vec![INF; size];
        let mut prev = vec![INF; size];
        // Per row s of the current group (at s % GROUP), indexed by j: C(s, j − 1, m) for
        // j = s+1..=t once column t is reached (stale values after t: G is ∞ there).
        let rlen = n + LANES + 1;
        let mut rows = vec![INF; GROUP * rlen];
        // Per row s of the current group, indexed by t: C(s+1, t, m − ā(s+1)).
        let mut right = vec![INF; GROUP * n];
        // Ring offset of slice m − k, for k < w.
        let mut back = vec![0usize; w];
        let every = (mm + 1).div_ceil(100).max(1);
        for m in 0..=mm {
            if reports && m % every == 0 {
                self.progress.report("rotor: memory slices", m, mm + 1);
            }
            let cm = m % w;
            for (k, b) in back.iter_mut().enumerate().take((m + 1).min(w)) {
                *b = if k <= cm { cm - k } else { cm + w - k } * tsize;
            }
            let cur = back[0];
            // G[t][j] = f[j] + C(j, t, m − x[j]). With x[j] = 0 this reads a stale
            // slice; such entries are refreshed below before they are read (one worker).
            for j in 1..n {
                if x[j] <= m {
                    let src = back[x[j]] + self.rowoff[j];
                    for (&cb, v) in self.colbase[j..n].iter().zip(&ring[src..src + n - j]) {
                        g[cb + j] = f[j] + f64::from_bits(v.load(Ordering::Relaxed));
                    }
                } else {
                    for &cb in &self.colbase[j..n] {
                        g[cb + j] = INF;
                    }
                }
            }
            let m32 = m as u32;
            let (done, rest) = args.split_at_mut(m * size);
            let slice_args = &mut rest[..size];
            let prev_args = if m >= 1 { &done[(m - 1) * size..] } else { &done[..0] };
            for (q, c) in cells.iter().enumerate() {
                let (s, t) = (c.s as usize, c.t as usize);
                let last = prev[q];
                if s == t && s % GROUP == 0 {
                    // A new group (its first cell): `right`, row by row, from the ring.
                    // With ā(s+1) = 0 the row is this slice's, read as it is computed.
                    for (r, s) in (s..(s + GROUP).min(n - 1)).enumerate() {
                        if xb[s + 1] <= m && xb[s + 1] > 0 {
                            let src = back[xb[s + 1]] + self.rowoff[s + 1] - (s + 1);
                            let dst = &mut right[r * n..(r + 1) * n];
                            for (d, v) in dst[s + 1..].iter_mut().zip(&ring[src + s + 1..src + n]) {
                                *d = f64::from_bits(v.load(Ordering::Relaxed));
                            }
                        }
                    }
                }
                let (v, a) = if m32 < c.mlo {
                    (INF, 0)
                } else if s == t {
                    if m32 >= c.mall {
                        (ftime[s] + btime[s], CODE_ALL)
                    } else {
                        (INF, 0)
                    }
                } else if last < INF && last - c.lb <= 1e-12 * last {
                    // Saturated: with one slot less, (s, t) already ran in its least time
                    // LB(s, t) (every stage once); the same choice still does. (`last` is
                    // ∞ at m = 0.)
                    let a = prev_args[q];
                    if a == CODE_FAR {
                        let i = ((m - 1) * size + q) as u32;
                        let j = far[far.partition_point(|e| e.0 < i)].1;
                        far.push(((m * size + q) as u32, j));
                    }
                    (last, a)
                } else {
                    let c1 = if m32 >= c.mall {
                        // m ≥ m_all(s, t) ≥ ā(s+1). With ā(s+1) = 0, C(s+1, t) is this
                        // slice's, just computed (one worker).
                        let sub = if xb[s + 1] == 0 {
                            load(back[0] + c.ts as usize + (n - s) - 1)
                        } else {
                            right[(s % GROUP) * n + t]
                        };
                        ftime[s] + sub + btime[s]
                    } else {
                        INF
                    };
                    let (mut best, mut arg) = if c1 < INF { (c1, CODE_ALL) } else { (INF, 0) };
                    if m32 >= c.mnul {
                        // Pruning: C2 with j costs at least Σ_{k=s}^{j−1} ftime[k] + LB(s, t),
                        // and C(s, t, m) ≤ min(C1, C(s, t, m−1)), so only a prefix of the j
                        // can reach the minimum.
                        let cb = self.colbase[t];
                        let row = &rows[(s % GROUP) * rlen + s + 1..];
                        let upper = c1.min(last);
                        let mut limit = INF;
                        if upper < INF {
                            let slack = upper - c.lb;
                            limit = f[s] + slack + 1e-9 * upper;
                        }
                        let (low, hit) = min_low(&g[cb + s + 1..], row, &f[s + 1..=t], limit);
                        // Ties go to C2, as in Rotor.
                        if low < INF && low - f[s] <= best {
                            best = low - f[s];
                            let d = 1 + first_at(&g[cb + s + 1..], row, hit, low);
                            arg = if d < usize::from(CODE_ALL) {
                                d as u8
                            } else {
                                far.push(((m * size + q) as u32, (s + d) as u16));
                                CODE_FAR
                            };
                        }
                    }
                    (best, arg)
                };
                mine[q] = v;
                ring[cur + c.ts as usize].store(v.to_bits(), Ordering::Relaxed);
                slice_args[q] = a;
                rows[(s % GROUP) * rlen + t + 1] = v;
                if self.zero && s >= 1 && x[s] == 0 {
                    g[self.colbase[t] + s] = f[s] + v;
                }
            }
            std::mem::swap(&mut mine, &mut prev);
            self.barrier.wait();
        }
        if reports {
            self.progress.report("rotor: memory slices", mm + 1, mm + 1);
        }
        (args, far)
    }
}

impl Dp {
    fn run(d: &Discrete, threads: Option<usize>, progress: &Progress) -> Dp {
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
        // Each worker's cells, in the order it computes them; `at[ts]` is the place of
        // cell ts among its worker's.
        let sat = |v: usize| u32::try_from(v).unwrap_or(u32::MAX);
        let mut at = vec![0u32; tsize];
        let cells: Vec<Vec<Cell>> = (0..threads)
            .map(|p| {
                let mut cells = Vec::new();
                for (lo, hi) in groups(n, threads, p) {
                    for t in lo..n {
                        for s in (lo..hi.min(t + 1)).rev() {
                            let ts = rowoff[s] + (t - s);
                            at[ts] = cells.len() as u32;
                            cells.push(Cell {
                                s: s as u32,
                                t: t as u32,
                                ts: ts as u32,
                                mlo: sat(mlo[ts]),
                                mall: sat(mall[ts]),
                                mnul: sat(mnul[ts]),
                                lb: lb[t + 1] - lb[s],
                            });
                        }
                    }
                }
                cells
            })
            .collect();
        let setup = Setup {
            d,
            n,
            tsize,
            w,
            f,
            rowoff: rowoff.clone(),
            colbase: (0..=n).map(|t| tt(t, 0) + t * LANES).collect(),
            ring: (0..w * tsize).map(|_| AtomicU64::new(INF.to_bits())).collect(),
            barrier: SpinBarrier { count: AtomicUsize::new(0), generation: AtomicUsize::new(0), n: threads },
            zero,
            progress,
        };
        let args = if threads == 1 {
            vec![setup.work(&cells[0], true)]
        } else {
            std::thread::scope(|scope| {
                let handles: Vec<_> = (1..threads)
                    .map(|p| {
                        scope.spawn({
                            let (setup, cells) = (&setup, &cells);
                            move || setup.work(&cells[p], false)
                        })
                    })
                    .collect();
                let mut all = vec![setup.work(&cells[0], true)];
                all.extend(handles.into_iter().map(|h| h.join().expect("a rotor worker panicked")));
                all
            })
        };
        let sizes = cells.iter().map(Vec::len).collect();
        let (args, far) = args.into_iter().unzip();
        Dp { n, tsize, ring: setup.ring, rowoff, w, threads, args, far, sizes, at }
    }

    fn arg(&self, s: usize, t: usize, m: usize) -> u16 {
        let p = owner(s, self.threads);
        let i = m * self.sizes[p] + self.at[self.rowoff[s] + (t - s)] as usize;
        match self.args[p][i] {
            0 => ARG_NONE,
            CODE_ALL => ARG_ALL,
            CODE_FAR => {
                let far = &self.far[p];
                far[far.partition_point(|e| (e.0 as usize) < i)].1
            }
            d => (s + usize::from(d)) as u16,
        }
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
    use crate::oracle::brute::tests::check;
    use pebble_sim::{simulate_chain, SimConfig};
    use pebble_testkit::{random_chain, Rng};

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
    fn progress_counts_the_memory_slices_up_to_all_of_them() {
        use std::sync::{Arc, Mutex};
        let chain = pebble_testkit::hand_chain();
        let seen: Arc<Mutex<Vec<(usize, usize)>>> = Arc::default();
        let progress = Progress::new({
            let seen = Arc::clone(&seen);
            move |what, done, total| {
                assert_eq!(what, "rotor: memory slices");
                seen.lock().unwrap().push((done, total));
            }
        });
        // The least budget rotor fits in: below store-all's, so that the DP runs.
        let budget = (1..200).find(|&b| persistent(&chain, b, Slots::Count(300)).is_ok()).expect("a budget fits");
        assert!(store_all_if_it_fits(&chain, budget).is_none());
        persistent_with(&chain, budget, Slots::Count(300), Some(1), &progress).unwrap();
        let seen = seen.lock().unwrap();
        let total = seen[0].1;
        assert!(total > 1 && seen.iter().all(|&(_, t)| t == total), "{seen:?}");
        assert!(seen.windows(2).all(|w| w[0].0 < w[1].0), "{seen:?}");
        assert_eq!(seen.first().unwrap().0, 0);
        assert_eq!(*seen.last().unwrap(), (total, total));
        assert!(seen.len() <= 102, "at most a report per hundredth, and the last: {}", seen.len());
    }

    #[test]
    fn workers_agree() {
        let mut rng = Rng::new(8);
        for l in [9, 30, 61] {
            let chain = random_chain(&mut rng, l);
            let (lo, hi) = (recompute_all_peak(&chain), store_all_peak(&chain));
            for k in [1, 3, 6] {
                let budget = lo + (hi - lo) * k / 8;
                let one = persistent_with(&chain, budget, Slots::Count(120), Some(1), &Progress::none()).unwrap();
                check(&chain, budget, &one.1, one.0, "rotor");
                for threads in [2, 3, 5] {
                    let many =
                        persistent_with(&chain, budget, Slots::Count(120), Some(threads), &Progress::none()).unwrap();
                    assert_eq!(many, one, "{threads} workers, L = {l}");
                }
            }
        }
    }

    #[test]
    fn far_choices_are_kept_aside() {
        // On a long chain, some choices are `j` with `j − s ≥ CODE_ALL`: they are kept aside
        // and read back the same with any number of workers.
        let mut rng = Rng::new(5);
        let chain = random_chain(&mut rng, 300);
        let (lo, hi) = (recompute_all_peak(&chain), store_all_peak(&chain));
        let budget = lo + (hi - lo) * 3 / 10;
        let d = discretize(&chain, budget, Slots::Count(20)).unwrap();
        let one = Dp::run(&d, Some(1), &Progress::none());
        let two = Dp::run(&d, Some(2), &Progress::none());
        assert!(one.far[0].len() > 100, "far choices: {}", one.far[0].len());
        for m in 0..=d.memory {
            for s in 0..=d.l {
                for t in s..=d.l {
                    let a = one.arg(s, t, m);
                    assert_eq!(a, two.arg(s, t, m), "(s, t, m) = ({s}, {t}, {m})");
                    assert!(a == ARG_NONE || a == ARG_ALL || (s < a as usize && a as usize <= t));
                }
            }
        }
        let (time, ops) = persistent_with(&chain, budget, Slots::Count(20), Some(2), &Progress::none()).unwrap();
        check(&chain, budget, &ops, time, "rotor");
    }
}
