//! pebble's executor: runs a schedule on real tensors through Burn's [`Backend`] trait,
//! on the CPU (burn-flex) or, with the `cuda` feature, on an NVIDIA GPU (burn-cuda).
//!
//! The executor reads the same [`pebble_zoo::Network`] the planner lowers to its chain
//! and graph: each op's forward and explicit backward ([`ops`]) obey the declaration the
//! planner counted, so a plan and its run cannot disagree on what is kept.
//!
//! [`Backend`]: burn_backend::Backend

pub mod autodiff;
pub mod backend;
pub mod bench;
pub mod exec;
pub mod memory;
pub mod ops;
pub mod profile;
pub mod program;
pub mod session;
pub mod train;
mod value;

pub use program::Program;
pub use session::{OptimizerKind, Session, StepReport};
pub use value::Value;

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
    /// Anything else, with its context.
    #[error("{0}")]
    Other(String),
}
