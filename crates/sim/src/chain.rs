//! Chain semantics (Shilova's thesis, Table 2.1, with rotor's 0-based indices).
//!
//! Tensors: `Activation(i)` (`a_i` alone, `x[i]`), `Saved(i)` for `i ≥ 1` (`ā_i`, `xbar[i]`,
//! which contains `a_i`), `Grad(i)` (`δ_i`, `x[i]`) and, when the chain has weights,
//! `Weight(i)` (`w[i]`, resident from the start and part of `static_bytes`). "`a_i` is
//! available" means `Activation(i)` or `Saved(i)` is resident; an op reads `Activation(i)`
//! when it can, `Saved(i)` otherwise.
//!
//! * `F_i^∅` reads `a_i`, produces `Activation(i+1)`, and releases `Activation(i)` if that is
//!   what it read (a saved set persists).
//! * `F_i^ck` reads `a_i`, produces `Activation(i+1)`.
//! * `F_i^all` reads `a_i`, produces `Saved(i+1)`.
//! * `B_L` (the loss) reads `a_L`, produces `δ_L`, releases `Activation(L)`.
//! * `B_i` (`i < L`) reads `δ_{i+1}`, `ā_{i+1}` and `a_i`, produces `δ_i`, and releases
//!   `δ_{i+1}`, `ā_{i+1}`, `Activation(i+1)` and `Activation(i)` (whatever is left of them).
//! * With weights, `F_i` and `B_i` (`i < L`) also read `Weight(i)`.
//!
//! Every op waits for its reads' prefetches, allocates its outputs and temporary memory at
//! its start and releases them at its end.
//!
//! Weights are updated in place by their stage's backward (the fused update of Beaumont
//! et al. 2022), so `B_i` makes `Weight(i)`'s host copy stale. `Free(Weight(i))` drops
//! the device copy of a weight whose host copy is up to date (and keeps that copy).
//!
//! An offload of a weight that is read again before its next offload, prefetch or free
//! is an *upload*: it copies the weight to the host and keeps the device copy until an
//! explicit free (the paper's upload, "send to the CPU without deleting"). Any other
//! offload releases the device copy when its transfer ends.
//!
//! A [periodic](pebble_schedule::Schedule::periodic) schedule is one period of a steady
//! state. Where each weight is when a period begins is read off the ops (the last of its
//! offload, prefetch and free in the period, and whether its backward follows its last
//! offload); the ops are then run [`PERIODS`] times, each period after the first taking a
//! new input `a_0` in place of the last `δ_0`. The report's `makespan` is the
//! steady-state period (the mean start-to-start time of the periods from
//! [`STEADY_FROM`] on), and its times and counts are per period; peaks are over all.

use pebble_graph::Chain;
use pebble_schedule::placement::{self, Copies, StageStart};
use pebble_schedule::{ForwardMode, Op, Schedule, Tensor, View};

use crate::engine::{Effect, Engine, TensorSpec};
use crate::{SimConfig, SimError, SimReport};

struct Ids {
    l: usize,
    weights: bool,
    grads: bool,
    states: bool,
}

impl Ids {
    fn n(&self) -> usize {
        self.l + 1
    }
    fn act(&self, i: usize) -> usize {
        i
    }
    fn sav(&self, i: usize) -> usize {
        self.n() + i
    }
    fn grad(&self, i: usize) -> usize {
        2 * self.n() + i
    }
    fn weight(&self, i: usize) -> usize {
        3 * self.n() + i
    }
    fn wgrad(&self, i: usize) -> usize {
        4 * self.n() + i
    }
    fn state(&self, i: usize) -> usize {
        5 * self.n() + i
    }

    fn of(&self, t: Tensor) -> Option<usize> {
        match t {
            Tensor::Activation(i) if i <= self.l => Some(self.act(i)),
            Tensor::Saved(i) if (1..=self.l).contains(&i) => Some(self.sav(i)),
            Tensor::Grad(i) if i <= self.l => Some(self.grad(i)),
            Tensor::Weight(i) if self.weights && i < self.l => Some(self.weight(i)),
            Tensor::WeightGrad(i) if self.grads && i < self.l => Some(self.wgrad(i)),
            Tensor::OptState(i) if self.states && i < self.l => Some(self.state(i)),
            _ => None,
        }
    }
}

fn lengths_ok(c: &Chain) -> bool {
    let l = c.len();
    l > 0
        && c.btime.len() == l + 1
        && c.x.len() == l + 1
        && c.xbar.len() == l + 1
        && c.ftmp.len() == l
        && c.btmp.len() == l + 1
        && [&c.w, &c.g, &c.o].iter().all(|v| v.as_ref().is_none_or(|v| v.len() == l))
        && (c.g.is_none() || c.w.is_some())
}

/// How many periods a periodic schedule is unrolled to.
pub const PERIODS: usize = 6;
/// The first period (0-based) counted in the steady state: the ones before are a transient.
pub const STEADY_FROM: usize = 2;

pub(crate) fn simulate(chain: &Chain, schedule: &Schedule, config: &SimConfig) -> Result<SimReport, SimError> {
    if schedule.view != View::Chain {
        return Err(SimError::WrongView { found: schedule.view, expected: View::Chain });
    }
    let ops = &schedule.ops[..];
    if !lengths_ok(chain) {
        return Err(SimError::OutOfRange {
            op: 0,
            text: ops.first().map(|o| o.to_string()).unwrap_or_default(),
            what: "the chain itself: its field lengths are inconsistent (see Chain::validate)".into(),
        });
    }
    let l = chain.len();
    let ids = Ids { l, weights: chain.w.is_some(), grads: chain.g.is_some(), states: chain.o.is_some() };
    let n = ids.n();
    let total = |v: &Option<Vec<u64>>| v.as_ref().map_or(0u64, |v| v.iter().fold(0u64, |a, &b| a.saturating_add(b)));
    let named = total(&chain.w).saturating_add(total(&chain.g)).saturating_add(total(&chain.o));
    let on_cpu = placement::cpu_updated(ops, l);
    let starts = placement::starts(schedule, l);
    let specs = (0..6 * n).map(|id| {
        let (kind, i) = (id / n, id % n);
        let plain = |name, size, resident| TensorSpec { name, size, resident, host: false };
        let per_stage = |name, sizes: &Option<Vec<u64>>, at: Copies| {
            let size = sizes.as_ref().and_then(|v| v.get(i).copied());
            TensorSpec {
                name,
                size: size.unwrap_or(0),
                resident: size.is_some() && at.device,
                host: size.is_some() && at.host,
            }
        };
        let start = starts.get(i).copied().unwrap_or(StageStart::DEVICE);
        match kind {
            0 => plain(Tensor::Activation(i), chain.x[i], i == 0),
            1 => plain(Tensor::Saved(i), chain.xbar[i], false),
            2 => plain(Tensor::Grad(i), chain.x[i], false),
            3 => per_stage(Tensor::Weight(i), &chain.w, start.weight),
            4 => per_stage(Tensor::WeightGrad(i), &chain.g, start.grad),
            _ => per_stage(Tensor::OptState(i), &chain.o, start.state),
        }
    });
    let mut eng = Engine::new(ops, config, chain.static_bytes.saturating_sub(named), specs);
    let mut done = vec![false; l + 1];
    // uploads[k]: the tensor op k uploads, if it is an upload.
    let uploads: Vec<Option<usize>> = ops
        .iter()
        .enumerate()
        .map(|(k, op)| match *op {
            Op::Offload { tensor: tensor @ (Tensor::Weight(_) | Tensor::OptState(_)), fraction } if fraction >= 1.0 => {
                let id = ids.of(tensor)?;
                placement::is_upload(ops, k, tensor, schedule.periodic, &on_cpu).then_some(id)
            }
            _ => None,
        })
        .collect();
    let sim = Stage {
        chain,
        ids: &ids,
        on_cpu: &on_cpu,
        gpu_rate: config.machine.gpu_optimizer_rate,
        cpu_rate: config.machine.cpu_optimizer_rate,
    };
    let periods = if schedule.periodic { PERIODS } else { 1 };
    let mut period_starts = Vec::with_capacity(periods);

    for p in 0..periods {
        let first = p * ops.len();
        if p > 0 {
            if !done[0] {
                return Err(eng.fail(SimError::Incomplete(format!("period {p} ended before δ_0 was computed"))));
            }
            // The next batch replaces the last input gradient.
            let gone = if eng.on_device(ids.grad(0)) { eng.free(first, ids.grad(0)) } else { Ok(()) };
            let next = gone.and_then(|()| eng.arrive(first, ids.act(0)));
            if let Err(e) = next {
                return Err(eng.fail(e));
            }
            done.fill(false);
        }
        for (k, op) in ops.iter().enumerate() {
            let ran = match uploads[k] {
                Some(id) => eng.upload(first + k, id),
                None => sim.step(&mut eng, &mut done, first + k, op),
            };
            if let Err(e) = ran {
                return Err(eng.fail(e));
            }
            if op.is_compute() && period_starts.len() == p {
                period_starts.push(eng.last_start());
            }
        }
    }
    let mut report = eng.finish()?;
    if !done[0] {
        return Err(SimError::Incomplete("δ_0 was never computed".into()));
    }
    if periods > 1 {
        let last = period_starts.len() - 1;
        let period = (period_starts[last] - period_starts[STEADY_FROM]) / (last - STEADY_FROM) as f64;
        let per = periods as f64;
        report.makespan = period;
        report.compute_time /= per;
        report.compute_ops /= periods;
        report.d2h_busy /= per;
        report.h2d_busy /= per;
        report.cpu_busy /= per;
        report.compute_stall = (period - report.compute_time).max(0.0);
        report.periods = periods;
    }
    Ok(report)
}

/// The id through which `a_i` is read: `Activation(i)` if resident, else `Saved(i)` if
/// resident, else `Activation(i)` (which the engine then reports missing).
fn a_input(ids: &Ids, eng: &Engine<'_>, i: usize) -> usize {
    if eng.readable(ids.act(i)) {
        ids.act(i)
    } else if i >= 1 && eng.readable(ids.sav(i)) {
        ids.sav(i)
    } else {
        ids.act(i)
    }
}

/// What the chain's ops do, for one simulation.
struct Stage<'c> {
    chain: &'c Chain,
    ids: &'c Ids,
    /// Which stages the host CPU updates ([`placement::cpu_updated`]).
    on_cpu: &'c [bool],
    gpu_rate: Option<f64>,
    cpu_rate: f64,
}

impl Stage<'_> {
    fn step(&self, eng: &mut Engine<'_>, done: &mut [bool], k: usize, op: &Op) -> Result<(), SimError> {
        let (chain, ids) = (self.chain, self.ids);
        let l = ids.l;
        match *op {
            Op::Forward { stage: i, mode } => {
                if i >= l {
                    return Err(eng.out_of_range(
                        k,
                        format!("forward stage {i} (the chain has stages 0..{l}; the loss is B{l})"),
                    ));
                }
                let a = a_input(ids, eng, i);
                let mut reads = vec![a];
                if ids.weights {
                    reads.push(ids.weight(i));
                }
                let out = if mode == ForwardMode::KeepAll { ids.sav(i + 1) } else { ids.act(i + 1) };
                let free = [a];
                let frees: &[usize] = if mode == ForwardMode::Discard && a == ids.act(i) { &free } else { &[] };
                eng.compute(
                    k,
                    &Effect { duration: chain.ftime[i], tmp: chain.ftmp[i], reads: &reads, allocs: &[out], frees },
                )
            }
            Op::Backward { stage: i } => {
                if i > l {
                    let what = if i == usize::MAX {
                        "the loss marker `L` (resolve it with Schedule::resolve_loss)".to_string()
                    } else {
                        format!("backward stage {i} (the chain has stages 0..={l}, the loss being B{l})")
                    };
                    return Err(eng.out_of_range(k, what));
                }
                if done[i] {
                    let why = if i == l {
                        "the loss already ran".to_string()
                    } else {
                        format!("B{i} already ran (δ_{i} was already computed)")
                    };
                    return Err(eng.invalid(k, why));
                }
                if i == l {
                    let a = a_input(ids, eng, l);
                    eng.compute(
                        k,
                        &Effect {
                            duration: chain.btime[l],
                            tmp: chain.btmp[l],
                            reads: &[a],
                            allocs: &[ids.grad(l)],
                            frees: &[ids.act(l)],
                        },
                    )?;
                } else {
                    self.backward(eng, k, i)?;
                }
                done[i] = true;
                Ok(())
            }
            Op::CpuUpdate { stage: i } => {
                if i >= l {
                    return Err(eng.out_of_range(k, format!("CPU update of stage {i} (the chain has stages 0..{l})")));
                }
                if !ids.grads {
                    return Err(eng.invalid(k, "a CPU update needs the chain's weight gradients (field `g`)"));
                }
                if !done[i] {
                    return Err(eng.invalid(k, format!("the CPU update of stage {i} comes before B{i} in this period")));
                }
                let size = chain.g.as_ref().map_or(0, |g| g[i]);
                let state = ids.states.then(|| ids.state(i));
                eng.cpu_update(k, ids.wgrad(i), ids.weight(i), state, size as f64 / self.cpu_rate)
            }
            Op::Compute { .. } => Err(eng.invalid(k, "a graph op (compute node) in a chain schedule")),
            Op::Run { .. } | Op::Send { .. } => Err(eng.invalid(k, "a pipeline op in a chain schedule")),
            Op::Free { tensor } => {
                let id = resolve(ids, eng, k, tensor)?;
                if matches!(tensor, Tensor::Weight(_) | Tensor::OptState(_)) {
                    return eng.drop_device(k, id);
                }
                eng.free(k, id)
            }
            Op::Offload { tensor, fraction } => {
                let id = resolve(ids, eng, k, tensor)?;
                eng.offload(k, id, fraction)
            }
            Op::Prefetch { tensor, fraction } => {
                let id = resolve(ids, eng, k, tensor)?;
                eng.prefetch(k, id, fraction)
            }
        }
    }

    /// `B_i` for a stage `i < L`: reads `δ_{i+1}`, `ā_{i+1}`, `a_i` and the weights,
    /// produces `δ_i`. With weight gradients (`g`), it accumulates into `WeightGrad(i)`
    /// (allocating it if absent). Unless the host CPU updates the stage, it also runs the
    /// optimizer step on the device (reading `OptState(i)`, timed at the machine's
    /// `gpu_optimizer_rate` if it has one) and makes the host copies of the weights and
    /// state stale.
    fn backward(&self, eng: &mut Engine<'_>, k: usize, i: usize) -> Result<(), SimError> {
        let (chain, ids) = (self.chain, self.ids);
        let a = a_input(ids, eng, i);
        let mut reads = vec![ids.grad(i + 1), ids.sav(i + 1), a];
        let mut allocs = vec![ids.grad(i)];
        if ids.weights {
            reads.push(ids.weight(i));
        }
        let on_device = !self.on_cpu[i];
        let mut duration = chain.btime[i];
        if ids.grads {
            if eng.on_device(ids.wgrad(i)) {
                reads.push(ids.wgrad(i));
            } else {
                allocs.push(ids.wgrad(i));
            }
            if on_device {
                if let (Some(rate), Some(g)) = (self.gpu_rate, &chain.g) {
                    duration += g[i] as f64 / rate;
                }
            }
        }
        if ids.states && on_device {
            reads.push(ids.state(i));
        }
        eng.compute(
            k,
            &Effect {
                duration,
                tmp: chain.btmp[i],
                reads: &reads,
                allocs: &allocs,
                frees: &[ids.grad(i + 1), ids.sav(i + 1), ids.act(i + 1), ids.act(i)],
            },
        )?;
        if on_device {
            if ids.weights {
                eng.invalidate_host(k, ids.weight(i));
            }
            if ids.states {
                eng.invalidate_host(k, ids.state(i));
            }
        }
        Ok(())
    }
}

fn resolve(ids: &Ids, eng: &Engine<'_>, k: usize, tensor: Tensor) -> Result<usize, SimError> {
    ids.of(tensor).ok_or_else(|| {
        let l = ids.l;
        let what = match tensor {
            Tensor::Data(_) => {
                format!("{tensor:?} (a graph tensor; chain schedules name Activation, Saved, Grad, Weight, WeightGrad or OptState)")
            }
            Tensor::Weight(_) if !ids.weights => format!("{tensor:?} (the chain has no weights `w`)"),
            Tensor::WeightGrad(_) if !ids.grads => format!("{tensor:?} (the chain has no weight gradients `g`)"),
            Tensor::OptState(_) if !ids.states => format!("{tensor:?} (the chain has no optimizer states `o`)"),
            Tensor::Saved(0) => "Saved(0) (there is no saved set ā_0; a_0 is Activation(0))".to_string(),
            _ => format!("{tensor:?} (the chain has {l} stages)"),
        };
        eng.out_of_range(k, what)
    })
}
