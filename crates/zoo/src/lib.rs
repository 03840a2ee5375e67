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
pub use ops::{Elem, OpKind};
pub use pebble_machine::{Machine, Profile};

/// Why a model could not be built.
#[derive(Debug, Error, Clone, PartialEq)]
#[non_exhaustive]
pub enum ZooError {
    /// No model has this name.
    #[error("unknown model `{name}` (known: {known})")]
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
    /// The device profile: compute rates for the costs, and the machine (memory, links,
    /// the executor's runtime overhead, its integer width).
    pub profile: Profile,
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
            profile: Profile::lookup("v100").expect("built-in"),
        }
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
        let cost = CostModel { profile: options.profile.clone() };
        let graph = network.training_graph(&cost, options.optimizer);
        let err = |error| ZooError::Graph { model: spec.name.to_string(), error };
        graph.validate().map_err(err)?;
        let chain = partition::to_chain(&graph).map_err(err)?;
        Ok(Model { spec, dims, network, graph, chain })
    }
}
