//! Linear, embedding, and the shape and arithmetic ops: reshape, slice, add, mul, concat.
//!
//! Parameters are in PyTorch's layout: a linear weight is `[out, in]` (`y = x·Wᵀ + b`), an
//! embedding table `[vocab, dim]`.

use burn_backend::tensor::FloatTensor;
use burn_backend::{Backend, TensorMetadata};
use pebble_zoo::{NetOp, OpKind};

use super::util::{dims, lead_ones, numel, ranges, reshape, shape, sum_leading, zeros};
use super::{float_in, unsupported, Forward, Grads, OpCtx};
use crate::{RuntimeError, Value};

pub(super) fn forward<B: Backend>(
    op: &NetOp,
    inputs: Vec<Value<B>>,
    params: &[FloatTensor<B>],
    _ctx: &OpCtx<'_, B>,
) -> Result<Forward<B>, RuntimeError> {
    let mut it = inputs.into_iter();
    let mut next = |k: usize| it.next().ok_or_else(|| unsupported(op, &format!("missing input {k}")));
    let output = match &op.kind {
        OpKind::Linear { bias, .. } => {
            let x = float_in(op, next(0)?, 0)?;
            Value::Float(linear::<B>(x, params[0].clone(), bias.then(|| params[1].clone())))
        }
        OpKind::Embedding { dim, .. } => {
            let v = next(0)?;
            let kind = v.kind();
            let ids = v.int().ok_or_else(|| unsupported(op, &format!("ids must be integers, got {kind}")))?;
            let d = ids.shape().to_vec();
            let n = numel(&d);
            // Burn's embedding takes `[batch, seq]` ids.
            let ids = B::int_reshape(ids, shape(&[1, n]));
            let rows = B::embedding(params[0].clone(), ids);
            let mut out = d;
            out.push(*dim);
            Value::Float(reshape::<B>(rows, &out))
        }
        OpKind::Reshape { shape: to } => match next(0)? {
            Value::Float(t) => Value::Float(B::float_reshape(t, shape(to))),
            Value::Int(t) => Value::Int(B::int_reshape(t, shape(to))),
            Value::Bool(t) => Value::Bool(B::bool_reshape(t, shape(to))),
        },
        OpKind::Slice { start, len } => {
            let v = next(0)?;
            let d = v.dims();
            let s = ranges(&d, d.len() - 1, *start..start + len);
            match v {
                Value::Float(t) => Value::Float(B::float_slice(t, &s)),
                Value::Int(t) => Value::Int(B::int_slice(t, &s)),
                Value::Bool(t) => Value::Bool(B::bool_slice(t, &s)),
            }
        }
        OpKind::Add => {
            let x = float_in(op, next(0)?, 0)?;
            let y = float_in(op, next(1)?, 1)?;
            let (xd, yd) = (dims(&x), dims(&y));
            let y = if xd == yd { y } else { reshape::<B>(y, &lead_ones(&yd, xd.len())) };
            Value::Float(B::float_add(x, y))
        }
        OpKind::Mul => {
            let x = float_in(op, next(0)?, 0)?;
            let y = float_in(op, next(1)?, 1)?;
            Value::Float(B::float_mul(x, y))
        }
        OpKind::Concat { dim } => {
            let mut parts = Vec::new();
            for (k, v) in it.enumerate() {
                parts.push(float_in(op, v, k)?);
            }
            if parts.len() == 1 {
                Value::Float(parts.pop().expect("one part"))
            } else {
                Value::Float(B::float_cat(parts, *dim))
            }
        }
        _ => return Err(unsupported(op, "not a basic op")),
    };
    Ok(Forward { output, extras: Vec::new() })
}

/// `y = x·Wᵀ + b` on the last dimension, through a 2-D matmul.
fn linear<B: Backend>(x: FloatTensor<B>, w: FloatTensor<B>, b: Option<FloatTensor<B>>) -> FloatTensor<B> {
    let mut d = dims(&x);
    let k = *d.last().expect("declared at least 1-D");
    let out = dims(&w)[0];
    let rows = numel(&d) / k.max(1);
    let y = B::float_matmul(reshape::<B>(x, &[rows, k]), B::float_transpose(w));
    let y = match b {
        Some(b) => B::float_add(y, reshape::<B>(b, &[1, out])),
        None => y,
    };
    *d.last_mut().expect("non-empty") = out;
    reshape::<B>(y, &d)
}

pub(super) fn backward<B: Backend>(
    op: &NetOp,
    input_dims: &[Vec<usize>],
    grad_out: FloatTensor<B>,
    saved: Vec<Value<B>>,
    params: &[FloatTensor<B>],
    needs: &[bool],
    ctx: &OpCtx<'_, B>,
) -> Result<Grads<B>, RuntimeError> {
    let mut saved = saved.into_iter();
    match &op.kind {
        OpKind::Linear { bias, out_features } => {
            let x = saved.next().and_then(Value::float).ok_or_else(|| unsupported(op, "needs its float input"))?;
            let xd = &input_dims[0];
            let k = *xd.last().expect("declared at least 1-D");
            let rows = numel(xd) / k.max(1);
            let g2 = reshape::<B>(grad_out, &[rows, *out_features]);
            let w = params[0].clone();
            let dx = needs[0].then(|| reshape::<B>(B::float_matmul(g2.clone(), w), xd));
            let dw = B::float_matmul(B::float_transpose(g2.clone()), reshape::<B>(x, &[rows, k]));
            let mut grads = vec![dw];
            if *bias {
                grads.push(reshape::<B>(B::float_sum_dim(g2, 0), &[*out_features]));
            }
            Ok(Grads { inputs: vec![dx], params: grads })
        }
        OpKind::Embedding { vocab, dim } => {
            let v = saved.next().ok_or_else(|| unsupported(op, "needs its ids"))?;
            let kind = v.kind();
            let ids = v.int().ok_or_else(|| unsupported(op, &format!("ids must be integers, got {kind}")))?;
            let n = numel(&input_dims[0]);
            let ids = B::int_reshape(ids, shape(&[n]));
            let g = reshape::<B>(grad_out, &[n, *dim]);
            // Burn's embedding backward, with the zeros made without a second copy.
            let dw = B::float_select_add(zeros::<B>(&[*vocab, *dim], g.dtype(), ctx.device), 0, ids, g);
            Ok(Grads { inputs: vec![None], params: vec![dw] })
        }
        OpKind::Reshape { .. } => {
            Ok(Grads { inputs: vec![needs[0].then(|| reshape::<B>(grad_out, &input_dims[0]))], params: vec![] })
        }
        OpKind::Slice { start, len } => {
            let dx = needs[0].then(|| {
                let d = &input_dims[0];
                let z = zeros::<B>(d, grad_out.dtype(), ctx.device);
                B::float_slice_assign(z, &ranges(d, d.len() - 1, *start..start + len), grad_out)
            });
            Ok(Grads { inputs: vec![dx], params: vec![] })
        }
        OpKind::Add => {
            let dy = needs[1].then(|| sum_leading::<B>(grad_out.clone(), &input_dims[1]));
            Ok(Grads { inputs: vec![needs[0].then_some(grad_out), dy], params: vec![] })
        }
        OpKind::Mul => {
            let x = saved.next().and_then(Value::float).ok_or_else(|| unsupported(op, "needs its inputs"))?;
            let y = saved.next().and_then(Value::float).ok_or_else(|| unsupported(op, "needs its inputs"))?;
            let dx = needs[0].then(|| B::float_mul(grad_out.clone(), y));
            let dy = needs[1].then(|| B::float_mul(grad_out, x));
            Ok(Grads { inputs: vec![dx, dy], params: vec![] })
        }
        OpKind::Concat { dim } => {
            let mut offset = 0;
            let mut inputs = Vec::with_capacity(input_dims.len());
            for (d, &need) in input_dims.iter().zip(needs) {
                let len = d[*dim];
                inputs.push(need.then(|| {
                    if len == 0 {
                        zeros::<B>(d, grad_out.dtype(), ctx.device)
                    } else if len == dims(&grad_out)[*dim] {
                        grad_out.clone()
                    } else {
                        B::float_slice(grad_out.clone(), &ranges(&dims(&grad_out), *dim, offset..offset + len))
                    }
                }));
                offset += len;
            }
            Ok(Grads { inputs, params: vec![] })
        }
        _ => Err(unsupported(op, "not a basic op")),
    }
}
