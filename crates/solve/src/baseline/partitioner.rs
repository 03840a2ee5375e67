//! What PyTorch's compile partitioner's two steps share, `knapsack` (the knapsack alone)
//! and `pytorch-mincut` (the knapsack, then the min cut): the forward-made tensors the
//! backward reads, with their producers and the compute-intensive ops ([`Network`]), and
//! the 0/1 knapsack of its activation-memory budget ([`knapsack`]).

use pebble_graph::{ComputeKind, DataKind, TrainingGraph};

/// Memory units of the knapsack's dynamic program.
pub const SLOTS: usize = 1000;

/// Whether the partitioner never recomputes an op of this type (`is_compute_intensive`:
/// matrix products, convolutions, attention), by the graph's op names and ONNX's.
pub fn compute_intensive(op: Option<&str>) -> bool {
    let Some(op) = op else { return false };
    let op = op.to_ascii_lowercase();
    ["linear", "matmul", "gemm", "conv", "attention", "bmm"].iter().any(|k| op.contains(k))
}

/// What the cut is made on: each forward-made tensor's producer, which forward ops are
/// compute-intensive, and which forward-made tensors the backward reads.
pub(crate) struct Network {
    /// The forward op that makes each activation or saved tensor.
    pub(crate) producer: Vec<Option<usize>>,
    /// The compute-intensive forward ops: the knapsack's items in `pytorch-mincut`.
    pub(crate) intensive: Vec<bool>,
    /// Forward-made tensors a backward node reads (the loss runs right after the
    /// forward: what it reads alone is not the backward's).
    pub(crate) needed: Vec<bool>,
}

impl Network {
    pub(crate) fn new(g: &TrainingGraph) -> Network {
        let mut producer = vec![None; g.data.len()];
        let mut needed = vec![false; g.data.len()];
        for (c, node) in g.compute.iter().enumerate() {
            match node.kind {
                ComputeKind::Forward => {
                    for &d in &node.outputs {
                        if matches!(g.data[d].kind, DataKind::Activation | DataKind::Saved) {
                            producer[d] = Some(c);
                        }
                    }
                }
                ComputeKind::Backward => {
                    for &d in &node.inputs {
                        needed[d] = true;
                    }
                }
                ComputeKind::Loss => {}
            }
        }
        for d in 0..g.data.len() {
            needed[d] &= producer[d].is_some();
        }
        let intensive =
            g.compute.iter().map(|c| c.kind == ComputeKind::Forward && compute_intensive(c.op.as_deref())).collect();
        Network { producer, intensive, needed }
    }
}

/// The 0/1 knapsack of the partitioner's `dp_knapsack`: the items of greatest total
/// value whose sizes, rounded up to `capacity / SLOTS` units, fit `capacity`.
pub(crate) fn knapsack(sizes: &[u64], values: &[f64], capacity: u64) -> Vec<bool> {
    let total: u64 = sizes.iter().sum();
    if capacity >= total {
        return vec![true; sizes.len()];
    }
    if capacity == 0 {
        return vec![false; sizes.len()];
    }
    let unit = capacity.div_ceil(SLOTS as u64).max(1);
    let cap = (capacity / unit) as usize;
    let weights: Vec<usize> = sizes.iter().map(|&s| s.div_ceil(unit) as usize).collect();
    // best[i][w]: the most value with items 0..i in w units.
    let n = sizes.len();
    let mut best = vec![vec![0.0f64; cap + 1]; n + 1];
    for i in 0..n {
        let (w, v) = (weights[i], values[i]);
        for c in 0..=cap {
            let skip = best[i][c];
            let take = if w <= c { best[i][c - w] + v } else { f64::NEG_INFINITY };
            best[i + 1][c] = skip.max(take);
        }
    }
    let mut keep = vec![false; n];
    let mut c = cap;
    for i in (0..n).rev() {
        if best[i + 1][c] != best[i][c] {
            keep[i] = true;
            c -= weights[i];
        }
    }
    keep
}
