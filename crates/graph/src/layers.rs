//! The chain as pipelined model parallelism sees it (Shilova, Part III §1.1–1.2): `L`
//! layers, each a forward and a backward that run on the same device, with the loss
//! folded into the last layer.
//!
//! Part III treats a layer as elementary: its forward keeps what its backward needs
//! until that backward, and the tensor crossing the boundary after layer `ℓ` (the
//! activation `a_ℓ` forward, the gradient `δ_ℓ` backward, of equal size) is what moves
//! when two neighbours sit on different devices. [`Layers::from_chain`] reads rotor's
//! chain that way; the thesis's own small instances are built with [`Layers::new`].

use crate::Chain;

/// A chain of layers for pipelining.
#[derive(Debug, Clone, PartialEq)]
pub struct Layers {
    /// Forward time of each layer, `u_F`.
    pub uf: Vec<f64>,
    /// Backward time of each layer, `u_B` (the loss's forward and backward included in
    /// the last).
    pub ub: Vec<f64>,
    /// The part of `ub` that computes the weight gradient: Zero Bubble's `W`, the rest
    /// being `B` (the input gradient). Only schedules that split the backward read it.
    pub uw: Vec<f64>,
    /// What each layer's forward keeps until its backward: its input and everything it
    /// saves except its own output (which the next layer keeps as its input). For the
    /// last layer, the loss's input too.
    pub stored: Vec<u64>,
    /// The size of the tensor crossing the boundary after each layer, `a_ℓ` (and `δ_ℓ`);
    /// the last entry is the loss's input, which never crosses.
    pub boundary: Vec<u64>,
    /// The chain's input `a_0`.
    pub input: u64,
    /// Each layer's parameters.
    pub weights: Vec<u64>,
    /// Each layer's parameter gradients.
    pub grads: Vec<u64>,
    /// Each layer's optimizer states.
    pub states: Vec<u64>,
    /// Static bytes no single layer owns (parameters several layers share, like a tied
    /// embedding); they live with the first layer.
    pub shared: u64,
    /// Temporary memory of each layer's forward.
    pub ftmp: Vec<u64>,
    /// Temporary memory of each layer's backward: its own, and the gradients it holds
    /// while it runs (that of its output, which it reads, and that of its input, which it
    /// makes; those crossing devices are buffers of their own as well).
    pub btmp: Vec<u64>,
}

impl Layers {
    /// Layers with the given times, stored activations and weights; `boundary[ℓ]` is the
    /// tensor after layer `ℓ`. No gradients, states or temporaries: the memory model of
    /// Part III's instances, where the thesis's `C·W_ℓ` is written as `weights`.
    pub fn new(uf: Vec<f64>, ub: Vec<f64>, stored: Vec<u64>, boundary: Vec<u64>, weights: Vec<u64>) -> Layers {
        let l = uf.len();
        Layers {
            uw: vec![0.0; l],
            ub,
            uf,
            stored,
            boundary,
            input: 0,
            grads: vec![0; l],
            states: vec![0; l],
            weights,
            shared: 0,
            ftmp: vec![0; l],
            btmp: vec![0; l],
        }
    }

    /// Layers whose forward and backward together cost `costs[ℓ]`, split evenly, with no
    /// memory at all: the load-balancing instances of Thms 13 and 17.
    pub fn from_costs(costs: &[f64]) -> Layers {
        let l = costs.len();
        let half: Vec<f64> = costs.iter().map(|c| c / 2.0).collect();
        Layers::new(half.clone(), half, vec![0; l], vec![0; l], vec![0; l])
    }

    /// Rotor's chain seen as layers. Stage `i` keeps its input `a_i` and what `F_all`
    /// saves, less its output (`x[i] + xbar[i+1] − x[i+1]`); the loss's input `x[L]` and
    /// its backward `btime[L]` go to the last layer. The weight gradient takes half of a
    /// backward that has trainable weights (a matrix product's two gradients cost the
    /// same), none of one without. A backward's temporaries count the gradients of its
    /// output and of its input beside its own (`btmp[i] + x[i+1] + x[i]`, no `δ_0`).
    pub fn from_chain(chain: &Chain) -> Layers {
        let l = chain.len();
        let zeros = vec![0; l];
        let weights = chain.w.clone().unwrap_or_else(|| zeros.clone());
        let grads = chain.g.clone().unwrap_or_else(|| zeros.clone());
        let states = chain.o.clone().unwrap_or_else(|| zeros.clone());
        let named: u64 = weights.iter().chain(&grads).chain(&states).sum();
        let mut ub: Vec<f64> = chain.btime[..l].to_vec();
        ub[l - 1] += chain.btime[l];
        let uw = (0..l)
            .map(|i| if grads[i] > 0 || (chain.g.is_none() && weights[i] > 0) { chain.btime[i] / 2.0 } else { 0.0 })
            .collect();
        let mut stored: Vec<u64> =
            (0..l).map(|i| chain.x[i] + chain.xbar[i + 1].saturating_sub(chain.x[i + 1])).collect();
        stored[l - 1] += chain.x[l];
        let mut btmp: Vec<u64> =
            (0..l).map(|i| chain.btmp[i] + chain.x[i + 1] + if i == 0 { 0 } else { chain.x[i] }).collect();
        btmp[l - 1] = btmp[l - 1].max(chain.btmp[l] + chain.x[l] + if l > 1 { chain.x[l - 1] } else { 0 });
        Layers {
            uf: chain.ftime.clone(),
            ub,
            uw,
            stored,
            boundary: chain.x[1..].to_vec(),
            input: chain.x[0],
            weights,
            grads,
            states,
            shared: chain.static_bytes.saturating_sub(named),
            ftmp: chain.ftmp.clone(),
            btmp,
        }
    }

    /// The same layers with these weights (the thesis's `C·W_ℓ`).
    pub fn with_weights(mut self, weights: Vec<u64>) -> Layers {
        self.weights = weights;
        self
    }

    /// The number of layers.
    pub fn len(&self) -> usize {
        self.uf.len()
    }

    /// Whether there are no layers.
    pub fn is_empty(&self) -> bool {
        self.uf.is_empty()
    }

    /// `U(i, j)`: the forward and backward time of layers `i..=j`.
    pub fn load(&self, i: usize, j: usize) -> f64 {
        (i..=j).map(|l| self.uf[l] + self.ub[l]).sum()
    }

    /// `U(0, i−1)` for each `i` in `0..=L`: the loads' prefix sums, for the DPs that ask
    /// for `U(i, j) = prefix[j+1] − prefix[i]` many times.
    pub fn load_prefix(&self) -> Vec<f64> {
        let mut prefix = Vec::with_capacity(self.len() + 1);
        prefix.push(0.0);
        for l in 0..self.len() {
            prefix.push(prefix[l] + self.uf[l] + self.ub[l]);
        }
        prefix
    }

    /// `U(1, L)`: the time of one mini-batch on one device.
    pub fn total_load(&self) -> f64 {
        self.load(0, self.len() - 1)
    }

    /// The static bytes of layers `i..=j` with `versions` copies of the weights (2 for
    /// PipeDream-2BW's weight stashing, 1 with a flush), counting the shared bytes when
    /// the range holds layer 0. With no gradients or states, this is the thesis's `C·W`
    /// for `C = versions`.
    pub fn static_bytes(&self, i: usize, j: usize, versions: u64) -> u64 {
        let own: u64 = (i..=j).map(|l| versions * self.weights[l] + self.grads[l] + self.states[l]).sum();
        own + if i == 0 { self.shared } else { 0 }
    }

    /// What layers `i..=j` keep for one micro-batch between forward and backward.
    pub fn stored_bytes(&self, i: usize, j: usize) -> u64 {
        self.stored[i..=j].iter().sum()
    }

    /// Checks lengths and values, naming the field at fault.
    pub fn validate(&self) -> Result<(), String> {
        let l = self.uf.len();
        if l == 0 {
            return Err("field `uf`: at least one layer".into());
        }
        let lens = [
            ("ub", self.ub.len()),
            ("uw", self.uw.len()),
            ("stored", self.stored.len()),
            ("boundary", self.boundary.len()),
            ("weights", self.weights.len()),
            ("grads", self.grads.len()),
            ("states", self.states.len()),
            ("ftmp", self.ftmp.len()),
            ("btmp", self.btmp.len()),
        ];
        if let Some((f, n)) = lens.iter().find(|(_, n)| *n != l) {
            return Err(format!("field `{f}`: {n} entries, expected {l} (one per layer)"));
        }
        for (f, v) in [("uf", &self.uf), ("ub", &self.ub), ("uw", &self.uw)] {
            if let Some(i) = v.iter().position(|t| !t.is_finite() || *t < 0.0) {
                return Err(format!("field `{f}[{i}]`: a time must be a non-negative finite number, got {}", v[i]));
            }
        }
        if let Some(i) = (0..l).find(|&i| self.uw[i] > self.ub[i]) {
            return Err(format!("field `uw[{i}]`: the weight gradient's time exceeds the backward's"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chain_seen_as_layers_keeps_inputs_and_folds_the_loss() {
        let mut c = Chain::homogeneous(3, 1.0, 2.0, 10);
        c.xbar = vec![10, 25, 30, 10];
        c.w = Some(vec![4, 0, 6]);
        c.static_bytes = 15;
        let l = Layers::from_chain(&c);
        // x[i] + xbar[i+1] − x[i+1]; the last also keeps the loss's input x[3].
        assert_eq!(l.stored, vec![10 + 15, 10 + 20, 10 + 10]);
        assert_eq!(l.ub, vec![2.0, 2.0, 4.0]);
        assert_eq!(l.uw, vec![1.0, 0.0, 1.0]);
        assert_eq!(l.boundary, vec![10, 10, 10]);
        assert_eq!(l.btmp, vec![10, 20, 20]);
        assert_eq!(l.shared, 5);
        assert_eq!(l.load(0, 2), 11.0);
        assert_eq!(l.static_bytes(0, 0, 2), 8 + 5);
        assert_eq!(l.static_bytes(1, 2, 2), 12);
        assert!(l.validate().is_ok());
    }
}
