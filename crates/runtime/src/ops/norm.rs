//! Batch normalization (training mode), layer normalization and RMS normalization.
//!
//! * BatchNorm2d normalizes `[N, C, H, W]` per channel with the batch's mean and biased
//!   variance, eps 1e-5, always (no running statistics: a forward without grad is
//!   bit-identical to one with grad). Saves `mean` and `invstd` (`[C]`).
//! * LayerNorm normalizes the last dimension, eps 1e-5; saves `rstd` and `mean` (`[rows]`).
//! * RmsNorm scales the last dimension by `1/√(mean(x²) + 1e-6)`; saves `rstd` (`[rows]`).

use burn_backend::tensor::FloatTensor;
use burn_backend::Backend;
use pebble_zoo::{NetOp, OpKind};

use super::util::{dims, numel, reshape, saved_float, sc, sum_dims, sum_leading};
use super::{first_float, unsupported, Forward, Grads, OpCtx};
use crate::{RuntimeError, Value};

const BN_EPS: f64 = 1e-5;
const LN_EPS: f64 = 1e-5;
const RMS_EPS: f64 = 1e-6;

pub(super) fn forward<B: Backend>(
    op: &NetOp,
    inputs: Vec<Value<B>>,
    params: &[FloatTensor<B>],
    ctx: &OpCtx<'_, B>,
) -> Result<Forward<B>, RuntimeError> {
    let x = first_float(op, inputs)?;
    let d = dims(&x);
    let (out, extras) = match &op.kind {
        OpKind::BatchNorm2d => {
            let c = d[1];
            let m = (d[0] * d[2] * d[3]) as f64;
            let mean = B::float_mul_scalar(sum_dims::<B>(x.clone(), &[0, 2, 3]), sc(1.0 / m));
            let xc = B::float_sub(x, mean.clone());
            let var = B::float_mul_scalar(sum_dims::<B>(B::float_mul(xc.clone(), xc.clone()), &[0, 2, 3]), sc(1.0 / m));
            let invstd = rsqrt::<B>(var, BN_EPS);
            let scale = B::float_mul(invstd.clone(), reshape::<B>(params[0].clone(), &[1, c, 1, 1]));
            let y = B::float_add(B::float_mul(xc, scale), reshape::<B>(params[1].clone(), &[1, c, 1, 1]));
            (y, vec![reshape::<B>(mean, &[c]), reshape::<B>(invstd, &[c])])
        }
        OpKind::LayerNorm { bias } => {
            let last = d.len() - 1;
            let e = d[last];
            let rows = numel(&d) / e.max(1);
            let mean = B::float_mean_dim(x.clone(), last);
            let xc = B::float_sub(x, mean.clone());
            let var = B::float_mean_dim(B::float_mul(xc.clone(), xc.clone()), last);
            let rstd = rsqrt::<B>(var, LN_EPS);
            let y = B::float_mul(B::float_mul(xc, rstd.clone()), row_param::<B>(params[0].clone(), d.len()));
            let y = if *bias { B::float_add(y, row_param::<B>(params[1].clone(), d.len())) } else { y };
            (y, vec![reshape::<B>(rstd, &[rows]), reshape::<B>(mean, &[rows])])
        }
        OpKind::RmsNorm => {
            let last = d.len() - 1;
            let e = d[last];
            let rows = numel(&d) / e.max(1);
            let ms = B::float_mean_dim(B::float_mul(x.clone(), x.clone()), last);
            let rstd = rsqrt::<B>(ms, RMS_EPS);
            let y = B::float_mul(B::float_mul(x, rstd.clone()), row_param::<B>(params[0].clone(), d.len()));
            (y, vec![reshape::<B>(rstd, &[rows])])
        }
        _ => return Err(unsupported(op, "not a normalization")),
    };
    let extras = if ctx.grad { extras.into_iter().map(Value::Float).collect() } else { Vec::new() };
    Ok(Forward { output: Value::Float(out), extras })
}

/// `1/√(v + eps)`.
fn rsqrt<B: Backend>(v: FloatTensor<B>, eps: f64) -> FloatTensor<B> {
    B::float_recip(B::float_sqrt(B::float_add_scalar(v, sc(eps))))
}

/// A `[E]` parameter as `[1, .., 1, E]`.
fn row_param<B: Backend>(p: FloatTensor<B>, rank: usize) -> FloatTensor<B> {
    let e = dims(&p)[0];
    let mut d = vec![1; rank.saturating_sub(1)];
    d.push(e);
    reshape::<B>(p, &d)
}

pub(super) fn backward<B: Backend>(
    op: &NetOp,
    grad_out: FloatTensor<B>,
    saved: Vec<Value<B>>,
    params: &[FloatTensor<B>],
    needs: &[bool],
) -> Result<Grads<B>, RuntimeError> {
    let mut s = saved.into_iter().enumerate().map(|(i, v)| saved_float(op, v, i));
    let mut next = || s.next().unwrap_or_else(|| Err(unsupported(op, "missing saved tensor")));
    let x = next()?;
    let d = dims(&x);
    let need_x = needs.first().copied().unwrap_or(false);
    match &op.kind {
        OpKind::BatchNorm2d => {
            let c = d[1];
            let m = (d[0] * d[2] * d[3]) as f64;
            let mean = reshape::<B>(next()?, &[1, c, 1, 1]);
            let invstd = reshape::<B>(next()?, &[1, c, 1, 1]);
            let xhat = B::float_mul(B::float_sub(x, mean), invstd.clone());
            let dbeta = sum_dims::<B>(grad_out.clone(), &[0, 2, 3]);
            let dgamma = sum_dims::<B>(B::float_mul(grad_out.clone(), xhat.clone()), &[0, 2, 3]);
            let dx = need_x.then(|| {
                // dx = γ·invstd/M · (M·g − Σg − x̂·Σ(g·x̂))
                let k = B::float_mul_scalar(
                    B::float_mul(invstd, reshape::<B>(params[0].clone(), &[1, c, 1, 1])),
                    sc(1.0 / m),
                );
                let inner = B::float_sub(
                    B::float_sub(B::float_mul_scalar(grad_out, sc(m)), dbeta.clone()),
                    B::float_mul(xhat, dgamma.clone()),
                );
                B::float_mul(inner, k)
            });
            Ok(Grads { inputs: vec![dx], params: vec![reshape::<B>(dgamma, &[c]), reshape::<B>(dbeta, &[c])] })
        }
        OpKind::LayerNorm { bias } => {
            let last = d.len() - 1;
            let e = d[last];
            let mut stat = d.clone();
            stat[last] = 1;
            let rstd = reshape::<B>(next()?, &stat);
            let mean = reshape::<B>(next()?, &stat);
            let xhat = B::float_mul(B::float_sub(x, mean), rstd.clone());
            let dgamma = sum_leading::<B>(B::float_mul(grad_out.clone(), xhat.clone()), &[e]);
            let mut grads = vec![dgamma];
            if *bias {
                grads.push(sum_leading::<B>(grad_out.clone(), &[e]));
            }
            let dx = need_x.then(|| {
                // dx = rstd·(ĝ − mean(ĝ) − x̂·mean(ĝ·x̂)), ĝ = g·γ
                let gh = B::float_mul(grad_out, row_param::<B>(params[0].clone(), d.len()));
                let m1 = B::float_mean_dim(gh.clone(), last);
                let m2 = B::float_mean_dim(B::float_mul(gh.clone(), xhat.clone()), last);
                let inner = B::float_sub(B::float_sub(gh, m1), B::float_mul(xhat, m2));
                B::float_mul(inner, rstd)
            });
            Ok(Grads { inputs: vec![dx], params: grads })
        }
        OpKind::RmsNorm => {
            let last = d.len() - 1;
            let e = d[last];
            let mut stat = d.clone();
            stat[last] = 1;
            let rstd = reshape::<B>(next()?, &stat);
            let xhat = B::float_mul(x, rstd.clone());
            let dgamma = sum_leading::<B>(B::float_mul(grad_out.clone(), xhat.clone()), &[e]);
            let dx = need_x.then(|| {
                // dx = rstd·(ĝ − x̂·mean(ĝ·x̂)), ĝ = g·γ
                let gh = B::float_mul(grad_out, row_param::<B>(params[0].clone(), d.len()));
                let m2 = B::float_mean_dim(B::float_mul(gh.clone(), xhat.clone()), last);
                B::float_mul(B::float_sub(gh, B::float_mul(xhat, m2)), rstd)
            });
            Ok(Grads { inputs: vec![dx], params: vec![dgamma] })
        }
        _ => Err(unsupported(op, "not a normalization")),
    }
}
