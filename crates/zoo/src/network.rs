//! A network: typed ops over shaped tensors, grouped into blocks. Models are written
//! with [`NetBuilder`]; [`Network::training_graph`] lowers a network to the training
//! graph the planners read.

use pebble_graph::{ComputeKind, ComputeNode, DataKind, DataNode, TrainingGraph};
use serde::{Deserialize, Serialize};

use crate::ops::{Elem, OpDecl, OpKind, Operand, Saved, Shape, Temporaries};
use crate::{DType, ParamMemory, ZooError};

/// Index of a tensor in [`Network::tensors`].
pub type TensorId = usize;
/// Index of a parameter in [`Network::params`].
pub type ParamId = usize;

/// A tensor of the forward pass.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NetTensor {
    /// Name.
    pub name: String,
    /// Shape.
    pub shape: Shape,
    /// Element type.
    pub elem: Elem,
    /// The op that produces it; `None` for an input of the step.
    pub producer: Option<usize>,
    /// Whether a gradient flows back to it.
    pub requires_grad: bool,
    /// For a view (reshape, slice): the tensor whose memory it shares.
    pub view_of: Option<TensorId>,
}

/// A parameter.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NetParam {
    /// Name, e.g. `layer1.0.conv1.weight`.
    pub name: String,
    /// Shape.
    pub shape: Shape,
}

/// An op of the forward pass.
#[derive(Debug, Clone, PartialEq)]
pub struct NetOp {
    /// Name, e.g. `layer1.0.conv1`.
    pub name: String,
    /// What it computes.
    pub kind: OpKind,
    /// Its inputs.
    pub inputs: Vec<TensorId>,
    /// Its output.
    pub output: TensorId,
    /// Its parameters, in the order of [`OpDecl::params`].
    pub params: Vec<ParamId>,
    /// Its block (chain stage).
    pub stage: usize,
    /// Its declaration for these shapes.
    pub decl: OpDecl,
}

/// A model: ops in execution order, the last one a loss.
#[derive(Debug, Clone, PartialEq)]
pub struct Network {
    /// Name.
    pub name: String,
    /// Float type.
    pub dtype: DType,
    /// Tensors.
    pub tensors: Vec<NetTensor>,
    /// Parameters.
    pub params: Vec<NetParam>,
    /// Ops, in execution order; the last is the loss.
    pub ops: Vec<NetOp>,
    /// Bytes of an integer element (token ids, labels, max-pool indices): 4, as pebble's
    /// executor stores them (Burn's `i32`), unless the profile's runtime says otherwise
    /// (`Model::from_network` applies it).
    pub int_bytes: u64,
    /// Whose temporaries its costs count: the kernels', unless the model is lowered for
    /// pebble's executor on burn-flex (`Model::from_network` applies the options').
    pub temporaries: Temporaries,
}

/// Where each tensor of a [`Network`] lands in its [`TrainingGraph`]: the numbering
/// [`Network::training_graph_indexed`] used, so that an executor can run a graph
/// schedule op by op.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GraphIndex {
    /// Data node of each forward tensor (a view maps to its root's node); `usize::MAX`
    /// for the loss's output.
    pub tensor: Vec<usize>,
    /// Data node of each tensor's gradient (`usize::MAX` where none flows).
    pub grad: Vec<usize>,
    /// Data node of each parameter.
    pub param: Vec<usize>,
    /// Data node of each parameter's gradient.
    pub param_grad: Vec<usize>,
    /// Data nodes of each op's saved extras, in declaration order.
    pub extras: Vec<Vec<usize>>,
    /// Forward compute node of each op (`usize::MAX` for views and the loss).
    pub forward: Vec<usize>,
    /// Backward compute node of each op (`usize::MAX` where it has none).
    pub backward: Vec<usize>,
    /// The loss's compute node.
    pub loss: usize,
    /// Number of data nodes.
    pub data: usize,
}

/// The cost of each op's forward and backward: time in seconds and temporary bytes.
/// The roofline [`CostModel`](crate::CostModel) is one; an executor's profiler is another.
pub trait OpCosts {
    /// Forward of `net.ops[op]`: (seconds, temporary bytes).
    fn forward(&self, net: &Network, op: usize) -> (f64, u64);
    /// Backward of `net.ops[op]` (for the loss: forward and backward at once).
    fn backward(&self, net: &Network, op: usize) -> (f64, u64);
}

/// Builds a [`Network`] op by op.
///
/// ```
/// use pebble_zoo::{NetBuilder, OpKind, Elem, DType};
/// let mut b = NetBuilder::new("mlp", DType::F32);
/// let x = b.input("x", vec![8, 16], Elem::Float);
/// let y = b.input("y", vec![8], Elem::Int);
/// let h = b.op("fc1", OpKind::Linear { out_features: 32, bias: true }, &[x]).unwrap();
/// let h = b.op("relu", OpKind::Relu, &[h]).unwrap();
/// b.next_stage();
/// let o = b.op("fc2", OpKind::Linear { out_features: 10, bias: true }, &[h]).unwrap();
/// b.loss("loss", OpKind::CrossEntropy, &[o, y]).unwrap();
/// let net = b.finish().unwrap();
/// assert_eq!(net.param_count(), 16 * 32 + 32 + 32 * 10 + 10);
/// ```
#[derive(Debug)]
pub struct NetBuilder {
    net: Network,
    stage: usize,
    stage_used: bool,
}

impl NetBuilder {
    /// An empty network.
    pub fn new(name: &str, dtype: DType) -> NetBuilder {
        NetBuilder {
            net: Network {
                name: name.to_string(),
                dtype,
                tensors: Vec::new(),
                params: Vec::new(),
                ops: Vec::new(),
                // As the executor stores them (Burn's `i32`); a profile may say otherwise.
                int_bytes: pebble_machine::RuntimeOverhead::BURN.int_bytes,
                temporaries: Temporaries::Kernels,
            },
            stage: 0,
            stage_used: false,
        }
    }

    /// An input of the step (images, token ids, labels). Inputs take no gradient.
    pub fn input(&mut self, name: &str, shape: Shape, elem: Elem) -> TensorId {
        self.net.tensors.push(NetTensor {
            name: name.into(),
            shape,
            elem,
            producer: None,
            requires_grad: false,
            view_of: None,
        });
        self.net.tensors.len() - 1
    }

    /// The shape of a tensor.
    pub fn shape(&self, t: TensorId) -> &Shape {
        &self.net.tensors[t].shape
    }

    /// The parameters of the op that produced `t`.
    pub fn params_of(&self, t: TensorId) -> Vec<ParamId> {
        self.net.tensors[t].producer.map(|o| self.net.ops[o].params.clone()).unwrap_or_default()
    }

    /// Starts a new block: later ops belong to the next chain stage. Does nothing if the
    /// current block has no op yet.
    pub fn next_stage(&mut self) {
        if self.stage_used {
            self.stage += 1;
            self.stage_used = false;
        }
    }

    /// Adds an op with fresh parameters named `{name}.weight`, `{name}.bias`.
    pub fn op(&mut self, name: &str, kind: OpKind, inputs: &[TensorId]) -> Result<TensorId, ZooError> {
        self.add(name, kind, inputs, None)
    }

    /// Adds an op whose parameters are existing ones (tied weights, e.g. GPT-2's lm_head
    /// reusing the token embedding). Shapes must match the declaration.
    pub fn op_tied(
        &mut self,
        name: &str,
        kind: OpKind,
        inputs: &[TensorId],
        params: &[ParamId],
    ) -> Result<TensorId, ZooError> {
        self.add(name, kind, inputs, Some(params))
    }

    fn add(
        &mut self,
        name: &str,
        kind: OpKind,
        inputs: &[TensorId],
        tied: Option<&[ParamId]>,
    ) -> Result<TensorId, ZooError> {
        if let Some(&t) = inputs.iter().find(|&&t| t >= self.net.tensors.len()) {
            return Err(ZooError::Shape { op: kind.name(), why: format!("`{name}`: unknown input tensor {t}") });
        }
        let operands: Vec<Operand> = inputs
            .iter()
            .map(|&t| Operand { shape: self.net.tensors[t].shape.clone(), elem: self.net.tensors[t].elem })
            .collect();
        let decl = kind.declare(&operands).map_err(|e| match e {
            ZooError::Shape { op, why } => ZooError::Shape { op, why: format!("`{name}`: {why}") },
            other => other,
        })?;
        let params = match tied {
            Some(p) => {
                let shapes: Vec<&Shape> = p.iter().map(|&i| &self.net.params[i].shape).collect();
                let want: Vec<&Shape> = decl.params.iter().map(|(_, s)| s).collect();
                if shapes != want {
                    return Err(ZooError::Shape {
                        op: kind.name(),
                        why: format!("`{name}`: tied parameters {shapes:?} do not match {want:?}"),
                    });
                }
                p.to_vec()
            }
            None => decl
                .params
                .iter()
                .map(|(suffix, shape)| {
                    self.net.params.push(NetParam { name: format!("{name}.{suffix}"), shape: shape.clone() });
                    self.net.params.len() - 1
                })
                .collect(),
        };
        let requires_grad = !params.is_empty() || inputs.iter().any(|&t| self.net.tensors[t].requires_grad);
        let view_of = if decl.view { Some(self.root(inputs[0])) } else { None };
        let op_index = self.net.ops.len();
        self.net.tensors.push(NetTensor {
            name: name.into(),
            shape: decl.output.clone(),
            elem: decl.output_elem,
            producer: Some(op_index),
            requires_grad,
            view_of,
        });
        let output = self.net.tensors.len() - 1;
        if !decl.view {
            self.stage_used = true;
        }
        self.net.ops.push(NetOp {
            name: name.into(),
            kind,
            inputs: inputs.to_vec(),
            output,
            params,
            stage: self.stage,
            decl,
        });
        Ok(output)
    }

    fn root(&self, mut t: TensorId) -> TensorId {
        while let Some(r) = self.net.tensors[t].view_of {
            t = r;
        }
        t
    }

    /// Adds the loss (cross-entropy or MSE). It must be the last op.
    pub fn loss(&mut self, name: &str, kind: OpKind, inputs: &[TensorId]) -> Result<(), ZooError> {
        let t = self.add(name, kind, inputs, None)?;
        if !self.net.ops.last().expect("just added").decl.loss {
            return Err(ZooError::Shape {
                op: self.net.ops[self.net.tensors[t].producer.expect("op")].kind.name(),
                why: format!("`{name}` is not a loss"),
            });
        }
        Ok(())
    }

    /// The finished network. It must end with exactly one loss.
    pub fn finish(self) -> Result<Network, ZooError> {
        let losses = self.net.ops.iter().filter(|o| o.decl.loss).count();
        if losses != 1 || !self.net.ops.last().is_some_and(|o| o.decl.loss) {
            return Err(ZooError::Shape {
                op: "loss",
                why: format!("network `{}` must end with exactly one loss", self.net.name),
            });
        }
        Ok(self.net)
    }
}

impl Network {
    /// Number of parameters (each tied parameter once).
    pub fn param_count(&self) -> u64 {
        self.params.iter().map(|p| p.shape.iter().product::<usize>() as u64).sum()
    }

    /// Number of blocks (chain stages).
    pub fn stages(&self) -> usize {
        self.ops.iter().filter(|o| !o.decl.view && !o.decl.loss).map(|o| o.stage + 1).max().unwrap_or(0)
    }

    /// Bytes of one element.
    pub fn elem_bytes(&self, elem: Elem) -> u64 {
        match elem {
            Elem::Float => self.dtype.bytes(),
            Elem::Int => self.int_bytes,
            Elem::Byte => 1,
        }
    }

    /// Bytes of a tensor of this shape and element type.
    pub fn bytes(&self, shape: &[usize], elem: Elem) -> u64 {
        shape.iter().product::<usize>() as u64 * self.elem_bytes(elem)
    }

    /// Bytes of every tensor and parameter, each once, counted without overflow: what
    /// [`Model::from_network`](crate::Model::from_network) bounds before any `u64` sum.
    pub fn step_bytes(&self) -> u128 {
        let bytes = |shape: &[usize], elem: Elem| {
            shape.iter().fold(self.elem_bytes(elem) as u128, |n, &d| n.saturating_mul(d as u128))
        };
        let tensors = self.tensors.iter().map(|t| bytes(&t.shape, t.elem));
        let params = self.params.iter().map(|p| bytes(&p.shape, Elem::Float));
        tensors.chain(params).fold(0u128, u128::saturating_add)
    }

    /// FLOPs of one training step (forward and backward of every op).
    pub fn flops(&self) -> f64 {
        self.ops.iter().map(|o| o.decl.forward_flops + o.decl.backward_flops).sum()
    }

    /// The memory that views share: the tensor that owns `t`'s memory.
    pub fn root(&self, mut t: TensorId) -> TensorId {
        while let Some(r) = self.tensors[t].view_of {
            t = r;
        }
        t
    }

    /// Lowers the network to the forward+backward training graph, timing each node with
    /// `cost` and sizing each parameter's static memory as `memory` says: an
    /// [`Optimizer`](crate::Optimizer) (full training, its states in the model's float
    /// type) or a [`ParamMemory`] (mixed precision's fp32 master copy, partial training).
    pub fn training_graph(&self, cost: &dyn OpCosts, memory: impl Into<ParamMemory>) -> TrainingGraph {
        self.training_graph_indexed(cost, memory).0
    }

    /// Lowers the network with any [`OpCosts`], and says where each tensor landed.
    ///
    /// Per parameter, a `Parameter` node of the whole tensor, a `ParamGrad` node and
    /// (unless the optimizer keeps no state and there is no master copy) an `OptimizerState` node sized as [`ParamMemory`]
    /// says. Times do not depend on `memory`: partial training keeps the backward's time.
    pub fn training_graph_indexed(
        &self,
        cost: &dyn OpCosts,
        memory: impl Into<ParamMemory>,
    ) -> (TrainingGraph, GraphIndex) {
        let memory: ParamMemory = memory.into();
        let mut lowering = Lowering::new(self);
        lowering.tensor_nodes();
        lowering.param_nodes(&memory);
        lowering.forward_nodes(cost);
        lowering.loss_node(cost);
        lowering.backward_nodes(cost);
        lowering.finish()
    }

    fn is_loss_output(&self, t: TensorId) -> bool {
        self.tensors[t].producer.is_some_and(|o| self.ops[o].decl.loss)
    }
}

/// A training graph being lowered from a network, step by step: its nodes so far and
/// where each tensor and op landed.
struct Lowering<'a> {
    /// The network lowered.
    net: &'a Network,
    /// Data nodes so far.
    data: Vec<DataNode>,
    /// Compute nodes so far.
    compute: Vec<ComputeNode>,
    /// Where each tensor, parameter and op landed so far.
    index: GraphIndex,
}

impl<'a> Lowering<'a> {
    fn new(net: &'a Network) -> Lowering<'a> {
        let index = GraphIndex {
            tensor: Vec::new(),
            grad: Vec::new(),
            param: Vec::new(),
            param_grad: Vec::new(),
            extras: Vec::new(),
            forward: Vec::new(),
            backward: Vec::new(),
            loss: usize::MAX,
            data: 0,
        };
        Lowering { net, data: Vec::new(), compute: Vec::new(), index }
    }

    /// Adds a data node and returns its index.
    fn push(&mut self, name: String, kind: DataKind, size: u64) -> usize {
        self.data.push(DataNode { name, kind, size });
        self.data.len() - 1
    }

    /// The forward tensors' data nodes (roots only: views share their root's node), then
    /// the gradients of those that take one.
    fn tensor_nodes(&mut self) {
        let net = self.net;
        let mut tensor_node = vec![usize::MAX; net.tensors.len()];
        for (t, tensor) in net.tensors.iter().enumerate() {
            if tensor.view_of.is_none() && !net.is_loss_output(t) {
                let kind = if tensor.producer.is_none() { DataKind::Input } else { DataKind::Activation };
                tensor_node[t] = self.push(tensor.name.clone(), kind, net.bytes(&tensor.shape, tensor.elem));
            }
        }
        for t in 0..net.tensors.len() {
            if net.tensors[t].view_of.is_some() {
                tensor_node[t] = tensor_node[net.root(t)];
            }
        }
        let mut grad_node = vec![usize::MAX; net.tensors.len()];
        for (t, tensor) in net.tensors.iter().enumerate() {
            if tensor.view_of.is_none() && tensor.requires_grad && !net.is_loss_output(t) {
                grad_node[t] = self.push(
                    format!("{}.grad", tensor.name),
                    DataKind::Gradient,
                    net.bytes(&tensor.shape, tensor.elem),
                );
            }
        }
        for t in 0..net.tensors.len() {
            if net.tensors[t].view_of.is_some() {
                grad_node[t] = grad_node[net.root(t)];
            }
        }
        self.index.tensor = tensor_node;
        self.index.grad = grad_node;
    }

    /// Per parameter, its `Parameter`, `ParamGrad` and (where `memory` keeps any)
    /// `OptimizerState` data nodes.
    fn param_nodes(&mut self, memory: &ParamMemory) {
        let net = self.net;
        let float = net.elem_bytes(Elem::Float);
        let states = memory.optimizer.states_per_param();
        let optimizer = memory.optimizer.name();
        // An fp32 master copy only where the weights are narrower than fp32.
        let master = memory.master_weights && float < 4;
        for p in &net.params {
            let elements = p.shape.iter().product::<usize>() as u64;
            let trainable = memory.trainable_elements(elements);
            let param = self.push(p.name.clone(), DataKind::Parameter, elements * float);
            self.index.param.push(param);
            let grad = self.push(format!("{}.grad", p.name), DataKind::ParamGrad, trainable * float);
            self.index.param_grad.push(grad);
            let (name, size) = match (master, states) {
                (true, 0) => (format!("{}.master", p.name), trainable * 4),
                (true, _) => (format!("{}.master+{optimizer}", p.name), trainable * (1 + states) * 4),
                (false, _) => (format!("{}.{optimizer}", p.name), trainable * states * float),
            };
            if master || states > 0 {
                self.push(name, DataKind::OptimizerState, size);
            }
        }
    }

    /// One forward compute node per op that is neither a view nor the loss, with a data
    /// node per saved extra it outputs.
    fn forward_nodes(&mut self, cost: &dyn OpCosts) {
        let net = self.net;
        self.index.forward = vec![usize::MAX; net.ops.len()];
        self.index.extras = vec![Vec::new(); net.ops.len()];
        for (o, op) in net.ops.iter().enumerate() {
            if op.decl.view || op.decl.loss {
                continue;
            }
            let mut outputs = vec![self.index.tensor[op.output]];
            for s in &op.decl.saved {
                if let Saved::Extra { name, shape, elem } = s {
                    let id = self.push(format!("{}.{name}", op.name), DataKind::Saved, net.bytes(shape, *elem));
                    self.index.extras[o].push(id);
                    outputs.push(id);
                }
            }
            let mut inputs: Vec<usize> = op.inputs.iter().map(|&t| self.index.tensor[t]).collect();
            inputs.extend(op.params.iter().map(|&p| self.index.param[p]));
            dedup(&mut inputs);
            self.index.forward[o] = self.compute.len();
            let (time, tmp) = cost.forward(net, o);
            self.compute.push(ComputeNode {
                name: op.name.clone(),
                kind: ComputeKind::Forward,
                time,
                tmp,
                inputs,
                outputs,
                op: Some(op.kind.name().to_string()),
                forward: None,
                stage: Some(op.stage),
            });
        }
    }

    /// The loss's compute node (forward and backward at once): it reads the loss's inputs
    /// and writes the gradients of those that take one.
    fn loss_node(&mut self, cost: &dyn OpCosts) {
        let net = self.net;
        let loss = net.ops.last().expect("a network ends with its loss");
        let mut loss_inputs: Vec<usize> = loss.inputs.iter().map(|&t| self.index.tensor[t]).collect();
        dedup(&mut loss_inputs);
        let mut loss_outputs: Vec<usize> =
            loss.inputs.iter().filter(|&&t| net.tensors[t].requires_grad).map(|&t| self.index.grad[t]).collect();
        dedup(&mut loss_outputs);
        self.index.loss = self.compute.len();
        let (time, tmp) = cost.backward(net, net.ops.len() - 1);
        self.compute.push(ComputeNode {
            name: loss.name.clone(),
            kind: ComputeKind::Loss,
            time,
            tmp,
            inputs: loss_inputs,
            outputs: loss_outputs,
            op: Some(loss.kind.name().to_string()),
            forward: None,
            stage: None,
        });
    }

    /// One backward compute node per op whose output takes a gradient, in reverse order:
    /// it reads the output's gradient and what the op saved, and writes the gradients of
    /// its inputs and parameters.
    fn backward_nodes(&mut self, cost: &dyn OpCosts) {
        let net = self.net;
        let index = &mut self.index;
        index.backward = vec![usize::MAX; net.ops.len()];
        for (o, op) in net.ops.iter().enumerate().rev() {
            if op.decl.view || op.decl.loss || !net.tensors[op.output].requires_grad {
                continue;
            }
            let mut inputs = vec![index.grad[op.output]];
            let mut extras = index.extras[o].iter();
            for s in &op.decl.saved {
                inputs.push(match s {
                    Saved::Input(k) => index.tensor[op.inputs[*k]],
                    Saved::Output => index.tensor[op.output],
                    Saved::Extra { .. } => *extras.next().expect("one node per extra"),
                });
            }
            if op.decl.backward_reads_params {
                inputs.extend(op.params.iter().map(|&p| index.param[p]));
            }
            dedup(&mut inputs);
            let mut outputs: Vec<usize> =
                op.inputs.iter().filter(|&&t| net.tensors[t].requires_grad).map(|&t| index.grad[t]).collect();
            outputs.extend(op.params.iter().map(|&p| index.param_grad[p]));
            dedup(&mut outputs);
            index.backward[o] = self.compute.len();
            let (time, tmp) = cost.backward(net, o);
            self.compute.push(ComputeNode {
                name: format!("{}.bwd", op.name),
                kind: ComputeKind::Backward,
                time,
                tmp,
                inputs,
                outputs,
                op: Some(op.kind.name().to_string()),
                forward: Some(index.forward[o]),
                stage: Some(op.stage),
            });
        }
    }

    /// The graph and its index.
    fn finish(mut self) -> (TrainingGraph, GraphIndex) {
        self.index.data = self.data.len();
        let graph = TrainingGraph {
            name: Some(self.net.name.clone()),
            compute: self.compute,
            data: self.data,
            param_grads_from_backward: false,
        };
        (graph, self.index)
    }
}

fn dedup(v: &mut Vec<usize>) {
    let mut seen = std::collections::HashSet::new();
    v.retain(|x| seen.insert(*x));
}
