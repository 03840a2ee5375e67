//! The normalizations: `batch_norm2d`, `layer_norm` and `rms_norm`.
//! Their forward and backward are in `pebble-runtime`'s `ops/norm.rs`.

use super::{numel, Elem, Inputs, OpDecl, OpKind, Saved};
use crate::ZooError;

/// Declares a normalization for its inputs, or says why the shapes do not fit.
pub(super) fn declare(kind: &OpKind, inputs: &Inputs<'_>) -> Result<OpDecl, ZooError> {
    let x = &inputs.x;
    let mut d = OpDecl::blank();
    match kind {
        OpKind::BatchNorm2d => {
            inputs.arity(1)?;
            inputs.float(0)?;
            let (_, c, _, _) = inputs.image("batch_norm2d")?;
            inputs.elementwise(&mut d, 8.0, 12.0);
            d.params = vec![("weight", vec![c]), ("bias", vec![c])];
            d.saved = vec![
                Saved::Input(0),
                Saved::Extra { name: "mean", shape: vec![c], elem: Elem::Float },
                Saved::Extra { name: "invstd", shape: vec![c], elem: Elem::Float },
            ];
            // burn-flex: the centred input and its square forward; two input-sized
            // intermediates and the per-channel sums backward.
            d.burn_flex_tmp = (2 * numel(x), 2 * numel(x) + 4 * c);
            d.backward_reads_params = true;
        }
        OpKind::LayerNorm { .. } | OpKind::RmsNorm => {
            let bias = matches!(kind, OpKind::LayerNorm { bias: true });
            inputs.arity(1)?;
            inputs.float(0)?;
            let Some(&e) = x.last() else { return Err(inputs.bad("needs at least a 1-D input".into())) };
            inputs.elementwise(&mut d, 8.0, 12.0);
            d.params.push(("weight", vec![e]));
            if bias {
                d.params.push(("bias", vec![e]));
            }
            let rows = numel(x) / e.max(1);
            d.saved = vec![Saved::Input(0), Saved::Extra { name: "rstd", shape: vec![rows], elem: Elem::Float }];
            if matches!(kind, OpKind::LayerNorm { .. }) {
                d.saved.push(Saved::Extra { name: "mean", shape: vec![rows], elem: Elem::Float });
            }
            // burn-flex: the centred input forward; two input-sized intermediates and the
            // per-row sums backward.
            d.burn_flex_tmp = (numel(x), 2 * numel(x) + 2 * rows);
            d.backward_reads_params = true;
        }
        _ => unreachable!("{} is not a normalization", kind.name()),
    }
    Ok(d)
}
