//! Where a chain step's static tensors (each stage's weights, their gradient, their
//! optimizer state) are when it starts, and what a transfer of one means, read off the
//! schedule alone: the one reading the simulator (`pebble-sim`) and the executor
//! (`pebble-runtime`) share, so that the executor starts a step where the simulator
//! starts a period.
//!
//! * A stage's weights are updated in place by its backward (the fused update of Beaumont
//!   et al. 2022), unless the schedule has a [`Op::CpuUpdate`] for it: then the host CPU
//!   updates their host copy from the offloaded gradient, and the device copy is stale.
//! * An offload of a weight or optimizer state that is read again before its next
//!   offload, prefetch or free is an *upload*: the device copy stays until a free.
//! * A [periodic](Schedule::periodic) schedule is one period of a steady state: each
//!   tensor starts a step where the period's ops leave it.

use crate::{Op, Schedule, Tensor};

/// Where a tensor's copies are: on the device, and an up-to-date copy on the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Copies {
    /// A device copy.
    pub device: bool,
    /// A host copy (up to date, for a weight or a state).
    pub host: bool,
}

impl Copies {
    /// On the device only.
    pub const DEVICE: Copies = Copies { device: true, host: false };
}

/// Where one stage's static tensors are when a step begins.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StageStart {
    /// `Weight(i)`.
    pub weight: Copies,
    /// `WeightGrad(i)`.
    pub grad: Copies,
    /// `OptState(i)`.
    pub state: Copies,
}

impl StageStart {
    /// Everything on the device, nothing on the host: the start of a one-off step.
    pub const DEVICE: StageStart = StageStart { weight: Copies::DEVICE, grad: Copies::DEVICE, state: Copies::DEVICE };
}

/// Whether the schedule names the static tensors: a weight, gradient or state moved or
/// freed, a CPU update, or a periodic cycle. Such a schedule updates each stage in its
/// backward (or on the CPU) instead of once at the end of the step.
pub fn names_statics(schedule: &Schedule) -> bool {
    schedule.periodic
        || schedule.ops.iter().any(|op| {
            matches!(op, Op::CpuUpdate { .. })
                || matches!(op.tensor(), Some(Tensor::Weight(_) | Tensor::WeightGrad(_) | Tensor::OptState(_)))
        })
}

/// Which stages the host CPU updates: those with a [`Op::CpuUpdate`] in the schedule.
pub fn cpu_updated(ops: &[Op], l: usize) -> Vec<bool> {
    let mut on_cpu = vec![false; l];
    for op in ops {
        if let Op::CpuUpdate { stage } = *op {
            if stage < l {
                on_cpu[stage] = true;
            }
        }
    }
    on_cpu
}

/// Whether `op` reads `tensor` (a weight or an optimizer state) on the device.
pub fn reads_static(op: &Op, tensor: Tensor, on_cpu: &[bool]) -> bool {
    match (tensor, *op) {
        (Tensor::Weight(i), Op::Forward { stage, .. } | Op::Backward { stage }) => stage == i,
        (Tensor::OptState(i), Op::Backward { stage }) => stage == i && !on_cpu.get(i).copied().unwrap_or(false),
        _ => false,
    }
}

/// Whether the offload at `k` of `tensor` (a weight or an optimizer state) is an upload:
/// a read of it comes before its next offload, prefetch or free, looking on into the next
/// period if the schedule is periodic.
pub fn is_upload(ops: &[Op], k: usize, tensor: Tensor, periodic: bool, on_cpu: &[bool]) -> bool {
    if !matches!(tensor, Tensor::Weight(_) | Tensor::OptState(_)) {
        return false;
    }
    let n = ops.len();
    let ahead = if periodic { n - 1 } else { n - k - 1 };
    for step in 1..=ahead {
        let op = &ops[(k + step) % n];
        if reads_static(op, tensor, on_cpu) {
            return true;
        }
        if op.tensor() == Some(tensor) {
            return false;
        }
    }
    false
}

/// Where each stage's static tensors are when a step of `schedule` (on a chain of `l`
/// stages) begins: on the device for a one-off schedule; for a periodic one, where its
/// ops leave them at the period's end.
pub fn starts(schedule: &Schedule, l: usize) -> Vec<StageStart> {
    let mut st = vec![StageStart::DEVICE; l];
    if !schedule.periodic {
        return st;
    }
    let ops = &schedule.ops[..];
    let on_cpu = cpu_updated(ops, l);
    for (k, op) in ops.iter().enumerate() {
        match *op {
            Op::Offload { tensor, .. } | Op::Prefetch { tensor, .. } | Op::Free { tensor } => {
                let offload = matches!(op, Op::Offload { .. });
                let prefetch = matches!(op, Op::Prefetch { .. });
                let upload = offload && is_upload(ops, k, tensor, true, &on_cpu);
                let slot = match tensor {
                    Tensor::Weight(i) if i < l => &mut st[i].weight,
                    Tensor::OptState(i) if i < l => &mut st[i].state,
                    Tensor::WeightGrad(i) if i < l => {
                        let host = st[i].grad.host;
                        st[i].grad = if offload {
                            Copies { device: false, host: true }
                        } else if prefetch {
                            Copies { device: true, host }
                        } else {
                            Copies { device: false, host: false }
                        };
                        continue;
                    }
                    _ => continue,
                };
                *slot = if offload {
                    Copies { device: upload, host: true }
                } else if prefetch {
                    Copies { device: true, host: slot.host }
                } else {
                    Copies { device: false, host: slot.host }
                };
            }
            Op::Backward { stage: i } if i < l => {
                st[i].grad.device = true;
                if !on_cpu[i] {
                    st[i].weight.host = false;
                    st[i].state.host = false;
                }
            }
            Op::CpuUpdate { stage: i } if i < l => {
                st[i].grad.host = false;
                st[i].weight.host = true;
                // A CPU-updated state lives on the host.
                st[i].state = Copies { device: false, host: true };
            }
            _ => {}
        }
    }
    st
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::View;

    fn periodic(text: &str, l: usize, extra: &[(usize, Op)]) -> Schedule {
        let mut s = Schedule::from_notation(View::Chain, text).unwrap().resolve_loss(l);
        // Each extra op goes before the op at its index in `text`.
        for &(at, op) in extra.iter().rev() {
            s.ops.insert(at, op);
        }
        s.repeated()
    }

    fn t(kind: &str, tensor: Tensor) -> Op {
        match kind {
            "off" => Op::Offload { tensor, fraction: 1.0 },
            "pre" => Op::Prefetch { tensor, fraction: 1.0 },
            _ => Op::Free { tensor },
        }
    }

    #[test]
    fn the_period_starts_where_its_ops_leave_each_tensor() {
        // The simulator's example (4b): W0 prefetched for F0, dropped, prefetched for B0 and
        // offloaded after it: each period starts with W0 on the host only.
        let w0 = Tensor::Weight(0);
        let s = periodic(
            "F0all F1all L B1 B0",
            2,
            &[(0, t("pre", w0)), (1, t("free", w0)), (4, t("pre", w0)), (5, t("off", w0))],
        );
        let st = starts(&s, 2);
        assert_eq!(st[0].weight, Copies { device: false, host: true });
        assert_eq!(st[1], StageStart::DEVICE);
        // Uploaded after B0 instead (read by the next period's F0 before its free).
        let s = periodic("F0all F1all L B1 B0", 2, &[(1, t("free", w0)), (4, t("pre", w0)), (5, t("off", w0))]);
        assert!(is_upload(&s.ops, 7, w0, true, &[false, false]));
        assert_eq!(starts(&s, 2)[0].weight, Copies { device: true, host: true });
        // Not periodic: everything on the device.
        assert_eq!(starts(&Schedule { periodic: false, ..s }, 2)[0], StageStart::DEVICE);
    }

    #[test]
    fn a_cpu_updated_stage_starts_with_its_weights_and_state_on_the_host() {
        // 4c: F0all [pre W1] F1all L B1 [off G1] [cpu 1] [free W1] B0.
        let s = periodic(
            "F0all F1all L B1 B0",
            2,
            &[
                (1, t("pre", Tensor::Weight(1))),
                (4, t("off", Tensor::WeightGrad(1))),
                (4, Op::CpuUpdate { stage: 1 }),
                (4, t("free", Tensor::Weight(1))),
            ],
        );
        let st = starts(&s, 2);
        assert_eq!(st[1].weight, Copies { device: false, host: true });
        assert_eq!(st[1].grad, Copies { device: false, host: false });
        assert_eq!(st[1].state, Copies { device: false, host: true });
        assert_eq!(st[0], StageStart::DEVICE);
        assert!(names_statics(&s));
        assert_eq!(cpu_updated(&s.ops, 2), vec![false, true]);
    }
}
