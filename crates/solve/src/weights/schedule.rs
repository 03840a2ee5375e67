//! Algorithm 2 (greedy scheduling) of Beaumont et al. 2022: the cyclic schedule of a
//! selection's transfers, and L2L's schedule, as periodic pebble schedules.
//!
//! The scheduler times one period the way the paper does, on three resources (compute,
//! the offload link, the prefetch link) and a memory timeline, from `B_L`:
//!
//! * prefetches go in the order their weights are needed, each at the earliest time the
//!   link is free, its host copy complete and its buffer fits for good (the digest's
//!   reading of "earliest time when `Pre_k` is feasible");
//! * offloads go first in, first out; a layer chosen `(k, 1)` only is uploaded from the
//!   waiting list `WL` (smallest first) while the offload link would otherwise sit idle
//!   for that long before an `Off_k`, and is then only dropped after `F_k`;
//! * a compute op starts when its weights are in, the op before it is done and its
//!   memory fits (the digest's rule 3; the printed algorithm lists only the first two);
//! * an op's memory besides weights is [`WeightChain::op_memory`] while it runs and
//!   [`WeightChain::kept_after`] from its end to the next op's start;
//! * a weight offloaded or deleted is released when its offload ends (the buffer rule).
//!
//! A *cut* `c` says that the first `c` prefetches of the backward pass are done before
//! `B_L`, i.e. at the end of the previous period, after the forward pass's transfers;
//! every cut is tried (the paper's loop, read on the prefetch sequence since a cut among
//! the offloads would take a weight away before its update). The period is the end of
//! `F_L` or of the last transfer, whichever is later.
//!
//! Each timed transfer is then placed after the last compute op that ends by its planned
//! start, and the period is written in pebble's order (`F_1 … F_L`, the loss, `B_L … B_1`)
//! as a [periodic](Schedule::periodic) schedule: the simulator, not this module, says what
//! it costs. Without the discount (the paper's Greedy*), `(k, 1)` is offloaded after
//! `F_k` every time, even when a valid host copy exists, and nothing is uploaded.

use pebble_machine::Machine;
use pebble_schedule::{ForwardMode, Op, Schedule, Tensor, View};

use super::selection::Choice;
use super::{Accounting, WeightChain, WeightOp};

/// Slack on time comparisons.
const EPS: f64 = 1e-12;

/// Device memory over time: deltas at times, kept sorted, above a level at time 0.
struct Timeline {
    events: Vec<(f64, i128)>,
}

impl Timeline {
    fn add(&mut self, time: f64, delta: i128) {
        let at = self.events.partition_point(|e| e.0 <= time);
        self.events.insert(at, (time, delta));
    }

    /// The earliest `t ≥ from` such that `need` more bytes fit under `cap` at `t` and at
    /// every later time; `None` if they never do.
    fn earliest(&self, from: f64, need: i128, cap: i128) -> Option<f64> {
        let mut level = 0i128;
        // The time after which memory stays within `cap − need`.
        let mut clear = f64::NEG_INFINITY;
        let mut violated = false;
        let mut i = 0;
        while i < self.events.len() {
            let t = self.events[i].0;
            while i < self.events.len() && self.events[i].0 == t {
                level += self.events[i].1;
                i += 1;
            }
            if level + need > cap {
                violated = true;
            } else if violated {
                clear = t;
                violated = false;
            }
        }
        if violated {
            return None;
        }
        Some(from.max(clear))
    }
}

/// A transfer placed in time.
#[derive(Debug, Clone, Copy)]
struct Planned {
    start: f64,
    op: Op,
}

/// One period, timed.
struct Period {
    /// Compute ops in the window's order (`B_L … B_1, F_1 … F_L`) with their starts and ends.
    ends: Vec<(WeightOp, f64, f64)>,
    transfers: Vec<Planned>,
    /// Drops (`Free`) right after `F_k`.
    drops: Vec<usize>,
    makespan: f64,
}

fn weight(k: usize) -> Tensor {
    Tensor::Weight(k - 1)
}

/// Algorithm 2 at one cut: `early` is how many of the backward prefetches are done at the
/// end of the previous period. `None` if some op never fits.
fn schedule_at_cut(
    chain: &WeightChain,
    chosen: &[Choice],
    memory: u64,
    machine: &Machine,
    discount: bool,
    early: usize,
) -> Option<Period> {
    let l = chain.len();
    let sel1: Vec<bool> = (0..=l).map(|k| chosen.contains(&Choice { layer: k, after_forward: true })).collect();
    let sel0: Vec<bool> = (0..=l).map(|k| chosen.contains(&Choice { layer: k, after_forward: false })).collect();
    let back_prefetches: Vec<usize> = (1..=l).rev().filter(|&k| sel1[k]).collect();
    let early_set: Vec<usize> = back_prefetches[..early.min(back_prefetches.len())].to_vec();
    let cap = memory as i128;
    let w = |k: usize| chain.weight(k) as i128;
    let m = |o: WeightOp| chain.op_memory(o, Accounting::Consistent) as i128;

    // Weights on the device when B_L begins.
    let present = |k: usize| !sel1[k] || early_set.contains(&k);
    // Before B_L, what F_L left.
    let last = chain.kept_after(WeightOp::Forward(l)) as i128;
    let base: i128 = (1..=l).filter(|&k| present(k)).map(w).sum::<i128>() + last;
    let mut mem = Timeline { events: vec![(0.0, base)] };
    let (mut t_off, mut t_pre) = (0.0f64, 0.0f64);
    let mut host_ready = vec![0.0f64; l + 1];
    let mut uploaded = vec![false; l + 1];
    let mut b_end = vec![0.0f64; l + 1];
    let mut transfers = Vec::new();
    let mut drops = Vec::new();
    let mut ends = Vec::with_capacity(2 * l);
    let (mut prev_end, mut prev_mem) = (0.0f64, last);

    // A compute op: after `ready`, the op before, and when its memory fits.
    let mut run = |mem: &mut Timeline, o: WeightOp, ready: f64, ends: &mut Vec<(WeightOp, f64, f64)>| -> Option<f64> {
        let delta = m(o) - prev_mem;
        let start = mem.earliest(ready.max(prev_end), delta, cap)?;
        mem.add(start, delta);
        prev_end = start + chain.time(o);
        prev_mem = chain.kept_after(o) as i128;
        mem.add(prev_end, prev_mem - m(o));
        ends.push((o, start, prev_end));
        Some(prev_end)
    };
    // A prefetch is issued when a compute op ends (pebble's schedules place transfers
    // between compute ops): one that would start inside an op waits for its end, so
    // that it never takes memory the op allocates when it starts.
    let prefetch = |mem: &mut Timeline,
                    k: usize,
                    t_pre: &mut f64,
                    host_ready: &[f64],
                    out: &mut Vec<Planned>,
                    ends: &[(WeightOp, f64, f64)]| {
        let mut start = mem.earliest(t_pre.max(host_ready[k]), w(k), cap)?;
        if let Some(&(_, _, end)) = ends.iter().find(|&&(_, s0, e0)| s0 < start - EPS && start < e0 - EPS) {
            start = end;
        }
        mem.add(start, w(k));
        *t_pre = start + machine.h2d.transfer_time(chain.weight(k) as f64);
        out.push(Planned { start, op: Op::Prefetch { tensor: weight(k), fraction: 1.0 } });
        Some(*t_pre)
    };
    // An offload (or, without `release`, an upload) from `from` on, when the link is free.
    let offload = |mem: &mut Timeline,
                   k: usize,
                   from: f64,
                   t_off: &mut f64,
                   release: bool,
                   host_ready: &mut [f64],
                   out: &mut Vec<Planned>| {
        let start = from.max(*t_off);
        *t_off = start + machine.d2h.transfer_time(chain.weight(k) as f64);
        if release {
            mem.add(*t_off, -w(k));
        }
        host_ready[k] = *t_off;
        out.push(Planned { start, op: Op::Offload { tensor: weight(k), fraction: 1.0 } });
    };

    let mut waiting: Vec<usize> = Vec::new();
    for k in (1..=l).rev() {
        let mut ready = 0.0;
        if sel1[k] && !early_set.contains(&k) {
            ready = prefetch(&mut mem, k, &mut t_pre, &host_ready, &mut transfers, &ends)?;
        }
        let end = run(&mut mem, WeightOp::Backward(k), ready, &mut ends)?;
        b_end[k] = end;
        if sel0[k] {
            // Uploads while the offload link would idle long enough before Off_k.
            while let Some(pos) = (0..waiting.len()).min_by_key(|&i| chain.weight(waiting[i])) {
                let j = waiting[pos];
                if end - t_off <= machine.d2h.transfer_time(chain.weight(j) as f64) {
                    break;
                }
                waiting.swap_remove(pos);
                offload(&mut mem, j, b_end[j], &mut t_off, false, &mut host_ready, &mut transfers);
                uploaded[j] = true;
            }
            offload(&mut mem, k, end, &mut t_off, true, &mut host_ready, &mut transfers);
        } else if sel1[k] && discount && chain.weight(k) > 0 {
            waiting.push(k);
        }
    }
    for k in 1..=l {
        let mut ready = 0.0;
        if sel0[k] {
            ready = prefetch(&mut mem, k, &mut t_pre, &host_ready, &mut transfers, &ends)?;
        }
        let end = run(&mut mem, WeightOp::Forward(k), ready, &mut ends)?;
        if sel1[k] {
            if discount && (sel0[k] || uploaded[k]) {
                mem.add(end.max(host_ready[k]), -w(k));
                drops.push(k);
            } else {
                offload(&mut mem, k, end, &mut t_off, true, &mut host_ready, &mut transfers);
            }
        }
    }
    // The cut's prefetches, for the next period's backward.
    for &k in &early_set {
        prefetch(&mut mem, k, &mut t_pre, &host_ready, &mut transfers, &ends)?;
    }
    let makespan = prev_end.max(t_off).max(t_pre);
    Some(Period { ends, transfers, drops, makespan })
}

impl Period {
    /// The period in pebble's order, each transfer after the last compute op that ends by
    /// its planned start.
    fn ops(&self, l: usize) -> Vec<Op> {
        // after[i]: transfers placed after the window's i-th compute op; `head` before B_L.
        let mut after: Vec<Vec<Planned>> = vec![Vec::new(); self.ends.len()];
        let mut head = Vec::new();
        for p in &self.transfers {
            let placed = self.ends.iter().rposition(|&(_, _, end)| end <= p.start + EPS);
            match placed {
                Some(i) => after[i].push(*p),
                None => head.push(*p),
            }
        }
        for v in after.iter_mut().chain(std::iter::once(&mut head)) {
            v.sort_by(|a, b| a.start.total_cmp(&b.start));
        }
        let stage_op = |o: WeightOp, ops: &mut Vec<Op>| match o {
            WeightOp::Forward(k) => ops.push(Op::Forward { stage: k - 1, mode: ForwardMode::KeepAll }),
            WeightOp::Backward(k) => {
                if k == l {
                    ops.push(Op::Backward { stage: l });
                }
                ops.push(Op::Backward { stage: k - 1 });
            }
        };
        let mut ops = Vec::new();
        let window = |i: usize, ops: &mut Vec<Op>| {
            let o = self.ends[i].0;
            stage_op(o, ops);
            if let WeightOp::Forward(k) = o {
                if self.drops.contains(&k) {
                    ops.push(Op::Free { tensor: weight(k) });
                }
            }
            ops.extend(after[i].iter().map(|p| p.op));
        };
        // The forward half (window ops L..2L), the head, then the backward half.
        for i in l..2 * l {
            window(i, &mut ops);
        }
        ops.extend(head.iter().map(|p| p.op));
        for i in 0..l {
            window(i, &mut ops);
        }
        ops
    }
}

/// Algorithm 2 over every cut: the periodic schedules of the selection `chosen` within
/// `memory`, best planned period first, at most `keep` of them.
pub fn greedy_schedules(
    chain: &WeightChain,
    chosen: &[Choice],
    memory: u64,
    machine: &Machine,
    discount: bool,
    keep: usize,
) -> Vec<(f64, Schedule)> {
    let cuts = chosen.iter().filter(|c| c.after_forward).count();
    let mut found: Vec<(f64, Schedule)> = (0..=cuts)
        .filter_map(|c| schedule_at_cut(chain, chosen, memory, machine, discount, c))
        .map(|p| (p.makespan, Schedule::new(View::Chain, p.ops(chain.len())).repeated()))
        .collect();
    found.sort_by(|a, b| a.0.total_cmp(&b.0));
    found.truncate(keep);
    found
}

/// L2L (Pudipeddi et al. 2020), as the paper runs it: the weights live on the host, and
/// each layer's are brought in right before its forward and its backward and leave after
/// (dropped after the forward, whose host copy is still valid; offloaded after the
/// backward, which updated them). Only the running layer's weights are on the device.
/// Each prefetch is issued when the op before ends, so compute waits for it.
pub fn l2l_schedule(chain: &WeightChain) -> Schedule {
    let l = chain.len();
    let moves = |k: usize| chain.weight(k) > 0;
    let mut ops = Vec::new();
    for k in 1..=l {
        if moves(k) {
            ops.push(Op::Prefetch { tensor: weight(k), fraction: 1.0 });
        }
        ops.push(Op::Forward { stage: k - 1, mode: ForwardMode::KeepAll });
        if moves(k) {
            ops.push(Op::Free { tensor: weight(k) });
        }
    }
    ops.push(Op::Backward { stage: l });
    for k in (1..=l).rev() {
        if moves(k) {
            ops.push(Op::Prefetch { tensor: weight(k), fraction: 1.0 });
        }
        ops.push(Op::Backward { stage: k - 1 });
        if moves(k) {
            ops.push(Op::Offload { tensor: weight(k), fraction: 1.0 });
        }
    }
    Schedule::new(View::Chain, ops).repeated()
}
