//! The op library: each op declares its output shape, its parameters, what its backward
//! saves, its temporary memory and its FLOPs. This one declaration feeds the planner's
//! training graph (here) and the executor (`pebble-runtime`), so that plan and run agree.
//!
//! The declarations live in one file per op family, as the executor's `ops/` in
//! `pebble-runtime` does: `basic`, `activation`, `conv`, `norm`, `pool`, `attention`,
//! `loss`, and `onnx` for the ops only the ONNX importer makes.

mod activation;
mod attention;
mod basic;
mod conv;
mod loss;
mod norm;
mod onnx;
mod pool;

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
    /// Temporary elements (forward, backward) on pebble's executor on burn-flex (the CPU),
    /// measured there (`pebble-runtime`'s `declared_temporaries` test checks them): its
    /// matmuls, convolutions and elementwise chains allocate more than the kernels above.
    /// At least `forward_tmp` and `backward_tmp`.
    pub burn_flex_tmp: (usize, usize),
    /// A view: no allocation, the output aliases the input.
    pub view: bool,
    /// A loss: its node is the training graph's loss (forward and backward at once).
    pub loss: bool,
}

/// Whose allocations an op's temporary memory is counted for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Temporaries {
    /// The ops' kernels (`OpDecl::forward_tmp`, `backward_tmp`): what a GPU library's
    /// kernels hold, for the profiles' devices.
    #[default]
    Kernels,
    /// pebble's executor on burn-flex, the CPU (`OpDecl::burn_flex_tmp`).
    BurnFlex,
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
    /// A declaration with nothing in it yet: no output, parameters, saved tensors, FLOPs
    /// or temporaries.
    fn blank() -> OpDecl {
        OpDecl {
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
            burn_flex_tmp: (0, 0),
            view: false,
            loss: false,
        }
    }

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

    /// Its temporary elements (forward, backward) where `t`'s allocations run it.
    pub fn tmp(&self, t: Temporaries) -> (usize, usize) {
        match t {
            Temporaries::Kernels => (self.forward_tmp, self.backward_tmp),
            Temporaries::BurnFlex => self.burn_flex_tmp,
        }
    }

    /// Its temporary bytes (forward, backward) where `t`'s allocations run it, with floats
    /// of `float` bytes. A loss runs its forward and backward as one op: the larger of
    /// the two, as its backward.
    pub fn tmp_bytes(&self, t: Temporaries, float: u64) -> (u64, u64) {
        let (fwd, bwd) = self.tmp(t);
        let bwd = if self.loss { fwd.max(bwd) } else { bwd };
        (fwd as u64 * float, bwd as u64 * float)
    }

    /// A convolution's temporaries on burn-flex, measured, with `col` the elements of its
    /// unfolded input (im2col). Forward: the input and the weight reordered, the unfolded
    /// tiles, and the output before its last reordering and its aligning copy. Backward:
    /// at stride 1, the unfolded tiles; strided, the input gradient's transposed
    /// convolution reorders the weight (three times for a 1×1 kernel) and the gradients,
    /// and the weight gradient is copied out of Burn's unsliced one (`unsliced` elements)
    /// while both are live.
    fn conv_temporaries(&mut self, inputs: &Inputs<'_>, col: f64, (kernel, stride): (usize, usize), unsliced: usize) {
        let w: usize = self.params.first().map_or(0, |(_, s)| numel(s));
        let (x, out, col) = (numel(&inputs.x), numel(&self.output), col as usize);
        let backward = match (stride, kernel) {
            (1, _) => col * 3 / 2 + x + out,
            (_, 1) => 3 * w + 2 * x + 2 * out + col,
            _ => w + 2 * x + 2 * out + 2 * col,
        };
        self.burn_flex_tmp = (w + x + 2 * out + 2 * col, backward.max(unsliced));
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

    /// Declares the op for the given inputs, or says why the shapes do not fit. Each
    /// family declares its own ops, in the file of its name.
    pub fn declare(&self, inputs: &[Operand]) -> Result<OpDecl, ZooError> {
        let inputs = Inputs::new(self.name(), inputs);
        let mut d = match self.family() {
            Family::Basic => basic::declare(self, &inputs),
            Family::Activation => activation::declare(self, &inputs),
            Family::Conv => conv::declare(self, &inputs),
            Family::Norm => norm::declare(self, &inputs),
            Family::Pool => pool::declare(self, &inputs),
            Family::Attention => attention::declare(self, &inputs),
            Family::Loss => loss::declare(self, &inputs),
            Family::Onnx => onnx::declare(self, &inputs),
        }?;
        // burn-flex holds at least what the kernels do.
        d.burn_flex_tmp = (d.burn_flex_tmp.0.max(d.forward_tmp), d.burn_flex_tmp.1.max(d.backward_tmp));
        Ok(d)
    }

    /// The op's family: the file of `ops/` that declares it, and of the executor's
    /// `ops/` that runs it. The one list of which op is where.
    pub fn family(&self) -> Family {
        match self {
            OpKind::Linear { .. }
            | OpKind::Reshape { .. }
            | OpKind::Slice { .. }
            | OpKind::Add
            | OpKind::Mul
            | OpKind::Concat { .. }
            | OpKind::Embedding { .. } => Family::Basic,
            OpKind::Relu | OpKind::Gelu | OpKind::Silu | OpKind::Softmax | OpKind::Dropout { .. } => Family::Activation,
            OpKind::Conv2d { .. } | OpKind::Conv2dRect { .. } | OpKind::ConvTranspose2d { .. } => Family::Conv,
            OpKind::BatchNorm2d | OpKind::LayerNorm { .. } | OpKind::RmsNorm => Family::Norm,
            OpKind::MaxPool2d { .. } | OpKind::AvgPool2d { .. } | OpKind::AdaptiveAvgPool2d { .. } => Family::Pool,
            OpKind::Attention { .. } | OpKind::Rope { .. } => Family::Attention,
            OpKind::CrossEntropy | OpKind::Mse => Family::Loss,
            OpKind::Lrn { .. }
            | OpKind::Permute { .. }
            | OpKind::MatMul
            | OpKind::ChannelAffine { .. }
            | OpKind::Pool2d { .. } => Family::Onnx,
        }
    }
}

/// An op family: one file of `ops/` here and one of the executor's (`pebble-runtime`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// Linear layers, views, elementwise arithmetic, concatenation, embeddings.
    Basic,
    /// Pointwise activations, softmax, dropout.
    Activation,
    /// Convolutions.
    Conv,
    /// Normalizations.
    Norm,
    /// Pooling.
    Pool,
    /// Attention and rotary embeddings.
    Attention,
    /// Losses.
    Loss,
    /// The ops only the ONNX importer makes, which the executor does not run yet.
    Onnx,
}

/// The inputs of the op being declared, with the checks every family shares. Its errors
/// name the op.
struct Inputs<'a> {
    /// The op's name.
    op: &'static str,
    /// Every input.
    all: &'a [Operand],
    /// The first input's shape (empty without inputs).
    x: Shape,
    /// The first input's element count, as a float.
    n_in: f64,
}

impl<'a> Inputs<'a> {
    fn new(op: &'static str, all: &'a [Operand]) -> Inputs<'a> {
        let x = all.first().map(|o| o.shape.clone()).unwrap_or_default();
        let n_in = numel(&x) as f64;
        Inputs { op, all, x, n_in }
    }

    /// A shape error naming the op.
    fn bad(&self, why: String) -> ZooError {
        ZooError::Shape { op: self.op, why }
    }

    /// Checks that the op has `n` inputs.
    fn arity(&self, n: usize) -> Result<(), ZooError> {
        if self.all.len() == n {
            Ok(())
        } else {
            Err(self.bad(format!("expects {n} input(s), got {}", self.all.len())))
        }
    }

    /// Checks that input `k` is a float tensor.
    fn float(&self, k: usize) -> Result<(), ZooError> {
        if self.all[k].elem == Elem::Float {
            Ok(())
        } else {
            Err(self.bad(format!("input {k} must be a float tensor")))
        }
    }

    /// The first input as an image `[N, C, H, W]`; `what` names the op in the error.
    fn image(&self, what: &str) -> Result<(usize, usize, usize, usize), ZooError> {
        let x = &self.x;
        if x.len() == 4 {
            Ok((x[0], x[1], x[2], x[3]))
        } else {
            Err(self.bad(format!("{what} expects a [N, C, H, W] input, got {x:?}")))
        }
    }

    /// Declares an elementwise op: the output has the first input's shape, and each of its
    /// elements costs `fwd_per` FLOPs forward and `bwd_per` backward.
    fn elementwise(&self, d: &mut OpDecl, fwd_per: f64, bwd_per: f64) {
        d.output = self.x.clone();
        d.forward_flops = fwd_per * self.n_in;
        d.backward_flops = bwd_per * self.n_in;
    }
}
