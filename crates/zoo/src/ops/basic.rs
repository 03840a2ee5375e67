//! The basic ops: `linear`, `embedding`, `add`, `mul`, `concat` and the views `reshape` and `slice`.
//! Their forward and backward are in `pebble-runtime`'s `ops/basic.rs`.

use super::{count, numel, Elem, Inputs, OpDecl, OpKind, Saved};
use crate::ZooError;

/// Declares a basic op for its inputs, or says why the shapes do not fit.
pub(super) fn declare(kind: &OpKind, inputs: &Inputs<'_>) -> Result<OpDecl, ZooError> {
    let x = &inputs.x;
    let mut d = OpDecl::blank();
    match kind {
        OpKind::Linear { out_features, bias } => {
            inputs.arity(1)?;
            inputs.float(0)?;
            let Some(&k) = x.last() else { return Err(inputs.bad("needs at least a 1-D input".into())) };
            let mut out = x.clone();
            *out.last_mut().expect("non-empty") = *out_features;
            d.output = out;
            d.weighted(vec![*out_features, k], bias.then_some(*out_features), count(x) * *out_features as f64);
            // Measured on burn-flex: a matmul's output is made as bytes and copied once to
            // align it (one output more), and gemm packs the weight when there are rows
            // enough to reuse it (from 32). Backward: the input and weight gradients are
            // made the same way, or gemm packs blocks of the output's gradient (up to 256
            // rows of it, on each of two threads).
            let (n_x, n_w, n_out) = (numel(x), *out_features * k, numel(&d.output));
            let rows = n_x / k.max(1);
            d.burn_flex_tmp =
                (n_out.max(if rows >= 32 { n_w } else { 0 }), (n_x + n_w).max(2 * out_features * rows.min(256)));
        }
        OpKind::Embedding { vocab, dim } => {
            inputs.arity(1)?;
            if inputs.all[0].elem != Elem::Int {
                return Err(inputs.bad("input must be integer ids".into()));
            }
            let mut out = x.clone();
            out.push(*dim);
            d.output = out;
            d.params.push(("weight", vec![*vocab, *dim]));
            // On burn-flex: forward, the ids flattened for the lookup (8 bytes each);
            // backward, `select_add` copies the zeroed table it adds the rows into, so the
            // zeros and the copy (a table above the gradient where it is the first to write
            // it, two where the table is shared and its gradient already holds one).
            d.burn_flex_tmp = (2 * numel(x), 2 * vocab * dim);
            d.backward_flops = count(x) * *dim as f64;
            d.saved = vec![Saved::Input(0)];
        }
        OpKind::Add | OpKind::Mul => {
            inputs.arity(2)?;
            inputs.float(0)?;
            inputs.float(1)?;
            let y = &inputs.all[1].shape;
            let ok = match kind {
                OpKind::Add => y.len() <= x.len() && x[x.len() - y.len()..] == y[..],
                _ => y == x,
            };
            if !ok {
                return Err(inputs.bad(format!("shapes {x:?} and {y:?} do not match")));
            }
            inputs.elementwise(&mut d, 1.0, if matches!(kind, OpKind::Mul) { 2.0 } else { 1.0 });
            if matches!(kind, OpKind::Mul) {
                d.saved = vec![Saved::Input(0), Saved::Input(1)];
            }
        }
        OpKind::Concat { dim } => {
            if inputs.all.is_empty() {
                return Err(inputs.bad("needs at least one input".into()));
            }
            let mut out = x.clone();
            if *dim >= out.len() {
                return Err(inputs.bad(format!("dimension {dim} out of range for {x:?}")));
            }
            out[*dim] = 0;
            for (k, o) in inputs.all.iter().enumerate() {
                inputs.float(k)?;
                let same = o.shape.len() == x.len() && (0..x.len()).all(|i| i == *dim || o.shape[i] == x[i]);
                if !same {
                    return Err(
                        inputs.bad(format!("input {k} shape {:?} does not match {x:?} outside dim {dim}", o.shape))
                    );
                }
                out[*dim] += o.shape[*dim];
            }
            d.output = out;
        }
        OpKind::Reshape { shape } => {
            inputs.arity(1)?;
            if numel(shape) != numel(x) {
                return Err(inputs.bad(format!("cannot view {x:?} as {shape:?}")));
            }
            d.output = shape.clone();
            d.output_elem = inputs.all[0].elem;
            d.view = true;
        }
        OpKind::Slice { start, len } => {
            inputs.arity(1)?;
            let Some(&e) = x.last() else { return Err(inputs.bad("needs at least a 1-D input".into())) };
            if start + len > e || *len == 0 {
                return Err(inputs.bad(format!("slice {start}..{} out of the last dimension {e}", start + len)));
            }
            let mut out = x.clone();
            *out.last_mut().expect("non-empty") = *len;
            d.output = out;
            d.output_elem = inputs.all[0].elem;
            d.view = true;
        }
        _ => unreachable!("{} is not a basic op", kind.name()),
    }
    Ok(d)
}
