//! The schedule IR: what every solver emits and what the simulator and the executor run.
//!
//! A [`Schedule`] is a list of [`Op`]s in program order. Compute ops (a chain stage in a
//! [`ForwardMode`], a chain backward, or a graph node) run one after the other on the
//! compute stream. [`Op::Offload`] and [`Op::Prefetch`] go to the device→host and
//! host→device streams: each is issued when the compute op before it in the list has
//! finished, and runs in parallel with the compute ops after it. [`Op::Free`] releases a
//! tensor. Schedules say nothing about time or memory: `pebble-sim` derives both.
//!
//! ```
//! use pebble_schedule::{Op, Schedule, View};
//! let s = Schedule::from_notation(View::Chain, "F0all L B0").unwrap();
//! assert_eq!(s.ops.len(), 3);
//! assert_eq!(s.to_notation(), "F0all L B0");
//! ```
#![deny(missing_docs)]
#![forbid(unsafe_code)]

use std::fmt;

pub mod lower;
pub mod pipeline;
pub mod placement;
pub mod torch;

pub use pipeline::{Pass, PipeStage};

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// The current version of the JSON format. Version 2 added the pipeline view (ops that
/// carry a device and a micro-batch, sends, and the stages' placement); a version 1 file
/// is a version 2 file without them, and still loads.
pub const FORMAT_VERSION: u32 = 2;

/// The oldest version of the JSON format this build reads.
pub const OLDEST_FORMAT_VERSION: u32 = 1;

/// How a chain stage runs forward (Shilova, Table 2.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ForwardMode {
    /// `F_∅`: no graph kept, and the input is released (unless it is part of a saved set).
    #[serde(rename = "none")]
    Discard,
    /// `F_ck`: no graph kept, the input is kept (a checkpoint).
    #[serde(rename = "ck")]
    Checkpoint,
    /// `F_all`: the graph is kept (the saved set `xbar`), and so is the input.
    #[serde(rename = "all")]
    KeepAll,
}

/// A tensor a transfer or a free names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Tensor {
    /// Chain: the activation `a_i`, stored alone (size `x[i]`).
    Activation(usize),
    /// Chain: the saved set `ā_i` produced by `F_all` of stage `i-1` (size `xbar[i]`).
    Saved(usize),
    /// Chain: the gradient `δ_i` (size `x[i]`).
    Grad(usize),
    /// Chain: the weights of stage `i` (size `w[i]`).
    Weight(usize),
    /// Chain: the gradient of stage `i`'s weights (size `g[i]`, its trainable part).
    WeightGrad(usize),
    /// Chain: the optimizer state of stage `i`'s weights (size `o[i]`: Adam's moments,
    /// and the fp32 master copy under mixed precision).
    OptState(usize),
    /// Graph: a data node.
    Data(usize),
}

/// One step of a schedule.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Op {
    /// Chain: run stage `stage`'s forward in `mode`.
    Forward {
        /// The stage, `0..L`.
        stage: usize,
        /// `F_∅`, `F_ck` or `F_all`.
        mode: ForwardMode,
    },
    /// Chain: run stage `stage`'s backward; `stage = L` is the loss (forward and backward).
    Backward {
        /// The stage, `0..=L`.
        stage: usize,
    },
    /// Graph: run a compute node. `no_grad` runs a forward node without producing its
    /// saved tensors (Rockmate's "fast forward").
    Compute {
        /// The compute node.
        node: usize,
        /// Run a forward node without keeping what its backward needs.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        no_grad: bool,
    },
    /// Chain: the optimizer step of stage `stage`'s weights on the host CPU (ZeRO-Offload's
    /// idea, OffMate's `Opt`), in place of the update fused into `B_stage`. It runs on the
    /// CPU stream once the weight gradient's offload has ended, and leaves the host copy of
    /// the weights up to date and the device copy stale.
    CpuUpdate {
        /// The stage, `0..L`.
        stage: usize,
    },
    /// Release a tensor's device memory.
    Free {
        /// The tensor.
        tensor: Tensor,
    },
    /// Move `fraction` of a tensor to host memory; its device memory is released when
    /// the transfer ends.
    Offload {
        /// The tensor.
        tensor: Tensor,
        /// The fraction moved, in `(0, 1]`.
        #[serde(default = "one")]
        fraction: f64,
    },
    /// Bring `fraction` of a tensor back from host memory; its device memory is taken
    /// when the transfer starts, and a compute op that reads it waits for the end.
    Prefetch {
        /// The tensor.
        tensor: Tensor,
        /// The fraction moved, in `(0, 1]`.
        #[serde(default = "one")]
        fraction: f64,
    },
    /// Pipeline: run one pass of a pipeline stage (a range of chain stages, see
    /// [`Schedule::stages`]) for one micro-batch, on the stage's device.
    Run {
        /// The device, which must be the stage's.
        device: usize,
        /// The pipeline stage, an index into [`Schedule::stages`].
        stage: usize,
        /// The micro-batch. In a periodic schedule, the shift: period `j` runs micro-batch
        /// `j·k + micro`, where `k` is [`Schedule::microbatches`].
        micro: i64,
        /// Forward, backward, or one half of a split backward.
        pass: Pass,
    },
    /// Pipeline: send a stage's output to the next stage (`grad = false`: the activation
    /// its `F` produced) or its input gradient to the previous one (`grad = true`: the
    /// `δ` its `B` or `I` produced), over the link between the two devices. The link
    /// carries one transfer at a time, both directions sharing it (Shilova, §4.x).
    Send {
        /// The sending device.
        from: usize,
        /// The receiving device.
        to: usize,
        /// The pipeline stage whose pass produced the tensor.
        stage: usize,
        /// The micro-batch (the shift, in a periodic schedule).
        micro: i64,
        /// The input gradient (backward), not the activation (forward).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        grad: bool,
    },
}

fn one() -> f64 {
    1.0
}

impl Op {
    /// Whether the op runs on the compute stream.
    pub fn is_compute(&self) -> bool {
        matches!(self, Op::Forward { .. } | Op::Backward { .. } | Op::Compute { .. })
    }

    /// The tensor a transfer or a free names (`None` for a compute op).
    pub fn tensor(&self) -> Option<Tensor> {
        match *self {
            Op::Offload { tensor, .. } | Op::Prefetch { tensor, .. } | Op::Free { tensor } => Some(tensor),
            Op::Forward { .. }
            | Op::Backward { .. }
            | Op::Compute { .. }
            | Op::CpuUpdate { .. }
            | Op::Run { .. }
            | Op::Send { .. } => None,
        }
    }
}

/// Which view of the training step a schedule addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum View {
    /// Ops name chain stages.
    Chain,
    /// Ops name graph nodes.
    Graph,
    /// Ops run pipeline stages on several devices ([`Op::Run`], [`Op::Send`]).
    Pipeline,
}

/// A schedule: ops in program order, for one view.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Schedule {
    /// Format version, [`FORMAT_VERSION`].
    pub version: u32,
    /// Which view the ops address.
    pub view: View,
    /// The solver that produced it, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub solver: Option<String>,
    /// The ops, in program order.
    pub ops: Vec<Op>,
    /// The ops are one period of a steady state, repeated for ever (weight offloading's
    /// cycle): the simulator infers where each weight is when a period begins from the
    /// ops themselves, unrolls several periods, and reports the steady-state period as
    /// the step time. Absent (false) in every other schedule.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub periodic: bool,
    /// Pipeline: the number of devices.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub devices: Option<usize>,
    /// Pipeline: the micro-batches one period (or one step, with a flush) processes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub microbatches: Option<usize>,
    /// Pipeline: the stages, each a range of chain stages on one device, in chain order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stages: Vec<PipeStage>,
    /// Whether every MILP behind the schedule was solved to optimality: `false` when a
    /// time limit stopped one at its best solution so far. Absent for solvers that solve
    /// none (or do not say).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub optimal: Option<bool>,
    /// The solver whose plan this one is, where a solver returns another's plan as its
    /// own because the simulator runs it faster (HiRemate keeps Rockmate's or PyTorch's
    /// min-cut plan so, OffMate Rotor's or a practice baseline's, pofo Rotor's or
    /// offload-dp's, as where its DP's tables are too large). Absent where the plan
    /// is the solver's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kept_from: Option<String>,
    /// What it was planned for, in words (`pebble plan` writes the model, batch and
    /// profile, the view and its size), so that a schedule replayed on another model can
    /// say so. Absent where unknown; never checked by the simulator.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub planned_for: Option<String>,
}

/// Why a schedule could not be read.
#[derive(Debug, Error, Clone, PartialEq)]
#[non_exhaustive]
pub enum ScheduleError {
    /// Not JSON, or a field with the wrong type or an unknown op.
    #[error("malformed schedule: {0}")]
    Malformed(String),
    /// A version this build does not read.
    #[error(
        "field `version`: schedule format version {found} is not supported (this build reads {OLDEST_FORMAT_VERSION} to {FORMAT_VERSION})"
    )]
    Version {
        /// The version found.
        found: u32,
    },
    /// A fraction outside `(0, 1]`.
    #[error("field `ops[{index}].fraction`: {value} is not in (0, 1]")]
    Fraction {
        /// The op's index.
        index: usize,
        /// The fraction.
        value: f64,
    },
    /// A pipeline schedule whose ops and stages disagree.
    #[error("field `{field}`: {why}")]
    Pipeline {
        /// The field at fault, e.g. `ops[3].device`.
        field: String,
        /// What is wrong.
        why: String,
    },
    /// A token of the paper notation that is not an op.
    #[error("`{0}` is not an op (expected e.g. F3ck, F2none, F4all, B5 or L)")]
    Notation(String),
}

/// What a schedule moves and recomputes in one step.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Moves {
    /// Offloads.
    pub offloads: usize,
    /// Reloads (prefetches).
    pub reloads: usize,
    /// Recomputations: compute ops beyond the first of each graph node or chain stage's
    /// forward.
    pub recomputes: usize,
}

/// Plain autograd on a chain of `l` stages: `F0all … F(L−1)all, B_L, B(L−1) … B0`.
pub fn store_all_ops(l: usize) -> Vec<Op> {
    let mut ops: Vec<Op> = (0..l).map(|stage| Op::Forward { stage, mode: ForwardMode::KeepAll }).collect();
    ops.extend((0..=l).rev().map(|stage| Op::Backward { stage }));
    ops
}

impl Schedule {
    /// Its offloads, reloads and recomputations.
    pub fn moves(&self) -> Moves {
        let mut firsts = std::collections::HashSet::new();
        let mut moves = Moves::default();
        for op in &self.ops {
            match *op {
                Op::Offload { .. } => moves.offloads += 1,
                Op::Prefetch { .. } => moves.reloads += 1,
                Op::Compute { node: k, .. } | Op::Forward { stage: k, .. } if !firsts.insert(k) => {
                    moves.recomputes += 1;
                }
                _ => {}
            }
        }
        moves
    }

    /// A schedule of the given ops.
    pub fn new(view: View, ops: Vec<Op>) -> Schedule {
        Schedule {
            version: FORMAT_VERSION,
            view,
            solver: None,
            ops,
            periodic: false,
            devices: None,
            microbatches: None,
            stages: Vec::new(),
            optimal: None,
            kept_from: None,
            planned_for: None,
        }
    }

    /// Marks the ops as one period of a steady state (see [`Schedule::periodic`]).
    pub fn repeated(mut self) -> Schedule {
        self.periodic = true;
        self
    }

    /// The schedule, saying whether the MILPs behind it were solved to optimality.
    pub fn with_optimal(mut self, optimal: bool) -> Schedule {
        self.optimal = Some(optimal);
        self
    }

    /// Names the solver that produced it.
    pub fn with_solver(mut self, solver: &str) -> Schedule {
        self.solver = Some(solver.to_string());
        self
    }

    /// Reads the JSON format, naming the field at fault on error.
    pub fn from_json(text: &str) -> Result<Schedule, ScheduleError> {
        let de = &mut serde_json::Deserializer::from_str(text);
        let s: Schedule = serde_path_to_error::deserialize(de).map_err(|e| {
            let path = e.path().to_string();
            let inner = e.into_inner();
            ScheduleError::Malformed(if path == "." { inner.to_string() } else { format!("field `{path}`: {inner}") })
        })?;
        if !(OLDEST_FORMAT_VERSION..=FORMAT_VERSION).contains(&s.version) {
            return Err(ScheduleError::Version { found: s.version });
        }
        for (index, op) in s.ops.iter().enumerate() {
            if let Op::Offload { fraction, .. } | Op::Prefetch { fraction, .. } = op {
                if !(*fraction > 0.0 && *fraction <= 1.0) {
                    return Err(ScheduleError::Fraction { index, value: *fraction });
                }
            }
        }
        if s.view == View::Pipeline {
            pipeline::check(&s)?;
        }
        Ok(s)
    }

    /// Writes the JSON format.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a schedule always serializes")
    }

    /// Parses the thesis's notation with 0-based stages: `F0ck F1none F2all L B2 B1 B0`.
    /// `F_∅` may be written `F1none` or `F1∅`; `L` is the loss (`B{L}`), which needs
    /// the chain length, so it is written `B{L}` in the ops; here `L` is kept as the
    /// marker `Backward { stage: usize::MAX }` and resolved by [`Schedule::resolve_loss`].
    pub fn from_notation(view: View, text: &str) -> Result<Schedule, ScheduleError> {
        let mut ops = Vec::new();
        for tok in text.split_whitespace() {
            let bad = || ScheduleError::Notation(tok.to_string());
            if tok == "L" {
                ops.push(Op::Backward { stage: usize::MAX });
            } else if let Some(rest) = tok.strip_prefix('B') {
                ops.push(Op::Backward { stage: rest.parse().map_err(|_| bad())? });
            } else if let Some(rest) = tok.strip_prefix('F') {
                let digits = rest.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
                let stage = rest[..digits].parse().map_err(|_| bad())?;
                let mode = match &rest[digits..] {
                    "ck" => ForwardMode::Checkpoint,
                    "none" | "∅" => ForwardMode::Discard,
                    "all" => ForwardMode::KeepAll,
                    _ => return Err(bad()),
                };
                ops.push(Op::Forward { stage, mode });
            } else {
                return Err(bad());
            }
        }
        Ok(Schedule::new(view, ops))
    }

    /// Replaces the `L` marker of [`Schedule::from_notation`] by the loss stage `l`.
    pub fn resolve_loss(mut self, l: usize) -> Schedule {
        for op in &mut self.ops {
            if let Op::Backward { stage } = op {
                if *stage == usize::MAX {
                    *stage = l;
                }
            }
        }
        self
    }

    /// The ops in the thesis's notation (compute ops only; transfers and frees in brackets).
    pub fn to_notation(&self) -> String {
        self.ops.iter().map(|o| o.to_string()).collect::<Vec<_>>().join(" ")
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Op::Forward { stage, mode } => {
                let m = match mode {
                    ForwardMode::Discard => "none",
                    ForwardMode::Checkpoint => "ck",
                    ForwardMode::KeepAll => "all",
                };
                write!(f, "F{stage}{m}")
            }
            Op::Backward { stage } if *stage == usize::MAX => write!(f, "L"),
            Op::Backward { stage } => write!(f, "B{stage}"),
            Op::Compute { node, no_grad } => write!(f, "C{node}{}", if *no_grad { "ng" } else { "" }),
            Op::CpuUpdate { stage } => write!(f, "[cpu update {stage}]"),
            Op::Free { tensor } => write!(f, "[free {tensor:?}]"),
            Op::Offload { tensor, fraction } => write!(f, "[offload {tensor:?} {fraction}]"),
            Op::Prefetch { tensor, fraction } => write!(f, "[prefetch {tensor:?} {fraction}]"),
            Op::Run { device, stage, micro, pass } => write!(f, "{pass:?}{stage}.{micro}@{device}"),
            Op::Send { from, to, stage, micro, grad } => {
                write!(f, "[send {}{stage}.{micro} {from}->{to}]", if *grad { "δ" } else { "a" })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moves_count_offloads_reloads_and_forwards_run_again() {
        let chain = Schedule::from_notation(View::Chain, "F0ck F1all L B1 F0all B0").unwrap();
        assert_eq!(chain.moves(), Moves { offloads: 0, reloads: 0, recomputes: 1 });
        let d = |i| Tensor::Data(i);
        let graph = Schedule::new(
            View::Graph,
            vec![
                Op::Compute { node: 0, no_grad: false },
                Op::Offload { tensor: d(0), fraction: 1.0 },
                Op::Compute { node: 1, no_grad: false },
                Op::Compute { node: 0, no_grad: true },
                Op::Prefetch { tensor: d(0), fraction: 1.0 },
                Op::Compute { node: 0, no_grad: true },
                Op::Compute { node: 2, no_grad: false },
            ],
        );
        assert_eq!(graph.moves(), Moves { offloads: 1, reloads: 1, recomputes: 2 });
    }

    #[test]
    fn json_round_trip() {
        let s = Schedule::new(
            View::Chain,
            vec![
                Op::Forward { stage: 0, mode: ForwardMode::Checkpoint },
                Op::Offload { tensor: Tensor::Activation(1), fraction: 0.5 },
                Op::Prefetch { tensor: Tensor::Activation(1), fraction: 0.5 },
                Op::Free { tensor: Tensor::Grad(2) },
                Op::Compute { node: 3, no_grad: true },
                Op::Offload { tensor: Tensor::WeightGrad(0), fraction: 1.0 },
                Op::CpuUpdate { stage: 0 },
                Op::Prefetch { tensor: Tensor::OptState(1), fraction: 1.0 },
            ],
        )
        .with_solver("test");
        let text = s.to_json();
        assert!(text.contains(r#""op": "forward""#));
        assert!(text.contains(r#""mode": "ck""#));
        assert!(text.contains(r#""activation": 1"#));
        assert!(text.contains(r#""op": "cpu_update""#));
        assert!(text.contains(r#""weight_grad": 0"#));
        assert!(text.contains(r#""opt_state": 1"#));
        assert_eq!(Schedule::from_json(&text).unwrap(), s);
    }

    #[test]
    fn bad_json_names_the_field() {
        let e = Schedule::from_json(r#"{"version":1,"view":"chain","ops":[{"op":"forward","stage":-1,"mode":"ck"}]}"#);
        assert!(e.unwrap_err().to_string().contains("field `ops[0]"));
        let e = Schedule::from_json(r#"{"version":1,"view":"chain","ops":[{"op":"jump"}]}"#);
        assert!(e.unwrap_err().to_string().contains("unknown variant `jump`"));
        let e = Schedule::from_json(r#"{"version":9,"view":"chain","ops":[]}"#);
        assert_eq!(e.unwrap_err(), ScheduleError::Version { found: 9 });
        let e = Schedule::from_json(
            r#"{"version":1,"view":"chain","ops":[{"op":"offload","tensor":{"grad":1},"fraction":1.5}]}"#,
        );
        assert_eq!(e.unwrap_err().to_string(), "field `ops[0].fraction`: 1.5 is not in (0, 1]");
    }

    #[test]
    fn notation() {
        let s = Schedule::from_notation(View::Chain, "F0ck F1∅ F2all L B2 F0all F1all B1 B0").unwrap().resolve_loss(3);
        assert_eq!(s.to_notation(), "F0ck F1none F2all B3 B2 F0all F1all B1 B0");
        assert!(Schedule::from_notation(View::Chain, "F1x").is_err());
    }
}
