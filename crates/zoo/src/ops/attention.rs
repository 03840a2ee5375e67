//! Attention and the rotary position embedding (`attention`, `rope`).
//! Their forward and backward are in `pebble-runtime`'s `ops/attention.rs`.

use super::{count, Elem, Inputs, OpDecl, OpKind, Saved};
use crate::ZooError;

/// Declares an attention op for its inputs, or says why the shapes do not fit.
pub(super) fn declare(kind: &OpKind, inputs: &Inputs<'_>) -> Result<OpDecl, ZooError> {
    let x = &inputs.x;
    let mut d = OpDecl::blank();
    match kind {
        OpKind::Attention { heads, kv_heads, causal: _, dropout } => {
            let (b, s, e, kv_e) = match inputs.all.len() {
                1 => {
                    inputs.float(0)?;
                    if x.len() != 3 || !x[2].is_multiple_of(3) {
                        return Err(inputs.bad(format!("packed attention expects [B, S, 3E], got {x:?}")));
                    }
                    (x[0], x[1], x[2] / 3, x[2] / 3)
                }
                3 => {
                    for (k, input) in inputs.all.iter().enumerate() {
                        inputs.float(k)?;
                        if input.shape.len() != 3 {
                            return Err(inputs.bad(format!("input {k} must be [B, S, E], got {:?}", input.shape)));
                        }
                    }
                    if inputs.all[1].shape != inputs.all[2].shape || inputs.all[1].shape[..2] != x[..2] {
                        return Err(inputs.bad("k and v must match, and share q's batch and length".into()));
                    }
                    (x[0], x[1], x[2], inputs.all[1].shape[2])
                }
                n => return Err(inputs.bad(format!("expects 1 (packed) or 3 (q, k, v) inputs, got {n}"))),
            };
            if *heads == 0 || *kv_heads == 0 || e % heads != 0 || heads % kv_heads != 0 || kv_e * heads != e * kv_heads
            {
                return Err(inputs
                    .bad(format!("width {e} (kv {kv_e}) does not split into {heads} heads / {kv_heads} kv heads")));
            }
            d.output = vec![b, s, e];
            let scores = b * heads * s * s;
            d.forward_flops = 4.0 * count(&[b, s, s, e]) + 5.0 * scores as f64;
            d.backward_flops = 8.0 * count(&[b, s, s, e]) + 4.0 * scores as f64;
            d.matmul = true;
            d.saved = (0..inputs.all.len()).map(Saved::Input).collect();
            d.saved.push(Saved::Extra { name: "weights", shape: vec![b, *heads, s, s], elem: Elem::Float });
            if *dropout > 0.0 {
                d.saved.push(Saved::Extra { name: "mask", shape: vec![b, *heads, s, s], elem: Elem::Byte });
            }
            d.forward_tmp = scores;
            d.backward_tmp = 2 * scores;
            // Measured on burn-flex: the scores twice (the matmul's aligning copy, then the
            // softmax), the causal mask (a byte per score) and one head-split copy of an input.
            let bse = b * s * e;
            d.burn_flex_tmp = (scores * 9 / 4 + bse, 2 * scores + bse);
        }
        OpKind::Rope { heads, rotary_dim } => {
            inputs.arity(1)?;
            inputs.float(0)?;
            let Some(&e) = x.last() else { return Err(inputs.bad("needs at least a 1-D input".into())) };
            if *heads == 0 || e % heads != 0 || *rotary_dim > e / heads || rotary_dim % 2 != 0 {
                return Err(inputs.bad(format!("rotary dim {rotary_dim} does not fit heads of width {e}/{heads}")));
            }
            inputs.elementwise(&mut d, 3.0, 3.0);
        }
        _ => unreachable!("{} is not an attention op", kind.name()),
    }
    Ok(d)
}
