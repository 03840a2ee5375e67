//! The candidate schedules of one compute sequence: a depth-first search over the
//! offloads and prefetches of each gap between compute ops.

use pebble_schedule::Op;
use pebble_sim::SimConfig;

use super::layout::Layout;
use super::sequences::Ctx;
use super::{no_better, Best};

/// The timeline without waits for memory: a lower bound on the simulator's.
#[derive(Debug, Clone, Copy)]
pub(super) struct Clock {
    pub(super) cursor: f64,
    pub(super) d2h: f64,
    pub(super) h2d: f64,
}

/// The transfer search over one compute sequence.
pub(super) struct Plan<'a, 'b> {
    pub(super) ctx: &'a Ctx<'a>,
    pub(super) ops: &'a [Op],
    pub(super) lay: Layout,
    pub(super) dur: Vec<f64>,
    /// `suffix[k]`: compute time of ops `k..`.
    pub(super) suffix: Vec<f64>,
    pub(super) cuts: bool,
    pub(super) best: &'b mut Best,
    /// Per instance: offloaded, and the gap of its prefetch.
    pub(super) off: Vec<bool>,
    pub(super) pre: Vec<Option<usize>>,
    pub(super) ready: Vec<f64>,
    pub(super) host_ready: Vec<f64>,
    /// The memory bound of each op already placed.
    pub(super) mem: Vec<u64>,
    /// Per instance offloaded and not prefetched: the ops from its offload gap up to here
    /// count it (read since, so held).
    pub(super) counted: Vec<usize>,
    pub(super) out: Vec<Op>,
    pub(super) config: SimConfig,
    pub(super) simulated: usize,
    pub(super) accepted: usize,
    pub(super) prefixes: usize,
}

impl<'a, 'b> Plan<'a, 'b> {
    /// The search over the transfers of compute sequence `ops`, sharing `best`.
    pub(super) fn new(ctx: &'a Ctx<'a>, ops: &'a [Op], cuts: bool, best: &'b mut Best) -> Plan<'a, 'b> {
        let c = ctx.chain;
        let lay = Layout::new(c, ops).expect("the enumeration yields sequences of the space");
        let dur: Vec<f64> = ops
            .iter()
            .map(|op| match *op {
                Op::Forward { stage, .. } => c.ftime[stage],
                Op::Backward { stage } => c.btime[stage],
                _ => 0.0,
            })
            .collect();
        let mut suffix = vec![0.0; ops.len() + 1];
        for k in (0..ops.len()).rev() {
            suffix[k] = suffix[k + 1] + dur[k];
        }
        let m = lay.insts.len();
        Plan {
            ctx,
            ops,
            dur,
            suffix,
            cuts,
            best,
            off: vec![false; m],
            pre: vec![None; m],
            ready: vec![0.0; m],
            host_ready: vec![0.0; m],
            mem: vec![0; ops.len()],
            counted: lay.insts.iter().map(|i| i.off_gap).collect(),
            out: Vec::with_capacity(3 * ops.len()),
            config: SimConfig { budget: Some(ctx.budget), ..SimConfig::on(ctx.machine) },
            lay,
            simulated: 0,
            accepted: 0,
            prefixes: 0,
        }
    }

    /// Searches every candidate, unless `bound` (the sequence's own) cannot beat the best.
    pub(super) fn run(&mut self, bound: f64) {
        if self.cuts && no_better(bound, self.best.makespan) {
            return;
        }
        self.gap(0, Clock { cursor: 0.0, d2h: 0.0, h2d: 0.0 });
    }

    /// Whether instance `j` may be offloaded: a link, a size, and a reader after its offload.
    pub(super) fn offloadable(&self, j: usize) -> bool {
        let inst = &self.lay.insts[j];
        self.ctx.links && inst.size > 0 && inst.last_reader() > inst.off_gap
    }

    /// Gap `g`: the offload of what op `g − 1` produced, or not.
    fn gap(&mut self, g: usize, t: Clock) {
        if self.best.simulations > self.best.limit {
            return;
        }
        let cand = self.lay.gap_offload[g].filter(|&j| self.offloadable(j));
        self.prefetches(g, t);
        if let Some(j) = cand {
            let size = self.lay.insts[j].size;
            let start = t.cursor.max(t.d2h).max(self.ready[j]);
            let end = start + self.ctx.off_time(size);
            self.host_ready[j] = end;
            self.off[j] = true;
            self.out.push(Op::Offload { tensor: self.lay.insts[j].tensor, fraction: 1.0 });
            self.prefetches(g, Clock { d2h: end, ..t });
            self.out.pop();
            self.off[j] = false;
        }
    }

    /// Instances offloaded before gap `g` and not prefetched yet.
    fn pending(&self, g: usize) -> impl Iterator<Item = usize> + '_ {
        (0..self.lay.insts.len())
            .filter(move |&j| self.off[j] && self.pre[j].is_none() && self.lay.insts[j].off_gap < g)
    }

    /// The prefetches of gap `g` after those already placed there: stop (unless an
    /// instance whose last reader is op `g` is still on the host), or prefetch one more.
    fn prefetches(&mut self, g: usize, t: Clock) {
        let pending: Vec<usize> = self.pending(g).collect();
        if g == self.ops.len() {
            if pending.is_empty() {
                self.leaf(t);
            }
            return;
        }
        if pending.iter().all(|&j| self.lay.insts[j].last_reader() > g) {
            self.compute(g, t);
        }
        for j in pending {
            let size = self.lay.insts[j].size;
            let start = t.cursor.max(t.h2d).max(self.host_ready[j]);
            let end = start + self.ctx.pre_time(size);
            let saved = self.ready[j];
            self.ready[j] = end;
            self.pre[j] = Some(g);
            self.out.push(Op::Prefetch { tensor: self.lay.insts[j].tensor, fraction: 1.0 });
            self.prefetches(g, Clock { h2d: end, ..t });
            self.out.pop();
            self.pre[j] = None;
            self.ready[j] = saved;
        }
    }

    /// Whether instance `j` may be off the device when op `k` starts, as far as the
    /// decisions so far tell: offloaded, not read by `k`, and not prefetched and read since.
    pub(super) fn maybe_off(&self, j: usize, k: usize) -> bool {
        if !self.off[j] || self.lay.reads[k].contains(&j) {
            return false;
        }
        match self.pre[j] {
            None => true,
            Some(h) => !self.lay.insts[j].readers.iter().any(|&r| h <= r && r <= k),
        }
    }

    /// Compute op `g`, then gap `g + 1`.
    fn compute(&mut self, g: usize, t: Clock) {
        let budget = self.ctx.budget;
        let mut start = t.cursor;
        for &j in &self.lay.reads[g] {
            start = start.max(self.ready[j]);
        }
        let mut off: Vec<usize> = (0..self.lay.insts.len()).filter(|&j| self.maybe_off(j, g)).collect();
        let freed: u64 = off.iter().map(|&j| self.lay.insts[j].size).sum();
        self.mem[g] = self.lay.full[g] - freed;
        // A read of an offloaded tensor not prefetched yet holds its device copy from the
        // offload on: the ops in between, counted without it, now count it.
        let mut recounted: Vec<(usize, usize)> = Vec::new();
        let mut fits = self.mem[g] <= budget;
        for &j in &self.lay.reads[g] {
            if self.off[j] && self.pre[j].is_none() {
                let size = self.lay.insts[j].size;
                recounted.push((j, self.counted[j]));
                for k in self.counted[j]..g {
                    if !self.lay.reads[k].contains(&j) {
                        self.mem[k] += size;
                        fits &= self.mem[k] <= budget;
                    }
                }
                self.counted[j] = g;
            }
        }
        if !self.cuts || fits {
            self.compute_placed(g, t, start, &mut off);
        }
        for (j, from) in recounted.into_iter().rev() {
            let size = self.lay.insts[j].size;
            for k in from..self.counted[j] {
                if !self.lay.reads[k].contains(&j) {
                    self.mem[k] -= size;
                }
            }
            self.counted[j] = from;
        }
    }

    /// Compute op `g` once its memory bound holds: its start, the cuts, gap `g + 1`.
    fn compute_placed(&mut self, g: usize, t: Clock, start: f64, off: &mut [usize]) {
        let budget = self.ctx.budget;
        let mut start = start;
        let mut t = t;
        let mut raised: Vec<(usize, f64)> = Vec::new();
        if self.cuts {
            // What exceeds the budget must be off the device when the op starts: released,
            // so offloaded (an offload's end is at least its `host_ready`).
            let mut q = self.lay.full[g].saturating_sub(budget);
            off.sort_by(|&a, &b| self.host_ready[a].total_cmp(&self.host_ready[b]));
            for &j in off.iter() {
                if q == 0 {
                    break;
                }
                start = start.max(self.host_ready[j]);
                q = q.saturating_sub(self.lay.insts[j].size);
            }
            // A prefetched tensor that cannot be on the device beside the op's memory (held
            // until the op ends) starts coming back only when the op ends.
            let end = start + self.dur[g];
            for &j in off.iter() {
                let size = self.lay.insts[j].size;
                if self.pre[j].is_some() && self.mem[g] + size > budget {
                    let arrival = end + self.ctx.pre_time(size);
                    if arrival > self.ready[j] {
                        raised.push((j, self.ready[j]));
                        self.ready[j] = arrival;
                        t.h2d = t.h2d.max(arrival);
                    }
                }
            }
        }
        let end = start + self.dur[g];
        t.cursor = end;
        let mut go = true;
        let ahead = if self.cuts { self.lookahead(g, end) } else { 0.0 };
        if self.cuts && (no_better(ahead, self.best.makespan) || self.prefix_fails(g, end)) {
            go = false;
        } else if self.cuts {
            let mut lb = (end + self.suffix[g + 1]).max(t.d2h).max(t.h2d).max(ahead);
            let mut queued = 0.0;
            for j in 0..self.lay.insts.len() {
                if !self.off[j] {
                    continue;
                }
                let inst = &self.lay.insts[j];
                match self.pre[j] {
                    None if inst.off_gap <= g => {
                        let p = self.ctx.pre_time(inst.size);
                        queued += p;
                        lb = lb.max(end.max(self.host_ready[j]) + p + self.suffix[inst.last_reader()]);
                    }
                    Some(h) => {
                        if let Some(&r) = inst.readers.iter().find(|&&r| r >= h && r > g) {
                            lb = lb.max(self.ready[j] + self.suffix[r]);
                        }
                    }
                    None => {}
                }
            }
            lb = lb.max(end.max(t.h2d) + queued);
            go = !no_better(lb, self.best.makespan);
        }
        if go {
            let saved = self.lay.output[g].map(|j| (j, self.ready[j]));
            if let Some((j, _)) = saved {
                self.ready[j] = end;
            }
            self.out.push(self.ops[g]);
            self.gap(g + 1, t);
            self.out.pop();
            if let Some((j, r)) = saved {
                self.ready[j] = r;
            }
        }
        for (j, r) in raised.into_iter().rev() {
            self.ready[j] = r;
        }
    }
}
