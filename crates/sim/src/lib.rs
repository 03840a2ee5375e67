//! The one simulator every solver is scored by: validity, makespan and peak memory of a
//! [`Schedule`], for either view of a training step.
//!
//! One event engine (three streams: compute, device→host, host→device) owns residency,
//! timing and memory accounting; two front-ends translate ops into effects.
//!
//! # Timing
//!
//! * Compute ops run back to back in program order; an op starts at the end of the
//!   previous compute op, or later if a tensor it reads is still being prefetched, or
//!   (with a budget) later if its outputs and temporary memory do not fit until in-flight
//!   transfers release memory (Shilova's O.3: the device waits for memory). Waiting only
//!   counts on releases already scheduled; if none makes the op fit, it starts on time
//!   and the budget check reports it.
//! * A transfer ([`Op::Offload`](pebble_schedule::Op::Offload), [`Op::Prefetch`](pebble_schedule::Op::Prefetch)) is
//!   issued at the end of the last compute op before it (0 if none) and starts when its
//!   stream is free (one transfer at a time per direction) and its data is complete (an
//!   offload waits for the tensor's producer or prefetch; a prefetch waits for the offload
//!   that filled the host copy). It lasts `latency + size × fraction / bandwidth` of its
//!   direction's [`Link`] in [`SimConfig::machine`]. With a budget, a prefetch under
//!   [`TransferMemory::Whole`] also waits until its buffer fits.
//! * `makespan` is the end of the last op on any stream.
//!
//! # Memory
//!
//! * Static memory and the step's inputs are resident from time 0.
//! * A compute op allocates its outputs and temporary memory at its start; at its end it
//!   releases the temporary memory and the inputs it consumes. Inputs it consumes still
//!   count during the op, so the peak of a compute-only schedule is exactly
//!   `max over ops of (resident before + outputs + temporary)`.
//! * At equal times, releases come before allocations (except a release of memory
//!   allocated at that same instant, e.g. by a zero-duration op, which follows it).
//! * Under [`TransferMemory::Progressive`] (the relaxations O.7′/O.7″) a transfer moves
//!   device memory linearly over its duration instead of in one step; memory is then
//!   piecewise linear, and its peak is still found at the events.
//! * Under [`TransferMemory::Whole`] (O.7, the default) an offload adds to host memory at
//!   its start and releases device memory at its end,
//!   but never under a compute op issued after it that reads the tensor: such a read keeps
//!   the device copy (and pushes the release to the read's end) until the tensor is
//!   prefetched, produced again or freed. A prefetch takes device memory at its start; the
//!   tensor is readable when it ends. A host copy stays until the tensor is freed.
//! * [`Op::Free`](pebble_schedule::Op::Free) releases a tensor's device memory and host
//!   copy at the end of the last compute op before it, or when its transfers end if later.
//!   Freeing a tensor held nowhere is [`SimError::InvalidOp`].
//! * A budget is checked at every instant; the first allocation that exceeds it is
//!   reported. Host copies are checked against the machine's `host_memory` alike. An invalid op reports the earlier budget violation if there is one, so the
//!   error names the first failing op in program order.
//!
//! # Chain view
//!
//! Tensors `Activation(i)` (`x[i]`), `Saved(i)` for `1 ≤ i ≤ L` (`xbar[i]`, containing
//! `a_i`), `Grad(i)` (`x[i]`) and, if the chain has `w`, `Weight(i)` (`w[i]`, resident from
//! the start and counted inside `static_bytes`; forward and backward of stage `i` read it).
//! `F_i^∅`, `F_i^ck`, `F_i^all`, the loss `B_L` and `B_i` follow Table 2.1; see
//! `src/chain.rs` for the exact reads, outputs and releases. `a_i` may be read through
//! `Activation(i)` or `Saved(i)`. The schedule is complete once `δ_0` is computed.
//! `B_i` updates `Weight(i)` in place, making its host copy stale; `Free(Weight(i))`
//! drops the device copy of a weight whose host copy is up to date.
//!
//! # Periodic schedules
//!
//! A [`Schedule::periodic`](pebble_schedule::Schedule::periodic) chain schedule is one
//! period of a steady state (weight offloading's cycle). The simulator reads where each
//! weight is when a period begins off the ops, runs [`PERIODS`] periods (each new one
//! takes a fresh `a_0` in place of the last `δ_0`), and reports the steady-state period
//! as `makespan`, with times and counts per period and peaks over all periods.
//!
//! # Graph view
//!
//! `Data(d)` names data node `d`; inputs and static nodes are resident at the start.
//! A node reads its inputs (resident and complete: a multi-producer gradient after all its
//! producers ran), allocates outputs not resident (a multi-producer gradient is allocated
//! by its first producer, accumulated by the others), and releases nothing: graph
//! schedules free explicitly. `no_grad` forward nodes hold their `Saved` outputs as
//! temporary memory only. The loss and each backward node run exactly once, and all must
//! have run by the end.
//!
//! ```
//! use pebble_graph::Chain;
//! use pebble_schedule::{Schedule, View};
//! use pebble_sim::{simulate_chain, SimConfig};
//! let chain = Chain::homogeneous(2, 1.0, 2.0, 1);
//! let s = Schedule::from_notation(View::Chain, "F0all F1all L B1 B0").unwrap().resolve_loss(2);
//! let r = simulate_chain(&chain, &s, &SimConfig::default()).unwrap();
//! assert_eq!(r.makespan, 8.0);
//! // a_0, ā_1, ā_2, δ_2, then δ_1 while B1 runs.
//! assert_eq!(r.peak_bytes, 5);
//! ```
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod allocator;
mod chain;
mod engine;

pub use chain::{PERIODS, STEADY_FROM};
mod graph;
pub mod pipeline;
mod reserved;
pub use pipeline::{simulate_pipeline, PipeConfig, PipeLane, PipeReport, PipeSpan};

use pebble_graph::{Chain, TrainingGraph};
pub use pebble_machine::{Link, Machine};
use pebble_schedule::{Schedule, Tensor};
use serde::Serialize;
use thiserror::Error;

/// How to run a simulation.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SimConfig {
    /// Device memory limit in bytes, counting everything resident; `None` = unlimited.
    /// With a budget, a compute op or a prefetch that does not fit waits for in-flight
    /// transfers to release memory (Shilova's O.3).
    pub budget: Option<u64>,
    /// The machine: its host links time the transfers (β per direction, and latency).
    pub machine: Machine,
    /// Record the memory timeline and the ops' spans in the report.
    pub timeline: bool,
    /// When a transfer takes and gives back device memory.
    pub transfers: TransferMemory,
    /// Replay the device memory through PyTorch's CUDA caching allocator
    /// ([`allocator`]); `None` (the default) counts allocated bytes only. Its capacity,
    /// where it gives none, is the budget: a schedule whose allocator runs out of it fails
    /// with [`SimError::OutOfMemory`].
    pub allocator: Option<allocator::AllocatorConfig>,
}

/// When a transfer takes and gives back device memory (Shilova, Assumptions 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TransferMemory {
    /// O.7, what an implementation does: a tensor occupies its whole buffer for the whole
    /// transfer. An offload releases it when the transfer ends; a prefetch reserves it
    /// when the transfer starts.
    #[default]
    Whole,
    /// O.7′ and O.7″, the relaxations: memory is released (offload) or taken (prefetch)
    /// progressively, at the link's rate, during the transfer. With fractions below 1 in
    /// the schedule this is O.7′ (partial offloading); with whole tensors only, O.7″.
    Progressive,
}

impl SimConfig {
    /// The allocator to replay through, its capacity the budget unless it names one.
    pub(crate) fn allocator_config(&self) -> Option<allocator::AllocatorConfig> {
        self.allocator.map(|a| allocator::AllocatorConfig { capacity: a.capacity.or(self.budget), ..a })
    }

    /// No budget, no timeline, on `machine`.
    pub fn on(machine: Machine) -> SimConfig {
        SimConfig { machine, ..SimConfig::default() }
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

/// Which stream an op runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Lane {
    /// The compute stream.
    Compute,
    /// The device→host link.
    D2h,
    /// The host→device link.
    H2d,
    /// The host CPU (optimizer steps).
    Cpu,
}

/// When one op ran, on which stream.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Span {
    /// The stream.
    pub lane: Lane,
    /// The op's index in the schedule.
    pub op: usize,
    /// Start time.
    pub start: f64,
    /// End time.
    pub end: f64,
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
    /// Time the device→host link is busy.
    pub d2h_busy: f64,
    /// Time the host→device link is busy.
    pub h2d_busy: f64,
    /// Time the host CPU spends in optimizer steps.
    pub cpu_busy: f64,
    /// Time the compute stream waits, before its last op ends, for prefetches or for
    /// memory: the end of the last compute op minus `compute_time`.
    pub compute_stall: f64,
    /// Device memory over time (only when [`SimConfig::timeline`] is set).
    pub timeline: Vec<MemoryPoint>,
    /// When each compute op and transfer ran (only when [`SimConfig::timeline`] is set).
    pub spans: Vec<Span>,
    /// How many periods were run: 1, or [`PERIODS`] for a periodic schedule, whose
    /// `makespan` is then the steady-state period and whose times are per period.
    pub periods: usize,
    /// What the caching allocator reserved and allocated (only with
    /// [`SimConfig::allocator`]): its peaks and the fragmentation at the reserved peak.
    pub allocator: Option<allocator::AllocatorStats>,
}

impl SimReport {
    /// For each prefetch (by op index), the last compute op that took its memory before
    /// the prefetch took its own: one that started earlier, or at the same time and comes
    /// first in the schedule. An executor that holds each prefetch until that op has
    /// started allocates in the simulator's order, not in its threads'. Needs the spans
    /// ([`SimConfig::timeline`]); a prefetch before any compute op has none, and a
    /// periodic schedule none at all.
    pub fn prefetch_gates(&self) -> Vec<(usize, usize)> {
        if self.periods > 1 {
            return Vec::new();
        }
        let computes: Vec<&Span> = self.spans.iter().filter(|s| s.lane == Lane::Compute).collect();
        let before = |p: &Span, c: &Span| c.start < p.start || c.start == p.start && c.op < p.op;
        let gate = |p: &Span| computes.iter().filter(|c| before(p, c)).map(|c| c.op).max();
        let prefetches = self.spans.iter().filter(|s| s.lane == Lane::H2d);
        prefetches.filter_map(|p| gate(p).map(|g| (p.op, g))).collect()
    }
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
    /// The caching allocator ([`SimConfig::allocator`]) could not serve a request within
    /// its capacity: fragmentation, where the allocated bytes fit.
    #[error("op {op} ({text}) at time {time}: the caching allocator runs out of memory: {why}")]
    OutOfMemory {
        /// Op index.
        op: usize,
        /// The op as text.
        text: String,
        /// When.
        time: f64,
        /// The allocator's message (PyTorch's words).
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
    /// Host copies exceed the machine's host memory.
    #[error("op {op} ({text}) at time {time}: host memory {bytes} exceeds the machine's {host_memory}")]
    HostMemoryExceeded {
        /// Op index.
        op: usize,
        /// The op as text.
        text: String,
        /// When.
        time: f64,
        /// Host memory in use.
        bytes: u64,
        /// The machine's host memory.
        host_memory: u64,
    },
    /// The schedule ends before the step is done (δ_0 not produced, a backward node never run).
    #[error("the schedule is incomplete: {0}")]
    Incomplete(String),
}

/// Simulates a chain schedule (Shilova's Table 2.1 semantics; see the crate docs).
pub fn simulate_chain(chain: &Chain, schedule: &Schedule, config: &SimConfig) -> Result<SimReport, SimError> {
    chain::simulate(chain, schedule, config)
}

/// Simulates a graph schedule (Zhao's §1.3 semantics; see the crate docs).
pub fn simulate_graph(graph: &TrainingGraph, schedule: &Schedule, config: &SimConfig) -> Result<SimReport, SimError> {
    graph::simulate(graph, schedule, config)
}

#[cfg(test)]
mod tests;
