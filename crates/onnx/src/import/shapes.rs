//! Shape arithmetic: the data inputs' shapes with the batch applied, `Reshape` targets,
//! convolution and pooling windows, and per-channel broadcasts. The shapes of op outputs
//! come from [`OpKind::declare`](pebble_zoo::OpKind::declare), in `values`.

use pebble_zoo::ops::{Elem, Shape};

use super::{attr_int, attr_ints, attr_str, elem_of, numel, too_large, Ctx, Importer};
use crate::error::OnnxError;
use crate::proto::{DimensionValue, NodeProto, ValueInfoProto};

/// An ONNX axis (negative from the end) as an index below `rank`.
pub(super) fn normalize_axis(axis: i64, rank: usize) -> Option<usize> {
    let r = rank as i64;
    let a = if axis < 0 { axis + r } else { axis };
    (0..r).contains(&a).then_some(a as usize)
}

/// Convolution and pooling windows: kernel, strides, padding (top, left, bottom, right).
pub(super) struct Window {
    pub(super) kernel: [usize; 2],
    pub(super) stride: [usize; 2],
    pub(super) pads: [usize; 4],
}

impl Importer<'_> {
    /// The declared shape of graph input `i`, the batch applied to its first dimension
    /// (when that is the file's batch, the first input's).
    pub(super) fn input_shape(&mut self, i: usize) -> Result<(Shape, Elem), OnnxError> {
        let info: &ValueInfoProto = &self.graph.input[i];
        let bad = |why: String| OnnxError::Input { input: info.name.clone(), why };
        let tensor =
            info.r#type.as_ref().and_then(|t| t.tensor_type.as_ref()).ok_or_else(|| bad("not a tensor".into()))?;
        let elem = elem_of(tensor.elem_type)
            .ok_or_else(|| bad(format!("element type {} is not supported", tensor.elem_type)))?;
        let dims = &tensor.shape.as_ref().ok_or_else(|| bad("its shape is not given".into()))?.dim;
        let mut shape = Vec::with_capacity(dims.len());
        for (k, d) in dims.iter().enumerate() {
            let v = match &d.value {
                Some(DimensionValue::DimValue(v)) if *v > 0 => Some(*v as usize),
                Some(DimensionValue::DimValue(v)) => return Err(bad(format!("dimension {k} is {v}"))),
                _ => None,
            };
            let what = match &d.value {
                Some(DimensionValue::DimParam(p)) if !p.is_empty() => format!("symbolic (`{p}`)"),
                _ => "unknown".to_string(),
            };
            shape.push(match (k, v) {
                (0, _) => v.unwrap_or(0),
                (_, Some(v)) => v,
                (_, None) => return Err(bad(format!("dimension {k} is {what}: only the batch dimension may be"))),
            });
            // An input whose fixed leading dimension is not the first input's batch (a
            // mask of [S, S] beside [1, S] tokens) is not batched.
            if k == 0 && v.is_some() && self.file_batch.is_some_and(|fb| v != Some(fb)) {
                continue;
            }
            if k == 0 {
                if v.is_some() {
                    self.file_batch.get_or_insert(shape[0]);
                }
                match (self.options.batch, v) {
                    (Some(0), _) => return Err(bad("the batch size must be positive".into())),
                    (Some(b), _) => shape[0] = b,
                    (None, Some(_)) => {}
                    (None, None) => {
                        return Err(bad(format!("its batch dimension is {what}: give a batch size")));
                    }
                }
                self.batch.get_or_insert(shape[0]);
            }
        }
        if too_large(&shape) {
            return Err(bad(format!("shape {shape:?} is too large")));
        }
        Ok((shape, elem))
    }

    /// The target of a Reshape: `0` copies a dimension (unless `allowzero`), `-1` is
    /// inferred. When the batch was changed, a leading dimension equal to the file's
    /// batch, on an input whose leading dimension is the batch, is the batch too: files
    /// hard-code `[1, -1]` or `[1, 2048]` for their batch of one.
    pub(super) fn reshape_target(
        &self,
        ctx: &Ctx,
        input: &[usize],
        target: &[i64],
        allow_zero: bool,
        is_tensor: bool,
    ) -> Result<Shape, OnnxError> {
        let mut t = target.to_vec();
        if !allow_zero {
            for (i, v) in t.iter_mut().enumerate() {
                if *v == 0 {
                    *v = *input
                        .get(i)
                        .ok_or_else(|| ctx.err(format!("target {target:?} copies a missing dimension {i}")))?
                        as i64;
                }
            }
        }
        if let (true, Some(fb), Some(b)) = (is_tensor, self.file_batch, self.batch) {
            if fb != b && t.first() == Some(&(fb as i64)) && input.first() == Some(&b) {
                t[0] = b as i64;
            }
        }
        let total = numel(input).ok_or_else(|| ctx.err(format!("shape {input:?} overflows")))?;
        let known: Option<usize> =
            t.iter().filter(|&&v| v != -1).try_fold(1usize, |acc, &v| acc.checked_mul(usize::try_from(v).ok()?));
        let known = known.ok_or_else(|| ctx.err(format!("target shape {target:?} is invalid")))?;
        let inferred = t.iter().filter(|&&v| v == -1).count();
        let out: Shape = match inferred {
            0 => t.iter().map(|&v| v as usize).collect(),
            1 if known > 0 && total % known == 0 => {
                t.iter().map(|&v| if v == -1 { total / known } else { v as usize }).collect()
            }
            _ => return Err(ctx.err(format!("cannot reshape {input:?} to {target:?}"))),
        };
        if numel(&out) != Some(total) {
            return Err(ctx.err(format!("cannot reshape {input:?} ({total} elements) to {target:?}")));
        }
        Ok(out)
    }

    /// Kernel, strides and padding of a convolution or pooling node on `x` `[N, C, H, W]`.
    pub(super) fn window(
        &self,
        ctx: &Ctx,
        node: &NodeProto,
        x: &[usize],
        kernel: Option<[usize; 2]>,
    ) -> Result<Window, OnnxError> {
        let pair = |name: &str, default: [usize; 2]| -> Result<[usize; 2], OnnxError> {
            match attr_ints(node, name) {
                None => Ok(default),
                Some(v) if v.len() == 2 && v.iter().all(|&d| d > 0) => Ok([v[0] as usize, v[1] as usize]),
                Some(v) => Err(ctx.err(format!("attribute `{name}` is {v:?}: two positive values expected"))),
            }
        };
        let k = match (attr_ints(node, "kernel_shape"), kernel) {
            (Some(_), _) => pair("kernel_shape", [1, 1])?,
            (None, Some(k)) => k,
            (None, None) => return Err(ctx.err("attribute `kernel_shape` is missing")),
        };
        if let (Some(w), true) = (kernel, attr_ints(node, "kernel_shape").is_some()) {
            if w != k {
                return Err(ctx.err(format!("attribute `kernel_shape` {k:?} differs from the weight's {w:?}")));
            }
        }
        let s = pair("strides", [1, 1])?;
        if pair("dilations", [1, 1])? != [1, 1] {
            return Err(ctx.unsupported(format!("dilations {:?}", attr_ints(node, "dilations").unwrap_or_default())));
        }
        let (h, w) = (x[2], x[3]);
        let mut pads = match attr_ints(node, "pads") {
            None => [0; 4],
            Some(p) if p.len() == 4 && p.iter().all(|&v| v >= 0) => {
                [p[0] as usize, p[1] as usize, p[2] as usize, p[3] as usize]
            }
            Some(p) => return Err(ctx.err(format!("attribute `pads` is {p:?}: four non-negative values expected"))),
        };
        let auto = attr_str(node, "auto_pad").unwrap_or_default();
        match auto.as_str() {
            "" | "NOTSET" => {}
            "VALID" => pads = [0; 4],
            "SAME_UPPER" | "SAME_LOWER" => {
                for (axis, size) in [h, w].into_iter().enumerate() {
                    let out = size.div_ceil(s[axis]);
                    let total = (out.saturating_sub(1) * s[axis] + k[axis]).saturating_sub(size);
                    let (small, large) = (total / 2, total - total / 2);
                    let (begin, end) = if auto == "SAME_UPPER" { (small, large) } else { (large, small) };
                    pads[axis] = begin;
                    pads[axis + 2] = end;
                }
            }
            other => return Err(ctx.err(format!("attribute `auto_pad` is `{other}`"))),
        }
        if attr_int(node, "ceil_mode").unwrap_or(0) != 0 {
            // Ceil mode as extra padding at the end, PyTorch's rule: the last window must
            // start inside the input or its leading padding.
            for (axis, size) in [h, w].into_iter().enumerate() {
                let padded = size + pads[axis] + pads[axis + 2];
                if padded < k[axis] {
                    break;
                }
                let mut out = (padded - k[axis]).div_ceil(s[axis]) + 1;
                if (out - 1) * s[axis] >= size + pads[axis] {
                    out -= 1;
                }
                pads[axis + 2] += ((out - 1) * s[axis] + k[axis]).saturating_sub(padded);
            }
        }
        Ok(Window { kernel: k, stride: s, pads })
    }

    /// The dimension of `x` along which a constant of shape `c` varies, if exactly one
    /// (a per-channel constant); `None` for scalars and other broadcasts.
    pub(super) fn channel_dim(&self, node: &NodeProto, x: &[usize], c: &[usize]) -> Option<usize> {
        // Opset < 7: no broadcasting unless `broadcast = 1`, then `c` aligns at `axis`.
        let start = if self.opset < 7 && attr_int(node, "broadcast").unwrap_or(0) == 1 {
            let axis = attr_int(node, "axis").unwrap_or(x.len() as i64 - c.len() as i64);
            normalize_axis(axis, x.len())?
        } else {
            x.len().checked_sub(c.len())?
        };
        if start + c.len() > x.len() {
            return None;
        }
        let varying: Vec<usize> = (0..c.len()).filter(|&j| c[j] != 1).collect();
        match varying[..] {
            [j] if c[j] == x[start + j] => Some(start + j),
            _ => None,
        }
    }
}
