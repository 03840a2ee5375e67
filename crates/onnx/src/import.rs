//! ONNX graph → intermediate ops with inferred shapes → zoo [`Network`].
//!
//! Translation walks the graph's nodes in their (topological) order. Each value is a
//! tensor of the forward pass, a constant (an initializer, a `Constant` or
//! `ConstantOfShape` output, or a view of one), or a graph input not yet used. Constants
//! in a weight slot become the parameters of the op that reads them; small integer
//! constants keep their values so that shape arithmetic (`Shape`, `Gather`, `Concat`,
//! `Reshape`) folds away. Every op is declared with [`OpKind::declare`] as it is added,
//! so shapes are exact even when the file carries none. The ops are then grouped into
//! stages at sequential cut points and handed to a [`NetBuilder`].

use std::collections::{HashMap, HashSet};

use pebble_zoo::ops::{Elem, Operand, Shape};
use pebble_zoo::{NetBuilder, Network, OpKind, ParamId};

use crate::error::OnnxError;
use crate::proto::{
    data_type, AttributeProto, DimensionValue, GraphProto, ModelProto, NodeProto, TensorProto, ValueInfoProto,
};
use crate::ImportOptions;

/// Constants up to this many elements keep their values (shapes, axes, scalars).
const KEEP_VALUES: usize = 4096;

/// The largest tensor a file may declare (2⁴⁰ elements): beyond, a file is taken as
/// malformed rather than risking overflow in size and FLOP arithmetic.
const MAX_ELEMENTS: usize = 1 << 40;

fn too_large(shape: &[usize]) -> bool {
    numel(shape).is_none_or(|n| n > MAX_ELEMENTS)
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

#[derive(Debug)]
struct IrOp {
    name: String,
    kind: OpKind,
    inputs: Vec<usize>,
    output: usize,
    /// The weights bound to the declaration's parameters, in order.
    params: Vec<usize>,
    view: bool,
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

fn numel(shape: &[usize]) -> Option<usize> {
    shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d))
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

/// A `TensorProto`'s shape, element type and (when small and stored inline) values.
fn decode_tensor(t: &TensorProto) -> Result<(Shape, Elem, Option<Data>), String> {
    let mut shape = Vec::with_capacity(t.dims.len());
    for &d in &t.dims {
        shape.push(usize::try_from(d).map_err(|_| format!("negative dimension {d} in {:?}", t.dims))?);
    }
    let n = numel(&shape).filter(|_| !too_large(&shape)).ok_or_else(|| format!("shape {shape:?} is too large"))?;
    let elem = elem_of(t.data_type).ok_or_else(|| format!("data type {} is not supported", t.data_type))?;
    if n > KEEP_VALUES || t.data_location == 1 {
        return Ok((shape, elem, None));
    }
    let raw = &t.raw_data;
    let data = match (elem, t.data_type) {
        (Elem::Float, _) if !t.float_data.is_empty() => {
            Some(Data::Float(t.float_data.iter().map(|&v| v as f64).collect()))
        }
        (Elem::Float, _) if !t.double_data.is_empty() => Some(Data::Float(t.double_data.clone())),
        (Elem::Float, data_type::FLOAT) if !raw.is_empty() => Some(Data::Float(
            raw.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64).collect(),
        )),
        (Elem::Float, data_type::DOUBLE) if !raw.is_empty() => Some(Data::Float(
            raw.chunks_exact(8).map(|c| f64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]])).collect(),
        )),
        (Elem::Int, _) if !t.int64_data.is_empty() => Some(Data::Int(t.int64_data.clone())),
        (Elem::Int, _) if !t.int32_data.is_empty() => Some(Data::Int(t.int32_data.iter().map(|&v| v as i64).collect())),
        (Elem::Int, data_type::INT64) if !raw.is_empty() => Some(Data::Int(
            raw.chunks_exact(8).map(|c| i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]])).collect(),
        )),
        (Elem::Int, data_type::INT32) if !raw.is_empty() => {
            Some(Data::Int(raw.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as i64).collect()))
        }
        _ => None,
    };
    let count = match &data {
        Some(Data::Int(v)) => v.len(),
        Some(Data::Float(v)) => v.len(),
        None => n,
    };
    if count != n {
        return Err(format!("{count} values for shape {shape:?}"));
    }
    Ok((shape, elem, data))
}

fn normalize_axis(axis: i64, rank: usize) -> Option<usize> {
    let r = rank as i64;
    let a = if axis < 0 { axis + r } else { axis };
    (0..r).contains(&a).then_some(a as usize)
}

/// Convolution and pooling windows: kernel, strides, padding (top, left, bottom, right).
struct Window {
    kernel: [usize; 2],
    stride: [usize; 2],
    pads: [usize; 4],
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
pub(crate) fn import(model: &ModelProto, name: &str, options: &ImportOptions) -> Result<Network, OnnxError> {
    let graph = model.graph.as_ref().ok_or_else(|| OnnxError::Malformed("the model has no graph".into()))?;
    let opset = model
        .opset_import
        .iter()
        .find(|o| o.domain.is_empty() || o.domain == "ai.onnx")
        .map(|o| o.version)
        // IR version 1 files have no opset import: operator set 1.
        .unwrap_or(1);
    let output = graph.output.first().ok_or_else(|| OnnxError::Malformed("the graph has no output".into()))?;
    let producer: HashMap<&str, usize> =
        graph.node.iter().enumerate().flat_map(|(i, n)| n.output.iter().map(move |o| (o.as_str(), i))).collect();
    // A classifier's trailing softmax is the inference head: the loss (cross-entropy,
    // which applies log-softmax itself) reads the logits before it.
    let mut logits = output.name.clone();
    if let Some(&i) = producer.get(logits.as_str()) {
        let n = &graph.node[i];
        if (n.op_type == "Softmax" || n.op_type == "LogSoftmax") && (n.domain.is_empty() || n.domain == "ai.onnx") {
            if let Some(x) = n.input.first() {
                logits = x.clone();
            }
        }
    }
    // Only the nodes the logits depend on (auxiliary heads and other outputs are dropped).
    let mut live_names: HashSet<&str> = HashSet::from([logits.as_str()]);
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
    *uses.entry(logits.clone()).or_default() += 1;

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
    for t in &graph.initializer {
        let (shape, elem, data) =
            decode_tensor(t).map_err(|why| OnnxError::Malformed(format!("initializer `{}`: {why}", t.name)))?;
        let weight = im.weight(&t.name);
        im.values.insert(t.name.clone(), Value::Const(Const { shape, elem, data, weight }));
    }
    for (i, input) in graph.input.iter().enumerate() {
        // IR < 4 lists initializers among the inputs too: the initializer wins.
        im.values.entry(input.name.clone()).or_insert(Value::Input(i));
    }
    for (i, node) in graph.node.iter().enumerate() {
        if live[i] {
            im.node(i, node)?;
        }
    }
    let ctx = Ctx { node: logits.clone(), op: "output".into() };
    let t = match im.values.get(&logits) {
        Some(Value::Tensor(t)) => *t,
        Some(Value::Input(_)) => im.tensor_named(&ctx, &logits)?,
        Some(Value::Const(_)) => {
            return Err(OnnxError::Malformed(format!("the output `{logits}` is a constant: nothing to train")))
        }
        None => return Err(OnnxError::Malformed(format!("no node produces the output `{logits}`"))),
    };
    let shape = im.tensors[t].shape.clone();
    if im.tensors[t].elem != Elem::Float || shape.len() < 2 || shape.contains(&0) {
        return Err(OnnxError::Malformed(format!(
            "the output `{logits}` has shape {shape:?}: a loss needs float logits [N, classes, ...]"
        )));
    }
    im.emit(name, t)
}

impl<'a> Importer<'a> {
    fn weight(&mut self, name: &str) -> usize {
        self.weights.push(name.to_string());
        self.weights.len() - 1
    }

    fn opt_input(node: &NodeProto, k: usize) -> Option<&str> {
        node.input.get(k).map(String::as_str).filter(|s| !s.is_empty())
    }

    fn lookup(&self, ctx: &Ctx, name: &str) -> Result<Value, OnnxError> {
        self.values.get(name).cloned().ok_or_else(|| {
            ctx.err(format!("input `{name}` is not a graph input, an initializer, nor the output of an earlier node"))
        })
    }

    fn is_const(&self, name: &str) -> bool {
        matches!(self.values.get(name), Some(Value::Const(_)))
    }

    /// The declared shape of graph input `i`, the batch applied to its first dimension.
    fn input_shape(&mut self, i: usize) -> Result<(Shape, Elem), OnnxError> {
        let info: &ValueInfoProto = &self.graph.input[i];
        let bad = |why: String| OnnxError::Input { input: info.name.clone(), why };
        let tensor =
            info.r#type.as_ref().and_then(|t| t.tensor_type.as_ref()).ok_or_else(|| bad("not a tensor".into()))?;
        let elem = elem_of(tensor.elem_type)
            .ok_or_else(|| bad(format!("element type {} is not supported", tensor.elem_type)))?;
        let dims = &tensor.shape.as_ref().ok_or_else(|| bad("its shape is not given".into()))?.dim;
        let mut shape = Vec::with_capacity(dims.len());
        for (k, d) in dims.iter().enumerate() {
            let v = match &d.value {
                Some(DimensionValue::DimValue(v)) if *v > 0 => Some(*v as usize),
                Some(DimensionValue::DimValue(v)) => return Err(bad(format!("dimension {k} is {v}"))),
                _ => None,
            };
            let what = match &d.value {
                Some(DimensionValue::DimParam(p)) if !p.is_empty() => format!("symbolic (`{p}`)"),
                _ => "unknown".to_string(),
            };
            shape.push(match (k, v) {
                (0, _) => v.unwrap_or(0),
                (_, Some(v)) => v,
                (_, None) => return Err(bad(format!("dimension {k} is {what}: only the batch dimension may be"))),
            });
            if k == 0 {
                if v.is_some() {
                    self.file_batch.get_or_insert(shape[0]);
                }
                match (self.options.batch, v) {
                    (Some(0), _) => return Err(bad("the batch size must be positive".into())),
                    (Some(b), _) => shape[0] = b,
                    (None, Some(_)) => {}
                    (None, None) => {
                        return Err(bad(format!("its batch dimension is {what}: give a batch size")));
                    }
                }
                self.batch.get_or_insert(shape[0]);
            }
        }
        if too_large(&shape) {
            return Err(bad(format!("shape {shape:?} is too large")));
        }
        Ok((shape, elem))
    }

    /// A tensor of the forward pass named `name` (materializing a graph input).
    fn tensor_named(&mut self, ctx: &Ctx, name: &str) -> Result<usize, OnnxError> {
        match self.lookup(ctx, name)? {
            Value::Tensor(t) => Ok(t),
            Value::Input(i) => {
                let (shape, elem) = self.input_shape(i)?;
                let t = self.tensors.len();
                self.tensors.push(IrTensor { name: name.to_string(), shape, elem, producer: None, root: t });
                self.inputs.push(t);
                self.values.insert(name.to_string(), Value::Tensor(t));
                Ok(t)
            }
            Value::Const(c) => Err(ctx.unsupported(format!(
                "input `{name}` is a constant of shape {:?}: constants are supported as weights (of Conv, Gemm, \
                 MatMul, BatchNormalization, per-channel Mul/Add, ...) and in shape arithmetic only",
                c.shape
            ))),
        }
    }

    fn tensor(&mut self, ctx: &Ctx, node: &NodeProto, k: usize) -> Result<usize, OnnxError> {
        let name = Self::opt_input(node, k).ok_or_else(|| ctx.err(format!("input {k} is missing")))?;
        self.tensor_named(ctx, name)
    }

    /// A constant named `name` (a graph input read as a weight becomes one).
    fn const_named(&mut self, ctx: &Ctx, name: &str) -> Result<Const, OnnxError> {
        match self.lookup(ctx, name)? {
            Value::Const(c) => Ok(c),
            Value::Input(i) => {
                let info = &self.graph.input[i];
                let bad = |why: &str| OnnxError::Input { input: info.name.clone(), why: why.to_string() };
                let tensor =
                    info.r#type.as_ref().and_then(|t| t.tensor_type.as_ref()).ok_or_else(|| bad("not a tensor"))?;
                let elem = elem_of(tensor.elem_type).ok_or_else(|| bad("element type not supported"))?;
                let mut shape = Vec::new();
                for d in &tensor.shape.as_ref().ok_or_else(|| bad("a weight whose shape is not given"))?.dim {
                    match &d.value {
                        Some(DimensionValue::DimValue(v)) if *v >= 0 => shape.push(*v as usize),
                        _ => return Err(bad("a weight with a symbolic or unknown dimension")),
                    }
                }
                if too_large(&shape) {
                    return Err(bad("a weight too large"));
                }
                let c = Const { shape, elem, data: None, weight: self.weight(name) };
                self.values.insert(name.to_string(), Value::Const(c.clone()));
                Ok(c)
            }
            Value::Tensor(_) => Err(ctx.unsupported(format!(
                "input `{name}` must be a constant (an initializer or a Constant node): \
                 weights computed during the step are not supported"
            ))),
        }
    }

    fn constant(&mut self, ctx: &Ctx, node: &NodeProto, k: usize) -> Result<Const, OnnxError> {
        let name = Self::opt_input(node, k).ok_or_else(|| ctx.err(format!("input {k} is missing")))?;
        self.const_named(ctx, name)
    }

    fn opt_constant(&mut self, ctx: &Ctx, node: &NodeProto, k: usize) -> Result<Option<Const>, OnnxError> {
        match Self::opt_input(node, k) {
            Some(name) => self.const_named(ctx, name).map(Some),
            None => Ok(None),
        }
    }

    /// The integer values of constant input `k` (shapes, axes).
    fn ints(&mut self, ctx: &Ctx, node: &NodeProto, k: usize) -> Result<Vec<i64>, OnnxError> {
        let c = self.constant(ctx, node, k)?;
        match c.data {
            Some(Data::Int(v)) => Ok(v),
            _ => Err(ctx.unsupported(format!(
                "input {k} (`{}`) must be an integer constant with known values",
                node.input.get(k).map_or("", String::as_str)
            ))),
        }
    }

    fn set(&mut self, node: &NodeProto, value: Value) {
        if let Some(out) = node.output.first() {
            self.values.insert(out.clone(), value);
        }
    }

    /// Fails if an output other than the first is read.
    fn only_first_output(&self, ctx: &Ctx, node: &NodeProto, what: &str) -> Result<(), OnnxError> {
        for o in node.output.iter().skip(1).filter(|o| !o.is_empty()) {
            if self.uses.get(o).copied().unwrap_or(0) > 0 {
                return Err(ctx.unsupported(format!("its output `{o}` ({what}) is read")));
            }
        }
        Ok(())
    }

    /// Adds an op: declares it on its inputs' shapes and checks its weights against the
    /// declared parameters.
    fn add(
        &mut self,
        ctx: &Ctx,
        name: &str,
        kind: OpKind,
        inputs: Vec<usize>,
        weights: &[&Const],
    ) -> Result<usize, OnnxError> {
        let operands: Vec<Operand> = inputs
            .iter()
            .map(|&t| Operand { shape: self.tensors[t].shape.clone(), elem: self.tensors[t].elem })
            .collect();
        let decl = kind.declare(&operands).map_err(|e| ctx.err(e.to_string()))?;
        if decl.params.len() != weights.len() {
            return Err(ctx.err(format!(
                "{} weights for the {} parameters of {}",
                weights.len(),
                decl.params.len(),
                kind.name()
            )));
        }
        for ((suffix, want), w) in decl.params.iter().zip(weights) {
            if numel(want) != numel(&w.shape) {
                return Err(ctx.err(format!(
                    "weight `{}` has shape {:?}; the {suffix} of this {} needs {want:?}",
                    self.weights[w.weight],
                    w.shape,
                    kind.name()
                )));
            }
        }
        let op = self.ops.len();
        let t = self.tensors.len();
        let root = if decl.view { self.tensors[inputs[0]].root } else { t };
        self.tensors.push(IrTensor {
            name: name.to_string(),
            shape: decl.output,
            elem: decl.output_elem,
            producer: Some(op),
            root,
        });
        self.ops.push(IrOp {
            name: name.to_string(),
            kind,
            inputs,
            output: t,
            params: weights.iter().map(|w| w.weight).collect(),
            view: decl.view,
        });
        Ok(t)
    }

    /// `x` viewed with `shape` (itself when the shape is unchanged).
    fn view(&mut self, ctx: &Ctx, name: &str, x: usize, shape: Shape) -> Result<usize, OnnxError> {
        if self.tensors[x].shape == shape {
            return Ok(x);
        }
        self.add(ctx, name, OpKind::Reshape { shape }, vec![x], &[])
    }

    /// The shape of input `k`, constant or tensor.
    fn shape_of(&mut self, ctx: &Ctx, node: &NodeProto, k: usize) -> Result<(Shape, Option<Const>), OnnxError> {
        let name = Self::opt_input(node, k).ok_or_else(|| ctx.err(format!("input {k} is missing")))?;
        if self.is_const(name) {
            let c = self.const_named(ctx, name)?;
            return Ok((c.shape.clone(), Some(c)));
        }
        let t = self.tensor_named(ctx, name)?;
        Ok((self.tensors[t].shape.clone(), None))
    }

    /// A view node (Reshape, Flatten, Squeeze, Unsqueeze): folds on a constant, a
    /// reshape op (no allocation) on a tensor.
    fn reshape_node(&mut self, ctx: &Ctx, node: &NodeProto, out: Shape, c: Option<Const>) -> Result<(), OnnxError> {
        match c {
            Some(mut c) => {
                c.shape = out;
                self.set(node, Value::Const(c));
            }
            None => {
                let x = self.tensor(ctx, node, 0)?;
                let t = self.view(ctx, &ctx.node, x, out)?;
                self.set(node, Value::Tensor(t));
            }
        }
        Ok(())
    }

    /// Kernel, strides and padding of a convolution or pooling node on `x` `[N, C, H, W]`.
    fn window(
        &self,
        ctx: &Ctx,
        node: &NodeProto,
        x: &[usize],
        kernel: Option<[usize; 2]>,
    ) -> Result<Window, OnnxError> {
        let pair = |name: &str, default: [usize; 2]| -> Result<[usize; 2], OnnxError> {
            match attr_ints(node, name) {
                None => Ok(default),
                Some(v) if v.len() == 2 && v.iter().all(|&d| d > 0) => Ok([v[0] as usize, v[1] as usize]),
                Some(v) => Err(ctx.err(format!("attribute `{name}` is {v:?}: two positive values expected"))),
            }
        };
        let k = match (attr_ints(node, "kernel_shape"), kernel) {
            (Some(_), _) => pair("kernel_shape", [1, 1])?,
            (None, Some(k)) => k,
            (None, None) => return Err(ctx.err("attribute `kernel_shape` is missing")),
        };
        if let (Some(w), true) = (kernel, attr_ints(node, "kernel_shape").is_some()) {
            if w != k {
                return Err(ctx.err(format!("attribute `kernel_shape` {k:?} differs from the weight's {w:?}")));
            }
        }
        let s = pair("strides", [1, 1])?;
        if pair("dilations", [1, 1])? != [1, 1] {
            return Err(ctx.unsupported(format!("dilations {:?}", attr_ints(node, "dilations").unwrap_or_default())));
        }
        let (h, w) = (x[2], x[3]);
        let mut pads = match attr_ints(node, "pads") {
            None => [0; 4],
            Some(p) if p.len() == 4 && p.iter().all(|&v| v >= 0) => {
                [p[0] as usize, p[1] as usize, p[2] as usize, p[3] as usize]
            }
            Some(p) => return Err(ctx.err(format!("attribute `pads` is {p:?}: four non-negative values expected"))),
        };
        let auto = attr_str(node, "auto_pad").unwrap_or_default();
        match auto.as_str() {
            "" | "NOTSET" => {}
            "VALID" => pads = [0; 4],
            "SAME_UPPER" | "SAME_LOWER" => {
                for (axis, size) in [h, w].into_iter().enumerate() {
                    let out = size.div_ceil(s[axis]);
                    let total = (out.saturating_sub(1) * s[axis] + k[axis]).saturating_sub(size);
                    let (small, large) = (total / 2, total - total / 2);
                    let (begin, end) = if auto == "SAME_UPPER" { (small, large) } else { (large, small) };
                    pads[axis] = begin;
                    pads[axis + 2] = end;
                }
            }
            other => return Err(ctx.err(format!("attribute `auto_pad` is `{other}`"))),
        }
        if attr_int(node, "ceil_mode").unwrap_or(0) != 0 {
            // Ceil mode as extra padding at the end, PyTorch's rule: the last window must
            // start inside the input or its leading padding.
            for (axis, size) in [h, w].into_iter().enumerate() {
                let padded = size + pads[axis] + pads[axis + 2];
                if padded < k[axis] {
                    break;
                }
                let mut out = (padded - k[axis]).div_ceil(s[axis]) + 1;
                if (out - 1) * s[axis] >= size + pads[axis] {
                    out -= 1;
                }
                pads[axis + 2] += ((out - 1) * s[axis] + k[axis]).saturating_sub(padded);
            }
        }
        Ok(Window { kernel: k, stride: s, pads })
    }

    /// The dimension of `x` along which a constant of shape `c` varies, if exactly one
    /// (a per-channel constant); `None` for scalars and other broadcasts.
    fn channel_dim(&self, node: &NodeProto, x: &[usize], c: &[usize]) -> Option<usize> {
        // Opset < 7: no broadcasting unless `broadcast = 1`, then `c` aligns at `axis`.
        let start = if self.opset < 7 && attr_int(node, "broadcast").unwrap_or(0) == 1 {
            let axis = attr_int(node, "axis").unwrap_or(x.len() as i64 - c.len() as i64);
            normalize_axis(axis, x.len())?
        } else {
            x.len().checked_sub(c.len())?
        };
        if start + c.len() > x.len() {
            return None;
        }
        let varying: Vec<usize> = (0..c.len()).filter(|&j| c[j] != 1).collect();
        match varying[..] {
            [j] if c[j] == x[start + j] => Some(start + j),
            _ => None,
        }
    }

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
            "MaxPool" | "AveragePool" => self.pool(&ctx, node),
            "GlobalAveragePool" => {
                let x = self.tensor(&ctx, node, 0)?;
                let t = self.add(&ctx, &name, OpKind::AdaptiveAvgPool2d { out: 1 }, vec![x], &[])?;
                self.set(node, Value::Tensor(t));
                Ok(())
            }
            "BatchNormalization" | "SpatialBN" => {
                if attr_int(node, "spatial").unwrap_or(1) != 1 {
                    return Err(ctx.unsupported("`spatial = 0` (per-activation statistics)"));
                }
                self.only_first_output(&ctx, node, "running statistics")?;
                let x = self.tensor(&ctx, node, 0)?;
                let scale = self.constant(&ctx, node, 1)?;
                let bias = self.constant(&ctx, node, 2)?;
                // The running mean and variance are buffers, not parameters (as PyTorch
                // and the zoo count them).
                let t = self.add(&ctx, &name, OpKind::BatchNorm2d, vec![x], &[&scale, &bias])?;
                self.set(node, Value::Tensor(t));
                Ok(())
            }
            "LayerNormalization" => {
                self.only_first_output(&ctx, node, "statistics")?;
                let x = self.tensor(&ctx, node, 0)?;
                let rank = self.tensors[x].shape.len();
                let axis = attr_int(node, "axis").unwrap_or(-1);
                if normalize_axis(axis, rank) != Some(rank.saturating_sub(1)) {
                    return Err(ctx.unsupported(format!("normalization from axis {axis}: only the last dimension")));
                }
                let scale = self.constant(&ctx, node, 1)?;
                let bias = self.opt_constant(&ctx, node, 2)?;
                let mut w = vec![&scale];
                w.extend(bias.as_ref());
                let t = self.add(&ctx, &name, OpKind::LayerNorm { bias: bias.is_some() }, vec![x], &w)?;
                self.set(node, Value::Tensor(t));
                Ok(())
            }
            "Relu" | "Gelu" => {
                let x = self.tensor(&ctx, node, 0)?;
                let kind = if node.op_type == "Relu" { OpKind::Relu } else { OpKind::Gelu };
                let t = self.add(&ctx, &name, kind, vec![x], &[])?;
                self.set(node, Value::Tensor(t));
                Ok(())
            }
            "LRN" => {
                let x = self.tensor(&ctx, node, 0)?;
                let size = attr_int(node, "size").ok_or_else(|| ctx.err("attribute `size` is missing"))?;
                let size = usize::try_from(size).map_err(|_| ctx.err(format!("attribute `size` is {size}")))?;
                let kind = OpKind::Lrn {
                    size,
                    alpha: attr_float(node, "alpha").unwrap_or(1e-4),
                    beta: attr_float(node, "beta").unwrap_or(0.75),
                    bias: attr_float(node, "bias").unwrap_or(1.0),
                };
                let t = self.add(&ctx, &name, kind, vec![x], &[])?;
                self.set(node, Value::Tensor(t));
                Ok(())
            }
            "Dropout" => {
                self.only_first_output(&ctx, node, "the mask")?;
                let p = match Self::opt_input(node, 1) {
                    Some(_) => match self.constant(&ctx, node, 1)?.data {
                        Some(Data::Float(v)) if v.len() == 1 => v[0],
                        _ => return Err(ctx.unsupported("a ratio that is not a constant scalar")),
                    },
                    None => attr_float(node, "ratio").unwrap_or(0.5),
                };
                let name0 = node.input.first().cloned().unwrap_or_default();
                if self.is_const(&name0) || p == 0.0 {
                    let v = self.lookup(&ctx, &name0)?;
                    self.set(node, v);
                    return Ok(());
                }
                let x = self.tensor(&ctx, node, 0)?;
                let t = self.add(&ctx, &name, OpKind::Dropout { p }, vec![x], &[])?;
                self.set(node, Value::Tensor(t));
                Ok(())
            }
            "Gemm" => self.gemm(&ctx, node),
            "MatMul" => {
                let x = self.tensor(&ctx, node, 0)?;
                let b = Self::opt_input(node, 1).ok_or_else(|| ctx.err("input 1 is missing"))?;
                if !self.is_const(b) && !matches!(self.values.get(b), Some(Value::Input(_))) {
                    return Err(ctx.unsupported(
                        "a product of two activations (e.g. attention scores): only products with a constant weight",
                    ));
                }
                let w = self.constant(&ctx, node, 1)?;
                let xs = &self.tensors[x].shape;
                if w.shape.len() != 2 || xs.last() != w.shape.first() {
                    return Err(ctx.err(format!("cannot multiply {xs:?} by the weight `{b}` of shape {:?}", w.shape)));
                }
                let kind = OpKind::Linear { out_features: w.shape[1], bias: false };
                let t = self.add(&ctx, &name, kind, vec![x], &[&w])?;
                self.set(node, Value::Tensor(t));
                Ok(())
            }
            "Add" | "Mul" => self.binary(&ctx, node),
            "Sum" => {
                let names: Vec<&str> = node.input.iter().filter(|s| !s.is_empty()).map(String::as_str).collect();
                if names.is_empty() {
                    return Err(ctx.err("no inputs"));
                }
                let mut acc = self.tensor_named(&ctx, names[0])?;
                for (k, n) in names.iter().enumerate().skip(1) {
                    let y = self.tensor_named(&ctx, n)?;
                    let op_name = if k + 1 == names.len() { name.clone() } else { format!("{name}.{k}") };
                    acc = self.add_tensors(&ctx, &op_name, acc, y)?;
                }
                self.set(node, Value::Tensor(acc));
                Ok(())
            }
            "Concat" => self.concat(&ctx, node),
            "Softmax" => {
                let x = self.tensor(&ctx, node, 0)?;
                let shape = self.tensors[x].shape.clone();
                let rank = shape.len();
                let default = if self.opset < 13 { 1 } else { -1 };
                let axis = attr_int(node, "axis").unwrap_or(default);
                let a = normalize_axis(axis, rank).ok_or_else(|| ctx.err(format!("axis {axis} out of range")))?;
                // Before opset 13 the softmax runs over all dimensions from `axis` on; from
                // 13 over `axis` alone, which we take when the later dimensions are ones.
                if self.opset >= 13 && shape[a + 1..].iter().any(|&d| d != 1) {
                    return Err(ctx.unsupported(format!("softmax over axis {axis} of {shape:?}: only the last")));
                }
                let rows = numel(&shape[..a]).unwrap_or(0);
                let cols = numel(&shape[a..]).unwrap_or(0);
                let flat = self.view(&ctx, &format!("{name}.flatten"), x, vec![rows, cols])?;
                let y = self.add(&ctx, &name, OpKind::Softmax, vec![flat], &[])?;
                let t = self.view(&ctx, &format!("{name}.unflatten"), y, shape)?;
                self.set(node, Value::Tensor(t));
                Ok(())
            }
            "Identity" => {
                let v = self.lookup(&ctx, node.input.first().map_or("", String::as_str))?;
                self.set(node, v);
                Ok(())
            }
            "Reshape" => {
                let (shape, c) = self.shape_of(&ctx, node, 0)?;
                let target = if Self::opt_input(node, 1).is_some() {
                    self.ints(&ctx, node, 1)?
                } else {
                    attr_ints(node, "shape").ok_or_else(|| ctx.err("no target shape (input 1)"))?
                };
                let allow_zero = attr_int(node, "allowzero").unwrap_or(0) != 0;
                let out = self.reshape_target(&ctx, &shape, &target, allow_zero, c.is_none())?;
                self.reshape_node(&ctx, node, out, c)
            }
            "Flatten" => {
                let (shape, c) = self.shape_of(&ctx, node, 0)?;
                let axis = attr_int(node, "axis").unwrap_or(1);
                let a = if axis == shape.len() as i64 {
                    shape.len()
                } else {
                    normalize_axis(axis, shape.len()).ok_or_else(|| ctx.err(format!("axis {axis} out of range")))?
                };
                let out = vec![numel(&shape[..a]).unwrap_or(0), numel(&shape[a..]).unwrap_or(0)];
                self.reshape_node(&ctx, node, out, c)
            }
            "Squeeze" | "Unsqueeze" => {
                let (shape, c) = self.shape_of(&ctx, node, 0)?;
                let axes = match Self::opt_input(node, 1) {
                    Some(_) => Some(self.ints(&ctx, node, 1)?),
                    None => attr_ints(node, "axes"),
                };
                let out = if node.op_type == "Squeeze" {
                    let axes = match axes {
                        Some(a) => a
                            .iter()
                            .map(|&x| {
                                normalize_axis(x, shape.len()).ok_or_else(|| ctx.err(format!("axis {x} out of range")))
                            })
                            .collect::<Result<Vec<_>, _>>()?,
                        None => (0..shape.len()).filter(|&i| shape[i] == 1).collect(),
                    };
                    if let Some(&a) = axes.iter().find(|&&a| shape[a] != 1) {
                        return Err(ctx.err(format!("cannot squeeze dimension {a} of {shape:?}")));
                    }
                    shape.iter().enumerate().filter(|(i, _)| !axes.contains(i)).map(|(_, &d)| d).collect()
                } else {
                    let axes = axes.ok_or_else(|| ctx.err("no axes"))?;
                    let rank = shape.len() + axes.len();
                    let mut axes = axes
                        .iter()
                        .map(|&x| normalize_axis(x, rank).ok_or_else(|| ctx.err(format!("axis {x} out of range"))))
                        .collect::<Result<Vec<_>, _>>()?;
                    axes.sort_unstable();
                    axes.dedup();
                    let mut rest = shape.iter();
                    (0..rank).map(|i| if axes.contains(&i) { 1 } else { rest.next().copied().unwrap_or(1) }).collect()
                };
                self.reshape_node(&ctx, node, out, c)
            }
            "Transpose" => {
                let (shape, c) = self.shape_of(&ctx, node, 0)?;
                let perm: Vec<usize> = match attr_ints(node, "perm") {
                    Some(p) => p
                        .iter()
                        .map(|&v| usize::try_from(v).map_err(|_| ctx.err(format!("attribute `perm` is {p:?}"))))
                        .collect::<Result<_, _>>()?,
                    None => (0..shape.len()).rev().collect(),
                };
                let mut sorted = perm.clone();
                sorted.sort_unstable();
                if sorted != (0..shape.len()).collect::<Vec<_>>() {
                    return Err(ctx.err(format!("attribute `perm` {perm:?} is not a permutation of {shape:?}")));
                }
                match c {
                    Some(mut c) => {
                        c.shape = perm.iter().map(|&p| shape[p]).collect();
                        if c.data.as_ref().is_some_and(|_| numel(&shape) != Some(1)) {
                            c.data = None;
                        }
                        self.set(node, Value::Const(c));
                    }
                    None if perm.iter().enumerate().all(|(i, &p)| i == p) => {
                        let x = self.tensor(&ctx, node, 0)?;
                        self.set(node, Value::Tensor(x));
                    }
                    None => {
                        let x = self.tensor(&ctx, node, 0)?;
                        let t = self.add(&ctx, &name, OpKind::Permute { perm }, vec![x], &[])?;
                        self.set(node, Value::Tensor(t));
                    }
                }
                Ok(())
            }
            "Cast" => {
                let to = attr_int(node, "to").ok_or_else(|| ctx.err("attribute `to` is missing"))? as i32;
                let elem = elem_of(to).ok_or_else(|| ctx.unsupported(format!("cast to data type {to}")))?;
                match self.lookup(&ctx, node.input.first().map_or("", String::as_str))? {
                    Value::Const(mut c) => {
                        c.data = match (c.data, elem) {
                            (Some(Data::Int(v)), Elem::Float) => {
                                Some(Data::Float(v.iter().map(|&x| x as f64).collect()))
                            }
                            (Some(Data::Float(v)), Elem::Int) => Some(Data::Int(v.iter().map(|&x| x as i64).collect())),
                            (d, _) => d,
                        };
                        c.elem = elem;
                        self.set(node, Value::Const(c));
                    }
                    _ => {
                        let x = self.tensor(&ctx, node, 0)?;
                        if self.tensors[x].elem != elem {
                            return Err(
                                ctx.unsupported(format!("a cast of a {:?} tensor to {elem:?}", self.tensors[x].elem))
                            );
                        }
                        self.set(node, Value::Tensor(x));
                    }
                }
                Ok(())
            }
            "Constant" => {
                let c = self.constant_node(&ctx, node)?;
                self.set(node, Value::Const(c));
                Ok(())
            }
            "ConstantOfShape" => {
                let dims = self.ints(&ctx, node, 0)?;
                let shape = dims
                    .iter()
                    .map(|&d| usize::try_from(d).map_err(|_| ctx.err(format!("negative dimension in {dims:?}"))))
                    .collect::<Result<Shape, _>>()?;
                let n = numel(&shape)
                    .filter(|_| !too_large(&shape))
                    .ok_or_else(|| ctx.err(format!("shape {shape:?} is too large")))?;
                let (elem, fill) = match attr(node, "value").and_then(|a| a.t.as_ref()) {
                    Some(t) => {
                        let (_, elem, data) =
                            decode_tensor(t).map_err(|why| ctx.err(format!("attribute `value`: {why}")))?;
                        (elem, data)
                    }
                    None => (Elem::Float, Some(Data::Float(vec![0.0]))),
                };
                let data = match fill {
                    Some(Data::Int(v)) if v.len() == 1 && n <= KEEP_VALUES => Some(Data::Int(vec![v[0]; n])),
                    Some(Data::Float(v)) if v.len() == 1 && n <= KEEP_VALUES => Some(Data::Float(vec![v[0]; n])),
                    _ => None,
                };
                let out = node.output[0].clone();
                let weight = self.weight(&out);
                self.set(node, Value::Const(Const { shape, elem, data, weight }));
                Ok(())
            }
            "Shape" => {
                let (shape, _) = self.shape_of(&ctx, node, 0)?;
                let r = shape.len() as i64;
                let clamp = |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r) as usize;
                let start = clamp(attr_int(node, "start").unwrap_or(0));
                let end = clamp(attr_int(node, "end").unwrap_or(r)).max(start);
                let data: Vec<i64> = shape[start..end].iter().map(|&d| d as i64).collect();
                let weight = self.weight(&node.output[0]);
                self.set(
                    node,
                    Value::Const(Const {
                        shape: vec![data.len()],
                        elem: Elem::Int,
                        data: Some(Data::Int(data)),
                        weight,
                    }),
                );
                Ok(())
            }
            "Gather" => self.gather(&ctx, node),
            _ => Err(OnnxError::UnsupportedOp { node: name, op: node.op_type.clone(), domain: node.domain.clone() }),
        }
    }

    /// `Constant`: its value from whichever attribute is set.
    fn constant_node(&mut self, ctx: &Ctx, node: &NodeProto) -> Result<Const, OnnxError> {
        let a = node.attribute.first().ok_or_else(|| ctx.err("no value attribute"))?;
        let (shape, elem, data) = match a.name.as_str() {
            "value" => {
                let t = a.t.as_ref().ok_or_else(|| ctx.err("attribute `value` holds no tensor"))?;
                decode_tensor(t).map_err(|why| ctx.err(format!("attribute `value`: {why}")))?
            }
            "value_float" => (vec![], Elem::Float, Some(Data::Float(vec![a.f as f64]))),
            "value_floats" => {
                (vec![a.floats.len()], Elem::Float, Some(Data::Float(a.floats.iter().map(|&v| v as f64).collect())))
            }
            "value_int" => (vec![], Elem::Int, Some(Data::Int(vec![a.i]))),
            "value_ints" => (vec![a.ints.len()], Elem::Int, Some(Data::Int(a.ints.clone()))),
            other => return Err(ctx.unsupported(format!("a constant given by `{other}`"))),
        };
        Ok(Const { shape, elem, data, weight: self.weight(&node.output[0]) })
    }

    /// The target of a Reshape: `0` copies a dimension (unless `allowzero`), `-1` is
    /// inferred. When the batch was changed, a leading dimension equal to the file's
    /// batch, on an input whose leading dimension is the batch, is the batch too: files
    /// hard-code `[1, -1]` or `[1, 2048]` for their batch of one.
    fn reshape_target(
        &self,
        ctx: &Ctx,
        input: &[usize],
        target: &[i64],
        allow_zero: bool,
        is_tensor: bool,
    ) -> Result<Shape, OnnxError> {
        let mut t = target.to_vec();
        if !allow_zero {
            for (i, v) in t.iter_mut().enumerate() {
                if *v == 0 {
                    *v = *input
                        .get(i)
                        .ok_or_else(|| ctx.err(format!("target {target:?} copies a missing dimension {i}")))?
                        as i64;
                }
            }
        }
        if let (true, Some(fb), Some(b)) = (is_tensor, self.file_batch, self.batch) {
            if fb != b && t.first() == Some(&(fb as i64)) && input.first() == Some(&b) {
                t[0] = b as i64;
            }
        }
        let total = numel(input).ok_or_else(|| ctx.err(format!("shape {input:?} overflows")))?;
        let known: Option<usize> =
            t.iter().filter(|&&v| v != -1).try_fold(1usize, |acc, &v| acc.checked_mul(usize::try_from(v).ok()?));
        let known = known.ok_or_else(|| ctx.err(format!("target shape {target:?} is invalid")))?;
        let inferred = t.iter().filter(|&&v| v == -1).count();
        let out: Shape = match inferred {
            0 => t.iter().map(|&v| v as usize).collect(),
            1 if known > 0 && total % known == 0 => {
                t.iter().map(|&v| if v == -1 { total / known } else { v as usize }).collect()
            }
            _ => return Err(ctx.err(format!("cannot reshape {input:?} to {target:?}"))),
        };
        if numel(&out) != Some(total) {
            return Err(ctx.err(format!("cannot reshape {input:?} ({total} elements) to {target:?}")));
        }
        Ok(out)
    }

    fn conv(&mut self, ctx: &Ctx, node: &NodeProto) -> Result<(), OnnxError> {
        let x = self.tensor(ctx, node, 0)?;
        let xs = self.tensors[x].shape.clone();
        if xs.len() != 4 {
            return Err(ctx.unsupported(format!("a convolution of a {xs:?} input: only 2-D ([N, C, H, W])")));
        }
        let w = self.constant(ctx, node, 1)?;
        let b = self.opt_constant(ctx, node, 2)?;
        let ws = &w.shape;
        if ws.len() != 4 {
            return Err(ctx.err(format!("weight `{}` has shape {ws:?}, not [M, C/group, kH, kW]", node.input[1])));
        }
        let groups = attr_int(node, "group").unwrap_or(1);
        let groups =
            usize::try_from(groups).ok().filter(|&g| g > 0).ok_or_else(|| ctx.err(format!("group {groups}")))?;
        if ws[1].checked_mul(groups) != Some(xs[1]) {
            return Err(ctx.err(format!(
                "weight `{}` has shape {ws:?}: {} channels per group × {groups} groups, but the input has {} channels",
                node.input[1], ws[1], xs[1]
            )));
        }
        let win = self.window(ctx, node, &xs, Some([ws[2], ws[3]]))?;
        let (k, s, p) = (win.kernel, win.stride, win.pads);
        let symmetric = p[0] == p[2] && p[1] == p[3];
        let bias = b.is_some();
        let kind = if symmetric && k[0] == k[1] && s[0] == s[1] && p[0] == p[1] {
            OpKind::Conv2d { out_channels: ws[0], kernel: k[0], stride: s[0], padding: p[0], groups, bias }
        } else if symmetric && s[0] == s[1] && groups == 1 {
            OpKind::Conv2dRect {
                out_channels: ws[0],
                kernel_h: k[0],
                kernel_w: k[1],
                stride: s[0],
                pad_h: p[0],
                pad_w: p[1],
                bias,
            }
        } else {
            return Err(ctx.unsupported(format!(
                "kernel {k:?}, strides {s:?}, pads {p:?}, group {groups}: pebble's convolutions take one stride, \
                 symmetric padding, and groups only with a square kernel"
            )));
        };
        let mut weights = vec![&w];
        weights.extend(b.as_ref());
        let t = self.add(ctx, &ctx.node, kind, vec![x], &weights)?;
        self.set(node, Value::Tensor(t));
        Ok(())
    }

    fn pool(&mut self, ctx: &Ctx, node: &NodeProto) -> Result<(), OnnxError> {
        self.only_first_output(ctx, node, "the argmax indices")?;
        let x = self.tensor(ctx, node, 0)?;
        let xs = self.tensors[x].shape.clone();
        if xs.len() != 4 {
            return Err(ctx.unsupported(format!("pooling a {xs:?} input: only 2-D ([N, C, H, W])")));
        }
        let win = self.window(ctx, node, &xs, None)?;
        let (k, s, p) = (win.kernel, win.stride, win.pads);
        let max = node.op_type == "MaxPool";
        let kind = if p[0] == p[2] && p[1] == p[3] && p[0] == p[1] && k[0] == k[1] && s[0] == s[1] {
            if max {
                OpKind::MaxPool2d { kernel: k[0], stride: s[0], padding: p[0] }
            } else {
                OpKind::AvgPool2d { kernel: k[0], stride: s[0], padding: p[0] }
            }
        } else {
            OpKind::Pool2d { max, kernel: k, stride: s, pads: p }
        };
        let t = self.add(ctx, &ctx.node, kind, vec![x], &[])?;
        self.set(node, Value::Tensor(t));
        Ok(())
    }

    fn gemm(&mut self, ctx: &Ctx, node: &NodeProto) -> Result<(), OnnxError> {
        if attr_int(node, "transA").unwrap_or(0) != 0 {
            return Err(ctx.unsupported("`transA = 1`"));
        }
        let x = self.tensor(ctx, node, 0)?;
        let b = Self::opt_input(node, 1).ok_or_else(|| ctx.err("input 1 is missing"))?;
        if matches!(self.values.get(b), Some(Value::Tensor(_))) {
            return Err(ctx.unsupported("a product of two activations: only products with a constant weight"));
        }
        let w = self.constant(ctx, node, 1)?;
        let c = self.opt_constant(ctx, node, 2)?;
        let xs = self.tensors[x].shape.clone();
        if w.shape.len() != 2 || xs.len() != 2 {
            return Err(ctx.err(format!("Gemm of {xs:?} by a weight of shape {:?}: both must be matrices", w.shape)));
        }
        let (n, k) = if attr_int(node, "transB").unwrap_or(0) != 0 {
            (w.shape[0], w.shape[1])
        } else {
            (w.shape[1], w.shape[0])
        };
        if xs[1] != k {
            return Err(ctx.err(format!("cannot multiply {xs:?} by the weight `{b}` of shape {:?}", w.shape)));
        }
        let mut weights = vec![&w];
        weights.extend(c.as_ref());
        let kind = OpKind::Linear { out_features: n, bias: c.is_some() };
        let t = self.add(ctx, &ctx.node, kind, vec![x], &weights)?;
        self.set(node, Value::Tensor(t));
        Ok(())
    }

    /// Sum of two tensors: the zoo's `add` broadcasts its second input over leading
    /// dimensions, so the larger one goes first.
    fn add_tensors(&mut self, ctx: &Ctx, name: &str, a: usize, b: usize) -> Result<usize, OnnxError> {
        let (sa, sb) = (&self.tensors[a].shape, &self.tensors[b].shape);
        let suffix = |x: &Shape, y: &Shape| y.len() <= x.len() && x[x.len() - y.len()..] == y[..];
        let inputs = if suffix(sa, sb) {
            vec![a, b]
        } else if suffix(sb, sa) {
            vec![b, a]
        } else {
            return Err(
                ctx.unsupported(format!("a sum of {sa:?} and {sb:?} (broadcast other than over leading dimensions)"))
            );
        };
        self.add(ctx, name, OpKind::Add, inputs, &[])
    }

    /// `Add` and `Mul`: of two tensors, or of a tensor and a per-channel constant (a
    /// learned scale or bias, fused into the op before it when that op is its only reader).
    fn binary(&mut self, ctx: &Ctx, node: &NodeProto) -> Result<(), OnnxError> {
        let a = Self::opt_input(node, 0).ok_or_else(|| ctx.err("input 0 is missing"))?;
        let b = Self::opt_input(node, 1).ok_or_else(|| ctx.err("input 1 is missing"))?;
        let is_add = node.op_type == "Add";
        let weightlike = |im: &Self, n: &str| im.is_const(n);
        match (weightlike(self, a), weightlike(self, b)) {
            (false, false) => {
                let x = self.tensor_named(ctx, a)?;
                let y = self.tensor_named(ctx, b)?;
                let t = if is_add {
                    self.add_tensors(ctx, &ctx.node, x, y)?
                } else {
                    let (sx, sy) = (&self.tensors[x].shape, &self.tensors[y].shape);
                    if sx != sy {
                        return Err(ctx.unsupported(format!("a product of {sx:?} and {sy:?}: only of equal shapes")));
                    }
                    self.add(ctx, &ctx.node, OpKind::Mul, vec![x, y], &[])?
                };
                self.set(node, Value::Tensor(t));
                Ok(())
            }
            (true, true) => Err(ctx.unsupported("arithmetic on two constants")),
            (a_const, _) => {
                let (xn, cn) = if a_const { (b, a) } else { (a, b) };
                let x = self.tensor_named(ctx, xn)?;
                let c = self.const_named(ctx, cn)?;
                let xs = self.tensors[x].shape.clone();
                let dim = self.channel_dim(node, &xs, &c.shape).ok_or_else(|| {
                    ctx.unsupported(format!(
                        "{} of {xs:?} by the constant `{cn}` of shape {:?}: only per-channel constants \
                         (varying along one dimension) are supported, as learned weights",
                        node.op_type, c.shape
                    ))
                })?;
                if self.fuse(x, xn, dim, is_add, &c) {
                    self.set(node, Value::Tensor(x));
                    return Ok(());
                }
                let kind = OpKind::ChannelAffine { dim, scale: !is_add, bias: is_add };
                let t = self.add(ctx, &ctx.node, kind, vec![x], &[&c])?;
                self.set(node, Value::Tensor(t));
                Ok(())
            }
        }
    }

    /// Folds a per-channel bias (`is_add`) into the op producing `x` when `x` has no
    /// other reader: a scale without a bias, a convolution or linear map without a bias.
    fn fuse(&mut self, x: usize, x_name: &str, dim: usize, is_add: bool, c: &Const) -> bool {
        if !is_add || self.uses.get(x_name).copied().unwrap_or(0) != 1 {
            return false;
        }
        let Some(p) = self.tensors[x].producer else { return false };
        let rank = self.tensors[x].shape.len();
        let op = &mut self.ops[p];
        if op.output != x || numel(&c.shape) != Some(self.tensors[x].shape[dim]) {
            return false;
        }
        let fused = match &mut op.kind {
            OpKind::ChannelAffine { dim: d, bias, .. } if *d == dim && !*bias => bias,
            OpKind::Conv2d { bias, .. } | OpKind::Conv2dRect { bias, .. } if dim == 1 && !*bias => bias,
            OpKind::Linear { bias, .. } if dim + 1 == rank && !*bias => bias,
            _ => return false,
        };
        *fused = true;
        op.params.push(c.weight);
        true
    }

    fn concat(&mut self, ctx: &Ctx, node: &NodeProto) -> Result<(), OnnxError> {
        let names: Vec<&str> = node.input.iter().filter(|s| !s.is_empty()).map(String::as_str).collect();
        if names.is_empty() {
            return Err(ctx.err("no inputs"));
        }
        let axis = attr_int(node, "axis").unwrap_or(1);
        if names.iter().all(|n| self.is_const(n)) {
            // Shape arithmetic: concatenation of 1-D integer constants.
            let mut data = Vec::new();
            for n in &names {
                match self.const_named(ctx, n)? {
                    Const { data: Some(Data::Int(v)), shape, .. } if shape.len() <= 1 => data.extend(v),
                    c => return Err(ctx.unsupported(format!("a concatenation of constants of shape {:?}", c.shape))),
                }
            }
            let weight = self.weight(&node.output[0]);
            self.set(
                node,
                Value::Const(Const { shape: vec![data.len()], elem: Elem::Int, data: Some(Data::Int(data)), weight }),
            );
            return Ok(());
        }
        let mut xs = Vec::new();
        for n in &names {
            xs.push(self.tensor_named(ctx, n)?);
        }
        if xs.len() == 1 {
            self.set(node, Value::Tensor(xs[0]));
            return Ok(());
        }
        let rank = self.tensors[xs[0]].shape.len();
        let dim = normalize_axis(axis, rank).ok_or_else(|| ctx.err(format!("axis {axis} out of range")))?;
        let t = self.add(ctx, &ctx.node, OpKind::Concat { dim }, xs, &[])?;
        self.set(node, Value::Tensor(t));
        Ok(())
    }

    /// `Gather`: an embedding (a constant table indexed by integer tensors), or shape
    /// arithmetic on integer constants.
    fn gather(&mut self, ctx: &Ctx, node: &NodeProto) -> Result<(), OnnxError> {
        let axis = attr_int(node, "axis").unwrap_or(0);
        let data = Self::opt_input(node, 0).ok_or_else(|| ctx.err("input 0 is missing"))?;
        let idx = Self::opt_input(node, 1).ok_or_else(|| ctx.err("input 1 is missing"))?;
        if !self.is_const(data) && !matches!(self.values.get(data), Some(Value::Input(_))) {
            return Err(ctx.unsupported("gathering from an activation: only from a constant (embedding) table"));
        }
        let table = self.const_named(ctx, data)?;
        if self.is_const(idx) {
            let i = self.const_named(ctx, idx)?;
            let (Some(Data::Int(values)), Some(Data::Int(indices)), 1) = (&table.data, &i.data, table.shape.len())
            else {
                return Err(ctx.unsupported("gathering from a constant other than a 1-D integer one"));
            };
            let mut out = Vec::new();
            for &k in indices {
                let k = normalize_axis(k, values.len()).ok_or_else(|| ctx.err(format!("index {k} out of range")))?;
                out.push(values[k]);
            }
            let weight = self.weight(&node.output[0]);
            self.set(
                node,
                Value::Const(Const { shape: i.shape.clone(), elem: Elem::Int, data: Some(Data::Int(out)), weight }),
            );
            return Ok(());
        }
        let ids = self.tensor_named(ctx, idx)?;
        if axis != 0 || table.shape.len() != 2 || self.tensors[ids].elem != Elem::Int {
            return Err(ctx.unsupported(format!(
                "a gather along axis {axis} of a table of shape {:?}: only embeddings (axis 0 of a matrix, integer ids)",
                table.shape
            )));
        }
        let kind = OpKind::Embedding { vocab: table.shape[0], dim: table.shape[1] };
        let t = self.add(ctx, &ctx.node, kind, vec![ids], &[&table])?;
        self.set(node, Value::Tensor(t));
        Ok(())
    }

    /// Stages: a new one after every op whose output is the only tensor that crosses from
    /// the ops so far to the ops after (a sequential cut point).
    fn cuts(&self, logits: usize) -> Vec<bool> {
        let n = self.ops.len();
        let mut last_use = vec![None::<usize>; self.tensors.len()];
        for (i, op) in self.ops.iter().enumerate() {
            for &t in &op.inputs {
                last_use[self.tensors[t].root] = Some(i);
            }
        }
        // The loss reads the logits after every op.
        last_use[self.tensors[logits].root] = Some(n);
        let mut live: HashSet<usize> = self.inputs.iter().copied().filter(|&t| last_use[t].is_some()).collect();
        let mut cut = vec![false; n];
        for (i, op) in self.ops.iter().enumerate() {
            let root = self.tensors[op.output].root;
            if last_use[root].is_some_and(|u| u > i) {
                live.insert(root);
            }
            live.retain(|&r| last_use[r].is_some_and(|u| u > i));
            cut[i] = !op.view && live.len() == 1 && live.contains(&root);
        }
        cut
    }

    /// Hands the ops to a [`NetBuilder`], with the loss: cross-entropy of the logits
    /// (flattened to `[N, classes]`) against integer labels.
    fn emit(&self, name: &str, logits: usize) -> Result<Network, OnnxError> {
        let cut = self.cuts(logits);
        let mut b = NetBuilder::new(name, self.options.dtype);
        let mut ids = vec![usize::MAX; self.tensors.len()];
        for &t in &self.inputs {
            ids[t] = b.input(&self.tensors[t].name, self.tensors[t].shape.clone(), self.tensors[t].elem);
        }
        let shape = &self.tensors[logits].shape;
        let labels = b.input("labels", vec![shape[0]], Elem::Int);
        let mut bound: Vec<Option<ParamId>> = vec![None; self.weights.len()];
        for (i, op) in self.ops.iter().enumerate() {
            let inputs: Vec<usize> = op.inputs.iter().map(|&t| ids[t]).collect();
            let tied: Option<Vec<ParamId>> = op.params.iter().map(|&w| bound[w]).collect();
            let out = match tied {
                Some(p) if !p.is_empty() => b.op_tied(&op.name, op.kind.clone(), &inputs, &p)?,
                _ => b.op(&op.name, op.kind.clone(), &inputs)?,
            };
            for (&w, p) in op.params.iter().zip(b.params_of(out)) {
                bound[w].get_or_insert(p);
            }
            ids[op.output] = out;
            if cut[i] {
                b.next_stage();
            }
        }
        let mut out = ids[logits];
        if shape.len() > 2 {
            let flat = vec![shape[0], shape[1..].iter().product()];
            out = b.op("logits", OpKind::Reshape { shape: flat }, &[out])?;
        }
        b.loss("loss", OpKind::CrossEntropy, &[out, labels])?;
        Ok(b.finish()?)
    }
}
