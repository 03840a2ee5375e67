//! Chain schedules on the engine: each op as [`pebble_schedule::lower`] lowers it (which
//! tensors it reads, creates, frees and moves: Shilova's Table 2.1, written there once
//! for the simulator and the executors), timed and measured here.
//!
//! Every compute op waits for its reads' prefetches, allocates its outputs and temporary
//! memory at its start and releases them at its end; it lasts `ftime`/`btime` (plus the
//! optimizer step at the machine's `gpu_optimizer_rate`, if it has one, for a backward
//! that updates its stage on the device). A CPU update lasts `g[i] / cpu_optimizer_rate`
//! on the host CPU's stream. An upload copies a weight or state to the host and keeps the
//! device copy until an explicit free (the paper's upload, "send to the CPU without
//! deleting"); any other offload releases the device copy when its transfer ends.
//!
//! A [periodic](pebble_schedule::Schedule::periodic) schedule is one period of a steady
//! state. Where each weight is when a period begins is read off the ops
//! ([`placement::starts`]); the ops are then run [`PERIODS`] times, each period after the
//! first taking a new input `a_0` in place of the last `δ_0`. The report's `makespan` is
//! the steady-state period (the mean start-to-start time of the periods from
//! [`STEADY_FROM`] on), and its times and counts are per period; peaks are over all.

use pebble_graph::Chain;
use pebble_schedule::lower::{self, Action, Ids, Refusal, Step};
use pebble_schedule::placement::{self, Copies, StageStart};
use pebble_schedule::{Schedule, View};

use crate::engine::{Effect, Engine, TensorSpec};
use crate::{SimConfig, SimError, SimReport};

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
    let ids = Ids::of_chain(chain);
    let starts = placement::starts(schedule, l);
    let periods = if schedule.periodic { PERIODS } else { 1 };
    let program = lower::lower_chain(ops, ids, schedule.periodic, &starts, periods);
    let mut eng = Engine::new(ops, config, resident_unnamed(chain), specs(chain, ids, &starts));
    let run = Run {
        chain,
        ids,
        on_cpu: &program.on_cpu,
        fused: placement::names_statics(schedule),
        gpu_rate: config.machine.gpu_optimizer_rate,
        cpu_rate: config.machine.cpu_optimizer_rate,
    };
    let mut b0_ran = false;
    let mut period_starts = Vec::with_capacity(periods);
    for (g, step) in program.steps.iter().enumerate() {
        let p = g / ops.len().max(1);
        if p > 0 && step.op == 0 {
            if !b0_ran {
                return Err(eng.fail(SimError::Incomplete(format!("period {p} ended before δ_0 was computed"))));
            }
            // The next batch replaces the last input gradient.
            let gone = if eng.on_device(ids.grad(0)) { eng.free(g, ids.grad(0)) } else { Ok(()) };
            if let Err(e) = gone.and_then(|()| eng.arrive(g, ids.act(0))) {
                return Err(eng.fail(e));
            }
            b0_ran = false;
        }
        if let Err(e) = run.step(&mut eng, g, step) {
            return Err(eng.fail(e));
        }
        b0_ran |= matches!(step.action, Action::Backward { stage: 0, .. });
        if ops[step.op].is_compute() && period_starts.len() == p {
            period_starts.push(eng.last_start());
        }
    }
    if let Some((g, why)) = program.refused {
        let e = match why {
            Refusal::OutOfRange(what) => eng.out_of_range(g, what),
            Refusal::Invalid(why) => eng.invalid(g, why),
        };
        return Err(eng.fail(e));
    }
    let mut report = eng.finish()?;
    if !b0_ran {
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

/// Bytes resident for the whole step that no tensor of the chain names: `static_bytes`
/// less the weights, gradients and states the chain lists.
fn resident_unnamed(chain: &Chain) -> u64 {
    let total = |v: &Option<Vec<u64>>| v.as_ref().map_or(0u64, |v| v.iter().fold(0u64, |a, &b| a.saturating_add(b)));
    let named = total(&chain.w).saturating_add(total(&chain.g)).saturating_add(total(&chain.o));
    chain.static_bytes.saturating_sub(named)
}

/// The engine's view of each chain tensor: its size ([`lower::tensor_bytes`]), and where
/// it is when the step begins (`a_0` on the device; the static tensors where `starts` says).
fn specs<'a>(chain: &'a Chain, ids: Ids, starts: &'a [StageStart]) -> impl Iterator<Item = TensorSpec> + 'a {
    (0..ids.count()).map(move |id| {
        let name = ids.tensor(id);
        let size = lower::tensor_bytes(chain, name);
        match ids.static_of(id) {
            None => TensorSpec { name, size, resident: id == ids.act(0), host: false },
            Some((kind, i)) => {
                let has = [ids.weights, ids.grads, ids.states][kind];
                let start = starts.get(i).copied().unwrap_or(StageStart::DEVICE);
                let at: Copies = [start.weight, start.grad, start.state][kind];
                TensorSpec { name, size, resident: has && at.device, host: has && at.host }
            }
        }
    })
}

/// What the chain's steps cost, for one simulation.
struct Run<'c> {
    chain: &'c Chain,
    ids: Ids,
    /// Which stages the host CPU updates.
    on_cpu: &'c [bool],
    /// The optimizer step runs inside the backwards (a schedule that names the statics),
    /// not after the step.
    fused: bool,
    gpu_rate: Option<f64>,
    cpu_rate: f64,
}

impl Run<'_> {
    /// Runs one lowered step (at index `k` of the unrolled program) on the engine.
    fn step(&self, eng: &mut Engine<'_>, k: usize, step: &Step) -> Result<(), SimError> {
        let chain = self.chain;
        let compute = |duration: f64, tmp: u64| Effect {
            duration,
            tmp,
            reads: &step.reads,
            allocs: &step.creates,
            frees: &step.frees,
        };
        match step.action {
            Action::Forward { stage: i, .. } => eng.compute(k, &compute(chain.ftime[i], chain.ftmp[i])),
            Action::Loss { .. } => {
                let l = self.ids.l;
                eng.compute(k, &compute(chain.btime[l], chain.btmp[l]))
            }
            Action::Backward { stage: i, .. } => {
                let mut duration = chain.btime[i];
                if let (true, Some(rate), Some(g)) = (!self.on_cpu[i], self.gpu_rate, &chain.g) {
                    duration += g[i] as f64 / rate;
                }
                // The fused update runs after the backward's temporaries are gone.
                let tmp = if self.fused && !step.updates.is_empty() { chain.fused_btmp(i) } else { chain.btmp[i] };
                eng.compute(k, &compute(duration, tmp))?;
                for &u in &step.updates {
                    eng.invalidate_host(k, u);
                }
                Ok(())
            }
            Action::CpuUpdate { stage: i, grad, weight, state } => {
                let size = chain.g.as_ref().map_or(0, |g| g[i]);
                eng.cpu_update(k, grad, weight, state, size as f64 / self.cpu_rate)
            }
            Action::Free { tensor, device_only: true } => eng.drop_device(k, tensor),
            Action::Free { tensor, device_only: false } => eng.free(k, tensor),
            Action::Offload { tensor, upload: true, .. } => eng.upload(k, tensor),
            Action::Offload { tensor, fraction, .. } => eng.offload(k, tensor, fraction),
            Action::Prefetch { tensor, fraction } => eng.prefetch(k, tensor, fraction),
        }
    }
}
