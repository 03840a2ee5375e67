//! Helpers shared by the ops: shapes, slices, host-built constants, dropout masks (drawn
//! from [`crate::rng`]), and the checks that keep Burn from panicking on operands that do
//! not fit the declaration.

use std::ops::Range;

use burn_backend::tensor::{BoolTensor, FloatTensor};
use burn_backend::{get_device_settings, Backend, DType, Scalar, Shape, Slice, TensorData, TensorMetadata};
use pebble_zoo::ops::{Elem, Operand, Saved};
use pebble_zoo::{NetOp, OpKind};

use super::unsupported;
pub(crate) use crate::rng::derive_seed;
use crate::rng::SplitMix;
use crate::{RuntimeError, Value};

/// The dimensions of a float tensor.
pub(crate) fn dims<T: TensorMetadata>(t: &T) -> Vec<usize> {
    t.shape().to_vec()
}

/// Number of elements of a shape.
pub(crate) fn numel(d: &[usize]) -> usize {
    d.iter().product()
}

/// A Burn shape.
pub(crate) fn shape(d: &[usize]) -> Shape {
    Shape::from(d.to_vec())
}

/// A float scalar.
pub(crate) fn sc(v: f64) -> Scalar {
    Scalar::Float(v)
}

/// Reshapes a float tensor.
pub(crate) fn reshape<B: Backend>(t: FloatTensor<B>, d: &[usize]) -> FloatTensor<B> {
    B::float_reshape(t, shape(d))
}

/// Full slices of `d`, except `range` along `dim`.
pub(crate) fn ranges(d: &[usize], dim: usize, range: Range<usize>) -> Vec<Slice> {
    d.iter().enumerate().map(|(i, &n)| Slice::from(if i == dim { range.clone() } else { 0..n })).collect()
}

/// `len` entries of `dim` from `start` (`len > 0`).
pub(crate) fn narrow<B: Backend>(t: FloatTensor<B>, dim: usize, start: usize, len: usize) -> FloatTensor<B> {
    let d = dims(&t);
    if start == 0 && len == d[dim] {
        return t;
    }
    B::float_slice(t, &ranges(&d, dim, start..start + len))
}

/// Sums over each of `over` (rank kept: those dimensions become 1).
pub(crate) fn sum_dims<B: Backend>(mut t: FloatTensor<B>, over: &[usize]) -> FloatTensor<B> {
    for &d in over {
        t = B::float_sum_dim(t, d);
    }
    t
}

/// Sums a `[lead.., tail..]` tensor over its leading dimensions, giving `tail`.
pub(crate) fn sum_leading<B: Backend>(t: FloatTensor<B>, tail: &[usize]) -> FloatTensor<B> {
    let d = dims(&t);
    if d == tail {
        return t;
    }
    let m = numel(tail);
    let rows = numel(&d) / m.max(1);
    let t = B::float_sum_dim(reshape::<B>(t, &[rows, m]), 0);
    reshape::<B>(t, tail)
}

/// `d` with ones in front, up to rank `rank` (for broadcasting a trailing-shaped tensor).
pub(crate) fn lead_ones(d: &[usize], rank: usize) -> Vec<usize> {
    let mut out = vec![1; rank.saturating_sub(d.len())];
    out.extend_from_slice(d);
    out
}

/// A float tensor uploaded from the host, in dtype `dtype`.
pub(crate) fn float_const<B: Backend>(
    values: Vec<f32>,
    d: &[usize],
    dtype: DType,
    device: &B::Device,
) -> FloatTensor<B> {
    B::float_from_data(TensorData::new(values, shape(d)).convert_dtype(dtype), device)
}

/// A boolean tensor uploaded from the host, in the device's boolean storage.
pub(crate) fn bool_const<B: Backend>(values: Vec<bool>, d: &[usize], device: &B::Device) -> BoolTensor<B> {
    let store = get_device_settings::<B>(device).bool_dtype;
    B::bool_from_data(TensorData::new(values, shape(d)).convert_dtype(store.into()), device)
}

/// Zeros of shape `d` and float type `dtype`. In `f32` they are made from a typed buffer:
/// burn-flex's `float_zeros` makes bytes and copies them once to align them, which holds
/// the tensor twice for a moment.
pub(crate) fn zeros<B: Backend>(d: &[usize], dtype: DType, device: &B::Device) -> FloatTensor<B> {
    match dtype {
        DType::F32 => crate::value::zeros::<B>(d.to_vec(), device),
        _ => B::float_zeros(shape(d), device, dtype.into()),
    }
}

/// A tensor of shape `d` that holds no memory of its own (one zero, broadcast), for Burn
/// primitives that read only the shape of an argument (pooling backwards).
pub(crate) fn shape_only<B: Backend>(d: &[usize], dtype: DType, device: &B::Device) -> FloatTensor<B> {
    let one = zeros::<B>(&vec![1; d.len()], dtype, device);
    B::float_expand(one, shape(d))
}

/// Seed tags of the random streams, so that two masks of one op never share a stream.
pub(crate) const TAG_DROPOUT: u64 = 0x6472_6f70_6f75_7401;
/// Attention dropout.
pub(crate) const TAG_ATTENTION: u64 = 0x6174_7465_6e74_6902;

/// A dropout keep-mask of `n` entries in row-major order: entry `i` is kept when the
/// `i`-th draw of the stream is below `1 - p`.
pub(crate) fn keep_mask(seed: u64, n: usize, p: f64) -> Vec<bool> {
    let mut rng = SplitMix(seed);
    let keep = 1.0 - p;
    (0..n).map(|_| rng.uniform() < keep).collect()
}

/// Applies a keep-mask with inverted scaling: `x / (1 - p)` where kept, 0 elsewhere.
pub(crate) fn apply_keep<B: Backend>(x: FloatTensor<B>, keep: BoolTensor<B>, p: f64) -> FloatTensor<B> {
    let x = B::float_mul_scalar(x, sc(1.0 / (1.0 - p)));
    B::float_mask_fill(x, B::bool_not(keep), sc(0.0))
}

/// The element type of a value, in the declaration's terms.
fn elem_of<B: Backend>(v: &Value<B>) -> Elem {
    match v {
        Value::Float(_) => Elem::Float,
        Value::Int(_) => Elem::Int,
        Value::Bool(_) => Elem::Byte,
    }
}

/// Checks that the parameters have the declared shapes.
pub(crate) fn check_params<B: Backend>(op: &NetOp, params: &[FloatTensor<B>]) -> Result<(), RuntimeError> {
    if params.len() != op.decl.params.len() {
        return Err(unsupported(op, &format!("got {} parameters, declared {}", params.len(), op.decl.params.len())));
    }
    for (p, (name, want)) in params.iter().zip(&op.decl.params) {
        let got = dims(p);
        if got != *want {
            return Err(unsupported(op, &format!("parameter `{name}` has shape {got:?}, declared {want:?}")));
        }
    }
    Ok(())
}

/// Declares the op again for these operands and checks that it agrees with the network's
/// declaration: then every shape the Burn primitives see is one the planner counted.
fn redeclare(op: &NetOp, operands: Vec<Operand>) -> Result<(), RuntimeError> {
    let shapes: Vec<Vec<usize>> = operands.iter().map(|o| o.shape.clone()).collect();
    let decl = op.kind.declare(&operands).map_err(|e| unsupported(op, &format!("operands {shapes:?}: {e}")))?;
    if decl.output != op.decl.output || decl.params != op.decl.params || decl.saved != op.decl.saved {
        return Err(unsupported(
            op,
            &format!("operands {shapes:?} give output {:?}, declared {:?}", decl.output, op.decl.output),
        ));
    }
    Ok(())
}

/// Checks a forward's (or a loss's) operands against the declaration.
pub(crate) fn check_forward<B: Backend>(
    op: &NetOp,
    inputs: &[Value<B>],
    params: &[FloatTensor<B>],
) -> Result<(), RuntimeError> {
    redeclare(op, inputs.iter().map(|v| Operand { shape: v.dims(), elem: elem_of(v) }).collect())?;
    check_params::<B>(op, params)
}

/// The element type of input `k` when it has a gradient path (embedding ids are integers).
fn input_elem(op: &NetOp) -> Elem {
    match op.kind {
        OpKind::Embedding { .. } => Elem::Int,
        _ => Elem::Float,
    }
}

/// Checks a backward's operands: input shapes, output gradient, saved tensors (kind and
/// shape) and, when the backward reads them, the parameters.
pub(crate) fn check_backward<B: Backend>(
    op: &NetOp,
    input_dims: &[Vec<usize>],
    grad_out: &FloatTensor<B>,
    saved: &[Value<B>],
    params: &[FloatTensor<B>],
    needs: &[bool],
) -> Result<(), RuntimeError> {
    if needs.len() != input_dims.len() {
        return Err(unsupported(op, &format!("{} input shapes but {} `needs` flags", input_dims.len(), needs.len())));
    }
    let elem = input_elem(op);
    redeclare(op, input_dims.iter().map(|d| Operand { shape: d.clone(), elem }).collect())?;
    let g = dims(grad_out);
    if g != op.decl.output {
        return Err(unsupported(op, &format!("output gradient {g:?}, declared output {:?}", op.decl.output)));
    }
    for (i, (s, v)) in op.decl.saved.iter().zip(saved).enumerate() {
        let (want, want_elem) = match s {
            Saved::Input(k) => (input_dims[*k].clone(), elem),
            Saved::Output => (op.decl.output.clone(), op.decl.output_elem),
            Saved::Extra { shape, elem, .. } => (shape.clone(), *elem),
        };
        if v.dims() != want || elem_of(v) != want_elem {
            return Err(unsupported(
                op,
                &format!("saved tensor {i} is {} {:?}, declared {want_elem:?} {want:?}", v.kind(), v.dims()),
            ));
        }
    }
    if op.decl.backward_reads_params {
        check_params::<B>(op, params)?;
    }
    Ok(())
}

/// Takes saved tensor `i` as a float tensor.
pub(crate) fn saved_float<B: Backend>(op: &NetOp, v: Value<B>, i: usize) -> Result<FloatTensor<B>, RuntimeError> {
    let kind = v.kind();
    v.float().ok_or_else(|| unsupported(op, &format!("saved tensor {i} must be float, got {kind}")))
}

/// Takes saved tensor `i` as a boolean tensor.
pub(crate) fn saved_bool<B: Backend>(op: &NetOp, v: Value<B>, i: usize) -> Result<BoolTensor<B>, RuntimeError> {
    let kind = v.kind();
    v.bool().ok_or_else(|| unsupported(op, &format!("saved tensor {i} must be bool, got {kind}")))
}

/// Softmax over the last dimension.
pub(crate) fn softmax_last<B: Backend>(x: FloatTensor<B>) -> FloatTensor<B> {
    let last = dims(&x).len() - 1;
    B::softmax(x, last)
}

/// The backward of a softmax over the last dimension, from its output `y`:
/// `y ⊙ (g − Σ g ⊙ y)`.
pub(crate) fn softmax_last_backward<B: Backend>(y: FloatTensor<B>, g: FloatTensor<B>) -> FloatTensor<B> {
    let last = dims(&y).len() - 1;
    let dot = B::float_sum_dim(B::float_mul(g.clone(), y.clone()), last);
    B::float_mul(y, B::float_sub(g, dot))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keep_mask_rate() {
        let m = keep_mask(7, 100_000, 0.25);
        let kept = m.iter().filter(|&&k| k).count() as f64 / m.len() as f64;
        assert!((kept - 0.75).abs() < 0.01, "{kept}");
        assert_eq!(m, keep_mask(7, 100_000, 0.25));
        assert_ne!(m, keep_mask(8, 100_000, 0.25));
        assert!(keep_mask(3, 1000, 0.0).iter().all(|&k| k));
    }
}
