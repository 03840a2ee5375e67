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

use std::collections::HashMap;

use burn_backend::tensor::FloatTensor;
use burn_backend::{Backend, TensorMetadata};
use pebble_schedule::{ForwardMode, Op, Schedule, Tensor, View};
use pebble_zoo::ops::Saved;
use pebble_zoo::{GraphIndex, TensorId};

use crate::ops::{self, OpCtx};
use crate::program::{Key, Program, Source};
use crate::rng::op_seed;
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
}

/// What a step leaves: the loss and the parameters' gradients.
pub struct StepOutput<B: Backend> {
    /// The loss, a one-element tensor.
    pub loss: FloatTensor<B>,
    /// Each parameter's gradient (`None` if no gradient reached it).
    pub grads: Vec<Option<FloatTensor<B>>>,
}

/// Runs one training step of `schedule` on `program`, on `device`.
pub fn run<B: Backend>(
    program: &Program,
    index: &GraphIndex,
    schedule: &Schedule,
    step: &StepInputs<'_, B>,
    device: &B::Device,
) -> Result<StepOutput<B>, RuntimeError> {
    // Parameter gradients are resident for the whole step, as the planners count them
    // (gradient-accumulation accounting, Zhao §1.1): zeroed at the start, accumulated into.
    let grads = step.params.iter().map(|p| Some(B::float_zeros(p.shape(), device, p.dtype().into()))).collect();
    let mut runner = Runner { p: program, step, device, grads, loss: None };
    match schedule.view {
        View::Chain => runner.chain(schedule)?,
        View::Graph => runner.graph(index, schedule)?,
    }
    let loss = runner.loss.take().ok_or(RuntimeError::NoLoss)?;
    Ok(StepOutput { loss, grads: runner.grads })
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

    fn chain(&mut self, schedule: &Schedule) -> Result<(), RuntimeError> {
        let l = self.p.len();
        let mut act: Vec<Option<Env<B>>> = (0..=l).map(|_| None).collect();
        let mut sav: Vec<Option<SavedSet<B>>> = (0..=l).map(|_| None).collect();
        let mut delta: Vec<Option<GradMap<B>>> = (0..=l).map(|_| None).collect();
        let mut a0 = Env::new();
        for &t in &self.p.boundary[0] {
            a0.insert(t, self.static_value(t)?);
        }
        act[0] = Some(a0);
        for (k, op) in schedule.ops.iter().enumerate() {
            match *op {
                Op::Forward { stage: i, mode } => {
                    if i >= l {
                        return Err(sched_err(k, op, format!("stage {i} out of range (L = {l})")));
                    }
                    let (input, from_act) = match (&act[i], &sav[i]) {
                        (Some(_), _) if mode == ForwardMode::Discard => (act[i].take().expect("checked"), true),
                        (Some(a), _) => (a.clone(), true),
                        (None, Some(s)) => (s.boundary.clone(), false),
                        (None, None) => return Err(sched_err(k, op, format!("a_{i} is not available"))),
                    };
                    let _ = from_act;
                    let grad = mode == ForwardMode::KeepAll;
                    let (out, inner) = self.forward_stage(i, input, grad)?;
                    if grad {
                        sav[i + 1] = Some(SavedSet { boundary: out, inner });
                    } else {
                        act[i + 1] = Some(out);
                    }
                }
                Op::Backward { stage: i } if i == l => {
                    let a_l = match (&act[l], &sav[l]) {
                        (Some(a), _) => a.clone(),
                        (None, Some(s)) => s.boundary.clone(),
                        (None, None) => return Err(sched_err(k, op, format!("a_{l} is not available"))),
                    };
                    act[l] = None;
                    delta[l] = Some(self.loss_stage(&a_l)?);
                }
                Op::Backward { stage: i } => {
                    if i > l {
                        return Err(sched_err(k, op, format!("stage {i} out of range (L = {l})")));
                    }
                    let d = delta[i + 1].take().ok_or_else(|| sched_err(k, op, format!("δ_{} is missing", i + 1)))?;
                    let s = sav[i + 1].take().ok_or_else(|| sched_err(k, op, format!("ā_{} is missing", i + 1)))?;
                    act[i + 1] = None;
                    let a_i = match (act[i].take(), &sav[i]) {
                        (Some(a), _) => a,
                        (None, Some(s)) => s.boundary.clone(),
                        (None, None) => return Err(sched_err(k, op, format!("a_{i} is not available"))),
                    };
                    delta[i] = Some(self.backward_stage(i, d, &a_i, s)?);
                    drop(a_i);
                }
                Op::Free { tensor } => match tensor {
                    Tensor::Activation(i) if i <= l => act[i] = None,
                    Tensor::Saved(i) if i <= l => sav[i] = None,
                    Tensor::Grad(i) if i <= l => delta[i] = None,
                    _ => return Err(sched_err(k, op, "not a chain tensor")),
                },
                Op::Compute { .. } => return Err(sched_err(k, op, "a graph op in a chain schedule")),
                Op::Offload { .. } | Op::Prefetch { .. } => {
                    return Err(sched_err(k, op, "the executor does not move tensors to the host yet"))
                }
            }
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
                _ => return Err(sched_err(k, sop, "not a graph op (compute or free)")),
            }
        }
        Ok(())
    }
}
