//! The one simulator every solver is scored by (API stub; see the implementation issue).
#![deny(missing_docs)]
#![forbid(unsafe_code)]

use pebble_graph::{Chain, TrainingGraph};
use pebble_schedule::{Schedule, Tensor};
use serde::Serialize;
use thiserror::Error;

/// How to run a simulation.
#[derive(Debug, Clone, PartialEq)]
pub struct SimConfig {
    /// Device memory limit in bytes, counting everything resident; `None` = unlimited.
    pub budget: Option<u64>,
    /// Bandwidth of each transfer direction, bytes per time unit (β).
    pub bandwidth: f64,
    /// Record the memory timeline in the report.
    pub timeline: bool,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig { budget: None, bandwidth: 16e9, timeline: false }
    }
}

/// One point of the device memory timeline: memory in use from `time` on.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct MemoryPoint {
    /// When.
    pub time: f64,
    /// Device bytes in use from then on.
    pub bytes: u64,
}

/// What a valid schedule does.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SimReport {
    /// End of the last op on any stream.
    pub makespan: f64,
    /// Sum of compute-op durations.
    pub compute_time: f64,
    /// Peak device memory, static memory and inputs included.
    pub peak_bytes: u64,
    /// Peak host memory used by offloaded tensors.
    pub peak_host_bytes: u64,
    /// Number of compute ops.
    pub compute_ops: usize,
    /// Device memory over time (only when [`SimConfig::timeline`] is set).
    pub timeline: Vec<MemoryPoint>,
}

/// Why a schedule is invalid. `op` is the index of the offending op in the schedule.
#[derive(Debug, Error, Clone, PartialEq)]
#[non_exhaustive]
pub enum SimError {
    /// The schedule addresses the other view.
    #[error("the schedule is for the {found:?} view, expected {expected:?}")]
    WrongView {
        /// The schedule's view.
        found: pebble_schedule::View,
        /// The view simulated.
        expected: pebble_schedule::View,
    },
    /// An op names a stage, node or tensor that does not exist.
    #[error("op {op} ({text}): {what} is out of range")]
    OutOfRange {
        /// Op index.
        op: usize,
        /// The op as text.
        text: String,
        /// What is out of range.
        what: String,
    },
    /// An op's input is not resident when it runs.
    #[error("op {op} ({text}) needs {tensor:?}, which is not resident")]
    MissingInput {
        /// Op index.
        op: usize,
        /// The op as text.
        text: String,
        /// The missing tensor.
        tensor: Tensor,
    },
    /// An op would produce a tensor that is already resident.
    #[error("op {op} ({text}) produces {tensor:?}, which is already resident")]
    AlreadyResident {
        /// Op index.
        op: usize,
        /// The op as text.
        text: String,
        /// The tensor.
        tensor: Tensor,
    },
    /// An op that is not allowed at this point (the loss twice, a backward of a stage whose
    /// gradient was already computed, freeing a static tensor not offloaded, ...).
    #[error("op {op} ({text}): {why}")]
    InvalidOp {
        /// Op index.
        op: usize,
        /// The op as text.
        text: String,
        /// Why.
        why: String,
    },
    /// Device memory exceeds the budget.
    #[error("op {op} ({text}) at time {time}: device memory {bytes} exceeds the budget {budget}")]
    BudgetExceeded {
        /// Op index.
        op: usize,
        /// The op as text.
        text: String,
        /// When.
        time: f64,
        /// Memory in use.
        bytes: u64,
        /// The budget.
        budget: u64,
    },
    /// The schedule ends before the step is done (δ_0 not produced, a backward node never run).
    #[error("the schedule is incomplete: {0}")]
    Incomplete(String),
}

/// Simulates a chain schedule.
pub fn simulate_chain(chain: &Chain, schedule: &Schedule, config: &SimConfig) -> Result<SimReport, SimError> {
    let _ = (chain, schedule, config);
    unimplemented!("pebble-sim: chain simulation")
}

/// Simulates a graph schedule.
pub fn simulate_graph(graph: &TrainingGraph, schedule: &Schedule, config: &SimConfig) -> Result<SimReport, SimError> {
    let _ = (graph, schedule, config);
    unimplemented!("pebble-sim: graph simulation")
}
