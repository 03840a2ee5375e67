//! Max, average and adaptive average pooling.
//!
//! Max pooling saves its input and its argmax indices (an integer tensor, Burn's layout,
//! stored as the backend's integers: burn-flex returns them as `i64` whatever its
//! `IntElem`, and the planner counts them at the integer width the executor stores);
//! average pooling (`count_include_pad = true`, PyTorch's default) and adaptive average
//! pooling save nothing: their backwards need only the input's shape, given to Burn's
//! primitives as a broadcast stand-in that holds no memory.

use std::any::TypeId;
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use burn_backend::tensor::{FloatTensor, IntTensor};
use burn_backend::{Backend, Element, IntDType, TensorData, TensorMetadata};
use pebble_zoo::{NetOp, OpKind};

use super::util::{saved_float, shape_only};
use super::{first_float, unsupported, Forward, Grads, OpCtx};
use crate::{RuntimeError, Value};

pub(super) fn forward<B: Backend>(
    op: &NetOp,
    inputs: Vec<Value<B>>,
    ctx: &OpCtx<'_, B>,
) -> Result<Forward<B>, RuntimeError> {
    let x = first_float(op, inputs)?;
    let mut extras = Vec::new();
    let y = match &op.kind {
        OpKind::MaxPool2d { kernel, stride, padding } => {
            let (k, s, p) = ([*kernel; 2], [*stride; 2], [*padding; 2]);
            if ctx.grad {
                let r = B::max_pool2d_with_indices(x, k, s, p, [1, 1], false);
                extras.push(Value::Int(B::int_cast(r.indices, IntDType::from(B::IntElem::dtype()))));
                r.output
            } else {
                // Same maximum, without the indices the planner did not count.
                B::max_pool2d(x, k, s, p, [1, 1], false)
            }
        }
        OpKind::AvgPool2d { kernel, stride, padding } => {
            B::avg_pool2d(x, [*kernel; 2], [*stride; 2], [*padding; 2], true, false)
        }
        OpKind::AdaptiveAvgPool2d { out } => B::adaptive_avg_pool2d(x, [*out; 2]),
        _ => return Err(unsupported(op, "not a pooling")),
    };
    Ok(Forward { output: Value::Float(y), extras })
}

pub(super) fn backward<B: Backend>(
    op: &NetOp,
    input_dims: &[Vec<usize>],
    grad_out: FloatTensor<B>,
    saved: Vec<Value<B>>,
    needs: &[bool],
) -> Result<Grads<B>, RuntimeError> {
    if !needs.first().copied().unwrap_or(false) {
        return Ok(Grads { inputs: vec![None], params: Vec::new() });
    }
    let device = B::float_device(&grad_out);
    let dx = match &op.kind {
        OpKind::MaxPool2d { kernel, stride, padding } => {
            let mut s = saved.into_iter();
            let x = saved_float(op, s.next().ok_or_else(|| unsupported(op, "missing its input"))?, 0)?;
            let v = s.next().ok_or_else(|| unsupported(op, "missing its indices"))?;
            let kind = v.kind();
            let idx = v.int().ok_or_else(|| unsupported(op, &format!("indices must be integers, got {kind}")))?;
            let idx = B::int_cast(idx, native_indices::<B>(&device));
            B::max_pool2d_with_indices_backward(
                x,
                [*kernel; 2],
                [*stride; 2],
                [*padding; 2],
                [1, 1],
                false,
                grad_out,
                idx,
            )
            .x_grad
        }
        OpKind::AvgPool2d { kernel, stride, padding } => {
            let x = shape_only::<B>(&input_dims[0], grad_out.dtype(), &device);
            B::avg_pool2d_backward(x, grad_out, [*kernel; 2], [*stride; 2], [*padding; 2], true, false)
        }
        OpKind::AdaptiveAvgPool2d { .. } => {
            let x = shape_only::<B>(&input_dims[0], grad_out.dtype(), &device);
            B::adaptive_avg_pool2d_backward(x, grad_out)
        }
        _ => return Err(unsupported(op, "not a pooling")),
    };
    Ok(Grads { inputs: vec![Some(dx)], params: Vec::new() })
}

/// The integer type backend `B`'s max pooling gives its indices in, which its backward
/// reads them in (burn-flex: `i64`), asked of it once with a 2×2 pool.
fn native_indices<B: Backend>(device: &B::Device) -> IntDType {
    static NATIVE: OnceLock<Mutex<HashMap<TypeId, IntDType>>> = OnceLock::new();
    let known = NATIVE.get_or_init(Default::default);
    let key = TypeId::of::<B>();
    if let Some(&dtype) = known.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return dtype;
    }
    let x = B::float_from_data(TensorData::new(vec![0.0f32; 4], [1, 1, 2, 2]), device);
    let indices: IntTensor<B> = B::max_pool2d_with_indices(x, [2, 2], [2, 2], [0, 0], [1, 1], false).indices;
    let dtype = IntDType::from(indices.dtype());
    known.lock().unwrap_or_else(|e| e.into_inner()).insert(key, dtype);
    dtype
}
