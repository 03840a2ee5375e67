use serde::{Deserialize, Serialize};

use crate::error::GraphError;

/// Index of a compute node in [`TrainingGraph::compute`].
pub type ComputeId = usize;
/// Index of a data node in [`TrainingGraph::data`].
pub type DataId = usize;

/// What a compute node does (Zhao, §1.2: cNodes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ComputeKind {
    /// A forward op. Run with grad, it also produces its [`DataKind::Saved`] outputs;
    /// run without grad ("fast forward") it does not.
    Forward,
    /// The backward of one forward op.
    Backward,
    /// The loss: everything between the last forward and the first backward.
    /// There is exactly one per graph, and it is never recomputed.
    Loss,
}

/// What a data node holds (Zhao, §1.2: aNodes, and §1.1's memory components).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DataKind {
    /// An input of the step (images, tokens, labels): resident at the start.
    Input,
    /// An activation: the output of a forward op.
    Activation,
    /// A tensor saved only for backward (a "phantom"): produced by a forward op
    /// run with grad, consumed only by backward ops.
    Saved,
    /// The gradient of an activation or input. It may have several producers;
    /// it is allocated by the first and complete after the last.
    Gradient,
    /// A parameter.
    Parameter,
    /// The gradient of a parameter (pre-allocated, resident for the whole step).
    ParamGrad,
    /// An optimizer state (Adam's two moments per parameter, say).
    OptimizerState,
}

impl DataKind {
    /// Parameters, their gradients and optimizer states: resident for the whole step,
    /// unless a schedule offloads them explicitly.
    pub fn is_static(self) -> bool {
        matches!(self, DataKind::Parameter | DataKind::ParamGrad | DataKind::OptimizerState)
    }
}

/// A computation (cNode).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ComputeNode {
    /// A readable name, e.g. `layer1.0.conv1` or `layer1.0.conv1.bwd`.
    pub name: String,
    /// Forward, backward or loss.
    pub kind: ComputeKind,
    /// Duration in seconds (or plain units).
    pub time: f64,
    /// Temporary memory while it runs, beyond its inputs and outputs.
    #[serde(default)]
    pub tmp: u64,
    /// Data that must be resident (and complete) for it to run.
    pub inputs: Vec<DataId>,
    /// Data it produces (or contributes to, for multi-producer gradients).
    pub outputs: Vec<DataId>,
    /// The op type (`conv2d`, `linear`, …), for the executor and the profiler.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub op: Option<String>,
    /// For a backward node: the forward node it differentiates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forward: Option<ComputeId>,
    /// The block (chain stage) of a forward or backward node, if the graph is partitioned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage: Option<usize>,
}

/// A tensor (aNode).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DataNode {
    /// A readable name.
    pub name: String,
    /// What it holds.
    pub kind: DataKind,
    /// Its size in bytes (or plain units).
    pub size: u64,
}

/// The forward+backward data-flow graph of one training step (Zhao, Ch. 1: the FB-graph).
///
/// Bipartite: compute nodes read and write data nodes. `compute` is listed in a valid
/// execution order (forward ops, the loss, then backward ops), which is the order of
/// plain autograd.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainingGraph {
    /// A label, e.g. the model it came from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Compute nodes, in a valid execution order.
    pub compute: Vec<ComputeNode>,
    /// Data nodes.
    pub data: Vec<DataNode>,
    /// Parameter gradients are made by their backward nodes, as PyTorch's autograd makes
    /// `.grad` (the first producer creates one, the others add to it), instead of being
    /// resident from the step's start (pebble's executor on Burn, which keeps them
    /// allocated). Either way they are never freed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub param_grads_from_backward: bool,
}

impl TrainingGraph {
    /// Whether data node `d` is resident from the step's start whatever a schedule does:
    /// the inputs and the static data (parameter gradients unless made by the backward).
    pub fn resident_from_start(&self, d: usize) -> bool {
        let kind = self.data[d].kind;
        kind == DataKind::Input || kind.is_static() && !(kind == DataKind::ParamGrad && self.param_grads_from_backward)
    }

    /// The temporary bytes compute node `c` holds while it runs: its declared `tmp`, and
    /// without grad also the `Saved` outputs it still makes (attention's weights, a
    /// dropout's mask) and drops at its end.
    pub fn compute_tmp(&self, c: ComputeId, no_grad: bool) -> u64 {
        self.compute[c].tmp + if no_grad { self.saved_bytes(c) } else { 0 }
    }

    /// Bytes of compute node `c`'s `Saved` outputs: what it keeps for its backward.
    pub fn saved_bytes(&self, c: ComputeId) -> u64 {
        let saved = self.compute[c].outputs.iter().filter(|&&d| self.data[d].kind == DataKind::Saved);
        saved.map(|&d| self.data[d].size).sum()
    }

    /// For each data node, the compute nodes that produce it.
    pub fn producers(&self) -> Vec<Vec<ComputeId>> {
        let mut p = vec![Vec::new(); self.data.len()];
        for (c, node) in self.compute.iter().enumerate() {
            for &d in &node.outputs {
                p[d].push(c);
            }
        }
        p
    }

    /// For each data node, the compute nodes that read it.
    pub fn consumers(&self) -> Vec<Vec<ComputeId>> {
        let mut p = vec![Vec::new(); self.data.len()];
        for (c, node) in self.compute.iter().enumerate() {
            for &d in &node.inputs {
                p[d].push(c);
            }
        }
        p
    }

    /// The loss node.
    pub fn loss(&self) -> Option<ComputeId> {
        self.compute.iter().position(|c| c.kind == ComputeKind::Loss)
    }

    /// Bytes resident for the whole step: parameters, their gradients, optimizer states.
    pub fn static_bytes(&self) -> u64 {
        self.data.iter().filter(|d| d.kind.is_static()).map(|d| d.size).sum()
    }

    /// Bytes resident from the step's start whatever a schedule does: the step's inputs
    /// and the static data (what no policy can release), but for parameter gradients made
    /// by the backward, which come later (a solver that plans on this figure checks its
    /// plans in the simulator, which counts them from then on).
    pub fn fixed_bytes(&self) -> u64 {
        (0..self.data.len()).filter(|&d| self.resident_from_start(d)).map(|d| self.data[d].size).sum()
    }

    /// Bytes of parameters alone.
    pub fn param_bytes(&self) -> u64 {
        self.data.iter().filter(|d| d.kind == DataKind::Parameter).map(|d| d.size).sum()
    }

    /// Checks ids, kinds and the execution order of `compute`.
    pub fn validate(&self) -> Result<(), GraphError> {
        let nd = self.data.len();
        let nc = self.compute.len();
        let losses = self.compute.iter().filter(|c| c.kind == ComputeKind::Loss).count();
        if losses != 1 {
            return Err(GraphError::Invalid(format!("a graph needs exactly one loss node, found {losses}")));
        }
        for (i, d) in self.data.iter().enumerate() {
            crate::chain::checked_size(d.size, || format!("data[{i}].size"))?;
        }
        for (i, c) in self.compute.iter().enumerate() {
            crate::chain::checked_time(c.time, || format!("compute[{i}].time"))?;
            crate::chain::checked_size(c.tmp, || format!("compute[{i}].tmp"))?;
            for (field, ids) in [("inputs", &c.inputs), ("outputs", &c.outputs)] {
                if let Some(&d) = ids.iter().find(|&&d| d >= nd) {
                    return Err(GraphError::BadId { field: format!("compute[{i}].{field}"), id: d, count: nd });
                }
            }
            if let Some(f) = c.forward {
                if f >= nc {
                    return Err(GraphError::BadId { field: format!("compute[{i}].forward"), id: f, count: nc });
                }
            }
        }
        let producers = self.producers();
        let mut produced = vec![false; nd];
        for (i, d) in self.data.iter().enumerate() {
            let p = &producers[i];
            match d.kind {
                DataKind::Input | DataKind::Parameter | DataKind::OptimizerState if !p.is_empty() => {
                    return Err(GraphError::Invalid(format!(
                        "data[{i}] `{}` is {:?} but has a producer",
                        d.name, d.kind
                    )));
                }
                DataKind::Activation | DataKind::Saved | DataKind::Gradient | DataKind::ParamGrad if p.is_empty() => {
                    return Err(GraphError::Invalid(format!("data[{i}] `{}` ({:?}) has no producer", d.name, d.kind)));
                }
                DataKind::Saved if (p.len() != 1 || self.compute[p[0]].kind != ComputeKind::Forward) => {
                    return Err(GraphError::Invalid(format!(
                        "data[{i}] `{}` is a saved tensor but is not produced by exactly one forward node",
                        d.name
                    )));
                }
                _ => {}
            }
            produced[i] = matches!(
                d.kind,
                DataKind::Input | DataKind::Parameter | DataKind::OptimizerState | DataKind::ParamGrad
            );
        }
        // The listed order must be executable: each input produced (completely) before use.
        let mut remaining: Vec<usize> = producers.iter().map(|p| p.len()).collect();
        for (i, c) in self.compute.iter().enumerate() {
            for &d in &c.inputs {
                let ready = match self.data[d].kind {
                    DataKind::Input | DataKind::Parameter | DataKind::OptimizerState => true,
                    _ => produced[d] && remaining[d] == 0,
                };
                if !ready {
                    return Err(GraphError::Invalid(format!(
                        "compute[{i}] `{}` reads data[{d}] `{}` before all its producers ran (the compute list must be in execution order)",
                        c.name, self.data[d].name
                    )));
                }
            }
            for &d in &c.outputs {
                produced[d] = true;
                remaining[d] = remaining[d].saturating_sub(1);
            }
        }
        Ok(())
    }

    /// Reads a training graph from JSON text and validates it.
    pub fn from_json(text: &str) -> Result<TrainingGraph, GraphError> {
        let de = &mut serde_json::Deserializer::from_str(text);
        let g: TrainingGraph = serde_path_to_error::deserialize(de).map_err(|e| {
            let path = e.path().to_string();
            let inner = e.into_inner();
            let message = if path == "." { inner.to_string() } else { format!("field `{path}`: {inner}") };
            GraphError::Malformed { what: "graph", message }
        })?;
        g.validate()?;
        Ok(g)
    }

    /// Writes the graph as JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a graph always serializes")
    }
}
