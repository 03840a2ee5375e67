//! ReLU, GELU, SiLU, softmax and dropout.
//!
//! * GELU is the tanh approximation (GPT-2's `gelu_new`, PyTorch's
//!   `gelu(approximate="tanh")`): `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`, built from
//!   elementwise primitives, with its exact derivative as the backward. (Burn's own `gelu`
//!   is the erf form while its `gelu_backward` differentiates the tanh form, so neither is
//!   used.)
//! * Dropout draws its keep-mask on the host from the op's seed ([`util::keep_mask`]),
//!   never from Burn's generator, and keeps it as a boolean tensor (the declared `mask`).

use burn_backend::tensor::BoolTensor;
use burn_backend::tensor::FloatTensor;
use burn_backend::Backend;
use pebble_zoo::{NetOp, OpKind};

use super::util::{self, apply_keep, bool_const, dims, numel, saved_bool, saved_float, sc};
use super::{first_float, unsupported, Forward, Grads, OpCtx};
use crate::{RuntimeError, Value};

/// √(2/π).
const GELU_C: f64 = 0.797_884_560_802_865_4;
/// The cubic coefficient of the tanh approximation.
const GELU_A: f64 = 0.044_715;

pub(super) fn forward<B: Backend>(
    op: &NetOp,
    inputs: Vec<Value<B>>,
    ctx: &OpCtx<'_, B>,
) -> Result<Forward<B>, RuntimeError> {
    let x = first_float(op, inputs)?;
    let mut extras = Vec::new();
    let out = match &op.kind {
        OpKind::Relu => B::relu(x),
        OpKind::Gelu => gelu_tanh::<B>(x),
        OpKind::Silu => B::float_mul(x.clone(), B::sigmoid(x)),
        OpKind::Softmax => util::softmax_last::<B>(x),
        OpKind::Dropout { p } => {
            let d = dims(&x);
            let keep = keep_tensor::<B>(ctx.seed, &d, *p, ctx.device);
            let out = apply_keep::<B>(x, keep.clone(), *p);
            if ctx.grad {
                extras.push(Value::Bool(keep));
            }
            out
        }
        _ => return Err(unsupported(op, "not an activation")),
    };
    Ok(Forward { output: Value::Float(out), extras })
}

/// The dropout keep-mask of an op with this seed, uploaded.
fn keep_tensor<B: Backend>(seed: u64, d: &[usize], p: f64, device: &B::Device) -> BoolTensor<B> {
    let mask = util::keep_mask(util::derive_seed(seed, util::TAG_DROPOUT), numel(d), p);
    bool_const::<B>(mask, d, device)
}

/// `x·(C + C·A·x²)`, the argument of the tanh.
fn gelu_inner<B: Backend>(x: FloatTensor<B>, x2: FloatTensor<B>) -> FloatTensor<B> {
    let poly = B::float_add_scalar(B::float_mul_scalar(x2, sc(GELU_C * GELU_A)), sc(GELU_C));
    B::float_mul(x, poly)
}

fn gelu_tanh<B: Backend>(x: FloatTensor<B>) -> FloatTensor<B> {
    let x2 = B::float_mul(x.clone(), x.clone());
    let t = B::float_tanh(gelu_inner::<B>(x.clone(), x2));
    let half_x = B::float_mul_scalar(x, sc(0.5));
    B::float_mul(half_x, B::float_add_scalar(t, sc(1.0)))
}

/// `d/dx = ½(1 + t) + ½·x·(1 − t²)·C·(1 + 3A·x²)`, `t = tanh(C·(x + A·x³))`.
fn gelu_tanh_backward<B: Backend>(x: FloatTensor<B>, g: FloatTensor<B>) -> FloatTensor<B> {
    let x2 = B::float_mul(x.clone(), x.clone());
    let t = B::float_tanh(gelu_inner::<B>(x.clone(), x2.clone()));
    let dinner = B::float_add_scalar(B::float_mul_scalar(x2, sc(3.0 * GELU_C * GELU_A)), sc(GELU_C));
    let sech2 = B::float_add_scalar(B::float_neg(B::float_mul(t.clone(), t.clone())), sc(1.0));
    let a = B::float_mul_scalar(B::float_add_scalar(t, sc(1.0)), sc(0.5));
    let b = B::float_mul(B::float_mul(B::float_mul_scalar(x, sc(0.5)), sech2), dinner);
    B::float_mul(g, B::float_add(a, b))
}

/// `d/dx x·σ(x) = σ(x)·(1 + x·(1 − σ(x)))`.
fn silu_backward<B: Backend>(x: FloatTensor<B>, g: FloatTensor<B>) -> FloatTensor<B> {
    let s = B::sigmoid(x.clone());
    let one_minus = B::float_add_scalar(B::float_neg(s.clone()), sc(1.0));
    let inner = B::float_add_scalar(B::float_mul(x, one_minus), sc(1.0));
    B::float_mul(g, B::float_mul(s, inner))
}

pub(super) fn backward<B: Backend>(
    op: &NetOp,
    grad_out: FloatTensor<B>,
    saved: Vec<Value<B>>,
    needs: &[bool],
) -> Result<Grads<B>, RuntimeError> {
    if !needs.first().copied().unwrap_or(false) {
        return Ok(Grads { inputs: vec![None], params: Vec::new() });
    }
    let s = saved.into_iter().next().ok_or_else(|| unsupported(op, "missing saved tensor"))?;
    let dx = match &op.kind {
        // Saved: the output.
        OpKind::Relu => B::relu_backward(saved_float(op, s, 0)?, grad_out),
        // Saved: the input.
        OpKind::Gelu => gelu_tanh_backward::<B>(saved_float(op, s, 0)?, grad_out),
        OpKind::Silu => silu_backward::<B>(saved_float(op, s, 0)?, grad_out),
        // Saved: the output.
        OpKind::Softmax => util::softmax_last_backward::<B>(saved_float(op, s, 0)?, grad_out),
        // Saved: the keep-mask.
        OpKind::Dropout { p } => apply_keep::<B>(grad_out, saved_bool(op, s, 0)?, *p),
        _ => return Err(unsupported(op, "not an activation")),
    };
    Ok(Grads { inputs: vec![Some(dx)], params: Vec::new() })
}
