//! The poolings: `max_pool2d`, `avg_pool2d` and `adaptive_avg_pool2d`.
//! Their forward and backward are in `pebble-runtime`'s `ops/pool.rs`.

use super::{numel, Elem, Inputs, OpDecl, OpKind, Saved};
use crate::ZooError;

/// Declares a pooling for its inputs, or says why the shapes do not fit.
pub(super) fn declare(kind: &OpKind, inputs: &Inputs<'_>) -> Result<OpDecl, ZooError> {
    let mut d = OpDecl::blank();
    match kind {
        OpKind::MaxPool2d { kernel, stride, padding } | OpKind::AvgPool2d { kernel, stride, padding } => {
            inputs.arity(1)?;
            inputs.float(0)?;
            let (n, c, h, w) = inputs.image("pooling")?;
            if *stride == 0 || h + 2 * padding < *kernel || w + 2 * padding < *kernel {
                return Err(inputs.bad(format!("window {kernel} does not fit the input {h}×{w}")));
            }
            let ho = (h + 2 * padding - kernel) / stride + 1;
            let wo = (w + 2 * padding - kernel) / stride + 1;
            d.output = vec![n, c, ho, wo];
            let out = (n * c * ho * wo) as f64;
            d.forward_flops = out * (kernel * kernel) as f64;
            d.backward_flops = out * (kernel * kernel) as f64;
            // burn-flex: a padded or reordered copy of the output's size, each way.
            d.burn_flex_tmp = (2 * (n * c * ho * wo), 2 * (n * c * ho * wo));
            if matches!(kind, OpKind::MaxPool2d { .. }) {
                d.saved =
                    vec![Saved::Input(0), Saved::Extra { name: "indices", shape: d.output.clone(), elem: Elem::Int }];
            }
        }
        OpKind::AdaptiveAvgPool2d { out } => {
            inputs.arity(1)?;
            inputs.float(0)?;
            let (n, c, _, _) = inputs.image("adaptive_avg_pool2d")?;
            d.output = vec![n, c, *out, *out];
            d.forward_flops = inputs.n_in;
            d.backward_flops = inputs.n_in;
            // On burn-flex: the input-sized gradient made twice.
            d.burn_flex_tmp = (0, 2 * numel(&inputs.x));
        }
        _ => unreachable!("{} is not a pooling", kind.name()),
    }
    Ok(d)
}
