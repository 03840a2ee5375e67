//! The one meaning of a graph schedule (Zhao's thesis, §1.3, on a [`TrainingGraph`]).
//!
//! `Tensor::Data(d)` names data node `d`. Inputs and static nodes (parameters, their
//! gradients, optimizer states) are resident from the start
//! ([`TrainingGraph::resident_from_start`]), but for parameter gradients that the graph
//! has made by the backward (`param_grads_from_backward`), which are gradients like any
//! other except that no schedule frees them.
//!
//! * `Compute { node, no_grad }` reads every input, which must be whole on the device and
//!   complete (a multi-producer gradient is complete once all its producers have run since
//!   it was created). It creates each output not on the device; a multi-producer gradient
//!   is created by its first producer and accumulated into by the others (which then read
//!   it). Producing a complete resident output again is a fault. Static outputs (parameter
//!   gradients) create nothing but must be resident. `no_grad` (forward nodes only) keeps
//!   none of its `Saved` outputs: it still makes them, so they count in its temporary
//!   memory ([`TrainingGraph::compute_tmp`]), and drops them at its end. The loss and each
//!   backward node run exactly once.
//! * Nothing is freed implicitly: schedules free with explicit `Free` ops. Static nodes
//!   cannot be freed (offload them instead).

use pebble_graph::{ComputeKind, DataKind, TrainingGraph};
use serde::Serialize;

use super::{Refusal, Where};
use crate::{Op, Tensor};

/// What one step of a lowered graph schedule does.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum GraphAction {
    /// Runs compute node `node` (without grad: its `Saved` outputs skipped).
    Compute {
        /// The compute node.
        node: usize,
        /// Run without grad.
        no_grad: bool,
    },
    /// Frees every copy of data node `data`.
    Free {
        /// The data node.
        data: usize,
    },
    /// `fraction` of data node `data` to the host.
    Offload {
        /// The data node.
        data: usize,
        /// The part moved.
        fraction: f64,
    },
    /// `fraction` of data node `data` back to the device.
    Prefetch {
        /// The data node.
        data: usize,
        /// The part moved.
        fraction: f64,
    },
}

/// Why a graph step cannot run, found where the tensors stand.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Fault {
    /// It reads (or accumulates into) a data node not whole on the device, or incomplete.
    Missing(usize),
    /// It produces a data node already complete on the device.
    Already(usize),
}

/// One step of a lowered graph schedule.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GraphStep {
    /// The index of its op in the schedule.
    pub op: usize,
    /// What it does.
    pub action: GraphAction,
    /// Data nodes a compute step reads whole on the device.
    pub reads: Vec<usize>,
    /// Data nodes it creates on the device, at its start.
    pub creates: Vec<usize>,
    /// Multi-producer gradients it adds into (also among its reads).
    pub accumulates: Vec<usize>,
    /// The first reason it cannot run, if any (the simulator says it with times; an
    /// executor refuses it).
    pub fault: Option<Fault>,
}

/// A graph schedule lowered: its steps in program order, up to the first op it refuses.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GraphProgram {
    /// The steps.
    pub steps: Vec<GraphStep>,
    /// Which compute nodes ran.
    pub ran: Vec<bool>,
    /// The op refused (its index, and why), where the steps stop.
    #[serde(skip)]
    pub refused: Option<(usize, Refusal)>,
}

/// Data node `d` of `graph` is resident from the start, never created or freed.
pub fn fixed(graph: &TrainingGraph, d: usize) -> bool {
    graph.resident_from_start(d)
}

/// Lowers a graph schedule's `ops` on `graph`.
pub fn lower_graph(graph: &TrainingGraph, ops: &[Op]) -> GraphProgram {
    let nd = graph.data.len();
    let mut nprod = vec![0u32; nd];
    for c in &graph.compute {
        for &d in c.outputs.iter().filter(|&&d| d < nd) {
            nprod[d] += 1;
        }
    }
    let mut at = vec![Where::default(); nd];
    for (d, at) in at.iter_mut().enumerate() {
        if fixed(graph, d) {
            at.created();
        }
    }
    let mut low = GraphLowering { graph, nprod, count: vec![0; nd], ran: vec![false; graph.compute.len()], at };
    let mut steps = Vec::with_capacity(ops.len());
    let mut refused = None;
    for (k, op) in ops.iter().enumerate() {
        match low.step(k, op) {
            Ok(step) => steps.push(step),
            Err(why) => {
                refused = Some((k, why));
                break;
            }
        }
    }
    GraphProgram { steps, ran: low.ran, refused }
}

/// The state of one graph lowering.
struct GraphLowering<'g> {
    graph: &'g TrainingGraph,
    /// Producers of each data node.
    nprod: Vec<u32>,
    /// Producers that have run since the node was (re)created.
    count: Vec<u32>,
    ran: Vec<bool>,
    at: Vec<Where>,
}

impl GraphLowering<'_> {
    fn data(&self, t: Tensor) -> Result<usize, Refusal> {
        let nd = self.graph.data.len();
        match t {
            Tensor::Data(d) if d < nd => Ok(d),
            Tensor::Data(d) => Err(Refusal::OutOfRange(format!("data node {d} (the graph has {nd} data nodes)"))),
            _ => Err(Refusal::OutOfRange(format!("{t:?} (a chain tensor; graph schedules name Data(d))"))),
        }
    }

    fn step(&mut self, k: usize, op: &Op) -> Result<GraphStep, Refusal> {
        let mut s = GraphStep {
            op: k,
            action: GraphAction::Free { data: 0 },
            reads: Vec::new(),
            creates: Vec::new(),
            accumulates: Vec::new(),
            fault: None,
        };
        match *op {
            Op::Compute { node, no_grad } => {
                self.check_compute(node, no_grad)?;
                s.action = GraphAction::Compute { node, no_grad };
                s.fault = self.compute(&mut s, node, no_grad);
            }
            Op::Forward { .. } | Op::Backward { .. } | Op::CpuUpdate { .. } => {
                return Err(Refusal::Invalid("a chain op (stage) in a graph schedule".into()))
            }
            Op::Run { .. } | Op::Send { .. } => {
                return Err(Refusal::Invalid("a pipeline op in a graph schedule".into()))
            }
            Op::Free { tensor } => {
                let d = self.data(tensor)?;
                let node = &self.graph.data[d];
                if node.kind.is_static() {
                    return Err(Refusal::Invalid(format!(
                        "data node {d} `{}` is static ({:?}): offload it instead of freeing it",
                        node.name, node.kind
                    )));
                }
                self.at[d].released();
                self.count[d] = 0;
                s.action = GraphAction::Free { data: d };
            }
            Op::Offload { tensor, fraction } => {
                let d = self.data(tensor)?;
                self.at[d].offloaded(fraction);
                s.action = GraphAction::Offload { data: d, fraction };
            }
            Op::Prefetch { tensor, fraction } => {
                let d = self.data(tensor)?;
                self.at[d].prefetched(fraction, k);
                s.action = GraphAction::Prefetch { data: d, fraction };
            }
        }
        Ok(s)
    }

    /// What a compute op may not be: out of the graph, a second run of the loss or of a
    /// backward node, or a node other than a forward one without grad.
    fn check_compute(&self, node: usize, no_grad: bool) -> Result<(), Refusal> {
        let (graph, nd) = (self.graph, self.graph.data.len());
        let Some(c) = graph.compute.get(node) else {
            return Err(Refusal::OutOfRange(format!(
                "compute node {node} (the graph has {} compute nodes)",
                graph.compute.len()
            )));
        };
        if let Some(&d) = c.inputs.iter().chain(&c.outputs).find(|&&d| d >= nd) {
            return Err(Refusal::OutOfRange(format!(
                "data node {d} of compute node {node} (the graph has {nd} data nodes)"
            )));
        }
        match c.kind {
            ComputeKind::Loss if self.ran[node] => return Err(Refusal::Invalid("the loss already ran".into())),
            ComputeKind::Backward if self.ran[node] => {
                return Err(Refusal::Invalid(format!(
                    "backward node {node} `{}` already ran (gradients would accumulate twice)",
                    c.name
                )))
            }
            _ => {}
        }
        if no_grad && c.kind != ComputeKind::Forward {
            return Err(Refusal::Invalid(format!(
                "no_grad on a {:?} node; only forward nodes run without grad",
                c.kind
            )));
        }
        Ok(())
    }

    /// Compute node `node`'s reads, creates and accumulations, and its first fault.
    fn compute(&mut self, s: &mut GraphStep, node: usize, no_grad: bool) -> Option<Fault> {
        let (graph, c) = (self.graph, &self.graph.compute[node]);
        for &d in &c.inputs {
            let complete = fixed(graph, d) || self.count[d] >= self.nprod[d];
            if !self.at[d].intact || !complete {
                return Some(Fault::Missing(d));
            }
            s.reads.push(d);
        }
        for &d in &c.outputs {
            let kind = graph.data[d].kind;
            if (no_grad && kind == DataKind::Saved) || s.creates.contains(&d) || s.accumulates.contains(&d) {
                continue;
            }
            let (at, count, nprod) = (self.at[d], self.count[d], self.nprod[d]);
            if fixed(graph, d) {
                // Accumulates into a pre-allocated parameter gradient.
                if !at.intact {
                    return Some(Fault::Missing(d));
                }
                s.reads.push(d);
            } else if at.on_device() {
                if !(nprod > 1 && count < nprod) {
                    return Some(Fault::Already(d));
                }
                if !at.intact {
                    return Some(Fault::Missing(d));
                }
                s.reads.push(d);
                s.accumulates.push(d);
            } else if nprod > 1 && count > 0 && count < nprod {
                // Partly accumulated, then offloaded: it must come back to accumulate.
                return Some(Fault::Missing(d));
            } else {
                s.creates.push(d);
            }
        }
        for &d in &s.creates {
            self.at[d].created();
            self.count[d] = 1;
        }
        for &d in &s.accumulates {
            self.count[d] += 1;
        }
        self.ran[node] = true;
        None
    }
}
