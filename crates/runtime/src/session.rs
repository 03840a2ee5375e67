//! A training session: a network's parameters, optimizer state and a batch on a device,
//! stepped by any schedule.
//!
//! Data is synthetic and deterministic (a fixed batch drawn from the seed), so that two
//! runs with the same seed see the same numbers whatever the schedule.

use std::collections::HashMap;
use std::time::Instant;

use burn_backend::tensor::FloatTensor;
use burn_backend::{Backend, TensorData, TensorMetadata};
use pebble_schedule::Schedule;
use pebble_zoo::{Elem, GraphIndex, Network, OpKind, TensorId};

use crate::exec::{self, StepInputs};
use crate::program::Program;
use crate::rng::{self, SplitMix};
use crate::transfer::{StageTemporaries, TransferOptions, TransferReport};
use crate::value::{read_floats, sync};
use crate::{memory, RuntimeError, Value};

/// The optimizer a session updates its parameters with.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum OptimizerKind {
    /// Plain SGD: no state.
    Sgd {
        /// Learning rate.
        lr: f64,
    },
    /// AdamW (Loshchilov & Hutter): two states per parameter.
    AdamW {
        /// Learning rate.
        lr: f64,
        /// Decoupled weight decay.
        weight_decay: f64,
    },
}

impl OptimizerKind {
    /// The planner's name for its state (`sgd` holds none, `adam` two per parameter).
    pub fn planner(self) -> pebble_zoo::Optimizer {
        match self {
            OptimizerKind::Sgd { .. } => pebble_zoo::Optimizer::Sgd,
            OptimizerKind::AdamW { .. } => pebble_zoo::Optimizer::Adam,
        }
    }
}

/// What one step did.
#[derive(Debug, Clone, PartialEq)]
pub struct StepReport {
    /// The loss before the update.
    pub loss: f32,
    /// Wall-clock seconds of the forward and backward (the schedule), synchronized.
    pub seconds: f64,
    /// Peak device bytes during the schedule: live heap above what was live at its start,
    /// plus the tensors resident then, host copies excepted (`None` where nothing counts
    /// allocations).
    pub peak_bytes: Option<u64>,
    /// Peak bytes of the host copies of offloaded tensors during the schedule, above those
    /// live at its start (`None` where nothing counts allocations).
    pub host_peak_bytes: Option<u64>,
    /// What the schedule's transfers did: link busy times, the compute stream's stalls.
    pub transfers: TransferReport,
}

/// Parameters, optimizer state and a batch of one network on one device.
pub struct Session<B: Backend> {
    /// The network, prepared.
    pub program: Program,
    /// Where each tensor is in the lowered training graph.
    pub index: GraphIndex,
    pub(crate) device: B::Device,
    pub(crate) params: Vec<FloatTensor<B>>,
    pub(crate) moments: Vec<(FloatTensor<B>, FloatTensor<B>)>,
    pub(crate) inputs: HashMap<TensorId, Value<B>>,
    pub(crate) optimizer: OptimizerKind,
    pub(crate) seed: u64,
    pub(crate) steps: u64,
    pub(crate) transfers: TransferOptions,
    pub(crate) temporaries: StageTemporaries,
}

fn float_tensor<B: Backend>(values: Vec<f32>, shape: &[usize], device: &B::Device) -> FloatTensor<B> {
    B::float_from_data(TensorData::new(values, shape.to_vec()), device)
}

impl<B: Backend> Session<B> {
    /// Allocates `network`'s parameters (PyTorch-style uniform initialization), the
    /// optimizer's state and a batch, all drawn from `seed`.
    pub fn new(
        network: Network,
        index: GraphIndex,
        optimizer: OptimizerKind,
        seed: u64,
        device: B::Device,
    ) -> Session<B> {
        let program = Program::new(network);
        let net = &program.net;
        let mut rng = SplitMix(seed);
        let params: Vec<FloatTensor<B>> = net
            .params
            .iter()
            .map(|p| {
                let n: usize = p.shape.iter().product();
                let values = if p.name.ends_with("bias") {
                    vec![0.0; n]
                } else if p.shape.len() == 1 {
                    vec![1.0; n]
                } else {
                    let fan_in: usize = p.shape[1..].iter().product();
                    let bound = 1.0 / (fan_in.max(1) as f32).sqrt();
                    (0..n).map(|_| (2.0 * rng.unit() - 1.0) * bound).collect()
                };
                float_tensor::<B>(values, &p.shape, &device)
            })
            .collect();
        let moments = match optimizer {
            OptimizerKind::Sgd { .. } => Vec::new(),
            OptimizerKind::AdamW { .. } => net
                .params
                .iter()
                .map(|p| {
                    let n: usize = p.shape.iter().product();
                    (
                        float_tensor::<B>(vec![0.0; n], &p.shape, &device),
                        float_tensor::<B>(vec![0.0; n], &p.shape, &device),
                    )
                })
                .collect(),
        };
        let inputs = synthetic_batch::<B>(net, &mut rng, &device);
        let transfers = TransferOptions::default();
        let temporaries = StageTemporaries::default();
        Session { program, index, device, params, moments, inputs, optimizer, seed, steps: 0, transfers, temporaries }
    }

    /// The device.
    pub fn device(&self) -> &B::Device {
        &self.device
    }

    /// The current parameters.
    pub fn params(&self) -> &[FloatTensor<B>] {
        &self.params
    }

    /// How steps move tensors to the host and back, and the device pool's cap
    /// (unthrottled and uncapped unless set).
    pub fn transfers(&self) -> &TransferOptions {
        &self.transfers
    }

    /// Sets the links transfers are throttled to and the device pool's cap.
    pub fn set_transfers(&mut self, options: TransferOptions) {
        self.transfers = options;
    }

    /// Sets the temporaries the device pool holds while each chain op runs (the plan's
    /// chain's `ftmp` and `btmp`; none unless set).
    pub fn set_temporaries(&mut self, temporaries: StageTemporaries) {
        self.temporaries = temporaries;
    }

    /// Runs `schedule` once, without updating anything: the loss, the gradients and what
    /// the transfers did.
    pub fn gradients(&self, schedule: &Schedule) -> Result<exec::StepOutput<B>, RuntimeError> {
        let step = StepInputs {
            inputs: &self.inputs,
            params: &self.params,
            seed: self.step_seed(),
            resident_bytes: self.resident_bytes(),
            temporaries: &self.temporaries,
        };
        exec::run_with(&self.program, &self.index, schedule, &step, &self.device, &self.transfers)
    }

    /// Bytes of the tensors resident between steps: parameters, optimizer state, batch.
    pub fn resident_bytes(&self) -> u64 {
        let floats: u64 = self
            .params
            .iter()
            .chain(self.moments.iter().flat_map(|(m, v)| [m, v]))
            .map(|t| (t.shape().num_elements() * t.dtype().size()) as u64)
            .sum();
        floats + self.inputs.values().map(Value::bytes).sum::<u64>()
    }

    /// The peak of a step that started with `before` live bytes: the peak of live heap
    /// bytes above what was live then, plus the tensors resident then. What else was
    /// live (the program, the allocator's and the kernels' own state) is not the step's.
    pub(crate) fn measured_peak(&self, before: u64) -> Option<u64> {
        if memory::probing() {
            // The device's own report counts every live tensor, resident ones included.
            return Some(memory::device_peak());
        }
        memory::counting().then(|| memory::peak().saturating_sub(before) + self.resident_bytes())
    }

    pub(crate) fn step_seed(&self) -> u64 {
        rng::op_seed(self.seed ^ 0x5EED, self.steps as usize)
    }

    /// One training step: `schedule`'s forward and backward, then the optimizer's update.
    pub fn step(&mut self, schedule: &Schedule) -> Result<StepReport, RuntimeError> {
        sync::<B>(&self.device)?;
        let before = memory::start_step();
        let host_before = memory::host_live();
        let start = Instant::now();
        let out = self.gradients(schedule)?;
        sync::<B>(&self.device)?;
        let seconds = start.elapsed().as_secs_f64();
        let peak_bytes = self.measured_peak(before);
        let host_peak_bytes = memory::counting().then(|| memory::host_peak().saturating_sub(host_before));
        let loss = read_floats::<B>(out.loss)?.first().copied().unwrap_or(f32::NAN);
        self.update(out.grads);
        self.steps += 1;
        Ok(StepReport { loss, seconds, peak_bytes, host_peak_bytes, transfers: out.transfers })
    }

    pub(crate) fn update(&mut self, grads: Vec<Option<FloatTensor<B>>>) {
        let t = self.steps as i32 + 1;
        for (i, g) in grads.into_iter().enumerate() {
            let Some(g) = g else { continue };
            let p = self.params[i].clone();
            self.params[i] = match self.optimizer {
                OptimizerKind::Sgd { lr } => B::float_sub(p, B::float_mul_scalar(g, (lr as f32).into())),
                OptimizerKind::AdamW { lr, weight_decay } => {
                    let (b1, b2, eps) = (0.9f32, 0.999f32, 1e-8f32);
                    let (m, v) = self.moments[i].clone();
                    let m = B::float_add(
                        B::float_mul_scalar(m, b1.into()),
                        B::float_mul_scalar(g.clone(), (1.0 - b1).into()),
                    );
                    let v = B::float_add(
                        B::float_mul_scalar(v, b2.into()),
                        B::float_mul_scalar(B::float_mul(g.clone(), g), (1.0 - b2).into()),
                    );
                    let mhat = B::float_div_scalar(m.clone(), (1.0 - b1.powi(t)).into());
                    let vhat = B::float_div_scalar(v.clone(), (1.0 - b2.powi(t)).into());
                    let dir = B::float_div(mhat, B::float_add_scalar(B::float_sqrt(vhat), eps.into()));
                    self.moments[i] = (m, v);
                    let decayed = B::float_mul_scalar(p, ((1.0 - lr * weight_decay) as f32).into());
                    B::float_sub(decayed, B::float_mul_scalar(dir, (lr as f32).into()))
                }
            };
        }
    }
}

/// A fixed batch: floats uniform in `[-1, 1)`; integer ids below the vocabulary of the
/// embedding that reads them, labels below the class count, `positions` `0, 1, ...`.
fn synthetic_batch<B: Backend>(net: &Network, rng: &mut SplitMix, device: &B::Device) -> HashMap<TensorId, Value<B>> {
    let mut out = HashMap::new();
    for (t, tensor) in net.tensors.iter().enumerate() {
        if tensor.producer.is_some() {
            continue;
        }
        let n: usize = tensor.shape.iter().product();
        let value = match tensor.elem {
            Elem::Float => {
                Value::Float(float_tensor::<B>((0..n).map(|_| 2.0 * rng.unit() - 1.0).collect(), &tensor.shape, device))
            }
            Elem::Int | Elem::Byte => {
                let mut range = 2u64;
                for op in net.ops.iter().filter(|o| o.inputs.contains(&t)) {
                    match &op.kind {
                        OpKind::Embedding { vocab, .. } => range = *vocab as u64,
                        OpKind::CrossEntropy => {
                            range = net.tensors[op.inputs[0]].shape.last().copied().unwrap_or(2) as u64
                        }
                        _ => {}
                    }
                }
                let last = tensor.shape.last().copied().unwrap_or(1).max(1);
                let ids: Vec<i64> = if tensor.name == "positions" {
                    (0..n).map(|i| (i % last) as i64).collect()
                } else {
                    (0..n).map(|_| rng.below(range) as i64).collect()
                };
                let data = TensorData::new(ids, tensor.shape.clone());
                Value::Int(B::int_from_data(data.convert::<B::IntElem>(), device))
            }
        };
        out.insert(t, value);
    }
    out
}
