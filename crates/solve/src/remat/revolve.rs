//! `Opt_0`: the homogeneous Revolve dynamic program (Shilova, Theorem 1; Griewank &
//! Walther's binomial checkpointing), with the reconstruction of its op sequence.
//!
//! # The model (Shilova, Ch. 1, ADJCHAIN(ℓ, m))
//!
//! A chain of `ℓ` forward steps and `ℓ+1` backward steps, with 0-based indices as in
//! [`pebble_graph::Chain`]: the forward step `j` (`j < ℓ`) maps `a_j` to `a_{j+1}`, and
//! the backward step `j` (`j ≤ ℓ`) needs `a_j` and `δ_{j+1}` and produces `δ_j`. The top
//! backward step `ℓ` needs only `a_ℓ` (on a chain with a loss, it is the loss). Every
//! value has the same size and takes one of `m` slots; the start state is `{a_0}` (plus
//! the incoming gradient) and the end state `{δ_0}`. A forward costs `u_f`, a backward
//! `u_b`.
//!
//! ```text
//! Opt_0(0, m) = u_b                                                      m ≥ 2
//! Opt_0(ℓ, m) = ∞                                                        ℓ > 0, m < 3
//! Opt_0(ℓ, m) = min_{1≤i≤ℓ} i·u_f + Opt_0(ℓ−i, m−1) + Opt_0(i−1, m)      ℓ > 0, m ≥ 3
//! ```
//!
//! (At `m = 3` only `i = ℓ` is finite, which gives the thesis's formula (1.2),
//! `ℓ(ℓ+1)/2·u_f + (ℓ+1)·u_b`.) Reading a choice `i`: advance `i` steps from `a_s`,
//! keeping `a_s` and ending with `a_{s+i}` stored; reverse the part above `a_{s+i}`
//! with one slot fewer; then reverse the part below with all slots.
//!
//! # The binomial closed form
//!
//! Griewank & Walther count the forward steps `t(l, s)` needed to reverse `l` steps
//! with `s` snapshots: `t(l, s) = r·l − C(s+r, s+1)`, where `r ≥ 0` is the unique
//! integer with `C(s+r−1, s) < l ≤ C(s+r, s)`. In their model reversing step `j`
//! needs the state before it, and the last forward step before each reversal is part
//! of the reversal (so `t(1, s) = 0`). ADJCHAIN(ℓ, m) has `ℓ+1` such reversals (the
//! backward steps `0..=ℓ`, step `j` needing `a_j`), the `m` slots hold the `s`
//! snapshots (the initial `a_0` among them) plus the current forward value and the
//! current gradient, and each backward step runs exactly once in an optimal schedule.
//! Hence
//!
//! ```text
//! Opt_0(ℓ, m) = t(ℓ+1, m−2)·u_f + (ℓ+1)·u_b
//! ```
//!
//! (e.g. `t(l, 1) = l(l−1)/2` gives (1.2) again), which [`binomial_revolve_cost`]
//! evaluates and the tests check against the DP.

use pebble_schedule::{ForwardMode, Op};

/// One step of a Revolve sequence on ADJCHAIN(ℓ, m), 0-based as in the module doc.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RevolveAction {
    /// Forward step `stage`: `a_stage → a_{stage+1}`. With `keep_input` the input stays
    /// stored (it is a checkpoint: `F_ck`), otherwise it is consumed (`F_∅`).
    Advance {
        /// The forward step.
        stage: usize,
        /// Whether `a_stage` stays stored.
        keep_input: bool,
    },
    /// Backward step `stage`: consumes `a_stage` and `δ_{stage+1}`, produces `δ_stage`.
    Reverse {
        /// The backward step.
        stage: usize,
    },
}

/// The `Opt_0` table for every `ℓ ≤ lmax` and `m ≤ mmax`, with its choices.
///
/// Building it costs `O(lmax² · min(mmax, lmax+2))`. Slot counts above `ℓ+2` behave as
/// `ℓ+2` (every value stored), so they are clamped.
#[derive(Debug, Clone)]
pub struct Opt0Table {
    lmax: usize,
    mmax: usize,
    uf: f64,
    ub: f64,
    /// `value[m * (lmax+1) + ℓ]`.
    value: Vec<f64>,
    /// The minimizing `i` (0 when `ℓ = 0` or infeasible).
    choice: Vec<usize>,
}

impl Opt0Table {
    /// Fills the table for `ℓ ≤ lmax`, `m ≤ mmax` with costs `uf`, `ub` (non-negative).
    pub fn new(lmax: usize, mmax: usize, uf: f64, ub: f64) -> Opt0Table {
        let mmax = mmax.min(lmax + 2);
        let w = lmax + 1;
        let mut value = vec![f64::INFINITY; (mmax + 1) * w];
        let mut choice = vec![0usize; (mmax + 1) * w];
        for m in 2..=mmax {
            value[m * w] = ub;
        }
        for m in 3..=mmax {
            for l in 1..=lmax {
                let mut best = f64::INFINITY;
                let mut arg = 0;
                for i in 1..=l {
                    let upper = value[(m - 1) * w + (l - i)];
                    if upper.is_infinite() {
                        continue;
                    }
                    let v = i as f64 * uf + upper + value[m * w + (i - 1)];
                    if v < best {
                        best = v;
                        arg = i;
                    }
                }
                value[m * w + l] = best;
                choice[m * w + l] = arg;
            }
        }
        Opt0Table { lmax, mmax, uf, ub, value, choice }
    }

    /// The largest `ℓ` of the table.
    pub fn lmax(&self) -> usize {
        self.lmax
    }

    /// `Opt_0(ℓ, m)`; `∞` when infeasible. Panics if `ℓ > lmax`.
    pub fn value(&self, l: usize, m: usize) -> f64 {
        assert!(l <= self.lmax, "Opt0Table: ℓ = {l} is beyond the table's {}", self.lmax);
        let m = m.min(self.mmax).min(l + 2);
        self.value[m * (self.lmax + 1) + l]
    }

    /// The optimal first advance `i` for `(ℓ, m)`, `None` if `ℓ = 0` or infeasible.
    pub fn choice(&self, l: usize, m: usize) -> Option<usize> {
        assert!(l <= self.lmax, "Opt0Table: ℓ = {l} is beyond the table's {}", self.lmax);
        let m = m.min(self.mmax).min(l + 2);
        match self.choice[m * (self.lmax + 1) + l] {
            0 => None,
            i => Some(i),
        }
    }

    /// The costs the table was built with.
    pub fn costs(&self) -> (f64, f64) {
        (self.uf, self.ub)
    }

    /// An optimal sequence for ADJCHAIN(ℓ, m) starting from `a_0`; `None` if infeasible
    /// (or if `m` exceeds the table and is below `ℓ + 2`).
    ///
    /// Its cost is `#Advance · u_f + #Reverse · u_b = Opt_0(ℓ, m)`, and it has exactly one
    /// `Reverse` per backward step `ℓ, ℓ−1, …, 0`, in that order.
    pub fn sequence(&self, l: usize, m: usize) -> Option<Vec<RevolveAction>> {
        if self.value(l, m).is_infinite() || (m > self.mmax && self.mmax < l + 2) {
            return None;
        }
        let mut out = Vec::new();
        // Tasks: reverse steps s..=s+len with `slots` slots, a_s stored.
        let mut stack = vec![(0usize, l, m)];
        while let Some((s, len, slots)) = stack.pop() {
            if len == 0 {
                out.push(RevolveAction::Reverse { stage: s });
                continue;
            }
            let i = self.choice(len, slots).expect("a finite Opt_0 entry has a choice");
            out.push(RevolveAction::Advance { stage: s, keep_input: true });
            for j in 1..i {
                out.push(RevolveAction::Advance { stage: s + j, keep_input: false });
            }
            // Last in, first out: the upper part runs first.
            stack.push((s, i - 1, slots));
            stack.push((s + i, len - i, slots - 1));
        }
        Some(out)
    }
}

/// `Opt_0(l, m)` with forward cost `uf` and backward cost `ub` (the DP of Theorem 1);
/// `f64::INFINITY` when `m` slots are too few.
pub fn opt0(l: usize, m: usize, uf: f64, ub: f64) -> f64 {
    Opt0Table::new(l, m, uf, ub).value(l, m)
}

/// An optimal Revolve sequence for ADJCHAIN(l, m) (see [`Opt0Table::sequence`]).
pub fn opt0_sequence(l: usize, m: usize) -> Option<Vec<RevolveAction>> {
    Opt0Table::new(l, m, 1.0, 1.0).sequence(l, m)
}

/// The binomial coefficient `C(n, k)`, saturating at `u128::MAX`.
fn binomial(n: u64, k: u64) -> u128 {
    if k > n {
        return 0;
    }
    let k = k.min(n - k);
    let mut c: u128 = 1;
    for j in 0..k {
        // c = C(n, j) here; C(n, j+1) = C(n, j) · (n−j) / (j+1), exact at each step.
        c = match c.checked_mul((n - j) as u128) {
            Some(p) => p / (j as u128 + 1),
            None => return u128::MAX,
        };
    }
    c
}

/// Griewank & Walther's `t(l, s)`: the fewest forward steps to reverse `l` steps with
/// `s` snapshots (`None` when `s = 0` and `l > 1`, or on overflow).
pub fn binomial_forward_steps(l: u64, s: u64) -> Option<u64> {
    if l <= 1 {
        return Some(0);
    }
    if s == 0 {
        return None;
    }
    // The smallest r with C(s+r, s) ≥ l; then C(s+r−1, s) < l holds by minimality.
    let mut r = 0u64;
    while binomial(s + r, s) < l as u128 {
        r += 1;
    }
    let t = (r as u128 * l as u128).checked_sub(binomial(s + r, s + 1))?;
    u64::try_from(t).ok()
}

/// `Opt_0(l, m)` with `u_f = u_b = 1` by the binomial closed form,
/// `t(l+1, m−2) + (l+1)`; `f64::INFINITY` when infeasible (`m < 2`, or `m < 3` with `l > 0`).
pub fn binomial_revolve_cost(l: usize, m: usize) -> f64 {
    if m < 2 || (m < 3 && l > 0) {
        return f64::INFINITY;
    }
    match binomial_forward_steps(l as u64 + 1, m as u64 - 2) {
        Some(t) => t as f64 + (l + 1) as f64,
        None => f64::INFINITY,
    }
}

/// `revolve-optimal`: `Opt_0` (Shilova, Theorem 1) as a solver. The chain is taken as
/// homogeneous: every value takes one slot of the largest tensor's size, and each stage
/// costs the mean forward and backward times in the DP's choice (which only minimizes
/// the number of forward steps). The budget left after static memory and the largest
/// temporary buffer gives `k` slots. Ch. 1's operations work in place, with their
/// working memory outside the slots; under Table 2.1 a backward step also holds the saved
/// set `ā_{i+1}` (recomputed by `F_i^all` just before `B_i`) and its output `δ_i` while it
/// runs, so `Opt_0` gets `m = k − 2` slots. With this accounting the schedule always fits.
///
/// The `revolve` baseline runs the same schedules but picks the slot count by simulation;
/// this one is the DP's own answer for the budget.
pub struct RevolveOptimal;

/// A Revolve sequence on an `L`-stage chain (its ADJCHAIN has `ℓ = L`, the loss being the
/// top backward step) turned into chain ops: a kept advance is `F_ck`, a consuming one
/// `F_∅`, and each backward `B_i` (`i < L`) is preceded by `F_i all`, which produces
/// its saved set just in time.
pub fn revolve_ops(l: usize, seq: &[RevolveAction]) -> Vec<Op> {
    let mut ops = Vec::with_capacity(seq.len() + l);
    for a in seq {
        match *a {
            RevolveAction::Advance { stage, keep_input } => ops.push(Op::Forward {
                stage,
                mode: if keep_input { ForwardMode::Checkpoint } else { ForwardMode::Discard },
            }),
            RevolveAction::Reverse { stage } => {
                if stage < l {
                    ops.push(Op::Forward { stage, mode: ForwardMode::KeepAll });
                }
                ops.push(Op::Backward { stage });
            }
        }
    }
    ops
}

impl crate::Solver for RevolveOptimal {
    fn name(&self) -> &'static str {
        "revolve-optimal"
    }

    fn description(&self) -> &'static str {
        "Opt_0, the homogeneous Revolve DP (Shilova Thm 1), with slots from the budget"
    }

    fn solve(
        &self,
        problem: crate::Problem<'_>,
        budget: u64,
        _options: &crate::SolveOptions,
    ) -> Result<pebble_schedule::Schedule, crate::SolveError> {
        let chain = problem.chain_for(self.name())?;
        let l = chain.len();
        let slot = chain.x.iter().chain(&chain.xbar[1..]).copied().max().unwrap_or(0).max(1);
        let tmp = chain.ftmp.iter().chain(&chain.btmp).copied().max().unwrap_or(0);
        let k = budget.saturating_sub(chain.static_bytes + tmp) / slot;
        let m = k.saturating_sub(2).min(l as u64 + 2) as usize;
        let seq = opt0_sequence(l, m).ok_or_else(|| crate::SolveError::Infeasible {
            budget,
            reason: format!(
                "Opt_0 needs 3 slots of {slot} bytes plus 2 for the backward step; the budget leaves {k} after static memory and {tmp} bytes of temporary memory"
            ),
        })?;
        Ok(pebble_schedule::Schedule::new(pebble_schedule::View::Chain, revolve_ops(l, &seq)))
    }
}

inventory::submit!(crate::Registration(&RevolveOptimal));

#[cfg(test)]
mod tests {
    use super::*;

    const INF: f64 = f64::INFINITY;

    /// Digest §10.1: Opt_0(ℓ, m) for ℓ = 0..=10 and m = 2..=8, u_f = u_b = 1.
    const TABLE: [[f64; 7]; 11] = [
        [1., 1., 1., 1., 1., 1., 1.],
        [INF, 3., 3., 3., 3., 3., 3.],
        [INF, 6., 5., 5., 5., 5., 5.],
        [INF, 10., 8., 7., 7., 7., 7.],
        [INF, 15., 11., 10., 9., 9., 9.],
        [INF, 21., 14., 13., 12., 11., 11.],
        [INF, 28., 18., 16., 15., 14., 13.],
        [INF, 36., 22., 19., 18., 17., 16.],
        [INF, 45., 26., 22., 21., 20., 19.],
        [INF, 55., 30., 25., 24., 23., 22.],
        [INF, 66., 35., 29., 27., 26., 25.],
    ];

    #[test]
    fn dp_matches_the_digest_table() {
        let t = Opt0Table::new(10, 8, 1.0, 1.0);
        for (l, row) in TABLE.iter().enumerate() {
            for (j, &want) in row.iter().enumerate() {
                let m = j + 2;
                assert_eq!(t.value(l, m), want, "Opt_0({l}, {m})");
                assert_eq!(opt0(l, m, 1.0, 1.0), want, "opt0({l}, {m})");
            }
        }
        assert_eq!(opt0(10, 4, 1.0, 1.0), 35.0);
        assert_eq!(opt0(8, 9, 1.0, 1.0), 18.0);
        assert_eq!(opt0(6, 7, 1.0, 1.0), 14.0);
        assert_eq!(opt0(0, 1, 1.0, 1.0), INF);
        assert_eq!(opt0(3, 2, 1.0, 1.0), INF);
    }

    #[test]
    fn three_slots_is_the_quadratic_formula() {
        for l in 1..60usize {
            let want = (l * (l + 1) / 2) as f64 * 2.5 + (l + 1) as f64 * 0.75;
            assert_eq!(opt0(l, 3, 2.5, 0.75), want, "ℓ = {l}");
            assert_eq!(opt0(l, 3, 1.0, 1.0), (l * (l + 1) / 2 + l + 1) as f64);
        }
    }

    #[test]
    fn enough_slots_store_everything() {
        for l in 0..30usize {
            for m in l + 2..l + 5 {
                assert_eq!(opt0(l, m, 3.0, 2.0), 3.0 * l as f64 + 2.0 * (l + 1) as f64);
            }
        }
    }

    #[test]
    fn dp_equals_the_binomial_closed_form() {
        let t = Opt0Table::new(39, 14, 1.0, 1.0);
        for l in 0..40 {
            for m in 3..15 {
                assert_eq!(t.value(l, m), binomial_revolve_cost(l, m), "ℓ = {l}, m = {m}");
            }
        }
        // Non-unit costs: only the forward count is optimized, so the same closed form holds.
        let t = Opt0Table::new(39, 14, 0.5, 3.0);
        for l in 0..40 {
            for m in 3..15 {
                let steps = binomial_forward_steps(l as u64 + 1, m as u64 - 2).unwrap();
                assert_eq!(t.value(l, m), steps as f64 * 0.5 + (l + 1) as f64 * 3.0, "ℓ = {l}, m = {m}");
            }
        }
        assert_eq!(binomial_revolve_cost(0, 2), 1.0);
        assert_eq!(binomial_revolve_cost(1, 2), INF);
        assert_eq!(binomial_revolve_cost(10, 4), 35.0);
        // t(l, 1) = l(l−1)/2, t(l, s) = l−1 once l ≤ s+1 (store everything).
        assert_eq!(binomial_forward_steps(11, 1), Some(55));
        assert_eq!(binomial_forward_steps(5, 4), Some(4));
        assert_eq!(binomial_forward_steps(5, 0), None);
    }

    /// Replays a sequence under the homogeneous model of Ch. 1 and returns
    /// (forward count, peak slots), checking every input is stored.
    fn replay(l: usize, seq: &[RevolveAction]) -> (usize, usize) {
        use std::collections::BTreeSet;
        let mut stored: BTreeSet<usize> = [0].into(); // a_j
        let mut grad = l + 1; // δ_grad is stored (the incoming gradient)
        let mut forwards = 0;
        let mut peak = stored.len() + 1;
        let mut expect_rev = l as isize;
        for a in seq {
            match *a {
                RevolveAction::Advance { stage, keep_input } => {
                    assert!(stage < l, "advance beyond the chain");
                    assert!(stored.contains(&stage), "a_{stage} not stored");
                    assert!(!stored.contains(&(stage + 1)), "a_{} recomputed while stored", stage + 1);
                    if !keep_input {
                        stored.remove(&stage);
                    }
                    stored.insert(stage + 1);
                    forwards += 1;
                }
                RevolveAction::Reverse { stage } => {
                    assert_eq!(stage as isize, expect_rev, "backward steps out of order");
                    assert_eq!(grad, stage + 1);
                    assert!(stored.remove(&stage), "a_{stage} not stored at its backward");
                    grad = stage;
                    expect_rev -= 1;
                }
            }
            peak = peak.max(stored.len() + 1);
        }
        assert_eq!(expect_rev, -1, "not every backward step ran");
        assert!(stored.is_empty());
        (forwards, peak)
    }

    #[test]
    fn sequences_are_valid_and_optimal() {
        let t = Opt0Table::new(25, 12, 1.0, 1.0);
        for l in 0..=25 {
            for m in 2..=12 {
                let Some(seq) = t.sequence(l, m) else {
                    assert_eq!(t.value(l, m), INF);
                    continue;
                };
                let (forwards, peak) = replay(l, &seq);
                assert_eq!((forwards + l + 1) as f64, t.value(l, m), "ℓ = {l}, m = {m}");
                assert!(peak <= m, "ℓ = {l}, m = {m}: peak {peak} slots");
            }
        }
    }

    #[test]
    fn small_sequences_by_hand() {
        use RevolveAction::*;
        // Three slots: recompute from a_0 before every backward step.
        assert_eq!(
            opt0_sequence(2, 3).unwrap(),
            vec![
                Advance { stage: 0, keep_input: true },
                Advance { stage: 1, keep_input: false },
                Reverse { stage: 2 },
                Advance { stage: 0, keep_input: true },
                Reverse { stage: 1 },
                Reverse { stage: 0 },
            ]
        );
        // Enough slots: checkpoint everything.
        assert_eq!(
            opt0_sequence(2, 4).unwrap(),
            vec![
                Advance { stage: 0, keep_input: true },
                Advance { stage: 1, keep_input: true },
                Reverse { stage: 2 },
                Reverse { stage: 1 },
                Reverse { stage: 0 },
            ]
        );
        assert_eq!(opt0_sequence(3, 2), None);
    }

    /// On a unit chain the simulated time is `Opt_0(L, m)` plus one `F^all` re-run per
    /// stage, and `Opt_0` is Griewank's binomial form: `t(L+1, m−2) + (L+1) + L`.
    #[test]
    fn revolve_optimal_matches_the_closed_form_in_the_simulator() {
        use crate::{plan, solver, Problem, SolveOptions};
        let s = solver("revolve-optimal").expect("registered");
        for l in 1..25 {
            let chain = pebble_graph::Chain::homogeneous(l, 1.0, 1.0, 1);
            for k in 5..(l as u64 + 8) {
                let m = (k - 2).min(l as u64 + 2) as usize;
                let p = plan(s, Problem::Chain(&chain), k, &SolveOptions::default()).expect("fits");
                let t = binomial_forward_steps(l as u64 + 1, m as u64 - 2).expect("feasible") as f64;
                assert_eq!(p.report.makespan, t + (l + 1) as f64 + l as f64, "L = {l}, k = {k}");
                assert_eq!(p.report.makespan, opt0(l, m, 1.0, 1.0) + l as f64);
                assert!(p.report.peak_bytes <= k);
            }
            assert!(plan(s, Problem::Chain(&chain), 4, &SolveOptions::default()).is_err());
        }
    }

    /// With heterogeneous sizes the slot accounting stays conservative: whatever it
    /// returns fits.
    #[test]
    fn revolve_optimal_schedules_fit_on_random_chains() {
        use crate::{plan, solver, PlanError, Problem, SolveError, SolveOptions};
        let s = solver("revolve-optimal").expect("registered");
        let mut rng = pebble_testkit::Rng::new(7);
        for _ in 0..200 {
            let l = rng.range(1, 10) as usize;
            let chain = pebble_testkit::random_chain(&mut rng, l);
            let budget = rng.range(10, 200);
            match plan(s, Problem::Chain(&chain), budget, &SolveOptions::default()) {
                Ok(p) => assert!(p.report.peak_bytes <= budget),
                Err(PlanError::Solve(SolveError::Infeasible { .. })) => {}
                Err(e) => panic!("{e}"),
            }
        }
    }
}
