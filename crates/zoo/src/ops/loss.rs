//! The losses: `cross_entropy` and `mse`.
//! Their forward and backward are in `pebble-runtime`'s `ops/loss.rs`.

use super::{numel, Elem, Inputs, OpDecl, OpKind};
use crate::ZooError;

/// Declares a loss for its inputs, or says why the shapes do not fit.
pub(super) fn declare(kind: &OpKind, inputs: &Inputs<'_>) -> Result<OpDecl, ZooError> {
    let x = &inputs.x;
    let mut d = OpDecl::blank();
    match kind {
        OpKind::CrossEntropy => {
            inputs.arity(2)?;
            inputs.float(0)?;
            let y = &inputs.all[1].shape;
            if inputs.all[1].elem != Elem::Int || x.is_empty() || x[..x.len() - 1] != y[..] {
                return Err(inputs.bad(format!("logits {x:?} and integer labels {y:?} do not match")));
            }
            d.output = vec![];
            d.forward_flops = 5.0 * inputs.n_in;
            d.backward_flops = 2.0 * inputs.n_in;
            d.forward_tmp = numel(x);
            // On burn-flex, also a few numbers per row (the softmax's maximum and sum, the
            // label's probability).
            d.burn_flex_tmp = (numel(x) + 4 * numel(y), 0);
            d.loss = true;
        }
        OpKind::Mse => {
            inputs.arity(2)?;
            inputs.float(0)?;
            inputs.float(1)?;
            if inputs.all[1].shape != *x {
                return Err(inputs.bad(format!("prediction {x:?} and target {:?} differ", inputs.all[1].shape)));
            }
            d.output = vec![];
            d.forward_flops = 3.0 * inputs.n_in;
            d.backward_flops = 2.0 * inputs.n_in;
            d.loss = true;
        }
        _ => unreachable!("{} is not a loss", kind.name()),
    }
    Ok(d)
}
