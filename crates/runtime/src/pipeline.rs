//! Pipelined model parallelism in one process (issue 14): a schedule of the pipeline view
//! ([`pebble_schedule::pipeline`]) run by `P` worker threads, one per device, over `m`
//! micro-batches: one training step, the schedule's ops unrolled over micro-batches
//! `0..m` ([`Schedule::unroll`]: a periodic pattern with its fill and drain, a flushed
//! schedule as it is). Each worker runs its device's ops in the order listed.
//!
//! * A worker owns the parameters its chain stages read and their gradients, which are
//!   resident for the whole step (zeroed at its start, accumulated over the micro-batches
//!   in the order the worker runs their backwards). A parameter several pipeline stages
//!   read (a tied embedding) has a copy, and a partial gradient, on each worker holding a
//!   reader; [`PipeRun::grads`] sums the partial gradients at the end of the step.
//! * `F` of a pipeline stage runs its chain stages' forwards with grad (`F_all`, the
//!   executor's own [`ForwardMode::KeepAll`](pebble_schedule::ForwardMode) code), keeping
//!   its input and each chain stage's saved set `ā` for that micro-batch until its `B`
//!   (less the output it sends to another device, unless its own backward reads it).
//!   `B` runs their backwards in reverse, the loss first on the last pipeline stage.
//!   Split backwards (`I`, `W`) are refused.
//! * Activations (the output boundary of `F`) and gradients (`δ` of the input boundary,
//!   from `B`) go to the worker of the next (previous) stage through a channel, when the
//!   sender reaches the schedule's [`Op::Send`]; the receiver blocks until what its pass
//!   reads has come. Two stages on one device hand over in place.
//! * Micro-batch `u` is [`MicroBatches`]' `u`-th synthetic batch, with its own dropout
//!   seed: a network built at the micro-batch size reads it, so single-device training
//!   over the same micro-batches ([`single_device`]) is well defined and, run in the same
//!   order, computes the same numbers.
//!
//! # Memory
//!
//! The process allocator is shared by every thread (and counts a buffer where it is
//! allocated, not where it is used), so it cannot tell the workers apart. Each worker
//! keeps its own pool instead, which counts the bytes of the tensors it holds, at their
//! actual sizes ([`Value::bytes`]), each buffer once however many slots refer to it: its
//! parameters and their gradients, the inputs and saved sets of the micro-batches in
//! flight, what it received and has not used, what it produced and has not sent, and,
//! while a chain stage's pass runs, its inputs and outputs together plus the
//! temporaries the plan declares for it (the session's [`StageTemporaries`], none
//! unless set). The pool is sampled after each chain stage's pass and each receipt; its
//! largest level is the worker's peak, and a level above [`PipeOptions::memory`] fails
//! the step. What a pass allocates inside its kernels and frees before it returns is
//! not seen (the temporaries stand for it).

use std::collections::{HashMap, HashSet};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::time::Instant;

use burn_backend::tensor::FloatTensor;
use burn_backend::{Backend, TensorMetadata};
use pebble_schedule::{Op, Pass, PipeStage, Schedule, View};
use pebble_zoo::{Network, TensorId};

use crate::exec::{self, Env, GradMap, Runner, SavedSet, StepInputs};
use crate::program::{Key, Program, Source};
use crate::rng::{self, SplitMix};
use crate::session::synthetic_batch;
use crate::transfer::StageTemporaries;
use crate::value::{read_floats, sync};
use crate::{RuntimeError, Session, Value};

/// The stream tag of micro-batch `u`'s data.
const DATA_TAG: u64 = 0x6D69_6372_6F64_6174;
/// The stream tag of micro-batch `u`'s dropout seed.
const SEED_TAG: u64 = 0x6D69_6372_6F73_6565;

/// The micro-batches of one step: each a full set of step inputs of a network built at
/// the micro-batch size, with the seed of its random ops.
pub struct MicroBatches<B: Backend> {
    /// Each micro-batch's step inputs (tensors without a producer), by tensor id.
    pub inputs: Vec<HashMap<TensorId, Value<B>>>,
    /// Each micro-batch's seed for its random ops (dropout masks).
    pub seeds: Vec<u64>,
}

impl<B: Backend> MicroBatches<B> {
    /// `count` synthetic batches of `net` (drawn as [`Session`]'s batch is), batch `u`
    /// from the stream `derive_seed(seed, DATA_TAG ^ u)`, its dropout seed
    /// `derive_seed(seed, SEED_TAG ^ u)`.
    pub fn synthetic(net: &Network, seed: u64, count: usize, device: &B::Device) -> MicroBatches<B> {
        let inputs = (0..count)
            .map(|u| synthetic_batch::<B>(net, &mut SplitMix(rng::derive_seed(seed, DATA_TAG ^ u as u64)), device))
            .collect();
        let seeds = (0..count).map(|u| rng::derive_seed(seed, SEED_TAG ^ u as u64)).collect();
        MicroBatches { inputs, seeds }
    }

    /// The number of micro-batches.
    pub fn len(&self) -> usize {
        self.inputs.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.inputs.is_empty()
    }

    fn step<'a>(&'a self, u: usize, temporaries: &'a StageTemporaries) -> StepInputs<'a, B> {
        StepInputs { inputs: &self.inputs[u], seed: self.seeds[u], temporaries, update: None, lowered: None }
    }
}

/// How a pipeline step runs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PipeOptions {
    /// Each device's memory in bytes: a worker whose pool goes above it fails the step
    /// (`None`: uncapped).
    pub memory: Option<u64>,
}

/// What one worker (device) did.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerReport {
    /// The device.
    pub device: usize,
    /// The pipeline stages it runs.
    pub stages: Vec<usize>,
    /// The chain stages it runs (the loss stage `L` with the last).
    pub chain_stages: Vec<usize>,
    /// The peak of its pool: tensors held plus the running pass's declared temporaries.
    pub peak_bytes: u64,
    /// The peak of the tensors it held, temporaries left out.
    pub tensor_peak_bytes: u64,
    /// Its parameters and their gradients, resident for the whole step.
    pub static_bytes: u64,
    /// Passes (`F`, `B`) it ran.
    pub passes: usize,
    /// Sends it made.
    pub sends: usize,
    /// Seconds it spent in passes.
    pub compute_seconds: f64,
    /// Seconds it waited for an activation or a gradient from another worker.
    pub wait_seconds: f64,
}

/// What a pipeline step did.
pub struct PipeRun<B: Backend> {
    /// Each micro-batch's loss, in micro-batch order.
    pub losses: Vec<f32>,
    /// Each parameter's gradient summed over the micro-batches (`None`: none reached
    /// it). A parameter held by several workers gets the sum of their partial gradients,
    /// the worker of the latest chain stage first.
    pub grads: Vec<Option<FloatTensor<B>>>,
    /// Each device's worker, in device order (an idle device reports zeros).
    pub workers: Vec<WorkerReport>,
    /// Wall-clock seconds of the step, threads started and joined, synchronized.
    pub seconds: f64,
}

/// Single-device training over the same micro-batches ([`single_device`]).
pub struct Accumulated<B: Backend> {
    /// Each micro-batch's loss.
    pub losses: Vec<f32>,
    /// Each parameter's gradient, summed over the micro-batches in order.
    pub grads: Vec<Option<FloatTensor<B>>>,
    /// Wall-clock seconds, synchronized.
    pub seconds: f64,
}

/// Runs a chain `schedule` (store-all, or any other) on `session`'s device once per
/// micro-batch, in order, without updating anything, and sums the gradients: each
/// parameter's starts at zero and the micro-batches' gradients are added to it in order,
/// as a pipeline worker accumulates them. The session's parameters must all be on the
/// device (as [`Session::new`] leaves them).
pub fn single_device<B: Backend>(
    session: &mut Session<B>,
    schedule: &Schedule,
    batches: &MicroBatches<B>,
) -> Result<Accumulated<B>, RuntimeError> {
    if schedule.view != View::Chain {
        return Err(RuntimeError::Unsupported {
            op: "schedule".into(),
            kind: "single-device reference",
            why: format!("runs chain schedules, not {:?} ones", schedule.view),
        });
    }
    not_on_device_err(session)?;
    sync::<B>(&session.device)?;
    let start = Instant::now();
    let mut acc: Vec<Option<FloatTensor<B>>> = zero_grads::<B>(&session.program, &session.device, |_| true);
    let mut losses = Vec::with_capacity(batches.len());
    for u in 0..batches.len() {
        let step = batches.step(u, &session.temporaries);
        let (program, index, device) = (&session.program, &session.index, &session.device);
        let out = exec::run_with(program, index, schedule, &step, &mut session.statics, device, &Default::default())?;
        losses.push(read_floats::<B>(out.loss)?.first().copied().unwrap_or(f32::NAN));
        for (slot, g) in acc.iter_mut().zip(out.grads) {
            if let Some(g) = g {
                *slot = Some(match slot.take() {
                    Some(a) => B::float_add(a, g),
                    None => g,
                });
            }
        }
    }
    sync::<B>(&session.device)?;
    Ok(Accumulated { losses, grads: acc, seconds: start.elapsed().as_secs_f64() })
}

fn not_on_device_err<B: Backend>(session: &Session<B>) -> Result<(), RuntimeError> {
    if session.statics.all_on_device() && session.statics.params.iter().all(Option::is_some) {
        Ok(())
    } else {
        Err(RuntimeError::Schedule {
            index: 0,
            op: "the step's start".into(),
            why: "a pipeline step (and its single-device reference) needs every parameter on the device".into(),
        })
    }
}

/// Zeroed gradients of the parameters `keep` selects.
fn zero_grads<B: Backend>(
    p: &Program,
    device: &B::Device,
    keep: impl Fn(usize) -> bool,
) -> Vec<Option<FloatTensor<B>>> {
    p.net
        .params
        .iter()
        .enumerate()
        .map(|(q, param)| keep(q).then(|| crate::value::zeros::<B>(param.shape.clone(), device)))
        .collect()
}

/// One op of a device's program: which schedule op, on which absolute micro-batch.
#[derive(Debug, Clone, Copy)]
struct Step {
    index: usize,
    micro: i64,
    op: Op,
}

/// Each device's ops over micro-batches `0..count`, checked: runs on their stage's
/// device, sends between the right devices, no split backward, every pass of every
/// micro-batch exactly once, and an order in which every device reaches its end (sends
/// never block, so this dry run is the real run's order, up to timing).
fn programs(schedule: &Schedule, chain_len: usize, count: usize) -> Result<Vec<Vec<Step>>, RuntimeError> {
    let bad = |index: usize, why: String| RuntimeError::Schedule {
        index,
        op: schedule.ops.get(index).map_or_else(|| "the schedule".to_string(), ToString::to_string),
        why,
    };
    if schedule.view != View::Pipeline {
        return Err(RuntimeError::Unsupported {
            op: "schedule".into(),
            kind: "pipeline executor",
            why: format!("runs pipeline schedules, not {:?} ones", schedule.view),
        });
    }
    let stages = &schedule.stages;
    let n = stages.len();
    let devices = schedule.devices.unwrap_or(1);
    let mut next = 0;
    for (i, st) in stages.iter().enumerate() {
        if st.first != next || st.last < st.first || st.device >= devices {
            return Err(bad(usize::MAX, format!("stage {i} does not continue the chain in order on a device")));
        }
        next = st.last + 1;
    }
    if n == 0 || next != chain_len {
        return Err(bad(usize::MAX, format!("the stages cover {next} chain stages, the network has {chain_len}")));
    }
    let mut out = vec![Vec::new(); devices];
    for u in schedule.unroll(count) {
        let op = schedule.ops[u.op];
        let device = match op {
            Op::Run { device, stage, pass, .. } => {
                if stage >= n || stages[stage].device != device {
                    return Err(bad(u.op, format!("stage {stage} does not run on device {device}")));
                }
                if matches!(pass, Pass::I | Pass::W) {
                    return Err(RuntimeError::Unsupported {
                        op: op.to_string(),
                        kind: "split backward",
                        why: "the pipeline executor runs whole backwards (B) only".into(),
                    });
                }
                device
            }
            Op::Send { from, to, stage, grad, .. } => {
                let peer = if grad { stage.checked_sub(1) } else { Some(stage + 1).filter(|&s| s < n) };
                match peer {
                    Some(peer)
                        if stage < n && (from, to) == (stages[stage].device, stages[peer].device) && from != to =>
                    {
                        from
                    }
                    _ => return Err(bad(u.op, "a send between devices that do not hold its stages".into())),
                }
            }
            _ => return Err(bad(u.op, "a pipeline schedule runs only `run` and `send` ops".into())),
        };
        out[device].push(Step { index: u.op, micro: u.micro, op });
    }
    // The dry run.
    let mut forward: HashSet<(usize, i64)> = HashSet::new();
    let mut backward: HashSet<(usize, i64)> = HashSet::new();
    let mut sent: HashSet<(usize, i64, bool)> = HashSet::new();
    let mut head = vec![0usize; devices];
    loop {
        let mut moved = false;
        for d in 0..devices {
            while let Some(step) = out[d].get(head[d]) {
                let u = step.micro;
                let local = |a: usize, b: usize| stages[a].device == stages[b].device;
                let (ready, fresh) = match step.op {
                    Op::Run { stage: s, pass: Pass::F, .. } => {
                        let ready = s == 0
                            || if local(s - 1, s) {
                                forward.contains(&(s - 1, u))
                            } else {
                                sent.contains(&(s - 1, u, false))
                            };
                        (ready, ready && forward.insert((s, u)))
                    }
                    Op::Run { stage: s, .. } => {
                        let after = s + 1 == n
                            || if local(s + 1, s) {
                                backward.contains(&(s + 1, u))
                            } else {
                                sent.contains(&(s + 1, u, true))
                            };
                        let ready = forward.contains(&(s, u)) && after;
                        (ready, ready && backward.insert((s, u)))
                    }
                    Op::Send { stage: s, grad, .. } => {
                        let ready = if grad { backward.contains(&(s, u)) } else { forward.contains(&(s, u)) };
                        (ready, ready && sent.insert((s, u, grad)))
                    }
                    _ => unreachable!("checked above"),
                };
                if !ready {
                    break;
                }
                if !fresh {
                    return Err(bad(step.index, format!("runs twice for micro-batch {u}")));
                }
                head[d] += 1;
                moved = true;
            }
        }
        if (0..devices).all(|d| head[d] == out[d].len()) {
            break;
        }
        if !moved {
            let waiting: Vec<String> = (0..devices)
                .filter_map(|d| {
                    out[d].get(head[d]).map(|s| format!("device {d} at {} (micro-batch {})", s.op, s.micro))
                })
                .collect();
            return Err(bad(
                usize::MAX,
                format!("deadlock: every device waits for an input that never comes ({})", waiting.join(", ")),
            ));
        }
    }
    for s in 0..n {
        for u in 0..count as i64 {
            for (done, pass) in [(&forward, "F"), (&backward, "B")] {
                if !done.contains(&(s, u)) {
                    return Err(bad(usize::MAX, format!("stage {s} never runs {pass} for micro-batch {u}")));
                }
            }
        }
    }
    Ok(out)
}

/// What a worker's pool counts, each buffer once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Slot {
    Param(usize),
    Grad(usize),
    /// A forward tensor or saved extra of a micro-batch.
    Act(i64, Key),
    /// The gradient of tensor `t` at cut `c` (`δ_c`) of a micro-batch.
    Delta(i64, usize, TensorId),
}

/// A worker's memory: reference-counted slots, their bytes, the level and its peaks.
struct Pool {
    held: HashMap<Slot, (u64, usize)>,
    level: u64,
    peak: u64,
    tensor_peak: u64,
    cap: Option<u64>,
}

impl Pool {
    fn hold(&mut self, slot: Slot, bytes: u64) {
        let e = self.held.entry(slot).or_insert((bytes, 0));
        if e.1 == 0 {
            self.level += bytes;
        }
        e.1 += 1;
    }

    fn release(&mut self, slot: Slot) {
        if let Some(e) = self.held.get_mut(&slot) {
            e.1 -= 1;
            if e.1 == 0 {
                self.level -= e.0;
                self.held.remove(&slot);
            }
        }
    }

    /// Samples the level, with `tmp` bytes of temporaries on top.
    fn sample(&mut self, tmp: u64, d: usize, what: &dyn Fn() -> String) -> Result<(), RuntimeError> {
        self.tensor_peak = self.tensor_peak.max(self.level);
        let now = self.level + tmp;
        self.peak = self.peak.max(now);
        match self.cap {
            Some(cap) if now > cap => Err(RuntimeError::Schedule {
                index: usize::MAX,
                op: what(),
                why: format!("device {d} holds {now} bytes, over its memory of {cap} bytes"),
            }),
            _ => Ok(()),
        }
    }
}

fn float_bytes<B: Backend>(t: &FloatTensor<B>) -> u64 {
    (t.shape().num_elements() * t.dtype().size()) as u64
}

/// An activation or a gradient on its way between stages.
enum Payload<B: Backend> {
    Act(Env<B>),
    Grad(GradMap<B>),
}

impl<B: Backend> Payload<B> {
    /// The slots it holds, with their bytes: `key` is its producer's (stage, micro-batch,
    /// gradient), `cut` the boundary it crosses.
    fn slots(&self, micro: i64, cut: usize) -> Vec<(Slot, u64)> {
        match self {
            Payload::Act(env) => env.iter().map(|(&t, v)| (Slot::Act(micro, Key::Tensor(t)), v.bytes())).collect(),
            Payload::Grad(g) => g.iter().map(|(&t, v)| (Slot::Delta(micro, cut, t), float_bytes::<B>(v))).collect(),
        }
    }
}

enum Msg<B: Backend> {
    /// What stage `key.0` produced for micro-batch `key.1` (`key.2`: a gradient).
    Data((usize, i64, bool), Payload<B>),
    /// Another worker failed: stop.
    Abort,
}

/// Tells every worker but `d` to stop.
fn abort_peers<B: Backend>(d: usize, tx: &[Sender<Msg<B>>]) {
    for (peer, tx) in tx.iter().enumerate() {
        if peer != d {
            let _ = tx.send(Msg::Abort);
        }
    }
}

/// Stops the other workers if worker `d` unwinds.
struct AbortOnPanic<B: Backend> {
    d: usize,
    tx: Vec<Sender<Msg<B>>>,
}

impl<B: Backend> Drop for AbortOnPanic<B> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            abort_peers(self.d, &self.tx);
        }
    }
}

/// A micro-batch's state on a pipeline stage between its `F` and its `B`: the stage's
/// input `a_first` and each chain stage's saved set `ā_{s+1}`.
struct Stash<B: Backend> {
    input: Env<B>,
    saved: Vec<SavedSet<B>>,
}

struct Worker<'a, B: Backend> {
    d: usize,
    p: &'a Program,
    stages: &'a [PipeStage],
    batches: &'a MicroBatches<B>,
    temporaries: &'a StageTemporaries,
    device: &'a B::Device,
    params: Vec<Option<FloatTensor<B>>>,
    grads: Vec<Option<FloatTensor<B>>>,
    stale: Vec<bool>,
    stash: HashMap<(usize, i64), Stash<B>>,
    inbox: HashMap<(usize, i64, bool), Payload<B>>,
    outbox: HashMap<(usize, i64, bool), Payload<B>>,
    pool: Pool,
    losses: Vec<(i64, f32)>,
    rx: Receiver<Msg<B>>,
    tx: Vec<Sender<Msg<B>>>,
    report: WorkerReport,
}

/// A worker's error, and whether it only stopped because another failed.
type WorkerError = (RuntimeError, bool);

impl<B: Backend> Worker<'_, B> {
    /// The cut a payload crosses: after its producer for an activation, before it for a
    /// gradient.
    fn cut(&self, key: (usize, i64, bool)) -> usize {
        let st = &self.stages[key.0];
        if key.2 {
            st.first
        } else {
            st.last + 1
        }
    }

    fn hold_payload(&mut self, key: (usize, i64, bool), payload: &Payload<B>) {
        for (slot, bytes) in payload.slots(key.1, self.cut(key)) {
            self.pool.hold(slot, bytes);
        }
    }

    fn release_payload(&mut self, key: (usize, i64, bool), payload: &Payload<B>) {
        for (slot, _) in payload.slots(key.1, self.cut(key)) {
            self.pool.release(slot);
        }
    }

    fn hold_saved(&mut self, u: i64, s: &SavedSet<B>) {
        for (&t, v) in &s.boundary {
            self.pool.hold(Slot::Act(u, Key::Tensor(t)), v.bytes());
        }
        for (&k, v) in &s.inner {
            self.pool.hold(Slot::Act(u, k), v.bytes());
        }
    }

    /// Runs `f` on a runner of micro-batch `u` over this worker's parameters and
    /// gradients; returns its result and the loss, if it computed one.
    fn with_runner<R>(
        &mut self,
        u: i64,
        f: impl FnOnce(&mut Runner<'_, B>) -> Result<R, RuntimeError>,
    ) -> Result<(R, Option<FloatTensor<B>>), RuntimeError> {
        let step = self.batches.step(u as usize, self.temporaries);
        let mut runner = Runner {
            p: self.p,
            step: &step,
            device: self.device,
            params: std::mem::take(&mut self.params),
            moments: Vec::new(),
            stale: std::mem::take(&mut self.stale),
            grads: std::mem::take(&mut self.grads),
            zeroed: Vec::new(),
            loss: None,
            op_seconds: Vec::new(),
        };
        let out = f(&mut runner);
        self.params = std::mem::take(&mut runner.params);
        self.stale = std::mem::take(&mut runner.stale);
        self.grads = std::mem::take(&mut runner.grads);
        out.map(|r| (r, runner.loss.take()))
    }

    /// The payload `key` from the inbox, waiting for it on the channel.
    fn take_input(&mut self, key: (usize, i64, bool)) -> Result<Payload<B>, WorkerError> {
        loop {
            if let Some(p) = self.inbox.remove(&key) {
                return Ok(p);
            }
            let start = Instant::now();
            let msg = self.rx.recv();
            self.report.wait_seconds += start.elapsed().as_secs_f64();
            match msg {
                Ok(Msg::Data(k, payload)) => {
                    self.hold_payload(k, &payload);
                    let what = || format!("receiving from stage {} (micro-batch {})", k.0, k.1);
                    self.pool.sample(0, self.d, &what).map_err(|e| (e, false))?;
                    self.inbox.insert(k, payload);
                }
                Ok(Msg::Abort) | Err(_) => {
                    let e = RuntimeError::Schedule {
                        index: usize::MAX,
                        op: format!("device {}", self.d),
                        why: "stopped: another device failed".into(),
                    };
                    return Err((e, true));
                }
            }
        }
    }

    /// Hands `payload` (produced by stage `key.0`) to the stage that reads it: in place
    /// if that stage is on this device, to the outbox for a send otherwise.
    fn hand_over(&mut self, key: (usize, i64, bool), payload: Payload<B>) {
        let reader = if key.2 { key.0 - 1 } else { key.0 + 1 };
        if self.stages[reader].device == self.d {
            self.inbox.insert(key, payload);
        } else {
            self.outbox.insert(key, payload);
        }
    }

    fn run(&mut self, program: &[Step]) -> Result<(), WorkerError> {
        for step in program {
            let at = |e: RuntimeError| match e {
                RuntimeError::Schedule { index: usize::MAX, op, why } => (
                    RuntimeError::Schedule {
                        index: step.index,
                        op: step.op.to_string(),
                        why: format!("micro-batch {}: {op}: {why}", step.micro),
                    },
                    false,
                ),
                e => (e, false),
            };
            match step.op {
                Op::Run { stage, pass: Pass::F, .. } => {
                    let start = Instant::now();
                    self.forward(stage, step.micro).map_err(|e| match e {
                        (e, false) => at(e),
                        e => e,
                    })?;
                    self.report.compute_seconds += start.elapsed().as_secs_f64();
                    self.report.passes += 1;
                }
                Op::Run { stage, .. } => {
                    let start = Instant::now();
                    self.backward(stage, step.micro).map_err(|e| match e {
                        (e, false) => at(e),
                        e => e,
                    })?;
                    self.report.compute_seconds += start.elapsed().as_secs_f64();
                    self.report.passes += 1;
                }
                Op::Send { to, stage, grad, .. } => {
                    let key = (stage, step.micro, grad);
                    let payload = self.outbox.remove(&key).ok_or_else(|| {
                        at(RuntimeError::Schedule {
                            index: usize::MAX,
                            op: format!("device {}", self.d),
                            why: "sends what it has not produced".into(),
                        })
                    })?;
                    self.release_payload(key, &payload);
                    // A worker that failed has left: its error is the step's.
                    let _ = self.tx[to].send(Msg::Data(key, payload));
                    self.report.sends += 1;
                }
                _ => unreachable!("programs() keeps runs and sends"),
            }
        }
        Ok(())
    }

    /// `F` of pipeline stage `stage` on micro-batch `u`.
    fn forward(&mut self, stage: usize, u: i64) -> Result<(), WorkerError> {
        let st = self.stages[stage];
        let input: Env<B> = if stage == 0 {
            let inputs = &self.batches.inputs[u as usize];
            let mut env = Env::new();
            for &t in &self.p.boundary[0] {
                let v = inputs.get(&t).cloned().ok_or_else(|| {
                    (RuntimeError::MissingInput { tensor: self.p.net.tensors[t].name.clone() }, false)
                })?;
                self.pool.hold(Slot::Act(u, Key::Tensor(t)), v.bytes());
                env.insert(t, v);
            }
            env
        } else {
            match self.take_input((stage - 1, u, false))? {
                Payload::Act(env) => env,
                Payload::Grad(_) => unreachable!("keyed as an activation"),
            }
        };
        let mut saved = Vec::with_capacity(st.last - st.first + 1);
        let mut env = input.clone();
        for s in st.first..=st.last {
            let ((out, inner), _) = self.with_runner(u, |r| r.forward_stage(s, env, true)).map_err(|e| (e, false))?;
            let set = SavedSet { boundary: out, inner };
            self.hold_saved(u, &set);
            let tmp = self.temporaries.forward.get(s).copied().unwrap_or(0);
            self.pool.sample(tmp, self.d, &|| format!("the forward of chain stage {s}")).map_err(|e| (e, false))?;
            env = set.boundary.clone();
            saved.push(set);
        }
        if stage + 1 < self.stages.len() {
            let key = (stage, u, false);
            let payload = Payload::Act(env);
            self.hold_payload(key, &payload);
            self.hand_over(key, payload);
            if self.stages[stage + 1].device != self.d {
                // The output goes to another device: keep here only what this stage's
                // own backward reads of it.
                let reads = &self.p.stages[st.last].backward_reads;
                let set = saved.last_mut().expect("a stage has a chain stage");
                let read = |t: TensorId| {
                    reads.values().flatten().any(|src| matches!(src, Source::Saved(Key::Tensor(x)) if *x == t))
                };
                let dropped: Vec<TensorId> = set.boundary.keys().copied().filter(|&t| !read(t)).collect();
                for t in dropped {
                    set.boundary.remove(&t);
                    self.pool.release(Slot::Act(u, Key::Tensor(t)));
                }
            }
        }
        self.stash.insert((stage, u), Stash { input, saved });
        Ok(())
    }

    /// `B` of pipeline stage `stage` on micro-batch `u` (the loss first on the last).
    fn backward(&mut self, stage: usize, u: i64) -> Result<(), WorkerError> {
        let st = self.stages[stage];
        let l = self.p.len();
        let Stash { input, mut saved } = self.stash.remove(&(stage, u)).ok_or_else(|| {
            let e = RuntimeError::Schedule {
                index: usize::MAX,
                op: format!("device {}", self.d),
                why: "runs B before F".into(),
            };
            (e, false)
        })?;
        let mut delta: GradMap<B> = if stage + 1 == self.stages.len() {
            let a_l = saved.last().expect("a stage has a chain stage").boundary.clone();
            let (delta, loss) = self.with_runner(u, |r| r.loss_stage(&a_l)).map_err(|e| (e, false))?;
            let loss = read_floats::<B>(loss.ok_or((RuntimeError::NoLoss, false))?).map_err(|e| (e, false))?;
            self.losses.push((u, loss.first().copied().unwrap_or(f32::NAN)));
            for (&t, g) in &delta {
                self.pool.hold(Slot::Delta(u, l, t), float_bytes::<B>(g));
            }
            let tmp = self.temporaries.backward.get(l).copied().unwrap_or(0);
            self.pool.sample(tmp, self.d, &|| "the loss".to_string()).map_err(|e| (e, false))?;
            delta
        } else {
            match self.take_input((stage + 1, u, true))? {
                Payload::Grad(g) => g,
                Payload::Act(_) => unreachable!("keyed as a gradient"),
            }
        };
        for s in (st.first..=st.last).rev() {
            let set = saved.pop().expect("one saved set per chain stage");
            let a_s = match saved.last() {
                Some(before) => before.boundary.clone(),
                None => input.clone(),
            };
            let old: Vec<TensorId> = delta.keys().copied().collect();
            let slots: Vec<Slot> = set
                .boundary
                .keys()
                .map(|&t| Slot::Act(u, Key::Tensor(t)))
                .chain(set.inner.keys().map(|&k| Slot::Act(u, k)))
                .collect();
            let (new, _) = self.with_runner(u, |r| r.backward_stage(s, delta, &a_s, set)).map_err(|e| (e, false))?;
            for (&t, g) in &new {
                self.pool.hold(Slot::Delta(u, s, t), float_bytes::<B>(g));
            }
            let tmp = self.temporaries.backward.get(s).copied().unwrap_or(0);
            self.pool.sample(tmp, self.d, &|| format!("the backward of chain stage {s}")).map_err(|e| (e, false))?;
            for t in old {
                self.pool.release(Slot::Delta(u, s + 1, t));
            }
            for slot in slots {
                self.pool.release(slot);
            }
            delta = new;
        }
        for &t in input.keys() {
            self.pool.release(Slot::Act(u, Key::Tensor(t)));
        }
        drop(input);
        if stage > 0 {
            self.hand_over((stage, u, true), Payload::Grad(delta));
        } else {
            for &t in delta.keys() {
                self.pool.release(Slot::Delta(u, 0, t));
            }
        }
        Ok(())
    }
}

/// Runs one step of the pipeline `schedule` over `batches` (one micro-batch per entry)
/// with one worker thread per device, on `session`'s network, parameters and device,
/// without updating anything: the losses, the gradients summed over the micro-batches,
/// and what each worker held. The session's parameters must all be on the device.
pub fn run<B: Backend>(
    session: &Session<B>,
    schedule: &Schedule,
    batches: &MicroBatches<B>,
    options: &PipeOptions,
) -> Result<PipeRun<B>, RuntimeError> {
    let p = &session.program;
    let l = p.len();
    let programs = programs(schedule, l, batches.len())?;
    not_on_device_err(session)?;
    let stages = &schedule.stages;
    let devices = programs.len();
    // Each device's chain stages (the loss stage with the last) and parameters.
    let chain_of = |d: usize| -> Vec<usize> {
        let mut c: Vec<usize> = stages.iter().filter(|s| s.device == d).flat_map(|s| s.first..=s.last).collect();
        if c.contains(&(l - 1)) {
            c.push(l);
        }
        c.sort_unstable();
        c
    };
    let device = &session.device;
    let temporaries = &session.temporaries;
    let statics = &session.statics.params;
    sync::<B>(device)?;
    let start = Instant::now();
    let (txs, rxs): (Vec<_>, Vec<_>) = (0..devices).map(|_| channel::<Msg<B>>()).unzip();
    let results: Vec<Result<Worker<'_, B>, WorkerError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = rxs
            .into_iter()
            .enumerate()
            .map(|(d, rx)| {
                let chain = chain_of(d);
                let reads: Vec<bool> =
                    (0..p.net.params.len()).map(|q| p.readers[q].iter().any(|s| chain.contains(s))).collect();
                let tx = txs.clone();
                let program = &programs[d];
                let params: Vec<Option<FloatTensor<B>>> =
                    statics.iter().enumerate().map(|(q, t)| t.clone().filter(|_| reads[q])).collect();
                scope.spawn(move || {
                    // A worker that panics stops the others, which would wait for it forever.
                    let _guard = AbortOnPanic { d, tx: tx.clone() };
                    let grads = zero_grads::<B>(p, device, |q| reads[q]);
                    let mut pool =
                        Pool { held: HashMap::new(), level: 0, peak: 0, tensor_peak: 0, cap: options.memory };
                    for (q, t) in params.iter().enumerate() {
                        if let Some(t) = t {
                            pool.hold(Slot::Param(q), float_bytes::<B>(t));
                            pool.hold(Slot::Grad(q), float_bytes::<B>(t));
                        }
                    }
                    let static_bytes = pool.level;
                    let report = WorkerReport {
                        device: d,
                        stages: (0..stages.len()).filter(|&s| stages[s].device == d).collect(),
                        chain_stages: chain,
                        peak_bytes: 0,
                        tensor_peak_bytes: 0,
                        static_bytes,
                        passes: 0,
                        sends: 0,
                        compute_seconds: 0.0,
                        wait_seconds: 0.0,
                    };
                    let mut w = Worker {
                        d,
                        p,
                        stages,
                        batches,
                        temporaries,
                        device,
                        stale: vec![false; params.len()],
                        params,
                        grads,
                        stash: HashMap::new(),
                        inbox: HashMap::new(),
                        outbox: HashMap::new(),
                        pool,
                        losses: Vec::new(),
                        rx,
                        tx,
                        report,
                    };
                    let result = w
                        .pool
                        .sample(0, d, &|| "the parameters and their gradients".to_string())
                        .map_err(|e| (e, false))
                        .and_then(|()| w.run(program))
                        .and_then(|()| sync::<B>(device).map_err(|e| (e, false)));
                    match result {
                        Ok(()) => Ok(w),
                        Err(e) => {
                            abort_peers(d, &w.tx);
                            Err(e)
                        }
                    }
                })
            })
            .collect();
        drop(txs);
        handles.into_iter().map(|h| h.join().expect("a pipeline worker panicked")).collect()
    });
    let seconds = start.elapsed().as_secs_f64();
    let mut workers = Vec::with_capacity(devices);
    let mut first_abort = None;
    for r in results {
        match r {
            Ok(w) => workers.push(w),
            Err((e, false)) => return Err(e),
            Err((e, true)) => first_abort = first_abort.or(Some(e)),
        }
    }
    if let Some(e) = first_abort {
        return Err(e);
    }
    // Losses by micro-batch.
    let mut losses = vec![f32::NAN; batches.len()];
    for w in &workers {
        for &(u, loss) in &w.losses {
            losses[u as usize] = loss;
        }
    }
    // Gradients: the partial sums of the workers, the latest chain stage's first.
    let mut order: Vec<usize> = (0..workers.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(workers[i].report.chain_stages.last().copied()));
    let mut grads: Vec<Option<FloatTensor<B>>> = vec![None; p.net.params.len()];
    let mut reports = Vec::with_capacity(devices);
    for &i in &order {
        for (q, g) in std::mem::take(&mut workers[i].grads).into_iter().enumerate() {
            if let Some(g) = g {
                grads[q] = Some(match grads[q].take() {
                    Some(acc) => B::float_add(acc, g),
                    None => g,
                });
            }
        }
    }
    for mut w in workers {
        w.report.peak_bytes = w.pool.peak;
        w.report.tensor_peak_bytes = w.pool.tensor_peak;
        reports.push(w.report);
    }
    reports.sort_by_key(|r| r.device);
    sync::<B>(device)?;
    Ok(PipeRun { losses, grads, workers: reports, seconds })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(device: usize, stage: usize, micro: i64, pass: Pass) -> Op {
        Op::Run { device, stage, micro, pass }
    }

    /// Two stages (chain stages 0..=1 and 2) on two devices over `k` micro-batches,
    /// with `ops` as given and their sends.
    fn two_stages(k: usize, ops: Vec<Op>) -> Schedule {
        let stages = vec![PipeStage { first: 0, last: 1, device: 0 }, PipeStage { first: 2, last: 2, device: 1 }];
        Schedule::pipeline(2, k, stages, ops).with_sends()
    }

    #[test]
    fn each_device_runs_its_ops_of_the_unrolled_schedule() {
        use Pass::{B, F};
        let s = two_stages(
            2,
            vec![
                run(0, 0, 0, F),
                run(0, 0, 1, F),
                run(1, 1, 0, F),
                run(1, 1, 0, B),
                run(1, 1, 1, F),
                run(1, 1, 1, B),
                run(0, 0, 0, B),
                run(0, 0, 1, B),
            ],
        );
        let p = programs(&s, 3, 2).unwrap();
        let text = |d: usize| p[d].iter().map(|s| format!("{}@{}", s.op, s.micro)).collect::<Vec<_>>();
        assert_eq!(p[0].len(), 4 + 2, "{:?}", text(0));
        assert_eq!(p[1].len(), 4 + 2, "{:?}", text(1));
        assert!(p[0].iter().all(|s| matches!(s.op, Op::Run { device: 0, .. } | Op::Send { from: 0, .. })));
    }

    #[test]
    fn a_schedule_that_cannot_finish_is_refused_before_it_runs() {
        use Pass::{B, F};
        // Device 0 waits for the gradient before it sends its activation.
        let mut s = two_stages(1, vec![run(0, 0, 0, F), run(1, 1, 0, F), run(1, 1, 0, B), run(0, 0, 0, B)]);
        let send = s.ops.iter().position(|o| matches!(o, Op::Send { grad: false, .. })).unwrap();
        let op = s.ops.remove(send);
        s.ops.push(op);
        let e = programs(&s, 3, 1).unwrap_err().to_string();
        assert!(e.contains("deadlock"), "{e}");
        // A micro-batch the schedule never runs.
        let s = two_stages(2, vec![run(0, 0, 0, F), run(1, 1, 0, F), run(1, 1, 0, B), run(0, 0, 0, B)]);
        let e = programs(&s, 3, 2).unwrap_err().to_string();
        assert!(e.contains("stage 0 never runs F for micro-batch 1"), "{e}");
        // Stages that do not cover the network's chain.
        let e = programs(&s, 4, 1).unwrap_err().to_string();
        assert!(e.contains("the stages cover 3 chain stages, the network has 4"), "{e}");
        // Split backwards.
        let s = two_stages(
            1,
            vec![run(0, 0, 0, F), run(1, 1, 0, F), run(1, 1, 0, Pass::I), run(1, 1, 0, Pass::W), run(0, 0, 0, B)],
        );
        let e = programs(&s, 3, 1).unwrap_err().to_string();
        assert!(e.contains("whole backwards (B) only"), "{e}");
    }
}
