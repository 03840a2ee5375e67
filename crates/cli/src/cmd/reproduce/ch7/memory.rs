//! Why a Ch. 7 case fits no solver: the least memory per device any allocation of the
//! chain needs with one micro-batch in flight per stage (`g = 1`, the chain run
//! sequentially: every pipelined schedule holds at least that), under pebble's
//! accounting and under the thesis's (§6.3, §7.1), term by term.
//!
//! pebble's (the MadPipe DP's `memory` and the simulator's `peak_memory`): a device
//! holding stage `i..=j` holds its static bytes (two weight versions and the gradient,
//! the thesis's `C·W` with `C = 3` under SGD), `g` times what the stage's forwards keep
//! until their backwards (`stored`: each layer's input *and everything its forward saves
//! for its backward*, rotor's `x̄`), the largest temporary of a pass, and a buffer of
//! `a` and of `δ` at each end that crosses devices. The thesis's `𝓜(i, j, g) = Σ_ℓ (C·W_ℓ
//! + g·a_{ℓ−1}) + a_{i−1} + a_j + δ_{i−1} + δ_j`: the same weights and buffers, but a
//! layer keeps only its input `a_{ℓ−1}`, and no temporary is counted.
//!
//! Shared by `pebble reproduce ch7` (the `cases` and `thesis_accounting` of `ch7.json`)
//! and the example `cargo run --release -p pebble-cli --example ch7_memory`.

use pebble_graph::Layers;
use pebble_solve::pipeline::{onef1b, PipeProblem};

/// Whose memory model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accounting {
    /// pebble's: `stored` (input and saved set) per micro-batch, and the temporaries.
    Pebble,
    /// The thesis's `𝓜(i, j, g)`: the input `a_{ℓ−1}` per layer and micro-batch, no
    /// temporaries.
    Thesis,
}

impl Accounting {
    /// Its name in the report.
    pub fn name(self) -> &'static str {
        match self {
            Accounting::Pebble => "pebble",
            Accounting::Thesis => "thesis",
        }
    }
}

/// One device's memory holding one stage, by term.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Terms {
    /// The static bytes, `C·W` (two weight versions and the gradient).
    pub weights: u64,
    /// What `g` micro-batches keep between forward and backward.
    pub activations: u64,
    /// The largest temporary of a pass (0 in the thesis's accounting).
    pub temporary: u64,
    /// `a` and `δ` at each end of the stage that is not an end of the chain.
    pub buffers: u64,
}

impl Terms {
    /// The sum of the terms.
    pub fn total(&self) -> u64 {
        self.weights + self.activations + self.temporary + self.buffers
    }
}

/// `a_{ℓ−1}`, the input of layer `ℓ` (0-based: `a_0` is the chain's input).
pub fn layer_input(l: &Layers, layer: usize) -> u64 {
    if layer == 0 {
        l.input
    } else {
        l.boundary[layer - 1]
    }
}

/// What layer `ℓ` keeps per micro-batch: pebble's `stored[ℓ]`, or the thesis's
/// `a_{ℓ−1}` (for the last layer with the loss's input `a_L`, which both count).
pub fn kept(l: &Layers, layer: usize, acc: Accounting) -> u64 {
    match acc {
        Accounting::Pebble => l.stored[layer],
        Accounting::Thesis => layer_input(l, layer) + if layer + 1 == l.len() { l.boundary[layer] } else { 0 },
    }
}

/// The memory of a device holding stage `i..=j` with `g` micro-batches in flight.
pub fn stage_terms(l: &Layers, i: usize, j: usize, g: u64, acc: Accounting) -> Terms {
    let n = l.len();
    let mut buffers = 0;
    if i > 0 {
        buffers += 2 * l.boundary[i - 1];
    }
    if j + 1 < n {
        buffers += 2 * l.boundary[j];
    }
    let temporary = match acc {
        Accounting::Pebble => (i..=j).map(|x| l.ftmp[x].max(l.btmp[x])).max().unwrap_or(0),
        Accounting::Thesis => 0,
    };
    Terms {
        weights: l.static_bytes(i, j, 2),
        activations: g * (i..=j).map(|x| kept(l, x, acc)).sum::<u64>(),
        temporary,
        buffers,
    }
}

/// The least, over contiguous allocations of the chain into at most `devices` stages, of
/// the largest device memory with `g = 1`: its value and the stages `(first, last)`.
/// (A non-contiguous allocation needs at least [`lower_bound`].)
pub fn floor(l: &Layers, devices: usize, acc: Accounting) -> (u64, Vec<(usize, usize)>) {
    let n = l.len();
    let p_max = devices.clamp(1, n);
    // best[p][j]: layers 0..=j on at most p+1 stages; from[p][j]: the last stage's first.
    let mut best = vec![vec![u64::MAX; n]; p_max];
    let mut from = vec![vec![0usize; n]; p_max];
    for j in 0..n {
        best[0][j] = stage_terms(l, 0, j, 1, acc).total();
        for p in 1..p_max {
            best[p][j] = best[p - 1][j];
            from[p][j] = from[p - 1][j];
            for i in 1..=j {
                let v = best[p - 1][i - 1].max(stage_terms(l, i, j, 1, acc).total());
                if v < best[p][j] {
                    best[p][j] = v;
                    from[p][j] = i;
                }
            }
        }
    }
    let mut stages = Vec::new();
    let (mut p, mut j) = (p_max - 1, n - 1);
    loop {
        // `from[p][j] = 0`: one stage (`from[0][·]` is 0); a prefix that fewer stages
        // serve as well is no worse on more.
        let i = from[p][j];
        stages.push((i, j));
        if i == 0 {
            break;
        }
        j = i - 1;
        p -= 1;
    }
    stages.reverse();
    (best[p_max - 1][n - 1], stages)
}

/// A bound no allocation, contiguous or not, on any number of devices, goes under with
/// `g = 1`: the device that holds layer `ℓ` holds a whole stage around it, so at least
/// `max_ℓ min_{i ≤ ℓ ≤ j} 𝓜(i, j, 1)`. Its value, the layer and that stage.
pub fn lower_bound(l: &Layers, acc: Accounting) -> (u64, usize, (usize, usize)) {
    let n = l.len();
    let mut out = (0, 0, (0, 0));
    for layer in 0..n {
        let mut least = (u64::MAX, (layer, layer));
        for i in 0..=layer {
            for j in layer..n {
                let m = stage_terms(l, i, j, 1, acc).total();
                if m < least.0 {
                    least = (m, (i, j));
                }
            }
        }
        if least.0 > out.0 {
            out = (least.0, layer, least.1);
        }
    }
    out
}

/// The floor of each accounting on `devices`, as JSON: the bytes, the stages, and the
/// terms of the stage that sets it.
pub fn floor_json(l: &Layers, devices: usize) -> serde_json::Value {
    let mut out = serde_json::Map::new();
    for acc in [Accounting::Pebble, Accounting::Thesis] {
        let (bytes, stages) = floor(l, devices, acc);
        let (i, j) =
            stages.iter().copied().max_by_key(|&(i, j)| stage_terms(l, i, j, 1, acc).total()).unwrap_or((0, 0));
        let t = stage_terms(l, i, j, 1, acc);
        out.insert(
            acc.name().into(),
            serde_json::json!({
                "bytes": bytes,
                "stages": stages.iter().map(|&(i, j)| [i, j]).collect::<Vec<_>>(),
                "largest_stage": [i, j],
                "weights": t.weights, "activations": t.activations, "temporary": t.temporary, "buffers": t.buffers,
            }),
        );
    }
    serde_json::Value::Object(out)
}

/// The layers as the thesis's `𝓜(i, j, g)` counts them: each keeps its input `a_{ℓ−1}`
/// per micro-batch ([`kept`]), no pass has a temporary; times, weights and boundaries
/// unchanged. Any solver and the simulator then charge a stage `𝓜(i, j, g)` (the
/// simulator's static bytes are the thesis's `C·W`, its buffers `a_{i−1} + δ_{i−1} + a_j
/// + δ_j`).
pub fn thesis_layers(l: &Layers) -> Layers {
    let mut t = l.clone();
    t.stored = (0..l.len()).map(|x| kept(l, x, Accounting::Thesis)).collect();
    t.ftmp = vec![0; l.len()];
    t.btmp = vec![0; l.len()];
    t
}

/// The period of the least-memory contiguous allocation ([`floor`] under pebble's
/// accounting) scheduled by 1F1B\* at the smallest period that fits, as simulated; `None`
/// if none fits. Where it is `Some`, the problem has a pipeline, however slow.
pub fn floor_period(problem: &PipeProblem<'_>) -> Option<f64> {
    let (_, stages) = floor(problem.layers, problem.devices, Accounting::Pebble);
    let bounds: Vec<usize> = stages.iter().map(|s| s.1).collect();
    onef1b::best_schedule(problem, &bounds).map(|(_, period)| period)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Three layers: inputs a_0 = 10, a_1 = 20, a_2 = 30, loss input a_3 = 1; pebble's
    /// `stored` adds a saved set of 100 to layer 1; weights 1, 2, 3 (static 2W + 0).
    fn three() -> Layers {
        let mut l = Layers::new(vec![1.0; 3], vec![1.0; 3], vec![10, 120, 31], vec![20, 30, 1], vec![1, 2, 3]);
        l.input = 10;
        l.btmp = vec![0, 7, 0];
        l
    }

    #[test]
    fn one_stage_per_layer_terms() {
        let l = three();
        // Layer 1 alone: static 2·2 = 4; pebble keeps 120, the thesis its input a_1 = 20 per
        // micro-batch (40 for g = 2); temporary 7 (pebble only); buffers 2·a_1 + 2·a_2 = 100.
        let p = stage_terms(&l, 1, 1, 1, Accounting::Pebble);
        assert_eq!(p, Terms { weights: 4, activations: 120, temporary: 7, buffers: 100 });
        let t = stage_terms(&l, 1, 1, 2, Accounting::Thesis);
        assert_eq!(t, Terms { weights: 4, activations: 40, temporary: 0, buffers: 100 });
        // The last layer keeps a_2 + a_3 = 31 in the thesis's accounting too.
        assert_eq!(stage_terms(&l, 2, 2, 1, Accounting::Thesis).activations, 31);
    }

    #[test]
    fn floor_and_bound() {
        let l = three();
        // Thesis, one device: 2·6 + (10 + 20 + 31) = 73, no buffers. On two devices:
        // {0} | {1,2}: max(2 + 10 + 40, 10 + 51 + 40) = 101; {0,1} | {2}: max(6 + 30 + 60,
        // 6 + 31 + 60) = 97. Splitting costs buffers: one device is the floor.
        assert_eq!(floor(&l, 1, Accounting::Thesis), (73, vec![(0, 2)]));
        assert_eq!(floor(&l, 2, Accounting::Thesis), (73, vec![(0, 2)]));
        // pebble, one device: 12 + 161 + 7 = 180; {0,1} | {2}: max(6 + 130 + 7 + 60,
        // 6 + 31 + 60) = 203; {0} | {1,2}: max(2 + 10 + 40, 10 + 151 + 7 + 40) = 208; so
        // 180. The bound: layer 1's stages cost {1} 4 + 120 + 7 + 100 = 231, {0,1} 203,
        // {1,2} 208, {0,1,2} 180 (layer 0's least is {0}, 52; layer 2's {2}, 97).
        assert_eq!(floor(&l, 2, Accounting::Pebble), (180, vec![(0, 2)]));
        assert_eq!(lower_bound(&l, Accounting::Pebble), (180, 1, (0, 2)));
    }

    #[test]
    fn the_thesis_view_charges_the_thesis_memory() {
        let t = thesis_layers(&three());
        // Each layer keeps its input (the last also a_3 = 1): 10, 20, 30 + 1.
        assert_eq!(t.stored, vec![10, 20, 31]);
        assert_eq!(t.btmp, vec![0, 0, 0]);
        // pebble's accounting of the thesis view is the thesis's accounting.
        assert_eq!(stage_terms(&t, 1, 1, 2, Accounting::Pebble), stage_terms(&three(), 1, 1, 2, Accounting::Thesis));
    }
}
