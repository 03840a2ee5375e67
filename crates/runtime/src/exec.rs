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
use burn_backend::{Backend, FloatDType, TensorMetadata};
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
}

/// The optimizer step of one training step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Update {
    /// The optimizer.
    pub optimizer: OptimizerKind,
    /// The step, from 1 (Adam's bias correction).
    pub t: i32,
}

/// A host copy a step leaves for the next, with its bytes.
type Carried = (Arc<HostCopy<Part>>, u64);

/// The parameters, their gradients' placement and the optimizer state between steps:
/// device copies per parameter, host copies per chain static tensor.
pub struct Statics<B: Backend> {
    /// Each parameter's device copy (`None`: only on the host).
    pub(crate) params: Vec<Option<FloatTensor<B>>>,
    /// Each parameter's moments on the device (empty for an optimizer without state).
    pub(crate) moments: Vec<Option<Moments<B>>>,
    /// Per stage, whether `Weight(i)`, `WeightGrad(i)`, `OptState(i)` are on the device
    /// (a gradient's device copy is made afresh by each step).
    pub(crate) device: Vec<[bool; 3]>,
    /// Per stage, the host copies of `Weight(i)`, `WeightGrad(i)`, `OptState(i)`.
    pub(crate) hosts: Vec<[Option<Carried>; 3]>,
    /// Each parameter's up-to-date host copy: the stage whose `Weight` host copy has it.
    pub(crate) fresh: Vec<Option<usize>>,
}

impl<B: Backend> Statics<B> {
    /// Everything on the device, for a chain of `stages` stages.
    pub(crate) fn new(params: Vec<FloatTensor<B>>, moments: Vec<Moments<B>>, stages: usize) -> Statics<B> {
        let n = params.len();
        Statics {
            params: params.into_iter().map(Some).collect(),
            moments: moments.into_iter().map(Some).collect(),
            device: vec![[true; 3]; stages],
            hosts: (0..stages).map(|_| [None, None, None]).collect(),
            fresh: vec![None; n],
        }
    }

    /// Optimizer states per parameter (2 for AdamW, 0 for SGD).
    fn moments_per_param(&self) -> u64 {
        if self.moments.is_empty() {
            0
        } else {
            2
        }
    }

    /// Device bytes of the parameters and moments on the device (each tensor once).
    pub(crate) fn device_bytes(&self) -> u64 {
        let bytes = |t: &FloatTensor<B>| (t.shape().num_elements() * t.dtype().size()) as u64;
        let params: u64 = self.params.iter().flatten().map(bytes).sum();
        let moments: u64 = self.moments.iter().flatten().map(|(m, v)| bytes(m) + bytes(v)).sum();
        params + moments
    }

    /// Whether every parameter and moment is on the device and nothing is on the host.
    pub(crate) fn all_on_device(&self) -> bool {
        self.params.iter().all(Option::is_some) && self.moments.iter().all(Option::is_some)
    }

    /// Every parameter's current value, from its device copy or its up-to-date host copy.
    pub(crate) fn current_values(&self) -> Result<Vec<Vec<f32>>, RuntimeError> {
        (0..self.params.len())
            .map(|q| match &self.params[q] {
                Some(t) => crate::read_floats::<B>(t.clone()),
                None => match self.fresh_part(q) {
                    Some(HostValue::Float(d)) => {
                        d.to_vec::<f32>().map_err(|e| RuntimeError::Readback(format!("{e:?}")))
                    }
                    _ => Err(lost(q)),
                },
            })
            .collect()
    }

    /// Parameter `q`'s current value as host data: from its device copy, or its
    /// up-to-date host copy.
    fn host_value(&self, q: usize) -> Result<HostValue, RuntimeError> {
        let _host = memory::host_scope();
        if let Some(t) = &self.params[q] {
            return HostValue::read(Value::<B>::Float(t.clone()));
        }
        self.fresh_part(q).cloned().ok_or_else(|| lost(q))
    }

    /// Parameter `q`'s part in its up-to-date host copy.
    fn fresh_part(&self, q: usize) -> Option<&HostValue> {
        let stage = self.fresh[q]?;
        let (copy, _) = self.hosts[stage][WEIGHT].as_ref()?;
        copy.parts.iter().find(|(k, _)| *k == Part::Param(q)).map(|(_, v)| v)
    }

    /// Drops stage `i`'s host copy of `kind` and what pointed at it.
    fn drop_host(&mut self, i: usize, kind: usize) {
        let copy = self.hosts[i][kind].take();
        if kind == WEIGHT {
            self.fresh.iter_mut().filter(|f| **f == Some(i)).for_each(|f| *f = None);
        }
        let _host = memory::host_scope();
        drop(copy);
    }

    /// Puts the static tensors where a step that starts at `starts` expects them (as the
    /// simulator starts a period), copying between the device and the host directly
    /// (neither timed nor throttled: this happens before a step, not in one). Host copies
    /// are made first (from the device copies), then device copies brought in (from the
    /// host copies), then what is not wanted dropped. Returns whether anything moved.
    pub(crate) fn arrange(
        &mut self,
        p: &Program,
        starts: &[StageStart],
        device: &B::Device,
    ) -> Result<bool, RuntimeError> {
        let l = p.len();
        let sizes = static_sizes(p, self.moments_per_param());
        let mut moved = false;
        for (i, want) in starts.iter().enumerate().take(l) {
            // A weights' host copy serves if each of its parameters has an up-to-date host
            // copy: this one, or (a tied parameter updated by another stage) that stage's.
            let weights = &p.weights[i];
            let fresh = self.hosts[i][WEIGHT].is_some() && weights.iter().all(|&q| self.fresh_part(q).is_some());
            if want.weight.host && !fresh {
                let parts = weights
                    .iter()
                    .map(|&q| Ok((Part::Param(q), self.host_value(q)?)))
                    .collect::<Result<Vec<_>, RuntimeError>>()?;
                self.drop_host(i, WEIGHT);
                self.hosts[i][WEIGHT] = Some((Arc::new(HostCopy { parts }), sizes[i][WEIGHT]));
                weights.iter().for_each(|&q| self.fresh[q] = Some(i));
                moved = true;
            }
            if want.state.host && self.hosts[i][STATE].is_none() {
                let mut parts: Parts<B, Part> = Vec::new();
                for &q in &p.weights[i] {
                    if let Some(slot) = self.moments.get(q) {
                        let (m, v) = slot.clone().ok_or_else(|| lost_state(i))?;
                        parts.push((Part::M(q), Value::Float(m)));
                        parts.push((Part::V(q), Value::Float(v)));
                    }
                }
                self.hosts[i][STATE] = Some((Arc::new(HostCopy::read(parts)?), sizes[i][STATE]));
                moved = true;
            }
            if want.grad.host && self.hosts[i][WGRAD].is_none() {
                let zeros = p.weights[i]
                    .iter()
                    .map(|&q| {
                        let shape = p.net.params[q].shape.clone();
                        (Part::Grad(q), Value::<B>::Float(B::float_zeros(shape.into(), device, FloatDType::F32)))
                    })
                    .collect();
                self.hosts[i][WGRAD] = Some((Arc::new(HostCopy::read(zeros)?), sizes[i][WGRAD]));
                moved = true;
            }
        }
        for (i, want) in starts.iter().enumerate().take(l) {
            if want.weight.device && !self.device[i][WEIGHT] {
                for &q in &p.weights[i] {
                    if self.params[q].is_none() {
                        let value = self.fresh_part(q).ok_or_else(|| lost(q))?.upload::<B>(device);
                        self.params[q] = value.float();
                    }
                }
                moved = true;
            }
            if want.state.device && !self.device[i][STATE] {
                let (copy, _) = self.hosts[i][STATE].as_ref().ok_or_else(|| lost_state(i))?;
                let mut halves: HashMap<usize, [Option<FloatTensor<B>>; 2]> = HashMap::new();
                for (k, v) in &copy.parts {
                    let (q, half) = match *k {
                        Part::M(q) => (q, 0),
                        Part::V(q) => (q, 1),
                        _ => continue,
                    };
                    halves.entry(q).or_default()[half] = v.upload::<B>(device).float();
                }
                for (q, [m, v]) in halves {
                    self.moments[q] = m.zip(v);
                }
                moved = true;
            }
        }
        for (i, want) in starts.iter().enumerate().take(l) {
            if !want.state.device && self.device[i][STATE] {
                if self.hosts[i][STATE].is_none() {
                    return Err(lost_state(i));
                }
                for &q in &p.weights[i] {
                    if let Some(slot) = self.moments.get_mut(q) {
                        *slot = None;
                    }
                }
                moved = true;
            }
            if !want.state.host && self.hosts[i][STATE].is_some() {
                if !want.state.device {
                    return Err(lost_state(i));
                }
                self.drop_host(i, STATE);
                moved = true;
            }
            if !want.grad.host && self.hosts[i][WGRAD].is_some() {
                self.drop_host(i, WGRAD);
                moved = true;
            }
            moved |= self.device[i][WEIGHT] != want.weight.device || self.device[i][WGRAD] != want.grad.device;
            self.device[i] = [want.weight.device, want.grad.device, want.state.device];
        }
        // Weights' host copies not wanted go (a parameter then lives on the device), then
        // device copies no stage keeps (a parameter then lives in a host copy).
        for (i, want) in starts.iter().enumerate().take(l) {
            if !want.weight.host && self.hosts[i][WEIGHT].is_some() {
                self.drop_host(i, WEIGHT);
                moved = true;
            }
        }
        for q in 0..self.params.len() {
            // A parameter no stage owns (tied, or read by none) stays on the device.
            let kept = p.owned_by(q).is_none_or(|s| self.device[s][WEIGHT]);
            if !kept && self.params[q].is_some() {
                if self.fresh_part(q).is_none() {
                    return Err(lost(q));
                }
                self.params[q] = None;
            }
        }
        Ok(moved)
    }
}

/// Parameter `q` would be left with no up-to-date copy anywhere.
fn lost(q: usize) -> RuntimeError {
    RuntimeError::Schedule {
        index: 0,
        op: "the step's start".into(),
        why: format!("parameter {q} has no up-to-date copy on the device or the host"),
    }
}

fn lost_state(i: usize) -> RuntimeError {
    RuntimeError::Schedule {
        index: 0,
        op: "the step's start".into(),
        why: format!("the optimizer state of stage {i} has no copy on the device or the host"),
    }
}

/// Per stage, the bytes of `Weight(i)`, `WeightGrad(i)` and `OptState(i)` at their
/// declared sizes (`moments` optimizer states per parameter).
fn static_sizes(p: &Program, moments: u64) -> Vec<[u64; 3]> {
    let bytes = |q: usize| p.net.bytes(&p.net.params[q].shape, Elem::Float);
    (0..p.len())
        .map(|i| {
            let owned: u64 = p.weights[i].iter().map(|&q| bytes(q)).sum();
            [p.weights[i].iter().map(|&q| bytes(q)).sum(), owned, moments * owned]
        })
        .collect()
}

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

/// Runs one training step of `schedule` on `program`, on `device`, with unthrottled
/// transfers and no cap on the device pool.
pub fn run<B: Backend>(
    program: &Program,
    index: &GraphIndex,
    schedule: &Schedule,
    step: &StepInputs<'_, B>,
    statics: &mut Statics<B>,
    device: &B::Device,
) -> Result<StepOutput<B>, RuntimeError> {
    run_with(program, index, schedule, step, statics, device, &TransferOptions::default())
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
    // (gradient-accumulation accounting, Zhao §1.1): zeroed at the start, accumulated into.
    // A stage's whose gradient starts the step elsewhere (a period that offloads it) is
    // made by its backward.
    let grads = (0..program.net.params.len())
        .map(|q| {
            let absent = matches!(program.owned_by(q), Some(i) if !statics.device[i][WGRAD]);
            let shape = program.net.params[q].shape.clone();
            (!absent).then(|| B::float_zeros(shape.into(), device, FloatDType::F32))
        })
        .collect();
    let mut runner = Runner {
        p: program,
        step,
        device,
        params: std::mem::take(&mut statics.params),
        moments: std::mem::take(&mut statics.moments),
        stale: vec![false; program.net.params.len()],
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

/// The host CPU's optimizer step of the parameters `owned` (a stage's), on the host
/// copies of their gradients, weights and moments, in place and without temporaries:
/// [`optim::apply_slices`], the backend's arithmetic element by element (on the CPU
/// backend, the device's update bit for bit). Without `update` (a step that updates
/// nothing) the copies are left as they are.
fn host_update(
    update: Option<Update>,
    owned: &[usize],
    grads: HostParts<Part>,
    mut weights: HostParts<Part>,
    mut state: HostParts<Part>,
) -> Result<(HostParts<Part>, HostParts<Part>), RuntimeError> {
    let Some(u) = update else { return Ok((weights, state)) };
    let bad = |e: burn_backend::DataError| RuntimeError::Readback(format!("{e:?}"));
    let mut g: HashMap<usize, burn_backend::TensorData> = HashMap::new();
    for (part, value) in grads {
        if let (Part::Grad(q), HostValue::Float(data)) = (part, value) {
            g.insert(q, data);
        }
    }
    let mut moments: HashMap<usize, [Option<&mut burn_backend::TensorData>; 2]> = HashMap::new();
    for (part, value) in state.iter_mut() {
        if let (Part::M(q) | Part::V(q), HostValue::Float(data)) = (*part, value) {
            moments.entry(q).or_default()[usize::from(matches!(part, Part::V(_)))] = Some(data);
        }
    }
    for (part, value) in weights.iter_mut() {
        let (Part::Param(q), HostValue::Float(p)) = (*part, value) else { continue };
        // A gradient that never reached the parameter leaves it (and its moments) as is.
        let (true, Some(grad)) = (owned.contains(&q), g.get(&q)) else { continue };
        let grad = grad.as_slice::<f32>().map_err(bad)?;
        let p = p.as_mut_slice::<f32>().map_err(bad)?;
        match moments.remove(&q) {
            Some([Some(m), Some(v)]) => {
                let (m, v) = (m.as_mut_slice::<f32>().map_err(bad)?, v.as_mut_slice::<f32>().map_err(bad)?);
                optim::apply_slices(u.optimizer, u.t, p, grad, Some((m, v)));
            }
            _ => optim::apply_slices(u.optimizer, u.t, p, grad, None),
        }
    }
    drop(moments);
    Ok((weights, state))
}

impl<B: Backend> Runner<'_, B> {
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

    /// Runs a chain schedule: compute ops on this thread, transfers on the two threads
    /// of [`Transfers`] (and CPU updates on a third), all of it inside one scope so that
    /// nothing outlives the step but what `statics` carries to the next.
    fn chain(
        &mut self,
        schedule: &Schedule,
        options: &TransferOptions,
        statics: &mut Statics<B>,
    ) -> Result<TransferReport, RuntimeError> {
        let l = self.p.len();
        let ids = Ids::with_statics(l);
        let steps = lower_checked(schedule, l, &statics.device)?;
        // (The moments are the runner's for the step.)
        let moments = if self.moments.is_empty() { 0 } else { 2 };
        let sizes = chain_sizes(self.p, ids, moments);
        let n_ops = schedule.ops.len();
        let mut held = Held::new(ids);
        let mut a0 = Env::new();
        for &t in &self.p.boundary[0] {
            a0.insert(t, self.static_value(t)?);
        }
        held.act[0] = Some(a0);
        let mut track = vec![Track::default(); ids.count()];
        // The host copies the last step left, under jobs past this step's ops.
        let mut hosts = HostCopies::new();
        for i in 0..l {
            for kind in [WEIGHT, WGRAD, STATE] {
                let id = ids.stat(kind, i);
                if let Some(entry) = statics.hosts[i][kind].take() {
                    hosts.insert(n_ops + id, entry);
                    track[id].host = Some(n_ops + id);
                }
                if statics.device[i][kind] {
                    track[id].dev = sizes[id];
                }
            }
        }
        let fresh = statics.fresh.iter().map(|s| s.map(|s| n_ops + ids.weight(s))).collect();
        // The pool starts with what the step holds from its start, as the simulator counts
        // it: the parameters, their gradients and states, less the stages' that start off
        // the device, and the batch (`a_0` among it).
        track[ids.act(0)].dev = sizes[ids.act(0)];
        let net = &self.p.net;
        let params: u64 = net.params.iter().map(|q| net.bytes(&q.shape, Elem::Float)).sum();
        let inputs: u64 = self.step.inputs.values().map(Value::bytes).sum();
        let absent: u64 = (0..l)
            .flat_map(|i| [WEIGHT, WGRAD, STATE].map(|kind| (i, kind)))
            .filter(|&(i, kind)| !statics.device[i][kind])
            .map(|(i, kind)| sizes[ids.stat(kind, i)])
            .sum();
        let base = ((2 + moments) * params + inputs).saturating_sub(absent).max(sizes[ids.act(0)]);
        let device = self.device;
        let on_cpu = placement::cpu_updated(&schedule.ops, l);
        let fused = placement::names_statics(schedule);
        let mut stat = StaticRun { dev: statics.device.clone(), fresh, pending: HashMap::new(), on_cpu, fused };
        let (result, finished) = std::thread::scope(|scope| {
            let xfer = Transfers::new(scope, device, *options, base, hosts);
            let mut run = ChainRun { held, track, sizes, xfer };
            let result = self.chain_ops(schedule, &steps, &mut run, &mut stat);
            let ok = result.is_ok();
            let ChainRun { held, xfer, track, .. } = run;
            drop(held);
            (result.map(|()| track), xfer.finish(ok))
        });
        let track = result?;
        let (report, mut left) = finished?;
        // What the step leaves for the next: host copies of the static tensors, and which
        // parameters they hold up to date; a device copy the CPU updated past goes.
        for i in 0..l {
            for kind in [WEIGHT, WGRAD, STATE] {
                statics.hosts[i][kind] = track[ids.stat(kind, i)].host.and_then(|job| left.remove(&job));
            }
        }
        statics.fresh = stat
            .fresh
            .iter()
            .map(|f| f.and_then(|job| (0..l).find(|&s| track[ids.weight(s)].host == Some(job))))
            .collect();
        for q in 0..self.params.len() {
            if self.stale[q] {
                self.params[q] = None;
                if let Some(s) = self.p.owned_by(q) {
                    stat.dev[s][WEIGHT] = false;
                }
            }
        }
        statics.device = stat.dev;
        let _host = memory::host_scope();
        drop(left);
        Ok(report)
    }

    fn chain_ops(
        &mut self,
        schedule: &Schedule,
        steps: &[Step],
        run: &mut ChainRun<'_, '_, B>,
        st: &mut StaticRun<B>,
    ) -> Result<(), RuntimeError> {
        let ids = run.held.ids;
        let time_ops = run.xfer.options().time_ops;
        if time_ops {
            self.op_seconds = vec![0.0; schedule.ops.len()];
        }
        for (k, (op, step)) in schedule.ops.iter().zip(steps).enumerate() {
            self.poll(run, st)?;
            match step.action {
                Action::Forward { .. } | Action::Loss { .. } | Action::Backward { .. } => {
                    for &r in &step.reads {
                        self.settle(run, st, r)?;
                    }
                    // What it creates and the op's temporaries must fit in the pool beside
                    // what it holds; the temporaries go back when the op is done.
                    let tmp = self.step.temporaries.of_op(op);
                    let mut need = tmp;
                    for &c in &step.creates {
                        if !ids.is_static(c) {
                            // Made again while held (or kept for a read): the old device
                            // copy goes first; a host copy stays.
                            run.drop_device(c)?;
                        }
                        need += run.sizes[c];
                    }
                    run.xfer.reserve(k, &op.to_string(), need)?;
                    for &c in &step.creates {
                        run.track[c].dev = run.sizes[c];
                        if let Some((WGRAD, i)) = ids.static_of(c) {
                            st.dev[i][WGRAD] = true;
                            for &q in &self.p.weights[i] {
                                let shape = self.p.net.params[q].shape.clone();
                                self.grads[q] = Some(B::float_zeros(shape.into(), self.device, FloatDType::F32));
                            }
                        }
                    }
                    let start = Instant::now();
                    self.compute(k, op, step, &mut run.held).map_err(|e| at_op(e, k, op))?;
                    if time_ops {
                        sync::<B>(self.device)?;
                        self.op_seconds[k] = start.elapsed().as_secs_f64();
                    }
                    run.xfer.release(tmp);
                    for &r in &step.frees {
                        run.release(r)?;
                    }
                    run.let_go_after(k);
                    if let Action::Backward { stage: i, .. } = step.action {
                        if st.fused {
                            self.after_backward(k, op, i, run, st)?;
                        }
                    }
                }
                Action::CpuUpdate { stage, .. } => self.cpu_update(k, op, stage, run, st)?,
                Action::Free { tensor: id, .. } if ids.is_static(id) => self.free_static(k, op, id, run, st)?,
                Action::Free { tensor: id, .. } => run.release(id)?,
                Action::Offload { tensor: id, upload, .. } if ids.is_static(id) => {
                    self.offload_static(k, op, id, upload, run, st)?
                }
                Action::Offload { tensor: id, hold_until, .. } => run.offload(k, op, id, hold_until)?,
                Action::Prefetch { tensor: id, .. } if ids.is_static(id) => self.prefetch_static(k, op, id, run, st)?,
                Action::Prefetch { tensor: id, .. } => run.prefetch(k, op, id)?,
            }
        }
        // A prefetch still in flight (a period's last ops bring in what the next period
        // reads first) lands before the step ends.
        for id in 0..run.track.len() {
            self.settle(run, st, id)?;
        }
        Ok(())
    }

    // ------------------------------------------------------- chain static tensors

    /// Takes in the prefetches that have arrived.
    fn poll(&mut self, run: &mut ChainRun<'_, '_, B>, st: &mut StaticRun<B>) -> Result<(), RuntimeError> {
        for (job, parts) in run.xfer.arrived()? {
            if let Some(id) = run.track.iter().position(|t| t.prefetch == Some(job)) {
                run.track[id].prefetch = None;
                self.put(run, st, id, parts);
            }
        }
        Ok(())
    }

    /// Waits for the tensor's prefetch in flight, if any.
    fn settle(&mut self, run: &mut ChainRun<'_, '_, B>, st: &mut StaticRun<B>, id: usize) -> Result<(), RuntimeError> {
        if let Some(job) = run.track[id].prefetch.take() {
            let parts = run.xfer.wait_prefetch(job)?;
            self.put(run, st, id, parts);
        }
        Ok(())
    }

    /// Holds a prefetched tensor: an activation's parts in `held`, a static tensor's in
    /// the parameter slots. A parameter already on the device (up to date, through
    /// another stage) keeps its copy.
    fn put(&mut self, run: &mut ChainRun<'_, '_, B>, st: &mut StaticRun<B>, id: usize, parts: Parts<B, Part>) {
        if !run.held.ids.is_static(id) {
            run.held.put(id, parts);
            return;
        }
        let extra = st.pending.remove(&id).unwrap_or_default();
        let mut halves: HashMap<usize, [Option<FloatTensor<B>>; 2]> = HashMap::new();
        for (part, value) in parts.into_iter().chain(extra) {
            let Some(t) = value.float() else { continue };
            match part {
                Part::Param(q) => {
                    if self.params[q].is_none() || self.stale[q] {
                        self.params[q] = Some(t);
                        self.stale[q] = false;
                    }
                }
                Part::Grad(q) => self.grads[q] = Some(t),
                Part::M(q) => halves.entry(q).or_default()[0] = Some(t),
                Part::V(q) => halves.entry(q).or_default()[1] = Some(t),
                Part::Boundary(_) | Part::Inner(_) => {}
            }
        }
        for (q, [m, v]) in halves {
            self.moments[q] = m.zip(v);
        }
    }

    /// Handles to a static tensor's parts (the device copy stays).
    fn static_parts(&self, k: usize, op: &Op, ids: Ids, id: usize) -> Result<Parts<B, Part>, RuntimeError> {
        let (kind, i) = ids.static_of(id).expect("a static tensor");
        let missing = || sched_err(k, op, format!("{:?} is not whole on the device", ids.tensor(id)));
        let mut parts = Vec::new();
        match kind {
            WEIGHT => {
                for &q in &self.p.weights[i] {
                    parts.push((Part::Param(q), Value::Float(self.params[q].clone().ok_or_else(missing)?)));
                }
            }
            WGRAD => {
                for &q in &self.p.weights[i] {
                    parts.push((Part::Grad(q), Value::Float(self.grads[q].clone().ok_or_else(missing)?)));
                }
            }
            _ => {
                for &q in &self.p.weights[i] {
                    if q < self.moments.len() {
                        let (m, v) = self.moments[q].clone().ok_or_else(missing)?;
                        parts.push((Part::M(q), Value::Float(m)));
                        parts.push((Part::V(q), Value::Float(v)));
                    }
                }
            }
        }
        Ok(parts)
    }

    /// Drops stage `i`'s device copy of `kind`. A parameter another stage's weights keep
    /// on the device stays; one whose only up-to-date copy this is may not go.
    fn clear_static(
        &mut self,
        k: usize,
        op: &Op,
        kind: usize,
        i: usize,
        st: &mut StaticRun<B>,
    ) -> Result<(), RuntimeError> {
        st.dev[i][kind] = false;
        match kind {
            WEIGHT => {
                for &q in &self.p.weights[i] {
                    if self.params[q].is_none() {
                        continue;
                    }
                    if !self.stale[q] && st.fresh[q].is_none() {
                        return Err(sched_err(
                            k,
                            op,
                            format!(
                                "parameter `{}` has no up-to-date host copy: dropping its device copy would lose it",
                                self.p.net.params[q].name
                            ),
                        ));
                    }
                    self.params[q] = None;
                    self.stale[q] = false;
                }
            }
            WGRAD => self.p.weights[i].iter().for_each(|&q| self.grads[q] = None),
            _ => {
                for &q in &self.p.weights[i] {
                    if let Some(slot) = self.moments.get_mut(q) {
                        *slot = None;
                    }
                }
            }
        }
        Ok(())
    }

    /// Schedule op `k`, an offload (or upload) of static tensor `id`.
    fn offload_static(
        &mut self,
        k: usize,
        op: &Op,
        id: usize,
        upload: bool,
        run: &mut ChainRun<'_, '_, B>,
        st: &mut StaticRun<B>,
    ) -> Result<(), RuntimeError> {
        let ids = run.held.ids;
        let (kind, i) = ids.static_of(id).expect("a static tensor");
        self.settle(run, st, id)?;
        if !st.dev[i][kind] || run.track[id].hold.is_some() {
            return Err(sched_err(k, op, format!("{:?} is not on the device", ids.tensor(id))));
        }
        if kind == WEIGHT && self.p.weights[i].iter().any(|&q| self.stale[q]) {
            return Err(sched_err(k, op, "its device copy is stale since its update on the host: free it instead"));
        }
        let parts = self.static_parts(k, op, ids, id)?;
        if let Some(old) = run.track[id].host.take() {
            st.drop_host(&mut run.xfer, old);
        }
        let text = op.to_string();
        if upload {
            // The device copy stays for the reads before the next free.
            let bytes = std::mem::take(&mut run.track[id].dev);
            run.xfer.offload(k, &text, parts, bytes, false)?;
            run.track[id].hold = Some((usize::MAX, k, bytes));
        } else {
            let bytes = std::mem::take(&mut run.track[id].dev);
            run.xfer.offload(k, &text, parts, bytes, true)?;
        }
        run.track[id].host = Some(k);
        if kind == WEIGHT {
            self.p.weights[i].iter().for_each(|&q| st.fresh[q] = Some(k));
        }
        if !upload {
            self.clear_static(k, op, kind, i, st)?;
        }
        Ok(())
    }

    /// Schedule op `k`, a prefetch of static tensor `id`: each parameter from its
    /// up-to-date copy (the device's, through another stage, or a host copy).
    fn prefetch_static(
        &mut self,
        k: usize,
        op: &Op,
        id: usize,
        run: &mut ChainRun<'_, '_, B>,
        st: &mut StaticRun<B>,
    ) -> Result<(), RuntimeError> {
        let ids = run.held.ids;
        let (kind, i) = ids.static_of(id).expect("a static tensor");
        if st.dev[i][kind] || run.track[id].prefetch.is_some() {
            return Err(sched_err(k, op, format!("{:?} is already on the device", ids.tensor(id))));
        }
        let mut sources: Vec<(usize, Option<Vec<Part>>)> = Vec::new();
        if kind == WEIGHT {
            let mut on_device = Vec::new();
            for &q in &self.p.weights[i] {
                match (&self.params[q], st.fresh[q]) {
                    (Some(t), _) if !self.stale[q] => on_device.push((Part::Param(q), Value::Float(t.clone()))),
                    (_, Some(job)) => match sources.iter_mut().find(|(j, _)| *j == job) {
                        Some((_, Some(list))) => list.push(Part::Param(q)),
                        _ => sources.push((job, Some(vec![Part::Param(q)]))),
                    },
                    _ => {
                        let name = &self.p.net.params[q].name;
                        return Err(sched_err(k, op, format!("parameter `{name}` has no up-to-date copy to prefetch")));
                    }
                }
            }
            st.pending.insert(id, on_device);
        } else {
            let Some(job) = run.track[id].host else {
                return Err(sched_err(k, op, format!("{:?} has no host copy to prefetch", ids.tensor(id))));
            };
            sources.push((job, None));
        }
        let bytes = run.sizes[id];
        run.xfer.prefetch(k, &op.to_string(), sources, bytes)?;
        run.track[id].prefetch = Some(k);
        run.track[id].dev = bytes;
        st.dev[i][kind] = true;
        Ok(())
    }

    /// Schedule op `k`, a free of static tensor `id`: a weight or a state loses its device
    /// copy (its host copy stays), a gradient both.
    fn free_static(
        &mut self,
        k: usize,
        op: &Op,
        id: usize,
        run: &mut ChainRun<'_, '_, B>,
        st: &mut StaticRun<B>,
    ) -> Result<(), RuntimeError> {
        let ids = run.held.ids;
        let (kind, i) = ids.static_of(id).expect("a static tensor");
        self.settle(run, st, id)?;
        let t = &mut run.track[id];
        if !st.dev[i][kind] && t.hold.is_none() {
            if kind == WGRAD && t.host.is_some() {
                let job = t.host.take().expect("checked");
                st.drop_host(&mut run.xfer, job);
                return Ok(());
            }
            return Err(sched_err(k, op, format!("{:?} is not on the device", ids.tensor(id))));
        }
        if kind == STATE && t.host.is_none() {
            return Err(sched_err(k, op, "the optimizer state has no host copy: its device copy cannot be dropped"));
        }
        if let Some((_, job, bytes)) = t.hold.take() {
            run.xfer.let_go(job, bytes);
        }
        let bytes = std::mem::take(&mut run.track[id].dev);
        run.xfer.release(bytes);
        self.clear_static(k, op, kind, i, st)?;
        if kind == WGRAD {
            if let Some(job) = run.track[id].host.take() {
                st.drop_host(&mut run.xfer, job);
            }
        }
        Ok(())
    }

    /// After `B_i` (of a schedule that names the static tensors): the optimizer step of
    /// the parameters whose last gradient contribution it made, on the device unless the
    /// host CPU updates the stage (a tied parameter, resident with its gradient and
    /// state, is updated here either way); the host copies of the stage's weights
    /// and state are then stale.
    fn after_backward(
        &mut self,
        k: usize,
        op: &Op,
        i: usize,
        run: &mut ChainRun<'_, '_, B>,
        st: &mut StaticRun<B>,
    ) -> Result<(), RuntimeError> {
        let on_cpu = st.on_cpu[i];
        let ids = run.held.ids;
        let updated: Vec<usize> = (0..self.params.len())
            .filter(|&q| self.p.update_stage[q] == Some(i))
            .filter(|&q| !on_cpu || self.p.owned_by(q).is_none())
            .collect();
        if let Some(u) = self.step.update {
            for &q in &updated {
                let Some(g) = self.grads[q].clone() else { continue };
                let name = &self.p.net.params[q].name;
                let param = match self.params[q].take() {
                    Some(t) if !self.stale[q] => t,
                    _ => {
                        return Err(sched_err(
                            k,
                            op,
                            format!("updates `{name}`, which is not up to date on the device"),
                        ));
                    }
                };
                let moments = match self.moments.get_mut(q) {
                    Some(slot) => Some(slot.take().ok_or_else(|| {
                        sched_err(k, op, format!("updates `{name}`, whose optimizer state is not on the device"))
                    })?),
                    None => None,
                };
                let (param, moments) = optim::apply::<B>(u.optimizer, u.t, param, g, moments);
                self.params[q] = Some(param);
                if let Some(m) = moments {
                    self.moments[q] = Some(m);
                }
            }
        }
        for &q in &updated {
            st.fresh[q] = None;
        }
        if !on_cpu {
            for kind in [WEIGHT, STATE] {
                if let Some(job) = run.track[ids.stat(kind, i)].host.take() {
                    st.drop_host(&mut run.xfer, job);
                }
            }
        }
        Ok(())
    }

    /// Schedule op `k`, the optimizer step of stage `i` on the host CPU: from the host
    /// copy of its gradient to new host copies of its weights and state.
    fn cpu_update(
        &mut self,
        k: usize,
        op: &Op,
        i: usize,
        run: &mut ChainRun<'_, '_, B>,
        st: &mut StaticRun<B>,
    ) -> Result<(), RuntimeError> {
        let ids = run.held.ids;
        let l = self.p.len();
        if i >= l {
            return Err(sched_err(k, op, format!("stage {i} out of range (L = {l})")));
        }
        let Some(grad) = run.track[ids.wgrad(i)].host.take() else {
            return Err(sched_err(
                k,
                op,
                format!("WeightGrad({i}) is not on the host: offload it before the CPU update"),
            ));
        };
        let Some(weight) = run.track[ids.weight(i)].host else {
            return Err(sched_err(k, op, format!("Weight({i}) has no up-to-date host copy for the CPU to update")));
        };
        let state = if self.moments.is_empty() {
            None
        } else {
            if st.dev[i][STATE] {
                return Err(sched_err(
                    k,
                    op,
                    format!("OptState({i}) is on the device: a CPU-updated state lives on the host"),
                ));
            }
            let Some(job) = run.track[ids.state(i)].host else {
                return Err(sched_err(k, op, format!("OptState({i}) has no host copy for the CPU to update")));
            };
            Some(job)
        };
        let owned = self.p.weights[i].clone();
        let update = self.step.update;
        let arithmetic: HostUpdate<Part> = Box::new(move |g, w, s| host_update(update, &owned, g, w, s));
        run.xfer.cpu_update(k, &op.to_string(), (grad, weight, state), arithmetic)?;
        for &q in &self.p.weights[i] {
            if self.params[q].is_some() {
                self.stale[q] = true;
            }
            st.fresh[q] = Some(weight);
        }
        Ok(())
    }

    /// Runs one compute step of a chain schedule on the tensors `held`: what it reads and
    /// also frees is taken from `held`, what it frees unread is dropped first, the rest of
    /// what it reads is shared.
    fn compute(&mut self, k: usize, op: &Op, step: &Step, h: &mut Held<B>) -> Result<(), RuntimeError> {
        let ids = h.ids;
        let gone = |id: usize| sched_err(k, op, format!("{:?} is not on the device", ids.tensor(id)));
        for &f in step.frees.iter().filter(|f| !step.reads.contains(f)) {
            h.clear(f);
        }
        let take = |id: usize| step.frees.contains(&id);
        match step.action {
            Action::Forward { stage, mode, input, output } => {
                let a = h.boundary(input, take(input)).ok_or_else(|| gone(input))?;
                let grad = mode == ForwardMode::KeepAll;
                let (out, inner) = self.forward_stage(stage, a, grad)?;
                h.set(output, Slot::from_forward(out, inner, grad));
            }
            Action::Loss { input, output } => {
                let a = h.boundary(input, take(input)).ok_or_else(|| gone(input))?;
                h.set(output, Slot::Grad(self.loss_stage(&a)?));
            }
            Action::Backward { stage, input, grad_in, saved, output, .. } => {
                let d = h.take_grad(grad_in).ok_or_else(|| gone(grad_in))?;
                let s = h.take_saved(saved).ok_or_else(|| gone(saved))?;
                let a = h.boundary(input, take(input)).ok_or_else(|| gone(input))?;
                h.set(output, Slot::Grad(self.backward_stage(stage, d, &a, s)?));
            }
            _ => unreachable!("a compute step"),
        }
        Ok(())
    }

    // ---------------------------------------------------------------- graph view

    /// The value of forward tensor `t`, rebuilding a view from its root.
    fn graph_value(
        &self,
        index: &GraphIndex,
        data: &[Option<Value<B>>],
        t: TensorId,
    ) -> Result<Value<B>, RuntimeError> {
        let tensor = &self.p.net.tensors[t];
        if tensor.view_of.is_none() {
            if tensor.producer.is_none() && data[index.tensor[t]].is_none() {
                return self.static_value(t);
            }
            return data[index.tensor[t]]
                .clone()
                .ok_or_else(|| RuntimeError::NotResident { tensor: tensor.name.clone() });
        }
        let o = tensor.producer.expect("a view has a producer");
        let op = &self.p.net.ops[o];
        let input = self.graph_value(index, data, op.inputs[0])?;
        Ok(ops::forward(op, vec![input], &[], &self.ctx(o, false))?.output)
    }

    /// Adds `g`, the gradient of forward tensor `t`, to its gradient node (through views).
    fn graph_grad(
        &self,
        index: &GraphIndex,
        data: &mut [Option<Value<B>>],
        mut t: TensorId,
        mut g: FloatTensor<B>,
    ) -> Result<(), RuntimeError> {
        while let Some(o) = self.p.net.tensors[t].view_of.and(self.p.net.tensors[t].producer) {
            let out = ops::backward(
                &self.p.net.ops[o],
                &self.input_dims(o),
                g,
                Vec::new(),
                &[],
                &[true],
                &self.ctx(o, true),
            )?;
            g = out
                .inputs
                .into_iter()
                .next()
                .flatten()
                .ok_or_else(|| RuntimeError::NoInputGradient { op: self.p.net.ops[o].name.clone() })?;
            t = self.p.net.ops[o].inputs[0];
        }
        let slot = &mut data[index.grad[t]];
        let mut cur = slot.take().and_then(Value::float);
        add_into::<B>(&mut cur, g);
        *slot = cur.map(Value::Float);
        Ok(())
    }

    /// Runs the graph ops `drive` hands over; offloads and prefetches of data nodes go on
    /// the transfer threads (the link at `options`' speeds, started on the first), each
    /// offload's device copy let go when its copy is done, as the simulator releases it.
    fn graph(
        &mut self,
        index: &GraphIndex,
        drive: &mut Drive<'_>,
        options: &TransferOptions,
    ) -> Result<TransferReport, RuntimeError> {
        let device = self.device;
        // With the graph's sizes, the pool counts as the simulator does, under the cap: a
        // compute op (or a reload) that would go over it waits for the offloads in flight,
        // as the simulator's does. Without them it counts nothing and caps nothing.
        let sizes = &self.step.temporaries.graph;
        let (options, base) = if sizes.fits(index.data) {
            (TransferOptions { host_cap: None, ..*options }, sizes.resident)
        } else {
            (TransferOptions { device_cap: None, host_cap: None, ..*options }, 0)
        };
        let (result, finished) = std::thread::scope(|scope| {
            let mut xfer = Transfers::<B, usize>::new(scope, device, options, base, HashMap::new());
            let result = self.graph_ops(index, drive, &mut xfer);
            let ok = result.is_ok();
            (result, xfer.finish(ok))
        });
        result?;
        let (report, left) = finished?;
        let _host = memory::host_scope();
        drop(left);
        Ok(report)
    }

    /// The data nodes compute node `node` (op `o`, its backward if `is_backward`) reads.
    fn graph_reads(&self, index: &GraphIndex, node: usize, o: usize, is_backward: bool) -> Vec<usize> {
        let op = &self.p.net.ops[o];
        if node == index.loss || !is_backward {
            return op.inputs.iter().map(|&t| index.tensor[t]).collect();
        }
        let mut reads = vec![index.grad[op.output]];
        for item in &op.decl.saved {
            match item {
                Saved::Input(j) => reads.push(index.tensor[op.inputs[*j]]),
                Saved::Output => reads.push(index.tensor[op.output]),
                Saved::Extra { .. } => {}
            }
        }
        reads.extend(index.extras[o].iter().copied());
        reads
    }

    /// Runs the graph ops `drive` hands to the executor it is given, in order, each as
    /// soon as it is handed over: a schedule's ops, or a run-time policy's decisions.
    fn graph_ops(
        &mut self,
        index: &GraphIndex,
        drive: &mut Drive<'_>,
        xfer: &mut Transfers<'_, '_, B, usize>,
    ) -> Result<(), RuntimeError> {
        let net = &self.p.net;
        let mut data: Vec<Option<Value<B>>> = (0..index.data).map(|_| None).collect();
        // Inputs of the step are resident from the start. `dev`: each data node's bytes in
        // the device pool (declared sizes, where the step has them; the inputs' are in the
        // pool's base).
        let sizes = &self.step.temporaries.graph;
        let counted = sizes.fits(index.data);
        let mut dev = vec![0u64; index.data];
        for (t, tensor) in net.tensors.iter().enumerate() {
            if tensor.producer.is_none() && index.tensor[t] != usize::MAX {
                let d = index.tensor[t];
                data[d] = Some(self.static_value(t)?);
                if counted {
                    dev[d] = sizes.data[d];
                }
            }
        }
        // Which compute node is which op's forward or backward.
        let mut node_op: HashMap<usize, (usize, bool)> = HashMap::new();
        for (o, (&f, &b)) in index.forward.iter().zip(&index.backward).enumerate() {
            if f != usize::MAX {
                node_op.insert(f, (o, false));
            }
            if b != usize::MAX {
                node_op.insert(b, (o, true));
            }
        }
        let loss_op = net.ops.len() - 1;
        // The offload holding each data node's host copy, and its prefetch in flight.
        let mut host_job: Vec<Option<(usize, u64)>> = vec![None; index.data];
        let mut prefetch_job: Vec<Option<usize>> = vec![None; index.data];
        let mut in_flight = 0usize;
        let mut k = 0;
        let mut exec = |sop: &Op| -> Result<(), RuntimeError> {
            let k = {
                k += 1;
                k - 1
            };
            match *sop {
                // Reloads in flight that this node reads land first.
                Op::Compute { node, .. } if in_flight > 0 => {
                    let (o, is_backward) = match node_op.get(&node) {
                        Some(&found) => found,
                        None if node == index.loss => (loss_op, false),
                        None => return Err(sched_err(k, sop, format!("compute node {node} is not in the graph"))),
                    };
                    for d in self.graph_reads(index, node, o, is_backward) {
                        if let Some(job) = prefetch_job.get_mut(d).and_then(Option::take) {
                            in_flight -= 1;
                            data[d] = landed(xfer, job)?;
                        }
                    }
                }
                _ => {}
            }
            // The outputs a compute node allocates and its temporaries must fit in the
            // pool; the temporaries go back when it is done.
            let mut tmp = 0;
            if let (Op::Compute { node, no_grad }, true) = (*sop, counted) {
                tmp = sizes.tmp.get(node).copied().unwrap_or(0);
                let mut need = tmp;
                for &(d, saved) in sizes.outputs.get(node).map_or(&[][..], Vec::as_slice) {
                    if dev[d] == 0 && !(no_grad && saved) {
                        dev[d] = sizes.data[d];
                        need += sizes.data[d];
                    }
                }
                xfer.reserve(k, &sop.to_string(), need)?;
            }
            match *sop {
                Op::Compute { node, no_grad } => {
                    if node == index.loss {
                        let op = &net.ops[loss_op];
                        let inputs = op
                            .inputs
                            .iter()
                            .map(|&t| self.graph_value(index, &data, t))
                            .collect::<Result<Vec<_>, _>>()?;
                        let out = ops::loss(op, inputs, &self.needs(loss_op), &self.ctx(loss_op, true))?;
                        crate::memory::sample();
                        self.loss = Some(out.value);
                        for (j, g) in out.inputs.into_iter().enumerate() {
                            if let Some(g) = g {
                                self.graph_grad(index, &mut data, op.inputs[j], g)?;
                            }
                        }
                        xfer.release(tmp);
                        return Ok(());
                    }
                    let Some(&(o, is_backward)) = node_op.get(&node) else {
                        return Err(sched_err(k, sop, format!("compute node {node} is not in the graph")));
                    };
                    let op = &net.ops[o];
                    if !is_backward {
                        let inputs = op
                            .inputs
                            .iter()
                            .map(|&t| self.graph_value(index, &data, t))
                            .collect::<Result<Vec<_>, _>>()?;
                        let out = ops::forward(op, inputs, &self.params_of(o)?, &self.ctx(o, !no_grad))?;
                        data[index.tensor[op.output]] = Some(out.output);
                        for (j, x) in out.extras.into_iter().enumerate() {
                            data[index.extras[o][j]] = Some(x);
                        }
                    } else {
                        let g = data[index.grad[op.output]]
                            .clone()
                            .and_then(Value::float)
                            .ok_or_else(|| sched_err(k, sop, "the output's gradient is not resident"))?;
                        let mut values = Vec::new();
                        let mut extra = 0;
                        for item in &op.decl.saved {
                            values.push(match item {
                                Saved::Input(j) => self.graph_value(index, &data, op.inputs[*j])?,
                                Saved::Output => self.graph_value(index, &data, op.output)?,
                                Saved::Extra { .. } => {
                                    extra += 1;
                                    data[index.extras[o][extra - 1]]
                                        .clone()
                                        .ok_or_else(|| sched_err(k, sop, "a saved extra is not resident"))?
                                }
                            });
                        }
                        let out = ops::backward(
                            op,
                            &self.input_dims(o),
                            g,
                            values,
                            &self.params_of(o)?,
                            &self.needs(o),
                            &self.ctx(o, true),
                        )?;
                        for (j, g) in out.inputs.into_iter().enumerate() {
                            if let Some(g) = g {
                                self.graph_grad(index, &mut data, op.inputs[j], g)?;
                            }
                        }
                        for (j, g) in out.params.into_iter().enumerate() {
                            add_into::<B>(&mut self.grads[op.params[j]], g);
                        }
                    }
                    xfer.release(tmp);
                }
                Op::Free { tensor: Tensor::Data(d) } => {
                    if d < data.len() {
                        if let Some(job) = prefetch_job[d].take() {
                            in_flight -= 1;
                            drop(landed(xfer, job)?);
                        }
                        if let Some((job, _)) = host_job[d].take() {
                            xfer.drop_host(job);
                        }
                        data[d] = None;
                        xfer.release(std::mem::take(&mut dev[d]));
                    }
                }
                Op::Offload { tensor: Tensor::Data(d), fraction } if fraction >= 1.0 && d < data.len() => {
                    // A reload still in flight lands first: the offload takes what arrives.
                    if let Some(job) = prefetch_job[d].take() {
                        in_flight -= 1;
                        data[d] = landed(xfer, job)?;
                    }
                    let value =
                        data[d].take().ok_or_else(|| sched_err(k, sop, "offloads a data node not on the device"))?;
                    if let Some((old, _)) = host_job[d].take() {
                        xfer.drop_host(old);
                    }
                    // At its declared size where the pool counts them, as the simulator moves it.
                    let bytes = if counted { sizes.data[d] } else { value.bytes() };
                    dev[d] = 0;
                    xfer.offload(k, &sop.to_string(), vec![(d, value)], bytes, true)?;
                    host_job[d] = Some((k, bytes));
                }
                Op::Prefetch { tensor: Tensor::Data(d), fraction } if fraction >= 1.0 && d < data.len() => {
                    let Some((job, bytes)) = host_job[d] else {
                        return Err(sched_err(k, sop, "prefetches a data node with no host copy"));
                    };
                    if data[d].is_some() || prefetch_job[d].is_some() {
                        return Err(sched_err(k, sop, "prefetches a data node already on the device"));
                    }
                    xfer.prefetch(k, &sop.to_string(), vec![(job, None)], bytes)?;
                    dev[d] = bytes;
                    prefetch_job[d] = Some(k);
                    in_flight += 1;
                }
                Op::Offload { .. } | Op::Prefetch { .. } => {
                    return Err(sched_err(k, sop, "a graph schedule moves whole data nodes"));
                }
                _ => return Err(sched_err(k, sop, "not a graph op (compute or free)")),
            }
            Ok(())
        };
        drive(&mut exec)
    }
}

/// The data node prefetch `job` brings back, once it has landed.
fn landed<B: Backend>(xfer: &mut Transfers<'_, '_, B, usize>, job: usize) -> Result<Option<Value<B>>, RuntimeError> {
    Ok(xfer.wait_prefetch(job)?.into_iter().next().map(|(_, v)| v))
}

// -------------------------------------------------------------------- chain tensors

/// A part of a chain tensor as it travels to the host and back: a boundary tensor (of
/// `a_i`, `ā_i` or `δ_i`) or an inner saved tensor of `ā_i`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Part {
    Boundary(TensorId),
    Inner(Key),
    /// A parameter (of `Weight(i)`).
    Param(usize),
    /// A parameter's gradient (of `WeightGrad(i)`).
    Grad(usize),
    /// A parameter's first and second moments (of `OptState(i)`).
    M(usize),
    V(usize),
}

/// A chain step's standing of the static tensors beside the pools.
struct StaticRun<B: Backend> {
    /// Per stage, whether `Weight(i)`, `WeightGrad(i)`, `OptState(i)` are on the device
    /// (from a prefetch's issue on).
    dev: Vec<[bool; 3]>,
    /// Each parameter's up-to-date host copy: the job that made it.
    fresh: Vec<Option<usize>>,
    /// Parameters a weight prefetch in flight takes from the device (another stage's
    /// copy, up to date) instead of the host.
    pending: HashMap<usize, Parts<B, Part>>,
    /// The stages the host CPU updates.
    on_cpu: Vec<bool>,
    /// The schedule names the static tensors: each stage is updated in its backward.
    fused: bool,
}

impl<B: Backend> StaticRun<B> {
    /// Drops the host copy `job` made, and forgets what it held up to date.
    fn drop_host<K: Clone + PartialEq + Send + Sync + 'static>(
        &mut self,
        xfer: &mut Transfers<'_, '_, B, K>,
        job: usize,
    ) {
        xfer.drop_host(job);
        self.fresh.iter_mut().filter(|f| **f == Some(job)).for_each(|f| *f = None);
    }
}

/// What a chain compute step creates: `a_{i+1}`, `ā_{i+1}` or `δ_i`.
enum Slot<B: Backend> {
    Act(Env<B>),
    Saved(SavedSet<B>),
    Grad(GradMap<B>),
}

impl<B: Backend> Slot<B> {
    /// A forward's output: a saved set with its inner tensors if it kept its graph.
    fn from_forward(out: Env<B>, inner: HashMap<Key, Value<B>>, kept: bool) -> Self {
        if kept {
            Slot::Saved(SavedSet { boundary: out, inner })
        } else {
            Slot::Act(out)
        }
    }
}

/// The chain tensors whose device copies the step holds.
struct Held<B: Backend> {
    ids: Ids,
    act: Vec<Option<Env<B>>>,
    sav: Vec<Option<SavedSet<B>>>,
    delta: Vec<Option<GradMap<B>>>,
}

impl<B: Backend> Held<B> {
    fn new(ids: Ids) -> Self {
        Held {
            ids,
            act: (0..ids.n()).map(|_| None).collect(),
            sav: (0..ids.n()).map(|_| None).collect(),
            delta: (0..ids.n()).map(|_| None).collect(),
        }
    }

    fn present(&self, id: usize) -> bool {
        let (kind, i) = (id / self.ids.n(), id % self.ids.n());
        match kind {
            0 => self.act[i].is_some(),
            1 => self.sav[i].is_some(),
            2 => self.delta[i].is_some(),
            _ => false,
        }
    }

    fn clear(&mut self, id: usize) {
        let (kind, i) = (id / self.ids.n(), id % self.ids.n());
        match kind {
            0 => self.act[i] = None,
            1 => self.sav[i] = None,
            2 => self.delta[i] = None,
            _ => {}
        }
    }

    /// The boundary tensors of `a_i` through `id` (`Activation(i)` or `Saved(i)`): taken
    /// from `held` if `take`, else shared.
    fn boundary(&mut self, id: usize, take: bool) -> Option<Env<B>> {
        let (kind, i) = (id / self.ids.n(), id % self.ids.n());
        match (kind, take) {
            (0, true) => self.act[i].take(),
            (0, false) => self.act[i].clone(),
            (1, true) => self.sav[i].take().map(|s| s.boundary),
            (1, false) => self.sav[i].as_ref().map(|s| s.boundary.clone()),
            _ => None,
        }
    }

    /// `δ_i`, taken from `held`.
    fn take_grad(&mut self, id: usize) -> Option<GradMap<B>> {
        (id / self.ids.n() == 2).then(|| self.delta[id % self.ids.n()].take()).flatten()
    }

    /// `ā_i`, taken from `held`.
    fn take_saved(&mut self, id: usize) -> Option<SavedSet<B>> {
        (id / self.ids.n() == 1).then(|| self.sav[id % self.ids.n()].take()).flatten()
    }

    /// Holds what a compute step created.
    fn set(&mut self, id: usize, slot: Slot<B>) {
        let i = id % self.ids.n();
        match slot {
            Slot::Act(env) => self.act[i] = Some(env),
            Slot::Saved(set) => self.sav[i] = Some(set),
            Slot::Grad(map) => self.delta[i] = Some(map),
        }
    }

    /// Handles to the tensor's parts (the device copy stays).
    fn parts(&self, id: usize) -> Parts<B, Part> {
        let (kind, i) = (id / self.ids.n(), id % self.ids.n());
        let boundary = |env: &Env<B>| env.iter().map(|(&t, v)| (Part::Boundary(t), v.clone())).collect::<Vec<_>>();
        match kind {
            0 => self.act[i].as_ref().map(boundary).unwrap_or_default(),
            1 => self.sav[i]
                .as_ref()
                .map(|s| {
                    let mut parts = boundary(&s.boundary);
                    parts.extend(s.inner.iter().map(|(&k, v)| (Part::Inner(k), v.clone())));
                    parts
                })
                .unwrap_or_default(),
            2 => self.delta[i]
                .as_ref()
                .map(|d| d.iter().map(|(&t, g)| (Part::Boundary(t), Value::Float(g.clone()))).collect())
                .unwrap_or_default(),
            _ => Vec::new(),
        }
    }

    /// The tensor's parts, no longer held here.
    fn take(&mut self, id: usize) -> Parts<B, Part> {
        let parts = self.parts(id);
        self.clear(id);
        parts
    }

    /// Holds the tensor again, from its parts.
    fn put(&mut self, id: usize, parts: Parts<B, Part>) {
        let (kind, i) = (id / self.ids.n(), id % self.ids.n());
        let mut boundary = Env::new();
        let mut inner = HashMap::new();
        for (part, v) in parts {
            match part {
                Part::Boundary(t) => boundary.insert(t, v),
                Part::Inner(k) => inner.insert(k, v),
                _ => None,
            };
        }
        match kind {
            0 => self.act[i] = Some(boundary),
            1 => self.sav[i] = Some(SavedSet { boundary, inner }),
            2 => self.delta[i] = Some(boundary.into_iter().filter_map(|(t, v)| Some((t, v.float()?))).collect()),
            _ => {}
        }
    }
}

/// Bytes of each chain tensor as the pool counts them: its tensors at their declared
/// sizes, a view and its root once (as the chain counts data nodes).
fn chain_sizes(p: &Program, ids: Ids, moments: u64) -> Vec<u64> {
    let net = &p.net;
    let roots = |ts: &mut dyn Iterator<Item = TensorId>| {
        let set: std::collections::BTreeSet<TensorId> = ts.map(|t| net.root(t)).collect();
        set.into_iter().map(|t| net.bytes(&net.tensors[t].shape, net.tensors[t].elem)).sum::<u64>()
    };
    let mut sizes = vec![0; ids.count()];
    for (i, stage) in static_sizes(p, moments).into_iter().enumerate() {
        for kind in [WEIGHT, WGRAD, STATE] {
            sizes[ids.stat(kind, i)] = stage[kind];
        }
    }
    for i in 0..ids.n() {
        let b = &p.boundary[i];
        sizes[ids.act(i)] = roots(&mut b.iter().copied());
        let grads = b.iter().copied().filter(|&t| net.tensors[t].requires_grad && net.tensors[t].elem == Elem::Float);
        sizes[ids.grad(i)] = roots(&mut grads.into_iter());
        if i >= 1 {
            // The chain's `xbar[i]` adds to `x[i]` what stage `i-1` makes for its backward;
            // a saved view of an older tensor is counted where that tensor is.
            let saved = &p.stages[i - 1].saved;
            let made_here = |t: TensorId| net.tensors[net.root(t)].producer.is_some_and(|o| p.stage_of[o] == i - 1);
            let tensors = saved.iter().filter_map(|k| match k {
                Key::Tensor(t) if made_here(*t) => Some(*t),
                _ => None,
            });
            let extras: u64 = saved
                .iter()
                .filter_map(|k| if let Key::Extra(o, j) = k { Some((*o, *j)) } else { None })
                .map(|(o, j)| {
                    let declared = net.ops[o].decl.saved.iter().filter_map(|s| match s {
                        Saved::Extra { shape, elem, .. } => Some(net.bytes(shape, *elem)),
                        _ => None,
                    });
                    declared.clone().nth(j).unwrap_or(0)
                })
                .sum();
            sizes[ids.sav(i)] = roots(&mut b.iter().copied().chain(tensors)) + extras;
        }
    }
    sizes
}

/// The chain schedule lowered ([`lower::lower_chain`]) from where the step's static
/// tensors start, refusing what the executor cannot run before any of it runs: an op the
/// lowering refuses, a read of a tensor not on the device, a partial transfer.
fn lower_checked(schedule: &Schedule, l: usize, device: &[[bool; 3]]) -> Result<Vec<Step>, RuntimeError> {
    let ids = Ids::with_statics(l);
    let on = |d: bool| Copies { device: d, host: false };
    let starts: Vec<StageStart> =
        device.iter().map(|d| StageStart { weight: on(d[WEIGHT]), grad: on(d[WGRAD]), state: on(d[STATE]) }).collect();
    let program = lower::lower_chain(&schedule.ops, ids, schedule.periodic, &starts, 1);
    let ops = &schedule.ops;
    for (k, step) in program.steps.iter().enumerate() {
        if let Some(m) = step.missing.filter(|&m| !ids.is_static(m)) {
            return Err(sched_err(k, &ops[k], format!("{:?} is not available", ids.tensor(m))));
        }
        if let Action::Offload { fraction, .. } | Action::Prefetch { fraction, .. } = step.action {
            if fraction != 1.0 {
                return Err(sched_err(
                    k,
                    &ops[k],
                    format!(
                        "fraction {fraction}: the executor moves whole tensors (fraction 1); \
                         partial transfers are a relaxation for the planner only"
                    ),
                ));
            }
        }
    }
    match program.refused {
        Some((k, Refusal::OutOfRange(what))) => Err(sched_err(k, &ops[k], format!("{what} is not in this chain"))),
        Some((k, Refusal::Invalid(why))) => Err(sched_err(k, &ops[k], why)),
        None => Ok(program.steps),
    }
}

/// Where a chain tensor stands with the pools.
#[derive(Debug, Clone, Default)]
struct Track {
    /// Device pool bytes its device copy holds (0: not on the device, or offloaded).
    dev: u64,
    /// The offload whose host copy it has (or is being made).
    host: Option<usize>,
    /// `(until, offload, bytes)`: a device copy kept after an offload for the compute ops
    /// up to `until` that read it.
    hold: Option<(usize, usize, u64)>,
    /// Its prefetch in flight.
    prefetch: Option<usize>,
}

/// A chain step's tensors, their standing with the pools, and the transfer machinery.
struct ChainRun<'s, 'e, B: Backend> {
    held: Held<B>,
    track: Vec<Track>,
    sizes: Vec<u64>,
    xfer: Transfers<'s, 'e, B, Part>,
}

impl<B: Backend> ChainRun<'_, '_, B> {
    /// Waits for the tensor's prefetch in flight, if any.
    fn settle(&mut self, id: usize) -> Result<(), RuntimeError> {
        if let Some(job) = self.track[id].prefetch.take() {
            let parts = self.xfer.wait_prefetch(job)?;
            self.held.put(id, parts);
        }
        Ok(())
    }

    /// Drops the tensor's device copy and gives its bytes back to the pool.
    fn drop_device(&mut self, id: usize) -> Result<(), RuntimeError> {
        self.settle(id)?;
        self.held.clear(id);
        let t = &mut self.track[id];
        if let Some((_, job, bytes)) = t.hold.take() {
            self.xfer.let_go(job, bytes);
        }
        if t.dev > 0 {
            self.xfer.release(std::mem::take(&mut t.dev));
        }
        Ok(())
    }

    /// Releases the tensor: its device copy and its host copy.
    fn release(&mut self, id: usize) -> Result<(), RuntimeError> {
        self.drop_device(id)?;
        if let Some(job) = self.track[id].host.take() {
            self.xfer.drop_host(job);
        }
        Ok(())
    }

    /// Lets go of the device copies kept for reads up to compute op `k`.
    fn let_go_after(&mut self, k: usize) {
        for id in 0..self.track.len() {
            if let Some((until, job, bytes)) = self.track[id].hold {
                if until == k {
                    self.track[id].hold = None;
                    self.held.clear(id);
                    self.xfer.let_go(job, bytes);
                }
            }
        }
    }

    /// Schedule op `k`, an offload of `tensor`.
    fn offload(&mut self, k: usize, op: &Op, id: usize, hold_until: Option<usize>) -> Result<(), RuntimeError> {
        let tensor = self.held.ids.tensor(id);
        self.settle(id)?;
        if !self.held.present(id) || self.track[id].hold.is_some() {
            return Err(sched_err(k, op, format!("{tensor:?} is not on the device")));
        }
        if let Some(old) = self.track[id].host.take() {
            self.xfer.drop_host(old);
        }
        let bytes = std::mem::take(&mut self.track[id].dev);
        let text = op.to_string();
        match hold_until {
            Some(until) => {
                let parts = self.held.parts(id);
                self.xfer.offload(k, &text, parts, bytes, false)?;
                self.track[id].hold = Some((until, k, bytes));
            }
            None => {
                let parts = self.held.take(id);
                self.xfer.offload(k, &text, parts, bytes, true)?;
            }
        }
        self.track[id].host = Some(k);
        Ok(())
    }

    /// Schedule op `k`, a prefetch of `tensor`.
    fn prefetch(&mut self, k: usize, op: &Op, id: usize) -> Result<(), RuntimeError> {
        let tensor = self.held.ids.tensor(id);
        let t = &self.track[id];
        if t.prefetch.is_some() || (self.held.present(id) && t.hold.is_none()) {
            return Err(sched_err(k, op, format!("{tensor:?} is already on the device")));
        }
        let Some(source) = t.host else {
            return Err(sched_err(k, op, format!("{tensor:?} has no host copy to prefetch")));
        };
        if let Some((_, job, bytes)) = self.track[id].hold.take() {
            self.held.clear(id);
            self.xfer.let_go(job, bytes);
        }
        let bytes = self.sizes[id];
        self.xfer.prefetch(k, &op.to_string(), vec![(source, None)], bytes)?;
        self.track[id].prefetch = Some(k);
        self.track[id].dev = bytes;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(text: &str, l: usize, extra: &[(usize, Op)]) -> String {
        let mut schedule = Schedule::from_notation(View::Chain, text).unwrap().resolve_loss(l);
        for &(at, op) in extra {
            schedule.ops.insert(at, op);
        }
        lower_checked(&schedule, l, &vec![[true; 3]; l]).unwrap_err().to_string()
    }

    #[test]
    fn what_the_executor_cannot_run_is_refused_before_anything_runs() {
        let half = Op::Offload { tensor: Tensor::Saved(1), fraction: 0.5 };
        let e = refused("F0all F1all L B1 B0", 2, &[(1, half)]);
        assert!(e.starts_with("schedule op 1 ([offload Saved(1) 0.5])") && e.contains("whole tensors"), "{e}");
        let w = Op::Prefetch { tensor: Tensor::Weight(2), fraction: 1.0 };
        let e = refused("F0all F1all L B1 B0", 2, &[(0, w)]);
        assert!(e.contains("Weight(2) (the chain has 2 stages) is not in this chain"), "{e}");
        let e = refused("F0all L B1 B0", 2, &[]);
        assert!(e.starts_with("schedule op 1 (B2)") && e.contains("Activation(2) is not available"), "{e}");
    }
}
