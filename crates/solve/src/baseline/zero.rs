//! DeepSpeed's ZeRO offloading as practised: `zero-offload` and `zero-infinity`.
//!
//! Both are fixed policies, not optimizers: each builds one periodic schedule per
//! activation strategy ([`Activations`]: store-all, or a checkpoint at every block as
//! Hugging Face's gradient checkpointing does, which the thesis's ZeRO baselines used)
//! and keeps the fastest whose simulated peak fits the budget. Both need a chain that
//! names its weights `w`, weight gradients `g` and optimizer states `o`. A stage none of
//! whose `w[i]`, `g[i]`, `o[i]` is positive has nothing to move and gets no op; every
//! other stage is updated on the host CPU (a stage whose gradient is unnamed, a tied
//! weight's reader, gets a CPU update of a zero-size gradient, so that its weights keep
//! an up-to-date host copy).
//!
//! The shared machinery ([`Activations`], [`require_optimizer_fields`], and
//! [`Candidates`], which every fixed baseline uses) is also what `paged-adam` (see
//! [`super::paged_adam`]) uses.

use pebble_graph::Chain;
use pebble_schedule::{Op, Schedule, Tensor, View};

use super::{segmented_ops, store_all_ops, Candidates};
use crate::{Prepared, Problem, SolveError, SolveOptions, Solver};

/// How a practice baseline keeps activations for the backward.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activations {
    /// Plain autograd: `F_all` at every stage, then the whole backward.
    StoreAll,
    /// A checkpoint at every block (Hugging Face's `gradient_checkpointing_enable`,
    /// PyTorch's `checkpoint_sequential` with one segment per stage): `F_ck` forward, then
    /// per stage in the backward `F_all` and `B`. The last stage runs `F_all` at once, as
    /// recomputing it right away would only cost time.
    CheckpointBlocks,
}

impl Activations {
    /// Both strategies, store-all first.
    pub const BOTH: [Activations; 2] = [Activations::StoreAll, Activations::CheckpointBlocks];

    /// The compute ops of one step on `l` stages.
    pub fn compute_ops(self, l: usize) -> Vec<Op> {
        match self {
            Activations::StoreAll => store_all_ops(l),
            Activations::CheckpointBlocks => segmented_ops(l, &(0..l).collect::<Vec<_>>()),
        }
    }
}

/// Checks that the chain names its weights `w`, weight gradients `g` and optimizer
/// states `o`, one per stage; else [`SolveError::Unsupported`] naming the field.
pub fn require_optimizer_fields(chain: &Chain, solver: &'static str) -> Result<(), SolveError> {
    let l = chain.len();
    for (v, name, what) in
        [(&chain.w, "w", "weights"), (&chain.g, "g", "weight gradients"), (&chain.o, "o", "optimizer states")]
    {
        match v {
            None => {
                let why = format!("it needs the chain's {what} (field `{name}`), which this chain does not name");
                return Err(SolveError::Unsupported { solver, why });
            }
            Some(v) if v.len() != l => {
                let why = format!("field `{name}` has {} entries for {l} stages", v.len());
                return Err(SolveError::Unsupported { solver, why });
            }
            Some(_) => {}
        }
    }
    Ok(())
}

/// The stages that hold parameter memory of their own (a positive `w`, `g` or `o`).
fn param_stages(chain: &Chain) -> Vec<bool> {
    let at = |v: &Option<Vec<u64>>, i: usize| v.as_ref().and_then(|v| v.get(i)).copied().unwrap_or(0);
    (0..chain.len()).map(|i| at(&chain.w, i) > 0 || at(&chain.g, i) > 0 || at(&chain.o, i) > 0).collect()
}

fn offload(tensor: Tensor) -> Op {
    Op::Offload { tensor, fraction: 1.0 }
}

fn prefetch(tensor: Tensor) -> Op {
    Op::Prefetch { tensor, fraction: 1.0 }
}

/// What follows `B_i` on a CPU-updated stage: the gradient goes to the host, the CPU
/// steps, and the device copy of the weights (stale from then on) is dropped.
fn cpu_step(ops: &mut Vec<Op>, i: usize) {
    ops.push(offload(Tensor::WeightGrad(i)));
    ops.push(Op::CpuUpdate { stage: i });
    ops.push(Op::Free { tensor: Tensor::Weight(i) });
}

/// One period of ZeRO-Offload: the weights of every parameter stage prefetched at the
/// period's start (in stage order, ahead of the forward), the compute ops of `act`, and
/// after each parameter stage's `B_i`: `Offload(WeightGrad(i))`, `CpuUpdate{i}`,
/// `Free(Weight(i))`. Optimizer states are never named: a CPU-updated state lives on the
/// host. Not yet marked periodic.
pub fn zero_offload_ops(chain: &Chain, act: Activations) -> Vec<Op> {
    let l = chain.len();
    let params = param_stages(chain);
    let mut ops: Vec<Op> = (0..l).filter(|&i| params[i]).map(|i| prefetch(Tensor::Weight(i))).collect();
    for op in act.compute_ops(l) {
        ops.push(op);
        if let Op::Backward { stage: i } = op {
            if i < l && params[i] {
                cpu_step(&mut ops, i);
            }
        }
    }
    ops
}

/// How close two uses of a stage's weights must be (in compute ops: the next op, or the
/// one after) for ZeRO-Infinity to keep them resident in between, as DeepSpeed's
/// `stage3_max_reuse_distance` does for a parameter about to be used again. It keeps the
/// last stage's weights across the loss, and one fetch serves a block's recomputation
/// and its backward.
const REUSE: usize = 2;

/// One period of ZeRO-Infinity: every parameter stage's weights live on the host and are
/// fetched for each run of uses (uses at most [`REUSE`] compute ops apart form a run).
/// A run's prefetch is issued one compute op ahead (DeepSpeed's prefetch of the next
/// block): before the compute op that precedes its first use, at the period's start for
/// a first use at op 0 or 1. After a run that ends with a forward, `Free(Weight(i))`;
/// after one that ends with `B_i`: `Offload(WeightGrad(i))`, `CpuUpdate{i}`,
/// `Free(Weight(i))`. Not yet marked periodic.
pub fn zero_infinity_ops(chain: &Chain, act: Activations) -> Vec<Op> {
    let l = chain.len();
    let params = param_stages(chain);
    let compute = act.compute_ops(l);
    let stage_of = |op: &Op| match *op {
        Op::Forward { stage, .. } => Some(stage),
        Op::Backward { stage } if stage < l => Some(stage),
        _ => None,
    };
    // before[k]: prefetches issued before compute op k (k = 0: at the period's start);
    // after[k]: what follows compute op k.
    let mut before: Vec<Vec<Op>> = vec![Vec::new(); compute.len()];
    let mut after: Vec<Vec<Op>> = vec![Vec::new(); compute.len()];
    for s in (0..l).filter(|&s| params[s]) {
        let uses: Vec<usize> = (0..compute.len()).filter(|&k| stage_of(&compute[k]) == Some(s)).collect();
        let mut runs: Vec<(usize, usize)> = Vec::new();
        for &k in &uses {
            match runs.last_mut() {
                Some((_, end)) if k - *end <= REUSE => *end = k,
                _ => runs.push((k, k)),
            }
        }
        for (first, last) in runs {
            before[first.saturating_sub(1)].push(prefetch(Tensor::Weight(s)));
            if matches!(compute[last], Op::Backward { .. }) {
                cpu_step(&mut after[last], s);
            } else {
                after[last].push(Op::Free { tensor: Tensor::Weight(s) });
            }
        }
    }
    let mut ops = Vec::new();
    for (k, op) in compute.into_iter().enumerate() {
        ops.append(&mut before[k]);
        ops.push(op);
        ops.append(&mut after[k]);
    }
    ops
}

/// Prepares a chain policy: checks the chain names `w`, `g` and `o`, then scores the
/// periodic schedules `build` makes for each activation strategy.
fn prepare_policy<'a>(
    solver: &'static str,
    problem: Problem<'a>,
    options: &'a SolveOptions,
    build: fn(&Chain, Activations) -> Vec<Op>,
) -> Result<Box<dyn Prepared + 'a>, SolveError> {
    let chain = problem.chain_for(solver)?;
    require_optimizer_fields(chain, solver)?;
    let schedules = Activations::BOTH.map(|act| Schedule::new(View::Chain, build(chain, act)).repeated());
    Ok(Box::new(Candidates::score(solver, Problem::Chain(chain), options, schedules)))
}

/// `zero-offload`: DeepSpeed's ZeRO-Offload (Ren et al., "ZeRO-Offload: Democratizing
/// Billion-Scale Model Training", USENIX ATC 2021;
/// <https://www.deepspeed.ai/tutorials/zero-offload/>), on one device.
///
/// As documented: the optimizer states live on the host and the optimizer step runs on
/// the CPU; the parameters stay on the device; each gradient is offloaded as the
/// backward produces it; the updated parameters are copied back to the device before the
/// next forward. Here, per period ([`zero_offload_ops`]): `Prefetch(Weight(i))` for every
/// stage at the period's start, in stage order; the forward and backward of
/// [`Activations`] (store-all, or a checkpoint at every block, the faster that fits);
/// after each `B_i`: `Offload(WeightGrad(i))`, `CpuUpdate{i}`, and `Free(Weight(i))`
/// (the device copy is stale once the CPU has stepped). In the steady state the host copy
/// of the weights is current from the previous period's CPU update, so nothing is
/// uploaded.
///
/// Simplified: DeepSpeed keeps fp16 parameters on the device and an fp32 master copy
/// with the states on the host; here the device holds the chain's weights `w` and the
/// host its states `o` (which under `--master-weights` include the master copy).
/// Gradients move per stage, not in `reduce_bucket_size` buckets, and the copy back is
/// a stage's weights each, not one flat buffer. The step is not delayed (no
/// "delayed parameter update"): the next forward waits for the last CPU step. The device
/// copy is dropped while the CPU steps and fetched again (the memory is free in
/// between), where DeepSpeed overwrites it in place.
pub struct ZeroOffload;

impl Solver for ZeroOffload {
    fn name(&self) -> &'static str {
        "zero-offload"
    }

    fn description(&self) -> &'static str {
        "DeepSpeed ZeRO-Offload: optimizer states and the step on the host CPU, gradients offloaded as produced, \
         weights on the device (copied back before the forward); store-all or a checkpoint per block"
    }

    fn prepare<'a>(
        &'a self,
        problem: Problem<'a>,
        options: &'a SolveOptions,
    ) -> Result<Box<dyn Prepared + 'a>, SolveError> {
        prepare_policy(self.name(), problem, options, zero_offload_ops)
    }
}

inventory::submit!(crate::Registration(&ZeroOffload));

/// `zero-infinity`: DeepSpeed's ZeRO stage 3 with `offload_param` and
/// `offload_optimizer` on the CPU (Rajbhandari et al., "ZeRO-Infinity: Breaking the GPU
/// Memory Wall for Extreme Scale Deep Learning", SC 2021;
/// <https://www.deepspeed.ai/tutorials/zero/>), on one device, without NVMe.
///
/// As documented: parameters, gradients and optimizer states live on the host; each
/// block's parameters are fetched right before its forward and released after it,
/// fetched again for its backward, the gradient is offloaded after the backward and the
/// optimizer step runs on the CPU; DeepSpeed prefetches ahead
/// (`stage3_prefetch_bucket_size`). Here, per period ([`zero_infinity_ops`]): each
/// stage's weights are prefetched one compute op ahead of their use and freed after it;
/// with a checkpoint per block the backward's recomputation and `B_i` share one fetch,
/// and the last stage's weights stay across the loss (`stage3_max_reuse_distance`);
/// after each `B_i`: `Offload(WeightGrad(i))`, `CpuUpdate{i}`, `Free(Weight(i))`.
/// Store-all or a checkpoint per block, the faster that fits.
///
/// Simplified: one stage's weights per fetch instead of a bucket of
/// `stage3_prefetch_bucket_size` elements, and no `stage3_param_persistence_threshold`
/// (small parameters are fetched like the others); the unnamed static memory (tied
/// weights' gradients and states) stays on the device; no delayed update, as in
/// [`ZeroOffload`].
pub struct ZeroInfinity;

impl Solver for ZeroInfinity {
    fn name(&self) -> &'static str {
        "zero-infinity"
    }

    fn description(&self) -> &'static str {
        "DeepSpeed ZeRO-Infinity (stage 3, parameters and optimizer on the CPU): weights fetched per block one op \
         ahead and freed after use, gradients offloaded, the step on the host CPU; store-all or a checkpoint per block"
    }

    fn prepare<'a>(
        &'a self,
        problem: Problem<'a>,
        options: &'a SolveOptions,
    ) -> Result<Box<dyn Prepared + 'a>, SolveError> {
        prepare_policy(self.name(), problem, options, zero_infinity_ops)
    }
}

inventory::submit!(crate::Registration(&ZeroInfinity));
