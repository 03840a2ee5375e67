//! ONNX graph → intermediate ops with inferred shapes → zoo [`Network`].
//!
//! Translation walks the graph's nodes in their (topological) order. Each value is a
//! tensor of the forward pass, a constant (an initializer, a `Constant` or
//! `ConstantOfShape` output, or a view of one), or a graph input not yet used. Constants
//! in a weight slot become the parameters of the op that reads them; small integer
//! constants keep their values so that shape arithmetic (`Shape`, `Gather`, `Concat`,
//! `Reshape`) folds away. Every op is declared with [`OpKind::declare`] as it is added,
//! so shapes are exact even when the file carries none. The ops are then grouped into
//! stages at sequential cut points and handed to a [`NetBuilder`](pebble_zoo::NetBuilder).
//!
//! This file holds the entry points, the intermediate representation, the helpers every
//! part uses (attributes, element types, element counts) and the dispatch from an ONNX
//! op type to its translation; the rest is split by concern, each part an
//! `impl Importer` block (only `ops` and `views` use another part, `shapes`, by name):
//!
//! * `values`: looking values up, materializing graph inputs, adding ops.
//! * `shapes`: shape arithmetic (the batch of the inputs, `Reshape` targets,
//!   convolution and pooling windows, per-channel broadcasts).
//! * `weights`: constants (initializers, `Constant`, `ConstantOfShape`, graph inputs
//!   read as weights) and their decoding.
//! * `ops`: the nodes that become zoo ops, one function per op family.
//! * `views`: the nodes that only view, alias or fold (`Reshape`, `Flatten`,
//!   `Squeeze`, `Unsqueeze`, `Transpose`, `Cast`, `Identity`, `Shape`).
//! * `stages`: the loss, the cut into stages
//!   ([`single_crossing_cuts`](pebble_graph::cut::single_crossing_cuts)), and the
//!   hand-over to the [`NetBuilder`](pebble_zoo::NetBuilder).

mod ops;
mod shapes;
mod stages;
mod values;
mod views;
mod weights;

use std::collections::{HashMap, HashSet};
use std::path::Path;

use pebble_zoo::ops::{Elem, Shape};
use pebble_zoo::{Network, OpKind};
use prost::Message;

use crate::error::OnnxError;
use crate::proto::{data_type, AttributeProto, GraphProto, ModelProto, NodeProto};
use crate::ImportOptions;

/// Imports an ONNX file; the network is named after the file's stem.
pub fn import_file(path: &Path, options: &ImportOptions) -> Result<Network, OnnxError> {
    let bytes = std::fs::read(path).map_err(|source| OnnxError::Io { path: path.to_path_buf(), source })?;
    let name = path.file_stem().map_or_else(|| "onnx".to_string(), |s| s.to_string_lossy().into_owned());
    import_bytes(&bytes, &name, options)
}

/// Imports an ONNX model from its bytes, naming the network `name`.
pub fn import_bytes(bytes: &[u8], name: &str, options: &ImportOptions) -> Result<Network, OnnxError> {
    let model = ModelProto::decode(bytes).map_err(|e| OnnxError::Decode(e.to_string()))?;
    import_model(&model, name, options)
}

/// The known values of a small constant.
#[derive(Debug, Clone, PartialEq)]
enum Data {
    Int(Vec<i64>),
    Float(Vec<f64>),
}

/// A constant: its shape, its values when small, and the weight it comes from (views
/// of a weight keep its identity, so that two ops reading it share one parameter).
#[derive(Debug, Clone)]
struct Const {
    shape: Shape,
    elem: Elem,
    data: Option<Data>,
    weight: usize,
}

/// What a name in the graph stands for.
#[derive(Debug, Clone)]
enum Value {
    /// A tensor of the forward pass.
    Tensor(usize),
    /// A constant.
    Const(Const),
    /// A graph input not used yet: a tensor of the step if read as data, a parameter if
    /// read as a weight.
    Input(usize),
}

/// A tensor of the forward pass: a graph input or an op's output.
#[derive(Debug)]
struct IrTensor {
    name: String,
    shape: Shape,
    elem: Elem,
    /// The op producing it; `None` for an input of the step.
    producer: Option<usize>,
    /// The tensor whose memory it shares (itself unless a view).
    root: usize,
}

/// An op of the forward pass, as it will be handed to the [`NetBuilder`](pebble_zoo::NetBuilder).
#[derive(Debug)]
struct IrOp {
    name: String,
    kind: OpKind,
    inputs: Vec<usize>,
    output: usize,
    /// The weights bound to the declaration's parameters, in order.
    params: Vec<usize>,
}

/// The node being translated, for error messages.
#[derive(Clone)]
struct Ctx {
    node: String,
    op: String,
}

impl Ctx {
    fn err(&self, why: impl Into<String>) -> OnnxError {
        OnnxError::Node { node: self.node.clone(), op: self.op.clone(), why: why.into() }
    }
    fn unsupported(&self, why: impl Into<String>) -> OnnxError {
        OnnxError::Unsupported { node: self.node.clone(), op: self.op.clone(), why: why.into() }
    }
}

fn attr<'n>(node: &'n NodeProto, name: &str) -> Option<&'n AttributeProto> {
    node.attribute.iter().find(|a| a.name == name)
}

fn attr_int(node: &NodeProto, name: &str) -> Option<i64> {
    attr(node, name).map(|a| a.i)
}

fn attr_ints(node: &NodeProto, name: &str) -> Option<Vec<i64>> {
    attr(node, name).map(|a| a.ints.clone())
}

fn attr_float(node: &NodeProto, name: &str) -> Option<f64> {
    attr(node, name).map(|a| a.f as f64)
}

fn attr_str(node: &NodeProto, name: &str) -> Option<String> {
    attr(node, name).map(|a| String::from_utf8_lossy(&a.s).into_owned())
}

/// The largest tensor a file may declare (2⁴⁰ elements): beyond, a file is taken as
/// malformed rather than risking overflow in size and FLOP arithmetic.
const MAX_ELEMENTS: usize = 1 << 40;

/// Whether a tensor of `shape` is beyond [`MAX_ELEMENTS`] (or overflows).
fn too_large(shape: &[usize]) -> bool {
    numel(shape).is_none_or(|n| n > MAX_ELEMENTS)
}

/// The number of elements of `shape`; `None` on overflow.
fn numel(shape: &[usize]) -> Option<usize> {
    shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d))
}

/// The element type of an ONNX data type.
fn elem_of(data_type: i32) -> Option<Elem> {
    match data_type {
        data_type::FLOAT | data_type::FLOAT16 | data_type::DOUBLE | data_type::BFLOAT16 => Some(Elem::Float),
        data_type::BOOL | data_type::UINT8 | data_type::INT8 => Some(Elem::Byte),
        // int16, int32, int64, uint16, uint32, uint64.
        4 | 5 | data_type::INT32 | data_type::INT64 | 12 | 13 => Some(Elem::Int),
        _ => None,
    }
}

/// Translates one graph.
struct Importer<'a> {
    options: &'a ImportOptions,
    opset: i64,
    graph: &'a GraphProto,
    values: HashMap<String, Value>,
    /// How many live nodes (and the loss) read each value.
    uses: HashMap<String, usize>,
    tensors: Vec<IrTensor>,
    inputs: Vec<usize>,
    ops: Vec<IrOp>,
    /// Weight names (initializers, constants, graph inputs read as weights).
    weights: Vec<String>,
    /// The first dimension of the data inputs as the file gives it, and as used.
    file_batch: Option<usize>,
    batch: Option<usize>,
}

/// Imports a decoded model.
fn import_model(model: &ModelProto, name: &str, options: &ImportOptions) -> Result<Network, OnnxError> {
    let graph = model.graph.as_ref().ok_or_else(|| OnnxError::Malformed("the model has no graph".into()))?;
    let opset = model
        .opset_import
        .iter()
        .find(|o| o.domain.is_empty() || o.domain == "ai.onnx")
        .map(|o| o.version)
        // IR version 1 files have no opset import: operator set 1.
        .unwrap_or(1);
    let output = graph.output.first().ok_or_else(|| OnnxError::Malformed("the graph has no output".into()))?;
    let logits = logits_name(graph, &output.name);
    let (live, uses) = live_nodes(graph, &logits);
    let mut im = Importer {
        options,
        opset,
        graph,
        values: HashMap::new(),
        uses,
        tensors: Vec::new(),
        inputs: Vec::new(),
        ops: Vec::new(),
        weights: Vec::new(),
        file_batch: None,
        batch: None,
    };
    im.initializers()?;
    for (i, input) in graph.input.iter().enumerate() {
        // IR < 4 lists initializers among the inputs too: the initializer wins.
        im.values.entry(input.name.clone()).or_insert(Value::Input(i));
    }
    for (i, node) in graph.node.iter().enumerate() {
        if live[i] {
            im.node(i, node)?;
        }
    }
    let t = im.logits(&logits)?;
    im.emit(name, t)
}

/// The value the loss reads: the graph's output, or the input of a trailing softmax.
fn logits_name(graph: &GraphProto, output: &str) -> String {
    let producer: HashMap<&str, usize> =
        graph.node.iter().enumerate().flat_map(|(i, n)| n.output.iter().map(move |o| (o.as_str(), i))).collect();
    // A classifier's trailing softmax is the inference head: the loss (cross-entropy,
    // which applies log-softmax itself) reads the logits before it.
    let mut logits = output.to_string();
    if let Some(&i) = producer.get(logits.as_str()) {
        let n = &graph.node[i];
        if (n.op_type == "Softmax" || n.op_type == "LogSoftmax") && (n.domain.is_empty() || n.domain == "ai.onnx") {
            if let Some(x) = n.input.first() {
                logits = x.clone();
            }
        }
    }
    logits
}

/// Which nodes the logits depend on (auxiliary heads and other outputs are dropped), and
/// how many of those nodes (and the loss) read each value.
fn live_nodes(graph: &GraphProto, logits: &str) -> (Vec<bool>, HashMap<String, usize>) {
    let mut live_names: HashSet<&str> = HashSet::from([logits]);
    let mut live = vec![false; graph.node.len()];
    for (i, n) in graph.node.iter().enumerate().rev() {
        if n.output.iter().any(|o| live_names.contains(o.as_str())) {
            live[i] = true;
            live_names.extend(n.input.iter().filter(|s| !s.is_empty()).map(String::as_str));
        }
    }
    let mut uses: HashMap<String, usize> = HashMap::new();
    for (i, n) in graph.node.iter().enumerate() {
        if live[i] {
            for x in n.input.iter().filter(|s| !s.is_empty()) {
                *uses.entry(x.clone()).or_default() += 1;
            }
        }
    }
    *uses.entry(logits.to_string()).or_default() += 1;
    (live, uses)
}

impl Importer<'_> {
    /// Translates one node.
    fn node(&mut self, index: usize, node: &NodeProto) -> Result<(), OnnxError> {
        let name = if !node.name.is_empty() {
            node.name.clone()
        } else {
            node.output.first().filter(|o| !o.is_empty()).cloned().unwrap_or_else(|| format!("#{index}"))
        };
        let ctx = Ctx { node: name.clone(), op: node.op_type.clone() };
        if !(node.domain.is_empty() || node.domain == "ai.onnx") {
            return Err(OnnxError::UnsupportedOp { node: name, op: node.op_type.clone(), domain: node.domain.clone() });
        }
        if node.output.first().is_none_or(|o| o.is_empty()) {
            return Err(ctx.err("it has no output"));
        }
        match node.op_type.as_str() {
            "Conv" => self.conv(&ctx, node),
            "ConvTranspose" => self.conv_transpose(&ctx, node),
            "MaxPool" | "AveragePool" => self.pool(&ctx, node),
            "GlobalAveragePool" => self.global_average_pool(&ctx, node),
            "BatchNormalization" | "SpatialBN" => self.batch_norm(&ctx, node),
            "LayerNormalization" => self.layer_norm(&ctx, node),
            "Relu" | "Gelu" => self.activation(&ctx, node),
            "LRN" => self.lrn(&ctx, node),
            "Dropout" => self.dropout(&ctx, node),
            "Gemm" => self.gemm(&ctx, node),
            "MatMul" => self.matmul(&ctx, node),
            "Add" | "Mul" => self.binary(&ctx, node),
            "Sum" => self.sum(&ctx, node),
            "Concat" => self.concat(&ctx, node),
            "Softmax" => self.softmax(&ctx, node),
            "Identity" => self.identity(&ctx, node),
            "Reshape" => self.reshape(&ctx, node),
            "Flatten" => self.flatten(&ctx, node),
            "Squeeze" | "Unsqueeze" => self.squeeze(&ctx, node),
            "Transpose" => self.transpose(&ctx, node),
            "Split" => self.split(&ctx, node),
            "Cast" => self.cast(&ctx, node),
            "Constant" => self.constant_node(&ctx, node),
            "ConstantOfShape" => self.constant_of_shape(&ctx, node),
            "Shape" => self.shape(&ctx, node),
            "Gather" => self.gather(&ctx, node),
            _ => Err(OnnxError::UnsupportedOp { node: name, op: node.op_type.clone(), domain: node.domain.clone() }),
        }
    }
}
