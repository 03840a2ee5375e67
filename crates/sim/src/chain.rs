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
use pebble_schedule::{ForwardMode, Op, Schedule, Tensor, View};

use crate::engine::{Effect, Engine, TensorSpec};
use crate::{SimConfig, SimError, SimReport};

struct Ids {
    l: usize,
    weights: bool,
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

    fn of(&self, t: Tensor) -> Option<usize> {
        match t {
            Tensor::Activation(i) if i <= self.l => Some(self.act(i)),
            Tensor::Saved(i) if (1..=self.l).contains(&i) => Some(self.sav(i)),
            Tensor::Grad(i) if i <= self.l => Some(self.grad(i)),
            Tensor::Weight(i) if self.weights && i < self.l => Some(self.weight(i)),
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
        && match &c.w {
            Some(w) => w.len() == l,
            None => true,
        }
}

/// How many periods a periodic schedule is unrolled to.
pub const PERIODS: usize = 6;
/// The first period (0-based) counted in the steady state: the ones before are a transient.
pub const STEADY_FROM: usize = 2;

/// Whether the op reads stage `i`'s weights.
fn reads_weight(op: &Op, i: usize) -> bool {
    matches!(*op, Op::Forward { stage, .. } | Op::Backward { stage } if stage == i)
}

/// Whether the offload of `Weight(i)` at `k` is an upload: a read of the weight comes
/// before its next offload, prefetch or free (looking on into the next period if the
/// schedule is periodic). An upload keeps the device copy until an explicit free; any
/// other offload releases it when the transfer ends.
fn is_upload(ops: &[Op], k: usize, i: usize, periodic: bool) -> bool {
    let n = ops.len();
    let ahead = if periodic { n - 1 } else { n - k - 1 };
    for step in 1..=ahead {
        let op = &ops[(k + step) % n];
        if reads_weight(op, i) {
            return true;
        }
        if op.tensor() == Some(Tensor::Weight(i)) {
            return false;
        }
    }
    false
}

/// Where each weight is when a period of `ops` begins: the state its ops leave at the
/// period's end, `(on the device, host copy up to date)`.
fn weight_starts(ops: &[Op], l: usize) -> Vec<(bool, bool)> {
    let mut st = vec![(true, false); l];
    for (k, op) in ops.iter().enumerate() {
        match *op {
            Op::Offload { tensor: Tensor::Weight(i), .. } if i < l => st[i] = (is_upload(ops, k, i, true), true),
            Op::Prefetch { tensor: Tensor::Weight(i), .. } if i < l => st[i].0 = true,
            Op::Free { tensor: Tensor::Weight(i) } if i < l => st[i].0 = false,
            Op::Backward { stage: i } if i < l => st[i].1 = false,
            _ => {}
        }
    }
    st
}

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
    let ids = Ids { l, weights: chain.w.is_some() };
    let n = ids.n();
    let w_total: u64 = chain.w.as_ref().map_or(0, |w| w.iter().sum());
    let starts = if schedule.periodic { weight_starts(ops, l) } else { vec![(true, false); l] };
    let specs = (0..4 * n).map(|id| {
        let (kind, i) = (id / n, id % n);
        let plain = |name, size, resident| TensorSpec { name, size, resident, host: false };
        match kind {
            0 => plain(Tensor::Activation(i), chain.x[i], i == 0),
            1 => plain(Tensor::Saved(i), chain.xbar[i], false),
            2 => plain(Tensor::Grad(i), chain.x[i], false),
            _ => {
                let size = chain.w.as_ref().and_then(|w| w.get(i).copied());
                let (device, host) = starts.get(i).copied().unwrap_or((true, false));
                TensorSpec {
                    name: Tensor::Weight(i),
                    size: size.unwrap_or(0),
                    resident: size.is_some() && device,
                    host: size.is_some() && host,
                }
            }
        }
    });
    let mut eng = Engine::new(ops, config, chain.static_bytes.saturating_sub(w_total), specs);
    let mut done = vec![false; l + 1];
    // uploads[k]: the weight op k uploads, if it is an upload.
    let uploads: Vec<Option<usize>> = ops
        .iter()
        .enumerate()
        .map(|(k, op)| match *op {
            Op::Offload { tensor: Tensor::Weight(i), fraction } if ids.weights && i < l && fraction >= 1.0 => {
                is_upload(ops, k, i, schedule.periodic).then_some(i)
            }
            _ => None,
        })
        .collect();
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
                Some(i) => eng.upload(first + k, ids.weight(i)),
                None => step(chain, &ids, &mut eng, &mut done, first + k, op),
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

fn step(chain: &Chain, ids: &Ids, eng: &mut Engine<'_>, done: &mut [bool], k: usize, op: &Op) -> Result<(), SimError> {
    let l = ids.l;
    match *op {
        Op::Forward { stage: i, mode } => {
            if i >= l {
                return Err(
                    eng.out_of_range(k, format!("forward stage {i} (the chain has stages 0..{l}; the loss is B{l})"))
                );
            }
            let a = a_input(ids, eng, i);
            let mut reads = [a, 0];
            let nr = if ids.weights {
                reads[1] = ids.weight(i);
                2
            } else {
                1
            };
            let out = if mode == ForwardMode::KeepAll { ids.sav(i + 1) } else { ids.act(i + 1) };
            let free = [a];
            let frees: &[usize] = if mode == ForwardMode::Discard && a == ids.act(i) { &free } else { &[] };
            eng.compute(
                k,
                &Effect { duration: chain.ftime[i], tmp: chain.ftmp[i], reads: &reads[..nr], allocs: &[out], frees },
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
                let a = a_input(ids, eng, i);
                let reads = [ids.grad(i + 1), ids.sav(i + 1), a, if ids.weights { ids.weight(i) } else { 0 }];
                let nr = if ids.weights { 4 } else { 3 };
                eng.compute(
                    k,
                    &Effect {
                        duration: chain.btime[i],
                        tmp: chain.btmp[i],
                        reads: &reads[..nr],
                        allocs: &[ids.grad(i)],
                        frees: &[ids.grad(i + 1), ids.sav(i + 1), ids.act(i + 1), ids.act(i)],
                    },
                )?;
                if ids.weights {
                    eng.invalidate_host(k, ids.weight(i));
                }
            }
            done[i] = true;
            Ok(())
        }
        Op::Compute { .. } => Err(eng.invalid(k, "a graph op (compute node) in a chain schedule")),
        Op::Free { tensor } => {
            let id = resolve(ids, eng, k, tensor)?;
            if matches!(tensor, Tensor::Weight(_)) {
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

fn resolve(ids: &Ids, eng: &Engine<'_>, k: usize, tensor: Tensor) -> Result<usize, SimError> {
    ids.of(tensor).ok_or_else(|| {
        let l = ids.l;
        let what = match tensor {
            Tensor::Data(_) => {
                format!("{tensor:?} (a graph tensor; chain schedules name Activation, Saved, Grad or Weight)")
            }
            Tensor::Weight(_) if !ids.weights => format!("{tensor:?} (the chain has no weights `w`)"),
            Tensor::Saved(0) => "Saved(0) (there is no saved set ā_0; a_0 is Activation(0))".to_string(),
            _ => format!("{tensor:?} (the chain has {l} stages)"),
        };
        eng.out_of_range(k, what)
    })
}
