//! 2-D convolutions (square, rectangular, transposed) on Burn's conv primitives and their backward primitives.
//!
//! Weights are in PyTorch's layout, which is also Burn's: a convolution's `[out, in/groups,
//! kh, kw]`, a transposed convolution's `[in, out, k, k]` (kernel = stride, no padding).

use burn_backend::ops::{ConvOptions, ConvTransposeOptions};
use burn_backend::tensor::FloatTensor;
use burn_backend::Backend;
use pebble_zoo::{NetOp, OpKind};

use super::util::saved_float;
use super::{first_float, unsupported, Forward, Grads};
use crate::{RuntimeError, Value};

/// What a convolution op is, for Burn.
enum Conv {
    Direct(ConvOptions<2>),
    Transposed(ConvTransposeOptions<2>),
}

fn options(op: &NetOp) -> Result<(Conv, bool), RuntimeError> {
    // The declaration rejected zero strides and groups, which Burn's constructors assert on.
    Ok(match &op.kind {
        OpKind::Conv2d { stride, padding, groups, bias, .. } => {
            (Conv::Direct(ConvOptions::new([*stride; 2], [*padding; 2], [1, 1], *groups)), *bias)
        }
        OpKind::Conv2dRect { stride, pad_h, pad_w, bias, .. } => {
            (Conv::Direct(ConvOptions::new([*stride; 2], [*pad_h, *pad_w], [1, 1], 1)), *bias)
        }
        OpKind::ConvTranspose2d { kernel, bias, .. } => {
            if *kernel == 0 {
                return Err(unsupported(op, "kernel (= stride) 0"));
            }
            (Conv::Transposed(ConvTransposeOptions::new([*kernel; 2], [0, 0], [0, 0], [1, 1], 1)), *bias)
        }
        _ => return Err(unsupported(op, "not a convolution")),
    })
}

pub(super) fn forward<B: Backend>(
    op: &NetOp,
    inputs: Vec<Value<B>>,
    params: &[FloatTensor<B>],
) -> Result<Forward<B>, RuntimeError> {
    let x = first_float(op, inputs)?;
    let (conv, bias) = options(op)?;
    let w = params[0].clone();
    let b = bias.then(|| params[1].clone());
    let y = match conv {
        Conv::Direct(o) => B::conv2d(x, w, b, o),
        Conv::Transposed(o) => B::conv_transpose2d(x, w, b, o),
    };
    Ok(Forward { output: Value::Float(y), extras: Vec::new() })
}

pub(super) fn backward<B: Backend>(
    op: &NetOp,
    grad_out: FloatTensor<B>,
    saved: Vec<Value<B>>,
    params: &[FloatTensor<B>],
    needs: &[bool],
) -> Result<Grads<B>, RuntimeError> {
    let x = saved_float(op, saved.into_iter().next().ok_or_else(|| unsupported(op, "missing its input"))?, 0)?;
    let (conv, bias) = options(op)?;
    let w = params[0].clone();
    let need_x = needs.first().copied().unwrap_or(false);
    let mut grads = Vec::with_capacity(2);
    let dx = match conv {
        Conv::Direct(o) => {
            let dx = need_x.then(|| B::conv2d_x_backward(x.clone(), w.clone(), grad_out.clone(), o.clone()));
            let strided = o.stride.iter().any(|&s| s > 1);
            grads.push(own_buffer::<B>(B::conv2d_weight_backward(x.clone(), w, grad_out.clone(), o), strided));
            if bias {
                grads.push(B::conv2d_bias_backward(x, params[1].clone(), grad_out));
            }
            dx
        }
        Conv::Transposed(o) => {
            let dx = need_x.then(|| B::conv_transpose2d_x_backward(w.clone(), grad_out.clone(), o.clone()));
            grads.push(B::conv_transpose2d_weight_backward(x.clone(), w, grad_out.clone(), o));
            if bias {
                grads.push(B::conv_transpose2d_bias_backward(x, params[1].clone(), grad_out));
            }
            dx
        }
    };
    Ok(Grads { inputs: vec![dx], params: grads })
}

/// Burn's weight gradient of a strided convolution is a slice of a larger one (the
/// input convolved with the output's gradient dilated by the stride), and the slice
/// keeps the whole buffer alive: 16/9 of a 3×3 kernel's bytes at stride 2, 4× a 1×1's.
/// Where that can happen, the gradient is copied into a buffer of its own (a strided
/// view flattens only by a copy), so that the rest goes when the op ends.
fn own_buffer<B: Backend>(g: FloatTensor<B>, strided: bool) -> FloatTensor<B> {
    if !strided {
        return g;
    }
    let dims = super::util::dims(&g);
    let flat = B::float_reshape(g, burn_backend::Shape::from(vec![super::util::numel(&dims)]));
    B::float_reshape(flat, burn_backend::Shape::from(dims))
}
