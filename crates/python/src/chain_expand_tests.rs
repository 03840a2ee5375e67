//! The chain view's peak against the graph simulator's: a chain plan, expanded to graph
//! ops as pebble.torch's `chain.py` expands it (ported here op for op), is simulated on
//! the training graph; the chain simulator's peak of the plan must be the graph's.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use pebble_graph::{partition, Chain, ComputeKind, DataKind, Retention, TrainingGraph};
use pebble_schedule::lower::{self, Action};
use pebble_schedule::{placement, ForwardMode, Op, Schedule, Tensor, View};
use pebble_sim::SimConfig;
use pebble_solve::{Problem, SolveOptions};

use crate::chain_view::chain_view;

/// The data nodes each chain tensor holds, as `chain.py` reads them off the stages.
fn members(g: &TrainingGraph, stages: &[usize]) -> HashMap<Tensor, BTreeSet<usize>> {
    let (producers, consumers) = (g.producers(), g.consumers());
    let fwd = |k: usize| matches!(g.compute[k].kind, ComputeKind::Forward | ComputeKind::Loss);
    let mut m: HashMap<Tensor, BTreeSet<usize>> = HashMap::new();
    for (d, node) in g.data.iter().enumerate() {
        let Some(&k) = producers[d].iter().max() else { continue };
        if node.kind == DataKind::ParamGrad {
            continue;
        }
        let s = stages[k];
        if g.compute[k].kind == ComputeKind::Forward {
            m.entry(Tensor::Saved(s + 1)).or_default().insert(d);
            if consumers[d].iter().any(|&r| fwd(r) && stages[r] > s) {
                m.entry(Tensor::Activation(s + 1)).or_default().insert(d);
            }
        } else if consumers[d].iter().any(|&r| g.compute[r].kind == ComputeKind::Backward && stages[r] < s) {
            m.entry(Tensor::Grad(s)).or_default().insert(d);
        }
    }
    m
}

/// `chain.py`'s `expand`: the graph ops of a chain schedule planned on `g`'s chain view.
fn expand(g: &TrainingGraph, chain: &Chain, stages: &[usize], schedule: &Schedule) -> Vec<Op> {
    let ids = lower::Ids::of_chain(chain);
    let program = lower::lower_chain(&schedule.ops, ids, false, &placement::starts(schedule, chain.len()), 1);
    assert!(program.refused.is_none(), "{:?}", program.refused);
    let members = members(g, stages);
    let none = BTreeSet::new();
    let of = |t: Tensor| members.get(&t).unwrap_or(&none);
    let nodes = |kind: ComputeKind, s: usize| {
        (0..g.compute.len()).filter(move |&k| g.compute[k].kind == kind && stages[k] == s)
    };
    let mut x = Expansion { ops: Vec::new(), resident: HashSet::new(), held: HashSet::new() };
    let mut later: BTreeMap<usize, Vec<Tensor>> = BTreeMap::new();
    for (n, step) in program.steps.iter().enumerate() {
        match step.action {
            Action::Forward { stage: i, mode, .. } => {
                let no_grad = mode != ForwardMode::KeepAll;
                nodes(ComputeKind::Forward, i).for_each(|k| x.run(g, k, no_grad));
                if no_grad {
                    for &d in of(Tensor::Saved(i + 1)).difference(of(Tensor::Activation(i + 1))) {
                        x.drop(d, false);
                    }
                }
            }
            Action::Loss { .. } => nodes(ComputeKind::Loss, chain.len()).for_each(|k| x.run(g, k, false)),
            Action::Backward { stage: i, .. } => {
                nodes(ComputeKind::Backward, i).for_each(|k| x.run(g, k, false));
                let made: BTreeSet<usize> =
                    nodes(ComputeKind::Backward, i).flat_map(|k| g.compute[k].outputs.iter().copied()).collect();
                for &d in made.difference(of(Tensor::Grad(i))) {
                    if g.data[d].kind != DataKind::ParamGrad {
                        x.drop(d, false);
                    }
                }
            }
            Action::Free { tensor, .. } => x.release(&members, ids.tensor(tensor), false),
            Action::Offload { tensor, hold_until, .. } => {
                let t = ids.tensor(tensor);
                assert_ne!(t, Tensor::Activation(0), "the plan offloads a_0");
                x.held.remove(&t);
                later.entry(hold_until.unwrap_or(n)).or_default().push(t);
            }
            Action::Prefetch { tensor, .. } => {
                let t = ids.tensor(tensor);
                for &d in of(t) {
                    if x.resident.insert(d) {
                        x.ops.push(Op::Prefetch { tensor: Tensor::Data(d), fraction: 1.0 });
                    }
                }
                x.held.insert(t);
            }
            Action::CpuUpdate { .. } => panic!("no CPU updates on a graph"),
        }
        if !matches!(step.action, Action::Free { .. } | Action::Offload { .. } | Action::Prefetch { .. }) {
            x.held.extend(step.creates.iter().map(|&c| ids.tensor(c)));
            for &f in &step.frees {
                x.release(&members, ids.tensor(f), false);
            }
        }
        for t in later.remove(&n).unwrap_or_default() {
            if !x.held.contains(&t) {
                x.release(&members, t, true);
            }
        }
    }
    x.ops
}

/// The state of an expansion: its ops, the data it made and holds, the chain tensors held.
struct Expansion {
    ops: Vec<Op>,
    resident: HashSet<usize>,
    held: HashSet<Tensor>,
}

impl Expansion {
    fn run(&mut self, g: &TrainingGraph, k: usize, no_grad: bool) {
        self.ops.push(Op::Compute { node: k, no_grad });
        for &d in &g.compute[k].outputs {
            let kind = g.data[d].kind;
            if kind != DataKind::ParamGrad && !(no_grad && kind == DataKind::Saved) {
                self.resident.insert(d);
            }
        }
    }

    fn drop(&mut self, d: usize, offload: bool) {
        if self.resident.remove(&d) {
            let tensor = Tensor::Data(d);
            self.ops.push(if offload { Op::Offload { tensor, fraction: 1.0 } } else { Op::Free { tensor } });
        }
    }

    fn release(&mut self, members: &HashMap<Tensor, BTreeSet<usize>>, t: Tensor, offload: bool) {
        self.held.remove(&t);
        let kept: HashSet<usize> = self.held.iter().filter_map(|h| members.get(h)).flatten().copied().collect();
        for &d in members.get(&t).into_iter().flatten() {
            if !kept.contains(&d) {
                self.drop(d, offload);
            }
        }
    }
}

fn model(name: &str, options: pebble_zoo::ModelOptions) -> TrainingGraph {
    pebble_zoo::build(name, &options).unwrap().graph
}

/// `g` without its stages: cut as a captured graph is, where one activation crosses.
fn unstaged(mut g: TrainingGraph) -> TrainingGraph {
    for c in &mut g.compute {
        c.stage = None;
    }
    g
}

/// For each budget share (of the way from rotor's least budget to store-all's peak): the
/// chain simulator's peak of rotor's plan, the graph simulator's of its expansion, and
/// the peak of the same plan on the chain `to_chain` gives for a last-use executor.
fn peaks(g: &TrainingGraph, shares: &[f64]) -> Vec<(u64, u64, u64)> {
    let (chain, stages) = chain_view(g).unwrap();
    let mut staged = g.clone();
    for (c, &s) in staged.compute.iter_mut().zip(&stages) {
        c.stage = (c.kind != ComputeKind::Loss).then_some(s);
    }
    let last_use = partition::to_chain_with(&staged, Retention::LastUse).unwrap();
    let rotor = pebble_solve::solver("rotor").unwrap();
    let opts = SolveOptions::default();
    let least = pebble_solve::min_feasible_budget(rotor, Problem::Chain(&chain), &opts).unwrap().unwrap();
    let all = pebble_solve::simulate(Problem::Chain(&chain), &store_all(chain.len()), &SimConfig::default())
        .unwrap()
        .peak_bytes;
    let config = SimConfig::default();
    shares
        .iter()
        .map(|&share| {
            let budget = least + ((all - least) as f64 * share) as u64;
            let plan = pebble_solve::plan(rotor, Problem::Chain(&chain), budget, &opts).unwrap();
            let ops = expand(g, &chain, &stages, &plan.schedule);
            let graph = Schedule::new(View::Graph, ops);
            let on_graph = pebble_sim::simulate_graph(g, &graph, &config).unwrap().peak_bytes;
            let on_last_use = pebble_sim::simulate_chain(&last_use, &plan.schedule, &config).unwrap().peak_bytes;
            (plan.report.peak_bytes, on_graph, on_last_use)
        })
        .collect()
}

/// Plain autograd on the chain: every forward keeps all, then every backward.
fn store_all(l: usize) -> Schedule {
    let mut ops: Vec<Op> = (0..l).map(|stage| Op::Forward { stage, mode: ForwardMode::KeepAll }).collect();
    ops.extend((0..=l).rev().map(|stage| Op::Backward { stage }));
    Schedule::new(View::Chain, ops)
}

const SHARES: [f64; 4] = [0.0, 0.3, 0.6, 1.0];

#[test]
fn a_captured_graphs_chain_view_peaks_where_its_expansion_does() {
    // ResNet's bottlenecks: BatchNorm outputs only the next forward reads (dead once it
    // ran), backward intermediates; cut where one activation crosses, as captured.
    let small = pebble_zoo::ModelOptions { batch: Some(2), image: Some(32), ..Default::default() };
    for (name, g) in
        [("resnet18", unstaged(model("resnet18", small.clone()))), ("gpt", unstaged(model("gpt", Default::default())))]
    {
        let mut below = 0;
        for (chain, graph, last_use) in peaks(&g, &SHARES) {
            assert_eq!(chain, graph, "{name}: the chain view's peak is the expansion's");
            below += usize::from(last_use < graph);
        }
        // Counted for an executor that frees each value after its last use, the chain
        // would promise less than the expansion holds.
        assert!(below > 0, "{name}: the last-use chain never under-counts");
    }
}

#[test]
fn a_staged_graphs_chain_view_peaks_where_its_expansion_does() {
    // The zoo's own stages (a ResNet's block, a transformer's layer). `chain.py` expands
    // a captured graph's chain, whose cuts one activation crosses; where several cross
    // (U-Net's skips), it frees a skip with the boundary it was made in.
    let image = pebble_zoo::ModelOptions { batch: Some(1), image: Some(32), ..Default::default() };
    for (name, opts) in [("resnet18", image.clone()), ("gpt", Default::default()), ("vgg16", image)] {
        let g = model(name, opts);
        for (chain, graph, _) in peaks(&g, &SHARES) {
            assert_eq!(chain, graph, "{name}: the chain view's peak is the expansion's");
        }
    }
}
