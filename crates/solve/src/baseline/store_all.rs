//! `store-all`: plain autograd, everything kept until its backward.

use pebble_graph::{DataKind, TrainingGraph};
use pebble_schedule::{Op, Schedule, Tensor, View};
use pebble_sim::{SimConfig, SimError, SimReport};

use super::{fastest_fitting, store_all_ops};
use crate::{Problem, SolveError, SolveOptions, Solver};

/// Plain autograd: the whole forward with its graph kept, the loss, the whole backward.
pub struct StoreAll;

impl Solver for StoreAll {
    fn name(&self) -> &'static str {
        "store-all"
    }

    fn description(&self) -> &'static str {
        "plain autograd: keep every saved tensor until its backward (PyTorch's default)"
    }

    fn views(&self) -> &'static [View] {
        &[View::Chain, View::Graph]
    }

    fn solve(&self, problem: Problem<'_>, budget: u64, options: &SolveOptions) -> Result<Schedule, SolveError> {
        if let Problem::Graph(_) = problem {
            super::valid_graph(problem, "store-all")?;
        }
        fastest_fitting(problem, budget, options, "store-all", [store_all_schedule(problem)])
    }
}

inventory::submit!(crate::Registration(&StoreAll));

/// The store-all schedule of either view.
pub fn store_all_schedule(problem: Problem<'_>) -> Schedule {
    match problem {
        Problem::Chain(c) => Schedule::new(View::Chain, store_all_ops(c.len())),
        Problem::Graph(g) => graph_store_all(g),
    }
}

/// The store-all schedule of either view, simulated under `config`: the reference peak
/// and time that budgets given as a share are taken of.
pub fn simulate_store_all(problem: Problem<'_>, config: &SimConfig) -> Result<SimReport, SimError> {
    crate::simulate(problem, &store_all_schedule(problem), config)
}

/// Plain autograd on a training graph: every compute node in list order (forwards with
/// grad, the loss, the backwards), each data node freed right after its last use, as
/// PyTorch's autograd frees it.
///
/// * Activations, saved tensors and gradients are freed right after the last compute
///   node that reads them; one nobody reads is freed right after its last producer;
/// * except a gradient nobody reads (the gradient of an input, say): it is an output of
///   the step and stays resident to the end;
/// * inputs and static data (parameters, their gradients, optimizer states) are never freed.
///
/// Frees that follow the same compute node come in data-id order.
pub fn graph_store_all(g: &TrainingGraph) -> Schedule {
    let n = g.compute.len();
    let mut last_use: Vec<Option<usize>> = vec![None; g.data.len()];
    let mut read = vec![false; g.data.len()];
    for (c, node) in g.compute.iter().enumerate() {
        for &d in &node.inputs {
            if d < last_use.len() {
                last_use[d] = Some(c);
                read[d] = true;
            }
        }
        for &d in &node.outputs {
            if d < last_use.len() {
                last_use[d] = Some(c);
            }
        }
    }
    let mut frees_after: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (d, data) in g.data.iter().enumerate() {
        let freeable = match data.kind {
            DataKind::Activation | DataKind::Saved => true,
            DataKind::Gradient => read[d],
            DataKind::Input | DataKind::Parameter | DataKind::ParamGrad | DataKind::OptimizerState => false,
        };
        if let (true, Some(c)) = (freeable, last_use[d]) {
            frees_after[c].push(d);
        }
    }
    let mut ops = Vec::with_capacity(n + g.data.len());
    for (c, frees) in frees_after.iter().enumerate() {
        ops.push(Op::Compute { node: c, no_grad: false });
        ops.extend(frees.iter().map(|&d| Op::Free { tensor: Tensor::Data(d) }));
    }
    Schedule::new(View::Graph, ops)
}
