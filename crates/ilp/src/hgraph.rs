//! H-graphs: the graphs Rockmate's and HiRemate's ILP solve (Zhao, Def. 3.2.2).
//!
//! An H-graph has compute nodes (cNodes) and data nodes (aNodes), like a training graph,
//! but a cNode may stand for a whole sub-schedule and come in several *options*, each
//! with its own time, temporary memory and *phantom*: what its forward keeps for its
//! backward that no other node sees (a bottom op's saved tensors, or a sub-cluster's
//! kept internals). At the bottom level a forward op has two options, with grad (its
//! phantom is its saved tensors) and without ("fast forward", no phantom); a backward op
//! has one.
//!
//! Options are paired by index: backward option `o` of pair `j` needs the phantom of
//! forward option `o`. A forward may have more options than its backward: the extra ones
//! are fast forwards, whose phantom is empty.

use pebble_graph::{ComputeKind, DataKind, TrainingGraph};

use crate::IlpError;

/// One way to run a cNode.
#[derive(Debug, Clone, PartialEq)]
pub struct HOption {
    /// Its duration.
    pub time: f64,
    /// Memory it needs while it runs, above what is resident before it and what it
    /// allocates (its outputs and its phantom).
    pub overhead: u64,
    /// For a forward: the phantom it leaves for the backward of the same option.
    pub phantom: u64,
    /// For a backward: aNodes this option reads beyond [`HNode::inputs`].
    pub reads: Vec<usize>,
    /// For a cluster's option, the correction terms (3.34): its memory substep by
    /// substep, where inputs it has done with free early. Empty: `overhead` holds
    /// throughout.
    pub substeps: Vec<Substep>,
}

/// One substep of a cluster option (Zhao, §3.4.4.1): while it runs, the option needs
/// `overhead` bytes (which may be negative) beyond what the H-ILP counts for the cNode
/// without [`HOption::overhead`] (what is resident before it, its outputs and its
/// phantom), less the inputs in `dead` that the H-ILP deletes after this cNode: no later
/// substep reads them, so the schedule frees them before this one runs.
#[derive(Debug, Clone, PartialEq)]
pub struct Substep {
    /// Bytes above what is resident before the cNode, its outputs and its phantom.
    pub overhead: i64,
    /// aNodes (inputs of the cNode) already freed, if the cNode deletes them.
    pub dead: Vec<usize>,
}

/// What a cNode is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HKind {
    /// The forward of pair `pair` (may be recomputed).
    Forward {
        /// The pair (forward, backward) it belongs to.
        pair: usize,
    },
    /// The backward of pair `pair` (runs once).
    Backward {
        /// The pair it belongs to.
        pair: usize,
    },
    /// The loss: everything between the forward and the backward (runs once).
    Loss,
}

/// A cNode.
#[derive(Debug, Clone, PartialEq)]
pub struct HNode {
    /// Forward, backward or loss.
    pub kind: HKind,
    /// aNodes every option reads.
    pub inputs: Vec<usize>,
    /// aNodes it produces (or accumulates into).
    pub outputs: Vec<usize>,
    /// Its options (at least one).
    pub options: Vec<HOption>,
}

/// An H-graph: cNodes in a topological order (forwards, the loss, backwards), and the
/// sizes of its aNodes.
#[derive(Debug, Clone, PartialEq)]
pub struct HGraph {
    /// cNodes.
    pub nodes: Vec<HNode>,
    /// aNode sizes.
    pub sizes: Vec<u64>,
}

impl HGraph {
    /// The bottom H-graph of a training graph: one cNode per compute node, one aNode per
    /// data node the schedule allocates (not static, not an input), saved tensors folded
    /// into their forward's phantom. Returns the graph and, for each aNode, its data node.
    pub fn bottom(g: &TrainingGraph) -> Result<(HGraph, Vec<usize>), IlpError> {
        let nd = g.data.len();
        let mut anode = vec![usize::MAX; nd];
        let mut of_anode = Vec::new();
        for (d, data) in g.data.iter().enumerate() {
            if !(data.kind.is_static() || data.kind == DataKind::Input || data.kind == DataKind::Saved) {
                anode[d] = of_anode.len();
                of_anode.push(d);
            }
        }
        let mut nodes = Vec::with_capacity(g.compute.len());
        for (k, c) in g.compute.iter().enumerate() {
            let keep = |ids: &[usize]| ids.iter().filter(|&&d| anode[d] != usize::MAX).map(|&d| anode[d]).collect();
            let kind = match c.kind {
                ComputeKind::Loss => HKind::Loss,
                ComputeKind::Backward => HKind::Backward {
                    pair: c.forward.ok_or_else(|| {
                        IlpError::InvalidGraph(format!("backward node {k} `{}` names no forward node", c.name))
                    })?,
                },
                ComputeKind::Forward => HKind::Forward { pair: k },
            };
            nodes.push(HNode { kind, inputs: keep(&c.inputs), outputs: keep(&c.outputs), options: op_options(g, k) });
        }
        // A saved tensor must be read by its forward's backward alone.
        for (k, c) in g.compute.iter().enumerate() {
            for &d in c.inputs.iter().filter(|&&d| g.data[d].kind == DataKind::Saved) {
                let owner = g.compute.iter().position(|p| p.outputs.contains(&d));
                if c.kind != ComputeKind::Backward || c.forward != owner {
                    return Err(IlpError::InvalidGraph(format!(
                        "saved tensor `{}` is read by `{}` (node {k}), not by the backward of the node that saved it",
                        g.data[d].name, c.name
                    )));
                }
            }
        }
        let sizes = of_anode.iter().map(|&d| g.data[d].size).collect();
        Ok((HGraph { nodes, sizes }, of_anode))
    }

    /// The index of the loss node.
    pub fn loss(&self) -> Option<usize> {
        self.nodes.iter().position(|n| n.kind == HKind::Loss)
    }
}

/// The options of one op of a training graph as a cNode: a forward that saves tensors
/// runs with grad (its phantom: those tensors) or fast (no phantom); any other node has
/// one option.
pub fn op_options(g: &TrainingGraph, k: usize) -> Vec<HOption> {
    let c = &g.compute[k];
    let one = |phantom, no_grad| HOption {
        time: c.time,
        overhead: g.compute_tmp(k, no_grad),
        phantom,
        reads: Vec::new(),
        substeps: Vec::new(),
    };
    let saved = g.saved_bytes(k);
    if c.kind == ComputeKind::Forward && saved > 0 {
        vec![one(saved, false), one(0, true)]
    } else {
        vec![one(0, false)]
    }
}
