//! The scoring of candidates: the lookahead bound, the simulated prefixes that cut a
//! branch over the budget, and the simulation of each complete candidate.

use pebble_schedule::{Schedule, View};
use pebble_sim::{simulate_chain, SimError};

use super::no_better;
use super::transfers::{Clock, Plan};

impl Plan<'_, '_> {
    /// A lower bound on the makespan from the ops after `g` (which ends at `end` or
    /// later), or infinity if they cannot fit:
    ///
    /// * an op that exceeds the budget needs its excess off the device when it starts:
    ///   tensors alive then, not read by it, and offloaded (so far, or produced from op `g`
    ///   on and not decided yet), each released no earlier than its offload ends;
    /// * a tensor on the host comes back for a reader `r`, and its prefetch cannot hold
    ///   memory during an op before `r` that would then exceed the budget even with
    ///   everything else that may be off the device: it starts after that op ends.
    pub(super) fn lookahead(&self, g: usize, end: f64) -> f64 {
        let n = self.ops.len();
        let budget = self.ctx.budget;
        let m = self.lay.insts.len();
        // When op `k` (after `g`) starts and ends at the earliest.
        let start_of = |k: usize| end + self.suffix[g + 1] - self.suffix[k];
        // Whether instance `i` may be off the device at future op `k`, and when its
        // memory is released at the earliest.
        let may_leave = |i: usize, k: usize| -> Option<f64> {
            let inst = &self.lay.insts[i];
            if inst.off_gap > k || inst.last_reader() < k || self.lay.reads[k].contains(&i) {
                return None;
            }
            if inst.off_gap <= g {
                self.maybe_off(i, k).then_some(self.host_ready[i])
            } else if self.offloadable(i) {
                Some(start_of(inst.off_gap) + self.ctx.off_time(inst.size))
            } else {
                None
            }
        };
        let mut lb: f64 = 0.0;
        let mut cands: Vec<(f64, u64)> = Vec::new();
        // `slack[k]`: the budget less what op `k` surely holds (negative: it cannot fit).
        let mut slack = vec![0i128; n];
        for (k, room) in slack.iter_mut().enumerate().skip(g + 1) {
            cands.clear();
            cands.extend((0..m).filter_map(|i| may_leave(i, k).map(|t| (t, self.lay.insts[i].size))));
            let off: u64 = cands.iter().map(|c| c.1).sum();
            *room = budget as i128 - (self.lay.full[k] as i128 - off as i128);
            if *room < 0 {
                return f64::INFINITY;
            }
            let Some(q) = self.lay.full[k].checked_sub(budget).filter(|&q| q > 0) else { continue };
            cands.sort_by(|a, b| a.0.total_cmp(&b.0));
            let (mut left, mut at) = (q, start_of(k));
            for &(avail, size) in &cands {
                if left == 0 {
                    break;
                }
                at = at.max(avail);
                left = left.saturating_sub(size);
            }
            lb = lb.max(at + self.suffix[k]);
        }
        // Prefetches to come or not read yet.
        for j in 0..m {
            if !self.off[j] {
                continue;
            }
            let inst = &self.lay.insts[j];
            let size = inst.size as i128;
            let (first, earliest) = match self.pre[j] {
                None => (g + 1, end.max(self.host_ready[j])),
                Some(h) => match inst.readers.iter().find(|&&r| r >= h) {
                    Some(&r) if r > g => (r, self.ready[j] - self.ctx.pre_time(inst.size)),
                    _ => continue,
                },
            };
            // The readers that may be the first after the prefetch, and the latest op
            // before each that cannot hold it.
            let mut best = f64::INFINITY;
            let mut after = earliest;
            for (k, &room) in slack.iter().enumerate().skip(g + 1) {
                if k >= first && inst.readers.contains(&k) {
                    best = best.min(after + self.ctx.pre_time(inst.size) + self.suffix[k]);
                    if self.pre[j].is_some() {
                        break;
                    }
                }
                if k > inst.last_reader() {
                    break;
                }
                let counted = may_leave(j, k).is_some();
                if room - if counted { size } else { 0 } < 0 {
                    after = after.max(start_of(k + 1));
                }
            }
            lb = lb.max(best);
        }
        lb
    }

    /// Whether the schedule so far, with compute op `g` (which ends at `end` or later),
    /// exceeds the budget before `end` whatever follows: later ops only allocate after
    /// it, and their reads only hold memory longer. Simulated only while a prefetch has
    /// yet to be read (what the memory bound cannot see: a transfer that found no room).
    pub(super) fn prefix_fails(&mut self, g: usize, end: f64) -> bool {
        let unread = (0..self.lay.insts.len())
            .any(|j| self.pre[j].is_some_and(|h| !self.lay.insts[j].readers.iter().any(|&r| h <= r && r < g)));
        if !unread {
            return false;
        }
        self.out.push(self.ops[g]);
        let verdict = simulate_chain(self.ctx.chain, &Schedule::new(View::Chain, self.out.clone()), &self.config);
        self.out.pop();
        self.prefixes += 1;
        self.best.simulations += 1;
        let fails = matches!(verdict, Err(SimError::BudgetExceeded { time, .. }) if time < end);
        fails
    }

    /// Simulates a complete candidate (its timeline `t` a bound) and keeps it if best.
    pub(super) fn leaf(&mut self, t: Clock) {
        let lb = t.cursor.max(t.d2h).max(t.h2d);
        if self.cuts && no_better(lb, self.best.makespan) {
            return;
        }
        self.simulated += 1;
        self.best.simulations += 1;
        let schedule = Schedule::new(View::Chain, self.out.clone());
        match simulate_chain(self.ctx.chain, &schedule, &self.config) {
            Ok(r) => {
                self.accepted += 1;
                debug_assert!(r.makespan >= lb * (1.0 - 1e-9), "simulated {} below the bound {lb}", r.makespan);
                if r.makespan < self.best.makespan {
                    self.best.makespan = r.makespan;
                    self.best.ops = Some(schedule.ops);
                }
            }
            Err(SimError::BudgetExceeded { .. }) => {}
            Err(e) => panic!("brute-offload built an invalid schedule {}: {e}", schedule.to_notation()),
        }
    }
}
