//! The ops only the ONNX importer makes: `lrn`, `permute`, `matmul`, `channel_affine`
//! and `pool2d`. The planner declares them; the executor has no kernels for them yet.

use super::{count, numel, Elem, Inputs, OpDecl, OpKind, Saved};
use crate::ZooError;

/// Declares an ONNX-only op for its inputs, or says why the shapes do not fit.
pub(super) fn declare(kind: &OpKind, inputs: &Inputs<'_>) -> Result<OpDecl, ZooError> {
    let x = &inputs.x;
    let mut d = OpDecl::blank();
    match kind {
        OpKind::Lrn { size, alpha, beta, bias } => {
            inputs.arity(1)?;
            inputs.float(0)?;
            inputs.image("lrn")?;
            if *size == 0 || !alpha.is_finite() || !beta.is_finite() || !bias.is_finite() {
                return Err(inputs.bad(format!("window {size}, alpha {alpha}, beta {beta}, bias {bias}")));
            }
            // Forward: the windowed sum of squares, then a power and a product per element;
            // backward: the same window over `dy·y/scale`. The scale is a temporary.
            inputs.elementwise(&mut d, (*size + 5) as f64, (2 * *size + 8) as f64);
            d.saved = vec![Saved::Input(0), Saved::Output];
            d.forward_tmp = numel(x);
            d.backward_tmp = 2 * numel(x);
        }
        OpKind::Permute { perm } => {
            inputs.arity(1)?;
            let mut seen = vec![false; x.len()];
            let mut repeated = |p: usize| p >= x.len() || std::mem::replace(&mut seen[p], true);
            if perm.len() != x.len() || perm.iter().any(|&p| repeated(p)) {
                return Err(inputs.bad(format!("{perm:?} is not a permutation of the {} dimensions of {x:?}", x.len())));
            }
            d.output = perm.iter().map(|&p| x[p]).collect();
            d.output_elem = inputs.all[0].elem;
        }
        OpKind::MatMul => {
            inputs.arity(2)?;
            inputs.float(0)?;
            inputs.float(1)?;
            let y = &inputs.all[1].shape;
            let r = x.len();
            if r < 2 || y.len() != r || x[..r - 2] != y[..r - 2] || x[r - 1] != y[r - 2] {
                return Err(inputs.bad(format!("cannot multiply {x:?} by {y:?}")));
            }
            let mut out = x.clone();
            out[r - 1] = y[r - 1];
            let macs = count(&out) * x[r - 1] as f64;
            d.output = out;
            d.forward_flops = 2.0 * macs;
            d.backward_flops = 4.0 * macs;
            d.matmul = true;
            d.saved = vec![Saved::Input(0), Saved::Input(1)];
        }
        OpKind::ChannelAffine { dim, scale, bias } => {
            inputs.arity(1)?;
            inputs.float(0)?;
            if *dim >= x.len() {
                return Err(inputs.bad(format!("dimension {dim} out of range for {x:?}")));
            }
            if !scale && !bias {
                return Err(inputs.bad("neither a scale nor a bias".into()));
            }
            let c = x[*dim];
            inputs.elementwise(&mut d, if *scale && *bias { 2.0 } else { 1.0 }, if *scale { 3.0 } else { 1.0 });
            if *scale {
                d.params.push(("weight", vec![c]));
                d.saved = vec![Saved::Input(0)];
                d.backward_reads_params = true;
            }
            if *bias {
                d.params.push(("bias", vec![c]));
            }
        }
        OpKind::Pool2d { max, kernel, stride, pads } => {
            inputs.arity(1)?;
            inputs.float(0)?;
            let (n, c, h, w) = inputs.image("pool2d")?;
            let (hp, wp) = (h + pads[0] + pads[2], w + pads[1] + pads[3]);
            if stride.contains(&0) || kernel.contains(&0) || hp < kernel[0] || wp < kernel[1] {
                return Err(inputs.bad(format!(
                    "window {kernel:?} (strides {stride:?}) does not fit the input {h}×{w} padded by {pads:?}"
                )));
            }
            if pads[0].max(pads[2]) >= kernel[0] || pads[1].max(pads[3]) >= kernel[1] {
                return Err(inputs.bad(format!("padding {pads:?} as large as the window {kernel:?}")));
            }
            let ho = (hp - kernel[0]) / stride[0] + 1;
            let wo = (wp - kernel[1]) / stride[1] + 1;
            d.output = vec![n, c, ho, wo];
            let out = (n * c * ho * wo) as f64;
            d.forward_flops = out * (kernel[0] * kernel[1]) as f64;
            d.backward_flops = d.forward_flops;
            if *max {
                d.saved =
                    vec![Saved::Input(0), Saved::Extra { name: "indices", shape: d.output.clone(), elem: Elem::Int }];
            }
        }
        _ => unreachable!("{} is not an ONNX-only op", kind.name()),
    }
    Ok(d)
}
