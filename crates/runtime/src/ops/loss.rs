//! Losses: cross-entropy against integer labels, and mean squared error. Mean reduction.
//!
//! * CrossEntropy: logits `[.., C]`, integer labels `[..]`; `−mean(log_softmax(logits)[label])`
//!   over the rows; gradient `(softmax − onehot) / rows`.
//! * Mse: `mean((x − y)²)` over all elements; gradient `2(x − y)/n` (negated for `y`).
//!
//! Values are one-element tensors `[1]`.

use burn_backend::tensor::{FloatTensor, IntTensor};
use burn_backend::{Backend, TensorMetadata};
use pebble_zoo::{NetOp, OpKind};

use super::util::{dims, numel, reshape, sc, shape};
use super::{float_in, unsupported, LossOut, OpCtx};
use crate::{RuntimeError, Value};

/// The operands of a loss.
enum Operands<B: Backend> {
    CrossEntropy { logits: FloatTensor<B>, labels: IntTensor<B> },
    Mse { x: FloatTensor<B>, y: FloatTensor<B> },
}

fn operands<B: Backend>(op: &NetOp, inputs: Vec<Value<B>>) -> Result<Operands<B>, RuntimeError> {
    let mut it = inputs.into_iter();
    let a = it.next().ok_or_else(|| unsupported(op, "missing input 0"))?;
    let b = it.next().ok_or_else(|| unsupported(op, "missing input 1"))?;
    match &op.kind {
        OpKind::CrossEntropy => {
            let logits = float_in(op, a, 0)?;
            let kind = b.kind();
            let labels = b.int().ok_or_else(|| unsupported(op, &format!("labels must be integers, got {kind}")))?;
            Ok(Operands::CrossEntropy { logits, labels })
        }
        OpKind::Mse => Ok(Operands::Mse { x: float_in(op, a, 0)?, y: float_in(op, b, 1)? }),
        _ => Err(unsupported(op, "not a loss")),
    }
}

/// `[rows, C]` log-probabilities and `[rows, 1]` labels.
fn log_probs<B: Backend>(logits: FloatTensor<B>, labels: IntTensor<B>) -> (FloatTensor<B>, IntTensor<B>, usize) {
    let d = dims(&logits);
    let c = *d.last().expect("declared non-empty");
    let rows = numel(&d) / c.max(1);
    let logp = B::log_softmax(reshape::<B>(logits, &[rows, c]), 1);
    (logp, B::int_reshape(labels, shape(&[rows, 1])), rows)
}

fn ce_value<B: Backend>(logp: FloatTensor<B>, labels: IntTensor<B>, rows: usize) -> FloatTensor<B> {
    let picked = B::float_gather(1, logp, labels);
    reshape::<B>(B::float_mul_scalar(B::float_sum(picked), sc(-1.0 / rows as f64)), &[1])
}

fn mse_value<B: Backend>(diff: FloatTensor<B>) -> FloatTensor<B> {
    let n = numel(&dims(&diff)) as f64;
    reshape::<B>(B::float_mul_scalar(B::float_sum(B::float_mul(diff.clone(), diff)), sc(1.0 / n)), &[1])
}

pub(super) fn run<B: Backend>(
    op: &NetOp,
    inputs: Vec<Value<B>>,
    needs: &[bool],
    _ctx: &OpCtx<'_, B>,
) -> Result<LossOut<B>, RuntimeError> {
    if needs.len() != inputs.len() {
        return Err(unsupported(op, &format!("{} inputs but {} `needs` flags", inputs.len(), needs.len())));
    }
    match operands(op, inputs)? {
        Operands::CrossEntropy { logits, labels } => {
            let d = dims(&logits);
            let (logp, labels, rows) = log_probs::<B>(logits, labels);
            let value = ce_value::<B>(logp.clone(), labels.clone(), rows);
            let dx = needs[0].then(|| {
                let inv = 1.0 / rows as f64;
                let g = B::float_mul_scalar(B::float_exp(logp), sc(inv));
                let device = B::float_device(&g);
                let minus = B::float_full(shape(&[rows, 1]), sc(-inv), &device, g.dtype().into());
                reshape::<B>(B::float_scatter_add(1, g, labels, minus), &d)
            });
            Ok(LossOut { value, inputs: vec![dx, None] })
        }
        Operands::Mse { x, y } => {
            let diff = B::float_sub(x, y);
            let value = mse_value::<B>(diff.clone());
            let n = numel(&dims(&diff)) as f64;
            let gx = B::float_mul_scalar(diff, sc(2.0 / n));
            let gy = needs[1].then(|| B::float_neg(gx.clone()));
            Ok(LossOut { value, inputs: vec![needs[0].then_some(gx), gy] })
        }
    }
}

pub(super) fn value<B: Backend>(
    op: &NetOp,
    inputs: Vec<Value<B>>,
    _ctx: &OpCtx<'_, B>,
) -> Result<FloatTensor<B>, RuntimeError> {
    match operands(op, inputs)? {
        Operands::CrossEntropy { logits, labels } => {
            let (logp, labels, rows) = log_probs::<B>(logits, labels);
            Ok(ce_value::<B>(logp, labels, rows))
        }
        Operands::Mse { x, y } => Ok(mse_value::<B>(B::float_sub(x, y))),
    }
}
