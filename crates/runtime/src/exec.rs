//! Running a schedule on real tensors.
//!
//! The executor holds what the simulator tracks, and frees it where the simulator does:
//!
//! * **chain schedules** (Shilova's Table 2.1): `a_i` ([`Tensor::Activation`]), `ā_i`
//!   ([`Tensor::Saved`]: `a_i` plus what stage `i-1`'s backward reads) and `δ_i`
//!   ([`Tensor::Grad`]). `F_i^∅` releases the `a_i` it read; `B_i` releases `δ_{i+1}`,
//!   `ā_{i+1}`, `a_{i+1}` and `a_i`. Within a stage, a tensor lives until its last reader.
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
//! Graph schedules do not move tensors yet: their transfers are refused.

use std::collections::HashMap;

use burn_backend::tensor::FloatTensor;
use burn_backend::{Backend, TensorMetadata};
use pebble_schedule::{ForwardMode, Op, Schedule, Tensor, View};
use pebble_zoo::ops::{Elem, Saved};
use pebble_zoo::{GraphIndex, TensorId};

use crate::ops::{self, OpCtx};
use crate::program::{Key, Program, Source};
use crate::rng::op_seed;
use crate::transfer::{Parts, StageTemporaries, TransferOptions, TransferReport, Transfers};
use crate::{RuntimeError, Value};

type Env<B> = HashMap<TensorId, Value<B>>;
type GradMap<B> = HashMap<TensorId, FloatTensor<B>>;
/// What a stage's forward leaves: the output boundary and the saved tensors.
type StageOut<B> = (Env<B>, HashMap<Key, Value<B>>);

/// `ā_i`: the boundary `a_i` and what stage `i-1`'s backward reads.
struct SavedSet<B: Backend> {
    boundary: Env<B>,
    inner: HashMap<Key, Value<B>>,
}

/// The tensors a step starts with and the parameters it reads.
pub struct StepInputs<'a, B: Backend> {
    /// A value for each step input of the network (tensors without a producer), by id.
    pub inputs: &'a HashMap<TensorId, Value<B>>,
    /// The parameters, in the network's order.
    pub params: &'a [FloatTensor<B>],
    /// The seed of this step's random ops.
    pub seed: u64,
    /// Bytes resident on the device when the step starts (parameters, optimizer state,
    /// the batch): where the device pool starts, with the gradients the step allocates.
    pub resident_bytes: u64,
    /// Each chain stage's temporaries, which the device pool holds while the op runs.
    pub temporaries: &'a StageTemporaries,
}

/// What a step leaves: the loss and the parameters' gradients.
pub struct StepOutput<B: Backend> {
    /// The loss, a one-element tensor.
    pub loss: FloatTensor<B>,
    /// Each parameter's gradient (`None` if no gradient reached it).
    pub grads: Vec<Option<FloatTensor<B>>>,
    /// What the step's transfers did (all zero for a schedule without any).
    pub transfers: TransferReport,
}

/// Runs one training step of `schedule` on `program`, on `device`, with unthrottled
/// transfers and no cap on the device pool.
pub fn run<B: Backend>(
    program: &Program,
    index: &GraphIndex,
    schedule: &Schedule,
    step: &StepInputs<'_, B>,
    device: &B::Device,
) -> Result<StepOutput<B>, RuntimeError> {
    run_with(program, index, schedule, step, device, &TransferOptions::default())
}

/// Runs one training step of `schedule` on `program`, on `device`: transfers over the
/// links of `options`, device memory under its cap.
pub fn run_with<B: Backend>(
    program: &Program,
    index: &GraphIndex,
    schedule: &Schedule,
    step: &StepInputs<'_, B>,
    device: &B::Device,
    options: &TransferOptions,
) -> Result<StepOutput<B>, RuntimeError> {
    // Parameter gradients are resident for the whole step, as the planners count them
    // (gradient-accumulation accounting, Zhao §1.1): zeroed at the start, accumulated into.
    let grads = step.params.iter().map(|p| Some(B::float_zeros(p.shape(), device, p.dtype().into()))).collect();
    let mut runner = Runner { p: program, step, device, grads, loss: None };
    let transfers = match schedule.view {
        View::Chain => runner.chain(schedule, options)?,
        View::Graph => {
            runner.graph(index, schedule)?;
            TransferReport::default()
        }
    };
    let loss = runner.loss.take().ok_or(RuntimeError::NoLoss)?;
    Ok(StepOutput { loss, grads: runner.grads, transfers })
}

struct Runner<'a, B: Backend> {
    p: &'a Program,
    step: &'a StepInputs<'a, B>,
    device: &'a B::Device,
    grads: Vec<Option<FloatTensor<B>>>,
    loss: Option<FloatTensor<B>>,
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

impl<B: Backend> Runner<'_, B> {
    fn ctx(&self, op: usize, grad: bool) -> OpCtx<'_, B> {
        OpCtx { device: self.device, grad, seed: op_seed(self.step.seed, op) }
    }

    fn params_of(&self, op: usize) -> Vec<FloatTensor<B>> {
        self.p.net.ops[op].params.iter().map(|&i| self.step.params[i].clone()).collect()
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
    fn forward_stage(&self, s: usize, mut env: Env<B>, grad: bool) -> Result<StageOut<B>, RuntimeError> {
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
            let out = ops::forward(op, inputs, &self.params_of(o), &self.ctx(o, grad))?;
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
    fn backward_stage(
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
            let params = self.params_of(o);
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
    fn loss_stage(&mut self, a_l: &Env<B>) -> Result<GradMap<B>, RuntimeError> {
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
    /// of [`Transfers`], all of it inside one scope so that nothing outlives the step.
    fn chain(&mut self, schedule: &Schedule, options: &TransferOptions) -> Result<TransferReport, RuntimeError> {
        let l = self.p.len();
        let ids = Ids { n: l + 1 };
        let effects = resolve(&schedule.ops, l)?;
        let sizes = chain_sizes(self.p, ids);
        let mut held = Held::new(ids);
        let mut a0 = Env::new();
        for &t in &self.p.boundary[0] {
            a0.insert(t, self.static_value(t)?);
        }
        held.act[0] = Some(a0);
        let mut track = vec![Track::default(); 3 * ids.n];
        // The pool starts with what the step holds from its start; `a_0` is among it.
        track[ids.act(0)].dev = sizes[ids.act(0)];
        let grads: u64 =
            self.grads.iter().flatten().map(|g| (g.shape().num_elements() * g.dtype().size()) as u64).sum();
        let base = self.step.resident_bytes.saturating_add(grads).max(sizes[ids.act(0)]);
        let device = self.device;
        std::thread::scope(|scope| {
            let xfer = Transfers::new(scope, device, *options, base);
            let mut run = ChainRun { held, track, sizes, xfer };
            let result = self.chain_ops(schedule, &effects, &mut run);
            let ChainRun { held, xfer, .. } = run;
            drop(held);
            let report = xfer.finish(result.is_ok());
            result.and(report)
        })
    }

    fn chain_ops(
        &mut self,
        schedule: &Schedule,
        effects: &[Effect],
        run: &mut ChainRun<'_, '_, B>,
    ) -> Result<(), RuntimeError> {
        let ids = run.held.ids;
        for (k, op) in schedule.ops.iter().enumerate() {
            let eff = &effects[k];
            run.poll()?;
            match *op {
                Op::Forward { .. } | Op::Backward { .. } => {
                    for &r in &eff.reads {
                        run.settle(r)?;
                    }
                    // The output and the op's temporaries must fit in the pool beside
                    // what it holds; the temporaries go back when the op is done.
                    let tmp = self.step.temporaries.of_op(op);
                    if let Some(o) = eff.output {
                        // Made again while held (or kept for a read): the old device copy
                        // goes first; a host copy stays.
                        run.drop_device(o)?;
                        run.xfer.reserve(k, &op.to_string(), run.sizes[o] + tmp)?;
                        run.track[o].dev = run.sizes[o];
                    } else {
                        run.xfer.reserve(k, &op.to_string(), tmp)?;
                    }
                    self.compute(k, op, eff, &mut run.held)?;
                    run.xfer.release(tmp);
                    for &r in &eff.releases {
                        run.release(r)?;
                    }
                    run.let_go_after(k);
                }
                Op::CpuUpdate { .. } => {
                    return Err(sched_err(k, op, "the executor does not run optimizer steps on the CPU yet"))
                }
                Op::Free { tensor } => run.release(ids.of(tensor).expect("resolved"))?,
                Op::Offload { tensor, .. } => run.offload(k, op, tensor, eff.hold_until)?,
                Op::Prefetch { tensor, .. } => run.prefetch(k, op, tensor)?,
                Op::Compute { .. } => unreachable!("resolve refuses graph ops in chain schedules"),
            }
        }
        run.poll()
    }

    /// Runs one compute op of a chain schedule on the tensors `held`, as `eff` resolved it.
    fn compute(&mut self, k: usize, op: &Op, eff: &Effect, h: &mut Held<B>) -> Result<(), RuntimeError> {
        let l = self.p.len();
        let gone = |what: String| sched_err(k, op, format!("{what} is not on the device"));
        // `a_i`, from `ā_i` or (taken if `take`) from `Activation(i)`.
        let a_of = |h: &mut Held<B>, i: usize, take: bool| -> Result<Env<B>, RuntimeError> {
            let a = if eff.a_saved {
                h.sav[i].as_ref().map(|s| s.boundary.clone())
            } else if take {
                h.act[i].take()
            } else {
                h.act[i].clone()
            };
            a.ok_or_else(|| gone(format!("a_{i}")))
        };
        match *op {
            Op::Forward { stage: i, mode } => {
                let input = a_of(h, i, mode == ForwardMode::Discard)?;
                let grad = mode == ForwardMode::KeepAll;
                let (out, inner) = self.forward_stage(i, input, grad)?;
                if grad {
                    h.sav[i + 1] = Some(SavedSet { boundary: out, inner });
                } else {
                    h.act[i + 1] = Some(out);
                }
            }
            Op::Backward { stage: i } if i == l => {
                let a_l = a_of(h, l, true)?;
                h.delta[l] = Some(self.loss_stage(&a_l)?);
            }
            Op::Backward { stage: i } => {
                let d = h.delta[i + 1].take().ok_or_else(|| gone(format!("δ_{}", i + 1)))?;
                let s = h.sav[i + 1].take().ok_or_else(|| gone(format!("ā_{}", i + 1)))?;
                h.act[i + 1] = None;
                let a_i = a_of(h, i, true)?;
                h.delta[i] = Some(self.backward_stage(i, d, &a_i, s)?);
            }
            _ => unreachable!("a compute op"),
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

    fn graph(&mut self, index: &GraphIndex, schedule: &Schedule) -> Result<(), RuntimeError> {
        let net = &self.p.net;
        let mut data: Vec<Option<Value<B>>> = (0..index.data).map(|_| None).collect();
        // Inputs of the step are resident from the start.
        for (t, tensor) in net.tensors.iter().enumerate() {
            if tensor.producer.is_none() && index.tensor[t] != usize::MAX {
                data[index.tensor[t]] = Some(self.static_value(t)?);
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
        for (k, sop) in schedule.ops.iter().enumerate() {
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
                        continue;
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
                        let out = ops::forward(op, inputs, &self.params_of(o), &self.ctx(o, !no_grad))?;
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
                            &self.params_of(o),
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
                }
                Op::Free { tensor: Tensor::Data(d) } => {
                    if d < data.len() {
                        data[d] = None;
                    }
                }
                Op::Offload { .. } | Op::Prefetch { .. } => {
                    return Err(sched_err(k, sop, "the executor moves tensors in chain schedules only"))
                }
                _ => return Err(sched_err(k, sop, "not a graph op (compute or free)")),
            }
        }
        Ok(())
    }
}

// -------------------------------------------------------------------- chain tensors

/// A part of a chain tensor as it travels to the host and back: a boundary tensor (of
/// `a_i`, `ā_i` or `δ_i`) or an inner saved tensor of `ā_i`.
#[derive(Debug, Clone, Copy)]
enum Part {
    Boundary(TensorId),
    Inner(Key),
}

/// Dense ids of the chain tensors `a_i`, `ā_i`, `δ_i` for `i` in `0..n` (`n = L + 1`).
#[derive(Debug, Clone, Copy)]
struct Ids {
    n: usize,
}

impl Ids {
    fn act(self, i: usize) -> usize {
        i
    }
    fn sav(self, i: usize) -> usize {
        self.n + i
    }
    fn grad(self, i: usize) -> usize {
        2 * self.n + i
    }
    fn of(self, t: Tensor) -> Option<usize> {
        match t {
            Tensor::Activation(i) if i < self.n => Some(self.act(i)),
            Tensor::Saved(i) if i < self.n => Some(self.sav(i)),
            Tensor::Grad(i) if i < self.n => Some(self.grad(i)),
            _ => None,
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
            act: (0..ids.n).map(|_| None).collect(),
            sav: (0..ids.n).map(|_| None).collect(),
            delta: (0..ids.n).map(|_| None).collect(),
        }
    }

    fn present(&self, id: usize) -> bool {
        let (kind, i) = (id / self.ids.n, id % self.ids.n);
        match kind {
            0 => self.act[i].is_some(),
            1 => self.sav[i].is_some(),
            _ => self.delta[i].is_some(),
        }
    }

    fn clear(&mut self, id: usize) {
        let (kind, i) = (id / self.ids.n, id % self.ids.n);
        match kind {
            0 => self.act[i] = None,
            1 => self.sav[i] = None,
            _ => self.delta[i] = None,
        }
    }

    /// Handles to the tensor's parts (the device copy stays).
    fn parts(&self, id: usize) -> Parts<B, Part> {
        let (kind, i) = (id / self.ids.n, id % self.ids.n);
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
            _ => self.delta[i]
                .as_ref()
                .map(|d| d.iter().map(|(&t, g)| (Part::Boundary(t), Value::Float(g.clone()))).collect())
                .unwrap_or_default(),
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
        let (kind, i) = (id / self.ids.n, id % self.ids.n);
        let mut boundary = Env::new();
        let mut inner = HashMap::new();
        for (part, v) in parts {
            match part {
                Part::Boundary(t) => boundary.insert(t, v),
                Part::Inner(k) => inner.insert(k, v),
            };
        }
        match kind {
            0 => self.act[i] = Some(boundary),
            1 => self.sav[i] = Some(SavedSet { boundary, inner }),
            _ => self.delta[i] = Some(boundary.into_iter().filter_map(|(t, v)| Some((t, v.float()?))).collect()),
        }
    }
}

/// Bytes of each chain tensor as the pool counts them: its tensors at their declared
/// sizes, a view and its root once (as the chain counts data nodes).
fn chain_sizes(p: &Program, ids: Ids) -> Vec<u64> {
    let net = &p.net;
    let roots = |ts: &mut dyn Iterator<Item = TensorId>| {
        let set: std::collections::BTreeSet<TensorId> = ts.map(|t| net.root(t)).collect();
        set.into_iter().map(|t| net.bytes(&net.tensors[t].shape, net.tensors[t].elem)).sum::<u64>()
    };
    let mut sizes = vec![0; 3 * ids.n];
    for i in 0..ids.n {
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

/// What a chain op does to the chain tensors, resolved before the step runs as the
/// simulator reads Table 2.1: which copy of `a_i` a compute op reads, what it produces and
/// releases; for an offload, the last compute op that still reads the device copy.
#[derive(Debug, Clone, Default)]
struct Effect {
    reads: Vec<usize>,
    /// `a_i` is read from `ā_i` (no `Activation(i)` is held).
    a_saved: bool,
    output: Option<usize>,
    releases: Vec<usize>,
    hold_until: Option<usize>,
}

/// Resolves a chain schedule's ops (see [`Effect`]), refusing the ops the executor
/// cannot run before any of them runs.
fn resolve(ops: &[Op], l: usize) -> Result<Vec<Effect>, RuntimeError> {
    let ids = Ids { n: l + 1 };
    // Held, as the simulator sees it: an offloaded tensor stays readable (its device copy
    // is kept for the reads) until it is prefetched, produced again or released.
    let mut held = vec![false; 3 * ids.n];
    held[ids.act(0)] = true;
    let mut effects: Vec<Effect> = Vec::with_capacity(ops.len());
    let tensor_of = |k: usize, op: &Op, t: Tensor| {
        ids.of(t).ok_or_else(|| match t {
            Tensor::Weight(_) => {
                sched_err(k, op, "weights stay on the device: the executor does not move or free them")
            }
            _ => sched_err(k, op, "not a chain tensor"),
        })
    };
    for (k, op) in ops.iter().enumerate() {
        let a_of = |held: &[bool], i: usize| {
            if held[ids.act(i)] {
                Ok((ids.act(i), false))
            } else if held[ids.sav(i)] {
                Ok((ids.sav(i), true))
            } else {
                Err(sched_err(k, op, format!("a_{i} is not available")))
            }
        };
        let mut e = Effect::default();
        match *op {
            Op::Forward { stage: i, mode } => {
                if i >= l {
                    return Err(sched_err(k, op, format!("stage {i} out of range (L = {l})")));
                }
                let (a, saved) = a_of(&held, i)?;
                e.reads.push(a);
                e.a_saved = saved;
                if mode == ForwardMode::Discard && !saved {
                    e.releases.push(a);
                }
                e.output = Some(if mode == ForwardMode::KeepAll { ids.sav(i + 1) } else { ids.act(i + 1) });
            }
            Op::Backward { stage: i } if i == l => {
                let (a, saved) = a_of(&held, l)?;
                e.reads.push(a);
                e.a_saved = saved;
                e.releases.push(ids.act(l));
                e.output = Some(ids.grad(l));
            }
            Op::Backward { stage: i } => {
                if i > l {
                    return Err(sched_err(k, op, format!("stage {i} out of range (L = {l})")));
                }
                if !held[ids.grad(i + 1)] {
                    return Err(sched_err(k, op, format!("δ_{} is missing", i + 1)));
                }
                if !held[ids.sav(i + 1)] {
                    return Err(sched_err(k, op, format!("ā_{} is missing", i + 1)));
                }
                let (a, saved) = a_of(&held, i)?;
                e.reads = vec![ids.grad(i + 1), ids.sav(i + 1), a];
                e.a_saved = saved;
                e.releases = vec![ids.grad(i + 1), ids.sav(i + 1), ids.act(i + 1)];
                if !saved {
                    e.releases.push(a);
                }
                e.output = Some(ids.grad(i));
            }
            Op::Free { tensor } => e.releases.push(tensor_of(k, op, tensor)?),
            Op::Offload { tensor, fraction } | Op::Prefetch { tensor, fraction } => {
                tensor_of(k, op, tensor)?;
                if fraction != 1.0 {
                    return Err(sched_err(
                        k,
                        op,
                        format!(
                            "fraction {fraction}: the executor moves whole tensors (fraction 1); \
                             partial transfers are a relaxation for the planner only"
                        ),
                    ));
                }
            }
            Op::Compute { .. } => return Err(sched_err(k, op, "a graph op in a chain schedule")),
            Op::CpuUpdate { .. } => {
                return Err(sched_err(k, op, "the executor does not run optimizer steps on the CPU yet"))
            }
        }
        for &r in &e.releases {
            held[r] = false;
        }
        if let Some(o) = e.output {
            held[o] = true;
        }
        effects.push(e);
    }
    // An offload's device copy stays for the compute ops after it that read the tensor,
    // until it is prefetched, freed, produced again or released.
    for k in 0..ops.len() {
        let Op::Offload { tensor, .. } = ops[k] else { continue };
        let id = ids.of(tensor).expect("resolved");
        for j in k + 1..ops.len() {
            if let Op::Prefetch { tensor: t, .. } | Op::Free { tensor: t } = ops[j] {
                if ids.of(t) == Some(id) {
                    break;
                }
            }
            if effects[j].reads.contains(&id) {
                effects[k].hold_until = Some(j);
            }
            if effects[j].output == Some(id) || effects[j].releases.contains(&id) {
                break;
            }
        }
    }
    Ok(effects)
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
    /// Takes in the prefetches that have arrived.
    fn poll(&mut self) -> Result<(), RuntimeError> {
        for (job, parts) in self.xfer.arrived()? {
            if let Some(id) = self.track.iter().position(|t| t.prefetch == Some(job)) {
                self.track[id].prefetch = None;
                self.held.put(id, parts);
            }
        }
        Ok(())
    }

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
    fn offload(&mut self, k: usize, op: &Op, tensor: Tensor, hold_until: Option<usize>) -> Result<(), RuntimeError> {
        let id = self.held.ids.of(tensor).expect("resolved");
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
    fn prefetch(&mut self, k: usize, op: &Op, tensor: Tensor) -> Result<(), RuntimeError> {
        let id = self.held.ids.of(tensor).expect("resolved");
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
        self.xfer.prefetch(k, &op.to_string(), source, bytes)?;
        self.track[id].prefetch = Some(k);
        self.track[id].dev = bytes;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(text: &str, l: usize, extra: &[(usize, Op)]) -> Vec<Op> {
        let mut ops = Schedule::from_notation(View::Chain, text).unwrap().resolve_loss(l).ops;
        for &(at, op) in extra {
            ops.insert(at, op);
        }
        ops
    }

    const OFF1: Op = Op::Offload { tensor: Tensor::Saved(1), fraction: 1.0 };
    const PRE1: Op = Op::Prefetch { tensor: Tensor::Saved(1), fraction: 1.0 };

    #[test]
    fn an_offloaded_saved_set_stays_on_the_device_for_the_forward_that_reads_it() {
        // F0all [offload ā_1] F1all F2all L B2 [prefetch ā_1] B1 B0: F1all reads a_1 from
        // ā_1 (no Activation(1) is held), so the device copy stays until op 2 ends.
        let ops = with("F0all F1all F2all L B2 B1 B0", 3, &[(1, OFF1), (6, PRE1)]);
        let e = resolve(&ops, 3).unwrap();
        assert_eq!(e[1].hold_until, Some(2));
        assert!(e[2].a_saved && e[2].reads == vec![5]); // ā_1 is id L + 1 + 1
                                                        // B1 reads a_1 from ā_1 too, but after the prefetch: no hold reaches it.
        assert!(e[7].a_saved && e[7].reads.contains(&5));
        // With a checkpoint of a_1 held, F1 reads it, and the offload holds nothing.
        let ops = with("F0ck F0all F1all F2all L B2 B1 B0", 3, &[(2, OFF1), (7, PRE1)]);
        let e = resolve(&ops, 3).unwrap();
        assert_eq!(e[2].hold_until, None);
        assert!(!e[3].a_saved);
    }

    #[test]
    fn what_the_executor_cannot_run_is_refused_before_anything_runs() {
        let half = Op::Offload { tensor: Tensor::Saved(1), fraction: 0.5 };
        let e = resolve(&with("F0all F1all L B1 B0", 2, &[(1, half)]), 2).unwrap_err().to_string();
        assert!(e.starts_with("schedule op 1 ([offload Saved(1) 0.5])") && e.contains("whole tensors"), "{e}");
        let w = Op::Prefetch { tensor: Tensor::Weight(0), fraction: 1.0 };
        let e = resolve(&with("F0all F1all L B1 B0", 2, &[(0, w)]), 2).unwrap_err().to_string();
        assert!(e.contains("weights stay on the device"), "{e}");
        let e = resolve(&with("F0all L B1 B0", 2, &[]), 2).unwrap_err().to_string();
        assert!(e.contains("a_2 is not available"), "{e}");
    }
}
