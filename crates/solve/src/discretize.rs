//! Memory discretization for Rotor's dynamic programs (Shilova, §2.4.2).
//!
//! The DPs index their tables by available memory, so sizes must be small integers. The
//! budget `M` (bytes, everything counted) is cut into slots and every size is expressed
//! as a whole number of slots:
//!
//! * [`Slots::Count`]`(S)`: the memory left after the static bytes, `A = M − static`, is
//!   split into `S` slots of `slot = ⌈A / S⌉` bytes. Every activation, saved set,
//!   gradient and temporary size is **rounded up** to whole slots, `⌈size / slot⌉`.
//! * [`Slots::Exact`]: the chain's integer units are used as they are. The slot is the
//!   greatest common divisor of the sizes (`x[1..]`, `xbar[1..]`, `ftmp`, `btmp`), which
//!   divides every size exactly, so the DP sees exactly the same problem as with a slot of
//!   one unit, only with smaller numbers.
//!
//! The memory the DP may use is `m = ⌊(M − static − x[0]) / slot⌋` slots: the static
//! bytes and the input `a_0` are resident for the whole step and are counted exactly,
//! outside the DP (Shilova's `M_GPU − a_0`).
//!
//! # Why rounding up is safe
//!
//! Every memory check of the DPs is "the sum of the sizes resident during an op (its
//! outputs and temporary memory included, `a_0` and the static bytes excluded) is at most
//! `m`", in slots. If `Σ ⌈s_i / slot⌉ ≤ m`, then in bytes
//! `Σ s_i ≤ slot · Σ ⌈s_i / slot⌉ ≤ slot · m ≤ M − static − x[0]`, so the true peak of
//! the op, `static + x[0] + Σ s_i`, is at most `M`. Every schedule the DP accepts thus fits
//! the true budget; the price is that some schedules that would fit are rejected (each
//! size is overestimated by less than one slot, i.e. by at most `A / S` bytes). Times are
//! not discretized, so the DP's value is the schedule's true time.
//!
//! The DP's memory is also capped at what store-all needs (in slots): with that much
//! memory the DP already reaches the store-all time, which no schedule beats, and a larger
//! table would change nothing but the cost.
//!
//! # Headroom, checked by the simulator
//!
//! Rounding up wastes up to one slot per resident tensor, so a schedule that fits the
//! budget in bytes may not fit in slots: on ResNet-101 it made the DP miss store-all at
//! exactly store-all's peak, and recompute-all at exactly its own. The DPs therefore fill
//! a few more memory slices than the guaranteed `base` (`headroom`: 4% plus two, none when
//! no size was rounded), reconstruct the schedule of the largest slice downward, and keep
//! the first one the simulator accepts under the true budget ([`first_fitting`]). Slices up
//! to `base` need no check. And when store-all itself fits in bytes, it is the answer
//! ([`store_all_if_it_fits`]): no schedule is faster.

use pebble_graph::Chain;
use pebble_schedule::Op;

use crate::{Slots, SolveError};

/// A chain with its sizes in slots, in the 0-based indexing of [`Chain`], padded so that
/// the DPs never index out of range: the loss (stage `L`) has a zero forward time and no
/// forward temporary memory, and `x[L+1] = xbar[L+1] = 0` (the loss's "output" and its
/// "saved set" do not exist).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Discrete {
    /// Number of stages `L` (the loss is stage `L`).
    pub l: usize,
    /// Bytes per slot.
    pub slot: u64,
    /// `x[i]` in slots, `L+2` entries, `x[L+1] = 0`.
    pub x: Vec<usize>,
    /// `xbar[i]` in slots, `L+2` entries, `xbar[0] = x[0]`, `xbar[L+1] = 0`.
    pub xbar: Vec<usize>,
    /// `ftmp[i]` in slots, `L+1` entries, `ftmp[L] = 0`.
    pub ftmp: Vec<usize>,
    /// `btmp[i]` in slots, `L+1` entries.
    pub btmp: Vec<usize>,
    /// Forward times, `L+1` entries, `ftime[L] = 0` (the loss's whole time is its `btime`).
    pub ftime: Vec<f64>,
    /// Backward times, `L+1` entries.
    pub btime: Vec<f64>,
    /// The largest memory slice the DP fills: `base` plus the headroom, capped at
    /// [`Discrete::store_all_need`].
    pub memory: usize,
    /// Memory guaranteed to fit in slots (`a_0` and the static bytes excluded): every
    /// schedule the DP finds within it fits the budget.
    pub base: usize,
    /// What store-all needs, in slots, counted like `memory`.
    pub store_all_need: usize,
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// The memory store-all needs beyond `a_0`, in the DP's accounting (sizes in slots),
/// summed in `u128` and saturated: a need beyond `usize` is more than any table holds.
fn store_all_need(x: &[usize], xbar: &[usize], ftmp: &[usize], btmp: &[usize], l: usize) -> usize {
    let w = |v: usize| v as u128;
    let mut need = 0u128;
    let mut resident = 0u128; // ā_1 .. ā_i
    for i in 0..l {
        need = need.max(resident + w(xbar[i + 1]) + w(ftmp[i]));
        resident += w(xbar[i + 1]);
    }
    // The loss: everything saved, plus δ_L and its temporary memory.
    need = need.max(resident + w(x[l]) + w(btmp[l]));
    // B_i: ā_1..ā_{i+1}, δ_{i+1}, and the output δ_i.
    for i in (0..l).rev() {
        need = need.max(resident + w(x[i + 1]) + w(x[i]) + w(btmp[i]));
        resident -= w(xbar[i + 1]);
    }
    usize::try_from(need).unwrap_or(usize::MAX)
}

/// The first size (`x[i]`, `xbar[i]` for `i ≥ 1`, `ftmp[i]`, `btmp[i]`) above `room`, named.
/// Every one of them is resident at some point of any schedule (`B_i` reads `ā_{i+1}` and
/// writes `δ_i`; every forward runs), beside the static memory and `a_0`.
fn oversized(chain: &Chain, room: u64) -> Option<(String, u64)> {
    let named = |field: &'static str, v: &[u64], from: usize| {
        v.iter().enumerate().skip(from).map(move |(i, &s)| (field, i, s)).collect::<Vec<_>>()
    };
    [
        named("x", &chain.x, 1),
        named("xbar", &chain.xbar, 1),
        named("ftmp", &chain.ftmp, 0),
        named("btmp", &chain.btmp, 0),
    ]
    .into_iter()
    .flatten()
    .find(|&(_, _, s)| s > room)
    .map(|(field, i, s)| (format!("{field}[{i}]"), s))
}

/// Discretizes `chain` for a budget of `budget` bytes (everything counted).
///
/// Fails with [`SolveError::Infeasible`] when the budget does not even hold the static
/// bytes and `a_0`, or when one size alone does not fit beside them (it names the size).
/// Sizes are summed without overflow, whatever they are (up to `u64::MAX` each).
pub(crate) fn discretize(chain: &Chain, budget: u64, slots: Slots) -> Result<Discrete, SolveError> {
    let l = chain.len();
    // In u128: the two may sum beyond u64::MAX, which no budget holds.
    if u128::from(chain.static_bytes) + u128::from(chain.x[0]) > u128::from(budget) {
        return Err(SolveError::Infeasible {
            budget,
            reason: format!(
                "the static memory ({}) and the input a_0 ({}) alone exceed it",
                chain.static_bytes, chain.x[0]
            ),
        });
    }
    let fixed = chain.static_bytes + chain.x[0];
    if let Some((field, size)) = oversized(chain, budget - fixed) {
        return Err(SolveError::Infeasible {
            budget,
            reason: format!(
                "{field} ({size} bytes) alone exceeds the {} bytes left beside the static memory ({}) and a_0 ({})",
                budget - fixed,
                chain.static_bytes,
                chain.x[0]
            ),
        });
    }
    let slot = match slots {
        Slots::Count(s) => {
            let avail = budget - chain.static_bytes;
            let s = s.max(1) as u64;
            avail.div_ceil(s).max(1)
        }
        Slots::Exact => {
            let sizes = chain.x.iter().chain(&chain.xbar[1..]).chain(&chain.ftmp).chain(&chain.btmp);
            let g = sizes.fold(0u64, |g, &v| gcd(g, v));
            g.max(1)
        }
    };
    // Every size is at most `budget − fixed` (checked above), so a size in slots is at most
    // the available slots plus one; the DPs run only on tables that fit in memory, so
    // their sums of a few sizes cannot overflow.
    let up = |v: u64| -> usize { usize::try_from(v.div_ceil(slot)).unwrap_or(usize::MAX) };
    let mut x: Vec<usize> = chain.x.iter().map(|&v| up(v)).collect();
    x.push(0);
    let mut xbar: Vec<usize> = chain.xbar.iter().map(|&v| up(v)).collect();
    xbar[0] = x[0];
    xbar.push(0);
    let mut ftmp: Vec<usize> = chain.ftmp.iter().map(|&v| up(v)).collect();
    ftmp.push(0);
    let btmp: Vec<usize> = chain.btmp.iter().map(|&v| up(v)).collect();
    let mut ftime = chain.ftime.clone();
    ftime.push(0.0);
    let btime = chain.btime.clone();
    let need = store_all_need(&x, &xbar, &ftmp, &btmp, l);
    let avail = (budget - fixed) / slot;
    let base = usize::try_from(avail).unwrap_or(usize::MAX).min(need);
    let sizes = chain.x.iter().chain(&chain.xbar[1..]).chain(&chain.ftmp).chain(&chain.btmp);
    let rounded = sizes.into_iter().any(|&v| v % slot != 0);
    let headroom = if rounded { base / 25 + 2 } else { 0 };
    let memory = base.saturating_add(headroom).min(need);
    Ok(Discrete { l, slot, x, xbar, ftmp, btmp, ftime, btime, memory, base, store_all_need: need })
}

/// The store-all schedule and its time, if its true peak fits `budget`: no schedule is
/// faster, so the DPs need not run.
pub(crate) fn store_all_if_it_fits(chain: &Chain, budget: u64) -> Option<(f64, Vec<Op>)> {
    let ops = pebble_schedule::store_all_ops(chain.len());
    simulated_time(chain, &ops, budget).map(|t| (t, ops))
}

/// The first schedule, over memory slices from `d.memory` down to `d.base`, that fits
/// `budget` in bytes. `reconstruct(m)` gives slice `m`'s schedule (`None` if the slice is
/// infeasible) and its DP value. A slice above `d.base` is checked with the simulator;
/// `d.base` and below fit by construction.
pub(crate) fn first_fitting(
    chain: &Chain,
    d: &Discrete,
    budget: u64,
    mut reconstruct: impl FnMut(usize) -> Option<(f64, Vec<Op>)>,
) -> Option<(f64, Vec<Op>)> {
    for m in (d.base..=d.memory).rev() {
        let Some((value, ops)) = reconstruct(m) else { continue };
        if m <= d.base || simulated_time(chain, &ops, budget).is_some() {
            return Some((value, ops));
        }
    }
    None
}

/// The time of a chain schedule: the sum of its ops' times (what the DPs' values count).
pub(crate) fn ops_time(chain: &Chain, ops: &[Op]) -> f64 {
    ops.iter()
        .map(|op| match *op {
            Op::Forward { stage, .. } => chain.ftime[stage],
            Op::Backward { stage } => chain.btime[stage],
            _ => 0.0,
        })
        .sum()
}

fn simulated_time(chain: &Chain, ops: &[Op], budget: u64) -> Option<f64> {
    let schedule = pebble_schedule::Schedule::new(pebble_schedule::View::Chain, ops.to_vec());
    let config = pebble_sim::SimConfig { budget: Some(budget), ..Default::default() };
    pebble_sim::simulate_chain(chain, &schedule, &config).ok().map(|r| r.makespan)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pebble_schedule::{Schedule, View};
    use pebble_sim::{simulate_chain, SimConfig};

    use pebble_testkit::hand_chain as chain;

    #[test]
    fn exact_uses_the_gcd_and_counts_a0_and_static_outside() {
        let mut c = chain();
        let d = discretize(&c, 100, Slots::Exact).unwrap();
        assert_eq!(d.slot, 1);
        assert_eq!(d.x, vec![4, 3, 5, 2, 0]);
        assert_eq!(d.xbar, vec![4, 6, 9, 7, 0]);
        assert_eq!(d.ftmp, vec![2, 1, 3, 0]);
        assert_eq!(d.ftime, vec![1.0, 2.0, 4.0, 0.0]);
        // Store-all's peak minus static and a_0.
        let s = Schedule::new(View::Chain, pebble_schedule::store_all_ops(3));
        let peak = simulate_chain(&c, &s, &SimConfig::default()).unwrap().peak_bytes;
        assert_eq!(d.store_all_need as u64, peak - 14);
        assert_eq!(d.memory, d.store_all_need.min(100 - 14));
        let d = discretize(&c, 30, Slots::Exact).unwrap();
        assert_eq!(d.memory, 16);
        assert!(discretize(&c, 13, Slots::Exact).is_err());
        // Scaled sizes: the gcd is the slot, the problem is the same.
        for v in c.x.iter_mut().chain(&mut c.xbar).chain(&mut c.ftmp).chain(&mut c.btmp) {
            *v *= 6;
        }
        let d = discretize(&c, 10 + 24 + 6 * 16 + 5, Slots::Exact).unwrap();
        assert_eq!(d.slot, 6);
        assert_eq!(d.x, vec![4, 3, 5, 2, 0]);
        assert_eq!(d.memory, 16);
    }

    /// Sizes near `u64::MAX` neither overflow nor wrap: a size that cannot fit is named,
    /// static memory and `a_0` beyond `u64::MAX` are infeasible, and sizes that fit one by
    /// one but sum beyond `u64::MAX` discretize (store-all's need saturates).
    #[test]
    fn sizes_near_u64_max_are_errors_or_saturate() {
        let mut c = chain();
        c.x[2] = u64::MAX - 3;
        c.xbar[2] = u64::MAX - 3;
        for slots in [Slots::Exact, Slots::Count(500)] {
            match discretize(&c, u64::MAX, slots) {
                Err(SolveError::Infeasible { reason, .. }) => {
                    assert!(reason.starts_with("x[2] (18446744073709551612 bytes) alone exceeds"), "{reason}")
                }
                other => panic!("{other:?}"),
            }
        }
        let mut c = chain();
        c.static_bytes = u64::MAX - 1;
        match discretize(&c, u64::MAX, Slots::Exact) {
            Err(SolveError::Infeasible { reason, .. }) => assert!(reason.contains("alone exceed it"), "{reason}"),
            other => panic!("{other:?}"),
        }
        // Each saved set fits beside static memory and a_0, their sum does not.
        let mut c = chain();
        let half = u64::MAX / 2;
        c.x = vec![4, 3, half - 20, 2];
        c.xbar = vec![4, half - 20, half - 20, half - 20];
        for slots in [Slots::Exact, Slots::Count(500)] {
            let d = discretize(&c, u64::MAX, slots).unwrap();
            assert!(d.store_all_need >= d.memory, "{slots:?}");
            if slots == Slots::Count(500) {
                // Slots of ⌈(2⁶⁴ − 11) / 500⌉ bytes: each large size is about 250 of them.
                assert_eq!(d.xbar[1], 250);
                assert!(d.memory <= 500 + 500 / 25 + 2);
            } else {
                assert_eq!(d.store_all_need, usize::MAX, "the need saturates");
            }
        }
    }

    #[test]
    fn count_rounds_sizes_up_and_memory_down() {
        let c = chain();
        // A = 1000 − 10 = 990 bytes in 100 slots of 10 bytes.
        let d = discretize(&c, 1000, Slots::Count(100)).unwrap();
        assert_eq!(d.slot, 10);
        assert_eq!(d.x, vec![1, 1, 1, 1, 0]);
        assert_eq!(d.btmp, vec![1, 1, 1, 1]);
        // Tiny budget: one byte per slot.
        let d = discretize(&c, 40, Slots::Count(500)).unwrap();
        assert_eq!(d.slot, 1);
        assert_eq!(d.memory, 26);
        // 7 slots of ⌈(40 − 10) / 7⌉ = 5 bytes: m = ⌊(40 − 14) / 5⌋ = 5, and sizes were
        // rounded, so 5/25 + 2 = 2 slices of headroom.
        let d = discretize(&c, 40, Slots::Count(7)).unwrap();
        assert_eq!((d.slot, d.base, d.memory), (5, 5, 7));
        assert_eq!(d.xbar, vec![1, 2, 2, 2, 0]);
    }
}
