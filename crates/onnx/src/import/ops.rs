//! The nodes that become zoo ops, one function per op family: convolution, pooling,
//! normalization, activations, linear maps, arithmetic, concatenation, softmax and
//! embeddings. Each declares its op through `Importer::add`, which checks the weights
//! against the declared parameters.

use pebble_zoo::ops::{Elem, Shape};
use pebble_zoo::OpKind;

use super::shapes::normalize_axis;
use super::{attr_float, attr_int, attr_ints, numel, Const, Ctx, Data, Importer, Value};
use crate::error::OnnxError;
use crate::proto::NodeProto;

impl Importer<'_> {
    /// A convolution's image `[N, C, H, W]` (its id and shape), weight and optional bias.
    fn conv_operands(
        &mut self,
        ctx: &Ctx,
        node: &NodeProto,
        what: &str,
    ) -> Result<(usize, Shape, Const, Option<Const>), OnnxError> {
        let x = self.tensor(ctx, node, 0)?;
        let xs = self.tensors[x].shape.clone();
        if xs.len() != 4 {
            return Err(ctx.unsupported(format!("{what} of a {xs:?} input: only 2-D ([N, C, H, W])")));
        }
        let w = self.constant(ctx, node, 1)?;
        let b = self.opt_constant(ctx, node, 2)?;
        Ok((x, xs, w, b))
    }

    /// `Conv`: `conv2d`, or `conv2d_rect` for a rectangular kernel.
    pub(super) fn conv(&mut self, ctx: &Ctx, node: &NodeProto) -> Result<(), OnnxError> {
        let (x, xs, w, b) = self.conv_operands(ctx, node, "a convolution")?;
        let ws = &w.shape;
        if ws.len() != 4 {
            return Err(ctx.err(format!("weight `{}` has shape {ws:?}, not [M, C/group, kH, kW]", node.input[1])));
        }
        let groups = attr_int(node, "group").unwrap_or(1);
        let groups =
            usize::try_from(groups).ok().filter(|&g| g > 0).ok_or_else(|| ctx.err(format!("group {groups}")))?;
        if ws[1].checked_mul(groups) != Some(xs[1]) {
            return Err(ctx.err(format!(
                "weight `{}` has shape {ws:?}: {} channels per group × {groups} groups, but the input has {} channels",
                node.input[1], ws[1], xs[1]
            )));
        }
        let win = self.window(ctx, node, &xs, Some([ws[2], ws[3]]))?;
        let (k, s, p) = (win.kernel, win.stride, win.pads);
        let symmetric = p[0] == p[2] && p[1] == p[3];
        let bias = b.is_some();
        let kind = if symmetric && k[0] == k[1] && s[0] == s[1] && p[0] == p[1] {
            OpKind::Conv2d { out_channels: ws[0], kernel: k[0], stride: s[0], padding: p[0], groups, bias }
        } else if symmetric && s[0] == s[1] && groups == 1 {
            OpKind::Conv2dRect {
                out_channels: ws[0],
                kernel_h: k[0],
                kernel_w: k[1],
                stride: s[0],
                pad_h: p[0],
                pad_w: p[1],
                bias,
            }
        } else {
            return Err(ctx.unsupported(format!(
                "kernel {k:?}, strides {s:?}, pads {p:?}, group {groups}: pebble's convolutions take one stride, \
                 symmetric padding, and groups only with a square kernel"
            )));
        };
        let mut weights = vec![&w];
        weights.extend(b.as_ref());
        let t = self.add(ctx, &ctx.node, kind, vec![x], &weights)?;
        self.set(node, Value::Tensor(t));
        Ok(())
    }

    /// `ConvTranspose` whose stride equals its square kernel, without padding, groups or
    /// output padding (U-Net's up-sampling): `conv_transpose2d`.
    pub(super) fn conv_transpose(&mut self, ctx: &Ctx, node: &NodeProto) -> Result<(), OnnxError> {
        let (x, xs, w, b) = self.conv_operands(ctx, node, "a transposed convolution")?;
        let ws = &w.shape;
        if ws.len() != 4 || ws[0] != xs[1] {
            return Err(ctx.err(format!(
                "weight `{}` has shape {ws:?}, not [C, M, kH, kW] with C = {} input channels",
                node.input[1], xs[1]
            )));
        }
        let plain = |name: &str| attr_ints(node, name).is_none_or(|v| v.iter().all(|&p| p == 0));
        if attr_int(node, "group").unwrap_or(1) != 1
            || !plain("output_padding")
            || attr_ints(node, "output_shape").is_some()
        {
            return Err(ctx.unsupported("groups, `output_padding` or `output_shape`: only plain up-sampling"));
        }
        let win = self.window(ctx, node, &xs, Some([ws[2], ws[3]]))?;
        let (k, s, p) = (win.kernel, win.stride, win.pads);
        if k[0] != k[1] || s != k || p != [0; 4] {
            return Err(ctx.unsupported(format!(
                "kernel {k:?}, strides {s:?}, pads {p:?}: pebble's transposed convolution has its stride equal to \
                 its square kernel, and no padding"
            )));
        }
        let kind = OpKind::ConvTranspose2d { out_channels: ws[1], kernel: k[0], bias: b.is_some() };
        let mut weights = vec![&w];
        weights.extend(b.as_ref());
        let t = self.add(ctx, &ctx.node, kind, vec![x], &weights)?;
        self.set(node, Value::Tensor(t));
        Ok(())
    }

    /// `MaxPool` and `AveragePool`: square windows as `max_pool2d`/`avg_pool2d`, others as
    /// `pool2d`.
    pub(super) fn pool(&mut self, ctx: &Ctx, node: &NodeProto) -> Result<(), OnnxError> {
        self.only_first_output(ctx, node, "the argmax indices")?;
        let x = self.tensor(ctx, node, 0)?;
        let xs = self.tensors[x].shape.clone();
        if xs.len() != 4 {
            return Err(ctx.unsupported(format!("pooling a {xs:?} input: only 2-D ([N, C, H, W])")));
        }
        let win = self.window(ctx, node, &xs, None)?;
        let (k, s, p) = (win.kernel, win.stride, win.pads);
        let max = node.op_type == "MaxPool";
        let kind = if p[0] == p[2] && p[1] == p[3] && p[0] == p[1] && k[0] == k[1] && s[0] == s[1] {
            if max {
                OpKind::MaxPool2d { kernel: k[0], stride: s[0], padding: p[0] }
            } else {
                OpKind::AvgPool2d { kernel: k[0], stride: s[0], padding: p[0] }
            }
        } else {
            OpKind::Pool2d { max, kernel: k, stride: s, pads: p }
        };
        let t = self.add(ctx, &ctx.node, kind, vec![x], &[])?;
        self.set(node, Value::Tensor(t));
        Ok(())
    }

    /// `GlobalAveragePool`: `adaptive_avg_pool2d` to 1×1.
    pub(super) fn global_average_pool(&mut self, ctx: &Ctx, node: &NodeProto) -> Result<(), OnnxError> {
        let x = self.tensor(ctx, node, 0)?;
        let t = self.add(ctx, &ctx.node, OpKind::AdaptiveAvgPool2d { out: 1 }, vec![x], &[])?;
        self.set(node, Value::Tensor(t));
        Ok(())
    }

    /// `BatchNormalization` (and Caffe2's `SpatialBN`): `batch_norm2d`, scale and bias its
    /// parameters.
    pub(super) fn batch_norm(&mut self, ctx: &Ctx, node: &NodeProto) -> Result<(), OnnxError> {
        if attr_int(node, "spatial").unwrap_or(1) != 1 {
            return Err(ctx.unsupported("`spatial = 0` (per-activation statistics)"));
        }
        self.only_first_output(ctx, node, "running statistics")?;
        let x = self.tensor(ctx, node, 0)?;
        let scale = self.constant(ctx, node, 1)?;
        let bias = self.constant(ctx, node, 2)?;
        // The running mean and variance are buffers, not parameters (as PyTorch
        // and the zoo count them).
        let t = self.add(ctx, &ctx.node, OpKind::BatchNorm2d, vec![x], &[&scale, &bias])?;
        self.set(node, Value::Tensor(t));
        Ok(())
    }

    /// `LayerNormalization` over the last dimension.
    pub(super) fn layer_norm(&mut self, ctx: &Ctx, node: &NodeProto) -> Result<(), OnnxError> {
        self.only_first_output(ctx, node, "statistics")?;
        let x = self.tensor(ctx, node, 0)?;
        let rank = self.tensors[x].shape.len();
        let axis = attr_int(node, "axis").unwrap_or(-1);
        if normalize_axis(axis, rank) != Some(rank.saturating_sub(1)) {
            return Err(ctx.unsupported(format!("normalization from axis {axis}: only the last dimension")));
        }
        let scale = self.constant(ctx, node, 1)?;
        let bias = self.opt_constant(ctx, node, 2)?;
        let mut w = vec![&scale];
        w.extend(bias.as_ref());
        let t = self.add(ctx, &ctx.node, OpKind::LayerNorm { bias: bias.is_some() }, vec![x], &w)?;
        self.set(node, Value::Tensor(t));
        Ok(())
    }

    /// `Relu` and `Gelu`.
    pub(super) fn activation(&mut self, ctx: &Ctx, node: &NodeProto) -> Result<(), OnnxError> {
        let x = self.tensor(ctx, node, 0)?;
        let kind = if node.op_type == "Relu" { OpKind::Relu } else { OpKind::Gelu };
        let t = self.add(ctx, &ctx.node, kind, vec![x], &[])?;
        self.set(node, Value::Tensor(t));
        Ok(())
    }

    /// `LRN`: local response normalization across channels.
    pub(super) fn lrn(&mut self, ctx: &Ctx, node: &NodeProto) -> Result<(), OnnxError> {
        let x = self.tensor(ctx, node, 0)?;
        let size = attr_int(node, "size").ok_or_else(|| ctx.err("attribute `size` is missing"))?;
        let size = usize::try_from(size).map_err(|_| ctx.err(format!("attribute `size` is {size}")))?;
        let kind = OpKind::Lrn {
            size,
            alpha: attr_float(node, "alpha").unwrap_or(1e-4),
            beta: attr_float(node, "beta").unwrap_or(0.75),
            bias: attr_float(node, "bias").unwrap_or(1.0),
        };
        let t = self.add(ctx, &ctx.node, kind, vec![x], &[])?;
        self.set(node, Value::Tensor(t));
        Ok(())
    }

    /// `Dropout` in training mode, its ratio an attribute or a constant input; a ratio of
    /// 0 (or a constant input) is an alias.
    pub(super) fn dropout(&mut self, ctx: &Ctx, node: &NodeProto) -> Result<(), OnnxError> {
        self.only_first_output(ctx, node, "the mask")?;
        let p = match Self::opt_input(node, 1) {
            Some(_) => match self.constant(ctx, node, 1)?.data {
                Some(Data::Float(v)) if v.len() == 1 => v[0],
                _ => return Err(ctx.unsupported("a ratio that is not a constant scalar")),
            },
            None => attr_float(node, "ratio").unwrap_or(0.5),
        };
        let name0 = node.input.first().cloned().unwrap_or_default();
        if self.is_const(&name0) || p == 0.0 {
            let v = self.lookup(ctx, &name0)?;
            self.set(node, v);
            return Ok(());
        }
        let x = self.tensor(ctx, node, 0)?;
        let t = self.add(ctx, &ctx.node, OpKind::Dropout { p }, vec![x], &[])?;
        self.set(node, Value::Tensor(t));
        Ok(())
    }

    /// `Gemm` by a constant weight: `linear`.
    pub(super) fn gemm(&mut self, ctx: &Ctx, node: &NodeProto) -> Result<(), OnnxError> {
        if attr_int(node, "transA").unwrap_or(0) != 0 {
            return Err(ctx.unsupported("`transA = 1`"));
        }
        let x = self.tensor(ctx, node, 0)?;
        let b = Self::opt_input(node, 1).ok_or_else(|| ctx.err("input 1 is missing"))?;
        if matches!(self.values.get(b), Some(Value::Tensor(_))) {
            return Err(ctx.unsupported("a product of two activations: only products with a constant weight"));
        }
        let w = self.constant(ctx, node, 1)?;
        let c = self.opt_constant(ctx, node, 2)?;
        let xs = self.tensors[x].shape.clone();
        if w.shape.len() != 2 || xs.len() != 2 {
            return Err(ctx.err(format!("Gemm of {xs:?} by a weight of shape {:?}: both must be matrices", w.shape)));
        }
        let (n, k) = if attr_int(node, "transB").unwrap_or(0) != 0 {
            (w.shape[0], w.shape[1])
        } else {
            (w.shape[1], w.shape[0])
        };
        if xs[1] != k {
            return Err(ctx.err(format!("cannot multiply {xs:?} by the weight `{b}` of shape {:?}", w.shape)));
        }
        let mut weights = vec![&w];
        weights.extend(c.as_ref());
        let kind = OpKind::Linear { out_features: n, bias: c.is_some() };
        let t = self.add(ctx, &ctx.node, kind, vec![x], &weights)?;
        self.set(node, Value::Tensor(t));
        Ok(())
    }

    /// `MatMul`: by a constant weight, `linear` without bias (a following `Add` may fuse
    /// one); of two activations, `matmul`.
    pub(super) fn matmul(&mut self, ctx: &Ctx, node: &NodeProto) -> Result<(), OnnxError> {
        let x = self.tensor(ctx, node, 0)?;
        let b = Self::opt_input(node, 1).ok_or_else(|| ctx.err("input 1 is missing"))?;
        if !self.is_const(b) && !matches!(self.values.get(b), Some(Value::Input(_))) {
            // A product of two activations (attention's scores and mix).
            let y = self.tensor_named(ctx, b)?;
            let t = self.add(ctx, &ctx.node, OpKind::MatMul, vec![x, y], &[])?;
            self.set(node, Value::Tensor(t));
            return Ok(());
        }
        let w = self.constant(ctx, node, 1)?;
        let xs = &self.tensors[x].shape;
        if w.shape.len() != 2 || xs.last() != w.shape.first() {
            return Err(ctx.err(format!("cannot multiply {xs:?} by the weight `{b}` of shape {:?}", w.shape)));
        }
        let kind = OpKind::Linear { out_features: w.shape[1], bias: false };
        let t = self.add(ctx, &ctx.node, kind, vec![x], &[&w])?;
        self.set(node, Value::Tensor(t));
        Ok(())
    }

    /// Sum of two tensors: the zoo's `add` broadcasts its second input over leading
    /// dimensions, so the larger one goes first.
    fn add_tensors(&mut self, ctx: &Ctx, name: &str, a: usize, b: usize) -> Result<usize, OnnxError> {
        let (sa, sb) = (&self.tensors[a].shape, &self.tensors[b].shape);
        let suffix = |x: &Shape, y: &Shape| y.len() <= x.len() && x[x.len() - y.len()..] == y[..];
        let inputs = if suffix(sa, sb) {
            vec![a, b]
        } else if suffix(sb, sa) {
            vec![b, a]
        } else {
            return Err(
                ctx.unsupported(format!("a sum of {sa:?} and {sb:?} (broadcast other than over leading dimensions)"))
            );
        };
        self.add(ctx, name, OpKind::Add, inputs, &[])
    }

    /// `Add` and `Mul`: of two tensors, or of a tensor and a per-channel constant (a
    /// learned scale or bias, fused into the op before it when that op is its only reader).
    pub(super) fn binary(&mut self, ctx: &Ctx, node: &NodeProto) -> Result<(), OnnxError> {
        let a = Self::opt_input(node, 0).ok_or_else(|| ctx.err("input 0 is missing"))?;
        let b = Self::opt_input(node, 1).ok_or_else(|| ctx.err("input 1 is missing"))?;
        let is_add = node.op_type == "Add";
        let weightlike = |im: &Self, n: &str| im.is_const(n);
        match (weightlike(self, a), weightlike(self, b)) {
            (false, false) => {
                let x = self.tensor_named(ctx, a)?;
                let y = self.tensor_named(ctx, b)?;
                let t = if is_add {
                    self.add_tensors(ctx, &ctx.node, x, y)?
                } else {
                    let (sx, sy) = (&self.tensors[x].shape, &self.tensors[y].shape);
                    if sx != sy {
                        return Err(ctx.unsupported(format!("a product of {sx:?} and {sy:?}: only of equal shapes")));
                    }
                    self.add(ctx, &ctx.node, OpKind::Mul, vec![x, y], &[])?
                };
                self.set(node, Value::Tensor(t));
                Ok(())
            }
            (true, true) => Err(ctx.unsupported("arithmetic on two constants")),
            (a_const, _) => {
                let (xn, cn) = if a_const { (b, a) } else { (a, b) };
                let x = self.tensor_named(ctx, xn)?;
                let c = self.const_named(ctx, cn)?;
                let xs = self.tensors[x].shape.clone();
                let dim = self.channel_dim(node, &xs, &c.shape).ok_or_else(|| {
                    ctx.unsupported(format!(
                        "{} of {xs:?} by the constant `{cn}` of shape {:?}: only per-channel constants \
                         (varying along one dimension) are supported, as learned weights",
                        node.op_type, c.shape
                    ))
                })?;
                if self.fuse(x, xn, dim, is_add, &c) {
                    self.set(node, Value::Tensor(x));
                    return Ok(());
                }
                let kind = OpKind::ChannelAffine { dim, scale: !is_add, bias: is_add };
                let t = self.add(ctx, &ctx.node, kind, vec![x], &[&c])?;
                self.set(node, Value::Tensor(t));
                Ok(())
            }
        }
    }

    /// Folds a per-channel bias (`is_add`) into the op producing `x` when `x` has no
    /// other reader: a scale without a bias, a convolution or linear map without a bias.
    fn fuse(&mut self, x: usize, x_name: &str, dim: usize, is_add: bool, c: &Const) -> bool {
        if !is_add || self.uses.get(x_name).copied().unwrap_or(0) != 1 {
            return false;
        }
        let Some(p) = self.tensors[x].producer else { return false };
        let rank = self.tensors[x].shape.len();
        let op = &mut self.ops[p];
        if op.output != x || numel(&c.shape) != Some(self.tensors[x].shape[dim]) {
            return false;
        }
        let fused = match &mut op.kind {
            OpKind::ChannelAffine { dim: d, bias, .. } if *d == dim && !*bias => bias,
            OpKind::Conv2d { bias, .. } | OpKind::Conv2dRect { bias, .. } if dim == 1 && !*bias => bias,
            OpKind::Linear { bias, .. } if dim + 1 == rank && !*bias => bias,
            _ => return false,
        };
        *fused = true;
        op.params.push(c.weight);
        true
    }

    /// `Sum`: a chain of `add`s (the last one named after the node).
    pub(super) fn sum(&mut self, ctx: &Ctx, node: &NodeProto) -> Result<(), OnnxError> {
        let names: Vec<&str> = node.input.iter().filter(|s| !s.is_empty()).map(String::as_str).collect();
        if names.is_empty() {
            return Err(ctx.err("no inputs"));
        }
        let mut acc = self.tensor_named(ctx, names[0])?;
        for (k, n) in names.iter().enumerate().skip(1) {
            let y = self.tensor_named(ctx, n)?;
            let op_name = if k + 1 == names.len() { ctx.node.clone() } else { format!("{}.{k}", ctx.node) };
            acc = self.add_tensors(ctx, &op_name, acc, y)?;
        }
        self.set(node, Value::Tensor(acc));
        Ok(())
    }

    /// `Concat`: of tensors, or of 1-D integer constants (shape arithmetic).
    pub(super) fn concat(&mut self, ctx: &Ctx, node: &NodeProto) -> Result<(), OnnxError> {
        let names: Vec<&str> = node.input.iter().filter(|s| !s.is_empty()).map(String::as_str).collect();
        if names.is_empty() {
            return Err(ctx.err("no inputs"));
        }
        let axis = attr_int(node, "axis").unwrap_or(1);
        if names.iter().all(|n| self.is_const(n)) {
            // Shape arithmetic: concatenation of 1-D integer constants.
            let mut data = Vec::new();
            for n in &names {
                match self.const_named(ctx, n)? {
                    Const { data: Some(Data::Int(v)), shape, .. } if shape.len() <= 1 => data.extend(v),
                    c => return Err(ctx.unsupported(format!("a concatenation of constants of shape {:?}", c.shape))),
                }
            }
            let weight = self.weight(&node.output[0]);
            self.set(
                node,
                Value::Const(Const { shape: vec![data.len()], elem: Elem::Int, data: Some(Data::Int(data)), weight }),
            );
            return Ok(());
        }
        let mut xs = Vec::new();
        for n in &names {
            xs.push(self.tensor_named(ctx, n)?);
        }
        if xs.len() == 1 {
            self.set(node, Value::Tensor(xs[0]));
            return Ok(());
        }
        let rank = self.tensors[xs[0]].shape.len();
        let dim = normalize_axis(axis, rank).ok_or_else(|| ctx.err(format!("axis {axis} out of range")))?;
        let t = self.add(ctx, &ctx.node, OpKind::Concat { dim }, xs, &[])?;
        self.set(node, Value::Tensor(t));
        Ok(())
    }

    /// `Softmax` over the trailing dimensions from `axis`, as a softmax over the rows of
    /// a flattened view.
    pub(super) fn softmax(&mut self, ctx: &Ctx, node: &NodeProto) -> Result<(), OnnxError> {
        let x = self.tensor(ctx, node, 0)?;
        let shape = self.tensors[x].shape.clone();
        let rank = shape.len();
        let default = if self.opset < 13 { 1 } else { -1 };
        let axis = attr_int(node, "axis").unwrap_or(default);
        let a = normalize_axis(axis, rank).ok_or_else(|| ctx.err(format!("axis {axis} out of range")))?;
        // Before opset 13 the softmax runs over all dimensions from `axis` on; from
        // 13 over `axis` alone, which we take when the later dimensions are ones.
        if self.opset >= 13 && shape[a + 1..].iter().any(|&d| d != 1) {
            return Err(ctx.unsupported(format!("softmax over axis {axis} of {shape:?}: only the last")));
        }
        let rows = numel(&shape[..a]).unwrap_or(0);
        let cols = numel(&shape[a..]).unwrap_or(0);
        let flat = self.view(ctx, &format!("{}.flatten", ctx.node), x, vec![rows, cols])?;
        let y = self.add(ctx, &ctx.node, OpKind::Softmax, vec![flat], &[])?;
        let t = self.view(ctx, &format!("{}.unflatten", ctx.node), y, shape)?;
        self.set(node, Value::Tensor(t));
        Ok(())
    }

    /// `Gather`: an embedding (a constant table indexed by integer tensors), or shape
    /// arithmetic on integer constants.
    pub(super) fn gather(&mut self, ctx: &Ctx, node: &NodeProto) -> Result<(), OnnxError> {
        let axis = attr_int(node, "axis").unwrap_or(0);
        let data = Self::opt_input(node, 0).ok_or_else(|| ctx.err("input 0 is missing"))?;
        let idx = Self::opt_input(node, 1).ok_or_else(|| ctx.err("input 1 is missing"))?;
        if !self.is_const(data) && !matches!(self.values.get(data), Some(Value::Input(_))) {
            return Err(ctx.unsupported("gathering from an activation: only from a constant (embedding) table"));
        }
        let table = self.const_named(ctx, data)?;
        if self.is_const(idx) {
            let i = self.const_named(ctx, idx)?;
            let (Some(Data::Int(values)), Some(Data::Int(indices)), 1) = (&table.data, &i.data, table.shape.len())
            else {
                return Err(ctx.unsupported("gathering from a constant other than a 1-D integer one"));
            };
            let mut out = Vec::new();
            for &k in indices {
                let k = normalize_axis(k, values.len()).ok_or_else(|| ctx.err(format!("index {k} out of range")))?;
                out.push(values[k]);
            }
            let weight = self.weight(&node.output[0]);
            self.set(
                node,
                Value::Const(Const { shape: i.shape.clone(), elem: Elem::Int, data: Some(Data::Int(out)), weight }),
            );
            return Ok(());
        }
        let ids = self.tensor_named(ctx, idx)?;
        if axis != 0 || table.shape.len() != 2 || self.tensors[ids].elem != Elem::Int {
            return Err(ctx.unsupported(format!(
                "a gather along axis {axis} of a table of shape {:?}: only embeddings (axis 0 of a matrix, integer ids)",
                table.shape
            )));
        }
        let kind = OpKind::Embedding { vocab: table.shape[0], dim: table.shape[1] };
        let t = self.add(ctx, &ctx.node, kind, vec![ids], &[&table])?;
        self.set(node, Value::Tensor(t));
        Ok(())
    }
}
