//! [`KJoin::detect`]: the K-join structure of a training graph, or why it has none.

use std::collections::{HashMap, HashSet};

use pebble_graph::{ComputeId, ComputeKind, DataId, DataKind, TrainingGraph};

use super::{is_value, JoinChain, KJoin};

impl KJoin {
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
        let det = Detector::new(g)?;
        let (mut chains, in_chain) = det.chains()?;
        let mut chain_of_top: HashMap<DataId, usize> = HashMap::new();
        for (k, ch) in chains.iter().enumerate() {
            chain_of_top.insert(*ch.acts.last().expect("a_0"), k);
        }
        let head_fwd = det.head_forward(&in_chain, &chain_of_top, loss)?;
        let head = det.assign_backward(&mut chains, &in_chain, &head_fwd, loss)?;
        let producers = g.producers();
        det.chain_gradients(&mut chains, &producers)?;
        let head_results = det.head_results(&mut chains, &head, &chain_of_top)?;
        det.check_ends(&chains, &head, &producers)?;
        Ok(KJoin { chains, head, head_results })
    }
}

/// The chain and layer of each forward node that is in a chain.
type InChain = HashMap<ComputeId, (usize, usize)>;

/// What [`KJoin::detect`] reads of a graph: the kinds of its data and the forward
/// readers of each value.
struct Detector<'g> {
    g: &'g TrainingGraph,
    /// Per data node: the forward and loss nodes that read it (none for static data).
    readers: Vec<Vec<ComputeId>>,
}

impl<'g> Detector<'g> {
    /// Collects the readers of `g`'s values; `Err` if a forward node reads a gradient.
    fn new(g: &'g TrainingGraph) -> Result<Detector<'g>, String> {
        let kind = |d: DataId| g.data[d].kind;
        let mut readers: Vec<Vec<ComputeId>> = vec![Vec::new(); g.data.len()];
        for (c, n) in g.compute.iter().enumerate() {
            if n.kind != ComputeKind::Backward {
                for &d in &n.inputs {
                    if !kind(d).is_static() && !readers[d].contains(&c) {
                        readers[d].push(c);
                    }
                }
            }
        }
        for (c, n) in g.compute.iter().enumerate() {
            if n.kind != ComputeKind::Backward {
                if let Some(&d) = n.inputs.iter().find(|&&d| kind(d) == DataKind::Gradient) {
                    return Err(format!("forward node {c} `{}` reads the gradient `{}`", n.name, g.data[d].name));
                }
            }
        }
        Ok(Detector { g, readers })
    }

    /// The kind of data node `d`.
    fn kind(&self, d: DataId) -> DataKind {
        self.g.data[d].kind
    }

    /// The values (inputs and activations) node `c` reads.
    fn value_inputs(&self, c: ComputeId) -> Vec<DataId> {
        let mut v: Vec<DataId> = self.g.compute[c].inputs.iter().copied().filter(|&d| is_value(self.kind(d))).collect();
        v.dedup();
        v
    }

    /// The activations node `c` produces.
    fn act_outputs(&self, c: ComputeId) -> Vec<DataId> {
        self.g.compute[c].outputs.iter().copied().filter(|&d| self.kind(d) == DataKind::Activation).collect()
    }

    /// The single forward reader that extends a chain from `d`, with its activation.
    fn step(&self, d: DataId) -> Option<(ComputeId, DataId)> {
        let r = &self.readers[d];
        if r.len() != 1 || self.g.compute[r[0]].kind != ComputeKind::Forward {
            return None;
        }
        let c = r[0];
        let outs = self.act_outputs(c);
        (self.value_inputs(c) == [d] && outs.len() == 1).then(|| (c, outs[0]))
    }

    /// The chains from the inputs that something reads, without their backward nodes
    /// and gradients yet, and the chain and layer of each of their forward nodes.
    fn chains(&self) -> Result<(Vec<JoinChain>, InChain), String> {
        let g = self.g;
        let mut chains = Vec::new();
        let mut in_chain: InChain = HashMap::new();
        for (x, r) in self.readers.iter().enumerate() {
            if self.kind(x) != DataKind::Input || r.is_empty() {
                continue;
            }
            let mut acts = vec![x];
            let mut forward = Vec::new();
            let mut cur = x;
            while let Some((c, mut out)) = self.step(cur) {
                let mut layer = vec![c];
                while g.data[out].size == 0 {
                    match self.step(out) {
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
        Ok((chains, in_chain))
    }

    /// The head's forward nodes (those in no chain), checked to join two branches or
    /// more, and to fork nowhere, up to the loss.
    fn head_forward(
        &self,
        in_chain: &InChain,
        chain_of_top: &HashMap<DataId, usize>,
        loss: ComputeId,
    ) -> Result<Vec<ComputeId>, String> {
        let g = self.g;
        let mut head_fwd: Vec<ComputeId> = Vec::new();
        // deps[d]: the chains a value of the head depends on.
        let mut deps: HashMap<DataId, HashSet<usize>> = HashMap::new();
        for (&top, &k) in chain_of_top {
            deps.insert(top, [k].into());
        }
        for (c, n) in g.compute.iter().enumerate() {
            if n.kind == ComputeKind::Forward && !in_chain.contains_key(&c) {
                head_fwd.push(c);
                let mut dep = HashSet::new();
                for d in self.value_inputs(c) {
                    let Some(s) = deps.get(&d) else {
                        return Err(format!(
                            "forward node {c} `{}` reads `{}`, which is inside a branch (a fork or skip connection)",
                            n.name, g.data[d].name
                        ));
                    };
                    dep.extend(s.iter().copied());
                }
                if dep.len() < 2 {
                    return Err(format!(
                        "forward node {c} `{}` depends on {} branch(es) only: the graph forks inside a branch",
                        n.name,
                        dep.len()
                    ));
                }
                for d in self.act_outputs(c) {
                    deps.insert(d, dep.clone());
                }
                for &d in &n.outputs {
                    if self.kind(d) == DataKind::Saved {
                        deps.insert(d, dep.clone());
                    }
                }
            }
        }
        for d in self.value_inputs(loss) {
            if !deps.contains_key(&d) {
                return Err(format!("the loss reads `{}`, which is inside a branch", g.data[d].name));
            }
        }
        // The head only joins: every value it reads has one forward/loss reader.
        for &c in head_fwd.iter().chain([&loss]) {
            for d in self.value_inputs(c) {
                if self.readers[d].len() > 1 {
                    return Err(format!(
                        "`{}` is read by {} forward nodes after the branches join (the head forks)",
                        g.data[d].name,
                        self.readers[d].len()
                    ));
                }
            }
        }
        Ok(head_fwd)
    }

    /// Gives each backward node to its chain's layer, or to the head; returns the head:
    /// its forward nodes, the loss, its backward nodes.
    fn assign_backward(
        &self,
        chains: &mut [JoinChain],
        in_chain: &InChain,
        head_fwd: &[ComputeId],
        loss: ComputeId,
    ) -> Result<Vec<ComputeId>, String> {
        let head_fwd_set: HashSet<ComputeId> = head_fwd.iter().copied().collect();
        let mut head = head_fwd.to_vec();
        head.push(loss);
        for (c, n) in self.g.compute.iter().enumerate() {
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
        Ok(head)
    }

    /// External inputs and outputs (non-static) of a group of nodes.
    fn group_io(&self, nodes: &[ComputeId]) -> (Vec<DataId>, Vec<DataId>) {
        let g = self.g;
        let set: HashSet<ComputeId> = nodes.iter().copied().collect();
        let mut produced: Vec<DataId> = Vec::new();
        for &c in nodes {
            for &d in &g.compute[c].outputs {
                if !self.kind(d).is_static() && !produced.contains(&d) {
                    produced.push(d);
                }
            }
        }
        let mut ins = Vec::new();
        for &c in nodes {
            for &d in &g.compute[c].inputs {
                if !self.kind(d).is_static() && !produced.contains(&d) && !ins.contains(&d) {
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
    }

    /// Finds each chain's gradients from its layers' backward nodes, from the last layer
    /// down, checking that each layer reads its own values and hands one gradient down.
    fn chain_gradients(&self, chains: &mut [JoinChain], producers: &[Vec<ComputeId>]) -> Result<(), String> {
        let g = self.g;
        for (k, chain) in chains.iter_mut().enumerate() {
            for i in (1..=chain.len()).rev() {
                let ch = &*chain;
                let nodes = ch.backward[i - 1].clone();
                let (ins, outs) = self.group_io(&nodes);
                let layer_out: HashSet<DataId> =
                    ch.forward[i - 1].iter().flat_map(|&c| g.compute[c].outputs.iter().copied()).collect();
                let mut grad_in = None;
                for d in ins {
                    if self.kind(d) == DataKind::Gradient {
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
                let grad_out: Vec<DataId> = outs.into_iter().filter(|&d| self.kind(d) == DataKind::Gradient).collect();
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
        Ok(())
    }

    /// Checks that the head reads only the chains' last values, gives the gradient of an
    /// input the head reads directly to its chain of length 0, and returns the other
    /// gradients the head leaves.
    fn head_results(
        &self,
        chains: &mut [JoinChain],
        head: &[ComputeId],
        chain_of_top: &HashMap<DataId, usize>,
    ) -> Result<Vec<DataId>, String> {
        let g = self.g;
        let (head_ins, head_outs) = self.group_io(head);
        for d in head_ins {
            if !chain_of_top.contains_key(&d) {
                return Err(format!("the head reads `{}`, which is not the last value of a branch", g.data[d].name));
            }
        }
        let mut head_results = Vec::new();
        for d in head_outs {
            if self.kind(d) != DataKind::Gradient {
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
        Ok(head_results)
    }

    /// Checks each chain's ends: the head alone produces its last gradient, and nothing
    /// reads the gradient of its input (unless the head reads the input directly).
    fn check_ends(&self, chains: &[JoinChain], head: &[ComputeId], producers: &[Vec<ComputeId>]) -> Result<(), String> {
        let g = self.g;
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
        Ok(())
    }
}
