//! `brute`: exhaustive search over the operations of Shilova's Table 2.1, the test oracle
//! of the DPs.
//!
//! Dijkstra's algorithm over states, on the chain's exact integer sizes (no
//! discretization; the budget is in the same units). A state is what is resident:
//! `Activation(i)` for `0 ≤ i ≤ L`, `Saved(i)` for `1 ≤ i ≤ L`, and the backward frontier
//! `f` (`B_f … B_L` are done, so `δ_f` is resident; `f = L+1` before the loss), packed in
//! a `u64`. The moves are the simulator's ops, nothing else (no `Free`: a tensor is only
//! released the way Table 2.1 says):
//!
//! * `F_i^ck`, `F_i^∅`, `F_i^all` for `i < f` when `a_i` is available (`Activation(i)`, or
//!   `Saved(i)`); `F_i^∅` releases `Activation(i)` if it read it; an op may not produce a
//!   tensor that is already resident;
//! * the loss `B_L` when `a_L` is available (releases `Activation(L)`);
//! * `B_{f−1}` when `Saved(f)` and `a_{f−1}` are available (releases `δ_f`, `Saved(f)`,
//!   `Activation(f)` and `Activation(f−1)`).
//!
//! Forwards of stages whose backward is done (`i ≥ f`) are pruned: they could only add
//! time and memory. An op is allowed when static memory, everything resident and the
//! op's outputs and temporary memory fit the budget; its cost is its duration. The first
//! state reached with `f = 0` is optimal.

use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, HashMap};

use pebble_graph::Chain;
use pebble_schedule::{ForwardMode, Op, Schedule, View};

use crate::{Problem, SolveError, SolveOptions, Solver};

/// The largest chain [`Brute`] accepts.
pub const MAX_STAGES: usize = 8;

/// Exhaustive search over Table 2.1 schedules, for chains of at most [`MAX_STAGES`] stages.
pub struct Brute;

impl Solver for Brute {
    fn name(&self) -> &'static str {
        "brute"
    }

    fn description(&self) -> &'static str {
        "exhaustive search over Table 2.1 schedules (exact sizes; chains of at most 8 stages)"
    }

    fn solve(&self, problem: Problem<'_>, budget: u64, _options: &SolveOptions) -> Result<Schedule, SolveError> {
        let chain = problem.chain_for(self.name())?;
        let (_, ops) = brute_force(chain, budget, MAX_STAGES)?;
        Ok(Schedule::new(View::Chain, ops))
    }
}

inventory::submit!(crate::Registration(&Brute));

/// A time ordered by `f64::total_cmp`, for the searches' heaps.
#[derive(Clone, Copy, PartialEq)]
pub(crate) struct Cost(pub(crate) f64);

impl Eq for Cost {}

impl PartialOrd for Cost {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Cost {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.total_cmp(&other.0)
    }
}

/// The bit layout of a state.
struct Layout {
    l: usize,
}

impl Layout {
    fn act(&self, i: usize) -> u64 {
        1 << i
    }
    /// `Saved(i)`, `1 ≤ i ≤ L`.
    fn sav(&self, i: usize) -> u64 {
        1 << (self.l + i)
    }
    fn shift(&self) -> usize {
        2 * self.l + 1
    }
    fn frontier(&self, s: u64) -> usize {
        (s >> self.shift()) as usize
    }
    fn with_frontier(&self, s: u64, f: usize) -> u64 {
        (s & ((1u64 << self.shift()) - 1)) | ((f as u64) << self.shift())
    }
}

/// The optimal time and schedule for `chain` within `budget` (chain units), for chains of
/// at most `max_stages` stages.
pub fn brute_force(chain: &Chain, budget: u64, max_stages: usize) -> Result<(f64, Vec<Op>), SolveError> {
    let l = chain.len();
    if l > max_stages || l > 28 {
        return Err(SolveError::TooLarge {
            solver: "brute",
            why: format!("{l} stages; exhaustive search takes at most {}", max_stages.min(28)),
        });
    }
    let lay = Layout { l };
    let Some(room) = budget.checked_sub(chain.static_bytes) else {
        return Err(SolveError::Infeasible { budget, reason: "static memory alone exceeds it".into() });
    };
    if chain.x[0] > room {
        return Err(SolveError::Infeasible { budget, reason: "static memory and a_0 alone exceed it".into() });
    }
    let (x, xb, ft, bt) = (&chain.x, &chain.xbar, &chain.ftmp, &chain.btmp);
    let resident = |s: u64| -> u64 {
        let mut total = 0u64;
        for i in 0..=l {
            if s & lay.act(i) != 0 {
                total += x[i];
            }
            if i >= 1 && s & lay.sav(i) != 0 {
                total += xb[i];
            }
        }
        let f = lay.frontier(s);
        if f <= l {
            total += x[f];
        }
        total
    };
    let start = lay.with_frontier(lay.act(0), l + 1);
    let mut dist: HashMap<u64, (f64, u64, Op)> = HashMap::new();
    let mut heap = BinaryHeap::new();
    dist.insert(start, (0.0, start, Op::Backward { stage: usize::MAX }));
    heap.push(Reverse((Cost(0.0), start)));
    let mut goal = None;
    let mut moves: Vec<(u64, f64, Op)> = Vec::new();
    while let Some(Reverse((Cost(c), s))) = heap.pop() {
        if dist.get(&s).is_some_and(|&(d, _, _)| d < c) {
            continue;
        }
        let f = lay.frontier(s);
        if f == 0 {
            goal = Some((c, s));
            break;
        }
        let mem = resident(s);
        let fits = |extra: u64| mem + extra <= room;
        moves.clear();
        // Forwards of stages whose backward is still to come.
        for i in 0..l.min(f) {
            let has_act = s & lay.act(i) != 0;
            let has_sav = i >= 1 && s & lay.sav(i) != 0;
            if !has_act && !has_sav {
                continue;
            }
            if s & lay.act(i + 1) == 0 && fits(x[i + 1] + ft[i]) {
                let out = s | lay.act(i + 1);
                moves.push((out, chain.ftime[i], Op::Forward { stage: i, mode: ForwardMode::Checkpoint }));
                let consumed = if has_act { out & !lay.act(i) } else { out };
                moves.push((consumed, chain.ftime[i], Op::Forward { stage: i, mode: ForwardMode::Discard }));
            }
            if s & lay.sav(i + 1) == 0 && fits(xb[i + 1] + ft[i]) {
                moves.push((s | lay.sav(i + 1), chain.ftime[i], Op::Forward { stage: i, mode: ForwardMode::KeepAll }));
            }
        }
        if f == l + 1 {
            // The loss.
            if (s & (lay.act(l) | lay.sav(l)) != 0) && fits(x[l] + bt[l]) {
                let out = lay.with_frontier(s & !lay.act(l), l);
                moves.push((out, chain.btime[l], Op::Backward { stage: l }));
            }
        } else {
            let i = f - 1;
            let has_a = s & lay.act(i) != 0 || (i >= 1 && s & lay.sav(i) != 0);
            if has_a && s & lay.sav(i + 1) != 0 && fits(x[i] + bt[i]) {
                let out = s & !(lay.sav(i + 1) | lay.act(i + 1) | lay.act(i));
                moves.push((lay.with_frontier(out, i), chain.btime[i], Op::Backward { stage: i }));
            }
        }
        for &(next, dt, op) in &moves {
            let nc = c + dt;
            let better = match dist.get(&next) {
                None => true,
                Some(&(d, _, _)) => nc < d,
            };
            if better {
                dist.insert(next, (nc, s, op));
                heap.push(Reverse((Cost(nc), next)));
            }
        }
    }
    let Some((cost, mut s)) = goal else {
        return Err(SolveError::Infeasible {
            budget,
            reason: "no schedule of Table 2.1's operations fits (exhaustive search)".into(),
        });
    };
    let mut ops = Vec::new();
    while s != start {
        let (_, prev, op) = dist[&s];
        ops.push(op);
        s = prev;
    }
    ops.reverse();
    Ok((cost, ops))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::baseline::{recompute_all_ops, store_all_ops};
    use crate::remat::rotor::persistent;
    use crate::remat::rotor_optimal::floating;
    use crate::{min_feasible_budget, plan, solver, Slots};
    use pebble_sim::{simulate_chain, SimConfig};
    use pebble_testkit::{random_chain, small_chain, Rng};

    /// A budget nothing reaches.
    pub(crate) const BIG: u64 = 1 << 50;

    pub(crate) fn same(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
    }

    /// Simulates `ops` under `budget` and checks that it passes with the time `value`.
    pub(crate) fn check(chain: &Chain, budget: u64, ops: &[Op], value: f64, who: &str) {
        let s = Schedule::new(View::Chain, ops.to_vec());
        let config = SimConfig { budget: Some(budget), ..SimConfig::default() };
        let r = simulate_chain(chain, &s, &config)
            .unwrap_or_else(|e| panic!("{who}: {} rejected at budget {budget} on {chain:?}: {e}", s.to_notation()));
        assert!(r.peak_bytes <= budget, "{who}");
        assert!(same(r.makespan, value), "{who}: simulated {} vs DP {value} for {}", r.makespan, s.to_notation());
    }

    fn peak(chain: &Chain, ops: Vec<Op>) -> u64 {
        let s = Schedule::new(View::Chain, ops);
        simulate_chain(chain, &s, &SimConfig::default()).unwrap().peak_bytes
    }

    /// Budgets from a little below the least of recompute-all's and store-all's peaks to
    /// a little above store-all's.
    pub(crate) fn budgets(chain: &Chain) -> Vec<u64> {
        let l = chain.len();
        let sp = peak(chain, store_all_ops(l));
        let rp = peak(chain, recompute_all_ops(l));
        let lo = rp.min(sp).saturating_sub(3);
        let hi = sp + 1;
        let mut v: Vec<u64> = (0..=8).map(|k| lo + (hi - lo) * k / 8).collect();
        v.dedup();
        v
    }

    struct Tally {
        feasible: usize,
        infeasible: usize,
        persistent_worse: usize,
    }

    fn cross_check(chain: &Chain, tally: &mut Tally) {
        for budget in budgets(chain) {
            let who = format!("{chain:?} at {budget}");
            let b = brute_force(chain, budget, MAX_STAGES);
            let o = floating(chain, budget, Slots::Exact);
            let p = persistent(chain, budget, Slots::Exact);
            match &b {
                Ok((tb, ops)) => {
                    tally.feasible += 1;
                    check(chain, budget, ops, *tb, "brute");
                    let (to, oops) =
                        o.as_ref().unwrap_or_else(|e| panic!("rotor-optimal fails where brute succeeds: {e}; {who}"));
                    assert!(same(*to, *tb), "rotor-optimal {to} ≠ brute {tb}: {who}");
                    check(chain, budget, oops, *to, "rotor-optimal");
                    let (tp, pops) =
                        p.as_ref().unwrap_or_else(|e| panic!("rotor fails where brute succeeds: {e}; {who}"));
                    assert!(*tp >= *tb - 1e-9 * tb.abs().max(1.0), "rotor {tp} < brute {tb}: {who}");
                    check(chain, budget, pops, *tp, "rotor");
                    if !same(*tp, *tb) {
                        tally.persistent_worse += 1;
                    }
                }
                Err(e) => {
                    assert!(matches!(e, SolveError::Infeasible { .. }), "{e}");
                    tally.infeasible += 1;
                    assert!(
                        matches!(o, Err(SolveError::Infeasible { .. })),
                        "rotor-optimal feasible where brute is not: {who}"
                    );
                    assert!(
                        matches!(p, Err(SolveError::Infeasible { .. })),
                        "rotor feasible where brute is not: {who}"
                    );
                }
            }
        }
    }

    #[test]
    fn dps_match_brute_force_on_small_random_chains() {
        let mut rng = Rng::new(0x0b5e_u64.wrapping_mul(0x1234_5678_9abc));
        let mut tally = Tally { feasible: 0, infeasible: 0, persistent_worse: 0 };
        let mut chains = 0;
        for k in 0..400 {
            let l = 1 + (k % 6);
            let chain = small_chain(&mut rng, l, k % 3 != 2);
            cross_check(&chain, &mut tally);
            chains += 1;
        }
        // The test kit's chains: larger sizes, more temporary and static memory.
        for k in 0..100 {
            let chain = random_chain(&mut rng, 1 + k % 5);
            cross_check(&chain, &mut tally);
            chains += 1;
        }
        eprintln!(
            "{chains} chains: {} feasible budgets (rotor worse than optimal on {}), {} infeasible",
            tally.feasible, tally.persistent_worse, tally.infeasible
        );
        assert!(tally.feasible > 1000 && tally.infeasible > 100);
    }

    #[test]
    fn least_budgets_of_rotor_and_brute_agree() {
        let options = SolveOptions { slots: Slots::Exact, ..SolveOptions::default() };
        let (rotor, brute, optimal) =
            (solver("rotor").unwrap(), solver("brute").unwrap(), solver("rotor-optimal").unwrap());
        let mut rng = Rng::new(77);
        for k in 0..150 {
            let chain = small_chain(&mut rng, 1 + k % 6, true);
            let p = Problem::Chain(&chain);
            let b = min_feasible_budget(brute, p, &options).unwrap().unwrap();
            assert_eq!(min_feasible_budget(rotor, p, &options).unwrap(), Some(b), "{chain:?}");
            assert_eq!(min_feasible_budget(optimal, p, &options).unwrap(), Some(b), "{chain:?}");
            // The "recompute everything" memory.
            let rp = peak(&chain, recompute_all_ops(chain.len()));
            assert!(b <= rp, "{chain:?}");
        }
    }

    #[test]
    fn brute_is_registered_and_bounded() {
        let s = solver("brute").unwrap();
        let chain = Chain::homogeneous(9, 1.0, 1.0, 1);
        let e = s.solve(Problem::Chain(&chain), BIG, &SolveOptions::default()).unwrap_err();
        assert!(matches!(e, SolveError::TooLarge { .. }), "{e}");
        let chain = Chain::homogeneous(3, 1.0, 2.0, 1);
        let p = plan(s, Problem::Chain(&chain), BIG, &SolveOptions::default()).unwrap();
        assert_eq!(p.report.makespan, 3.0 + 8.0);
        assert_eq!(p.schedule.to_notation(), "F0all F1all F2all B3 B2 B1 B0");
        // B_1 needs a_0 (or ā_0), a_1, ā_2, δ_2 and δ_1: five units, which store-all needs too.
        let chain = Chain::homogeneous(2, 1.0, 1.0, 1);
        let (t, ops) = brute_force(&chain, 5, 8).unwrap();
        check(&chain, 5, &ops, t, "brute");
        assert_eq!(t, 2.0 + 3.0);
        assert!(brute_force(&chain, 4, 8).is_err());
    }
}
