//! The executable half of the op library.
//!
//! The planner's half is [`pebble_zoo::OpKind::declare`]: for every op it declares the
//! output, the parameters, what the backward needs ([`Saved`]) and the temporary memory.
//! This module gives each [`OpKind`](pebble_zoo::OpKind) its forward and its explicit backward on a Burn
//! [`Backend`], bound by that declaration:
//!
//! * [`forward`] returns the output and, when run with grad, one tensor per
//!   [`Saved::Extra`] of the declaration, in order (masks, statistics, attention weights);
//! * [`backward`] receives exactly the tensors the declaration lists in
//!   [`OpDecl::saved`](pebble_zoo::OpDecl::saved), in order, and nothing else: it cannot
//!   read a tensor the planner did not count;
//! * a loss runs forward and backward at once ([`loss`]).
//!
//! Random ops (dropout) draw from a seed the executor passes in [`OpCtx::seed`], derived
//! from the step and the op, never from a global generator: a recomputed forward draws the
//! same mask and is bit-identical to the first.

mod activation;
mod attention;
mod basic;
mod conv;
mod loss;
mod norm;
mod pool;
pub(crate) mod util;

use burn_backend::tensor::FloatTensor;
use burn_backend::Backend;
use pebble_zoo::ops::{Family, Saved};
use pebble_zoo::NetOp;

use crate::{RuntimeError, Value};

/// What an op's forward and backward need besides tensors.
pub struct OpCtx<'a, B: Backend> {
    /// Where tensors live.
    pub device: &'a B::Device,
    /// Whether the forward runs with grad (produces the saved extras).
    pub grad: bool,
    /// The op's random seed for this step.
    pub seed: u64,
}

/// A forward's results.
pub struct Forward<B: Backend> {
    /// The output.
    pub output: Value<B>,
    /// One tensor per [`Saved::Extra`] of the declaration, in order; empty without grad.
    pub extras: Vec<Value<B>>,
}

/// A backward's results.
pub struct Grads<B: Backend> {
    /// The gradient of each input: `None` where `needs[k]` was false.
    pub inputs: Vec<Option<FloatTensor<B>>>,
    /// The gradient of each parameter, in the declaration's order.
    pub params: Vec<FloatTensor<B>>,
}

/// A loss's results.
pub struct LossOut<B: Backend> {
    /// The loss, a one-element tensor.
    pub value: FloatTensor<B>,
    /// The gradient of each input: `None` where `needs[k]` was false.
    pub inputs: Vec<Option<FloatTensor<B>>>,
}

/// Why the ops the ONNX importer added (`lrn`, `permute`, `channel_affine`, `pool2d`) do
/// not run: the planner declares them, the executor has no kernels for them yet.
const NOT_EXECUTABLE: &str = "the planner declares this op (ONNX import) but the executor has no kernel for it yet";

fn unsupported(op: &NetOp, why: &str) -> RuntimeError {
    RuntimeError::Unsupported { op: op.name.clone(), kind: op.kind.name(), why: why.to_string() }
}

/// Takes input `k` as a float tensor.
pub(crate) fn float_in<B: Backend>(op: &NetOp, v: Value<B>, k: usize) -> Result<FloatTensor<B>, RuntimeError> {
    let kind = v.kind();
    v.float().ok_or_else(|| unsupported(op, &format!("input {k} must be float, got {kind}")))
}

/// Takes the first input as a float tensor (the only input of unary ops).
pub(crate) fn first_float<B: Backend>(op: &NetOp, inputs: Vec<Value<B>>) -> Result<FloatTensor<B>, RuntimeError> {
    float_in(op, inputs.into_iter().next().ok_or_else(|| unsupported(op, "missing input 0"))?, 0)
}

/// Runs an op's forward on its inputs and parameters (in the declaration's order).
pub fn forward<B: Backend>(
    op: &NetOp,
    inputs: Vec<Value<B>>,
    params: &[FloatTensor<B>],
    ctx: &OpCtx<'_, B>,
) -> Result<Forward<B>, RuntimeError> {
    if op.decl.loss {
        return Err(unsupported(op, "a loss runs through `loss`, not `forward`"));
    }
    util::check_forward(op, &inputs, params)?;
    let out = match op.kind.family() {
        Family::Basic => basic::forward(op, inputs, params, ctx)?,
        Family::Activation => activation::forward(op, inputs, ctx)?,
        Family::Conv => conv::forward(op, inputs, params)?,
        Family::Norm => norm::forward(op, inputs, params, ctx)?,
        Family::Pool => pool::forward(op, inputs, ctx)?,
        Family::Attention => attention::forward(op, inputs, ctx)?,
        Family::Onnx => return Err(unsupported(op, NOT_EXECUTABLE)),
        Family::Loss => unreachable!("losses are handled above"),
    };
    let extras = op.decl.saved.iter().filter(|s| matches!(s, Saved::Extra { .. })).count();
    debug_assert_eq!(out.extras.len(), if ctx.grad { extras } else { 0 }, "{}: extras", op.name);
    Ok(out)
}

/// Runs an op's backward: `saved` holds exactly the tensors of
/// [`OpDecl::saved`](pebble_zoo::OpDecl::saved), in order; `input_dims` the shapes of the
/// op's inputs; `needs[k]` says whether input `k` takes a gradient.
pub fn backward<B: Backend>(
    op: &NetOp,
    input_dims: &[Vec<usize>],
    grad_out: FloatTensor<B>,
    saved: Vec<Value<B>>,
    params: &[FloatTensor<B>],
    needs: &[bool],
    ctx: &OpCtx<'_, B>,
) -> Result<Grads<B>, RuntimeError> {
    if saved.len() != op.decl.saved.len() {
        return Err(unsupported(
            op,
            &format!("backward got {} saved tensors, declared {}", saved.len(), op.decl.saved.len()),
        ));
    }
    util::check_backward(op, input_dims, &grad_out, &saved, params, needs)?;
    match op.kind.family() {
        Family::Basic => basic::backward(op, input_dims, grad_out, saved, params, needs, ctx),
        Family::Activation => activation::backward(op, grad_out, saved, needs),
        Family::Conv => conv::backward(op, grad_out, saved, params, needs),
        Family::Norm => norm::backward(op, grad_out, saved, params, needs),
        Family::Pool => pool::backward(op, input_dims, grad_out, saved, needs),
        Family::Attention => attention::backward(op, input_dims, grad_out, saved, needs, ctx),
        Family::Onnx => Err(unsupported(op, NOT_EXECUTABLE)),
        Family::Loss => Err(unsupported(op, "a loss runs through `loss`, not `backward`")),
    }
}

/// Runs a loss forward and backward at once (mean reduction).
pub fn loss<B: Backend>(
    op: &NetOp,
    inputs: Vec<Value<B>>,
    needs: &[bool],
    ctx: &OpCtx<'_, B>,
) -> Result<LossOut<B>, RuntimeError> {
    match op.kind.family() {
        Family::Loss => {
            util::check_forward::<B>(op, &inputs, &[])?;
            loss::run(op, inputs, needs, ctx)
        }
        _ => Err(unsupported(op, "not a loss")),
    }
}

/// Runs a loss's forward only (no gradient): the loss value, for Burn's own autodiff,
/// which differentiates it itself.
pub fn loss_value<B: Backend>(
    op: &NetOp,
    inputs: Vec<Value<B>>,
    ctx: &OpCtx<'_, B>,
) -> Result<FloatTensor<B>, RuntimeError> {
    match op.kind.family() {
        Family::Loss => {
            util::check_forward::<B>(op, &inputs, &[])?;
            loss::value(op, inputs, ctx)
        }
        _ => Err(unsupported(op, "not a loss")),
    }
}
