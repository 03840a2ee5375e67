//! Shilova's Theorem 3 (`Opt_bm`, the DP for MULTI-b), Lemma 2 (`m_min`), the
//! reconstruction of an optimal canonical schedule as Table 1.1 operations, and an
//! independent replay of such sequences under the thesis's memory model.

use std::collections::HashMap;

use crate::remat::revolve::{Opt0Table, RevolveAction};

/// The homogeneous costs of the thesis's model: every forward step costs `uf`, every
/// backward step `ub`, the loss `ul`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Costs {
    /// `u_F`.
    pub uf: f64,
    /// `u_B`.
    pub ub: f64,
    /// `u_L`.
    pub ul: f64,
}

impl Costs {
    /// `u_F = u_B = u_L = 1`, the thesis's simulations.
    pub const UNIT: Costs = Costs { uf: 1.0, ub: 1.0, ul: 1.0 };
}

/// One operation of Table 1.1. Chains are 0-based (`chain = 0` is the thesis's
/// branch 1); indices are the thesis's: chain `k` holds `a_0 … a_{L_k}` and
/// `δ_0 … δ_{L_k}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KOp {
    /// `F_i`: replaces `a_{i-1}` by `a_i` in the same slot (`index = i ≥ 1`), cost `u_F`.
    Forward {
        /// The chain.
        chain: usize,
        /// `i`.
        index: usize,
    },
    /// `B_i`: `{δ_i, a_{i-1}} → {δ_{i-1}}` (`index = i ≥ 1`), cost `u_B`.
    Backward {
        /// The chain.
        chain: usize,
        /// `i`.
        index: usize,
    },
    /// `Loss`: `{a_{L_k}} → {δ_{L_k}}` for every chain, in place, cost `u_L`.
    Loss,
    /// `S_i`: replicates `a_i` (a checkpoint), cost 0, one more slot.
    Store {
        /// The chain.
        chain: usize,
        /// `i`.
        index: usize,
    },
    /// `D_i`: discards one copy of `a_i`, cost 0.
    Discard {
        /// The chain.
        chain: usize,
        /// `i`.
        index: usize,
    },
    /// `D̄`: discards `δ_0` of the chain, cost 0.
    DiscardGrad {
        /// The chain.
        chain: usize,
    },
}

impl std::fmt::Display for KOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The thesis's notation, with 1-based branch numbers as superscripts.
        match *self {
            KOp::Forward { chain, index } => write!(f, "F{index}^{}", chain + 1),
            KOp::Backward { chain, index } => write!(f, "B{index}^{}", chain + 1),
            KOp::Loss => write!(f, "Loss"),
            KOp::Store { chain, index } => write!(f, "S{index}^{}", chain + 1),
            KOp::Discard { chain, index } => write!(f, "D{index}^{}", chain + 1),
            KOp::DiscardGrad { chain } => write!(f, "D̄^{}", chain + 1),
        }
    }
}

/// Lemma 2: the fewest slots with which MULTI-b(`lengths`, m, `b`) can be solved.
///
/// With `K̃ = K + #{k : L_k ≠ 0}`: `K̃` if some `L_k = 1`, or some `L_k = 0` with
/// `b_k = 0`, or every `L_k = 0`; `K̃ + 1` otherwise.
pub fn m_min(lengths: &[usize], b: &[bool]) -> usize {
    assert_eq!(lengths.len(), b.len(), "m_min: one b per chain");
    let k = lengths.len();
    let kt = k + lengths.iter().filter(|&&l| l != 0).count();
    let easy =
        lengths.contains(&1) || lengths.iter().zip(b).any(|(&l, &bk)| l == 0 && !bk) || lengths.iter().all(|&l| l == 0);
    if easy {
        kt
    } else {
        kt + 1
    }
}

/// Slots beyond which `Opt_bm` no longer decreases: storing every `a_i` of every chain
/// takes `Σ (L_k + 1)` slots, and then nothing is recomputed.
fn saturation(v: &[(usize, bool)]) -> usize {
    let (l, b): (Vec<usize>, Vec<bool>) = v.iter().copied().unzip();
    m_min(&l, &b).max(v.iter().map(|&(l, _)| l + 1).sum())
}

/// The no-recomputation lower bound `Σ L_k (u_F + u_B) + u_L`.
pub fn lower_bound(lengths: &[usize], costs: Costs) -> f64 {
    let n: usize = lengths.iter().sum();
    n as f64 * (costs.uf + costs.ub) + costs.ul
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    value: f64,
    /// Position (in the canonical order) of the chain that finishes last, and `i`.
    choice: Option<(usize, usize)>,
}

/// `Opt_bm(L, m, b)` of Theorem 3, memoized on the canonical state.
///
/// ```text
/// Opt_bm(L, m, b)   = ∞                          m < m_min(L, b)
/// Opt_bm(0⃗, m, b)   = u_L                        m ≥ K
/// Opt_bm(e_i, m, b) = u_F + u_L + u_B            m ≥ K + 1
/// Opt_bm(L, m, b)   = min_{k, 1 ≤ i ≤ L_k} i·u_F + Opt_bm(L[k←L_k−i], m−1, b[k←1])
///                                              + Opt_0(i−1, m − Σ_{j≠k} b_j)        (1.4)
/// ```
///
/// Branches are interchangeable, so a state is canonicalized by sorting its
/// `(L_k, b_k)` pairs; `m` is clamped at `max(m_min, Σ (L_k + 1))`, where every
/// activation fits and the value no longer changes. The `e_i` case is the `(k, 1)` term
/// of (1.4) and needs no special code. `Opt_0` is [`crate::remat::revolve`]'s table.
#[derive(Debug, Clone)]
pub struct MultiChainDp {
    costs: Costs,
    opt0: Opt0Table,
    /// `(lmax, mmax)` the Opt_0 table was asked for.
    opt0_size: (usize, usize),
    memo: HashMap<(Vec<(usize, bool)>, usize), Entry>,
}

impl MultiChainDp {
    /// An empty DP with these costs (non-negative).
    pub fn new(costs: Costs) -> MultiChainDp {
        MultiChainDp { costs, opt0: Opt0Table::new(0, 2, costs.uf, costs.ub), opt0_size: (0, 2), memo: HashMap::new() }
    }

    /// The costs.
    pub fn costs(&self) -> Costs {
        self.costs
    }

    /// How many states the memo holds.
    pub fn states(&self) -> usize {
        self.memo.len()
    }

    /// Makes the Opt_0 table cover `ℓ ≤ lmax` and `m ≤ mmax` (a table built up to
    /// `m = ℓmax + 2` covers every `m`, since `Opt_0` no longer changes beyond).
    fn ensure_opt0(&mut self, lmax: usize, mmax: usize) {
        let (l0, m0) = self.opt0_size;
        if lmax <= l0 && (mmax <= m0 || m0 >= l0 + 2) {
            return;
        }
        let l = lmax.max(l0);
        let m = mmax.max(m0).min(l + 2);
        self.opt0 = Opt0Table::new(l, m, self.costs.uf, self.costs.ub);
        self.opt0_size = (l, m);
    }

    fn opt0(&self, l: usize, m: usize) -> f64 {
        if m < 2 {
            return f64::INFINITY;
        }
        self.opt0.value(l, m)
    }

    fn prepare(&mut self, lengths: &[usize], m: usize, b: &[bool]) -> (Vec<usize>, Vec<(usize, bool)>, usize) {
        assert_eq!(lengths.len(), b.len(), "MultiChainDp: one b per chain");
        let mut perm: Vec<usize> = (0..lengths.len()).collect();
        perm.sort_by_key(|&k| (lengths[k], b[k]));
        let v: Vec<(usize, bool)> = perm.iter().map(|&k| (lengths[k], b[k])).collect();
        let m = m.min(saturation(&v));
        let lmax = lengths.iter().copied().max().unwrap_or(0);
        self.ensure_opt0(lmax, m);
        (perm, v, m)
    }

    /// `Opt_bm(lengths, m, b)`; `f64::INFINITY` when `m < m_min`.
    pub fn value(&mut self, lengths: &[usize], m: usize, b: &[bool]) -> f64 {
        let (_, v, m) = self.prepare(lengths, m, b);
        self.solve(&v, m).value
    }

    /// The argmin `(k, i)` of (1.4) the DP keeps (chain `k` in the caller's order
    /// finishes its backward pass last; `a_i^{(k)}` is its second checkpoint). `None`
    /// when infeasible or when every `L_k = 0`.
    pub fn choice(&mut self, lengths: &[usize], m: usize, b: &[bool]) -> Option<(usize, usize)> {
        let (perm, v, m) = self.prepare(lengths, m, b);
        self.solve(&v, m).choice.map(|(pos, i)| (perm[pos], i))
    }

    /// Every `(k, i)` (caller's order) that attains the minimum of (1.4) at the top
    /// level, in increasing `(k, i)`.
    pub fn argmins(&mut self, lengths: &[usize], m: usize, b: &[bool]) -> Vec<(usize, usize)> {
        let best = self.value(lengths, m, b);
        if best.is_infinite() || lengths.iter().all(|&l| l == 0) {
            return Vec::new();
        }
        let mut out = Vec::new();
        for k in 0..lengths.len() {
            for i in 1..=lengths[k] {
                let t = self.term(lengths, m, b, k, i);
                if (t - best).abs() <= 1e-9 * best.abs().max(1.0) {
                    out.push((k, i));
                }
            }
        }
        out
    }

    /// The term of (1.4) for the choice `(k, i)` (caller's order), at the top level.
    pub fn term(&mut self, lengths: &[usize], m: usize, b: &[bool], k: usize, i: usize) -> f64 {
        assert!(i >= 1 && i <= lengths[k], "term: i = {i} out of 1..={}", lengths[k]);
        let (l, bb): (Vec<usize>, Vec<bool>) = (lengths.to_vec(), b.to_vec());
        if m < m_min(&l, &bb) || m == 0 {
            return f64::INFINITY;
        }
        let others: usize = b.iter().enumerate().filter(|&(j, &bj)| j != k && bj).count();
        let mut sub_l = l.clone();
        sub_l[k] -= i;
        let mut sub_b = bb.clone();
        sub_b[k] = true;
        let sub = self.value(&sub_l, m - 1, &sub_b);
        self.ensure_opt0(lengths[k], m);
        let t0 = if m < others { f64::INFINITY } else { self.opt0(i - 1, m - others) };
        i as f64 * self.costs.uf + sub + t0
    }

    /// The DP on a canonical (sorted) state with `m` already clamped.
    fn solve(&mut self, v: &[(usize, bool)], m: usize) -> Entry {
        let (l, b): (Vec<usize>, Vec<bool>) = v.iter().copied().unzip();
        if m < m_min(&l, &b) {
            return Entry { value: f64::INFINITY, choice: None };
        }
        let m = m.min(saturation(v));
        if l.iter().all(|&x| x == 0) {
            return Entry { value: self.costs.ul, choice: None };
        }
        let key = (v.to_vec(), m);
        if let Some(&e) = self.memo.get(&key) {
            return e;
        }
        let sum_b = b.iter().filter(|&&x| x).count();
        let mut best = Entry { value: f64::INFINITY, choice: None };
        for k in 0..v.len() {
            let (lk, bk) = v[k];
            if lk == 0 || (k > 0 && v[k - 1] == v[k]) {
                continue;
            }
            let others = sum_b - bk as usize;
            if m < others + 2 {
                continue;
            }
            let slots0 = m - others;
            for i in 1..=lk {
                let t0 = self.opt0(i - 1, slots0);
                if t0.is_infinite() {
                    continue;
                }
                let mut sub = v.to_vec();
                sub[k] = (lk - i, true);
                sub.sort_unstable();
                let s = self.solve(&sub, m - 1).value;
                if s.is_infinite() {
                    continue;
                }
                let t = i as f64 * self.costs.uf + s + t0;
                if t < best.value {
                    best = Entry { value: t, choice: Some((k, i)) };
                }
            }
        }
        self.memo.insert(key, best);
        best
    }

    /// An optimal canonical schedule of MULTI-b(`lengths`, m, `b`) as Table 1.1
    /// operations; `None` when `m < m_min`.
    ///
    /// Following Theorem 3's proof, from the argmin `(k, i)`: `S_0^{(k)}`, then
    /// `F_1^{(k)} … F_i^{(k)}`, then the schedule of `(L[k←L_k−i], m−1, b[k←1])` (whose
    /// chain `k` starts at `a_i^{(k)}`), then Revolve's sequence for `ADJCHAIN(i−1,
    /// m − Σ_{j≠k} b_j)` on layers `1..i` of chain `k`, then `D̄^{(k)}` if `b_k = 0`. At
    /// `L = 0⃗`: `Loss`, then `D̄` for every chain with `b = 0`.
    pub fn schedule(&mut self, lengths: &[usize], m: usize, b: &[bool]) -> Option<Vec<KOp>> {
        if self.value(lengths, m, b).is_infinite() {
            return None;
        }
        let mut out = Vec::new();
        let offsets = vec![0usize; lengths.len()];
        self.rebuild(lengths.to_vec(), m, b.to_vec(), offsets, &mut out);
        Some(out)
    }

    fn rebuild(&mut self, lengths: Vec<usize>, m: usize, b: Vec<bool>, offsets: Vec<usize>, out: &mut Vec<KOp>) {
        if lengths.iter().all(|&l| l == 0) {
            out.push(KOp::Loss);
            for (chain, &bk) in b.iter().enumerate() {
                if !bk {
                    out.push(KOp::DiscardGrad { chain });
                }
            }
            return;
        }
        let (perm, v, m) = self.prepare(&lengths, m, &b);
        let (pos, i) = self.solve(&v, m).choice.expect("a finite state with a non-zero L has a choice");
        let k = perm[pos];
        let o = offsets[k];
        out.push(KOp::Store { chain: k, index: o });
        for j in 1..=i {
            out.push(KOp::Forward { chain: k, index: o + j });
        }
        let others: usize = b.iter().enumerate().filter(|&(j, &bj)| j != k && bj).count();
        let mut sub_l = lengths.clone();
        sub_l[k] -= i;
        let mut sub_b = b.clone();
        sub_b[k] = true;
        let mut sub_o = offsets.clone();
        sub_o[k] += i;
        self.rebuild(sub_l, m - 1, sub_b, sub_o, out);
        let seq = self.opt0.sequence(i - 1, m - others).expect("the chosen Opt_0 term is finite");
        for a in seq {
            match a {
                RevolveAction::Advance { stage, keep_input } => {
                    if keep_input {
                        out.push(KOp::Store { chain: k, index: o + stage });
                    }
                    out.push(KOp::Forward { chain: k, index: o + stage + 1 });
                }
                RevolveAction::Reverse { stage } => out.push(KOp::Backward { chain: k, index: o + stage + 1 }),
            }
        }
        if !b[k] {
            out.push(KOp::DiscardGrad { chain: k });
        }
    }
}

/// `Opt_bm(lengths, m, b)` with the given costs (a fresh [`MultiChainDp`]).
pub fn opt_bm(lengths: &[usize], m: usize, b: &[bool], costs: Costs) -> f64 {
    MultiChainDp::new(costs).value(lengths, m, b)
}

/// What replaying Table 1.1 operations gives.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Replay {
    /// Makespan: `k_F·u_F + k_B·u_B + k_T·u_L`.
    pub time: f64,
    /// The thesis's memory count: the most values stored at once (duplicates included).
    pub peak: usize,
    /// Number of `F` operations.
    pub forwards: usize,
    /// The peak of the same schedule on a [`KJoinLayout::Plain`](super::KJoinLayout::Plain)
    /// graph: each compute op also holds its new outputs while its inputs are still
    /// resident, i.e. the maximum of `peak` and, over the ops, *distinct values stored
    /// before the op + values it creates* (`F`: 1; `B_i`: 1, or 0 for `B_1` when
    /// `b = 0`; `Loss`: one per chain with `L_k ≥ 1` or `b_k = 1`).
    pub plain_peak: usize,
}

/// Replays Table 1.1 operations from `{a_0^{(k)}}` under the thesis's model (§1.1:
/// `F` and `Loss` work in place, `S` duplicates, `B` consumes its two inputs) and
/// checks the schedule: every input present, each `B` exactly once, the loss once, and
/// the final memory exactly `{δ_0^{(k)} : b_k = 1}`.
pub fn replay(lengths: &[usize], b: &[bool], costs: Costs, ops: &[KOp]) -> Result<Replay, String> {
    let kk = lengths.len();
    assert_eq!(b.len(), kk, "replay: one b per chain");
    // copies[k][i]: copies of a_i^{(k)}; grad[k]: index of the δ held (at most one).
    let mut copies: Vec<Vec<usize>> = lengths.iter().map(|&l| vec![0; l + 1]).collect();
    for c in &mut copies {
        c[0] = 1;
    }
    let mut grad: Vec<Option<usize>> = vec![None; kk];
    let mut done_b: Vec<Vec<bool>> = lengths.iter().map(|&l| vec![false; l + 1]).collect();
    let mut loss = false;
    let mut count = kk;
    let mut peak = count;
    let mut plain_peak = count;
    let mut time = 0.0;
    let mut forwards = 0;
    let distinct = |copies: &Vec<Vec<usize>>, grad: &Vec<Option<usize>>| {
        copies.iter().flatten().filter(|&&c| c > 0).count() + grad.iter().filter(|g| g.is_some()).count()
    };
    for (n, op) in ops.iter().enumerate() {
        let bad = |why: String| Err(format!("op {n} ({op}): {why}"));
        match *op {
            KOp::Forward { chain, index } => {
                if chain >= kk || index == 0 || index > lengths[chain] {
                    return bad("out of range".into());
                }
                if copies[chain][index - 1] == 0 {
                    return bad(format!("a_{} is not stored", index - 1));
                }
                plain_peak = plain_peak.max(distinct(&copies, &grad) + 1);
                copies[chain][index - 1] -= 1;
                copies[chain][index] += 1;
                time += costs.uf;
                forwards += 1;
            }
            KOp::Backward { chain, index } => {
                if chain >= kk || index == 0 || index > lengths[chain] {
                    return bad("out of range".into());
                }
                if grad[chain] != Some(index) {
                    return bad(format!("δ_{index} is not stored"));
                }
                if copies[chain][index - 1] == 0 {
                    return bad(format!("a_{} is not stored", index - 1));
                }
                if done_b[chain][index] {
                    return bad("already ran".into());
                }
                let creates = usize::from(index > 1 || b[chain]);
                plain_peak = plain_peak.max(distinct(&copies, &grad) + creates);
                copies[chain][index - 1] -= 1;
                grad[chain] = Some(index - 1);
                done_b[chain][index] = true;
                count -= 1;
                time += costs.ub;
            }
            KOp::Loss => {
                if loss {
                    return bad("the loss already ran".into());
                }
                if let Some(k) = (0..kk).find(|&k| copies[k][lengths[k]] == 0) {
                    return bad(format!("a_{}^{} is not stored", lengths[k], k + 1));
                }
                let creates = (0..kk).filter(|&k| lengths[k] >= 1 || b[k]).count();
                plain_peak = plain_peak.max(distinct(&copies, &grad) + creates);
                for k in 0..kk {
                    copies[k][lengths[k]] -= 1;
                    grad[k] = Some(lengths[k]);
                }
                loss = true;
                time += costs.ul;
            }
            KOp::Store { chain, index } => {
                if chain >= kk || index > lengths[chain] || copies[chain][index] == 0 {
                    return bad("replicates a value that is not stored".into());
                }
                copies[chain][index] += 1;
                count += 1;
            }
            KOp::Discard { chain, index } => {
                if chain >= kk || index > lengths[chain] || copies[chain][index] == 0 {
                    return bad("discards a value that is not stored".into());
                }
                copies[chain][index] -= 1;
                count -= 1;
            }
            KOp::DiscardGrad { chain } => {
                if chain >= kk || grad[chain] != Some(0) {
                    return bad("δ_0 is not stored".into());
                }
                grad[chain] = None;
                count -= 1;
            }
        }
        peak = peak.max(count);
        plain_peak = plain_peak.max(count);
    }
    if !loss {
        return Err("the loss never ran".into());
    }
    for k in 0..kk {
        if let Some(i) = (1..=lengths[k]).find(|&i| !done_b[k][i]) {
            return Err(format!("B_{i}^{} never ran", k + 1));
        }
        if copies[k].iter().any(|&c| c > 0) {
            return Err(format!("chain {} still stores activations at the end", k + 1));
        }
        let want = if b[k] { Some(0) } else { None };
        if grad[k] != want {
            return Err(format!("chain {}: final gradient state {:?}, expected {want:?}", k + 1, grad[k]));
        }
    }
    Ok(Replay { time, peak, forwards, plain_peak })
}
