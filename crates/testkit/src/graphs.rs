//! Hand-made, random and zoo training graphs, and a builder for more.

use pebble_graph::{ComputeId, ComputeKind, ComputeNode, DataId, DataKind, DataNode, TrainingGraph};
use pebble_zoo::{Model, ModelOptions};

use crate::Rng;

/// A data node.
pub fn data(name: &str, kind: DataKind, size: u64) -> DataNode {
    DataNode { name: name.into(), kind, size }
}

/// A compute node with no op, no stage and no forward node; set `forward` with struct
/// update syntax for a backward node (`ComputeNode { forward: Some(f), ..node(…) }`).
pub fn node(
    name: &str,
    kind: ComputeKind,
    time: f64,
    tmp: u64,
    inputs: impl Into<Vec<DataId>>,
    outputs: impl Into<Vec<DataId>>,
) -> ComputeNode {
    ComputeNode {
        name: name.into(),
        kind,
        time,
        tmp,
        inputs: inputs.into(),
        outputs: outputs.into(),
        op: None,
        forward: None,
        stage: None,
    }
}

/// Builds a training graph node by node; each call returns the new node's id.
#[derive(Debug, Clone)]
pub struct GraphBuilder {
    graph: TrainingGraph,
}

impl GraphBuilder {
    /// An empty graph called `name`.
    pub fn new(name: &str) -> GraphBuilder {
        GraphBuilder {
            graph: TrainingGraph {
                name: Some(name.into()),
                data: Vec::new(),
                compute: Vec::new(),
                param_grads_from_backward: false,
            },
        }
    }

    /// Adds a data node.
    pub fn data(&mut self, name: impl Into<String>, kind: DataKind, size: u64) -> DataId {
        self.graph.data.push(DataNode { name: name.into(), kind, size });
        self.graph.data.len() - 1
    }

    /// Adds a compute node as it is.
    pub fn push(&mut self, node: ComputeNode) -> ComputeId {
        self.graph.compute.push(node);
        self.graph.compute.len() - 1
    }

    /// Adds a forward node.
    pub fn forward(
        &mut self,
        name: impl Into<String>,
        time: f64,
        tmp: u64,
        inputs: impl Into<Vec<DataId>>,
        outputs: impl Into<Vec<DataId>>,
    ) -> ComputeId {
        self.push(ComputeNode { name: name.into(), ..node("", ComputeKind::Forward, time, tmp, inputs, outputs) })
    }

    /// Adds the loss node.
    pub fn loss(
        &mut self,
        name: impl Into<String>,
        time: f64,
        tmp: u64,
        inputs: impl Into<Vec<DataId>>,
        outputs: impl Into<Vec<DataId>>,
    ) -> ComputeId {
        self.push(ComputeNode { name: name.into(), ..node("", ComputeKind::Loss, time, tmp, inputs, outputs) })
    }

    /// Adds the backward node of forward node `forward`.
    pub fn backward(
        &mut self,
        name: impl Into<String>,
        forward: ComputeId,
        time: f64,
        tmp: u64,
        inputs: impl Into<Vec<DataId>>,
        outputs: impl Into<Vec<DataId>>,
    ) -> ComputeId {
        let n = node("", ComputeKind::Backward, time, tmp, inputs, outputs);
        self.push(ComputeNode { name: name.into(), forward: Some(forward), ..n })
    }

    /// The graph so far (for ids and sizes while building).
    pub fn graph(&self) -> &TrainingGraph {
        &self.graph
    }

    /// The graph, validated (panics with the reason if it is not valid).
    pub fn build(self) -> TrainingGraph {
        if let Err(e) = self.graph.validate() {
            panic!("the test graph {:?} is invalid: {e}", self.graph.name);
        }
        self.graph
    }
}

/// A two-layer network as a training graph.
///
/// Data: 0 `x` input 10, 1 `w` parameter 4, 2 `gw` its gradient 4, 3 `a1` activation
/// 20, 4 `s1` saved 6, 5 `a2` activation 8, 6 `da2` gradient 8, 7 `da1` gradient 20,
/// 8 `dx` gradient 10. Compute: 0 `f1` (x, w → a1, s1; tmp 3), 1 `f2` (a1, w → a2;
/// tmp 2), 2 `loss` (a2 → da2; tmp 1), 3 `f2.bwd` (da2, a1, w → da1, gw; tmp 5),
/// 4 `f1.bwd` (da1, s1, x, w → dx, gw; tmp 0). Store-all peaks at 77 and takes 10.5.
pub fn tiny_graph() -> TrainingGraph {
    let mut b = GraphBuilder::new("tiny");
    let x = b.data("x", DataKind::Input, 10);
    let w = b.data("w", DataKind::Parameter, 4);
    let gw = b.data("gw", DataKind::ParamGrad, 4);
    let a1 = b.data("a1", DataKind::Activation, 20);
    let s1 = b.data("s1", DataKind::Saved, 6);
    let a2 = b.data("a2", DataKind::Activation, 8);
    let da2 = b.data("da2", DataKind::Gradient, 8);
    let da1 = b.data("da1", DataKind::Gradient, 20);
    let dx = b.data("dx", DataKind::Gradient, 10);
    let f1 = b.forward("f1", 1.0, 3, [x, w], [a1, s1]);
    let f2 = b.forward("f2", 2.0, 2, [a1, w], [a2]);
    b.loss("loss", 0.5, 1, [a2], [da2]);
    b.backward("f2.bwd", f2, 4.0, 5, [da2, a1, w], [da1, gw]);
    b.backward("f1.bwd", f1, 3.0, 0, [da1, s1, x, w], [dx, gw]);
    b.build()
}

/// A chain of `l` layers: `f_i(a_{i−1}, w_i) → a_i, s_i`, the loss `(a_l) → g_l`,
/// `b_i(g_i, a_{i−1}, s_i, w_i) → g_{i−1}, gw_i`; `a_0` is the input and `g_0` (its
/// gradient, read by nobody) is produced only if `input_grad`. Sizes and times vary by
/// layer so that the choices matter. (Backward nodes name no forward node.)
pub fn chain_graph(l: usize, input_grad: bool) -> TrainingGraph {
    let mut d = Vec::new();
    let mut c = Vec::new();
    let push = |v: &mut Vec<DataNode>, n: DataNode| {
        v.push(n);
        v.len() - 1
    };
    let x = push(&mut d, data("x", DataKind::Input, 3));
    let mut a = vec![x];
    let mut s = vec![usize::MAX];
    let mut w = vec![usize::MAX];
    let mut gw = vec![usize::MAX];
    for i in 1..=l {
        let u = i as u64;
        w.push(push(&mut d, data(&format!("w{i}"), DataKind::Parameter, 2)));
        gw.push(push(&mut d, data(&format!("gw{i}"), DataKind::ParamGrad, 2)));
        a.push(push(&mut d, data(&format!("a{i}"), DataKind::Activation, 4 + 3 * (u % 3))));
        s.push(push(&mut d, data(&format!("s{i}"), DataKind::Saved, 1 + 2 * (u % 2))));
    }
    let mut g = vec![usize::MAX; l + 1];
    for i in (0..=l).rev() {
        if i > 0 || input_grad {
            let size = d[a[i]].size;
            g[i] = push(&mut d, data(&format!("g{i}"), DataKind::Gradient, size));
        }
    }
    for i in 1..=l {
        let t = 1.0 + (i % 3) as f64;
        c.push(node(&format!("f{i}"), ComputeKind::Forward, t, (i % 2) as u64, [a[i - 1], w[i]], [a[i], s[i]]));
    }
    c.push(node("loss", ComputeKind::Loss, 1.0, 1, [a[l]], [g[l]]));
    for i in (1..=l).rev() {
        let mut outputs = vec![gw[i]];
        if g[i - 1] != usize::MAX {
            outputs.insert(0, g[i - 1]);
        }
        let t = 2.0 + (i % 2) as f64;
        c.push(node(&format!("b{i}"), ComputeKind::Backward, t, 1, [g[i], a[i - 1], s[i], w[i]], outputs));
    }
    let graph =
        TrainingGraph { name: Some(format!("chain-{l}")), compute: c, data: d, param_grads_from_backward: false };
    graph.validate().expect("a valid chain graph");
    graph
}

/// A residual block: `f1(x) → a1`, `f2(a1) → a2, s2`, `add(a1, a2) → a3`, the loss, and
/// backwards where `a1`'s gradient has two producers (`add.bwd`, then `f2.bwd`).
/// (Backward nodes name no forward node.)
pub fn residual_graph() -> TrainingGraph {
    use ComputeKind::*;
    use DataKind::*;
    let d = vec![
        data("x", Input, 4),       // 0
        data("w1", Parameter, 3),  // 1
        data("gw1", ParamGrad, 3), // 2
        data("w2", Parameter, 3),  // 3
        data("gw2", ParamGrad, 3), // 4
        data("a1", Activation, 6), // 5
        data("a2", Activation, 5), // 6
        data("s2", Saved, 2),      // 7
        data("a3", Activation, 6), // 8
        data("label", Input, 1),   // 9
        data("g3", Gradient, 6),   // 10
        data("g1", Gradient, 6),   // 11
        data("g2", Gradient, 5),   // 12
    ];
    let c = vec![
        node("f1", Forward, 3.0, 1, [0, 1], [5]),
        node("f2", Forward, 2.0, 2, [5, 3], [6, 7]),
        node("add", Forward, 1.0, 0, [5, 6], [8]),
        node("loss", Loss, 1.0, 1, [8, 9], [10]),
        node("add.bwd", Backward, 1.0, 0, [10], [11, 12]),
        node("f2.bwd", Backward, 2.0, 1, [12, 5, 7, 3], [11, 4]),
        node("f1.bwd", Backward, 3.0, 1, [11, 0, 1], [2]),
    ];
    let g = TrainingGraph { name: Some("residual".into()), compute: c, data: d, param_grads_from_backward: false };
    g.validate().expect("a valid residual graph");
    g
}

/// A Siamese-like graph: two branches of `n ≥ 1` layers sharing a parameter, with saved
/// tensors and a ReLU-like backward that reads its output (even layers), a concatenation
/// and a classifier before the loss, and labels. A K-join (`multichain`'s shape) with
/// branches of lengths 6, 6 and 0 (the labels) for `n = 6`.
pub fn siamese(n: usize) -> TrainingGraph {
    let mut b = GraphBuilder::new("siamese-like");
    let w = b.data("w", DataKind::Parameter, 8);
    let gw = b.data("w.grad", DataKind::ParamGrad, 8);
    let labels = b.data("labels", DataKind::Input, 1);
    let mut tops = Vec::new();
    let mut branches = Vec::new();
    for br in 0..2 {
        let x = b.data(format!("x{br}"), DataKind::Input, 10);
        let mut acts = vec![x];
        let mut saved = Vec::new();
        for i in 1..=n {
            acts.push(b.data(format!("b{br}.a{i}"), DataKind::Activation, 10 + (i as u64 % 3)));
            saved.push(b.data(format!("b{br}.s{i}"), DataKind::Saved, 2));
        }
        let grads: Vec<DataId> =
            (1..=n).map(|i| b.data(format!("b{br}.a{i}.grad"), DataKind::Gradient, 10 + (i as u64 % 3))).collect();
        let first = b.graph().compute.len();
        for i in 1..=n {
            b.forward(format!("b{br}.f{i}"), 1.0, 1, [acts[i - 1], w], [acts[i], saved[i - 1]]);
        }
        tops.push((acts[n], grads[n - 1]));
        branches.push((first, acts, saved, grads));
    }
    let h = b.data("h", DataKind::Activation, 20);
    let hg = b.data("h.grad", DataKind::Gradient, 20);
    let logits = b.data("logits", DataKind::Activation, 2);
    let lg = b.data("logits.grad", DataKind::Gradient, 2);
    let concat = b.forward("concat", 1.0, 0, [tops[0].0, tops[1].0], [h]);
    let fc = b.forward("fc", 1.0, 0, [h, w], [logits]);
    b.loss("loss", 1.0, 0, [logits, labels], [lg]);
    b.backward("fc.bwd", fc, 1.0, 0, [lg, h, w], [hg, gw]);
    b.backward("concat.bwd", concat, 1.0, 0, [hg], [tops[0].1, tops[1].1]);
    for (br, (first, acts, saved, grads)) in branches.iter().enumerate() {
        for i in (1..=n).rev() {
            // Odd layers read their input and saved tensor, even layers their output.
            let mut inputs = vec![grads[i - 1], w];
            if i % 2 == 1 {
                inputs.extend([acts[i - 1], saved[i - 1]]);
            } else {
                inputs.push(acts[i]);
            }
            let mut outputs = vec![gw];
            if i > 1 {
                outputs.push(grads[i - 2]);
            }
            b.backward(format!("b{br}.f{i}.bwd"), first + i - 1, 2.0, 2, inputs, outputs);
        }
    }
    b.build()
}

/// One forward layer of a [`GraphSpec`]: `f_i` reads `a_{i−1}` (and `a_skip` if set),
/// writes `a_i` (and a saved tensor `s_i` if `saved > 0`), with a parameter if `param > 0`;
/// its backward reads `g_i`, what `f_i` read, `s_i`, and `a_i` if `reads_output`, and
/// writes the gradients of the activations `f_i` read (accumulated where two layers read
/// one) and of its parameter.
#[derive(Debug, Clone, PartialEq)]
pub struct Layer {
    /// `|a_i|` (and `|g_i|`).
    pub size: u64,
    /// A second input `a_j`, `j < i − 1` (`0` is the graph's input).
    pub skip: Option<usize>,
    /// `|s_i|`, `0` for none.
    pub saved: u64,
    /// The parameter's size, `0` for none.
    pub param: u64,
    /// The backward also reads the layer's output (a ReLU).
    pub reads_output: bool,
    /// Forward time.
    pub ftime: f64,
    /// Backward time.
    pub btime: f64,
    /// Temporary memory of the forward (the backward takes twice as much).
    pub tmp: u64,
}

/// A random layered training graph's description (see [`Layer`]); [`GraphSpec::build`]
/// makes the graph. Without skips it is sequential; with them, gradients have several
/// producers.
#[derive(Debug, Clone, PartialEq)]
pub struct GraphSpec {
    /// The input's size.
    pub input: u64,
    /// The layers, at least one.
    pub layers: Vec<Layer>,
    /// The loss's time.
    pub loss_time: f64,
}

impl GraphSpec {
    /// A random spec of `n ≥ 1` layers: sizes in `1..=20`, integer times, one layer in
    /// three with a skip input, one in two with a saved tensor.
    pub fn random(rng: &mut Rng, n: usize) -> GraphSpec {
        let layers = (1..=n)
            .map(|i| Layer {
                size: rng.range(1, 20),
                skip: (i >= 2 && rng.one_in(3)).then(|| rng.below(i as u64 - 1) as usize),
                saved: if rng.one_in(2) { rng.range(1, 10) } else { 0 },
                param: if rng.one_in(2) { rng.range(1, 8) } else { 0 },
                reads_output: rng.one_in(3),
                ftime: rng.range(1, 5) as f64,
                btime: rng.range(1, 9) as f64,
                tmp: rng.range(0, 4),
            })
            .collect();
        GraphSpec { input: rng.range(1, 20), layers, loss_time: rng.range(0, 3) as f64 }
    }

    /// The training graph.
    pub fn build(&self) -> TrainingGraph {
        let n = self.layers.len();
        assert!(n >= 1, "a graph spec needs a layer");
        let mut b = GraphBuilder::new(&format!("layered-{n}"));
        let mut acts = vec![b.data("x", DataKind::Input, self.input)];
        let mut saved = vec![None];
        let mut params = vec![None];
        let mut fwd = vec![usize::MAX];
        for (k, layer) in self.layers.iter().enumerate() {
            let i = k + 1;
            let p = (layer.param > 0).then(|| {
                (
                    b.data(format!("w{i}"), DataKind::Parameter, layer.param),
                    b.data(format!("gw{i}"), DataKind::ParamGrad, layer.param),
                )
            });
            let a = b.data(format!("a{i}"), DataKind::Activation, layer.size);
            let s = (layer.saved > 0).then(|| b.data(format!("s{i}"), DataKind::Saved, layer.saved));
            let mut inputs = vec![acts[i - 1]];
            if let Some(j) = layer.skip {
                assert!(j + 1 < i, "layer {i} skips from a_{j}: must be before a_{}", i - 1);
                inputs.push(acts[j]);
            }
            inputs.extend(p.map(|p| p.0));
            let outputs: Vec<DataId> = std::iter::once(a).chain(s).collect();
            fwd.push(b.forward(format!("f{i}"), layer.ftime, layer.tmp, inputs, outputs));
            acts.push(a);
            saved.push(s);
            params.push(p);
        }
        // Gradients of a_1..a_n (the input has none).
        let grads: Vec<DataId> = std::iter::once(usize::MAX)
            .chain((1..=n).map(|i| b.data(format!("g{i}"), DataKind::Gradient, self.layers[i - 1].size)))
            .collect();
        b.loss("loss", self.loss_time, 1, [acts[n]], [grads[n]]);
        for i in (1..=n).rev() {
            let layer = &self.layers[i - 1];
            let read: Vec<usize> = std::iter::once(i - 1).chain(layer.skip).collect();
            let mut inputs = vec![grads[i]];
            inputs.extend(read.iter().map(|&j| acts[j]));
            inputs.extend(saved[i]);
            inputs.extend(params[i].map(|p| p.0));
            if layer.reads_output {
                inputs.push(acts[i]);
            }
            let mut outputs: Vec<DataId> = read.iter().filter(|&&j| j >= 1).map(|&j| grads[j]).collect();
            outputs.extend(params[i].map(|p| p.1));
            b.backward(format!("f{i}.bwd"), fwd[i], layer.btime, 2 * layer.tmp, inputs, outputs);
        }
        b.build()
    }
}

/// A random layered graph of `n` layers ([`GraphSpec::random`]).
pub fn random_graph(rng: &mut Rng, n: usize) -> TrainingGraph {
    GraphSpec::random(rng, n).build()
}

/// A small GPT-2 from the zoo (2 heads, batch 1, `layers` layers of width `width`, `seq`
/// tokens): both views, with residual connections in the graph.
pub fn gpt(layers: usize, width: usize, seq: usize) -> Model {
    pebble_zoo::build("gpt", &gpt_options(layers, width, seq)).unwrap_or_else(|e| panic!("gpt: {e}"))
}

/// The options of [`gpt`]: for a caller that builds or lowers the model itself.
pub fn gpt_options(layers: usize, width: usize, seq: usize) -> ModelOptions {
    ModelOptions {
        layers: Some(layers),
        width: Some(width),
        heads: Some(2),
        seq: Some(seq),
        batch: Some(1),
        ..Default::default()
    }
}

/// The least memory any schedule of `graph` needs: what stays resident (static data and
/// inputs) and the largest compute node's footprint (its temporaries, and the inputs and
/// outputs it holds at once). Tests take budgets between it and store-all's peak, since
/// temporaries can dwarf the activations (an MLP's weight-gradient matmul on burn-flex).
pub fn least_graph_memory(graph: &TrainingGraph) -> u64 {
    let resident = |d: &usize| graph.data[*d].kind.is_static() || graph.data[*d].kind == DataKind::Input;
    let node = |c: &pebble_graph::ComputeNode| {
        c.tmp + c.inputs.iter().chain(&c.outputs).filter(|d| !resident(d)).map(|&d| graph.data[d].size).sum::<u64>()
    };
    graph.fixed_bytes() + graph.compute.iter().map(node).max().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixtures_are_valid() {
        for g in [tiny_graph(), chain_graph(3, true), chain_graph(2, false), residual_graph(), siamese(3)] {
            g.validate().unwrap();
        }
        let g = siamese(6);
        assert_eq!(g.compute.len(), 2 * 6 + 3 + 2 + 2 * 6);
    }

    #[test]
    fn random_graphs_are_valid_and_skips_accumulate() {
        let mut rng = Rng::new(11);
        let mut multi = 0;
        for n in 1..30 {
            let g = random_graph(&mut rng, 1 + n % 7);
            g.validate().unwrap();
            multi += g.producers().iter().filter(|p| p.len() > 1).count();
        }
        assert!(multi > 0, "some gradients have two producers");
    }
}
