//! The model zoo: every model as a network of typed ops with shapes, lowered to both
//! planner views (training graph and chain) with sizes from the shapes and times from a
//! roofline [`CostModel`] on a device [`Profile`].
//!
//! * [`ops`]: the op library. Each [`OpKind`] declares its output shape, parameters,
//!   what its backward saves, its temporary memory and FLOPs. The executor runs the same
//!   declarations, so the plan and the run cannot disagree.
//! * [`NetBuilder`] / [`Network`]: models are written op by op, grouped into blocks.
//! * [`models`]: the named models ([`catalog`], [`build`]).
//!
//! ```
//! use pebble_zoo::{build, ModelOptions};
//! let m = build("resnet18", &ModelOptions { batch: Some(2), image: Some(64), ..Default::default() }).unwrap();
//! assert_eq!(m.network.param_count(), 11_689_512);
//! assert!(m.chain.len() > 8);
//! ```
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod cost;
pub mod models;
mod network;
pub mod ops;

use pebble_graph::{partition, Chain, TrainingGraph};
use serde::{Deserialize, Serialize};
use thiserror::Error;

pub use cost::CostModel;
pub use models::{build, catalog, ModelSpec};
pub use network::{GraphIndex, NetBuilder, NetOp, NetParam, NetTensor, Network, OpCosts, ParamId, TensorId};
pub use ops::{Elem, OpKind, Temporaries};
pub use pebble_machine::{Machine, Profile};

/// Why a model could not be built.
#[derive(Debug, Error, Clone, PartialEq)]
#[non_exhaustive]
pub enum ZooError {
    /// No model has this name.
    #[error("unknown model `{name}` (known: {known}){}", pebble_machine::names::did_you_mean(.name, .known.split(", ")))]
    UnknownModel {
        /// The name asked for.
        name: String,
        /// The known names, comma-separated.
        known: String,
    },
    /// An option the model does not take, or a value it cannot use.
    #[error("model `{model}`: option `--{option}` {why}")]
    BadOption {
        /// The model.
        model: String,
        /// The option, as the CLI spells it.
        option: &'static str,
        /// What is wrong.
        why: String,
    },
    /// Options whose step would hold more than [`MAX_STEP_BYTES`].
    #[error(
        "model `{model}`: these options make one training step hold {bytes:.3e} bytes of tensors and parameters, \
         more than the 1 PiB pebble plans for; lower --batch, --image, --seq, --width or --layers"
    )]
    TooLarge {
        /// The model.
        model: String,
        /// The bytes of every tensor and parameter of one step, once each.
        bytes: f64,
    },
    /// Shapes that an op cannot take.
    #[error("op {op}: {why}")]
    Shape {
        /// The op type.
        op: &'static str,
        /// What is wrong.
        why: String,
    },
    /// The lowered graph failed validation (a zoo bug).
    #[error("model `{model}`: {error}")]
    Graph {
        /// The model.
        model: String,
        /// The graph error.
        error: pebble_graph::GraphError,
    },
}

/// The largest `--batch` a model takes (each size option has its bound; this one is
/// also `pebble maxbatch`'s largest `--max`).
pub const MAX_BATCH: usize = 1 << 20;

/// The most bytes of tensors and parameters one training step may hold, each once
/// (1 PiB): sizes beyond it are bad input, so that every byte count pebble derives from a
/// model fits in a `u64` with room to add.
pub const MAX_STEP_BYTES: u64 = 1 << 50;

/// Float type of a model's parameters and activations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DType {
    /// 32-bit floats (the default, as in the seeds' experiments).
    #[default]
    F32,
    /// bfloat16.
    Bf16,
}

impl DType {
    /// Bytes per element.
    pub fn bytes(self) -> u64 {
        match self {
            DType::F32 => 4,
            DType::Bf16 => 2,
        }
    }

    /// Name as the CLI spells it.
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::Bf16 => "bf16",
        }
    }
}

/// The optimizer whose state counts in memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Optimizer {
    /// Plain SGD: no state.
    Sgd,
    /// SGD with momentum: one state per parameter.
    Momentum,
    /// Adam / AdamW: two states per parameter (Zhao §1.1: M_opt_st = 2 × M_p_grad).
    #[default]
    Adam,
}

impl Optimizer {
    /// States kept per parameter.
    pub fn states_per_param(self) -> u64 {
        match self {
            Optimizer::Sgd => 0,
            Optimizer::Momentum => 1,
            Optimizer::Adam => 2,
        }
    }

    /// Name as the CLI spells it.
    pub fn name(self) -> &'static str {
        match self {
            Optimizer::Sgd => "sgd",
            Optimizer::Momentum => "momentum",
            Optimizer::Adam => "adam",
        }
    }
}

/// How a training step sizes each parameter's static memory (Zhao §1.1, and the mixed
/// precision and partial training of OffMate's experiments, Zhao Ch. 4): the parameter
/// itself, its gradient, and its [`DataKind::OptimizerState`](pebble_graph::DataKind)
/// node. An [`Optimizer`] converts into one with the defaults (full training, no master
/// copy), so [`Network::training_graph`] takes either.
///
/// With `n` elements in a parameter tensor, `t` of them trainable (see
/// [`trainable_elements`](ParamMemory::trainable_elements)), `b` bytes per element of the
/// model's float type and `s` optimizer states per element:
///
/// | node              | bytes                                             |
/// |-------------------|---------------------------------------------------|
/// | `Parameter`       | `n·b` (frozen base weights stay on the device)    |
/// | `ParamGrad`       | `t·b`                                             |
/// | `OptimizerState`  | `t·s·b`; with `master_weights` and `b < 4`: `t·(1 + s)·4` |
///
/// Only memory changes: the backward's time is the same as in full training (its
/// parameter-gradient share is not split out of the op's FLOPs).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ParamMemory {
    /// The optimizer whose states count.
    pub optimizer: Optimizer,
    /// Mixed precision: an fp32 master copy of the weights, and fp32 optimizer states,
    /// beside weights and gradients in the model's float type. With an f32 model the
    /// weights are their own master copy and this changes nothing ([`ModelOptions`]
    /// rejects it there, as a likely mistake).
    pub master_weights: bool,
    /// The trainable fraction of each parameter tensor, in (0, 1]; 1 is full training.
    /// Gradients and optimizer states cover only the trainable elements (a LoRA-like
    /// adapter); values outside (0, 1] are clamped by
    /// [`trainable_elements`](ParamMemory::trainable_elements), [`ModelOptions`] rejects them.
    pub trainable: f64,
}

impl ParamMemory {
    /// Full training with `optimizer`, no master copy.
    pub fn new(optimizer: Optimizer) -> ParamMemory {
        ParamMemory { optimizer, master_weights: false, trainable: 1.0 }
    }

    /// The trainable elements of a tensor of `n`: `⌈trainable·n⌉` (a product within
    /// float rounding of a whole number counts as that number), at least 1 and at most
    /// `n`. An empty tensor has none.
    pub fn trainable_elements(&self, n: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        if self.trainable >= 1.0 || self.trainable.is_nan() {
            // 1, and anything above (or NaN): full training.
            return n;
        }
        let x = self.trainable * n as f64;
        let nearest = x.round();
        let t = if (x - nearest).abs() <= 1e-9 * nearest.max(1.0) { nearest } else { x.ceil() };
        (t as u64).clamp(1, n)
    }
}

impl Default for ParamMemory {
    fn default() -> Self {
        ParamMemory::new(Optimizer::default())
    }
}

impl From<Optimizer> for ParamMemory {
    fn from(optimizer: Optimizer) -> Self {
        ParamMemory::new(optimizer)
    }
}

/// The options every model takes; `None` means the model's default.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelOptions {
    /// Batch size.
    pub batch: Option<usize>,
    /// Image side, for vision models.
    pub image: Option<usize>,
    /// Sequence length, for sequence models.
    pub seq: Option<usize>,
    /// Layer count, for models of variable depth (GPT-2, Transformer, Llama, ...).
    pub layers: Option<usize>,
    /// Width (channels or embedding size), for models of variable width.
    pub width: Option<usize>,
    /// Attention heads, for models with a variable head count.
    pub heads: Option<usize>,
    /// Float type.
    pub dtype: DType,
    /// Optimizer (for the static memory it keeps).
    pub optimizer: Optimizer,
    /// Mixed precision (`--master-weights`): with `dtype` bf16, an fp32 master copy of
    /// the weights and fp32 optimizer states beside the bf16 weights and gradients (see
    /// [`ParamMemory`]). Needs bf16: with f32 it is rejected as a
    /// [`ZooError::BadOption`] (f32 weights are their own master copy).
    pub master_weights: bool,
    /// The trainable fraction of each parameter tensor (`--trainable`), in (0, 1]:
    /// LoRA-like partial training, where gradients and optimizer states cover that
    /// fraction and the frozen weights stay whole (see [`ParamMemory`]). `None` is full
    /// training; anything outside (0, 1], or NaN, is a [`ZooError::BadOption`].
    pub trainable: Option<f64>,
    /// The device profile: compute rates for the costs, and the machine (memory, links,
    /// the executor's runtime overhead, its integer width).
    pub profile: Profile,
    /// Whose temporary memory the ops hold: `None`, the executor's where the model is
    /// lowered for one (`pebble_train::lower::<B>`: burn-flex's on the CPU) and the
    /// kernels' otherwise (for the profile's device); `Some` says which (`--device cpu`
    /// on the planning commands: burn-flex's).
    pub temporaries: Option<Temporaries>,
}

impl Default for ModelOptions {
    fn default() -> Self {
        ModelOptions {
            batch: None,
            image: None,
            seq: None,
            layers: None,
            width: None,
            heads: None,
            dtype: DType::F32,
            optimizer: Optimizer::Adam,
            master_weights: false,
            trainable: None,
            profile: Profile::lookup("v100").expect("built-in"),
            temporaries: None,
        }
    }
}

impl ModelOptions {
    /// How the training graph sizes each parameter's static memory, after checking
    /// `master_weights` and `trainable`; `model` names the model in the error.
    pub fn param_memory(&self, model: &str) -> Result<ParamMemory, ZooError> {
        let bad = |option: &'static str, why: String| ZooError::BadOption { model: model.to_string(), option, why };
        if self.master_weights && self.dtype != DType::Bf16 {
            return Err(bad("master-weights", "needs --dtype bf16 (f32 weights are their own master copy)".into()));
        }
        let trainable = match self.trainable {
            None => 1.0,
            Some(a) if a > 0.0 && a <= 1.0 => a,
            Some(a) => return Err(bad("trainable", format!("must be a fraction in (0, 1], not {a}"))),
        };
        Ok(ParamMemory { optimizer: self.optimizer, master_weights: self.master_weights, trainable })
    }
}

/// The resolved sizes a model builder receives.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Dims {
    /// Batch size.
    pub batch: usize,
    /// Image side (vision models).
    pub image: usize,
    /// Sequence length (sequence models).
    pub seq: usize,
    /// Layer count (models of variable depth).
    pub layers: usize,
    /// Width (models of variable width).
    pub width: usize,
    /// Attention heads (models with a variable head count).
    pub heads: usize,
    /// Float type.
    pub dtype: DType,
}

/// A built model: its network and both planner views.
#[derive(Debug, Clone)]
pub struct Model {
    /// The catalog entry.
    pub spec: &'static ModelSpec,
    /// The resolved sizes.
    pub dims: Dims,
    /// The typed-op network (what the executor runs).
    pub network: Network,
    /// The training graph, timed on the chosen device.
    pub graph: TrainingGraph,
    /// The chain of the network's blocks.
    pub chain: Chain,
}

impl Model {
    /// Lowers a network to both views.
    pub fn from_network(
        spec: &'static ModelSpec,
        dims: Dims,
        network: Network,
        options: &ModelOptions,
    ) -> Result<Model, ZooError> {
        // Integers as wide as the executor stores them, so that every command sizes token
        // ids and labels alike.
        let mut network = network;
        network.int_bytes = options.profile.machine.runtime.int_bytes;
        network.temporaries = options.temporaries.unwrap_or_default();
        let bytes = network.step_bytes();
        if bytes > MAX_STEP_BYTES as u128 {
            return Err(ZooError::TooLarge { model: spec.name.to_string(), bytes: bytes as f64 });
        }
        let memory = options.param_memory(spec.name)?;
        let cost = CostModel { profile: options.profile.clone() };
        let graph = network.training_graph(&cost, memory);
        let err = |error| ZooError::Graph { model: spec.name.to_string(), error };
        graph.validate().map_err(err)?;
        let chain = partition::to_chain(&graph).map_err(err)?;
        Ok(Model { spec, dims, network, graph, chain })
    }
}
