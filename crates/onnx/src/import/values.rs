//! Values by name: lookups, graph inputs materialized as tensors, and ops added with
//! their shapes declared.

use pebble_zoo::ops::{Operand, Shape};
use pebble_zoo::OpKind;

use super::{numel, Const, Ctx, Importer, IrOp, IrTensor, Value};
use crate::error::OnnxError;
use crate::proto::NodeProto;

impl Importer<'_> {
    /// The name of input `k` of `node`, if given (an empty name is an omitted input).
    pub(super) fn opt_input(node: &NodeProto, k: usize) -> Option<&str> {
        node.input.get(k).map(String::as_str).filter(|s| !s.is_empty())
    }

    /// The value named `name`.
    pub(super) fn lookup(&self, ctx: &Ctx, name: &str) -> Result<Value, OnnxError> {
        self.values.get(name).cloned().ok_or_else(|| {
            ctx.err(format!("input `{name}` is not a graph input, an initializer, nor the output of an earlier node"))
        })
    }

    /// Whether `name` is a constant (so far: a graph input is not yet one).
    pub(super) fn is_const(&self, name: &str) -> bool {
        matches!(self.values.get(name), Some(Value::Const(_)))
    }

    /// A tensor of the forward pass named `name` (materializing a graph input).
    pub(super) fn tensor_named(&mut self, ctx: &Ctx, name: &str) -> Result<usize, OnnxError> {
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

    /// Input `k` of `node`, a tensor of the forward pass.
    pub(super) fn tensor(&mut self, ctx: &Ctx, node: &NodeProto, k: usize) -> Result<usize, OnnxError> {
        let name = Self::opt_input(node, k).ok_or_else(|| ctx.err(format!("input {k} is missing")))?;
        self.tensor_named(ctx, name)
    }

    /// Binds `node`'s (first) output to `value`.
    pub(super) fn set(&mut self, node: &NodeProto, value: Value) {
        if let Some(out) = node.output.first() {
            self.values.insert(out.clone(), value);
        }
    }

    /// Fails if an output other than the first is read.
    pub(super) fn only_first_output(&self, ctx: &Ctx, node: &NodeProto, what: &str) -> Result<(), OnnxError> {
        for o in node.output.iter().skip(1).filter(|o| !o.is_empty()) {
            if self.uses.get(o).copied().unwrap_or(0) > 0 {
                return Err(ctx.unsupported(format!("its output `{o}` ({what}) is read")));
            }
        }
        Ok(())
    }

    /// Adds an op: declares it on its inputs' shapes and checks its weights against the
    /// declared parameters.
    pub(super) fn add(
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
        });
        Ok(t)
    }

    /// `x` viewed with `shape` (itself when the shape is unchanged).
    pub(super) fn view(&mut self, ctx: &Ctx, name: &str, x: usize, shape: Shape) -> Result<usize, OnnxError> {
        if self.tensors[x].shape == shape {
            return Ok(x);
        }
        self.add(ctx, name, OpKind::Reshape { shape }, vec![x], &[])
    }
}
