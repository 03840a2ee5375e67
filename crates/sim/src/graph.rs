//! Graph schedules on the engine: each op as [`pebble_schedule::lower::lower_graph`] lowers
//! it (Zhao's thesis, §1.3: which data nodes it reads, creates and accumulates into),
//! timed and measured here. A compute node lasts its `time` and holds its `tmp` while it
//! runs. At the end, the loss and every backward node must have run.

use pebble_graph::{ComputeKind, TrainingGraph};
use pebble_schedule::lower::{self, Fault, GraphAction, Refusal};
use pebble_schedule::{Schedule, Tensor, View};

use crate::engine::{Effect, Engine, TensorSpec};
use crate::{SimConfig, SimError, SimReport};

pub(crate) fn simulate(graph: &TrainingGraph, schedule: &Schedule, config: &SimConfig) -> Result<SimReport, SimError> {
    if schedule.view != View::Graph {
        return Err(SimError::WrongView { found: schedule.view, expected: View::Graph });
    }
    let ops = &schedule.ops[..];
    let specs = graph.data.iter().enumerate().map(|(d, node)| TensorSpec {
        name: Tensor::Data(d),
        size: node.size,
        resident: lower::fixed(graph, d),
        host: false,
    });
    let mut eng = Engine::new(ops, config, 0, specs);
    let program = lower::lower_graph(graph, ops);
    for step in &program.steps {
        let k = step.op;
        let ran = match (step.fault, step.action) {
            (Some(Fault::Missing(d)), _) => Err(eng.missing(k, d)),
            (Some(Fault::Already(d)), _) => Err(eng.already(k, d)),
            (None, GraphAction::Compute { node, no_grad }) => {
                let (duration, tmp) = (graph.compute[node].time, graph.compute_tmp(node, no_grad));
                let effect = Effect { duration, tmp, reads: &step.reads, allocs: &step.creates, frees: &[] };
                eng.compute(k, &effect)
            }
            (None, GraphAction::Free { data }) => eng.free(k, data),
            (None, GraphAction::Offload { data, fraction }) => eng.offload(k, data, fraction),
            (None, GraphAction::Prefetch { data, fraction }) => eng.prefetch(k, data, fraction),
        };
        if let Err(e) = ran {
            return Err(eng.fail(e));
        }
    }
    if let Some((k, why)) = program.refused {
        let e = match why {
            Refusal::OutOfRange(what) => eng.out_of_range(k, what),
            Refusal::Invalid(why) => eng.invalid(k, why),
        };
        return Err(eng.fail(e));
    }
    let report = eng.finish()?;
    if let Some(c) = graph.compute.iter().position(|c| c.kind == ComputeKind::Loss) {
        if !program.ran[c] {
            return Err(SimError::Incomplete(format!(
                "the loss (compute node {c} `{}`) never ran",
                graph.compute[c].name
            )));
        }
    }
    if let Some((c, node)) =
        graph.compute.iter().enumerate().find(|(c, node)| node.kind == ComputeKind::Backward && !program.ran[*c])
    {
        return Err(SimError::Incomplete(format!("backward node {c} `{}` never ran", node.name)));
    }
    Ok(report)
}
