//! K-join training graphs: the builder [`kjoin_graph`], the detection of a K-join
//! structure in any [`TrainingGraph`] ([`KJoin::detect`]), and the lowering of Table 1.1
//! operations to a graph [`Schedule`] ([`KJoin::lower`]).

use std::collections::{HashMap, HashSet};

use pebble_graph::{ComputeId, ComputeKind, ComputeNode, DataId, DataKind, DataNode, TrainingGraph};
use pebble_schedule::{Op, Schedule, Tensor, View};

use super::dp::{Costs, KOp};

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

    /// Finds the K-join structure of `g`, or says why it is not one.
    ///
    /// * A chain starts at an input read by forward nodes or the loss, and follows
    ///   forward nodes that read (besides static data) exactly the previous value, are its
    ///   only forward/loss reader, and produce exactly one activation. A node whose
    ///   activation has size 0 is merged with its single reader (a staged layout).
    /// * Every other forward node, the loss and the backward nodes of those (or with no
    ///   `forward`) form the head; every forward node of the head must depend on at least
    ///   two chains (otherwise the graph has a fork or a skip connection inside a branch),
    ///   and every value the head reads must have a single forward/loss reader (the head
    ///   joins, it does not fork: a network whose branches only join at its start, like
    ///   GPT-2's two embeddings, is not a K-join).
    /// * The backward nodes of layer `i` may read `δ_i`, `a_{i-1}`, `a_i`, what layer
    ///   `i`'s forward nodes produce, static data and what they produce themselves, and
    ///   hand one gradient, `δ_{i-1}`, to layer `i − 1`; the head reads only the chains'
    ///   last values and hands each chain its `δ_{L_k}`.
    pub fn detect(g: &TrainingGraph) -> Result<KJoin, String> {
        g.validate().map_err(|e| e.to_string())?;
        let loss = g.loss().ok_or("the graph has no loss")?;
        let nd = g.data.len();
        let kind = |d: DataId| g.data[d].kind;
        let mut readers: Vec<Vec<ComputeId>> = vec![Vec::new(); nd];
        for (c, n) in g.compute.iter().enumerate() {
            if n.kind != ComputeKind::Backward {
                for &d in &n.inputs {
                    if !kind(d).is_static() && !readers[d].contains(&c) {
                        readers[d].push(c);
                    }
                }
            }
        }
        let value_inputs = |c: ComputeId| -> Vec<DataId> {
            let mut v: Vec<DataId> = g.compute[c].inputs.iter().copied().filter(|&d| is_value(kind(d))).collect();
            v.dedup();
            v
        };
        let act_outputs = |c: ComputeId| -> Vec<DataId> {
            g.compute[c].outputs.iter().copied().filter(|&d| kind(d) == DataKind::Activation).collect()
        };
        for (c, n) in g.compute.iter().enumerate() {
            if n.kind != ComputeKind::Backward {
                if let Some(&d) = n.inputs.iter().find(|&&d| kind(d) == DataKind::Gradient) {
                    return Err(format!("forward node {c} `{}` reads the gradient `{}`", n.name, g.data[d].name));
                }
            }
        }
        // The single forward reader that extends a chain from `d`, with its activation.
        let step = |d: DataId| -> Option<(ComputeId, DataId)> {
            let r = &readers[d];
            if r.len() != 1 || g.compute[r[0]].kind != ComputeKind::Forward {
                return None;
            }
            let c = r[0];
            let outs = act_outputs(c);
            (value_inputs(c) == [d] && outs.len() == 1).then(|| (c, outs[0]))
        };
        let mut chains = Vec::new();
        let mut in_chain: HashMap<ComputeId, (usize, usize)> = HashMap::new();
        for (x, r) in readers.iter().enumerate() {
            if kind(x) != DataKind::Input || r.is_empty() {
                continue;
            }
            let mut acts = vec![x];
            let mut forward = Vec::new();
            let mut cur = x;
            while let Some((c, mut out)) = step(cur) {
                let mut layer = vec![c];
                while g.data[out].size == 0 {
                    match step(out) {
                        Some((c2, o2)) => {
                            layer.push(c2);
                            out = o2;
                        }
                        None => break,
                    }
                }
                for &c in &layer {
                    in_chain.insert(c, (chains.len(), forward.len()));
                }
                forward.push(layer);
                acts.push(out);
                cur = out;
            }
            let l = forward.len();
            chains.push(JoinChain { acts, grads: vec![None; l + 1], forward, backward: vec![Vec::new(); l] });
        }
        if chains.is_empty() {
            return Err("no input is read by a forward node or the loss".into());
        }
        // Head: forward nodes not in chains, and the loss.
        let mut head_fwd: Vec<ComputeId> = Vec::new();
        let mut chain_of_top: HashMap<DataId, usize> = HashMap::new();
        for (k, ch) in chains.iter().enumerate() {
            chain_of_top.insert(*ch.acts.last().expect("a_0"), k);
        }
        // deps[c]: the chains a head forward node depends on.
        let mut deps: HashMap<DataId, HashSet<usize>> = HashMap::new();
        for (&top, &k) in &chain_of_top {
            deps.insert(top, [k].into());
        }
        for (c, n) in g.compute.iter().enumerate() {
            if n.kind == ComputeKind::Forward && !in_chain.contains_key(&c) {
                head_fwd.push(c);
                let mut dep = HashSet::new();
                for d in value_inputs(c) {
                    match deps.get(&d) {
                        Some(s) => dep.extend(s.iter().copied()),
                        None => {
                            return Err(format!(
                            "forward node {c} `{}` reads `{}`, which is inside a branch (a fork or skip connection)",
                            n.name, g.data[d].name
                        ))
                        }
                    }
                }
                if dep.len() < 2 {
                    return Err(format!(
                        "forward node {c} `{}` depends on {} branch(es) only: the graph forks inside a branch",
                        n.name,
                        dep.len()
                    ));
                }
                for d in act_outputs(c) {
                    deps.insert(d, dep.clone());
                }
                for &d in &n.outputs {
                    if kind(d) == DataKind::Saved {
                        deps.insert(d, dep.clone());
                    }
                }
            }
        }
        for d in value_inputs(loss) {
            if !deps.contains_key(&d) {
                return Err(format!("the loss reads `{}`, which is inside a branch", g.data[d].name));
            }
        }
        // The head only joins: every value it reads has one forward/loss reader.
        for &c in head_fwd.iter().chain([&loss]) {
            for d in value_inputs(c) {
                if readers[d].len() > 1 {
                    return Err(format!(
                        "`{}` is read by {} forward nodes after the branches join (the head forks)",
                        g.data[d].name,
                        readers[d].len()
                    ));
                }
            }
        }
        let head_fwd_set: HashSet<ComputeId> = head_fwd.iter().copied().collect();
        let mut head = head_fwd.clone();
        head.push(loss);
        for (c, n) in g.compute.iter().enumerate() {
            if n.kind != ComputeKind::Backward {
                continue;
            }
            match n.forward.and_then(|f| in_chain.get(&f)) {
                Some(&(k, i)) => chains[k].backward[i].push(c),
                None => {
                    if let Some(f) = n.forward {
                        if !head_fwd_set.contains(&f) && f != loss {
                            return Err(format!("backward node {c} `{}` names forward node {f}, which is neither in a branch nor in the head", n.name));
                        }
                    }
                    head.push(c);
                }
            }
        }
        // External inputs and outputs (non-static) of a group of nodes.
        let group_io = |nodes: &[ComputeId]| -> (Vec<DataId>, Vec<DataId>) {
            let set: HashSet<ComputeId> = nodes.iter().copied().collect();
            let mut produced: Vec<DataId> = Vec::new();
            for &c in nodes {
                for &d in &g.compute[c].outputs {
                    if !kind(d).is_static() && !produced.contains(&d) {
                        produced.push(d);
                    }
                }
            }
            let mut ins = Vec::new();
            for &c in nodes {
                for &d in &g.compute[c].inputs {
                    if !kind(d).is_static() && !produced.contains(&d) && !ins.contains(&d) {
                        ins.push(d);
                    }
                }
            }
            // An output is external if someone outside reads it, or nobody reads it at all.
            let mut outs = Vec::new();
            for &d in &produced {
                let mut read_inside = false;
                let mut read_outside = false;
                for (c, n) in g.compute.iter().enumerate() {
                    if n.inputs.contains(&d) {
                        if set.contains(&c) {
                            read_inside = true;
                        } else {
                            read_outside = true;
                        }
                    }
                }
                if read_outside || !read_inside {
                    outs.push(d);
                }
            }
            (ins, outs)
        };
        let producers = g.producers();
        for (k, chain) in chains.iter_mut().enumerate() {
            for i in (1..=chain.len()).rev() {
                let ch = &*chain;
                let nodes = ch.backward[i - 1].clone();
                let (ins, outs) = group_io(&nodes);
                let layer_out: HashSet<DataId> =
                    ch.forward[i - 1].iter().flat_map(|&c| g.compute[c].outputs.iter().copied()).collect();
                let mut grad_in = None;
                for d in ins {
                    if kind(d) == DataKind::Gradient {
                        if grad_in.replace(d).is_some() {
                            return Err(format!("the backward of layer {i} of branch {k} reads two gradients"));
                        }
                    } else if d != ch.acts[i - 1] && d != ch.acts[i] && !layer_out.contains(&d) {
                        return Err(format!(
                            "the backward of layer {i} of branch {k} reads `{}`, which is not its layer's",
                            g.data[d].name
                        ));
                    }
                }
                let grad_out: Vec<DataId> = outs.into_iter().filter(|&d| kind(d) == DataKind::Gradient).collect();
                if grad_out.len() > 1 {
                    return Err(format!("the backward of layer {i} of branch {k} produces two gradients"));
                }
                if let Some(&d) = grad_out.first() {
                    if producers[d].iter().any(|c| !nodes.contains(c)) {
                        return Err(format!("gradient `{}` has producers outside its layer", g.data[d].name));
                    }
                }
                let below = grad_out.first().copied();
                if i < ch.len() {
                    if ch.grads[i] != grad_in {
                        return Err(format!(
                            "branch {k}: the gradient layer {} hands down is not the one layer {i} reads",
                            i + 1
                        ));
                    }
                } else {
                    chain.grads[i] = grad_in;
                }
                chain.grads[i - 1] = below;
            }
        }
        let (head_ins, head_outs) = group_io(&head);
        for d in head_ins {
            if !chain_of_top.contains_key(&d) {
                return Err(format!("the head reads `{}`, which is not the last value of a branch", g.data[d].name));
            }
        }
        let mut head_results = Vec::new();
        for d in head_outs {
            if kind(d) != DataKind::Gradient {
                continue;
            }
            let owner = chains.iter().position(|ch| !ch.is_empty() && ch.grads[ch.len()] == Some(d));
            if owner.is_some() {
                continue;
            }
            // The gradient of an input that the head reads directly (a chain of length 0).
            let named = chains
                .iter()
                .position(|ch| ch.is_empty() && g.data[d].name == format!("{}.grad", g.data[ch.acts[0]].name));
            match named {
                Some(k) => chains[k].grads[0] = Some(d),
                None => head_results.push(d),
            }
        }
        for (k, ch) in chains.iter().enumerate() {
            if let Some(d) = ch.grads[ch.len()] {
                if producers[d].iter().any(|c| !head.contains(c)) {
                    return Err(format!(
                        "branch {k}: its last gradient `{}` is not produced by the head",
                        g.data[d].name
                    ));
                }
            }
            if let Some(d) = ch.grads[0] {
                if g.compute.iter().any(|n| n.inputs.contains(&d)) && !ch.is_empty() {
                    return Err(format!("branch {k}: the gradient of its input is read by another node"));
                }
            }
        }
        Ok(KJoin { chains, head, head_results })
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
