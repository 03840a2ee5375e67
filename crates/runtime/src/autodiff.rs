//! Burn's own autodiff running the same network: the reference pebble's executor is
//! measured against. The forward is the op library's, run on an
//! [`Autodiff`](burn_autodiff::Autodiff) backend, which records it and differentiates
//! it itself, with Burn's checkpointing strategy (`NoCheckpointing` keeps everything,
//! `BalancedCheckpointing` recomputes cheap ops).

use std::collections::HashMap;
use std::time::Instant;

use burn_autodiff::checkpoint::strategy::{BalancedCheckpointing, NoCheckpointing};
use burn_autodiff::Autodiff;
use burn_backend::tensor::FloatTensor;
use burn_backend::{AutodiffBackend, Backend};
use pebble_zoo::{GraphIndex, Network, TensorId};

use crate::ops::{self, OpCtx};
use crate::rng::op_seed;
use crate::session::{OptimizerKind, Session, StepReport};
use crate::value::{read_floats, sync};
use crate::{memory, RuntimeError, Value};

/// Burn's checkpointing strategy for its autodiff.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Checkpointing {
    /// `NoCheckpointing`: every tensor the backward reads is kept.
    None,
    /// `BalancedCheckpointing`: cheap ops are recomputed in the backward.
    Balanced,
}

/// Runs `steps` training steps of `network` under Burn's autodiff on `B` with `strategy`,
/// from parameters and a batch drawn from `seed` (the same as a [`Session`]'s).
pub fn autodiff_steps<B: Backend>(
    strategy: Checkpointing,
    network: Network,
    index: GraphIndex,
    optimizer: OptimizerKind,
    seed: u64,
    steps: usize,
    device: B::Device,
) -> Result<Vec<StepReport>, RuntimeError> {
    fn go<A: AutodiffBackend>(mut session: Session<A>, steps: usize) -> Result<Vec<StepReport>, RuntimeError> {
        (0..steps).map(|_| session.autodiff_step()).collect()
    }
    match strategy {
        Checkpointing::None => {
            go(Session::<Autodiff<B, NoCheckpointing>>::new(network, index, optimizer, seed, device), steps)
        }
        Checkpointing::Balanced => {
            go(Session::<Autodiff<B, BalancedCheckpointing>>::new(network, index, optimizer, seed, device), steps)
        }
    }
}

impl<B: AutodiffBackend> Session<B> {
    /// One training step under Burn's autodiff: forward through every op, backward by
    /// Burn, then the same optimizer update as [`Session::step`].
    pub fn autodiff_step(&mut self) -> Result<StepReport, RuntimeError> {
        sync::<B>(&self.device)?;
        let resident = self.resident_bytes();
        let before = memory::start_step();
        let start = Instant::now();
        let params: Vec<FloatTensor<B>> = self
            .statics
            .params
            .iter()
            .flatten()
            .map(|p| B::float_set_require_grad(B::float_detach(p.clone()), true))
            .collect();
        let net = &self.program.net;
        let seed = self.step_seed();
        // Last reader of each tensor, to drop our handle when Burn alone needs it.
        let mut last: HashMap<TensorId, usize> = HashMap::new();
        for (o, op) in net.ops.iter().enumerate() {
            for &t in &op.inputs {
                last.insert(t, o);
            }
        }
        let mut env: HashMap<TensorId, Value<B>> = self.inputs.clone();
        let loss_op = net.ops.len() - 1;
        let mut loss = None;
        for (o, op) in net.ops.iter().enumerate() {
            let inputs = op
                .inputs
                .iter()
                .map(|&t| {
                    env.get(&t)
                        .cloned()
                        .ok_or_else(|| RuntimeError::NotResident { tensor: net.tensors[t].name.clone() })
                })
                .collect::<Result<Vec<_>, _>>()?;
            let ctx = OpCtx { device: &self.device, grad: false, seed: op_seed(seed, o) };
            if o == loss_op {
                loss = Some(ops::loss_value(op, inputs, &ctx)?);
                break;
            }
            let op_params: Vec<FloatTensor<B>> = op.params.iter().map(|&p| params[p].clone()).collect();
            let out = ops::forward(op, inputs, &op_params, &ctx)?;
            memory::sample();
            env.insert(op.output, out.output);
            for &t in &op.inputs {
                if last.get(&t) == Some(&o) && !self.inputs.contains_key(&t) {
                    env.remove(&t);
                }
            }
        }
        drop(env);
        let loss = loss.ok_or(RuntimeError::NoLoss)?;
        let grads = B::backward(loss.clone());
        memory::sample();
        let inner: Vec<Option<FloatTensor<B>>> = params.iter().map(|p| B::grad(p, &grads).map(B::from_inner)).collect();
        drop(grads);
        sync::<B>(&self.device)?;
        let peak_bytes = self.measured_peak(before, resident);
        drop(params);
        let detached: Vec<Option<FloatTensor<B>>> = inner.into_iter().map(|g| g.map(B::float_detach)).collect();
        self.update(detached);
        for p in self.statics.params.iter_mut().flatten() {
            *p = B::float_detach(p.clone());
        }
        // The whole step, the update included, as `Session::step` times it.
        sync::<B>(&self.device)?;
        let seconds = start.elapsed().as_secs_f64();
        let loss = read_floats::<B>(B::float_detach(loss))?.first().copied().unwrap_or(f32::NAN);
        self.steps += 1;
        let host_peak_bytes = memory::counting().then_some(0);
        Ok(StepReport {
            loss,
            seconds,
            peak_bytes,
            host_peak_bytes,
            transfers: Default::default(),
            op_seconds: Vec::new(),
        })
    }
}
