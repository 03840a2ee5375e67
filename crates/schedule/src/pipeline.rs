//! The pipeline view of the schedule IR (Shilova, Part III): the layers of a chain are
//! cut into [`PipeStage`]s, each a range of chain stages placed on one device, and a
//! schedule lists, for each device, the passes it runs ([`Op::Run`]) in order, with the
//! [`Op::Send`]s that carry activations and gradients between devices.
//!
//! The ops of one device run in the order they are listed; nothing else about time is
//! written down: the simulator (`pebble_sim::pipeline`) starts each op as soon as its
//! device is free and its inputs are there. A *periodic* schedule is one period of a
//! steady state: period `j` runs each op on micro-batch `j·k + micro` (`k` =
//! [`Schedule::microbatches`]), as the thesis's index shifts do. A schedule that is not
//! periodic is one training step over micro-batches `0..k`, ending with a flush.

use serde::{Deserialize, Serialize};

use crate::{Op, Schedule, ScheduleError, View};

/// A pass of a pipeline stage over one micro-batch. The letters are those of PyTorch's
/// pipeline schedule runtime (`torch.distributed.pipelining`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Pass {
    /// The forward: reads the stage's input, keeps what the backward needs.
    F,
    /// The whole backward: the input gradient and the weight gradient.
    B,
    /// The first half of a split backward: the input gradient only (Zero Bubble's `B`).
    I,
    /// The second half of a split backward: the weight gradient (Zero Bubble's `W`).
    W,
}

/// One pipeline stage: chain stages `first..=last` on `device`. The last pipeline stage
/// also runs the loss.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PipeStage {
    /// The first chain stage.
    pub first: usize,
    /// The last chain stage (inclusive).
    pub last: usize,
    /// The device.
    pub device: usize,
}

impl Schedule {
    /// A pipeline schedule: `stages` cut the chain in order, `ops` list what each device
    /// runs, `microbatches` per period (or per step).
    pub fn pipeline(devices: usize, microbatches: usize, stages: Vec<PipeStage>, ops: Vec<Op>) -> Schedule {
        Schedule {
            devices: Some(devices),
            microbatches: Some(microbatches),
            stages,
            ..Schedule::new(View::Pipeline, ops)
        }
    }

    /// What identifies a micro-batch index among the ops: its residue modulo `k` in a
    /// periodic schedule (where it is a shift), itself in a flushed one.
    pub fn residue(&self) -> impl Fn(i64) -> i64 {
        let k = if self.periodic { self.microbatches.unwrap_or(1).max(1) as i64 } else { 0 };
        move |m| if k > 0 { m.rem_euclid(k) } else { m }
    }

    /// The layers on each device: `allocation()[d]` lists the chain stages device `d` runs.
    pub fn allocation(&self) -> Vec<Vec<usize>> {
        let mut out = vec![Vec::new(); self.devices.unwrap_or(1)];
        for s in &self.stages {
            if let Some(d) = out.get_mut(s.device) {
                d.extend(s.first..=s.last);
            }
        }
        for d in &mut out {
            d.sort_unstable();
        }
        out
    }

    /// Adds the sends a pipeline schedule needs: after each pass whose output crosses to
    /// another device (an `F` feeding the next stage, a `B` or `I` feeding the previous
    /// one), a send of it. Sends already there are kept; none is added twice (in a
    /// periodic schedule a send covers the micro-batches of its residue modulo `k`,
    /// whatever its shift).
    pub fn with_sends(mut self) -> Schedule {
        let stages = self.stages.clone();
        let residue = self.residue();
        let mut ops = Vec::with_capacity(self.ops.len() * 2);
        let existing: std::collections::HashSet<(usize, i64, bool)> = self
            .ops
            .iter()
            .filter_map(|op| match *op {
                Op::Send { stage, micro, grad, .. } => Some((stage, residue(micro), grad)),
                _ => None,
            })
            .collect();
        for op in std::mem::take(&mut self.ops) {
            ops.push(op);
            if let Op::Run { stage, micro, pass, .. } = op {
                let target = match pass {
                    Pass::F if stage + 1 < stages.len() => Some((stage + 1, false)),
                    Pass::B | Pass::I if stage > 0 => Some((stage - 1, true)),
                    _ => None,
                };
                if let Some((next, grad)) = target {
                    let (from, to) = (stages[stage].device, stages[next].device);
                    if from != to && !existing.contains(&(stage, residue(micro), grad)) {
                        ops.push(Op::Send { from, to, stage, micro, grad });
                    }
                }
            }
        }
        self.ops = ops;
        self
    }
}

/// One op of an unrolled pipeline schedule: which op of the schedule, on which absolute
/// micro-batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unrolled {
    /// The op's index in [`Schedule::ops`].
    pub op: usize,
    /// The micro-batch it processes.
    pub micro: i64,
    /// The period it belongs to (`micro = period·k + shift`; 0 in a flushed schedule).
    pub period: i64,
}

/// How many periods an op of a periodic schedule may reach back or ahead of the period
/// that runs it (its micro-batch shift over `k`): far beyond any pipeline's depth (the
/// solvers' shifts grow with the stage count), and small enough that unrolling the
/// schedule over its span (the simulator, the executor) stays within memory.
pub const MAX_SHIFT_PERIODS: i64 = 4096;

/// The most devices a pipeline schedule may name: as many as `pebble pipeline` plans on.
/// The simulator keeps a few numbers per device; a file that said 2·10^6 devices took
/// 80 MB to check.
pub const MAX_DEVICES: usize = 1024;

/// The most micro-batches a pipeline schedule may have (per period, if periodic): as many
/// as `pebble pipeline --microbatches` takes. 2^64 − 2 once wrapped to −2 in the
/// simulator's arithmetic and overflowed a vector's capacity.
pub const MAX_MICROBATCHES: usize = 4096;

impl Schedule {
    /// Why an op's micro-batch index `micro` is out of range, if it is: in a flushed
    /// schedule it is the micro-batch itself, in `0..k`; in a periodic one a shift of at
    /// most [`MAX_SHIFT_PERIODS`] periods either way, `-4096·k..=4096·k`.
    pub fn micro_out_of_range(&self, micro: i64) -> Option<String> {
        let k = i64::try_from(self.microbatches.unwrap_or(1).max(1)).unwrap_or(i64::MAX);
        if !self.periodic {
            return (!(0..k).contains(&micro)).then(|| {
                format!(
                    "micro-batch {micro} is out of range: a flushed schedule runs 0..={} (`microbatches` = {k})",
                    k - 1
                )
            });
        }
        let most = k.saturating_mul(MAX_SHIFT_PERIODS);
        (!(-most..=most).contains(&micro)).then(|| {
            format!(
                "micro-batch shift {micro} is out of range: a periodic schedule's ops reach at most \
                 {MAX_SHIFT_PERIODS} periods back or ahead, shifts {}..={most} (`microbatches` = {k})",
                -most
            )
        })
    }

    /// The least and the greatest period offset of the ops' micro-batches (`⌊micro / k⌋`,
    /// 0 included): how many periods an op reaches back or ahead of the one it runs in.
    pub fn shift_span(&self) -> (i64, i64) {
        let k = self.microbatches.unwrap_or(1).max(1) as i64;
        self.ops
            .iter()
            .filter_map(|op| match *op {
                Op::Run { micro, .. } | Op::Send { micro, .. } => Some(micro.div_euclid(k)),
                _ => None,
            })
            .fold((0, 0), |(a, b), h| (a.min(h), b.max(h)))
    }

    /// The ops a pipeline schedule runs on micro-batches `0..count`, in order: a flushed
    /// schedule's ops once (`count` is its micro-batch count), or a periodic schedule's
    /// periods one after the other, period `j` running each op on `j·k + micro`, keeping
    /// the micro-batches in `0..count` (the fill and drain of the pipeline: no op of a
    /// micro-batch outside is run). Each device's ops, filtered from this list, are its
    /// program.
    pub fn unroll(&self, count: usize) -> Vec<Unrolled> {
        let k = self.microbatches.unwrap_or(1).max(1) as i64;
        let micro = |op: &Op| match *op {
            Op::Run { micro, .. } | Op::Send { micro, .. } => Some(micro),
            _ => None,
        };
        if !self.periodic {
            return (0..self.ops.len())
                .filter_map(|i| {
                    micro(&self.ops[i]).filter(|m| (0..count as i64).contains(m)).map(|m| Unrolled {
                        op: i,
                        micro: m,
                        period: 0,
                    })
                })
                .collect();
        }
        let (lo, hi) = self.shift_span();
        let periods = (count as i64 + k - 1) / k;
        let mut out = Vec::new();
        for j in (-hi - 1)..(periods - lo + 1) {
            for (i, op) in self.ops.iter().enumerate() {
                if let Some(h) = micro(op) {
                    let m = j * k + h;
                    if (0..count as i64).contains(&m) {
                        out.push(Unrolled { op: i, micro: m, period: j });
                    }
                }
            }
        }
        out
    }
}

/// Checks that a pipeline schedule's ops agree with its stages: stages cut the chain in
/// order, devices exist, each op's micro-batch is in range
/// ([`Schedule::micro_out_of_range`]), each run is on its stage's device, each send goes
/// between the right devices.
pub(crate) fn check(s: &Schedule) -> Result<(), ScheduleError> {
    let bad = |field: String, why: String| Err(ScheduleError::Pipeline { field, why });
    let Some(devices) = s.devices else {
        return bad("devices".into(), "a pipeline schedule needs its device count".into());
    };
    if devices == 0 {
        return bad("devices".into(), "must be at least 1".into());
    }
    if devices > MAX_DEVICES {
        return bad("devices".into(), format!("{devices} devices: at most {MAX_DEVICES}"));
    }
    match s.microbatches {
        None => return bad("microbatches".into(), "a pipeline schedule needs its micro-batch count".into()),
        Some(0) => return bad("microbatches".into(), "must be at least 1".into()),
        Some(k) if k > MAX_MICROBATCHES => {
            return bad("microbatches".into(), format!("{k} micro-batches: at most {MAX_MICROBATCHES}"))
        }
        Some(_) => {}
    }
    if s.stages.is_empty() {
        return bad("stages".into(), "a pipeline schedule needs at least one stage".into());
    }
    let mut next = 0;
    for (i, st) in s.stages.iter().enumerate() {
        if st.first != next || st.last < st.first || st.last == usize::MAX {
            return bad(
                format!("stages[{i}]"),
                format!("stages must cut the chain in order: expected first = {next} and last >= first"),
            );
        }
        if st.device >= devices {
            return bad(
                format!("stages[{i}].device"),
                format!("device {} does not exist ({devices} devices)", st.device),
            );
        }
        next = st.last + 1;
    }
    let n = s.stages.len();
    for (i, op) in s.ops.iter().enumerate() {
        if let Op::Run { micro, .. } | Op::Send { micro, .. } = *op {
            if let Some(why) = s.micro_out_of_range(micro) {
                return bad(format!("ops[{i}].micro"), why);
            }
        }
        match *op {
            Op::Run { device, stage, .. } => {
                if stage >= n {
                    return bad(format!("ops[{i}].stage"), format!("stage {stage} does not exist ({n} stages)"));
                }
                if device != s.stages[stage].device {
                    return bad(
                        format!("ops[{i}].device"),
                        format!("stage {stage} is on device {}, not {device}", s.stages[stage].device),
                    );
                }
            }
            Op::Send { from, to, stage, grad, .. } => {
                let peer = if grad { stage.checked_sub(1) } else { stage.checked_add(1).filter(|&p| p < n) };
                let Some(peer) = peer.filter(|_| stage < n) else {
                    return bad(format!("ops[{i}].stage"), format!("stage {stage} has no stage to send to"));
                };
                if (from, to) != (s.stages[stage].device, s.stages[peer].device) || from == to {
                    return bad(
                        format!("ops[{i}]"),
                        format!(
                            "a send from stage {stage} to stage {peer} goes from device {} to device {}, not {from} to {to}",
                            s.stages[stage].device, s.stages[peer].device
                        ),
                    );
                }
            }
            _ => return bad(format!("ops[{i}]"), "a pipeline schedule runs only `run` and `send` ops".into()),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn two_stage() -> Schedule {
        let stages = vec![PipeStage { first: 0, last: 1, device: 0 }, PipeStage { first: 2, last: 2, device: 1 }];
        let run = |device, stage, pass| Op::Run { device, stage, micro: 0, pass };
        Schedule::pipeline(
            2,
            1,
            stages,
            vec![run(0, 0, Pass::F), run(1, 1, Pass::F), run(1, 1, Pass::B), run(0, 0, Pass::B)],
        )
        .with_sends()
    }

    #[test]
    fn sends_follow_the_passes_that_cross_devices() {
        let s = two_stage();
        let sends: Vec<_> = s.ops.iter().filter(|o| matches!(o, Op::Send { .. })).copied().collect();
        assert_eq!(
            sends,
            vec![
                Op::Send { from: 0, to: 1, stage: 0, micro: 0, grad: false },
                Op::Send { from: 1, to: 0, stage: 1, micro: 0, grad: true }
            ]
        );
        assert_eq!(s.clone().with_sends(), s, "no send is added twice");
        assert_eq!(s.allocation(), vec![vec![0, 1], vec![2]]);
    }

    #[test]
    fn json_round_trip_and_version_one_still_loads() {
        let s = two_stage().with_solver("test");
        let text = s.to_json();
        assert!(text.contains(r#""op": "run""#) && text.contains(r#""pass": "F""#) && text.contains(r#""version": 2"#));
        assert_eq!(Schedule::from_json(&text).unwrap(), s);
        let v1 = Schedule::from_json(r#"{"version":1,"view":"chain","ops":[{"op":"backward","stage":0}]}"#).unwrap();
        assert_eq!(v1.version, 1);
        assert!(v1.stages.is_empty());
    }

    #[test]
    fn inconsistent_pipelines_name_the_field() {
        let mut s = two_stage();
        s.ops[0] = Op::Run { device: 1, stage: 0, micro: 0, pass: Pass::F };
        let e = Schedule::from_json(&s.to_json()).unwrap_err().to_string();
        assert_eq!(e, "field `ops[0].device`: stage 0 is on device 0, not 1");
        let mut s = two_stage();
        s.stages[1].first = 3;
        let e = Schedule::from_json(&s.to_json()).unwrap_err().to_string();
        assert!(e.starts_with("field `stages[1]`"), "{e}");
        let mut s = two_stage();
        s.ops[1] = Op::Send { from: 1, to: 0, stage: 0, micro: 0, grad: false };
        let e = Schedule::from_json(&s.to_json()).unwrap_err().to_string();
        assert!(e.starts_with("field `ops[1]`: a send from stage 0 to stage 1 goes from device 0 to device 1"), "{e}");
        let mut s = two_stage();
        s.devices = None;
        assert!(Schedule::from_json(&s.to_json()).unwrap_err().to_string().starts_with("field `devices`"));
    }

    #[test]
    fn absurd_counts_and_indices_name_the_field() {
        // Found by the CLI's fuzz test (issue 47): 2·10^6 devices took the simulator 80 MB,
        // 2^64 − 2 micro-batches wrapped to −2 in its arithmetic, and a stage or a send at
        // 2^64 − 1 overflowed here.
        let e = |s: &Schedule| Schedule::from_json(&s.to_json()).unwrap_err().to_string();
        let mut s = two_stage();
        s.devices = Some(2_000_006);
        assert!(e(&s).starts_with("field `devices`: 2000006 devices: at most 1024"), "{}", e(&s));
        let mut s = two_stage();
        s.microbatches = Some(usize::MAX - 1);
        assert!(e(&s).starts_with("field `microbatches`"), "{}", e(&s));
        let mut s = two_stage();
        s.stages[1].last = usize::MAX;
        assert!(e(&s).starts_with("field `stages[1]`"), "{}", e(&s));
        let mut s = two_stage();
        s.ops[1] = Op::Send { from: 0, to: 1, stage: usize::MAX, micro: 0, grad: false };
        assert!(e(&s).starts_with("field `ops[1].stage`"), "{}", e(&s));
        let mut s = two_stage();
        s.devices = Some(MAX_DEVICES);
        s.microbatches = Some(MAX_MICROBATCHES);
        Schedule::from_json(&s.to_json()).expect("the limits themselves");
    }

    #[test]
    fn micro_batches_out_of_range_name_the_field() {
        // A shift of 10^9 periods once unrolled the simulator over 4·10^9 periods.
        let mut s = two_stage();
        s.periodic = true;
        s.ops[1] = Op::Run { device: 1, stage: 1, micro: 1_000_000_000, pass: Pass::F };
        let e = Schedule::from_json(&s.to_json()).unwrap_err().to_string();
        assert!(e.starts_with("field `ops[1].micro`: micro-batch shift 1000000000 is out of range"), "{e}");
        assert!(e.contains("-4096..=4096"), "{e}");
        s.ops[1] = Op::Run { device: 1, stage: 1, micro: i64::MIN, pass: Pass::F };
        assert!(Schedule::from_json(&s.to_json()).unwrap_err().to_string().starts_with("field `ops[1].micro`"));
        s.ops[1] = Op::Run { device: 1, stage: 1, micro: -MAX_SHIFT_PERIODS, pass: Pass::F };
        Schedule::from_json(&s.to_json()).expect("the farthest shift allowed");
        // A flushed step runs micro-batches 0..k only.
        let mut s = two_stage();
        s.ops[0] = Op::Run { device: 0, stage: 0, micro: 1, pass: Pass::F };
        let e = Schedule::from_json(&s.to_json()).unwrap_err().to_string();
        assert_eq!(
            e,
            "field `ops[0].micro`: micro-batch 1 is out of range: a flushed schedule runs 0..=0 (`microbatches` = 1)"
        );
    }
}
