//! pebble's executor: runs a schedule on real tensors through Burn's [`Backend`] trait,
//! on the CPU (burn-flex) or, with the `cuda` feature, on an NVIDIA GPU (burn-cuda).
//!
//! The executor reads the same [`pebble_zoo::Network`] the planner lowers to its chain
//! and graph: each op's forward and explicit backward ([`ops`]) obey the declaration the
//! planner counted, so a plan and its run cannot disagree on what is kept.
//!
//! This crate only executes: it runs the schedule it is given and never plans one (it
//! has no edge to `pebble-solve`, `pebble-sim` or `pebble-ilp`). Planning a model and
//! running the plan is `pebble-train`'s.
//!
//! [`Backend`]: burn_backend::Backend

pub mod autodiff;
pub mod backend;
#[cfg(feature = "cuda")]
mod cuda;
pub mod exec;
pub mod memory;
pub mod ops;
mod optim;
pub mod pipeline;
pub mod profile;
pub mod program;
pub mod rng;
pub mod session;
pub mod transfer;
mod value;

pub use backend::{DeviceKind, Unavailable};
pub use burn_backend::Backend;
pub use program::Program;
pub use session::{OptimizerKind, Session, StepReport};
pub use transfer::{LinkSpeed, StageTemporaries, TransferOptions, TransferReport};
pub use value::{read_floats, sync, Value};

/// What can go wrong while running a model.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The executor cannot run this op (or these operands).
    #[error("op `{op}` ({kind}): {why}")]
    Unsupported {
        /// The op's name.
        op: String,
        /// Its kind.
        kind: &'static str,
        /// Why.
        why: String,
    },
    /// The schedule asks for something the executor does not hold.
    #[error("schedule op {index} ({op}): {why}")]
    Schedule {
        /// Position in the schedule.
        index: usize,
        /// The op, in the schedule's notation.
        op: String,
        /// Why.
        why: String,
    },
    /// A tensor the step reads is not held when it is read: the schedule freed it, or
    /// never computed it (a graph schedule that skips a producer; for chain schedules,
    /// a mismatch between the program and the network).
    #[error("`{tensor}` is not resident when it is read")]
    NotResident {
        /// The tensor's name.
        tensor: String,
    },
    /// A step input (a tensor no op produces: the batch, labels, positions) has no value:
    /// the session's batch does not match the network.
    #[error("no value for step input `{tensor}`")]
    MissingInput {
        /// The tensor's name.
        tensor: String,
    },
    /// A backward needs a tensor its stage's forward should have saved, and it is not
    /// there: the schedule ran the backward without the `ā` that holds it.
    #[error("the backward of `{op}` misses a saved tensor ({slot})")]
    MissingSaved {
        /// The op whose backward runs.
        op: String,
        /// Where the tensor was expected, in the program's terms.
        slot: String,
    },
    /// The step ended and no op computed the loss: the schedule never runs the loss stage
    /// (or the network has none).
    #[error("the step never ran the loss")]
    NoLoss,
    /// The backward of a view returned no gradient for its input (an op library bug).
    #[error("the backward of view `{op}` returned no input gradient")]
    NoInputGradient {
        /// The view op.
        op: String,
    },
    /// The device reported a failure when asked to finish its work (a kernel failed, the
    /// device was lost), with the backend's message.
    #[error("device: {0}")]
    Device(String),
    /// A transfer (offload, prefetch) or the device pool failed: a link that cannot be
    /// throttled, device memory that nothing in flight will release (the schedule does
    /// not fit the cap), a host copy that is gone.
    #[error("schedule op {index} ({op}): {why}")]
    Transfer {
        /// Position in the schedule.
        index: usize,
        /// The op, in the schedule's notation.
        op: String,
        /// Why.
        why: String,
    },
    /// A tensor could not be read back to the host, with the backend's message.
    #[error("reading a tensor back to the host: {0}")]
    Readback(String),
}
