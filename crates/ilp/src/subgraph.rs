//! Pieces of a training graph solved on their own: Rockmate's blocks and HiRemate's
//! clusters (rk-GB's block builder, Zhao §2.3).
//!
//! A piece is a set of forward nodes with their backward nodes. [`SubGraph::extract`]
//! makes it a standalone training graph: activations it reads from outside become
//! inputs, and a stand-in loss reads what it hands outside and produces the gradients
//! that come back ("the loss plus everything after", §2.3). Gradients it makes for the
//! outside nobody reads inside: they are the piece's outputs, kept to its end.
//!
//! [`sequential_blocks`] cuts the forward graph where a single activation crosses (the
//! 1-separators of rk-GB, found by [`pebble_graph::cut::single_crossing_cuts`]), and [`SubGraph::signature`] tells identical blocks apart
//! from different ones by comparing them node by node, names left out (§2.3: not graph
//! isomorphism, so identical blocks written differently are solved twice, which costs
//! time only).

use std::collections::HashMap;

use pebble_graph::cut::single_crossing_cuts;
use pebble_graph::{ComputeId, ComputeKind, ComputeNode, DataId, DataKind, DataNode, TrainingGraph};

use crate::IlpError;

/// A piece of a training graph, standalone.
#[derive(Debug, Clone)]
pub struct SubGraph {
    /// The piece: its forward nodes, a loss (the graph's own if the piece holds every
    /// forward node, else a stand-in), its backward nodes.
    pub graph: TrainingGraph,
    /// For each local compute node, the global one (`None` for a stand-in loss).
    pub compute: Vec<Option<ComputeId>>,
    /// For each local data node, the global one.
    pub data: Vec<DataId>,
    /// Local ids of the activations it reads from outside (now inputs).
    pub inputs: Vec<DataId>,
    /// Local ids of the activations it hands outside (read by the stand-in loss).
    pub outputs: Vec<DataId>,
    /// Local ids of the gradients that come back (made by the stand-in loss).
    pub grads_in: Vec<DataId>,
    /// Local ids of the gradients it makes for the outside.
    pub grads_out: Vec<DataId>,
    /// The local loss node.
    pub loss: ComputeId,
}

impl SubGraph {
    /// The piece made of forward nodes `forward` (and their backward nodes).
    pub fn extract(g: &TrainingGraph, forward: &[ComputeId]) -> Result<SubGraph, IlpError> {
        let nc = g.compute.len();
        let mut inside = vec![false; nc];
        for &f in forward {
            if f >= nc || g.compute[f].kind != ComputeKind::Forward {
                return Err(IlpError::InvalidGraph(format!("compute node {f} is not a forward node")));
            }
            inside[f] = true;
        }
        let all_forward = g.compute.iter().enumerate().all(|(k, c)| c.kind != ComputeKind::Forward || inside[k]);
        let fwd: Vec<usize> = (0..nc).filter(|&k| inside[k]).collect();
        let bwd: Vec<usize> = (0..nc)
            .filter(|&k| g.compute[k].kind == ComputeKind::Backward && g.compute[k].forward.is_some_and(|f| inside[f]))
            .collect();
        let real_loss = g.loss().ok_or_else(|| IlpError::InvalidGraph("the graph has no loss".into()))?;
        let producers = g.producers();
        let consumers = g.consumers();
        let mut member = vec![false; nc];
        for &k in fwd.iter().chain(&bwd) {
            member[k] = true;
        }
        if all_forward {
            member[real_loss] = true;
        }
        let made_inside = |d: usize| producers[d].iter().any(|&p| member[p]);
        let made_outside = |d: usize| producers[d].iter().any(|&p| !member[p]);
        let read_outside = |d: usize| consumers[d].iter().any(|&c| !member[c]);

        let made_in: Vec<bool> = (0..g.data.len()).map(made_inside).collect();
        let mut b = Builder {
            g,
            made_in: &made_in,
            local: HashMap::new(),
            data: Vec::new(),
            nodes: Vec::new(),
            inputs: Vec::new(),
            compute: Vec::new(),
        };
        let mut map = Vec::new();
        for &k in &fwd {
            b.push(k);
            map.push(Some(k));
        }
        let loss = b.compute.len();
        let mut outputs = Vec::new();
        let mut grads_in = Vec::new();
        if all_forward {
            b.push(real_loss);
            map.push(Some(real_loss));
        } else {
            // Activations made inside and read outside; gradients made outside and read inside.
            let mut reads = Vec::new();
            for &k in &fwd {
                for &d in &g.compute[k].outputs {
                    if g.data[d].kind == DataKind::Activation && read_outside(d) && !reads.contains(&d) {
                        reads.push(d);
                    }
                }
            }
            let mut makes = Vec::new();
            for &k in &bwd {
                for &d in &g.compute[k].inputs {
                    if g.data[d].kind == DataKind::Gradient && made_outside(d) && !makes.contains(&d) {
                        makes.push(d);
                    }
                }
            }
            makes.sort_unstable();
            outputs = reads.iter().map(|&d| b.id(d)).collect();
            grads_in = makes.iter().map(|&d| b.id(d)).collect();
            b.compute.push(ComputeNode {
                name: "loss (stand-in)".into(),
                kind: ComputeKind::Loss,
                time: 0.0,
                tmp: 0,
                inputs: outputs.clone(),
                outputs: grads_in.clone(),
                op: None,
                forward: None,
                stage: None,
            });
            map.push(None);
        }
        for &k in &bwd {
            b.push(k);
            map.push(Some(k));
        }
        let Builder { data, nodes: nodes_data, inputs, mut compute, .. } = b;
        // Backward nodes point at their local forward node.
        let local_of: HashMap<usize, usize> = map.iter().enumerate().filter_map(|(i, k)| k.map(|k| (k, i))).collect();
        for (i, k) in map.iter().enumerate() {
            if let Some(k) = k {
                if let Some(f) = g.compute[*k].forward {
                    compute[i].forward = local_of.get(&f).copied();
                }
            }
        }
        let grads_out: Vec<usize> = (0..data.len())
            .filter(|&l| {
                let d = data[l];
                g.data[d].kind == DataKind::Gradient && made_inside(d) && read_outside(d)
            })
            .collect();
        let graph = TrainingGraph {
            name: g.name.clone(),
            compute,
            data: nodes_data,
            param_grads_from_backward: g.param_grads_from_backward,
        };
        graph.validate().map_err(|e| IlpError::InvalidGraph(format!("a piece of the graph: {e}")))?;
        Ok(SubGraph { graph, compute: map, data, inputs, outputs, grads_in, grads_out, loss })
    }

    /// What identical pieces share: every node's op, kind, time, temporary memory and
    /// local wiring, and every data node's kind and size, names left out.
    pub fn signature(&self) -> String {
        let mut s = String::new();
        for c in &self.graph.compute {
            s.push_str(&format!(
                "{:?}|{}|{}|{}|{:?}|{:?}|{:?};",
                c.kind,
                c.op.as_deref().unwrap_or(""),
                c.time.to_bits(),
                c.tmp,
                c.inputs,
                c.outputs,
                c.forward
            ));
        }
        for d in &self.graph.data {
            s.push_str(&format!("{:?}:{};", d.kind, d.size));
        }
        s
    }
}

struct Builder<'g> {
    g: &'g TrainingGraph,
    made_in: &'g [bool],
    local: HashMap<usize, usize>,
    data: Vec<DataId>,
    nodes: Vec<DataNode>,
    inputs: Vec<DataId>,
    compute: Vec<ComputeNode>,
}

impl Builder<'_> {
    fn id(&mut self, d: usize) -> usize {
        if let Some(&l) = self.local.get(&d) {
            return l;
        }
        let mut node = self.g.data[d].clone();
        if node.kind == DataKind::Activation && !self.made_in[d] {
            node.kind = DataKind::Input;
            self.inputs.push(self.nodes.len());
        }
        self.data.push(d);
        self.nodes.push(node);
        self.local.insert(d, self.nodes.len() - 1);
        self.nodes.len() - 1
    }

    fn push(&mut self, k: usize) {
        let c = &self.g.compute[k];
        let mut node = c.clone();
        node.inputs = c.inputs.iter().map(|&d| self.id(d)).collect();
        node.outputs = c.outputs.iter().map(|&d| self.id(d)).collect();
        node.forward = None;
        self.compute.push(node);
    }
}

/// The sequential blocks of a graph's forward nodes (list order): a block ends after a
/// forward node past which exactly one activation is still read by a later forward node
/// or the loss ([`single_crossing_cuts`] over the forward nodes, the loss their final
/// reader; inputs and parameters do not count). Each block's forward nodes then read
/// only that one activation from the blocks before (plus inputs and parameters).
pub fn sequential_blocks(g: &TrainingGraph) -> Vec<Vec<ComputeId>> {
    let fwd: Vec<usize> =
        g.compute.iter().enumerate().filter(|(_, c)| c.kind == ComputeKind::Forward).map(|(k, _)| k).collect();
    let n = fwd.len();
    let mut pos = vec![None; g.compute.len()];
    for (i, &k) in fwd.iter().enumerate() {
        pos[k] = Some(i);
    }
    if let Some(l) = g.loss() {
        pos[l] = Some(n);
    }
    let mut made_by = vec![None; g.data.len()];
    for (i, &k) in fwd.iter().enumerate() {
        for &d in &g.compute[k].outputs {
            if g.data[d].kind == DataKind::Activation {
                made_by[d] = Some(i);
            }
        }
    }
    let consumers = g.consumers();
    let reads = (0..g.data.len())
        .filter(|&d| made_by[d].is_some())
        .flat_map(|d| consumers[d].iter().filter_map(|&c| pos[c]).map(move |r| (d, r)));
    // No cut after the last forward node: the loss alone would follow.
    let mut cuts = single_crossing_cuts(n, &made_by, reads).into_iter().filter(|&i| i + 1 < n).peekable();
    let mut blocks = Vec::new();
    let mut current = Vec::new();
    for (i, &k) in fwd.iter().enumerate() {
        current.push(k);
        if cuts.next_if_eq(&i).is_some() {
            blocks.push(std::mem::take(&mut current));
        }
    }
    if !current.is_empty() {
        blocks.push(current);
    }
    blocks
}
