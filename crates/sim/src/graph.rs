//! Graph semantics (Zhao's thesis, §1.3; [`TrainingGraph`]).
//!
//! `Tensor::Data(d)` names data node `d`. Inputs and static nodes (parameters, their
//! gradients, optimizer states) are resident from the start.
//!
//! * `Compute { node, no_grad }` reads every input, which must be resident and complete
//!   (a multi-producer gradient is complete once all its producers have run since it was
//!   allocated). It allocates each output not on the device; a multi-producer gradient is
//!   allocated by its first producer and accumulated into by the others (which then read
//!   it). Producing a complete resident output again is `AlreadyResident`. Static outputs
//!   (parameter gradients) allocate nothing but must be resident. `no_grad` (forward nodes
//!   only) skips the `Saved` outputs. The loss and each backward node run exactly once.
//! * Nothing is released implicitly: schedules free with explicit `Free` ops. Static nodes
//!   cannot be freed (offload them instead).
//! * At the end, the loss and every backward node must have run.

use pebble_graph::{ComputeKind, DataKind, TrainingGraph};
use pebble_schedule::{Op, Schedule, Tensor, View};

use crate::engine::{Effect, Engine, TensorSpec};
use crate::{SimConfig, SimError, SimReport};

struct State {
    /// Producers of each data node.
    nprod: Vec<u32>,
    /// Producers that have run since the node was (re)allocated.
    count: Vec<u32>,
    ran: Vec<bool>,
    reads: Vec<usize>,
    allocs: Vec<usize>,
    accum: Vec<usize>,
}

fn fixed(kind: DataKind) -> bool {
    kind == DataKind::Input || kind.is_static()
}

pub(crate) fn simulate(graph: &TrainingGraph, schedule: &Schedule, config: &SimConfig) -> Result<SimReport, SimError> {
    if schedule.view != View::Graph {
        return Err(SimError::WrongView { found: schedule.view, expected: View::Graph });
    }
    let ops = &schedule.ops[..];
    let nd = graph.data.len();
    let mut nprod = vec![0u32; nd];
    for c in &graph.compute {
        for &d in &c.outputs {
            if d < nd {
                nprod[d] += 1;
            }
        }
    }
    let specs = graph.data.iter().enumerate().map(|(d, node)| TensorSpec {
        name: Tensor::Data(d),
        size: node.size,
        resident: fixed(node.kind),
        host: false,
    });
    let mut eng = Engine::new(ops, config, 0, specs);
    let mut st = State {
        nprod,
        count: vec![0; nd],
        ran: vec![false; graph.compute.len()],
        reads: Vec::new(),
        allocs: Vec::new(),
        accum: Vec::new(),
    };
    for (k, op) in ops.iter().enumerate() {
        if let Err(e) = step(graph, &mut st, &mut eng, k, op) {
            return Err(eng.fail(e));
        }
    }
    let report = eng.finish()?;
    if let Some(c) = graph.compute.iter().position(|c| c.kind == ComputeKind::Loss) {
        if !st.ran[c] {
            return Err(SimError::Incomplete(format!(
                "the loss (compute node {c} `{}`) never ran",
                graph.compute[c].name
            )));
        }
    }
    if let Some((c, node)) =
        graph.compute.iter().enumerate().find(|(c, node)| node.kind == ComputeKind::Backward && !st.ran[*c])
    {
        return Err(SimError::Incomplete(format!("backward node {c} `{}` never ran", node.name)));
    }
    Ok(report)
}

fn data_id(graph: &TrainingGraph, eng: &Engine<'_>, k: usize, tensor: Tensor) -> Result<usize, SimError> {
    match tensor {
        Tensor::Data(d) if d < graph.data.len() => Ok(d),
        Tensor::Data(d) => {
            Err(eng.out_of_range(k, format!("data node {d} (the graph has {} data nodes)", graph.data.len())))
        }
        _ => Err(eng.out_of_range(k, format!("{tensor:?} (a chain tensor; graph schedules name Data(d))"))),
    }
}

fn step(graph: &TrainingGraph, st: &mut State, eng: &mut Engine<'_>, k: usize, op: &Op) -> Result<(), SimError> {
    match *op {
        Op::Compute { node, no_grad } => {
            let nd = graph.data.len();
            let Some(c) = graph.compute.get(node) else {
                return Err(eng.out_of_range(
                    k,
                    format!("compute node {node} (the graph has {} compute nodes)", graph.compute.len()),
                ));
            };
            if let Some(&d) = c.inputs.iter().chain(&c.outputs).find(|&&d| d >= nd) {
                return Err(eng
                    .out_of_range(k, format!("data node {d} of compute node {node} (the graph has {nd} data nodes)")));
            }
            match c.kind {
                ComputeKind::Loss if st.ran[node] => return Err(eng.invalid(k, "the loss already ran")),
                ComputeKind::Backward if st.ran[node] => {
                    return Err(eng.invalid(
                        k,
                        format!("backward node {node} `{}` already ran (gradients would accumulate twice)", c.name),
                    ))
                }
                _ => {}
            }
            if no_grad && c.kind != ComputeKind::Forward {
                return Err(
                    eng.invalid(k, format!("no_grad on a {:?} node; only forward nodes run without grad", c.kind))
                );
            }
            st.reads.clear();
            st.allocs.clear();
            st.accum.clear();
            for &d in &c.inputs {
                let complete = fixed(graph.data[d].kind) || st.count[d] >= st.nprod[d];
                if !eng.readable(d) || !complete {
                    return Err(eng.missing(k, d));
                }
                st.reads.push(d);
            }
            for &d in &c.outputs {
                let kind = graph.data[d].kind;
                if (no_grad && kind == DataKind::Saved) || st.allocs.contains(&d) || st.accum.contains(&d) {
                    continue;
                }
                if kind.is_static() {
                    // Accumulates into a pre-allocated parameter gradient.
                    if !eng.readable(d) {
                        return Err(eng.missing(k, d));
                    }
                    st.reads.push(d);
                } else if eng.on_device(d) {
                    if st.nprod[d] > 1 && st.count[d] < st.nprod[d] {
                        if !eng.readable(d) {
                            return Err(eng.missing(k, d));
                        }
                        st.reads.push(d);
                        st.accum.push(d);
                    } else {
                        return Err(eng.already(k, d));
                    }
                } else if st.nprod[d] > 1 && st.count[d] > 0 && st.count[d] < st.nprod[d] {
                    // Partly accumulated, then offloaded: it must come back to accumulate.
                    return Err(eng.missing(k, d));
                } else {
                    st.allocs.push(d);
                }
            }
            eng.compute(k, &Effect { duration: c.time, tmp: c.tmp, reads: &st.reads, allocs: &st.allocs, frees: &[] })?;
            for &d in &st.allocs {
                st.count[d] = 1;
            }
            for &d in &st.accum {
                st.count[d] += 1;
            }
            st.ran[node] = true;
            Ok(())
        }
        Op::Forward { .. } | Op::Backward { .. } | Op::CpuUpdate { .. } => {
            Err(eng.invalid(k, "a chain op (stage) in a graph schedule"))
        }
        Op::Run { .. } | Op::Send { .. } => Err(eng.invalid(k, "a pipeline op in a graph schedule")),
        Op::Free { tensor } => {
            let d = data_id(graph, eng, k, tensor)?;
            if graph.data[d].kind.is_static() {
                return Err(eng.invalid(
                    k,
                    format!(
                        "data node {d} `{}` is static ({:?}): offload it instead of freeing it",
                        graph.data[d].name, graph.data[d].kind
                    ),
                ));
            }
            eng.free(k, d)?;
            st.count[d] = 0;
            Ok(())
        }
        Op::Offload { tensor, fraction } => {
            let d = data_id(graph, eng, k, tensor)?;
            eng.offload(k, d, fraction)
        }
        Op::Prefetch { tensor, fraction } => {
            let d = data_id(graph, eng, k, tensor)?;
            eng.prefetch(k, d, fraction)
        }
    }
}
