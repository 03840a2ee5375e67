//! Compute sequences and their frees.
//!
//! Rockmate, HiRemate and `pytorch-mincut` build a schedule in two steps: which compute nodes run, in
//! which order and in which mode (a *sequence* of [`Step`]s), then where each tensor is
//! freed. The second step needs no solver: a tensor is freed right after its last use
//! before it is produced again, which is as early as any schedule could free it. So the
//! ILPs' deletion variables only bound the memory; the schedule's frees come from here,
//! and the schedule's memory is never above what the ILP counted.
//!
//! [`Liveness`] also replays a sequence locally (a block's or a cluster's, on its own
//! sub-graph) to measure the peaks an option records.

use pebble_graph::{ComputeId, DataKind, TrainingGraph};

use pebble_schedule::{Op, Schedule, Tensor, View};

/// One compute node of a training graph, and whether it runs without grad (a forward
/// run "fast", which produces no saved-for-backward tensors).
pub type Step = (ComputeId, bool);

/// Who allocates, reads and keeps each data node of a graph.
pub struct Liveness<'g> {
    g: &'g TrainingGraph,
    /// Not static and not an input of the step: allocated and freed by the schedule.
    tracked: Vec<bool>,
    /// A gradient nobody reads is an output of the step: kept to the end.
    pinned: Vec<bool>,
    /// Made by several compute nodes (a gradient they accumulate into).
    multi: Vec<bool>,
}

impl<'g> Liveness<'g> {
    /// The liveness rules of `g`.
    pub fn new(g: &'g TrainingGraph) -> Liveness<'g> {
        let nd = g.data.len();
        let tracked: Vec<bool> = g.data.iter().map(|d| !(d.kind.is_static() || d.kind == DataKind::Input)).collect();
        let mut read = vec![false; nd];
        let mut producers = vec![0usize; nd];
        for c in &g.compute {
            for &d in &c.inputs {
                read[d] = true;
            }
            for &d in &c.outputs {
                producers[d] += 1;
            }
        }
        let multi = producers.iter().map(|&n| n > 1).collect();
        let pinned = (0..nd).map(|d| tracked[d] && !read[d] && g.data[d].kind == DataKind::Gradient).collect();
        Liveness { g, tracked, pinned, multi }
    }

    /// Whether the schedule allocates and frees `d`.
    pub fn tracked(&self, d: usize) -> bool {
        self.tracked[d]
    }

    /// What a step writes that the schedule tracks: its outputs, not the saved ones in
    /// no-grad mode.
    fn writes(&self, (k, no_grad): Step) -> impl Iterator<Item = usize> + '_ {
        self.g.compute[k]
            .outputs
            .iter()
            .copied()
            .filter(move |&d| self.tracked[d] && !(no_grad && self.g.data[d].kind == DataKind::Saved))
    }

    /// For each step, the data it allocates and the data freed right after it.
    ///
    /// A data node with one producer is freed after its last use before it is produced
    /// again (or the sequence ends). One with several producers (a gradient, which
    /// backward nodes accumulate into, each once) lives from whichever producer runs first
    /// in the sequence (not necessarily the first in the graph's list) to its last use.
    /// Pinned gradients are never freed.
    pub fn lifetimes(&self, seq: &[Step]) -> (Vec<Vec<usize>>, Vec<Vec<usize>>) {
        let nd = self.g.data.len();
        let mut alloc_at: Vec<Vec<usize>> = vec![Vec::new(); seq.len()];
        let mut frees_after: Vec<Vec<usize>> = vec![Vec::new(); seq.len()];
        let mut last_event: Vec<Option<usize>> = vec![None; nd];
        for (p, &step) in seq.iter().enumerate() {
            for d in self.writes(step) {
                if self.multi[d] {
                    if last_event[d].is_none() {
                        alloc_at[p].push(d);
                    }
                    last_event[d] = Some(p);
                } else {
                    alloc_at[p].push(d);
                    if let Some(q) = last_event[d].replace(p) {
                        if !self.pinned[d] {
                            frees_after[q].push(d);
                        }
                    }
                }
            }
            for &d in self.g.compute[step.0].inputs.iter().filter(|&&d| self.tracked[d]) {
                last_event[d] = Some(p);
            }
        }
        for (d, q) in last_event.iter().enumerate() {
            if let (Some(q), false) = (q, self.pinned[d]) {
                frees_after[*q].push(d);
            }
        }
        for f in alloc_at.iter_mut().chain(frees_after.iter_mut()) {
            f.sort_unstable();
            f.dedup();
        }
        (alloc_at, frees_after)
    }

    /// For each step, the data freed right after it (see [`Liveness::lifetimes`]).
    pub fn frees(&self, seq: &[Step]) -> Vec<Vec<usize>> {
        self.lifetimes(seq).1
    }

    /// The schedule of a sequence: each step, then the frees after it.
    pub fn schedule(&self, seq: &[Step]) -> Schedule {
        let frees = self.frees(seq);
        let mut ops = Vec::with_capacity(seq.len() * 2);
        for (&(node, no_grad), f) in seq.iter().zip(&frees) {
            ops.push(Op::Compute { node, no_grad });
            ops.extend(f.iter().map(|&d| Op::Free { tensor: Tensor::Data(d) }));
        }
        Schedule::new(View::Graph, ops)
    }

    /// Replays a sequence with its frees, counting tracked bytes only (no static memory,
    /// no inputs). For each step: the peak while it runs (what is resident before it,
    /// plus what it allocates, plus its temporary memory: the simulator's count), and
    /// what stays resident after its frees.
    pub fn replay(&self, seq: &[Step]) -> Vec<(u64, u64)> {
        let (alloc_at, frees) = self.lifetimes(seq);
        let mut resident = vec![false; self.g.data.len()];
        let mut bytes = 0u64;
        let mut out = Vec::with_capacity(seq.len());
        for ((&step, f), a) in seq.iter().zip(&frees).zip(&alloc_at) {
            for &d in a {
                if !resident[d] {
                    resident[d] = true;
                    bytes += self.g.data[d].size;
                }
            }
            let peak = bytes + self.g.compute_tmp(step.0, step.1);
            for &d in f {
                if std::mem::replace(&mut resident[d], false) {
                    bytes -= self.g.data[d].size;
                }
            }
            out.push((peak, bytes));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pebble_sim::SimConfig;
    use pebble_zoo::ModelOptions;

    /// A gradient two backward nodes accumulate into lives from whichever runs first
    /// (Inception's concat gradients: the H-ILP orders backward nodes by cluster, not by
    /// the graph's list).
    #[test]
    fn a_gradient_lives_from_the_first_producer_in_the_sequence() {
        use pebble_graph::DataKind as D;
        let mut b = pebble_testkit::GraphBuilder::new("fork");
        let x = b.data("x", D::Input, 1);
        let a = b.data("a", D::Activation, 10);
        let bb = b.data("b", D::Activation, 20);
        let c = b.data("c", D::Activation, 30);
        let gb = b.data("gb", D::Gradient, 20);
        let gc = b.data("gc", D::Gradient, 30);
        let ga = b.data("ga", D::Gradient, 10);
        // x → f1 → a; a → f2 → b; a → f3 → c; loss(b, c); ga accumulated by b3 and b2.
        let f1 = b.forward("f1", 1.0, 0, [x], [a]);
        let f2 = b.forward("f2", 1.0, 0, [a], [bb]);
        let f3 = b.forward("f3", 1.0, 0, [a], [c]);
        b.loss("loss", 1.0, 0, [bb, c], [gb, gc]);
        b.backward("b3", f3, 1.0, 0, [gc, a], [ga]);
        b.backward("b2", f2, 1.0, 0, [gb, a], [ga]);
        b.backward("b1", f1, 1.0, 0, [ga], []);
        let g = b.build();
        let live = Liveness::new(&g);
        for order in [[4, 5], [5, 4]] {
            let seq: Vec<Step> = [0, 1, 2, 3, order[0], order[1], 6].iter().map(|&k| (k, false)).collect();
            let r = pebble_sim::simulate_graph(&g, &live.schedule(&seq), &SimConfig::default())
                .unwrap_or_else(|e| panic!("{order:?}: {e}"));
            let local = live.replay(&seq).iter().map(|p| p.0).max().unwrap();
            assert_eq!(r.peak_bytes, 1 + local, "{order:?}");
        }
    }

    #[test]
    fn store_all_sequence_matches_the_simulator() {
        for (model, layers) in [("gpt", 2), ("mlp", 4), ("resnet", 1)] {
            let opts = ModelOptions { layers: Some(layers), ..ModelOptions::default() };
            let g = pebble_zoo::build(model, &opts).unwrap().graph;
            let seq: Vec<Step> = (0..g.compute.len()).map(|k| (k, false)).collect();
            let live = Liveness::new(&g);
            let s = live.schedule(&seq);
            let r = pebble_sim::simulate_graph(&g, &s, &SimConfig::default()).unwrap();
            let fixed: u64 =
                g.static_bytes() + g.data.iter().filter(|d| d.kind == DataKind::Input).map(|d| d.size).sum::<u64>();
            let local = live.replay(&seq).iter().map(|p| p.0).max().unwrap();
            assert_eq!(r.peak_bytes, fixed + local, "{model}");
        }
    }
}
