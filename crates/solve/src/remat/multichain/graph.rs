//! K-join training graphs: the builder [`kjoin_graph`], the detection of a K-join
//! structure in any [`TrainingGraph`] ([`KJoin::detect`]), and the lowering of Table 1.1
//! operations to a graph [`Schedule`](pebble_schedule::Schedule) ([`KJoin::lower`]).

use pebble_graph::{ComputeId, ComputeKind, ComputeNode, DataId, DataKind, DataNode, TrainingGraph};

use super::dp::Costs;

mod detect;
mod lower;

/// How [`kjoin_graph`] lays the thesis's operations out as compute nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KJoinLayout {
    /// The thesis's accounting, exactly. §1.1 keeps an operation's working memory in a
    /// "special buffer" outside the `m` slots, and `F`, `B` and `Loss` replace their
    /// inputs by their outputs in place. Each such operation is a compute node (cost
    /// `u_F`, `u_B` or `u_L`) that writes a **zero-size** staging tensor (the buffer),
    /// followed by a zero-time node that moves the result into a one-unit tensor
    /// (`….put`); a schedule frees the consumed inputs in between. The simulated peak (in
    /// units) then equals the thesis's memory count, and the makespan its
    /// `k_F·u_F + k_B·u_B + u_L`.
    Staged,
    /// One compute node per operation, as a framework's graph has it. The simulator counts
    /// a node's outputs while its inputs are still resident, so the peak exceeds the
    /// thesis's count by the values an op creates (see [`super::Replay::plain_peak`]):
    /// `+1` around an in-place `F` or `B`, `+K` around the loss.
    Plain,
}

/// The training graph of a K-join (Shilova, Definition 3) with homogeneous unit-size
/// values.
///
/// Chain `k` (0-based) has the input `c{k}.a0` (an [`DataKind::Input`], one unit),
/// activations `c{k}.a{i}` for `1 ≤ i ≤ L_k` and gradients `c{k}.a{i}.grad` (one unit
/// each); forward node `c{k}.f{i}` maps `a_{i-1}` to `a_i` (time `u_F`), backward node
/// `c{k}.b{i}` maps `{δ_i, a_{i-1}}` to `δ_{i-1}` (time `u_B`); the loss (time `u_L`)
/// reads every `a_{L_k}` and produces every `δ_{L_k}`. Nothing else: no parameters, no
/// saved tensors, no temporary memory. `b_k = true` makes input `k` take a gradient
/// (`c{k}.a0.grad`, which the step delivers: MULTI-b's "keep `δ_0^{(k)}`"); with
/// `b_k = false` the graph has no `δ_0^{(k)}` (`B_1^{(k)}` produces nothing, and with
/// `L_k = 0` the input is a plain loss input).
///
/// With [`KJoinLayout::Staged`] every op writes a zero-size `….out` tensor and a
/// zero-time `….put` node moves it into its slot (see there).
pub fn kjoin_graph(lengths: &[usize], b: &[bool], costs: Costs, layout: KJoinLayout) -> TrainingGraph {
    assert_eq!(lengths.len(), b.len(), "kjoin_graph: one b per chain");
    let kk = lengths.len();
    let mut data: Vec<DataNode> = Vec::new();
    let mut push = |name: String, kind: DataKind, size: u64| {
        data.push(DataNode { name, kind, size });
        data.len() - 1
    };
    let staged = layout == KJoinLayout::Staged;
    // acts[k][i], grads[k][i]
    let mut acts: Vec<Vec<DataId>> = Vec::new();
    let mut grads: Vec<Vec<Option<DataId>>> = Vec::new();
    for (k, &l) in lengths.iter().enumerate() {
        let a: Vec<DataId> = (0..=l)
            .map(|i| push(format!("c{k}.a{i}"), if i == 0 { DataKind::Input } else { DataKind::Activation }, 1))
            .collect();
        let g: Vec<Option<DataId>> =
            (0..=l).map(|i| (i > 0 || b[k]).then(|| push(format!("c{k}.a{i}.grad"), DataKind::Gradient, 1))).collect();
        acts.push(a);
        grads.push(g);
    }
    let node = |name: String, kind, time, inputs: Vec<DataId>, outputs: Vec<DataId>, forward| ComputeNode {
        name,
        kind,
        time,
        tmp: 0,
        inputs,
        outputs,
        op: None,
        forward,
        stage: None,
    };
    let mut compute: Vec<ComputeNode> = Vec::new();
    // fwd[k][i-1]: the main forward node of layer i.
    let mut fwd: Vec<Vec<ComputeId>> = vec![Vec::new(); kk];
    for k in 0..kk {
        for i in 1..=lengths[k] {
            let (a_in, a_out) = (acts[k][i - 1], acts[k][i]);
            fwd[k].push(compute.len());
            if staged {
                let buf = push(format!("c{k}.f{i}.out"), DataKind::Activation, 0);
                compute.push(node(format!("c{k}.f{i}"), ComputeKind::Forward, costs.uf, vec![a_in], vec![buf], None));
                compute.push(node(format!("c{k}.f{i}.put"), ComputeKind::Forward, 0.0, vec![buf], vec![a_out], None));
            } else {
                compute.push(node(format!("c{k}.f{i}"), ComputeKind::Forward, costs.uf, vec![a_in], vec![a_out], None));
            }
        }
    }
    let tops: Vec<DataId> = (0..kk).map(|k| acts[k][lengths[k]]).collect();
    let top_grads: Vec<DataId> = (0..kk).filter_map(|k| grads[k][lengths[k]]).collect();
    if staged {
        let buf = push("loss.out".into(), DataKind::Gradient, 0);
        compute.push(node("loss".into(), ComputeKind::Loss, costs.ul, tops, vec![buf], None));
        for k in 0..kk {
            if let Some(g) = grads[k][lengths[k]] {
                compute.push(node(format!("c{k}.loss.put"), ComputeKind::Backward, 0.0, vec![buf], vec![g], None));
            }
        }
    } else {
        compute.push(node("loss".into(), ComputeKind::Loss, costs.ul, tops, top_grads, None));
    }
    for k in 0..kk {
        for i in (1..=lengths[k]).rev() {
            let f = Some(fwd[k][i - 1]);
            let inputs = vec![grads[k][i].expect("δ_i exists for i ≥ 1"), acts[k][i - 1]];
            let out: Vec<DataId> = grads[k][i - 1].into_iter().collect();
            if staged && !out.is_empty() {
                let buf = push(format!("c{k}.b{i}.out"), DataKind::Gradient, 0);
                compute.push(node(format!("c{k}.b{i}"), ComputeKind::Backward, costs.ub, inputs, vec![buf], f));
                compute.push(node(format!("c{k}.b{i}.put"), ComputeKind::Backward, 0.0, vec![buf], out, f));
            } else {
                compute.push(node(format!("c{k}.b{i}"), ComputeKind::Backward, costs.ub, inputs, out, f));
            }
        }
    }
    let name = format!(
        "kjoin L=({}) b=({}){}",
        lengths.iter().map(|l| l.to_string()).collect::<Vec<_>>().join(","),
        b.iter().map(|&x| if x { "1" } else { "0" }).collect::<Vec<_>>().join(","),
        if staged { " staged" } else { "" }
    );
    let g = TrainingGraph { name: Some(name), compute, data, param_grads_from_backward: false };
    debug_assert!(g.validate().is_ok(), "kjoin_graph builds valid graphs: {:?}", g.validate());
    g
}

/// One branch of a detected K-join.
#[derive(Debug, Clone, PartialEq)]
pub struct JoinChain {
    /// `a_0` (an input) … `a_L` (the value the head reads).
    pub acts: Vec<DataId>,
    /// `δ_0 … δ_L`; `None` where the graph computes no such gradient.
    pub grads: Vec<Option<DataId>>,
    /// Layer `i` (at index `i − 1`): its forward nodes, in order (one node, or a node
    /// followed by the nodes that move a zero-size output into `a_i`).
    pub forward: Vec<Vec<ComputeId>>,
    /// Layer `i` (at index `i − 1`): the backward nodes of its forward nodes, in list order.
    pub backward: Vec<Vec<ComputeId>>,
}

impl JoinChain {
    /// `L_k`.
    pub fn len(&self) -> usize {
        self.forward.len()
    }

    /// Whether the chain is an input read by the head directly.
    pub fn is_empty(&self) -> bool {
        self.forward.is_empty()
    }
}

/// A K-join found in a training graph: K chains from K inputs into a head (the loss,
/// and any forward nodes that join chains before it, with their backward nodes), which
/// plays the thesis's `Loss`.
#[derive(Debug, Clone, PartialEq)]
pub struct KJoin {
    /// The chains, ordered by their input's data id.
    pub chains: Vec<JoinChain>,
    /// The head, in list order: forward nodes, the loss, backward nodes.
    pub head: Vec<ComputeId>,
    /// Gradients the head produces that no chain reads and that stay to the end.
    pub head_results: Vec<DataId>,
}

fn is_value(kind: DataKind) -> bool {
    matches!(kind, DataKind::Input | DataKind::Activation)
}

impl KJoin {
    /// `L`.
    pub fn lengths(&self) -> Vec<usize> {
        self.chains.iter().map(|c| c.len()).collect()
    }

    /// `b`: chain `k` keeps `δ_0^{(k)}` iff the graph computes the gradient of its input.
    pub fn b(&self) -> Vec<bool> {
        self.chains.iter().map(|c| c.grads[0].is_some()).collect()
    }

    /// The largest value of any chain (inputs, activations, gradients): the slot of the
    /// homogeneous approximation (at least 1).
    pub fn slot_size(&self, g: &TrainingGraph) -> u64 {
        let mut s = 1;
        for ch in &self.chains {
            for &d in ch.acts.iter().chain(ch.grads.iter().flatten()) {
                s = s.max(g.data[d].size);
            }
        }
        s
    }

    /// Average layer forward time, backward time, and the head's time: the costs of
    /// the homogeneous approximation.
    pub fn costs(&self, g: &TrainingGraph) -> Costs {
        let t = |cs: &[ComputeId]| cs.iter().map(|&c| g.compute[c].time).sum::<f64>();
        let layers: usize = self.chains.iter().map(|c| c.len()).sum();
        let (mut f, mut b) = (0.0, 0.0);
        for ch in &self.chains {
            f += ch.forward.iter().map(|l| t(l)).sum::<f64>();
            b += ch.backward.iter().map(|l| t(l)).sum::<f64>();
        }
        let n = layers.max(1) as f64;
        Costs { uf: f / n, ub: b / n, ul: t(&self.head) }
    }
}
