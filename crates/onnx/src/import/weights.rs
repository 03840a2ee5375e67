//! Constants: initializers, `Constant` and `ConstantOfShape` outputs, and graph inputs
//! read as weights. A constant in a weight slot becomes a parameter of the op reading it
//! (one parameter however many ops read it); small integer constants keep their values
//! for shape arithmetic.

use pebble_zoo::ops::{Elem, Shape};

use super::{attr, elem_of, numel, too_large, Const, Ctx, Data, Importer, Value};
use crate::error::OnnxError;
use crate::proto::{data_type, DimensionValue, NodeProto, TensorProto};

/// Constants up to this many elements keep their values (shapes, axes, scalars).
const KEEP_VALUES: usize = 4096;

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

impl Importer<'_> {
    /// Every initializer, as a constant.
    pub(super) fn initializers(&mut self) -> Result<(), OnnxError> {
        for t in &self.graph.initializer {
            let (shape, elem, data) =
                decode_tensor(t).map_err(|why| OnnxError::Malformed(format!("initializer `{}`: {why}", t.name)))?;
            let weight = self.weight(&t.name);
            self.values.insert(t.name.clone(), Value::Const(Const { shape, elem, data, weight }));
        }
        Ok(())
    }

    /// A new weight named `name`; its index in `weights`.
    pub(super) fn weight(&mut self, name: &str) -> usize {
        self.weights.push(name.to_string());
        self.weights.len() - 1
    }

    /// A constant named `name` (a graph input read as a weight becomes one).
    pub(super) fn const_named(&mut self, ctx: &Ctx, name: &str) -> Result<Const, OnnxError> {
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

    /// Constant input `k` of `node`.
    pub(super) fn constant(&mut self, ctx: &Ctx, node: &NodeProto, k: usize) -> Result<Const, OnnxError> {
        let name = Self::opt_input(node, k).ok_or_else(|| ctx.err(format!("input {k} is missing")))?;
        self.const_named(ctx, name)
    }

    /// Constant input `k` of `node`, if the node has one.
    pub(super) fn opt_constant(&mut self, ctx: &Ctx, node: &NodeProto, k: usize) -> Result<Option<Const>, OnnxError> {
        match Self::opt_input(node, k) {
            Some(name) => self.const_named(ctx, name).map(Some),
            None => Ok(None),
        }
    }

    /// The integer values of constant input `k` (shapes, axes).
    pub(super) fn ints(&mut self, ctx: &Ctx, node: &NodeProto, k: usize) -> Result<Vec<i64>, OnnxError> {
        let c = self.constant(ctx, node, k)?;
        match c.data {
            Some(Data::Int(v)) => Ok(v),
            _ => Err(ctx.unsupported(format!(
                "input {k} (`{}`) must be an integer constant with known values",
                node.input.get(k).map_or("", String::as_str)
            ))),
        }
    }

    /// `Constant`: its value from whichever attribute is set.
    pub(super) fn constant_node(&mut self, ctx: &Ctx, node: &NodeProto) -> Result<(), OnnxError> {
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
        let c = Const { shape, elem, data, weight: self.weight(&node.output[0]) };
        self.set(node, Value::Const(c));
        Ok(())
    }

    /// `ConstantOfShape`: a constant filled with one value (values kept when small).
    pub(super) fn constant_of_shape(&mut self, ctx: &Ctx, node: &NodeProto) -> Result<(), OnnxError> {
        let dims = self.ints(ctx, node, 0)?;
        let shape = dims
            .iter()
            .map(|&d| usize::try_from(d).map_err(|_| ctx.err(format!("negative dimension in {dims:?}"))))
            .collect::<Result<Shape, _>>()?;
        let n = numel(&shape)
            .filter(|_| !too_large(&shape))
            .ok_or_else(|| ctx.err(format!("shape {shape:?} is too large")))?;
        let (elem, fill) = match attr(node, "value").and_then(|a| a.t.as_ref()) {
            Some(t) => {
                let (_, elem, data) = decode_tensor(t).map_err(|why| ctx.err(format!("attribute `value`: {why}")))?;
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
}
