//! `rk-rotor`: Rockmate's dynamic program over a sequence of blocks that each offer several
//! forward/backward options (Zhao's thesis §2.5, research digest §2.7), in pebble's own
//! conventions. It is a pure DP on sizes and times: building the options (RK-CHECKMATE) and
//! turning the op sequence into a schedule are the caller's business.
//!
//! # The problem
//!
//! Blocks `0..L`; block `s` reads activation `a_s` (size `x_in`) and produces `a_{s+1}`; the
//! loss reads `a_L` and produces `δ_L`. The backward of block `s` reads `δ_{s+1}` and
//! produces `δ_s`. Each block can be run
//!
//! * as a *fast forward* `F^0` ([`RkOp::FastForward`]): no grad, peak `f0.peak` (which
//!   includes `a_s` and `a_{s+1}`), leaves only `a_{s+1}` (the caller keeps `a_s` if needed);
//! * with an *option* `o` ([`RkOp::Forward`] then, later, [`RkOp::Backward`]): the forward
//!   part peaks at `fwd_peak` (`a_s`, internals, `a_{s+1}`) and leaves `keep` (what the
//!   backward needs, `a_s` included, `a_{s+1}` excluded) besides `a_{s+1}`; the backward
//!   part peaks at `bwd_peak` (`keep`, `δ_{s+1}`, `δ_s`).
//!
//! # The DP
//!
//! `Opt(s, t, m)`, `0 ≤ s ≤ t ≤ L`, is the least time to run blocks `s..t−1` (forward and
//! backward) with `m` bytes available to the sub-problem, `a_s` resident at its start
//! (counted in `m`); if `t < L`, `δ_t` is resident at its start (counted in `m`) and the
//! loss has already run; if `t = L` the loss runs inside. With `d(t)` the size of `δ_t`
//! (`blocks[t−1].delta_out`, `0` for `t = L`):
//!
//! ```text
//! Opt(L, L, m) = loss.time                    if loss.peak ≤ m
//! Opt(t, t, m) = 0                            for t < L
//! Case 1, option o of block s (valid iff fwd_peak + d(t) ≤ m, bwd_peak ≤ m, keep ≤ m):
//!     fwd_time + Opt(s+1, t, m − keep) + bwd_time
//!     ops: Forward{s,o} ++ ops(s+1, t) ++ Backward{s,o}
//! Case 2, s < i < t (valid iff f0[s].peak + d(t) ≤ m and x_in[s] + f0[j].peak + d(t) ≤ m
//!                    for every s < j < i):
//!     Σ_{j=s}^{i−1} f0[j].time + Opt(i, t, m − x_in[s]) + Opt(s, i, m)
//!     ops: FastForward(s) … FastForward(i−1) ++ ops(i, t) ++ ops(s, i)
//! Opt(s, t, m) = min(Case 1, Case 2)          (∞ when both are empty)
//! ```
//!
//! The answer is `Opt(0, L, memory)`. Ties go to Case 1 (options in order), then to Case 2
//! with the smallest `i`.
//!
//! # Limits
//!
//! The DP is exact over *persistent, nested* plans (checked against exhaustive search in
//! the tests): each `a_j` a forward produces is either read by the next op (a `F^0` chain)
//! and dropped, or held until the backward of block `j`; a sub-chain's backward completes
//! before the blocks before it run again; the loss directly follows an option's forward of
//! block `L − 1`. [`evaluate`] accepts more, and exhaustive search over its sequences finds
//! plans faster than the DP (or feasible where the DP finds none) in about 6% of small
//! random chains, of three kinds: `F^0` of block `L − 1` through the loss, then the block
//! again with an option (`δ_L` is smaller than the option's `keep`); an option's forward
//! whose `a_{s+1}` is dropped and later recomputed with `F^0` from the kept `a_s`; and an
//! option's forward of an earlier block hoisted above a backward whose `δ_s` is larger
//! than what that backward frees.
//!
//! # A chain's blocks
//!
//! [`RkChain::from_chain`] gives each stage of a [`Chain`] as a block with one option
//! (`F_all`, then `B`) and `F_∅` as its fast forward, in Rotor's accounting, and
//! [`chain_ops`] writes a plan back as chain ops. On such blocks this DP is Rotor's:
//! the same time wherever it has a plan, and Rotor has one more only through the first
//! kind of plan above (`tests.rs`, `on_a_chains_blocks_rk_rotor_is_rotor`). OffMate's
//! tests use it as Rockmate's plan on OffMate's blocks.
//!
//! # Discretization
//!
//! * `slots = Some(S)`: the budget is cut into slots of `⌈memory / S⌉` bytes and every size
//!   is rounded **up** to whole slots; the DP runs with `⌊memory / slot⌋ ≤ S` slots. Every
//!   check is "a sum of sizes ≤ m", so a plan accepted in slots fits in bytes (each sum of
//!   rounded sizes times the slot bounds the sum in bytes, and the top memory times the
//!   slot is at most `memory`).
//! * `slots = None`: exact sizes when `memory ≤ 10_000` (the slot is the greatest common
//!   divisor of all sizes, which loses nothing), else 500 slots.
//!
//! # Implementation
//!
//! Rows `Opt(s, t, ·)` (a vector over `m`) are stored flat, ordered by interval length
//! `t − s` and then by `s`, so that all rows of one length are contiguous and depend only on
//! earlier (shorter) rows: each length is filled by up to eight scoped threads,
//! each taking a contiguous run of rows. A row is the minimum of `B + (t − s − 1)`
//! shifted copies of earlier rows (one per option, one per `i`), each a contiguous loop over
//! `m`. Beside the values (`f64`), a `u16` choice per cell (`0` none, `1 + o` Case 1 with
//! option `o`, `CASE2 + i` Case 2) is all the reconstruction needs. Cost `O(L²·S·(L + B))`
//! time and `10·S·(L+1)(L+2)/2` bytes of table.

use std::num::NonZeroUsize;

use pebble_graph::Chain;
use pebble_schedule::{ForwardMode, Op};

#[cfg(test)]
mod tests;

/// `F^0`: the forward of a block without grad.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FastForward {
    /// Running time.
    pub time: f64,
    /// Peak bytes while it runs, `a_s` and `a_{s+1}` included.
    pub peak: u64,
}

/// One forward/backward option of a block.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BlockOption {
    /// Time of the forward part.
    pub fwd_time: f64,
    /// Time of the backward part.
    pub bwd_time: f64,
    /// Peak bytes during the forward part: `a_s`, internals, `a_{s+1}`.
    pub fwd_peak: u64,
    /// Bytes resident after the forward part that the backward needs: `a_s` included,
    /// `a_{s+1}` excluded.
    pub keep: u64,
    /// Peak bytes during the backward part: `keep`, `δ_{s+1}` and `δ_s` included.
    pub bwd_peak: u64,
}

/// A block of the sequence.
#[derive(Debug, Clone, PartialEq)]
pub struct RkBlock {
    /// Size of its input `a_s`.
    pub x_in: u64,
    /// Size of `δ_{s+1}`, the gradient of its output.
    pub delta_out: u64,
    /// Its no-grad forward.
    pub f0: FastForward,
    /// Its options (possibly none: then the block cannot be run, and there is no plan).
    pub options: Vec<BlockOption>,
}

/// The loss.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RkLoss {
    /// Running time (forward and backward of the loss).
    pub time: f64,
    /// Peak bytes: `a_L`, `δ_L` and its temporary memory.
    pub peak: u64,
}

/// A sequence of blocks followed by a loss.
#[derive(Debug, Clone, PartialEq)]
pub struct RkChain {
    /// The blocks, in order.
    pub blocks: Vec<RkBlock>,
    /// The loss.
    pub loss: RkLoss,
}

impl RkChain {
    /// A chain's stages as Rockmate's blocks, each with one option, `F_all` then `B`
    /// (OffMate's "PyTorch" option), and `F_∅` as the fast forward: Rotor's model in
    /// rk-Rotor's terms, sizes as [`rotor`](crate::remat::rotor) counts them.
    ///
    /// * `f0`: `ftime[s]`, peak `x[s] + x[s+1] + ftmp[s]`;
    /// * the option: `ftime[s]` and `btime[s]`; forward peak `x[s] + xbar[s+1] + ftmp[s]`;
    ///   `keep` the saved set less `a_{s+1}`, plus `a_s`: `x[s] + xbar[s+1] − x[s+1]`;
    ///   backward peak `keep + a_{s+1} + δ_{s+1} + δ_s + btmp[s]` (Rotor holds the saved
    ///   set whole, `a_{s+1}` included, until `B_s`);
    /// * the loss: `btime[L]`, peak `a_L + δ_L + btmp[L]`.
    ///
    /// Static memory is the caller's: plan in the budget less `static_bytes` (`a_0` is
    /// counted in rk-Rotor's memory, as in Rotor's budget).
    pub fn from_chain(chain: &Chain) -> RkChain {
        let (x, xbar) = (&chain.x, &chain.xbar);
        let blocks = (0..chain.len())
            .map(|s| {
                let keep = x[s] + xbar[s + 1].saturating_sub(x[s + 1]);
                RkBlock {
                    x_in: x[s],
                    delta_out: x[s + 1],
                    f0: FastForward { time: chain.ftime[s], peak: x[s] + x[s + 1] + chain.ftmp[s] },
                    options: vec![BlockOption {
                        fwd_time: chain.ftime[s],
                        bwd_time: chain.btime[s],
                        fwd_peak: x[s] + xbar[s + 1] + chain.ftmp[s],
                        keep,
                        bwd_peak: keep + 2 * x[s + 1] + x[s] + chain.btmp[s],
                    }],
                }
            })
            .collect();
        let l = chain.len();
        RkChain { blocks, loss: RkLoss { time: chain.btime[l], peak: 2 * x[l] + chain.btmp[l] } }
    }
}

/// An rk-Rotor plan of [`RkChain::from_chain`] as chain ops, the way Rotor writes its
/// own: an option's forward is `F_all`, the loss `B_L`; a fast forward is `F_ck` where its
/// input is read again before a forward recomputes it (the start of a recomputed run),
/// else `F_∅`.
pub fn chain_ops(ops: &[RkOp]) -> Vec<Op> {
    let forward_of = |op: &RkOp| match *op {
        RkOp::FastForward(b) | RkOp::Forward { block: b, .. } => Some(b),
        RkOp::Loss | RkOp::Backward { .. } => None,
    };
    let read_again = |k: usize, h: usize| {
        ops[k + 1..].iter().filter_map(forward_of).find(|&b| b == h || b + 1 == h).is_some_and(|b| b == h)
    };
    let l = ops.iter().filter(|op| matches!(op, RkOp::Backward { .. })).count();
    ops.iter()
        .enumerate()
        .map(|(k, op)| match *op {
            RkOp::FastForward(h) => Op::Forward {
                stage: h,
                mode: if read_again(k, h) { ForwardMode::Checkpoint } else { ForwardMode::Discard },
            },
            RkOp::Forward { block, .. } => Op::Forward { stage: block, mode: ForwardMode::KeepAll },
            RkOp::Loss => Op::Backward { stage: l },
            RkOp::Backward { block, .. } => Op::Backward { stage: block },
        })
        .collect()
}

/// One step of an rk-Rotor plan.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RkOp {
    /// `F^0` of a block.
    FastForward(usize),
    /// The forward part of an option.
    Forward {
        /// The block.
        block: usize,
        /// The option.
        option: usize,
    },
    /// The loss (forward and backward).
    Loss,
    /// The backward part of an option.
    Backward {
        /// The block.
        block: usize,
        /// The option.
        option: usize,
    },
}

/// A plan and its time.
#[derive(Debug, Clone, PartialEq)]
pub struct RkSolution {
    /// The ops, in order.
    pub ops: Vec<RkOp>,
    /// Their total time (the DP's value).
    pub time: f64,
}

/// Largest number of worker threads filling the table.
const MAX_THREADS: usize = 8;
/// Below this many cell updates per interval length, one thread.
const PARALLEL_WORK: usize = 1 << 18;
/// Slot count used when `slots` is `None` and the budget is above [`EXACT_LIMIT`].
const DEFAULT_SLOTS: usize = 500;
/// Largest budget solved in exact sizes when `slots` is `None`.
const EXACT_LIMIT: u64 = 10_000;
/// Choice codes at or above this are Case 2 (`code − CASE2` is `i`).
const CASE2: u16 = 0x8000;

/// The most blocks, and options per block, minus one, that [`rk_rotor`] takes (choices
/// are stored in 15 bits); callers check it, and `rk_rotor` asserts it.
pub const MAX_BLOCKS: usize = CASE2 as usize;

/// The chain's sizes in slots, each capped at `top + 1` (anything above `top` never fits).
struct Quantized {
    /// Slots available at the top.
    top: usize,
    /// `x_in[s]`, `L` entries.
    x: Vec<usize>,
    /// `d(t)`, `L + 1` entries (`d(0)` unused, `d(L) = 0`).
    d: Vec<usize>,
    /// `f0[s].peak`, `L` entries.
    f0p: Vec<usize>,
    /// Per block, per option: `(fwd_peak, keep, bwd_peak)`.
    opts: Vec<Vec<(usize, usize, usize)>>,
    /// `loss.peak`.
    loss: usize,
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

impl Quantized {
    fn new(chain: &RkChain, memory: u64, slots: Option<usize>) -> Quantized {
        let sizes = || {
            chain
                .blocks
                .iter()
                .flat_map(|b| {
                    [b.x_in, b.delta_out, b.f0.peak]
                        .into_iter()
                        .chain(b.options.iter().flat_map(|o| [o.fwd_peak, o.keep, o.bwd_peak]))
                })
                .chain([chain.loss.peak])
        };
        let slot = if slots.is_none() && memory <= EXACT_LIMIT {
            sizes().fold(0, gcd).max(1)
        } else {
            slot_bytes(memory, slots)
        };
        let top = (memory / slot) as usize;
        let q = |b: u64| b.div_ceil(slot).min(top as u64 + 1) as usize;
        let l = chain.blocks.len();
        Quantized {
            top,
            x: chain.blocks.iter().map(|b| q(b.x_in)).collect(),
            d: (0..=l).map(|t| if t == 0 || t == l { 0 } else { q(chain.blocks[t - 1].delta_out) }).collect(),
            f0p: chain.blocks.iter().map(|b| q(b.f0.peak)).collect(),
            opts: chain
                .blocks
                .iter()
                .map(|b| b.options.iter().map(|o| (q(o.fwd_peak), q(o.keep), q(o.bwd_peak))).collect())
                .collect(),
            loss: q(chain.loss.peak),
        }
    }
}

/// Bytes per slot for `memory` split in `slots` (`None`: [`DEFAULT_SLOTS`] above
/// [`EXACT_LIMIT`]; below it the sizes' gcd, which [`Quantized::new`] computes).
fn slot_bytes(memory: u64, slots: Option<usize>) -> u64 {
    memory.div_ceil(slots.unwrap_or(DEFAULT_SLOTS).max(1) as u64).max(1)
}

/// The most cells [`rk_rotor`]'s table may have: 10 bytes each (a time and a choice).
pub const MAX_TABLE_CELLS: u64 = 1 << 27;

/// The cells of [`rk_rotor`]'s table for `chain` in `memory` bytes: one row per interval
/// of blocks, one cell per memory slot (at most, where the sizes' gcd sets the slot).
/// Above [`MAX_TABLE_CELLS`], ask for fewer slots.
pub fn table_cells(chain: &RkChain, memory: u64, slots: Option<usize>) -> u64 {
    let l = chain.blocks.len() as u64;
    let rows = (l + 1) * (l + 2) / 2;
    let width = match slots {
        None if memory <= EXACT_LIMIT => memory + 1,
        _ => memory / slot_bytes(memory, slots) + 1,
    };
    rows.saturating_mul(width)
}

/// The filled table.
struct Table {
    l: usize,
    /// Row length, `top + 1`.
    w: usize,
    /// First row of each interval length, `L + 2` entries.
    start: Vec<usize>,
    val: Vec<f64>,
    choice: Vec<u16>,
}

impl Table {
    fn row(&self, s: usize, t: usize) -> usize {
        self.start[t - s] + s
    }
}

/// Fills row `(s, t)` (`t > s`) into `val`/`choice` from the shorter rows in `prev` (rows
/// `0..start[t − s]` of the table).
#[allow(clippy::too_many_arguments)]
fn fill_row(
    chain: &RkChain,
    q: &Quantized,
    start: &[usize],
    w: usize,
    prev: &[f64],
    s: usize,
    t: usize,
    val: &mut [f64],
    choice: &mut [u16],
) {
    val.fill(f64::INFINITY);
    choice.fill(0);
    let top = q.top;
    let row = |a: usize, b: usize| {
        let r = start[b - a] + a;
        &prev[r * w..(r + 1) * w]
    };
    let dt = q.d[t];
    // Case 1.
    let sub = row(s + 1, t);
    for (o, (&(fp, kp, bp), opt)) in q.opts[s].iter().zip(&chain.blocks[s].options).enumerate() {
        let lo = (fp + dt).max(bp).max(kp);
        if lo > top {
            continue;
        }
        let c = opt.fwd_time + opt.bwd_time;
        let code = 1 + o as u16;
        for ((v, ch), &x) in val[lo..].iter_mut().zip(&mut choice[lo..]).zip(&sub[lo - kp..=top - kp]) {
            let y = c + x;
            if y < *v {
                *v = y;
                *ch = code;
            }
        }
    }
    // Case 2.
    let xs = q.x[s];
    let mut need = (q.f0p[s] + dt).max(xs);
    let mut time = chain.blocks[s].f0.time;
    for i in s + 1..t {
        if i > s + 1 {
            need = need.max(xs + q.f0p[i - 1] + dt);
            time += chain.blocks[i - 1].f0.time;
        }
        if need > top {
            break;
        }
        let right = &row(i, t)[need - xs..=top - xs];
        let left = &row(s, i)[need..];
        let code = CASE2 + i as u16;
        for (((v, ch), &a), &b) in val[need..].iter_mut().zip(&mut choice[need..]).zip(right).zip(left) {
            let y = time + a + b;
            if y < *v {
                *v = y;
                *ch = code;
            }
        }
    }
}

fn fill(chain: &RkChain, q: &Quantized) -> Table {
    let l = chain.blocks.len();
    let w = q.top + 1;
    let mut start = vec![0usize; l + 2];
    for len in 0..=l {
        start[len + 1] = start[len] + (l + 1 - len);
    }
    let rows = start[l + 1];
    let mut val = vec![f64::INFINITY; rows * w];
    let mut choice = vec![0u16; rows * w];
    // Length 0: Opt(t, t, ·).
    for t in 0..=l {
        let r = &mut val[t * w..(t + 1) * w];
        if t < l {
            r.fill(0.0);
        } else if q.loss < w {
            r[q.loss..].fill(chain.loss.time);
        }
    }
    let max_opts = chain.blocks.iter().map(|b| b.options.len()).max().unwrap_or(0);
    let threads = std::thread::available_parallelism().map_or(1, NonZeroUsize::get).min(MAX_THREADS);
    for len in 1..=l {
        let (prev, rest) = val.split_at_mut(start[len] * w);
        let n = l + 1 - len;
        let cur = &mut rest[..n * w];
        let ch = &mut choice[start[len] * w..start[len + 1] * w];
        let work = n * w * (max_opts + len);
        let prev: &[f64] = prev;
        let run = |s0: usize, cur: &mut [f64], ch: &mut [u16]| {
            for (k, (v, c)) in cur.chunks_mut(w).zip(ch.chunks_mut(w)).enumerate() {
                let s = s0 + k;
                fill_row(chain, q, &start, w, prev, s, s + len, v, c);
            }
        };
        let parts = if work < PARALLEL_WORK { 1 } else { threads.min(n) };
        if parts <= 1 {
            run(0, cur, ch);
        } else {
            // Later rows (larger s) are no cheaper, so equal runs of rows balance well enough.
            let per = n.div_ceil(parts);
            std::thread::scope(|scope| {
                for (p, (v, c)) in cur.chunks_mut(per * w).zip(ch.chunks_mut(per * w)).enumerate() {
                    let run = &run;
                    scope.spawn(move || run(p * per, v, c));
                }
            });
        }
    }
    Table { l, w, start, val, choice }
}

fn build(q: &Quantized, table: &Table, s: usize, t: usize, m: usize, ops: &mut Vec<RkOp>) {
    if s == t {
        if t == table.l {
            ops.push(RkOp::Loss);
        }
        return;
    }
    let code = table.choice[table.row(s, t) * table.w + m];
    debug_assert!(code != 0, "reconstruction reached an infeasible cell");
    if code >= CASE2 {
        let i = (code - CASE2) as usize;
        ops.extend((s..i).map(RkOp::FastForward));
        build(q, table, i, t, m - q.x[s], ops);
        build(q, table, s, i, m, ops);
    } else {
        let option = (code - 1) as usize;
        ops.push(RkOp::Forward { block: s, option });
        build(q, table, s + 1, t, m - q.opts[s][option].1, ops);
        ops.push(RkOp::Backward { block: s, option });
    }
}

/// The fastest plan of `chain` within `memory` bytes (everything resident counted, `a_0`
/// included), or `None` when no plan of the DP fits. `slots`: see the module docs.
///
/// # Panics
///
/// When a block has 32 768 options or more, or the chain has 32 768 blocks or more (the
/// choice codes are 15 bits).
pub fn rk_rotor(chain: &RkChain, memory: u64, slots: Option<usize>) -> Option<RkSolution> {
    let l = chain.blocks.len();
    assert!(l < MAX_BLOCKS, "rk_rotor: fewer than {MAX_BLOCKS} blocks");
    assert!(
        chain.blocks.iter().all(|b| b.options.len() < MAX_BLOCKS),
        "rk_rotor: fewer than {MAX_BLOCKS} options per block"
    );
    let q = Quantized::new(chain, memory, slots);
    let table = fill(chain, &q);
    let time = table.val[table.row(0, l) * table.w + q.top];
    if !time.is_finite() {
        return None;
    }
    let mut ops = Vec::new();
    build(&q, &table, 0, l, q.top, &mut ops);
    Some(RkSolution { ops, time })
}

/// A tensor of the replay in [`evaluate`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Item {
    /// `a_j`.
    A(usize),
    /// The internals a block's option saved (its `keep` less `a_s`).
    Saved(usize),
    /// `δ_j`.
    D(usize),
}

/// Replays `ops` on `chain`, independently of the DP, and returns their total time and peak
/// bytes, or why the sequence is not well formed.
///
/// # Well-formedness
///
/// * Block and option indices are in range; the loss runs exactly once; every block's
///   [`RkOp::Backward`] runs exactly once, after the loss, in the order `L−1, …, 0`, and
///   nothing follows `Backward` of block 0.
/// * A forward of block `s` ([`RkOp::FastForward`] or [`RkOp::Forward`]) needs `a_s`:
///   `a_0` is there from the start, `a_s` (`s ≥ 1`) once some forward of block `s − 1` ran.
/// * `Backward{s, o}` uses the last `Forward` of block `s` before it, which must exist and
///   have option `o` (a later `Forward{s, o'}` replaces the saved internals; a `FastForward`
///   of block `s` does not touch them).
/// * The loss directly follows a forward of block `L − 1` (`a_L`, whose size the chain does
///   not give, is thus never resident while another op runs).
/// * Every `keep` must be at least its block's `x_in`.
///
/// # Memory rules
///
/// Every op produces new *instances*: `FastForward(s)` and `Forward{s, o}` produce `a_{s+1}`,
/// `Forward{s, o}` also the saved internals of block `s` (`keep − x_in[s]` bytes), the loss
/// `δ_L`, `Backward{s, o}` `δ_s` (nothing for `s = 0`: `δ_0` is no one's input). Ops read:
/// a forward of block `s` the latest `a_s`; the loss the latest `a_L`; `Backward{s, o}` the
/// internals saved by its `Forward`, the **same** `a_s` instance that `Forward` read (the
/// `keep` includes it), and `δ_{s+1}`. An instance is resident from the end of the op that
/// produces it until the end of its last reader (an instance nobody reads is freed at once;
/// `a_0` is resident from the start). While op `k` runs, memory is the resident instances
/// that it does not read, plus its own peak figure (`f0.peak`, `fwd_peak`, `loss.peak`,
/// `bwd_peak`, which include its inputs and outputs). The peak is the largest such sum;
/// `a_0` alone before the first op never exceeds it, as every op counts `a_0`.
pub fn evaluate(chain: &RkChain, ops: &[RkOp]) -> Result<(f64, u64), String> {
    let l = chain.blocks.len();
    for (s, b) in chain.blocks.iter().enumerate() {
        for (o, opt) in b.options.iter().enumerate() {
            if opt.keep < b.x_in {
                return Err(format!("block {s} option {o}: keep {} < x_in {}", opt.keep, b.x_in));
            }
        }
    }
    // Pass 1: structure, and which instances each op reads and produces. An instance is
    // named by the index of the op that produced it (`usize::MAX` for the initial `a_0`).
    const INITIAL: usize = usize::MAX;
    type Inst = (Item, usize);
    let mut latest_a: Vec<Option<usize>> = vec![None; l + 1];
    latest_a[0] = Some(INITIAL);
    // Per block: the last Forward (op index, option, the a_s instance it read).
    let mut last_fwd: Vec<Option<(usize, usize, usize)>> = vec![None; l];
    let mut loss_at: Option<usize> = None;
    let mut next_bwd = l; // the block whose backward comes next is `next_bwd − 1`
    let mut delta_at = 0; // the op that produced the latest δ
    let mut reads: Vec<Vec<Inst>> = Vec::with_capacity(ops.len());
    let mut produces: Vec<Vec<Inst>> = Vec::with_capacity(ops.len());
    let mut time = 0.0;
    for (k, op) in ops.iter().enumerate() {
        if next_bwd == 0 && l > 0 {
            return Err(format!("op {k} ({op:?}) follows the backward of block 0"));
        }
        let block = match *op {
            RkOp::FastForward(s) | RkOp::Forward { block: s, .. } | RkOp::Backward { block: s, .. } => Some(s),
            RkOp::Loss => None,
        };
        if let Some(s) = block {
            if s >= l {
                return Err(format!("op {k} ({op:?}): block {s} out of range (L = {l})"));
            }
        }
        let option = |s: usize, o: usize| {
            chain.blocks[s].options.get(o).ok_or_else(|| format!("op {k} ({op:?}): block {s} has no option {o}"))
        };
        let input = |latest_a: &[Option<usize>], s: usize| {
            latest_a[s].ok_or_else(|| format!("op {k} ({op:?}): a_{s} was never computed"))
        };
        match *op {
            RkOp::FastForward(s) => {
                let a = input(&latest_a, s)?;
                time += chain.blocks[s].f0.time;
                reads.push(vec![(Item::A(s), a)]);
                produces.push(vec![(Item::A(s + 1), k)]);
                latest_a[s + 1] = Some(k);
            }
            RkOp::Forward { block: s, option: o } => {
                let opt = option(s, o)?;
                let a = input(&latest_a, s)?;
                time += opt.fwd_time;
                reads.push(vec![(Item::A(s), a)]);
                produces.push(vec![(Item::A(s + 1), k), (Item::Saved(s), k)]);
                latest_a[s + 1] = Some(k);
                last_fwd[s] = Some((k, o, a));
            }
            RkOp::Loss => {
                if loss_at.is_some() {
                    return Err(format!("op {k}: the loss runs twice"));
                }
                let fed = l == 0
                    || k > 0
                        && matches!(ops[k - 1], RkOp::FastForward(s) | RkOp::Forward { block: s, .. } if s + 1 == l);
                if !fed {
                    return Err(format!(
                        "op {k}: the loss does not directly follow a forward of block {}",
                        l as isize - 1
                    ));
                }
                time += chain.loss.time;
                loss_at = Some(k);
                delta_at = k;
                reads.push(vec![(Item::A(l), if l == 0 { INITIAL } else { k - 1 })]);
                produces.push(vec![(Item::D(l), k)]);
            }
            RkOp::Backward { block: s, option: o } => {
                let opt = option(s, o)?;
                if loss_at.is_none() {
                    return Err(format!("op {k} ({op:?}) runs before the loss"));
                }
                if s + 1 != next_bwd {
                    return Err(format!("op {k} ({op:?}): expected the backward of block {}", next_bwd - 1));
                }
                let Some((f, fo, a)) = last_fwd[s] else {
                    return Err(format!("op {k} ({op:?}): block {s} has no Forward before it"));
                };
                if fo != o {
                    return Err(format!("op {k} ({op:?}): the last Forward of block {s} (op {f}) has option {fo}"));
                }
                time += opt.bwd_time;
                reads.push(vec![(Item::A(s), a), (Item::Saved(s), f), (Item::D(s + 1), delta_at)]);
                delta_at = k;
                produces.push(if s > 0 { vec![(Item::D(s), k)] } else { vec![] });
                next_bwd = s;
            }
        }
    }
    if loss_at.is_none() {
        return Err("the loss never runs".into());
    }
    if next_bwd != 0 {
        return Err(format!("the backward of block {} never runs", next_bwd - 1));
    }
    // Pass 2: last readers.
    let mut last_read: std::collections::HashMap<Inst, usize> = std::collections::HashMap::new();
    for (k, r) in reads.iter().enumerate() {
        for &i in r {
            last_read.insert(i, k);
        }
    }
    // Pass 3: replay.
    let size = |item: Item, producer: usize| -> u64 {
        match item {
            Item::A(j) if j < l => chain.blocks[j].x_in,
            Item::A(_) => 0, // a_L: resident only between its forward and the loss
            Item::Saved(s) => {
                let RkOp::Forward { option, .. } = ops[producer] else { unreachable!() };
                chain.blocks[s].options[option].keep - chain.blocks[s].x_in
            }
            Item::D(j) => chain.blocks[j - 1].delta_out,
        }
    };
    let mut resident: std::collections::HashMap<Inst, u64> = std::collections::HashMap::new();
    let mut total: u64 = 0;
    if last_read.contains_key(&(Item::A(0), INITIAL)) {
        resident.insert((Item::A(0), INITIAL), size(Item::A(0), INITIAL));
        total += size(Item::A(0), INITIAL);
    }
    let mut peak = 0u64;
    for (k, op) in ops.iter().enumerate() {
        let own = match *op {
            RkOp::FastForward(s) => chain.blocks[s].f0.peak,
            RkOp::Forward { block, option } => chain.blocks[block].options[option].fwd_peak,
            RkOp::Loss => chain.loss.peak,
            RkOp::Backward { block, option } => chain.blocks[block].options[option].bwd_peak,
        };
        let inputs: u64 = reads[k].iter().map(|i| resident.get(i).copied().unwrap_or(0)).sum();
        peak = peak.max(total - inputs + own);
        for i in &reads[k] {
            if last_read.get(i) == Some(&k) {
                total -= resident.remove(i).unwrap_or(0);
            }
        }
        for &(item, p) in &produces[k] {
            if last_read.contains_key(&(item, p)) {
                let b = size(item, p);
                resident.insert((item, p), b);
                total += b;
            }
        }
    }
    Ok((time, peak))
}
