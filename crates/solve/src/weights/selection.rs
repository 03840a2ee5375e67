//! Algorithm 1 (greedy selection): which weights to offload, and between which
//! operations, until every operation's memory fits, ignoring time (the scheduler's job).
//!
//! A *choice* `(k, d)` removes `w_k` from the device for a stretch of the cycle:
//! `(k, 1)` between `F_k` and `B_k` (it covers `F_{k+1} … F_L, B_L … B_{k+1}`), `(k, 0)`
//! between `B_k` and the next `F_k` (it covers `B_{k−1} … B_1, F_1 … F_{k−1}`). Each
//! operation `o` starts with the excess `E_o = max(0, Σ_j |w_j| + mem(o) − M)`, `mem` the
//! shared accounting ([`WeightChain::op_memory`]). The choice of largest profit, the
//! benefit `Σ_{o covered} min(E_o, |w_k|)` over its cost in transfers (`2|w_k|`, or
//! `|w_k|` when its twin `(k, 1 − d)` is chosen: one offload serves both prefetches, the
//! paper's discount), is taken, and lowers the `E_o` it covers by `|w_k|`, until no
//! excess is left.
//!
//! The digest's readings, applied here: `E_o` starts clamped at 0 (the printed update
//! clamps, the initialisation does not); ties go to the first maximum scanning
//! `k = 1 … L`, `d = 1` before `d = 0`; the selection is infeasible when excess is left
//! and no choice has a positive profit (an operation that does not fit even alone).

use super::{Accounting, WeightChain, WeightOp};
use crate::SolveError;

/// Where `w_k` is away from the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Choice {
    /// The layer, from 1.
    pub layer: usize,
    /// `(k, 1)`: removed between `F_k` and `B_k`; `(k, 0)`: between `B_k` and `F_k`.
    pub after_forward: bool,
}

impl Choice {
    /// The operations that run while `w_k` is away (transfer times ignored).
    pub fn covers(self, l: usize) -> Vec<WeightOp> {
        let k = self.layer;
        if self.after_forward {
            ((k + 1)..=l).map(WeightOp::Forward).chain(((k + 1)..=l).rev().map(WeightOp::Backward)).collect()
        } else {
            (1..k).rev().map(WeightOp::Backward).chain((1..k).map(WeightOp::Forward)).collect()
        }
    }

    /// The other choice of the same layer.
    pub fn twin(self) -> Choice {
        Choice { layer: self.layer, after_forward: !self.after_forward }
    }
}

/// How Algorithm 1 runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SelectionOptions {
    /// The memory accounting ([`Accounting::Consistent`] by default).
    pub accounting: Accounting,
    /// The discount: a choice whose twin is taken costs one transfer, not two (off for
    /// the paper's Greedy*, which offloads each weight every time it leaves).
    pub discount: bool,
}

impl Default for SelectionOptions {
    fn default() -> Self {
        SelectionOptions { accounting: Accounting::default(), discount: true }
    }
}

/// One step of the selection: the choice taken and its profit then.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Selected {
    /// The choice.
    pub choice: Choice,
    /// Its profit when taken (benefit over cost, in units of `|w_k|`).
    pub profit: f64,
}

/// The initial excess of every operation, in [`WeightChain::ops`]'s order.
pub fn initial_excess(chain: &WeightChain, memory: u64, accounting: Accounting) -> Vec<u64> {
    let total = chain.total_weights();
    chain.ops().into_iter().map(|o| (total + chain.op_memory(o, accounting)).saturating_sub(memory)).collect()
}

/// Algorithm 1 within `memory` bytes: the choices in the order taken.
pub fn select(chain: &WeightChain, memory: u64, options: SelectionOptions) -> Result<Vec<Selected>, SolveError> {
    let l = chain.len();
    let index = |o: WeightOp| chain.op_index(o);
    let mut excess = initial_excess(chain, memory, options.accounting);
    let mut taken: Vec<Selected> = Vec::new();
    let is_taken = |taken: &[Selected], c: Choice| taken.iter().any(|s| s.choice == c);
    while excess.iter().any(|&e| e > 0) {
        let mut best: Option<Selected> = None;
        for layer in 1..=l {
            let wk = chain.weight(layer);
            if wk == 0 {
                continue;
            }
            for after_forward in [true, false] {
                let choice = Choice { layer, after_forward };
                if is_taken(&taken, choice) {
                    continue;
                }
                let benefit: u64 = choice.covers(l).into_iter().map(|o| excess[index(o)].min(wk)).sum();
                let halves = if options.discount && is_taken(&taken, choice.twin()) { 1.0 } else { 0.5 };
                let profit = halves * benefit as f64 / wk as f64;
                if best.is_none_or(|b| profit > b.profit) {
                    best = Some(Selected { choice, profit });
                }
            }
        }
        let Some(best) = best.filter(|b| b.profit > 0.0) else {
            let worst = excess.iter().copied().max().unwrap_or(0);
            return Err(SolveError::Infeasible {
                budget: memory,
                reason: format!("offloading every weight leaves an operation {worst} bytes over"),
            });
        };
        let wk = chain.weight(best.choice.layer);
        for o in best.choice.covers(l) {
            let e = &mut excess[index(o)];
            *e = e.saturating_sub(wk);
        }
        taken.push(best);
    }
    Ok(taken)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::weights::tests::t1;

    fn trace(selected: &[Selected]) -> Vec<(usize, u8, f64)> {
        selected
            .iter()
            .map(|s| (s.choice.layer, s.choice.after_forward as u8, (s.profit * 1e4).round() / 1e4))
            .collect()
    }

    /// The digest's trace on T1 (A.6, `greedy_selection_trace.py`).
    #[test]
    fn algorithm_1_follows_the_digests_trace_on_t1() {
        let c = t1();
        // F1 F2 F3 F4 B4 B3 B2 B1.
        assert_eq!(initial_excess(&c, 11, Accounting::Consistent), vec![0, 0, 1, 2, 4, 2, 3, 1]);
        let s = select(&c, 11, SelectionOptions::default()).unwrap();
        assert_eq!(trace(&s), vec![(1, 1, 2.25), (3, 0, 1.0), (3, 1, 1.0), (2, 1, 0.1667)]);
        let literal = SelectionOptions { accounting: Accounting::Literal, ..SelectionOptions::default() };
        assert_eq!(initial_excess(&c, 13, Accounting::Literal), vec![0, 1, 0, 2, 4, 1, 4, 1]);
        let s = select(&c, 13, literal).unwrap();
        assert_eq!(trace(&s), vec![(1, 1, 2.0), (3, 0, 1.0), (3, 1, 1.0), (4, 0, 0.25), (2, 1, 0.1667)]);
    }

    #[test]
    fn coverage_follows_the_paper() {
        let name = |c: Choice| c.covers(4).iter().map(|o| format!("{o:?}")).collect::<Vec<_>>().join(" ");
        let c = |layer, after_forward| Choice { layer, after_forward };
        assert_eq!(name(c(2, true)), "Forward(3) Forward(4) Backward(4) Backward(3)");
        assert_eq!(name(c(3, false)), "Backward(2) Backward(1) Forward(1) Forward(2)");
        assert!(c(4, true).covers(4).is_empty() && c(1, false).covers(4).is_empty());
    }

    /// No pressure, no choice; too little memory for one operation alone, infeasible;
    /// without the discount (Greedy*), a twin costs as much as a first choice.
    #[test]
    fn no_pressure_selects_nothing_and_too_little_memory_is_infeasible() {
        let c = t1();
        assert!(select(&c, 100, SelectionOptions::default()).unwrap().is_empty());
        // B_2 alone needs 2·3 + 3 = 9 with its own weights.
        assert!(matches!(select(&c, 8, SelectionOptions::default()), Err(SolveError::Infeasible { .. })));
        let star = SelectionOptions { discount: false, ..SelectionOptions::default() };
        let s = select(&c, 11, star).unwrap();
        assert!(s.iter().all(|x| x.profit <= 2.25), "{s:?}");
        assert_eq!((s[1].choice, s[1].profit), (Choice { layer: 3, after_forward: false }, 1.0));
        assert_eq!(s[2].profit, 0.5, "(3,1) without the discount: {s:?}");
    }
}
