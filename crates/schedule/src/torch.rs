//! Export of a pipeline schedule to PyTorch's pipeline schedule runtime
//! (`torch.distributed.pipelining.schedules._PipelineScheduleRuntime`), so that a pebble
//! plan runs on PyTorch ranks as it is.
//!
//! The format is the one `_PipelineScheduleRuntime._load_csv(path)` reads (its default
//! `format="compute_only"`), as of PyTorch [`TORCH_VERSION`]: one CSV row per rank, in
//! rank order, each cell one compute action `{stage}{F|B|I|W}{micro}` (`0F3`: stage 0's
//! forward of micro-batch 3; `I` and `W` are the two halves of a split backward). A
//! pebble pipeline stage is PyTorch's stage index, a device is a rank. The stage-to-rank
//! map is not a field of its own: PyTorch infers it from the rows (each stage's actions
//! sit in the row of the one rank that runs it, `_validate_schedule`), and
//! [`stage_to_rank`] gives the same map. Sends are not exported: the runtime adds the
//! sends and receives itself (`_add_send_recv`), after each `F` whose next stage is on
//! another rank and each `B` or `I` whose previous stage is.
//!
//! PyTorch runs one flushed step over `n_microbatches` micro-batches. A flushed pebble
//! schedule is exported over its own micro-batches; a periodic one (a steady-state
//! pattern, see [`Schedule::periodic`]) over the micro-batches asked for, with
//! [`Schedule::unroll`]: the pattern's order, with the fill and the drain that a step
//! needs. A periodic asynchronous schedule (PipeDream-2BW's weight stashing) so becomes
//! a synchronous step with a flush: the order is pebble's, the weight versions are not.
//!
//! ```
//! use pebble_schedule::{torch, Op, Pass, PipeStage, Schedule};
//! let stages = vec![PipeStage { first: 0, last: 0, device: 0 }, PipeStage { first: 1, last: 1, device: 1 }];
//! let run = |device, stage, pass| Op::Run { device, stage, micro: 0, pass };
//! let ops = vec![run(0, 0, Pass::F), run(1, 1, Pass::F), run(1, 1, Pass::B), run(0, 0, Pass::B)];
//! let s = Schedule::pipeline(2, 1, stages, ops).with_sends();
//! assert_eq!(torch::export(&s, 1).unwrap(), "0F0,0B0\n1F0,1B0\n");
//! ```

use std::collections::{HashMap, HashSet};
use std::fmt;

use crate::{Op, Pass, Schedule, View};

/// The PyTorch release whose `_PipelineScheduleRuntime._load_csv` format [`export`]
/// writes (`scripts/torch_pipeline.sh` runs the export on it).
pub const TORCH_VERSION: &str = "2.15.0";

/// One compute action of PyTorch's runtime: a pass of a stage over a micro-batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Action {
    /// The stage index (pebble's pipeline stage).
    pub stage: usize,
    /// `F`, `B`, `I` or `W`: PyTorch's letters are pebble's.
    pub pass: Pass,
    /// The micro-batch, `0..n_microbatches`.
    pub micro: usize,
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{:?}{}", self.stage, self.pass, self.micro)
    }
}

/// The rank that runs each stage: `stage_to_rank(s)[i]` is stage `i`'s device.
pub fn stage_to_rank(schedule: &Schedule) -> Vec<usize> {
    schedule.stages.iter().map(|s| s.device).collect()
}

/// The micro-batches a step of `schedule` runs when `microbatches` are asked for: a
/// periodic schedule's (at least 1), a flushed schedule's own count (which `microbatches`
/// must be, or 0).
pub fn step_microbatches(schedule: &Schedule, microbatches: usize) -> Result<usize, String> {
    let own = schedule.microbatches.unwrap_or(1);
    match (schedule.periodic, microbatches) {
        (true, 0) => Err("a periodic schedule is exported over a number of micro-batches: at least 1".into()),
        (true, m) => Ok(m),
        (false, 0) => Ok(own),
        (false, m) if m == own => Ok(m),
        (false, m) => Err(format!(
            "this schedule is one flushed step over {own} micro-batches; it cannot run {m} (plan it for {m}, or export {own})"
        )),
    }
}

/// Each rank's compute actions, in order, for a step over `microbatches` micro-batches
/// (see [`step_microbatches`]), checked as PyTorch's runtime checks them: every rank
/// runs a stage; every stage runs, on every micro-batch, `F` once and then either `B`
/// once or `I` and then `W`; and the order can run (each rank's next action waits only
/// for actions some rank can still reach, as `_add_send_recv` requires).
pub fn programs(schedule: &Schedule, microbatches: usize) -> Result<Vec<Vec<Action>>, String> {
    if schedule.view != View::Pipeline {
        let view = match schedule.view {
            View::Chain => "chain",
            View::Graph => "graph",
            View::Pipeline => "pipeline",
        };
        return Err(format!(
            "PyTorch's pipeline runtime runs pipeline schedules (view `pipeline`, as `pebble pipeline` plans them), not a {view} schedule"
        ));
    }
    crate::pipeline::check(schedule).map_err(|e| e.to_string())?;
    let count = step_microbatches(schedule, microbatches)?;
    let devices = schedule.devices.unwrap_or(1);
    let stage_rank = stage_to_rank(schedule);
    if let Some(d) = (0..devices).find(|d| !stage_rank.contains(d)) {
        return Err(format!(
            "device {d} runs no stage, and PyTorch's runtime needs every rank of the pipeline group to run one: plan on {} devices",
            stage_rank.iter().collect::<HashSet<_>>().len()
        ));
    }
    let mut ranks = vec![Vec::new(); devices];
    for u in schedule.unroll(count) {
        if let Op::Run { device, stage, pass, .. } = schedule.ops[u.op] {
            ranks[device].push(Action { stage, pass, micro: u.micro as usize });
        }
    }
    check_passes(&ranks, stage_rank.len(), count)?;
    check_runs(&ranks)?;
    Ok(ranks)
}

/// The plan in the CSV format `_PipelineScheduleRuntime._load_csv` reads: one row per
/// rank, each cell an action like `0F3`. A periodic schedule is unrolled over
/// `microbatches` micro-batches; a flushed one runs its own (`microbatches` is that
/// count, or 0). See the [module documentation](self).
pub fn export(schedule: &Schedule, microbatches: usize) -> Result<String, String> {
    let mut out = String::new();
    for row in programs(schedule, microbatches)? {
        let cells: Vec<String> = row.iter().map(Action::to_string).collect();
        out.push_str(&cells.join(","));
        out.push('\n');
    }
    Ok(out)
}

/// Each stage runs `F` once on each micro-batch, then `B` once, or `I` and then `W`.
fn check_passes(ranks: &[Vec<Action>], stages: usize, count: usize) -> Result<(), String> {
    let mut at: HashMap<(usize, usize, Pass), usize> = HashMap::new();
    for row in ranks {
        for (i, a) in row.iter().enumerate() {
            if at.insert((a.stage, a.micro, a.pass), i).is_some() {
                return Err(format!("stage {} runs {:?} twice on micro-batch {}", a.stage, a.pass, a.micro));
            }
        }
    }
    for s in 0..stages {
        for m in 0..count {
            let get = |p| at.get(&(s, m, p)).copied();
            let Some(f) = get(Pass::F) else {
                return Err(format!("stage {s} never runs F on micro-batch {m}"));
            };
            let backward = match (get(Pass::B), get(Pass::I), get(Pass::W)) {
                (Some(b), None, None) => b,
                (None, Some(i), Some(w)) if i < w => i,
                (None, Some(_), Some(_)) => return Err(format!("stage {s} runs W before I on micro-batch {m}")),
                (None, None, None) => return Err(format!("stage {s} never runs its backward on micro-batch {m}")),
                (None, Some(_), None) => return Err(format!("stage {s} runs I but never W on micro-batch {m}")),
                (None, None, Some(_)) => return Err(format!("stage {s} runs W but never I on micro-batch {m}")),
                (Some(_), _, _) => {
                    return Err(format!("stage {s} runs both B and a split backward (I, W) on micro-batch {m}"))
                }
            };
            if backward < f {
                return Err(format!("stage {s} runs its backward before its forward on micro-batch {m}"));
            }
        }
    }
    Ok(())
}

/// The order runs: as `_add_send_recv` lowers it, ranks take turns, each running its
/// next action once what it needs has run (`F` of stage `s`: `F` of `s − 1`; `B` or `I`
/// of `s`: the backward of `s + 1` that produced its gradient).
fn check_runs(ranks: &[Vec<Action>]) -> Result<(), String> {
    let last = ranks.iter().flatten().map(|a| a.stage).max().unwrap_or(0);
    let mut done: HashSet<(usize, usize, bool)> = HashSet::new(); // (stage, micro, backward)
    let mut next = vec![0; ranks.len()];
    loop {
        let mut progress = false;
        for (r, row) in ranks.iter().enumerate() {
            while let Some(a) = row.get(next[r]) {
                let ready = match a.pass {
                    Pass::F => a.stage == 0 || done.contains(&(a.stage - 1, a.micro, false)),
                    Pass::B | Pass::I => a.stage == last || done.contains(&(a.stage + 1, a.micro, true)),
                    Pass::W => true,
                };
                if !ready {
                    break;
                }
                match a.pass {
                    Pass::F => done.insert((a.stage, a.micro, false)),
                    Pass::B | Pass::I => done.insert((a.stage, a.micro, true)),
                    Pass::W => false,
                };
                next[r] += 1;
                progress = true;
            }
        }
        if next.iter().zip(ranks).all(|(&n, row)| n == row.len()) {
            return Ok(());
        }
        if !progress {
            let stuck: Vec<String> = ranks
                .iter()
                .enumerate()
                .filter_map(|(r, row)| row.get(next[r]).map(|a| format!("rank {r} at {a}")))
                .collect();
            return Err(format!("the order cannot run: each rank waits on another ({})", stuck.join(", ")));
        }
    }
}

#[cfg(test)]
mod tests;
