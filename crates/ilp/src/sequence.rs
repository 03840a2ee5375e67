//! Compute sequences and their frees.
//!
//! Rockmate and HiRemate build a schedule in two steps: which compute nodes run, in
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
    /// The first producer of a data node with several (the others accumulate into it).
    first_producer: Vec<Option<ComputeId>>,
}

impl<'g> Liveness<'g> {
    /// The liveness rules of `g`.
    pub fn new(g: &'g TrainingGraph) -> Liveness<'g> {
        let nd = g.data.len();
        let tracked: Vec<bool> =
            g.data.iter().map(|d| !(d.kind.is_static() || d.kind == DataKind::Input)).collect();
        let mut read = vec![false; nd];
        let mut first_producer = vec![None; nd];
        for (k, c) in g.compute.iter().enumerate() {
            for &d in &c.inputs {
                read[d] = true;
            }
            for &d in &c.outputs {
                first_producer[d].get_or_insert(k);
            }
        }
        let pinned = (0..nd).map(|d| tracked[d] && !read[d] && g.data[d].kind == DataKind::Gradient).collect();
        Liveness { g, tracked, pinned, first_producer }
    }

    /// Whether the schedule allocates and frees `d`.
    pub fn tracked(&self, d: usize) -> bool {
        self.tracked[d]
    }

    /// The tracked data a step allocates: its outputs (not the saved ones in no-grad
    /// mode), except gradients it only accumulates into.
    pub fn allocates(&self, (k, no_grad): Step) -> impl Iterator<Item = usize> + '_ {
        self.g.compute[k].outputs.iter().copied().filter(move |&d| {
            self.tracked[d]
                && self.first_producer[d] == Some(k)
                && !(no_grad && self.g.data[d].kind == DataKind::Saved)
        })
    }

    /// The tracked data a step needs resident: its inputs, and the gradients it
    /// accumulates into.
    pub fn needs(&self, (k, _): Step) -> impl Iterator<Item = usize> + '_ {
        let c = &self.g.compute[k];
        let acc = c.outputs.iter().copied().filter(move |&d| self.tracked[d] && self.first_producer[d] != Some(k));
        c.inputs.iter().copied().filter(|&d| self.tracked[d]).chain(acc)
    }

    /// For each step, the data freed right after it: each tracked data node after its
    /// last use before it is allocated again or the sequence ends (pinned gradients never).
    pub fn frees(&self, seq: &[Step]) -> Vec<Vec<usize>> {
        let nd = self.g.data.len();
        let mut frees_after: Vec<Vec<usize>> = vec![Vec::new(); seq.len()];
        let mut last_event: Vec<Option<usize>> = vec![None; nd];
        for (p, &step) in seq.iter().enumerate() {
            for d in self.allocates(step) {
                if let Some(q) = last_event[d].replace(p) {
                    if !self.pinned[d] {
                        frees_after[q].push(d);
                    }
                }
            }
            for d in self.needs(step) {
                last_event[d] = Some(p);
            }
        }
        for (d, q) in last_event.iter().enumerate() {
            if let (Some(q), false) = (q, self.pinned[d]) {
                frees_after[*q].push(d);
            }
        }
        for f in &mut frees_after {
            f.sort_unstable();
            f.dedup();
        }
        frees_after
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
        let frees = self.frees(seq);
        let mut resident = vec![false; self.g.data.len()];
        let mut bytes = 0u64;
        let mut out = Vec::with_capacity(seq.len());
        for (&step, f) in seq.iter().zip(&frees) {
            for d in self.allocates(step) {
                if !resident[d] {
                    resident[d] = true;
                    bytes += self.g.data[d].size;
                }
            }
            let peak = bytes + self.g.compute[step.0].tmp;
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

    #[test]
    fn store_all_sequence_matches_the_simulator() {
        for (model, layers) in [("gpt", 2), ("mlp", 4), ("resnet", 1)] {
            let opts = ModelOptions { layers: Some(layers), ..ModelOptions::default() };
            let g = pebble_zoo::build(model, &opts).unwrap().graph;
            let seq: Vec<Step> = (0..g.compute.len()).map(|k| (k, false)).collect();
            let live = Liveness::new(&g);
            let s = live.schedule(&seq);
            let r = pebble_sim::simulate_graph(&g, &s, &SimConfig::default()).unwrap();
            let fixed: u64 = g.static_bytes()
                + g.data.iter().filter(|d| d.kind == DataKind::Input).map(|d| d.size).sum::<u64>();
            let local = live.replay(&seq).iter().map(|p| p.0).max().unwrap();
            assert_eq!(r.peak_bytes, fixed + local, "{model}");
        }
    }
}
