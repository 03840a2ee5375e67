//! K-join training graphs: the builder [`kjoin_graph`], the detection of a K-join
//! structure in any [`TrainingGraph`] ([`KJoin::detect`]), and the lowering of Table 1.1
//! operations to a graph [`Schedule`] ([`KJoin::lower`]).

use std::collections::{HashMap, HashSet};

use pebble_graph::{ComputeId, ComputeKind, ComputeNode, DataId, DataKind, DataNode, TrainingGraph};
use pebble_schedule::{Op, Schedule, Tensor, View};

use super::dp::{Costs, KOp};

mod detect;

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
    let g = TrainingGraph { name: Some(name), compute, data };
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

    /// Lowers Table 1.1 operations (for this K-join's `L` and `b`) to graph ops, with
    /// `keep_saved = false` (see [`KJoin::lower_with`]).
    pub fn lower(&self, g: &TrainingGraph, ops: &[KOp]) -> Result<Vec<Op>, String> {
        self.lower_with(g, ops, false)
    }

    /// Lowers Table 1.1 operations (for this K-join's `L` and `b`) to graph ops.
    ///
    /// The graph side tracks the thesis's copies of each `a_i` and frees a tensor when its
    /// last copy goes. Each op runs a group of compute nodes and frees, after each node,
    /// what the op consumes (and what the group made for itself) once no later node of the
    /// group reads or writes it:
    ///
    /// * `F_i`: layer `i`'s forward nodes without grad; consumes `a_{i-1}` unless a copy
    ///   remains (after `S_{i-1}`), keeps `a_i`. On a staged graph the input is freed
    ///   before the `put` node: in place, as in the thesis.
    /// * `B_i`: layer `i`'s backward nodes; if they read `a_i` or a tensor layer `i`'s
    ///   forward saves and it is not resident, layer `i`'s forward nodes run first with
    ///   grad (real graphs; never on [`kjoin_graph`]s). Consumes `δ_i` and `a_{i-1}`, keeps
    ///   `δ_{i-1}`.
    /// * `Loss`: the head's forward nodes with grad, the loss, the head's backward nodes;
    ///   consumes every `a_{L_k}`, keeps every `δ_{L_k}`.
    /// * `S_i`: one more copy. `D_i`: one copy fewer. `D̄`: frees `δ_0` if the graph has it.
    ///
    /// Then every `Free` moves up to right after the last compute op that reads or writes
    /// the tensor: a real backward need not read `a_{i-1}`, which the thesis keeps until
    /// `B_i`. On a [`kjoin_graph`] every free already follows its tensor's last use.
    ///
    /// With `keep_saved`, an `F_i` that is the last one before `B_i` runs with grad when
    /// `B_i` reads what layer `i` produces, and that stays (`a_i` too, past its last copy)
    /// until `B_i`: no recomputation before the backward, at the price of memory the
    /// thesis's model does not count. Nothing changes on a [`kjoin_graph`].
    pub fn lower_with(&self, g: &TrainingGraph, ops: &[KOp], keep_saved: bool) -> Result<Vec<Op>, String> {
        let mut copies: HashMap<DataId, usize> = HashMap::new();
        let mut resident = vec![false; g.data.len()];
        for (d, n) in g.data.iter().enumerate() {
            resident[d] = n.kind == DataKind::Input;
        }
        for ch in &self.chains {
            copies.insert(ch.acts[0], 1);
        }
        // Tensors kept for a later backward beyond the thesis's copies (keep_saved).
        let mut held: HashSet<DataId> = HashSet::new();
        // last_f[n]: op n is an F_i after which the next F_i / B_i of its layer is B_i.
        let mut last_f = vec![false; ops.len()];
        let mut next_is_b: HashMap<(usize, usize), bool> = HashMap::new();
        for (n, op) in ops.iter().enumerate().rev() {
            match *op {
                KOp::Backward { chain, index } => {
                    next_is_b.insert((chain, index), true);
                }
                KOp::Forward { chain, index } => {
                    last_f[n] = next_is_b.get(&(chain, index)).copied().unwrap_or(false);
                    next_is_b.insert((chain, index), false);
                }
                _ => {}
            }
        }
        // What layer `i`'s backward reads of what its forward produces.
        let bwd_reads_layer = |ch: &JoinChain, i: usize| -> Vec<DataId> {
            let layer_out: HashSet<DataId> = ch.forward[i - 1]
                .iter()
                .flat_map(|&c| g.compute[c].outputs.iter().copied())
                .filter(|&d| !g.data[d].kind.is_static())
                .collect();
            let mut v: Vec<DataId> = Vec::new();
            for &c in &ch.backward[i - 1] {
                for &d in &g.compute[c].inputs {
                    if layer_out.contains(&d) && !v.contains(&d) {
                        v.push(d);
                    }
                }
            }
            v
        };
        // Drops one thesis copy of `d`; true when the tensor is to be freed.
        let drop_copy = |copies: &mut HashMap<DataId, usize>, held: &HashSet<DataId>, d: DataId| {
            let c = copies.get_mut(&d).expect("checked by the caller");
            *c -= 1;
            *c == 0 && !held.contains(&d)
        };
        let mut out = Vec::new();
        for (n, op) in ops.iter().enumerate() {
            let bad = |why: String| Err(format!("op {n} ({op}): {why}"));
            match *op {
                KOp::Forward { chain, index } => {
                    let Some(ch) = self.chains.get(chain).filter(|c| index >= 1 && index <= c.len()) else {
                        return bad("out of range".into());
                    };
                    let (a_in, a_out) = (ch.acts[index - 1], ch.acts[index]);
                    if copies.get(&a_in).copied().unwrap_or(0) == 0 {
                        return bad("its input is not stored".into());
                    }
                    if resident[a_out] {
                        return bad("recomputes a value that is stored".into());
                    }
                    let consumed: Vec<DataId> =
                        if drop_copy(&mut copies, &held, a_in) { vec![a_in] } else { Vec::new() };
                    let mut keep: HashSet<DataId> = [a_out].into();
                    let mut no_grad = true;
                    if keep_saved && last_f[n] {
                        let reads = bwd_reads_layer(ch, index);
                        if !reads.is_empty() {
                            no_grad = false;
                            keep.extend(reads.iter().copied());
                            held.extend(reads);
                        }
                    }
                    let nodes: Vec<(ComputeId, bool)> = ch.forward[index - 1].iter().map(|&c| (c, no_grad)).collect();
                    run_group(g, &nodes, &consumed, &keep, &mut resident, &mut out);
                    *copies.entry(a_out).or_insert(0) += 1;
                }
                KOp::Backward { chain, index } => {
                    let Some(ch) = self.chains.get(chain).filter(|c| index >= 1 && index <= c.len()) else {
                        return bad("out of range".into());
                    };
                    let a_in = ch.acts[index - 1];
                    if copies.get(&a_in).copied().unwrap_or(0) == 0 {
                        return bad("its input is not stored".into());
                    }
                    if let Some(d) = ch.grads[index] {
                        if !resident[d] {
                            return bad("δ_i is not resident".into());
                        }
                    }
                    let bwd = &ch.backward[index - 1];
                    let fwd = &ch.forward[index - 1];
                    let reads = bwd_reads_layer(ch, index);
                    let mut consumed: Vec<DataId> = ch.grads[index].into_iter().collect();
                    let mut nodes: Vec<(ComputeId, bool)> = Vec::new();
                    if reads.iter().any(|&d| !resident[d]) {
                        let layer_out = fwd.iter().flat_map(|&c| g.compute[c].outputs.iter().copied());
                        if let Some(d) = layer_out.filter(|&d| !g.data[d].kind.is_static()).find(|&d| resident[d]) {
                            return bad(format!(
                                "must recompute its layer's forward, but `{}` is resident",
                                g.data[d].name
                            ));
                        }
                        nodes.extend(fwd.iter().map(|&c| (c, false)));
                    } else {
                        // What an earlier F_i kept for this backward (keep_saved).
                        for d in reads {
                            if held.remove(&d) && copies.get(&d).copied().unwrap_or(0) == 0 {
                                consumed.push(d);
                            }
                        }
                    }
                    nodes.extend(bwd.iter().map(|&c| (c, false)));
                    if drop_copy(&mut copies, &held, a_in) {
                        consumed.push(a_in);
                    }
                    let keep: HashSet<DataId> = ch.grads[index - 1].into_iter().collect();
                    run_group(g, &nodes, &consumed, &keep, &mut resident, &mut out);
                }
                KOp::Loss => {
                    let mut consumed = Vec::new();
                    for ch in &self.chains {
                        let top = *ch.acts.last().expect("a_0");
                        if copies.get(&top).copied().unwrap_or(0) == 0 {
                            return bad(format!("`{}` is not stored", g.data[top].name));
                        }
                        if drop_copy(&mut copies, &held, top) {
                            consumed.push(top);
                        }
                    }
                    let mut keep: HashSet<DataId> = self.head_results.iter().copied().collect();
                    keep.extend(self.chains.iter().filter_map(|ch| ch.grads[ch.len()]));
                    keep.extend(held.iter().copied());
                    let nodes: Vec<(ComputeId, bool)> = self.head.iter().map(|&c| (c, false)).collect();
                    run_group(g, &nodes, &consumed, &keep, &mut resident, &mut out);
                }
                KOp::Store { chain, index } => {
                    let Some(ch) = self.chains.get(chain).filter(|c| index <= c.len()) else {
                        return bad("out of range".into());
                    };
                    match copies.get_mut(&ch.acts[index]).filter(|c| **c > 0) {
                        Some(c) => *c += 1,
                        None => return bad("replicates a value that is not stored".into()),
                    }
                }
                KOp::Discard { chain, index } => {
                    let Some(ch) = self.chains.get(chain).filter(|c| index <= c.len()) else {
                        return bad("out of range".into());
                    };
                    let d = ch.acts[index];
                    if copies.get(&d).copied().unwrap_or(0) == 0 {
                        return bad("discards a value that is not stored".into());
                    }
                    if drop_copy(&mut copies, &held, d) {
                        free(d, &mut resident, &mut out);
                    }
                }
                KOp::DiscardGrad { chain } => {
                    let Some(ch) = self.chains.get(chain) else {
                        return bad("out of range".into());
                    };
                    if let Some(d) = ch.grads[0] {
                        if resident[d] {
                            free(d, &mut resident, &mut out);
                        }
                    }
                }
            }
        }
        Ok(free_early(g, out))
    }

    /// [`KJoin::lower`] as a graph [`Schedule`].
    pub fn schedule(&self, g: &TrainingGraph, ops: &[KOp]) -> Result<Schedule, String> {
        Ok(Schedule::new(View::Graph, self.lower(g, ops)?))
    }
}

/// Moves each `Free` up to right after the last compute op (since the tensor was last
/// allocated) that reads or writes it; a tensor no compute op touched stays where it is.
fn free_early(g: &TrainingGraph, ops: Vec<Op>) -> Vec<Op> {
    let mut last: Vec<Option<usize>> = vec![None; g.data.len()];
    let mut after: Vec<Vec<Op>> = vec![Vec::new(); ops.len()];
    let mut keep = vec![true; ops.len()];
    for (p, op) in ops.iter().enumerate() {
        match *op {
            Op::Compute { node, .. } => {
                let n = &g.compute[node];
                for &d in n.inputs.iter().chain(&n.outputs) {
                    last[d] = Some(p);
                }
            }
            Op::Free { tensor: Tensor::Data(d) } => {
                if let Some(q) = last[d].take() {
                    after[q].push(*op);
                    keep[p] = false;
                }
            }
            _ => {}
        }
    }
    let mut out = Vec::with_capacity(ops.len());
    for (p, op) in ops.into_iter().enumerate() {
        if keep[p] {
            out.push(op);
        }
        out.append(&mut after[p]);
    }
    out
}

fn free(d: DataId, resident: &mut [bool], out: &mut Vec<Op>) {
    resident[d] = false;
    out.push(Op::Free { tensor: Tensor::Data(d) });
}

/// Runs `nodes` (with their `no_grad` flags) and frees, right after the last node of the
/// group that reads or writes it, every resident tensor in `consumed` and every
/// non-static tensor the group produces, except those in `keep`. A consumed tensor no
/// node of the group touches is freed before the group.
fn run_group(
    g: &TrainingGraph,
    nodes: &[(ComputeId, bool)],
    consumed: &[DataId],
    keep: &HashSet<DataId>,
    resident: &mut [bool],
    out: &mut Vec<Op>,
) {
    let produced = |c: ComputeId, no_grad: bool| {
        g.compute[c]
            .outputs
            .iter()
            .copied()
            .filter(move |&d| !(g.data[d].kind.is_static() || (no_grad && g.data[d].kind == DataKind::Saved)))
    };
    let mut last: HashMap<DataId, usize> = HashMap::new();
    for (j, &(c, no_grad)) in nodes.iter().enumerate() {
        for &d in &g.compute[c].inputs {
            last.insert(d, j);
        }
        for d in produced(c, no_grad) {
            last.insert(d, j);
        }
    }
    let mut candidates: Vec<DataId> = consumed.to_vec();
    for &(c, no_grad) in nodes {
        for d in produced(c, no_grad) {
            if !candidates.contains(&d) {
                candidates.push(d);
            }
        }
    }
    candidates.retain(|d| !keep.contains(d));
    for &d in &candidates {
        if !last.contains_key(&d) && resident[d] {
            free(d, resident, out);
        }
    }
    for (j, &(c, no_grad)) in nodes.iter().enumerate() {
        out.push(Op::Compute { node: c, no_grad });
        for d in produced(c, no_grad) {
            resident[d] = true;
        }
        for &d in &candidates {
            if last.get(&d) == Some(&j) && resident[d] {
                free(d, resident, out);
            }
        }
    }
}
