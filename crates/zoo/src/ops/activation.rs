//! The activations: `relu`, `gelu`, `silu`, `dropout` and `softmax`.
//! Their forward and backward are in `pebble-runtime`'s `ops/activation.rs`.

use super::{numel, Elem, Inputs, OpDecl, OpKind, Saved};
use crate::ZooError;

/// Declares an activation for its inputs, or says why the shapes do not fit.
pub(super) fn declare(kind: &OpKind, inputs: &Inputs<'_>) -> Result<OpDecl, ZooError> {
    let x = &inputs.x;
    let mut d = OpDecl::blank();
    match kind {
        OpKind::Relu => {
            inputs.arity(1)?;
            inputs.float(0)?;
            inputs.elementwise(&mut d, 1.0, 1.0);
            d.saved = vec![Saved::Output];
        }
        OpKind::Gelu | OpKind::Silu => {
            inputs.arity(1)?;
            inputs.float(0)?;
            inputs.elementwise(&mut d, 8.0, 12.0);
            d.saved = vec![Saved::Input(0)];
            // burn-flex computes them op by op: one intermediate forward, three backward.
            d.burn_flex_tmp = (numel(x), 3 * numel(x));
        }
        OpKind::Dropout { p } => {
            inputs.arity(1)?;
            inputs.float(0)?;
            if !(0.0..1.0).contains(p) {
                return Err(inputs.bad(format!("probability {p} is not in [0, 1)")));
            }
            inputs.elementwise(&mut d, 2.0, 1.0);
            d.saved = vec![Saved::Extra { name: "mask", shape: x.clone(), elem: Elem::Byte }];
            // On burn-flex: the scaled product, and the mask (a quarter of the bytes).
            let n = numel(x) + numel(x).div_ceil(4);
            d.burn_flex_tmp = (n, n);
        }
        OpKind::Softmax => {
            inputs.arity(1)?;
            inputs.float(0)?;
            inputs.elementwise(&mut d, 5.0, 4.0);
            d.saved = vec![Saved::Output];
        }
        _ => unreachable!("{} is not an activation", kind.name()),
    }
    Ok(d)
}
