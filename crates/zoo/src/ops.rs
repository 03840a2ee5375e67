//! The op library: each op declares its output shape, its parameters, what its backward
//! saves, its temporary memory and its FLOPs. This one declaration feeds the planner's
//! training graph (here) and the executor (`pebble-runtime`), so that plan and run agree.

use serde::{Deserialize, Serialize};

use crate::ZooError;

/// A tensor shape.
pub type Shape = Vec<usize>;

/// Element type of a tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Elem {
    /// The model's float type (fp32 or bf16).
    Float,
    /// 64-bit integers (token ids, labels, pooling indices).
    Int,
    /// One byte per element (dropout and ReLU masks).
    Byte,
}

/// What an op's backward needs from its forward, beyond parameters and the output gradient.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Saved {
    /// The op's k-th input.
    Input(usize),
    /// The op's output.
    Output,
    /// A tensor that exists only to be saved (a mask, statistics, attention weights):
    /// a "phantom" in Zhao's terms. Produced only when the forward runs with grad.
    Extra {
        /// Its name, e.g. `mask`.
        name: &'static str,
        /// Its shape.
        shape: Shape,
        /// Its element type.
        elem: Elem,
    },
}

/// The typed ops models are made of. Shapes are PyTorch's: images `[N, C, H, W]`,
/// sequences `[B, S, E]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OpKind {
    /// 2-D convolution.
    Conv2d {
        /// Output channels.
        out_channels: usize,
        /// Kernel size (square).
        kernel: usize,
        /// Stride.
        stride: usize,
        /// Zero padding.
        padding: usize,
        /// Channel groups.
        groups: usize,
        /// Whether it has a bias.
        bias: bool,
    },
    /// 2-D transposed convolution (U-Net's up-sampling).
    ConvTranspose2d {
        /// Output channels.
        out_channels: usize,
        /// Kernel size (square), equal to the stride.
        kernel: usize,
        /// Whether it has a bias.
        bias: bool,
    },
    /// Affine map on the last dimension.
    Linear {
        /// Output features.
        out_features: usize,
        /// Whether it has a bias.
        bias: bool,
    },
    /// Batch normalization in training mode over `[N, C, H, W]`.
    BatchNorm2d,
    /// Layer normalization over the last dimension.
    LayerNorm {
        /// Whether it has a bias.
        bias: bool,
    },
    /// RMS normalization over the last dimension (Llama).
    RmsNorm,
    /// ReLU; its backward needs its output (as PyTorch's and Burn's `relu_backward`).
    Relu,
    /// GELU (tanh approximation); its backward needs its input.
    Gelu,
    /// SiLU; its backward needs its input.
    Silu,
    /// Dropout with probability `p`; its backward needs the mask.
    Dropout {
        /// Drop probability.
        p: f64,
    },
    /// Softmax over the last dimension; its backward needs its output.
    Softmax,
    /// Scaled dot-product attention. Inputs: one packed `[B, S, 3E]` tensor, or `q, k, v`
    /// (`k`, `v` may have fewer heads, for grouped-query attention). Output `[B, S, E]`.
    /// It materializes the attention weights, as eager PyTorch and our executor do.
    Attention {
        /// Query heads.
        heads: usize,
        /// Key/value heads (equal to `heads` without grouped-query attention).
        kv_heads: usize,
        /// Causal mask.
        causal: bool,
        /// Dropout on the attention weights.
        dropout: f64,
    },
    /// Rotary position embedding on `rotary_dim` of each head's dimensions.
    Rope {
        /// Heads in the input.
        heads: usize,
        /// Dimensions rotated per head.
        rotary_dim: usize,
    },
    /// Table lookup: integer input `[..]` → `[.., dim]`.
    Embedding {
        /// Table rows.
        vocab: usize,
        /// Embedding width.
        dim: usize,
    },
    /// Elementwise sum of two tensors (the second may broadcast over leading dimensions).
    Add,
    /// Elementwise product of two same-shape tensors.
    Mul,
    /// Concatenation along a dimension.
    Concat {
        /// The dimension.
        dim: usize,
    },
    /// Max pooling; its backward needs the input and the argmax indices.
    MaxPool2d {
        /// Window.
        kernel: usize,
        /// Stride.
        stride: usize,
        /// Padding.
        padding: usize,
    },
    /// Average pooling.
    AvgPool2d {
        /// Window.
        kernel: usize,
        /// Stride.
        stride: usize,
        /// Padding.
        padding: usize,
    },
    /// Adaptive average pooling to `out × out`.
    AdaptiveAvgPool2d {
        /// Output side.
        out: usize,
    },
    /// A view with another shape (flatten, split of heads): allocates nothing.
    Reshape {
        /// The new shape.
        shape: Shape,
    },
    /// A view of `len` entries of the last dimension from `start` (splitting a packed
    /// tensor): allocates nothing in the planner's accounting.
    Slice {
        /// First index of the last dimension.
        start: usize,
        /// Number of entries.
        len: usize,
    },
    /// Cross-entropy loss of logits `[.., C]` against integer labels `[..]`.
    CrossEntropy,
    /// Mean squared error of two same-shape tensors.
    Mse,
    /// 2-D convolution with a rectangular kernel and padding (Inception's 1×7, 7×1,
    /// 1×3 and 3×1 factorized convolutions); one group.
    Conv2dRect {
        /// Output channels.
        out_channels: usize,
        /// Kernel height.
        kernel_h: usize,
        /// Kernel width.
        kernel_w: usize,
        /// Stride (both directions).
        stride: usize,
        /// Zero padding of the height.
        pad_h: usize,
        /// Zero padding of the width.
        pad_w: usize,
        /// Whether it has a bias.
        bias: bool,
    },
    /// Local response normalization across channels (AlexNet, GoogLeNet, ZFNet):
    /// `y = x / (bias + alpha/size · Σ x²)^beta` over `size` neighbouring channels of
    /// `[N, C, H, W]`. Its backward needs its input and its output (as cuDNN's).
    Lrn {
        /// Channels in the window.
        size: usize,
        /// Scale of the sum of squares.
        alpha: f64,
        /// Exponent.
        beta: f64,
        /// Additive constant.
        bias: f64,
    },
    /// A permutation of the dimensions, materialized (ShuffleNet's channel shuffle): the
    /// output dimension `i` is the input's dimension `perm[i]`. Its backward permutes back
    /// and needs nothing saved.
    Permute {
        /// The permutation.
        perm: Vec<usize>,
    },
    /// A batched product of two activations, `[.., m, k] × [.., k, n]` with the same
    /// leading dimensions (attention's scores and mix, as ONNX writes an unfused
    /// attention). Its backward reads both inputs.
    MatMul,
    /// A per-channel affine map `y = x·w + b` along dimension `dim`, with learned `w`
    /// and `b` of `x[dim]` entries (Caffe's Scale layer; a batch norm folded into Mul and
    /// Add). Its backward needs its input only when it scales (for the weight gradient).
    ChannelAffine {
        /// The channel dimension.
        dim: usize,
        /// Whether it has a weight (a scale).
        scale: bool,
        /// Whether it has a bias.
        bias: bool,
    },
    /// 2-D max or average pooling with any window, strides and zero padding, asymmetric
    /// included (Caffe's ceil-mode pools as ONNX writes them). Max pooling saves its input
    /// and argmax indices, as [`OpKind::MaxPool2d`].
    Pool2d {
        /// Max pooling (else average).
        max: bool,
        /// Window (height, width).
        kernel: [usize; 2],
        /// Strides (height, width).
        stride: [usize; 2],
        /// Padding: top, left, bottom, right.
        pads: [usize; 4],
    },
}

/// What an op declares, for given input shapes.
#[derive(Debug, Clone, PartialEq)]
pub struct OpDecl {
    /// Output shape.
    pub output: Shape,
    /// Output element type.
    pub output_elem: Elem,
    /// Parameters it owns: a name suffix (`weight`, `bias`) and a shape.
    pub params: Vec<(&'static str, Shape)>,
    /// What its backward needs.
    pub saved: Vec<Saved>,
    /// Whether the backward needs the parameters (for the input gradient).
    pub backward_reads_params: bool,
    /// Forward FLOPs.
    pub forward_flops: f64,
    /// Backward FLOPs (input and parameter gradients).
    pub backward_flops: f64,
    /// Whether the FLOPs run on matrix units (convolutions, matmuls).
    pub matmul: bool,
    /// Temporary elements (model float) while the forward runs.
    pub forward_tmp: usize,
    /// Temporary elements (model float) while the backward runs.
    pub backward_tmp: usize,
    /// A view: no allocation, the output aliases the input.
    pub view: bool,
    /// A loss: its node is the training graph's loss (forward and backward at once).
    pub loss: bool,
}

/// An input of an op: its shape and element type.
#[derive(Debug, Clone, PartialEq)]
pub struct Operand {
    /// Shape.
    pub shape: Shape,
    /// Element type.
    pub elem: Elem,
}

impl OpDecl {
    /// An op with a weight (and a bias of `bias` entries) doing `macs` multiply-adds on
    /// matrix units: forward `2·macs`, backward `4·macs` (input and weight gradients), and
    /// a backward that reads the input and the weight.
    fn weighted(&mut self, weight: Shape, bias: Option<usize>, macs: f64) {
        self.params.push(("weight", weight));
        if let Some(b) = bias {
            self.params.push(("bias", vec![b]));
        }
        self.forward_flops = 2.0 * macs;
        self.backward_flops = 4.0 * macs;
        self.matmul = true;
        self.saved = vec![Saved::Input(0)];
        self.backward_reads_params = true;
    }
}

/// The product of `dims` as a float: FLOP counts, which may exceed a `usize` where the
/// shapes themselves do not.
fn count(dims: &[usize]) -> f64 {
    dims.iter().map(|&d| d as f64).product()
}

fn numel(s: &[usize]) -> usize {
    s.iter().product()
}

impl OpKind {
    /// The name the graph and the executor use, e.g. `conv2d`.
    pub fn name(&self) -> &'static str {
        match self {
            OpKind::Conv2d { .. } => "conv2d",
            OpKind::ConvTranspose2d { .. } => "conv_transpose2d",
            OpKind::Linear { .. } => "linear",
            OpKind::BatchNorm2d => "batch_norm2d",
            OpKind::LayerNorm { .. } => "layer_norm",
            OpKind::RmsNorm => "rms_norm",
            OpKind::Relu => "relu",
            OpKind::Gelu => "gelu",
            OpKind::Silu => "silu",
            OpKind::Dropout { .. } => "dropout",
            OpKind::Softmax => "softmax",
            OpKind::Attention { .. } => "attention",
            OpKind::Rope { .. } => "rope",
            OpKind::Embedding { .. } => "embedding",
            OpKind::Add => "add",
            OpKind::Mul => "mul",
            OpKind::Concat { .. } => "concat",
            OpKind::MaxPool2d { .. } => "max_pool2d",
            OpKind::AvgPool2d { .. } => "avg_pool2d",
            OpKind::AdaptiveAvgPool2d { .. } => "adaptive_avg_pool2d",
            OpKind::Reshape { .. } => "reshape",
            OpKind::Slice { .. } => "slice",
            OpKind::CrossEntropy => "cross_entropy",
            OpKind::Mse => "mse",
            OpKind::Conv2dRect { .. } => "conv2d_rect",
            OpKind::Lrn { .. } => "lrn",
            OpKind::Permute { .. } => "permute",
            OpKind::MatMul => "matmul",
            OpKind::ChannelAffine { .. } => "channel_affine",
            OpKind::Pool2d { .. } => "pool2d",
        }
    }

    /// Declares the op for the given inputs, or says why the shapes do not fit.
    pub fn declare(&self, inputs: &[Operand]) -> Result<OpDecl, ZooError> {
        let bad = |why: String| ZooError::Shape { op: self.name(), why };
        let arity = |n: usize| {
            if inputs.len() == n {
                Ok(())
            } else {
                Err(bad(format!("expects {n} input(s), got {}", inputs.len())))
            }
        };
        let float = |k: usize| {
            if inputs[k].elem == Elem::Float {
                Ok(())
            } else {
                Err(bad(format!("input {k} must be a float tensor")))
            }
        };
        let mut d = OpDecl {
            output: Vec::new(),
            output_elem: Elem::Float,
            params: Vec::new(),
            saved: Vec::new(),
            backward_reads_params: false,
            forward_flops: 0.0,
            backward_flops: 0.0,
            matmul: false,
            forward_tmp: 0,
            backward_tmp: 0,
            view: false,
            loss: false,
        };
        let x = inputs.first().map(|o| o.shape.clone()).unwrap_or_default();
        let n_in = numel(&x) as f64;
        let elementwise = |d: &mut OpDecl, fwd_per: f64, bwd_per: f64| {
            d.output = x.clone();
            d.forward_flops = fwd_per * n_in;
            d.backward_flops = bwd_per * n_in;
        };
        let image = |what: &str| {
            if x.len() == 4 {
                Ok((x[0], x[1], x[2], x[3]))
            } else {
                Err(bad(format!("{what} expects a [N, C, H, W] input, got {x:?}")))
            }
        };
        match self {
            OpKind::Conv2d { out_channels, kernel, stride, padding, groups, bias } => {
                arity(1)?;
                float(0)?;
                let (n, c, h, w) = image("conv2d")?;
                if *stride == 0 || *groups == 0 || c % groups != 0 || out_channels % groups != 0 {
                    return Err(bad(format!(
                        "channels {c} → {out_channels} do not divide into {groups} groups (or stride 0)"
                    )));
                }
                if h + 2 * padding < *kernel || w + 2 * padding < *kernel {
                    return Err(bad(format!("kernel {kernel} larger than the padded input {h}×{w}")));
                }
                let ho = (h + 2 * padding - kernel) / stride + 1;
                let wo = (w + 2 * padding - kernel) / stride + 1;
                d.output = vec![n, *out_channels, ho, wo];
                let macs = count(&[n, *out_channels, ho, wo, c / groups, *kernel, *kernel]);
                d.weighted(vec![*out_channels, c / groups, *kernel, *kernel], bias.then_some(*out_channels), macs);
            }
            OpKind::ConvTranspose2d { out_channels, kernel, bias } => {
                arity(1)?;
                float(0)?;
                let (n, c, h, w) = image("conv_transpose2d")?;
                d.output = vec![n, *out_channels, h * kernel, w * kernel];
                let macs = count(&[n, c, h, w, *out_channels, *kernel, *kernel]);
                d.weighted(vec![c, *out_channels, *kernel, *kernel], bias.then_some(*out_channels), macs);
            }
            OpKind::Linear { out_features, bias } => {
                arity(1)?;
                float(0)?;
                let Some(&k) = x.last() else { return Err(bad("needs at least a 1-D input".into())) };
                let mut out = x.clone();
                *out.last_mut().expect("non-empty") = *out_features;
                d.output = out;
                d.weighted(vec![*out_features, k], bias.then_some(*out_features), count(&x) * *out_features as f64);
            }
            OpKind::BatchNorm2d => {
                arity(1)?;
                float(0)?;
                let (_, c, _, _) = image("batch_norm2d")?;
                elementwise(&mut d, 8.0, 12.0);
                d.params = vec![("weight", vec![c]), ("bias", vec![c])];
                d.saved = vec![
                    Saved::Input(0),
                    Saved::Extra { name: "mean", shape: vec![c], elem: Elem::Float },
                    Saved::Extra { name: "invstd", shape: vec![c], elem: Elem::Float },
                ];
                d.backward_reads_params = true;
            }
            OpKind::LayerNorm { .. } | OpKind::RmsNorm => {
                let bias = matches!(self, OpKind::LayerNorm { bias: true });
                arity(1)?;
                float(0)?;
                let Some(&e) = x.last() else { return Err(bad("needs at least a 1-D input".into())) };
                elementwise(&mut d, 8.0, 12.0);
                d.params.push(("weight", vec![e]));
                if bias {
                    d.params.push(("bias", vec![e]));
                }
                let rows = numel(&x) / e.max(1);
                d.saved = vec![Saved::Input(0), Saved::Extra { name: "rstd", shape: vec![rows], elem: Elem::Float }];
                if matches!(self, OpKind::LayerNorm { .. }) {
                    d.saved.push(Saved::Extra { name: "mean", shape: vec![rows], elem: Elem::Float });
                }
                d.backward_reads_params = true;
            }
            OpKind::Relu => {
                arity(1)?;
                float(0)?;
                elementwise(&mut d, 1.0, 1.0);
                d.saved = vec![Saved::Output];
            }
            OpKind::Gelu | OpKind::Silu => {
                arity(1)?;
                float(0)?;
                elementwise(&mut d, 8.0, 12.0);
                d.saved = vec![Saved::Input(0)];
            }
            OpKind::Dropout { p } => {
                arity(1)?;
                float(0)?;
                if !(0.0..1.0).contains(p) {
                    return Err(bad(format!("probability {p} is not in [0, 1)")));
                }
                elementwise(&mut d, 2.0, 1.0);
                d.saved = vec![Saved::Extra { name: "mask", shape: x.clone(), elem: Elem::Byte }];
            }
            OpKind::Softmax => {
                arity(1)?;
                float(0)?;
                elementwise(&mut d, 5.0, 4.0);
                d.saved = vec![Saved::Output];
            }
            OpKind::Attention { heads, kv_heads, causal: _, dropout } => {
                let (b, s, e, kv_e) = match inputs.len() {
                    1 => {
                        float(0)?;
                        if x.len() != 3 || !x[2].is_multiple_of(3) {
                            return Err(bad(format!("packed attention expects [B, S, 3E], got {x:?}")));
                        }
                        (x[0], x[1], x[2] / 3, x[2] / 3)
                    }
                    3 => {
                        for (k, input) in inputs.iter().enumerate() {
                            float(k)?;
                            if input.shape.len() != 3 {
                                return Err(bad(format!("input {k} must be [B, S, E], got {:?}", input.shape)));
                            }
                        }
                        if inputs[1].shape != inputs[2].shape || inputs[1].shape[..2] != x[..2] {
                            return Err(bad("k and v must match, and share q's batch and length".into()));
                        }
                        (x[0], x[1], x[2], inputs[1].shape[2])
                    }
                    n => return Err(bad(format!("expects 1 (packed) or 3 (q, k, v) inputs, got {n}"))),
                };
                if *heads == 0
                    || *kv_heads == 0
                    || e % heads != 0
                    || heads % kv_heads != 0
                    || kv_e * heads != e * kv_heads
                {
                    return Err(bad(format!(
                        "width {e} (kv {kv_e}) does not split into {heads} heads / {kv_heads} kv heads"
                    )));
                }
                d.output = vec![b, s, e];
                let scores = b * heads * s * s;
                d.forward_flops = 4.0 * count(&[b, s, s, e]) + 5.0 * scores as f64;
                d.backward_flops = 8.0 * count(&[b, s, s, e]) + 4.0 * scores as f64;
                d.matmul = true;
                d.saved = (0..inputs.len()).map(Saved::Input).collect();
                d.saved.push(Saved::Extra { name: "weights", shape: vec![b, *heads, s, s], elem: Elem::Float });
                if *dropout > 0.0 {
                    d.saved.push(Saved::Extra { name: "mask", shape: vec![b, *heads, s, s], elem: Elem::Byte });
                }
                d.forward_tmp = scores;
                d.backward_tmp = 2 * scores;
            }
            OpKind::Rope { heads, rotary_dim } => {
                arity(1)?;
                float(0)?;
                let Some(&e) = x.last() else { return Err(bad("needs at least a 1-D input".into())) };
                if *heads == 0 || e % heads != 0 || *rotary_dim > e / heads || rotary_dim % 2 != 0 {
                    return Err(bad(format!("rotary dim {rotary_dim} does not fit heads of width {e}/{heads}")));
                }
                elementwise(&mut d, 3.0, 3.0);
            }
            OpKind::Embedding { vocab, dim } => {
                arity(1)?;
                if inputs[0].elem != Elem::Int {
                    return Err(bad("input must be integer ids".into()));
                }
                let mut out = x.clone();
                out.push(*dim);
                d.output = out;
                d.params.push(("weight", vec![*vocab, *dim]));
                d.backward_flops = count(&x) * *dim as f64;
                d.saved = vec![Saved::Input(0)];
            }
            OpKind::Add | OpKind::Mul => {
                arity(2)?;
                float(0)?;
                float(1)?;
                let y = &inputs[1].shape;
                let ok = match self {
                    OpKind::Add => y.len() <= x.len() && x[x.len() - y.len()..] == y[..],
                    _ => *y == x,
                };
                if !ok {
                    return Err(bad(format!("shapes {x:?} and {y:?} do not match")));
                }
                elementwise(&mut d, 1.0, if matches!(self, OpKind::Mul) { 2.0 } else { 1.0 });
                if matches!(self, OpKind::Mul) {
                    d.saved = vec![Saved::Input(0), Saved::Input(1)];
                }
            }
            OpKind::Concat { dim } => {
                if inputs.is_empty() {
                    return Err(bad("needs at least one input".into()));
                }
                let mut out = x.clone();
                if *dim >= out.len() {
                    return Err(bad(format!("dimension {dim} out of range for {x:?}")));
                }
                out[*dim] = 0;
                for (k, o) in inputs.iter().enumerate() {
                    float(k)?;
                    let same = o.shape.len() == x.len() && (0..x.len()).all(|i| i == *dim || o.shape[i] == x[i]);
                    if !same {
                        return Err(bad(format!(
                            "input {k} shape {:?} does not match {x:?} outside dim {dim}",
                            o.shape
                        )));
                    }
                    out[*dim] += o.shape[*dim];
                }
                d.output = out;
            }
            OpKind::MaxPool2d { kernel, stride, padding } | OpKind::AvgPool2d { kernel, stride, padding } => {
                arity(1)?;
                float(0)?;
                let (n, c, h, w) = image("pooling")?;
                if *stride == 0 || h + 2 * padding < *kernel || w + 2 * padding < *kernel {
                    return Err(bad(format!("window {kernel} does not fit the input {h}×{w}")));
                }
                let ho = (h + 2 * padding - kernel) / stride + 1;
                let wo = (w + 2 * padding - kernel) / stride + 1;
                d.output = vec![n, c, ho, wo];
                let out = (n * c * ho * wo) as f64;
                d.forward_flops = out * (kernel * kernel) as f64;
                d.backward_flops = out * (kernel * kernel) as f64;
                if matches!(self, OpKind::MaxPool2d { .. }) {
                    d.saved = vec![
                        Saved::Input(0),
                        Saved::Extra { name: "indices", shape: d.output.clone(), elem: Elem::Int },
                    ];
                }
            }
            OpKind::AdaptiveAvgPool2d { out } => {
                arity(1)?;
                float(0)?;
                let (n, c, _, _) = image("adaptive_avg_pool2d")?;
                d.output = vec![n, c, *out, *out];
                d.forward_flops = n_in;
                d.backward_flops = n_in;
            }
            OpKind::Reshape { shape } => {
                arity(1)?;
                if numel(shape) != numel(&x) {
                    return Err(bad(format!("cannot view {x:?} as {shape:?}")));
                }
                d.output = shape.clone();
                d.output_elem = inputs[0].elem;
                d.view = true;
            }
            OpKind::Slice { start, len } => {
                arity(1)?;
                let Some(&e) = x.last() else { return Err(bad("needs at least a 1-D input".into())) };
                if start + len > e || *len == 0 {
                    return Err(bad(format!("slice {start}..{} out of the last dimension {e}", start + len)));
                }
                let mut out = x.clone();
                *out.last_mut().expect("non-empty") = *len;
                d.output = out;
                d.output_elem = inputs[0].elem;
                d.view = true;
            }
            OpKind::CrossEntropy => {
                arity(2)?;
                float(0)?;
                let y = &inputs[1].shape;
                if inputs[1].elem != Elem::Int || x.is_empty() || x[..x.len() - 1] != y[..] {
                    return Err(bad(format!("logits {x:?} and integer labels {y:?} do not match")));
                }
                d.output = vec![];
                d.forward_flops = 5.0 * n_in;
                d.backward_flops = 2.0 * n_in;
                d.forward_tmp = numel(&x);
                d.loss = true;
            }
            OpKind::Mse => {
                arity(2)?;
                float(0)?;
                float(1)?;
                if inputs[1].shape != x {
                    return Err(bad(format!("prediction {x:?} and target {:?} differ", inputs[1].shape)));
                }
                d.output = vec![];
                d.forward_flops = 3.0 * n_in;
                d.backward_flops = 2.0 * n_in;
                d.loss = true;
            }
            OpKind::Conv2dRect { out_channels, kernel_h, kernel_w, stride, pad_h, pad_w, bias } => {
                arity(1)?;
                float(0)?;
                let (n, c, h, w) = image("conv2d_rect")?;
                if *stride == 0 || *kernel_h == 0 || *kernel_w == 0 {
                    return Err(bad(format!("kernel {kernel_h}×{kernel_w} or stride {stride} is zero")));
                }
                if h + 2 * pad_h < *kernel_h || w + 2 * pad_w < *kernel_w {
                    return Err(bad(format!("kernel {kernel_h}×{kernel_w} larger than the padded input {h}×{w}")));
                }
                let ho = (h + 2 * pad_h - kernel_h) / stride + 1;
                let wo = (w + 2 * pad_w - kernel_w) / stride + 1;
                d.output = vec![n, *out_channels, ho, wo];
                let macs = count(&[n, *out_channels, ho, wo, c, *kernel_h, *kernel_w]);
                d.weighted(vec![*out_channels, c, *kernel_h, *kernel_w], bias.then_some(*out_channels), macs);
            }
            OpKind::Lrn { size, alpha, beta, bias } => {
                arity(1)?;
                float(0)?;
                image("lrn")?;
                if *size == 0 || !alpha.is_finite() || !beta.is_finite() || !bias.is_finite() {
                    return Err(bad(format!("window {size}, alpha {alpha}, beta {beta}, bias {bias}")));
                }
                // Forward: the windowed sum of squares, then a power and a product per element;
                // backward: the same window over `dy·y/scale`. The scale is a temporary.
                elementwise(&mut d, (*size + 5) as f64, (2 * *size + 8) as f64);
                d.saved = vec![Saved::Input(0), Saved::Output];
                d.forward_tmp = numel(&x);
                d.backward_tmp = 2 * numel(&x);
            }
            OpKind::Permute { perm } => {
                arity(1)?;
                let mut seen = vec![false; x.len()];
                let mut repeated = |p: usize| p >= x.len() || std::mem::replace(&mut seen[p], true);
                if perm.len() != x.len() || perm.iter().any(|&p| repeated(p)) {
                    return Err(bad(format!("{perm:?} is not a permutation of the {} dimensions of {x:?}", x.len())));
                }
                d.output = perm.iter().map(|&p| x[p]).collect();
                d.output_elem = inputs[0].elem;
            }
            OpKind::MatMul => {
                arity(2)?;
                float(0)?;
                float(1)?;
                let y = &inputs[1].shape;
                let r = x.len();
                if r < 2 || y.len() != r || x[..r - 2] != y[..r - 2] || x[r - 1] != y[r - 2] {
                    return Err(bad(format!("cannot multiply {x:?} by {y:?}")));
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
                arity(1)?;
                float(0)?;
                if *dim >= x.len() {
                    return Err(bad(format!("dimension {dim} out of range for {x:?}")));
                }
                if !scale && !bias {
                    return Err(bad("neither a scale nor a bias".into()));
                }
                let c = x[*dim];
                elementwise(&mut d, if *scale && *bias { 2.0 } else { 1.0 }, if *scale { 3.0 } else { 1.0 });
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
                arity(1)?;
                float(0)?;
                let (n, c, h, w) = image("pool2d")?;
                let (hp, wp) = (h + pads[0] + pads[2], w + pads[1] + pads[3]);
                if stride.contains(&0) || kernel.contains(&0) || hp < kernel[0] || wp < kernel[1] {
                    return Err(bad(format!(
                        "window {kernel:?} (strides {stride:?}) does not fit the input {h}×{w} padded by {pads:?}"
                    )));
                }
                if pads[0].max(pads[2]) >= kernel[0] || pads[1].max(pads[3]) >= kernel[1] {
                    return Err(bad(format!("padding {pads:?} as large as the window {kernel:?}")));
                }
                let ho = (hp - kernel[0]) / stride[0] + 1;
                let wo = (wp - kernel[1]) / stride[1] + 1;
                d.output = vec![n, c, ho, wo];
                let out = (n * c * ho * wo) as f64;
                d.forward_flops = out * (kernel[0] * kernel[1]) as f64;
                d.backward_flops = d.forward_flops;
                if *max {
                    d.saved = vec![
                        Saved::Input(0),
                        Saved::Extra { name: "indices", shape: d.output.clone(), elem: Elem::Int },
                    ];
                }
            }
        }
        Ok(d)
    }
}
