//! `pytorch-mincut`: PyTorch's compile partitioner, `min_cut_rematerialization_partition`
//! with an activation-memory budget (`torch._functorch.config.activation_memory_budget`),
//! on the training graph.
//!
//! 1. **Bans.** Compute-intensive ops (matrix products, convolutions, attention: the
//!    partitioner's `is_compute_intensive`) are the ones it would rather not recompute.
//! 2. **The knapsack** (the budget mode's `get_saved_values_knapsack`): of those, keep
//!    banned the set of most time whose outputs the backward reads fit a capacity
//!    ([`super::partitioner::knapsack`]); the others may be recomputed like any cheap op.
//! 3. **The min cut.** A flow network over the forward's tensors: each tensor `d` is an
//!    edge `d_in → d_out` of capacity its size (saving it); `d_out → e_in` (infinite) when
//!    `e`'s producer reads `d`; `source → d_in` (infinite) when `d`'s producer is banned;
//!    `d_out → sink` (infinite) when a backward node reads `d`. Inputs and parameters are
//!    always at hand. A minimum cut (Dinic's max flow, `petgraph::algo::dinics`) is the
//!    least memory to save such that the backward recomputes everything else it needs
//!    from what is saved, banned ops never again.
//! 4. **The schedule.** The forward runs once (with grad only where a saved tensor is
//!    kept); everything not saved goes after its last forward reader. Before each
//!    backward node, what it reads and is gone is recomputed, each producer once, inputs
//!    first, and kept until its last backward reader, as the partitioner's backward graph
//!    does; frees come from liveness ([`crate::sequence::Liveness`]).
//!
//! The solver tries a ladder of knapsack capacities and returns the fastest schedule whose
//! simulated peak fits the budget. Unlike `knapsack` (the knapsack step alone, each dropped
//! tensor recomputed on demand and dropped again), a recomputed tensor is computed once.

use pebble_graph::{ComputeKind, DataKind, TrainingGraph};
use pebble_schedule::{Schedule, View};
use petgraph::algo::dinics;
use petgraph::graph::{DiGraph, NodeIndex};
use petgraph::visit::EdgeRef;

use super::fastest_fitting;
pub use super::partitioner::compute_intensive;
use super::partitioner::{knapsack, Network};
use crate::sequence::{Liveness, Step};
use crate::{Problem, SolveError, SolveOptions, Solver};

/// Capacities tried, evenly spaced from nothing kept by the knapsack to everything (and
/// `total / 2^5 … total / 2^14` besides).
const LADDER: u64 = 24;

/// PyTorch's min-cut partitioner with the activation-memory budget.
pub struct PytorchMincut;

impl Solver for PytorchMincut {
    fn name(&self) -> &'static str {
        "pytorch-mincut"
    }

    fn description(&self) -> &'static str {
        "PyTorch's compile partitioner: a knapsack under the activation-memory budget picks which matmuls, \
         convolutions and attentions are never recomputed, then the min cut picks what to save"
    }

    fn views(&self) -> &'static [View] {
        &[View::Graph]
    }

    fn solve(&self, problem: Problem<'_>, budget: u64, options: &SolveOptions) -> Result<Schedule, SolveError> {
        let g = super::valid_graph(problem, "pytorch-mincut")?;
        let net = Network::new(g);
        // The knapsack's items: the compute-intensive ops, each weighing what its backward
        // would need of its outputs if it stayed banned, worth its time.
        let items: Vec<usize> = (0..g.compute.len()).filter(|&c| net.intensive[c]).collect();
        let sizes: Vec<u64> = items
            .iter()
            .map(|&c| g.compute[c].outputs.iter().filter(|&&d| net.needed[d]).map(|&d| g.data[d].size).sum())
            .collect();
        let values: Vec<f64> = items.iter().map(|&c| g.compute[c].time).collect();
        let total: u64 = sizes.iter().sum();
        let live = Liveness::new(g);
        let mut candidates = Vec::new();
        let mut seen = Vec::new();
        // Evenly spaced, and finer near nothing kept, where each op kept is a checkpoint.
        let capacities = (0..=LADDER).map(|k| total * k / LADDER).chain((1..=10).map(|k| total >> (4 + k)));
        for capacity in capacities {
            let keep = knapsack(&sizes, &values, capacity);
            let mut banned = vec![false; g.compute.len()];
            for (&c, &kept) in items.iter().zip(&keep) {
                banned[c] = kept;
            }
            let saved = min_cut(g, &net, &banned);
            if seen.contains(&saved) {
                continue;
            }
            let sch = live.schedule(&sequence(g, &net, &saved));
            candidates.push(sch);
            seen.push(saved);
        }
        fastest_fitting(problem, budget, options, "pytorch-mincut", candidates)
    }
}

inventory::submit!(crate::Registration(&PytorchMincut));

/// The tensors to save: a minimum cut with the ops of `banned` never recomputed.
fn min_cut(g: &TrainingGraph, network: &Network, banned: &[bool]) -> Vec<bool> {
    let nd = g.data.len();
    // Sizes as they are (bytes fit an f64 exactly below 2^53); infinity as such.
    let mut net: DiGraph<(), f64> = DiGraph::new();
    let source = net.add_node(());
    let sink = net.add_node(());
    let mut din = vec![NodeIndex::end(); nd];
    let mut dout = vec![NodeIndex::end(); nd];
    let mut save_edge = vec![None; nd];
    for d in (0..nd).filter(|&d| network.producer[d].is_some()) {
        din[d] = net.add_node(());
        dout[d] = net.add_node(());
        save_edge[d] = Some(net.add_edge(din[d], dout[d], g.data[d].size as f64));
    }
    for d in (0..nd).filter(|&d| network.producer[d].is_some()) {
        let p = network.producer[d].expect("filtered");
        for &i in &g.compute[p].inputs {
            if network.producer[i].is_some() {
                net.add_edge(dout[i], din[d], f64::INFINITY);
            }
        }
        if banned[p] {
            net.add_edge(source, din[d], f64::INFINITY);
        }
        if network.needed[d] {
            net.add_edge(dout[d], sink, f64::INFINITY);
        }
    }
    let (_, flows) = dinics(&net, source, sink);
    // The source's side of the residual network.
    let mut reached = vec![false; net.node_count()];
    let mut stack = vec![source];
    reached[source.index()] = true;
    while let Some(u) = stack.pop() {
        let forward = net.edges(u).filter(|e| flows[e.id().index()] < *e.weight()).map(|e| e.target());
        let backward = net
            .edges_directed(u, petgraph::Direction::Incoming)
            .filter(|e| flows[e.id().index()] > 0.0)
            .map(|e| e.source());
        for v in forward.chain(backward) {
            if !std::mem::replace(&mut reached[v.index()], true) {
                stack.push(v);
            }
        }
    }
    (0..nd).map(|d| save_edge[d].is_some() && reached[din[d].index()] && !reached[dout[d].index()]).collect()
}

/// The partitioner's step: the forward once (with grad where a saved tensor is kept), the
/// loss, then each backward node after the recomputation of what it reads and is gone.
fn sequence(g: &TrainingGraph, net: &Network, saved: &[bool]) -> Vec<Step> {
    let mut seq: Vec<Step> = Vec::new();
    // Whether each forward-made tensor is at hand in the backward.
    let mut present = saved.to_vec();
    for (c, node) in g.compute.iter().enumerate() {
        if node.kind != ComputeKind::Forward {
            continue;
        }
        let grad = node.outputs.iter().any(|&d| g.data[d].kind == DataKind::Saved && saved[d]);
        seq.push((c, !grad));
    }
    for (c, node) in g.compute.iter().enumerate() {
        match node.kind {
            ComputeKind::Forward => {}
            ComputeKind::Loss => seq.push((c, false)),
            ComputeKind::Backward => {
                for &d in &node.inputs {
                    recompute(g, net, d, &mut present, &mut seq);
                }
                seq.push((c, false));
            }
        }
    }
    seq
}

/// Makes `d` present in the backward: its producer runs again (with grad if the backward
/// needs one of its saved tensors), after what it reads.
fn recompute(g: &TrainingGraph, net: &Network, d: usize, present: &mut [bool], seq: &mut Vec<Step>) {
    let Some(p) = net.producer[d] else { return };
    if present[d] {
        return;
    }
    for &i in &g.compute[p].inputs {
        recompute(g, net, i, present, seq);
    }
    // With grad if the backward needs one of its saved tensors that is gone: both at once.
    let grad = g.compute[p].outputs.iter().any(|&o| g.data[o].kind == DataKind::Saved && net.needed[o] && !present[o]);
    seq.push((p, !grad));
    for &o in &g.compute[p].outputs {
        if grad || g.data[o].kind != DataKind::Saved {
            present[o] = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::baseline::store_all::graph_store_all;

    fn gpt() -> TrainingGraph {
        pebble_testkit::gpt(2, 16, 16).graph
    }

    fn sim(g: &TrainingGraph, s: &Schedule) -> pebble_sim::SimReport {
        pebble_sim::simulate_graph(g, s, &pebble_sim::SimConfig::default()).expect("the simulator accepts it")
    }

    /// With every compute-intensive op banned (the knapsack's largest capacity but one), no
    /// matmul, convolution or attention is computed twice, each cheap op at most twice;
    /// the schedule is valid, below store-all's peak and slower.
    #[test]
    fn the_min_cut_never_recomputes_a_banned_op() {
        let g = gpt();
        let net = Network::new(&g);
        let saved = min_cut(&g, &net, &net.intensive);
        let seq = sequence(&g, &net, &saved);
        let runs = |c: usize| seq.iter().filter(|&&(k, _)| k == c).count();
        let mut recomputed = 0;
        for (c, node) in g.compute.iter().enumerate().filter(|(_, n)| n.kind == ComputeKind::Forward) {
            if compute_intensive(node.op.as_deref()) {
                assert_eq!(runs(c), 1, "{} runs {} times", node.name, runs(c));
            } else {
                recomputed += runs(c) - 1;
            }
            assert!(runs(c) <= 2, "{} runs {} times: each op is recomputed at most once", node.name, runs(c));
        }
        assert!(recomputed > 5, "the cheap ops are recomputed ({recomputed})");
        let schedule = Liveness::new(&g).schedule(&seq);
        let r = sim(&g, &schedule);
        let top = sim(&g, &graph_store_all(&g));
        assert!(r.peak_bytes < top.peak_bytes);
        assert!(r.makespan > top.makespan);
    }

    /// The cut is minimal: on a chain x → a (banned) → b → c → backward reading c, saving
    /// `a` (4 bytes) beats saving `b` (8) or `c` (16).
    #[test]
    fn the_cut_saves_the_smallest_sufficient_set() {
        use pebble_testkit::GraphBuilder;
        let mut gb = GraphBuilder::new("chain");
        let x = gb.data("x", DataKind::Input, 1);
        let a = gb.data("a", DataKind::Activation, 4);
        let b = gb.data("b", DataKind::Activation, 8);
        let c = gb.data("c", DataKind::Activation, 16);
        let fa = gb.forward("fa", 1.0, 0, [x], [a]);
        let fb = gb.forward("fb", 1.0, 0, [a], [b]);
        let fc = gb.forward("fc", 1.0, 0, [b], [c]);
        let dl = gb.data("dl", DataKind::Gradient, 16);
        gb.loss("loss", 1.0, 0, [c], [dl]);
        let dc = gb.data("dc", DataKind::Gradient, 8);
        gb.backward("fc.bwd", fc, 1.0, 0, [dl, c], [dc]);
        let db = gb.data("db", DataKind::Gradient, 4);
        gb.backward("fb.bwd", fb, 1.0, 0, [dc], [db]);
        gb.backward("fa.bwd", fa, 1.0, 0, [db], []);
        let mut g = gb.build();
        g.compute[fa].op = Some("linear".into());
        let net = Network::new(&g);
        let saved = min_cut(&g, &net, &net.intensive);
        assert!(saved[a] && !saved[b] && !saved[c]);
        // Banning `fc` as well (the knapsack's choice): then `c` is saved.
        let mut banned = net.intensive.clone();
        banned[fc] = true;
        let saved = min_cut(&g, &net, &banned);
        assert!(saved[c] && !saved[a]);
        // Banning nothing: nothing is saved, the whole forward runs again from `x`.
        assert!(min_cut(&g, &net, &vec![false; g.compute.len()]).iter().all(|&s| !s));
    }
}
