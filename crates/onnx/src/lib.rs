//! ONNX import: reads an `.onnx` file and returns a zoo [`Network`], which both the
//! planners ([`Network::training_graph_indexed`]) and the executor take.
//!
//! ```no_run
//! use pebble_onnx::{import_file, ImportOptions};
//! let net = import_file("models/onnx/light_resnet50.onnx".as_ref(), &ImportOptions { batch: Some(32), ..Default::default() })?;
//! assert_eq!(net.param_count(), 25_557_032);
//! # Ok::<(), pebble_onnx::OnnxError>(())
//! ```
//!
//! **What it reads.** The protobuf is decoded with `prost` into hand-written messages
//! for the subset of `onnx.proto` it needs ([`proto`]): no `protoc`, no build script.
//! Weights may be initializers (inline or external: only their shapes matter), graph
//! inputs read as weights, or `Constant` / `ConstantOfShape` outputs (the ONNX test
//! suite's "light" models replace every weight by a `ConstantOfShape`).
//!
//! **What it builds.** Each node maps to the zoo op with the same memory behaviour, and
//! shapes are inferred through [`OpKind::declare`](pebble_zoo::OpKind::declare), so they
//! are exact even when the file has none:
//!
//! | ONNX | zoo op |
//! |---|---|
//! | `Conv` (groups, strides, pads, `auto_pad`; dilation 1) | `conv2d`, or `conv2d_rect` for rectangular kernels |
//! | `BatchNormalization` | `batch_norm2d` (scale and bias are parameters; the running mean and variance are buffers, not counted, as in PyTorch) |
//! | `Relu`, `Gelu`, `Softmax`, `Dropout`, `LRN` | `relu`, `gelu`, `softmax`, `dropout` (training mode), `lrn` |
//! | `MaxPool`, `AveragePool` (`ceil_mode`, asymmetric pads) | `max_pool2d`, `avg_pool2d`, or `pool2d` when the window or padding is not square |
//! | `GlobalAveragePool` | `adaptive_avg_pool2d` (out 1) |
//! | `Gemm`, `MatMul` by a constant (+ a following bias `Add`) | `linear` |
//! | `Add`, `Sum`, `Mul` of activations | `add` (chained for `Sum`), `mul` |
//! | `Mul` / `Add` by a per-channel constant (Caffe's Scale layer) | `channel_affine` (fused with a preceding bias-less conv, linear or scale) |
//! | `Concat`, `Transpose` | `concat`, `permute` |
//! | `Reshape`, `Flatten`, `Squeeze`, `Unsqueeze` | `reshape`, a view (no allocation); `Identity` and same-type `Cast` alias |
//! | `LayerNormalization`, `Gather` of a constant table | `layer_norm`, `embedding` |
//! | `Constant`, `ConstantOfShape`, `Shape`, and `Gather`/`Concat`/`Cast` of integer constants | folded at import |
//!
//! A constant read as a weight becomes a parameter of the op that reads it; a weight
//! read by several ops is one parameter. Only the nodes the (first) graph output depends
//! on are imported. A trailing `Softmax`/`LogSoftmax` is the inference head: the loss
//! appended after the output, cross-entropy against integer labels (as the zoo's models
//! end), applies log-softmax itself and reads the logits before it, flattened to
//! `[N, classes]`. Ops are grouped into stages (chain blocks) at sequential cut points:
//! a new stage begins after every op whose output is the only tensor crossing to later
//! ops ([`pebble_graph::cut::single_crossing_cuts`]).
//!
//! **Batch.** [`ImportOptions::batch`] replaces the first dimension of the data inputs
//! (files say 1 or a symbol); a `Reshape` whose constant target begins with the file's
//! batch follows it. Other sizes (the image) come from the file.
//!
//! **Not supported** (each is an [`OnnxError`] naming the node and op, never a panic):
//! products of two activations (attention written out as `MatMul`s), dilated or
//! asymmetrically padded convolutions, broadcasting other than over leading dimensions
//! or along one channel, control flow, and ops the zoo has no equivalent for (`Sigmoid`,
//! `Clip`, `Pad`, `Sub`, `Div`, ...). The executor has no kernels yet for `lrn`,
//! `permute`, `channel_affine` and `pool2d`: models using them plan but do not run.
//!
//! [`Network`]: pebble_zoo::Network
//! [`Network::training_graph_indexed`]: pebble_zoo::Network::training_graph_indexed
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod error;
mod import;
mod model;
pub mod proto;

use std::path::Path;

use pebble_zoo::DType;

pub use error::OnnxError;
pub use import::{import_bytes, import_file};
pub use model::imported_model;

/// How to import a model.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ImportOptions {
    /// Batch size: replaces the first dimension of the graph's data inputs. `None` keeps
    /// the file's (an error if it is symbolic).
    pub batch: Option<usize>,
    /// Float type of parameters and activations.
    pub dtype: DType,
}

/// The "light" models of the ONNX backend test suite (each with its weights replaced by
/// `ConstantOfShape` nodes), as `scripts/fetch-onnx-models.sh` names them.
pub const LIGHT_MODELS: [&str; 9] = [
    "resnet50",
    "densenet121",
    "inception_v1",
    "inception_v2",
    "vgg19",
    "shufflenet",
    "squeezenet",
    "bvlc_alexnet",
    "zfnet512",
];

/// `ROOT/models/onnx` with every light model, running `ROOT/scripts/fetch-onnx-models.sh`
/// first if one is missing (it downloads the `onnx` wheel from PyPI). For tests and
/// benchmarks; `root` is the workspace root.
pub fn fetch_light_models(root: &Path) -> Result<std::path::PathBuf, String> {
    let dir = root.join("models/onnx");
    if LIGHT_MODELS.iter().all(|m| dir.join(format!("light_{m}.onnx")).is_file()) {
        return Ok(dir);
    }
    let out = std::process::Command::new("bash")
        .arg(root.join("scripts/fetch-onnx-models.sh"))
        .arg(&dir)
        .current_dir(root)
        .output()
        .map_err(|e| format!("cannot run scripts/fetch-onnx-models.sh: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "scripts/fetch-onnx-models.sh failed (it downloads the onnx wheel from PyPI):\n{}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(dir)
}
