//! `paged-adam`: bitsandbytes' paged optimizers
//! (<https://huggingface.co/docs/bitsandbytes/main/en/optimizers#paged-optimizers>).
//!
//! As documented: the optimizer states are allocated in CUDA unified memory; when the
//! device runs short they are evicted to host memory and paged back in when the
//! optimizer step needs them (bitsandbytes prefetches a parameter's state right before
//! its update). Weights and gradients stay on the device and the update runs there.
//!
//! Here the update is the one fused into `B_i`, so a paged stage's state is prefetched
//! right before `B_i` (issued when the op before it ends, so that `B_i` waits for it, as
//! the update waits for its page-in) and offloaded right after it, the host copy being the
//! home of the state between updates. Only as many states are paged as the budget needs:
//! the candidates page the `k` largest states (ties: the lower stage), for every `k` from
//! none to all, under either activation strategy ([`Activations`]: store-all, or a
//! checkpoint per block), and the fastest that fits wins (ties: the lower peak, then the
//! fewer pages). Paging costs time (the backward waits for the page-in), so the winner
//! pages the fewest states that make its strategy fit. Largest first is a plain rule,
//! not a search: a paged state is back on the device during its own backward, so paging
//! the state of the stage whose backward holds the peak does not lower the peak (among
//! equal states the lower stages, whose backwards come last, go first).
//!
//! Simplified: unified memory pages on demand, page by page, and evicts only under
//! pressure; here a whole stage's state moves at once, and it is written back after every
//! update rather than when the memory is wanted. Stages whose state is unnamed (tied
//! weights) keep it on the device.

use pebble_graph::Chain;
use pebble_schedule::{Op, Schedule, Tensor, View};

use super::zero::{require_optimizer_fields, Activations};
use super::Candidates;
use crate::{Prepared, Problem, SolveError, SolveOptions, Solver};

/// One period of paged Adam with the stages in `paged` paging their state:
/// `Prefetch(OptState(i))` right before `B_i` and `Offload(OptState(i))` right after it,
/// around the compute ops of `act`. Not yet marked periodic.
pub fn paged_adam_ops(l: usize, paged: &[bool], act: Activations) -> Vec<Op> {
    let mut ops = Vec::new();
    for op in act.compute_ops(l) {
        let paged_stage = match op {
            Op::Backward { stage } if stage < l && paged.get(stage).copied().unwrap_or(false) => Some(stage),
            _ => None,
        };
        if let Some(i) = paged_stage {
            ops.push(Op::Prefetch { tensor: Tensor::OptState(i), fraction: 1.0 });
        }
        ops.push(op);
        if let Some(i) = paged_stage {
            ops.push(Op::Offload { tensor: Tensor::OptState(i), fraction: 1.0 });
        }
    }
    ops
}

/// The stages with a state (`o[i] > 0`), largest state first (ties: the lower stage):
/// the order in which paged Adam pages them.
pub fn paging_order(o: &[u64]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..o.len()).filter(|&i| o[i] > 0).collect();
    order.sort_by_key(|&i| (std::cmp::Reverse(o[i]), i));
    order
}

/// Every candidate period: for each activation strategy, the `k` largest states paged,
/// `k` from 0 up.
pub fn paged_adam_schedules(chain: &Chain) -> Vec<Schedule> {
    let l = chain.len();
    let order = paging_order(chain.o.as_deref().unwrap_or(&[]));
    let mut out = Vec::new();
    for act in Activations::BOTH {
        let mut paged = vec![false; l];
        for k in 0..=order.len() {
            if k > 0 {
                paged[order[k - 1]] = true;
            }
            out.push(Schedule::new(View::Chain, paged_adam_ops(l, &paged, act)).repeated());
        }
    }
    out
}

/// `paged-adam`: bitsandbytes' paged optimizer (see the module docs).
pub struct PagedAdam;

impl Solver for PagedAdam {
    fn name(&self) -> &'static str {
        "paged-adam"
    }

    fn description(&self) -> &'static str {
        "bitsandbytes paged optimizers: the largest optimizer states paged in before their (device) update and out \
         after it, as few as the budget needs; store-all or a checkpoint per block"
    }

    fn prepare<'a>(
        &'a self,
        problem: Problem<'a>,
        options: &'a SolveOptions,
    ) -> Result<Box<dyn Prepared + 'a>, SolveError> {
        let chain = problem.chain_for(self.name())?;
        require_optimizer_fields(chain, self.name())?;
        Ok(Box::new(Candidates::score(self.name(), Problem::Chain(chain), options, paged_adam_schedules(chain))))
    }
}

inventory::submit!(crate::Registration(&PagedAdam));
