//! Nodes that allocate nothing: views (`Reshape`, `Flatten`, `Squeeze`, `Unsqueeze`),
//! aliases (`Identity`, a `Cast` to the same type) and shape arithmetic folded on
//! constants (`Shape`, and every view of a constant). `Transpose` is a `permute` op on a
//! tensor.

use pebble_zoo::ops::{Elem, Shape};
use pebble_zoo::OpKind;

use super::shapes::normalize_axis;
use super::{attr_int, attr_ints, elem_of, numel, Const, Ctx, Data, Importer, Value};
use crate::error::OnnxError;
use crate::proto::NodeProto;

impl Importer<'_> {
    /// The shape of input `k`, constant or tensor.
    pub(super) fn shape_of(
        &mut self,
        ctx: &Ctx,
        node: &NodeProto,
        k: usize,
    ) -> Result<(Shape, Option<Const>), OnnxError> {
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
    pub(super) fn reshape_node(
        &mut self,
        ctx: &Ctx,
        node: &NodeProto,
        out: Shape,
        c: Option<Const>,
    ) -> Result<(), OnnxError> {
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

    /// `Identity`: the same value.
    pub(super) fn identity(&mut self, ctx: &Ctx, node: &NodeProto) -> Result<(), OnnxError> {
        let v = self.lookup(ctx, node.input.first().map_or("", String::as_str))?;
        self.set(node, v);
        Ok(())
    }

    /// `Reshape`, to a constant target (input 1) or, before opset 5, the `shape` attribute.
    pub(super) fn reshape(&mut self, ctx: &Ctx, node: &NodeProto) -> Result<(), OnnxError> {
        let (shape, c) = self.shape_of(ctx, node, 0)?;
        let target = if Self::opt_input(node, 1).is_some() {
            self.ints(ctx, node, 1)?
        } else {
            attr_ints(node, "shape").ok_or_else(|| ctx.err("no target shape (input 1)"))?
        };
        let allow_zero = attr_int(node, "allowzero").unwrap_or(0) != 0;
        let out = self.reshape_target(ctx, &shape, &target, allow_zero, c.is_none())?;
        self.reshape_node(ctx, node, out, c)
    }

    /// `Flatten`: to a matrix, the dimensions before `axis` its rows.
    pub(super) fn flatten(&mut self, ctx: &Ctx, node: &NodeProto) -> Result<(), OnnxError> {
        let (shape, c) = self.shape_of(ctx, node, 0)?;
        let axis = attr_int(node, "axis").unwrap_or(1);
        let a = if axis == shape.len() as i64 {
            shape.len()
        } else {
            normalize_axis(axis, shape.len()).ok_or_else(|| ctx.err(format!("axis {axis} out of range")))?
        };
        let out = vec![numel(&shape[..a]).unwrap_or(0), numel(&shape[a..]).unwrap_or(0)];
        self.reshape_node(ctx, node, out, c)
    }

    /// `Squeeze` and `Unsqueeze`, with axes as an input (opset 13) or an attribute.
    pub(super) fn squeeze(&mut self, ctx: &Ctx, node: &NodeProto) -> Result<(), OnnxError> {
        let (shape, c) = self.shape_of(ctx, node, 0)?;
        let axes = match Self::opt_input(node, 1) {
            Some(_) => Some(self.ints(ctx, node, 1)?),
            None => attr_ints(node, "axes"),
        };
        let out = if node.op_type == "Squeeze" {
            let axes = match axes {
                Some(a) => a
                    .iter()
                    .map(|&x| normalize_axis(x, shape.len()).ok_or_else(|| ctx.err(format!("axis {x} out of range"))))
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
        self.reshape_node(ctx, node, out, c)
    }

    /// `Transpose`: folded on a constant, an alias for the identity permutation, else
    /// a `permute` op.
    pub(super) fn transpose(&mut self, ctx: &Ctx, node: &NodeProto) -> Result<(), OnnxError> {
        let (shape, c) = self.shape_of(ctx, node, 0)?;
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
                let x = self.tensor(ctx, node, 0)?;
                self.set(node, Value::Tensor(x));
            }
            None => {
                let x = self.tensor(ctx, node, 0)?;
                let t = self.add(ctx, &ctx.node, OpKind::Permute { perm }, vec![x], &[])?;
                self.set(node, Value::Tensor(t));
            }
        }
        Ok(())
    }

    /// `Split` of a tensor along its last dimension (a packed projection into q, k, v):
    /// one `slice` view per output. The sizes come from input 1 (opset 13), the `split`
    /// attribute (before), or `num_outputs` equal parts (opset 18).
    pub(super) fn split(&mut self, ctx: &Ctx, node: &NodeProto) -> Result<(), OnnxError> {
        let x = self.tensor(ctx, node, 0)?;
        let shape = self.tensors[x].shape.clone();
        let axis = attr_int(node, "axis").unwrap_or(0);
        let a = normalize_axis(axis, shape.len()).ok_or_else(|| ctx.err(format!("axis {axis} out of range")))?;
        if a + 1 != shape.len() {
            return Err(ctx.unsupported(format!("a split of {shape:?} along axis {axis}: only along the last")));
        }
        let outputs = node.output.len();
        let sizes = match Self::opt_input(node, 1) {
            Some(_) => self.ints(ctx, node, 1)?,
            None => match attr_ints(node, "split") {
                Some(v) => v,
                None if shape[a].is_multiple_of(outputs.max(1)) => vec![(shape[a] / outputs.max(1)) as i64; outputs],
                None => {
                    return Err(ctx.unsupported(format!("an uneven split of {} into {outputs} parts", shape[a])));
                }
            },
        };
        let total = sizes.iter().try_fold(0i64, |acc, &v| acc.checked_add(v));
        if sizes.len() != outputs || sizes.iter().any(|&v| v <= 0) || total != Some(shape[a] as i64) {
            return Err(ctx.err(format!("split sizes {sizes:?} for {outputs} outputs of a dimension of {}", shape[a])));
        }
        let mut start = 0;
        for (k, (out, &len)) in node.output.iter().zip(&sizes).enumerate() {
            let len = len as usize;
            // A part nobody reads is not sliced.
            if self.uses.get(out).copied().unwrap_or(0) > 0 {
                let t = self.add(ctx, &format!("{}.{k}", ctx.node), OpKind::Slice { start, len }, vec![x], &[])?;
                self.values.insert(out.clone(), Value::Tensor(t));
            }
            start += len;
        }
        Ok(())
    }

    /// `Cast`: converts a constant's values; on a tensor, only to its own element type (an
    /// alias).
    pub(super) fn cast(&mut self, ctx: &Ctx, node: &NodeProto) -> Result<(), OnnxError> {
        let to = attr_int(node, "to").ok_or_else(|| ctx.err("attribute `to` is missing"))? as i32;
        let elem = elem_of(to).ok_or_else(|| ctx.unsupported(format!("cast to data type {to}")))?;
        match self.lookup(ctx, node.input.first().map_or("", String::as_str))? {
            Value::Const(mut c) => {
                c.data = match (c.data, elem) {
                    (Some(Data::Int(v)), Elem::Float) => Some(Data::Float(v.iter().map(|&x| x as f64).collect())),
                    (Some(Data::Float(v)), Elem::Int) => Some(Data::Int(v.iter().map(|&x| x as i64).collect())),
                    (d, _) => d,
                };
                c.elem = elem;
                self.set(node, Value::Const(c));
            }
            _ => {
                let x = self.tensor(ctx, node, 0)?;
                if self.tensors[x].elem != elem {
                    return Err(ctx.unsupported(format!("a cast of a {:?} tensor to {elem:?}", self.tensors[x].elem)));
                }
                self.set(node, Value::Tensor(x));
            }
        }
        Ok(())
    }

    /// `Shape`: the (sliced) shape of its input, as an integer constant.
    pub(super) fn shape(&mut self, ctx: &Ctx, node: &NodeProto) -> Result<(), OnnxError> {
        let (shape, _) = self.shape_of(ctx, node, 0)?;
        let r = shape.len() as i64;
        let clamp = |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r) as usize;
        let start = clamp(attr_int(node, "start").unwrap_or(0));
        let end = clamp(attr_int(node, "end").unwrap_or(r)).max(start);
        let data: Vec<i64> = shape[start..end].iter().map(|&d| d as i64).collect();
        let weight = self.weight(&node.output[0]);
        self.set(
            node,
            Value::Const(Const { shape: vec![data.len()], elem: Elem::Int, data: Some(Data::Int(data)), weight }),
        );
        Ok(())
    }
}
