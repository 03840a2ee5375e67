//! The engine's memory queries: the level at a time, when an op's memory fits the budget
//! (O.3), and the events replayed through the caching allocator.

use super::{key, key_op, Engine, ALLOC, RELEASE};
use crate::allocator::{AllocatorConfig, AllocatorStats};
use crate::reserved::Event;
use crate::SimError;

impl Engine<'_> {
    /// Device memory in use at `t`: the base, the events before `t` (and at `t` if
    /// `inclusive`), the offloads released by then, as an exact step part and the
    /// progressive transfers' part.
    fn level_at(&self, t: f64, inclusive: bool) -> (i128, f64) {
        let before = |time: f64| time < t || (inclusive && time == t);
        let mut steps = self.base as i128;
        for e in self.dev.iter().filter(|e| before(e.time)) {
            steps += e.delta;
        }
        for p in self.t.iter().flat_map(|s| &s.pending).filter(|p| before(p.time)) {
            steps -= p.bytes as i128;
        }
        (steps, self.ramps.iter().map(|r| r.at(t)).sum())
    }

    fn fits(level: (i128, f64), need: u64, budget: u64) -> bool {
        let (steps, ramp) = level;
        if ramp == 0.0 {
            steps + need as i128 <= budget as i128
        } else {
            (steps + need as i128) as f64 + ramp <= budget as f64 * (1.0 + 1e-12) + 1e-6
        }
    }

    /// The earliest time from `start` on at which `need` more bytes fit the budget, given
    /// the releases already scheduled (O.3: the device waits for memory); `start` if there
    /// is no budget, if they fit at once, or if no scheduled release makes them fit.
    ///
    /// They must fit later too, beside what ops earlier in program order already take later
    /// in time (a prefetch that waited for the link): the first `tmp` bytes of `need` only
    /// for `duration`, the rest for good. Otherwise an op placed now could push a transfer
    /// placed before it over the budget.
    pub(super) fn wait_for_memory(&self, start: f64, need: u64, tmp: u64, duration: f64) -> f64 {
        let Some(budget) = self.budget else { return start };
        if self.horizon <= start {
            return start;
        }
        let mut times: Vec<f64> = self
            .dev
            .iter()
            .map(|e| e.time)
            .chain(self.t.iter().flat_map(|s| &s.pending).map(|p| p.time))
            .chain(self.ramps.iter().flat_map(|r| [r.t0, r.t1]))
            .filter(|&t| t > start)
            .collect();
        times.sort_by(f64::total_cmp);
        times.dedup();
        let after: Vec<(i128, f64)> = times.iter().map(|&t| self.level_at(t, true)).collect();
        // Placed at `at`, `need` fits beside the levels after the event times from index
        // `from` on.
        let later_fits = |at: f64, from: usize| {
            times[from..].iter().zip(&after[from..]).all(|(&t, &level)| {
                let held = if t < at + duration { need } else { need - tmp.min(need) };
                Self::fits(level, held, budget)
            })
        };
        let mut level = self.level_at(start, true);
        if Self::fits(level, need, budget) && later_fits(start, 0) {
            return start;
        }
        let mut prev = start;
        for (i, &t) in times.iter().enumerate() {
            // Memory is linear between `prev` (after its events) and `t` (before its events).
            let end = self.level_at(t, false);
            if Self::fits(end, need, budget) {
                let over = (level.0 + need as i128 - budget as i128) as f64 + level.1;
                let drop = (level.0 - end.0) as f64 + level.1 - end.1;
                let at = if drop > 0.0 { prev + (t - prev) * (over / drop).clamp(0.0, 1.0) } else { prev };
                if later_fits(at, i) {
                    return at;
                }
            }
            level = after[i];
            if Self::fits(level, need, budget) && later_fits(t, i + 1) {
                return t;
            }
            prev = t;
        }
        start
    }

    /// The device events replayed through the caching allocator ([`crate::reserved`]).
    pub(super) fn reserved(&self, config: AllocatorConfig) -> Result<AllocatorStats, SimError> {
        let events =
            self.dev.iter().map(|e| Event { time: e.time, key: e.key, delta: e.delta, tag: e.tag, op: key_op(e.key) });
        let ramps = self.ramps.iter().map(|r| {
            // Whole blocks: a prefetch's from its start, an offload's until its end.
            let (time, k) = if r.delta > 0 { (r.t0, key(1, r.op, ALLOC)) } else { (r.t1, key(0, r.op, RELEASE)) };
            Event { time, key: k, delta: r.delta, tag: r.tag, op: r.op }
        });
        crate::reserved::replay(events.chain(ramps).collect(), &self.initial, config).map_err(|r| {
            SimError::OutOfMemory { op: r.op, text: self.text(r.op), time: r.time, why: r.oom.to_string() }
        })
    }
}
