//! Running a schedule on real tensors.
//!
//! The executor holds what the simulator tracks, and frees it where the simulator does:
//!
//! * **chain schedules**: the program [`pebble_schedule::lower`] lowers them to (Shilova's
//!   Table 2.1, written there once: which tensors each op reads, creates and frees), run
//!   step by step on `a_i` ([`Tensor::Activation`]), `ā_i` ([`Tensor::Saved`]: `a_i` plus
//!   what stage `i-1`'s backward reads) and `δ_i` ([`Tensor::Grad`]). Within a stage, a
//!   tensor lives until its last reader.
//! * **graph schedules** (Zhao §1.3): one slot per data node of the training graph,
//!   filled by compute nodes and emptied by explicit frees.
//!
//! Parameters, their gradients and the optimizer's state live outside the schedule, as
//! the planners' static memory does.
//!
//! # Transfers (chain schedules)
//!
//! [`Op::Offload`] and [`Op::Prefetch`] run as the simulator times them, moving whole
//! tensors (Shilova's Assumptions 1 and O.7; a fraction below 1 is refused). Compute ops
//! run on the calling thread in program order; a transfer is issued when the compute op
//! before it has finished, to one thread per direction that runs its transfers one at a
//! time, throttled to its link ([`TransferOptions`], [`crate::transfer`]).
//!
//! * An offload copies the tensor's data to a host copy and then releases the device
//!   copy, except that a compute op issued after it that reads the tensor still reads
//!   the device copy, which stays until that op is done (until the tensor is prefetched,
//!   freed or produced again, as in the simulator).
//! * A prefetch takes device memory when it starts and rebuilds the device tensors from
//!   the host copy; a compute op that reads the tensor waits for it. The host copy stays
//!   until the tensor is freed or consumed.
//! * The device pool counts the step's resident bytes, the schedule's tensors at their
//!   declared sizes and, while an op runs, its temporaries ([`StageTemporaries`], the
//!   plan's chain's) under [`TransferOptions::device_cap`]: a compute op (or a prefetch)
//!   that would go over it waits for offloads in flight to release memory, and fails when
//!   none will. [`TransferReport`] says how long each link was busy and how long the
//!   compute stream waited.
//!
//! # Weights, their gradients and optimizer states (chain schedules)
//!
//! The chain's static tensors of stage `i` are `Weight(i)`, `WeightGrad(i)` and
//! `OptState(i)`: the parameters only stage `i` reads ([`Program::weights`]), their
//! gradients and their optimizer states. A tied parameter, read by several stages, stays
//! resident with its gradient and state, as the chain leaves it unnamed. A schedule that names them ([`placement::names_statics`])
//! runs with the simulator's semantics ([`crate::placement`]):
//!
//! * `B_i` updates the parameters it is the last to contribute gradients to (those whose
//!   first reader is stage `i`) in place, right after its backward, with the same
//!   optimizer code as the session's end-of-step update ([`crate::optim`]); the host
//!   copies of `Weight(i)` and `OptState(i)` are then stale and dropped.
//! * [`Op::CpuUpdate`] runs that step on the host CPU's thread instead, once the
//!   gradient's offload is done: it rewrites the host copies of `Weight(i)` and
//!   `OptState(i)` and drops the gradient's; the device copy of the weights is stale
//!   (reading it is an error) until freed and prefetched again.
//! * An offload of a weight or state read again before its next move is an upload: the
//!   device copy stays until a free. A free of either drops the device copy only.
//! * Parameters live in one slot each, and a prefetch takes each from its up-to-date
//!   copy (the device's, or the host copy made after its last update).
//! * What a step leaves on the host and the device ([`Statics`]) is where the next step
//!   starts: a periodic schedule runs one period per step, each tensor where the period's
//!   ops leave it ([`placement::starts`]); [`Statics::arrange`] puts them there before the
//!   first step.
//!
//! Graph schedules move whole data nodes: an offload takes the device copy to the host
//! (let go when the copy is done), a prefetch brings it back, waited for by its reader.
//! With the graph's sizes ([`GraphSizes`](crate::transfer::GraphSizes), in the step's
//! [`StageTemporaries`]) the device pool counts a graph schedule as the simulator does and
//! holds it under the cap: a compute node whose outputs and temporaries would go over
//! waits for the offloads in flight, so a link slower than planned costs time, not memory.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use burn_backend::tensor::FloatTensor;
use burn_backend::{Backend, TensorMetadata};
use pebble_schedule::{ForwardMode, Op, Schedule, Tensor, View};
use pebble_zoo::ops::{Elem, Saved};
use pebble_zoo::{GraphIndex, TensorId};

use crate::ops::{self, OpCtx};
use crate::optim::{self, Moments, OptimizerKind};
use crate::program::{Key, Program, Source};
use crate::rng::op_seed;
use crate::transfer::{
    HostCopies, HostCopy, HostParts, HostUpdate, HostValue, Parts, StageTemporaries, TransferOptions, TransferReport,
    Transfers,
};
use crate::value::sync;
use crate::{memory, RuntimeError, Value};
use pebble_schedule::lower::{self, Action, Ids, Refusal, Step, STATE, WEIGHT, WGRAD};
use pebble_schedule::placement::{self, Copies, StageStart};

pub(crate) type Env<B> = HashMap<TensorId, Value<B>>;
pub(crate) type GradMap<B> = HashMap<TensorId, FloatTensor<B>>;
/// What a stage's forward leaves: the output boundary and the saved tensors.
pub(crate) type StageOut<B> = (Env<B>, HashMap<Key, Value<B>>);

/// `ā_i`: the boundary `a_i` and what stage `i-1`'s backward reads.
pub(crate) struct SavedSet<B: Backend> {
    pub(crate) boundary: Env<B>,
    pub(crate) inner: HashMap<Key, Value<B>>,
}

/// The tensors a step starts with, beside the parameters ([`Statics`]).
pub struct StepInputs<'a, B: Backend> {
    /// A value for each step input of the network (tensors without a producer), by id.
    pub inputs: &'a HashMap<TensorId, Value<B>>,
    /// The seed of this step's random ops.
    pub seed: u64,
    /// Each chain stage's temporaries, which the device pool holds while the op runs.
    pub temporaries: &'a StageTemporaries,
    /// The optimizer step a schedule that names the static tensors runs inside its
    /// backwards and CPU updates (`None`: the step updates nothing).
    pub update: Option<Update>,
    /// A chain schedule's program, lowered before the step ([`lower_step`]) so that its
    /// bookkeeping is not the step's measured memory; `None`: the step lowers it.
    pub lowered: Option<&'a [Step]>,
}

/// The optimizer step of one training step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Update {
    /// The optimizer.
    pub optimizer: OptimizerKind,
    /// The step, from 1 (Adam's bias correction).
    pub t: i32,
}

mod chain;
mod graph;
mod statics;

pub use chain::lower_step;
pub(crate) use chain::Part;
pub use statics::Statics;

/// What a step leaves: the loss and the parameters' gradients.
pub struct StepOutput<B: Backend> {
    /// The loss, a one-element tensor.
    pub loss: FloatTensor<B>,
    /// Each parameter's gradient (`None` if no gradient reached it).
    pub grads: Vec<Option<FloatTensor<B>>>,
    /// What the step's transfers did (all zero for a schedule without any).
    pub transfers: TransferReport,
    /// Wall-clock seconds of each compute op of a chain schedule, by its index in the
    /// schedule, stalls excepted (0 for the other ops; empty for graph schedules, and
    /// unless [`TransferOptions::time_ops`]).
    pub op_seconds: Vec<f64>,
}

/// The executor of one graph op, as a [`Drive`] is handed it.
pub type Exec<'a> = dyn FnMut(&Op) -> Result<(), RuntimeError> + 'a;

/// What runs a graph step op by op: given the executor of one op, it hands over the
/// step's ops in order (a schedule's, or a run-time policy's as it decides them).
pub type Drive<'a> = dyn FnMut(&mut Exec<'_>) -> Result<(), RuntimeError> + 'a;

/// A [`Drive`] that hands over `schedule`'s ops.
pub fn drive_schedule(schedule: &Schedule) -> impl FnMut(&mut Exec<'_>) -> Result<(), RuntimeError> + '_ {
    move |exec| schedule.ops.iter().try_for_each(&mut *exec)
}

/// Runs one training step of `schedule` on `program`, on `device`: transfers over the
/// links of `options`, device memory under its cap. The parameters and optimizer state
/// are `statics`', which the step leaves where its last op puts them.
pub fn run_with<B: Backend>(
    program: &Program,
    index: &GraphIndex,
    schedule: &Schedule,
    step: &StepInputs<'_, B>,
    statics: &mut Statics<B>,
    device: &B::Device,
    options: &TransferOptions,
) -> Result<StepOutput<B>, RuntimeError> {
    match schedule.view {
        View::Chain => {
            execute(program, step, statics, device, |runner, statics| runner.chain(schedule, options, statics))
        }
        View::Graph => run_driven(program, index, &mut drive_schedule(schedule), step, statics, device, options),
        View::Pipeline => Err(RuntimeError::Unsupported {
            op: "schedule".into(),
            kind: "pipeline",
            why: "a pipeline schedule runs on several devices: run it with `pebble pipeline`".into(),
        }),
    }
}

/// Runs one training step of graph ops that `drive` hands over one at a time (a run-time
/// policy deciding as the step goes), on `device`, transfers over the links of `options`.
pub fn run_driven<B: Backend>(
    program: &Program,
    index: &GraphIndex,
    drive: &mut Drive<'_>,
    step: &StepInputs<'_, B>,
    statics: &mut Statics<B>,
    device: &B::Device,
    options: &TransferOptions,
) -> Result<StepOutput<B>, RuntimeError> {
    if !statics.all_on_device() {
        return Err(RuntimeError::Schedule {
            index: 0,
            op: "the step's start".into(),
            why: "a graph schedule needs every parameter and optimizer state on the device".into(),
        });
    }
    execute(program, step, statics, device, |runner, _| runner.graph(index, drive, options))
}

/// One step's frame around `body`: the parameter gradients, the runner on `statics`'
/// parameters and state, and what the step leaves.
fn execute<B: Backend>(
    program: &Program,
    step: &StepInputs<'_, B>,
    statics: &mut Statics<B>,
    device: &B::Device,
    body: impl FnOnce(&mut Runner<'_, B>, &mut Statics<B>) -> Result<TransferReport, RuntimeError>,
) -> Result<StepOutput<B>, RuntimeError> {
    // Parameter gradients are resident for the whole step, as the planners count them
    // (gradient-accumulation accounting, Zhao §1.1): zeroed at the start, accumulated into;
    // the zeros make way for the first backward that writes them ([`Runner::zeroed`]). A
    // stage's whose gradient starts the step elsewhere (a period that offloads it) is made
    // by its backward.
    let grads: Vec<_> = (0..program.net.params.len())
        .map(|q| {
            let absent = matches!(program.owned_by(q), Some(i) if !statics.device[i][WGRAD]);
            let shape = program.net.params[q].shape.clone();
            (!absent).then(|| crate::value::zeros::<B>(shape, device))
        })
        .collect();
    let mut runner = Runner {
        p: program,
        step,
        device,
        params: std::mem::take(&mut statics.params),
        moments: std::mem::take(&mut statics.moments),
        stale: vec![false; program.net.params.len()],
        zeroed: grads.iter().map(Option::is_some).collect(),
        grads,
        loss: None,
        op_seconds: Vec::new(),
    };
    let result = body(&mut runner, statics);
    statics.params = std::mem::take(&mut runner.params);
    statics.moments = std::mem::take(&mut runner.moments);
    let transfers = result?;
    let loss = runner.loss.take().ok_or(RuntimeError::NoLoss)?;
    Ok(StepOutput { loss, grads: runner.grads, transfers, op_seconds: runner.op_seconds })
}

/// The chain view's passes on one device (also run per pipeline stage by `crate::pipeline`).
pub(crate) struct Runner<'a, B: Backend> {
    pub(crate) p: &'a Program,
    pub(crate) step: &'a StepInputs<'a, B>,
    pub(crate) device: &'a B::Device,
    /// Each parameter's device copy.
    pub(crate) params: Vec<Option<FloatTensor<B>>>,
    /// Each parameter's moments on the device.
    pub(crate) moments: Vec<Option<Moments<B>>>,
    /// A device copy the host CPU has updated past: read it and the step fails.
    pub(crate) stale: Vec<bool>,
    pub(crate) grads: Vec<Option<FloatTensor<B>>>,
    /// A gradient still at the step's zeros: freed before the first backward that writes
    /// it, which then lands its result in place of the zeros, as the planners count the
    /// resident gradient (the backward writing into it), not the zeros beside a new one
    /// and their sum. Empty: none (a pipeline's micro-batches accumulate).
    pub(crate) zeroed: Vec<bool>,
    pub(crate) loss: Option<FloatTensor<B>>,
    /// Seconds of each compute op of the chain schedule run ([`StepOutput::op_seconds`]).
    pub(crate) op_seconds: Vec<f64>,
}

fn add_into<B: Backend>(slot: &mut Option<FloatTensor<B>>, g: FloatTensor<B>) {
    *slot = Some(match slot.take() {
        Some(old) => B::float_add(old, g),
        None => g,
    });
}

fn add_grad<B: Backend>(map: &mut GradMap<B>, t: TensorId, g: FloatTensor<B>) {
    let slot = map.remove(&t);
    map.insert(
        t,
        match slot {
            Some(old) => B::float_add(old, g),
            None => g,
        },
    );
}

fn sched_err(k: usize, op: &Op, why: impl Into<String>) -> RuntimeError {
    RuntimeError::Schedule { index: k, op: op.to_string(), why: why.into() }
}

/// Names schedule op `k` in an error raised inside it without knowing it.
fn at_op(e: RuntimeError, k: usize, op: &Op) -> RuntimeError {
    match e {
        RuntimeError::Schedule { index: usize::MAX, op: inner, why } => sched_err(k, op, format!("{inner} {why}")),
        e => e,
    }
}

impl<B: Backend> Runner<'_, B> {
    /// Frees the zeros of op `o`'s parameter gradients before its backward writes them.
    pub(crate) fn release_zeroed_grads(&mut self, o: usize) {
        for &q in &self.p.net.ops[o].params {
            if self.zeroed.get(q).copied().unwrap_or(false) {
                self.zeroed[q] = false;
                self.grads[q] = None;
            }
        }
    }

    fn ctx(&self, op: usize, grad: bool) -> OpCtx<'_, B> {
        OpCtx { device: self.device, grad, seed: op_seed(self.step.seed, op) }
    }

    fn params_of(&self, op: usize) -> Result<Vec<FloatTensor<B>>, RuntimeError> {
        let net = &self.p.net;
        net.ops[op]
            .params
            .iter()
            .map(|&q| match &self.params[q] {
                Some(t) if !self.stale[q] => Ok(t.clone()),
                Some(_) => Err(RuntimeError::Schedule {
                    index: usize::MAX,
                    op: net.ops[op].name.clone(),
                    why: format!(
                        "reads parameter `{}`, whose device copy is stale since its update on the host: \
                         free its stage's weights and prefetch them again",
                        net.params[q].name
                    ),
                }),
                None => Err(RuntimeError::NotResident { tensor: net.params[q].name.clone() }),
            })
            .collect()
    }

    fn input_dims(&self, op: usize) -> Vec<Vec<usize>> {
        self.p.net.ops[op].inputs.iter().map(|&t| self.p.net.tensors[t].shape.clone()).collect()
    }

    fn needs(&self, op: usize) -> Vec<bool> {
        self.p.net.ops[op].inputs.iter().map(|&t| self.p.net.tensors[t].requires_grad).collect()
    }

    fn static_value(&self, t: TensorId) -> Result<Value<B>, RuntimeError> {
        self.step
            .inputs
            .get(&t)
            .cloned()
            .ok_or_else(|| RuntimeError::MissingInput { tensor: self.p.net.tensors[t].name.clone() })
    }

    // ---------------------------------------------------------------- chain view

    /// Runs stage `s`'s forward on its input boundary. Returns the output boundary and,
    /// with grad, the saved tensors of its backward.
    pub(crate) fn forward_stage(&self, s: usize, mut env: Env<B>, grad: bool) -> Result<StageOut<B>, RuntimeError> {
        let stage = &self.p.stages[s];
        let keep_out = &self.p.boundary[s + 1];
        let mut inner: HashMap<Key, Value<B>> = HashMap::new();
        let keep_saved = |t: TensorId| grad && stage.saved.contains(&Key::Tensor(t));
        for (pos, &o) in stage.ops.iter().enumerate() {
            let op = &self.p.net.ops[o];
            let mut inputs = Vec::with_capacity(op.inputs.len());
            for &t in &op.inputs {
                let v = match env.get(&t) {
                    Some(v) => v.clone(),
                    None => self.static_value(t)?,
                };
                inputs.push(v);
            }
            let out = ops::forward(op, inputs, &self.params_of(o)?, &self.ctx(o, grad))?;
            crate::memory::sample();
            for (j, x) in out.extras.into_iter().enumerate() {
                inner.insert(Key::Extra(o, j), x);
            }
            env.insert(op.output, out.output);
            // Drop what this stage no longer reads.
            for &t in op.inputs.iter().chain(std::iter::once(&op.output)) {
                if stage.last_use.get(&t) == Some(&pos) && !keep_out.contains(&t) {
                    if let Some(v) = env.remove(&t) {
                        if keep_saved(t) {
                            inner.insert(Key::Tensor(t), v);
                        }
                    }
                }
            }
        }
        let mut out = Env::new();
        for &t in keep_out {
            let v = match env.remove(&t) {
                Some(v) => v,
                None => self.static_value(t)?,
            };
            out.insert(t, v);
        }
        if grad {
            for (&t, v) in &env {
                if keep_saved(t) {
                    inner.insert(Key::Tensor(t), v.clone());
                }
            }
        }
        inner.retain(|k, _| stage.saved.contains(k));
        Ok((out, inner))
    }

    /// Runs stage `s`'s backward: from `δ_{s+1}` to `δ_s`.
    pub(crate) fn backward_stage(
        &mut self,
        s: usize,
        mut grads: GradMap<B>,
        a_s: &Env<B>,
        mut saved: SavedSet<B>,
    ) -> Result<GradMap<B>, RuntimeError> {
        let stage = &self.p.stages[s];
        // Last backward reader of each saved entry, to free it as soon as it is read.
        let mut last_read: HashMap<Key, usize> = HashMap::new();
        for &o in stage.ops.iter() {
            if let Some(sources) = stage.backward_reads.get(&o) {
                for src in sources {
                    if let Source::Saved(k) = src {
                        last_read.entry(*k).or_insert(o);
                    }
                }
            }
        }
        for &o in stage.ops.iter().rev() {
            let op = &self.p.net.ops[o];
            if !self.p.net.tensors[op.output].requires_grad {
                continue;
            }
            let Some(g) = grads.remove(&op.output) else { continue };
            let sources = &stage.backward_reads[&o];
            let mut values = Vec::with_capacity(sources.len());
            for src in sources {
                let v = match src {
                    Source::Boundary(t) => a_s.get(t).cloned(),
                    Source::Static(t) => Some(self.static_value(*t)?),
                    Source::Saved(Key::Tensor(t)) => {
                        saved.inner.get(&Key::Tensor(*t)).or_else(|| saved.boundary.get(t)).cloned()
                    }
                    Source::Saved(k) => saved.inner.get(k).cloned(),
                };
                values.push(
                    v.ok_or_else(|| RuntimeError::MissingSaved { op: op.name.clone(), slot: format!("{src:?}") })?,
                );
            }
            for src in sources {
                if let Source::Saved(k) = src {
                    if last_read.get(k) == Some(&o) {
                        saved.inner.remove(k);
                    }
                }
            }
            let params = self.params_of(o)?;
            self.release_zeroed_grads(o);
            let out = ops::backward(op, &self.input_dims(o), g, values, &params, &self.needs(o), &self.ctx(o, true))?;
            crate::memory::sample();
            for (k, g) in out.inputs.into_iter().enumerate() {
                if let Some(g) = g {
                    add_grad::<B>(&mut grads, op.inputs[k], g);
                }
            }
            for (j, g) in out.params.into_iter().enumerate() {
                add_into::<B>(&mut self.grads[op.params[j]], g);
            }
        }
        drop(saved);
        let mut out = GradMap::<B>::new();
        for &t in &self.p.boundary[s] {
            if let Some(g) = grads.remove(&t) {
                out.insert(t, g);
            }
        }
        Ok(out)
    }

    /// `B_L`: the views before the loss, the loss, and their backward.
    pub(crate) fn loss_stage(&mut self, a_l: &Env<B>) -> Result<GradMap<B>, RuntimeError> {
        let l = self.p.len();
        let stage = &self.p.stages[l];
        let mut env = a_l.clone();
        let mut grads = GradMap::<B>::new();
        let (&loss_op, views) = stage.ops.split_last().expect("the loss stage holds the loss");
        for &o in views {
            let op = &self.p.net.ops[o];
            let inputs = op.inputs.iter().map(|t| env.get(t).cloned().ok_or(*t)).collect::<Result<Vec<_>, _>>();
            let inputs =
                inputs.map_err(|t| RuntimeError::NotResident { tensor: self.p.net.tensors[t].name.clone() })?;
            let out = ops::forward(op, inputs, &[], &self.ctx(o, true))?;
            env.insert(op.output, out.output);
        }
        let op = &self.p.net.ops[loss_op];
        let mut inputs = Vec::new();
        for &t in &op.inputs {
            inputs.push(match env.get(&t) {
                Some(v) => v.clone(),
                None => self.static_value(t)?,
            });
        }
        let out = ops::loss(op, inputs, &self.needs(loss_op), &self.ctx(loss_op, true))?;
        crate::memory::sample();
        self.loss = Some(out.value);
        for (k, g) in out.inputs.into_iter().enumerate() {
            if let Some(g) = g {
                add_grad::<B>(&mut grads, op.inputs[k], g);
            }
        }
        for &o in views.iter().rev() {
            let op = &self.p.net.ops[o];
            let Some(g) = grads.remove(&op.output) else { continue };
            let out = ops::backward(op, &self.input_dims(o), g, Vec::new(), &[], &self.needs(o), &self.ctx(o, true))?;
            if let Some(Some(g)) = out.inputs.into_iter().next() {
                add_grad::<B>(&mut grads, op.inputs[0], g);
            }
        }
        let mut out = GradMap::<B>::new();
        for &t in &self.p.boundary[l] {
            if let Some(g) = grads.remove(&t) {
                out.insert(t, g);
            }
        }
        Ok(out)
    }
}
