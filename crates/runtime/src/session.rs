//! A training session: a network's parameters, optimizer state and a batch on a device,
//! stepped by any schedule.
//!
//! Data is synthetic and deterministic (a fixed batch drawn from the seed), so that two
//! runs with the same seed see the same numbers whatever the schedule.

use std::collections::HashMap;
use std::time::Instant;

use burn_backend::tensor::FloatTensor;
use burn_backend::{Backend, TensorData};
use pebble_schedule::{Schedule, View};
use pebble_zoo::{Elem, GraphIndex, Network, OpKind, TensorId};

use crate::exec::{self, Statics, StepInputs, Update};
pub use crate::optim::OptimizerKind;
use crate::program::Program;
use crate::rng::{self, SplitMix};
use crate::transfer::{StageTemporaries, TransferOptions, TransferReport};
use crate::value::{read_floats, sync};
use crate::{memory, RuntimeError, Value};
use pebble_schedule::lower::Step;
use pebble_schedule::placement::{self, StageStart};

/// What one step did.
#[derive(Debug, Clone, PartialEq)]
pub struct StepReport {
    /// The loss before the update.
    pub loss: f32,
    /// Wall-clock seconds of the whole step, synchronized: the schedule and the optimizer
    /// step (fused into its backwards or on the host CPU for a schedule that names the
    /// static tensors, the end-of-step update for the others).
    pub seconds: f64,
    /// Peak device bytes during the schedule: live heap above what was live at its start,
    /// plus the tensors resident then, host copies excepted (`None` where nothing counts
    /// allocations).
    pub peak_bytes: Option<u64>,
    /// Peak bytes of the host copies during the schedule, those the step started with
    /// (weights and states a periodic schedule keeps on the host) included (`None` where
    /// nothing counts allocations).
    pub host_peak_bytes: Option<u64>,
    /// What the schedule's transfers did: link busy times, the compute stream's stalls.
    pub transfers: TransferReport,
    /// Seconds of each compute op of a chain schedule, by its index in the schedule
    /// (0 for the other ops; empty for graph schedules, autodiff, and unless
    /// [`TransferOptions::time_ops`](crate::TransferOptions::time_ops)).
    pub op_seconds: Vec<f64>,
}

/// Parameters, optimizer state and a batch of one network on one device.
pub struct Session<B: Backend> {
    /// The network, prepared.
    pub program: Program,
    /// Where each tensor is in the lowered training graph.
    pub index: GraphIndex,
    pub(crate) device: B::Device,
    /// Parameters and optimizer state, on the device or the host.
    pub(crate) statics: Statics<B>,
    pub(crate) inputs: HashMap<TensorId, Value<B>>,
    pub(crate) optimizer: OptimizerKind,
    pub(crate) seed: u64,
    pub(crate) steps: u64,
    pub(crate) transfers: TransferOptions,
    pub(crate) temporaries: StageTemporaries,
    /// Heap bytes of the host copies the session holds between steps.
    host_held: u64,
    /// How many times the static tensors were put where a schedule starts them.
    arrangements: u64,
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
        let statics = Statics::new(params, moments, program.len());
        Session {
            program,
            index,
            device,
            statics,
            inputs,
            optimizer,
            seed,
            steps: 0,
            transfers: TransferOptions::default(),
            temporaries: StageTemporaries::default(),
            host_held: 0,
            arrangements: 0,
        }
    }

    /// The device.
    pub fn device(&self) -> &B::Device {
        &self.device
    }

    /// The parameters' device copies (`None` for one a schedule left on the host only).
    pub fn params(&self) -> &[Option<FloatTensor<B>>] {
        &self.statics.params
    }

    /// The current value of every parameter, wherever it is (device or host).
    pub fn parameters(&self) -> Result<Vec<Vec<f32>>, RuntimeError> {
        self.statics.current_values()
    }

    /// How many times the static tensors were moved before a step to where its schedule
    /// starts them: once for a periodic schedule (its first step), never for one that
    /// keeps them on the device.
    pub fn arrangements(&self) -> u64 {
        self.arrangements
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

    /// Runs `schedule` once, without updating anything: the loss, the gradients (those
    /// left on the device) and what the transfers did. The parameters, states and
    /// gradients end where the schedule leaves them, as after [`Session::step`].
    pub fn gradients(&mut self, schedule: &Schedule) -> Result<exec::StepOutput<B>, RuntimeError> {
        self.prepare(schedule)?;
        let other = memory::host_live().saturating_sub(self.host_held);
        let out = self.run(schedule, None, None);
        self.host_held = memory::host_live().saturating_sub(other);
        out
    }

    /// Puts the parameters, gradients and states where `schedule` starts a step (a
    /// periodic schedule: where its period leaves them; any other: on the device).
    fn prepare(&mut self, schedule: &Schedule) -> Result<(), RuntimeError> {
        let l = self.program.len();
        let starts = match schedule.view {
            View::Chain => placement::starts(schedule, l),
            View::Graph | View::Pipeline => vec![StageStart::DEVICE; l],
        };
        self.arrange(&starts)
    }

    /// Puts the parameters, gradients and states of each stage where `starts` says.
    fn arrange(&mut self, starts: &[StageStart]) -> Result<(), RuntimeError> {
        let other = memory::host_live().saturating_sub(self.host_held);
        let moved = self.statics.arrange(&self.program, starts, &self.device)?;
        self.host_held = memory::host_live().saturating_sub(other);
        self.arrangements += u64::from(moved);
        Ok(())
    }

    fn run(
        &mut self,
        schedule: &Schedule,
        update: Option<Update>,
        lowered: Option<&[Step]>,
    ) -> Result<exec::StepOutput<B>, RuntimeError> {
        let step = StepInputs {
            inputs: &self.inputs,
            seed: self.step_seed(),
            temporaries: &self.temporaries,
            update,
            lowered,
        };
        let statics = &mut self.statics;
        exec::run_with(&self.program, &self.index, schedule, &step, statics, &self.device, &self.transfers)
    }

    /// Bytes of the tensors resident on the device between steps: parameters and
    /// optimizer state on the device, and the batch.
    pub fn resident_bytes(&self) -> u64 {
        self.statics.device_bytes() + self.inputs.values().map(Value::bytes).sum::<u64>()
    }

    /// The peak of a step that started with `before` live bytes and `resident` bytes of
    /// tensors on the device: the peak of live heap bytes above what was live then, plus
    /// those tensors. What else was live (the program, the allocator's and the kernels'
    /// own state) is not the step's.
    pub(crate) fn measured_peak(&self, before: u64, resident: u64) -> Option<u64> {
        if memory::probing() {
            // The device's own report counts every live tensor, resident ones included.
            return Some(memory::device_peak());
        }
        memory::counting().then(|| memory::peak().saturating_sub(before) + resident)
    }

    pub(crate) fn step_seed(&self) -> u64 {
        rng::op_seed(self.seed ^ 0x5EED, self.steps as usize)
    }

    /// One training step: `schedule`'s forward and backward, and the optimizer's update:
    /// inside each stage's backward (or on the host CPU) for a schedule that names the
    /// weights, their gradients or states ([`placement::names_statics`]), once at the
    /// end otherwise. Both run the same arithmetic on the same values.
    pub fn step(&mut self, schedule: &Schedule) -> Result<StepReport, RuntimeError> {
        self.prepare(schedule)?;
        let fused = schedule.view == View::Chain && placement::names_statics(schedule);
        // The program is lowered before the step is measured: it is the executor's
        // bookkeeping, not the step's memory.
        let l = self.program.len();
        let lowered =
            (schedule.view == View::Chain).then(|| exec::lower_step(schedule, l, &self.statics)).transpose()?;
        self.timed_step(fused, |session, update| session.run(schedule, update, lowered.as_deref()))
    }

    /// One training step of graph ops `drive` hands over as it decides them (a run-time
    /// policy), then the end-of-step update: the parameters and states on the device, as
    /// for any graph schedule.
    pub fn step_driven(&mut self, drive: &mut exec::Drive<'_>) -> Result<StepReport, RuntimeError> {
        self.arrange(&vec![StageStart::DEVICE; self.program.len()])?;
        self.timed_step(false, |session, _| {
            let step = StepInputs {
                inputs: &session.inputs,
                seed: session.step_seed(),
                temporaries: &session.temporaries,
                update: None,
                lowered: None,
            };
            let (program, index, device, transfers) =
                (&session.program, &session.index, &session.device, &session.transfers);
            exec::run_driven(program, index, drive, &step, &mut session.statics, device, transfers)
        })
    }

    /// Runs one step with `run`, timed and measured; the update fused into it if `fused`,
    /// at its end otherwise.
    fn timed_step(
        &mut self,
        fused: bool,
        run: impl FnOnce(&mut Self, Option<Update>) -> Result<exec::StepOutput<B>, RuntimeError>,
    ) -> Result<StepReport, RuntimeError> {
        sync::<B>(&self.device)?;
        let resident = self.resident_bytes();
        let before = memory::start_step();
        let host_other = memory::host_live().saturating_sub(self.host_held);
        let update = fused.then_some(Update { optimizer: self.optimizer, t: self.steps as i32 + 1 });
        let start = Instant::now();
        let out = run(self, update)?;
        sync::<B>(&self.device)?;
        // The peaks are the schedule's (the end-of-step update's temporaries are not).
        let peak_bytes = self.measured_peak(before, resident);
        let host_peak_bytes = memory::counting().then(|| memory::host_peak().saturating_sub(host_other));
        self.host_held = memory::host_live().saturating_sub(host_other);
        if !fused {
            self.update(out.grads);
            sync::<B>(&self.device)?;
        }
        let seconds = start.elapsed().as_secs_f64();
        let loss = read_floats::<B>(out.loss)?.first().copied().unwrap_or(f32::NAN);
        self.steps += 1;
        Ok(StepReport {
            loss,
            seconds,
            peak_bytes,
            host_peak_bytes,
            transfers: out.transfers,
            op_seconds: out.op_seconds,
        })
    }

    /// The end-of-step update of every parameter a gradient reached (all on the device).
    pub(crate) fn update(&mut self, grads: Vec<Option<FloatTensor<B>>>) {
        let t = self.steps as i32 + 1;
        let statics = &mut self.statics;
        for (i, g) in grads.into_iter().enumerate() {
            let Some(g) = g else { continue };
            let p = statics.params[i].take().expect("an end-of-step update finds every parameter on the device");
            let moments = statics.moments.get_mut(i).map(|m| m.take().expect("and every optimizer state"));
            let (p, moments) = crate::optim::apply::<B>(self.optimizer, t, p, g, moments);
            statics.params[i] = Some(p);
            statics.fresh[i] = None;
            if let Some(m) = moments {
                statics.moments[i] = Some(m);
            }
        }
    }
}

/// A fixed batch: floats uniform in `[-1, 1)`; integer ids below the vocabulary of the
/// embedding that reads them, labels below the class count, `positions` `0, 1, ...`.
pub(crate) fn synthetic_batch<B: Backend>(
    net: &Network,
    rng: &mut SplitMix,
    device: &B::Device,
) -> HashMap<TensorId, Value<B>> {
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
