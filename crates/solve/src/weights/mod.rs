//! Weight offloading (Beaumont, Eyraud-Dubois, Shilova, Zhao 2022; digest
//! `seed000-004.md` part A): which layers' weights leave the device, and when.
//!
//! The model differs from the rest of pebble's chain model in three ways the paper fixes:
//! the weight update is fused into `B_i` (its gradient `δw_i` lives only during `B_i`),
//! activations are neither offloaded nor recomputed (`a^i` stays from `F_i` to `B_{i+1}`),
//! and the schedule is a steady-state cycle, numbered from `B_L`. [`WeightChain`] holds
//! such an instance; [`WeightChain::op_memory`] is the one memory-accounting function
//! that the selection ([`selection`]), the scheduler and the MILP bound share, with the
//! digest's fix of the paper's double count as the default ([`Accounting`]).

pub mod brute;
pub mod exhaustive;
pub mod schedule;
pub mod selection;
mod solvers;

pub use solvers::{L2l, WeightOffload, WeightOffloadNoReuse};

/// The names of the weight-offloading paper's solvers and bound. (OffMate and the practice
/// baselines move weights too, but are not in this list.)
pub const SOLVERS: [&str; 4] = ["weight-offload", "weight-offload-noreuse", "l2l", "weight-offload-bound"];

use pebble_graph::Chain;

use crate::SolveError;

/// A layer's operation: its forward `F_i` or its backward `B_i` (with the update).
/// Layers are numbered from 1, as in the paper.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WeightOp {
    /// `F_i`.
    Forward(usize),
    /// `B_i`, the weight update included.
    Backward(usize),
}

impl WeightOp {
    /// The layer it belongs to.
    pub fn layer(self) -> usize {
        match self {
            WeightOp::Forward(i) | WeightOp::Backward(i) => i,
        }
    }
}

/// How an operation's memory counts its own layer's weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Accounting {
    /// `M_o + Σ_{j ≠ layer(o)} |w_j|`: the layer's weights once, in `M_o` (the paper's
    /// NP-hardness proof; the digest's recommendation, since the printed formula makes
    /// the paper's own gadget schedule infeasible).
    #[default]
    Consistent,
    /// `M_o + Σ_j |w_j|`, as Algorithm 1 and eq. (4) print it: the layer's weights twice.
    Literal,
}

/// A weight-offloading instance: `L` layers, each with weights `w`, forward and
/// backward times, and the activations between them.
#[derive(Debug, Clone, PartialEq)]
pub struct WeightChain {
    /// `|w_i|` for `i = 1..=L`, at index `i − 1`.
    pub w: Vec<u64>,
    /// `|a^i|` for `i = 0..=L` (`a^0` the input): what stays from `F_i` to `B_{i+1}`.
    pub a: Vec<u64>,
    /// `u_{F_i}`, at index `i − 1`.
    pub uf: Vec<f64>,
    /// `u_{B_i}`, at index `i − 1`.
    pub ub: Vec<f64>,
    /// What `F_i` holds on the device besides the weights, at index `i − 1`.
    pub mf: Vec<u64>,
    /// What `B_i` holds on the device besides the weights, at index `i − 1`.
    pub mb: Vec<u64>,
    /// What stays on the device after `F_i` ends, besides the weights (what `F_{i+1}`
    /// finds), at index `i − 1`.
    pub kept_f: Vec<u64>,
    /// What stays after `B_i` ends, besides the weights, at index `i − 1`.
    pub kept_b: Vec<u64>,
}

impl WeightChain {
    /// An instance from its arrays, checked: `w`, `uf`, `ub` of one length `L ≥ 1`, `a`
    /// of `L + 1`, times finite and non-negative.
    pub fn new(w: Vec<u64>, a: Vec<u64>, uf: Vec<f64>, ub: Vec<f64>) -> Result<WeightChain, SolveError> {
        let l = w.len();
        let bad = |why: String| Err(SolveError::Unsupported { solver: "weight-offload", why });
        if l == 0 {
            return bad("a weight chain needs at least one layer".into());
        }
        if a.len() != l + 1 || uf.len() != l || ub.len() != l {
            return bad(format!(
                "a weight chain of {l} layers needs {} activations and {l} forward and backward times, got {}, {} and {}",
                l + 1,
                a.len(),
                uf.len(),
                ub.len()
            ));
        }
        if let Some(t) = uf.iter().chain(&ub).find(|t| !t.is_finite() || **t < 0.0) {
            return bad(format!("operation times must be finite and non-negative, got {t}"));
        }
        // Eq. (1) less the layer's own weights.
        let acts: Vec<u64> = (1..=l).map(|i| a[..=i].iter().sum()).collect();
        let mf = acts.clone();
        let mb = (0..l).map(|j| acts[j] + w[j]).collect();
        // After B_i: a^0 … a^{i−2} and δ^{i−1}, the size of a^{i−1}.
        let kept_b = (0..l).map(|j| acts[j] - a[j + 1]).collect();
        Ok(WeightChain { w, a, uf, ub, kept_f: mf.clone(), mf, mb, kept_b })
    }

    /// The weight-offloading view of a chain with weights `w`: layer `i` is stage `i − 1`,
    /// `a^i` is what stage `i − 1` keeps for its backward (`x̄_i`, `a^0 = x_0`), and the
    /// loss is folded into `B_L` (the paper ignores the loss). The memory of each
    /// operation besides the weights is what the simulator counts when every stage keeps
    /// its saved set (`F_all`): the static bytes other than `w`, the activations kept so
    /// far, the op's outputs and temporary memory; `B_L` is the larger of the loss and
    /// the last stage's backward. So a schedule that fits by this accounting fits the
    /// simulator's.
    pub fn from_chain(chain: &Chain) -> Result<WeightChain, SolveError> {
        let Some(w) = chain.w.clone() else {
            let why = "weight offloading needs the chain's weights `w`".into();
            return Err(SolveError::Unsupported { solver: "weight-offload", why });
        };
        let l = chain.len();
        let mut a = Vec::with_capacity(l + 1);
        a.push(chain.x[0]);
        a.extend_from_slice(&chain.xbar[1..=l]);
        let mut ub = chain.btime[..l].to_vec();
        ub[l - 1] += chain.btime[l];
        let mut c = WeightChain::new(w, a, chain.ftime.clone(), ub)?;
        let other = chain.static_bytes.saturating_sub(c.total_weights());
        // kept[s]: a_0 and the saved sets of stages before s.
        let mut kept = vec![other + chain.x[0]; l + 1];
        for s in 1..=l {
            kept[s] = kept[s - 1] + chain.xbar[s];
        }
        for s in 0..l {
            c.mf[s] = kept[s] + chain.xbar[s + 1] + chain.ftmp[s];
            c.mb[s] = kept[s + 1] + chain.x[s + 1] + chain.x[s] + chain.fused_btmp(s);
            c.kept_f[s] = kept[s + 1];
            // δ_s beside what came before stage s (B_0 releases a_0).
            c.kept_b[s] = kept[s] + chain.x[s] - if s == 0 { chain.x[0] } else { 0 };
        }
        let loss = kept[l] + chain.x[l] + chain.btmp[l];
        c.mb[l - 1] = c.mb[l - 1].max(loss);
        Ok(c)
    }

    /// `L`.
    pub fn len(&self) -> usize {
        self.w.len()
    }

    /// Never: an instance has at least one layer.
    pub fn is_empty(&self) -> bool {
        self.w.is_empty()
    }

    /// `|w_i|`, `i` from 1.
    pub fn weight(&self, i: usize) -> u64 {
        self.w[i - 1]
    }

    /// `Σ_i |w_i|`.
    pub fn total_weights(&self) -> u64 {
        self.w.iter().sum()
    }

    /// One iteration's operations in the paper's order: `F_1 … F_L, B_L … B_1`.
    pub fn ops(&self) -> Vec<WeightOp> {
        let l = self.len();
        (1..=l).map(WeightOp::Forward).chain((1..=l).rev().map(WeightOp::Backward)).collect()
    }

    /// What stays on the device after `op` ends, besides the weights.
    pub fn kept_after(&self, op: WeightOp) -> u64 {
        match op {
            WeightOp::Forward(i) => self.kept_f[i - 1],
            WeightOp::Backward(i) => self.kept_b[i - 1],
        }
    }

    /// A lower bound on the period that needs no solver: `Σu`, and the weights that must
    /// be away from the device at the operation with the most excess, `E = max_o (Σ|w| +
    /// mem(o) − M)`. Each byte of them is updated once a period (by its backward), so it
    /// goes out after its update and comes back before its next use, once each way per
    /// period: the period is at least `E/β↓` and `E/β↑`.
    pub fn transfer_bound(&self, memory: u64, beta_off: f64, beta_pre: f64) -> f64 {
        let total = self.total_weights();
        let excess = self
            .ops()
            .into_iter()
            .map(|o| (total + self.op_memory(o, Accounting::Consistent)).saturating_sub(memory))
            .max();
        let e = excess.unwrap_or(0) as f64;
        self.compute_time().max(e / beta_off).max(e / beta_pre)
    }

    /// The operation's position in [`WeightChain::ops`].
    pub fn op_index(&self, op: WeightOp) -> usize {
        match op {
            WeightOp::Forward(i) => i - 1,
            WeightOp::Backward(i) => 2 * self.len() - i,
        }
    }

    /// The operation's time.
    pub fn time(&self, op: WeightOp) -> f64 {
        match op {
            WeightOp::Forward(i) => self.uf[i - 1],
            WeightOp::Backward(i) => self.ub[i - 1],
        }
    }

    /// `Σ u`: the iteration's time with no wait.
    pub fn compute_time(&self) -> f64 {
        self.uf.iter().chain(&self.ub).sum()
    }

    /// Eq. (1): `M_{F_i} = |w_i| + Σ_{k≤i} |a^k|` and `M_{B_i} = 2|w_i| + Σ_{k≤i} |a^k|`
    /// (`δw_i` beside `w_i`; `δ^{i−1}` replaces `a^{i−1}`).
    pub fn eq1(&self, op: WeightOp) -> u64 {
        let i = op.layer();
        let acts: u64 = self.a[..=i].iter().sum();
        let copies = match op {
            WeightOp::Forward(_) => 1,
            WeightOp::Backward(_) => 2,
        };
        copies * self.weight(i) + acts
    }

    /// What `op` needs besides the weights resident on the device: `M_o` less its own
    /// layer's `|w|` under [`Accounting::Consistent`] (the resident weights count it),
    /// `M_o` under [`Accounting::Literal`]. `M_o` is eq. (1) for an instance built by
    /// [`WeightChain::new`], the simulator's count for one from [`WeightChain::from_chain`].
    pub fn op_memory(&self, op: WeightOp, accounting: Accounting) -> u64 {
        let own = match op {
            WeightOp::Forward(i) => self.mf[i - 1],
            WeightOp::Backward(i) => self.mb[i - 1],
        };
        match accounting {
            Accounting::Consistent => own,
            Accounting::Literal => own + self.weight(op.layer()),
        }
    }
}

/// The paper's setting (§7) for a chain of blocks: each block's forward keeps only its
/// input (block checkpointing, so its backward first recomputes what it saved, "about 1–2
/// GB of intermediate activations per layer recomputed"), the weight update is fused into
/// the backward (its gradient `δw_i`, `|w_i|` bytes, is the backward's temporary), and
/// the weights are all the static memory (plain SGD: no optimizer state, no resident
/// gradient, but for a tied parameter's, which stays resident with it).
pub fn paper_setting(chain: &Chain) -> Result<Chain, SolveError> {
    let Some(w) = chain.w.clone() else {
        let why = "weight offloading needs the chain's weights `w`".into();
        return Err(SolveError::Unsupported { solver: "weight-offload", why });
    };
    let mut c = chain.clone();
    for (s, &ws) in w.iter().enumerate() {
        let saved = chain.xbar[s + 1].saturating_sub(chain.x[s + 1]);
        c.xbar[s + 1] = chain.x[s + 1];
        c.btime[s] = chain.btime[s] + chain.ftime[s];
        c.btmp[s] = chain.fused_btmp(s).max(chain.ftmp[s]) + saved + ws;
    }
    // The weights, and what the chain leaves unnamed (a tied embedding and its gradient,
    // which the two stages that read it accumulate).
    let named = |v: &Option<Vec<u64>>| v.as_ref().map_or(0, |v| v.iter().sum::<u64>());
    let unnamed = chain.static_bytes.saturating_sub(named(&chain.w) + named(&chain.g) + named(&chain.o));
    c.static_bytes = w.iter().sum::<u64>() + unnamed;
    // No resident gradient, no state: nothing else to name.
    (c.g, c.o) = (None, None);
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The digest's instance T1 (A.6).
    pub(crate) fn t1() -> WeightChain {
        WeightChain::new(vec![2, 3, 1, 2], vec![1; 5], vec![1.0; 4], vec![2.0; 4]).unwrap()
    }

    #[test]
    fn eq1_and_the_two_accountings_on_t1() {
        let c = t1();
        assert_eq!(c.compute_time(), 12.0);
        // F_3: |w_3| + a^0..a^3 = 1 + 4; B_2: 2·3 + 3.
        assert_eq!(c.eq1(WeightOp::Forward(3)), 5);
        assert_eq!(c.eq1(WeightOp::Backward(2)), 9);
        assert_eq!(c.op_memory(WeightOp::Backward(2), Accounting::Consistent), 6);
        assert_eq!(c.op_memory(WeightOp::Backward(2), Accounting::Literal), 9);
        let names: Vec<String> = c.ops().iter().map(|o| format!("{o:?}")).collect();
        assert_eq!(names.first().map(String::as_str), Some("Forward(1)"));
        assert_eq!(names.last().map(String::as_str), Some("Backward(1)"));
    }

    /// T1 at M = 11: B_4 has the most excess, 4 (digest A.6); at β = 0.25 that is 16 per
    /// link, above Σu = 12 (the MILP gives 26 there).
    #[test]
    fn the_transfer_bound_on_t1() {
        let c = t1();
        assert_eq!(c.transfer_bound(11, 0.25, 0.25), 16.0);
        assert_eq!(c.transfer_bound(11, 1.0, 1.0), 12.0);
        assert_eq!(c.transfer_bound(100, 0.01, 0.01), 12.0);
    }

    #[test]
    fn bad_instances_are_refused_naming_what_is_wrong() {
        let e = WeightChain::new(vec![1, 2], vec![1, 1], vec![1.0; 2], vec![1.0; 2]).unwrap_err();
        assert!(e.to_string().contains("3 activations"), "{e}");
        let e = WeightChain::new(vec![1], vec![1, 1], vec![f64::NAN], vec![1.0]).unwrap_err();
        assert!(e.to_string().contains("finite"), "{e}");
        let no_w = Chain::homogeneous(3, 1.0, 1.0, 1);
        assert!(WeightChain::from_chain(&no_w).unwrap_err().to_string().contains("`w`"));
    }

    #[test]
    fn a_chain_with_weights_maps_layer_i_to_stage_i_minus_one() {
        let mut chain = Chain::homogeneous(3, 1.0, 2.0, 4);
        chain.w = Some(vec![5, 6, 7]);
        chain.xbar = vec![4, 8, 9, 10];
        let c = WeightChain::from_chain(&chain).unwrap();
        assert_eq!(c.op_index(WeightOp::Backward(3)), 3);
        assert_eq!(c.op_index(WeightOp::Backward(1)), 5);
        assert_eq!(c.w, vec![5, 6, 7]);
        assert_eq!(c.a, vec![4, 8, 9, 10]);
        assert_eq!(c.ub, vec![2.0, 2.0, 4.0], "the loss folded into B_L");
        assert_eq!(c.compute_time(), chain.ftime.iter().chain(&chain.btime).sum::<f64>());
    }
}
