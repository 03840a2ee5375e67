//! `dtr`: Dynamic Tensor Rematerialization (Kirisame et al., ICLR 2021), replayed
//! offline on the training graph.
//!
//! DTR is not a planner but a runtime policy: run the program in its eager order (every
//! forward, the loss, every backward), and whenever an allocation would overflow the
//! budget, evict the resident tensor with the least `h(t) = cost(t) / (size(t) ·
//! staleness(t))`, where `cost` is the time of the forward that made it and `staleness`
//! the time since it was last touched. An evicted tensor that is read again is
//! recomputed by its forward, whose own evicted inputs are recomputed first, recursively.
//! We run that policy against the simulator's memory accounting and write down what it
//! did, so the result is an ordinary graph schedule that the simulator scores like any
//! other.
//!
//! * Only activations and saved tensors are evicted (gradients cannot be recomputed;
//!   inputs and static data stay).
//! * A tensor that no later node of the eager order reads is freed at once (DTR's
//!   reference count reaching zero); if a recomputation needs it after all, it is
//!   recomputed like an evicted one.
//! * A saved tensor is recomputed by rerunning its forward with grad, after freeing
//!   that forward's resident outputs (the simulator does not let a node produce a
//!   resident tensor twice); an activation alone by rerunning it without grad.

use pebble_graph::{ComputeKind, DataKind, TrainingGraph};
use pebble_schedule::{Op, Schedule, Tensor, View};

use crate::{Problem, SolveError, SolveOptions, Solver};

/// DTR's eviction heuristic, replayed in the simulator's accounting.
pub struct Dtr;

impl Solver for Dtr {
    fn name(&self) -> &'static str {
        "dtr"
    }

    fn description(&self) -> &'static str {
        "Dynamic Tensor Rematerialization: evict the tensor of least cost/(size·staleness) on overflow"
    }

    fn views(&self) -> &'static [View] {
        &[View::Graph]
    }

    fn solve(&self, problem: Problem<'_>, budget: u64, _options: &SolveOptions) -> Result<Schedule, SolveError> {
        dtr_schedule(problem.graph_for("dtr")?, budget)
    }
}

inventory::submit!(crate::Registration(&Dtr));

struct Replay<'a> {
    g: &'a TrainingGraph,
    budget: u64,
    resident: Vec<bool>,
    /// Bytes of the resident non-fixed data plus all fixed data.
    mem: u64,
    last_touch: Vec<u64>,
    clock: u64,
    /// Position in the eager order of the last node that reads each data node.
    last_read: Vec<Option<usize>>,
    /// The forward node that produces each activation or saved tensor.
    producer: Vec<Option<usize>>,
    /// Producers of each data node, and how many have run since it was allocated.
    nprod: Vec<u32>,
    count: Vec<u32>,
    /// Data that must stay while the current chain of recomputations runs.
    pinned: Vec<u32>,
    /// Whether to evict on overflow (DTR) or leave the overflow to the simulator.
    evict: bool,
    /// Tensors dropped after the forward pass (the knapsack's choice; none for DTR).
    dropped: Vec<bool>,
    ops: Vec<Op>,
}

fn fixed(kind: DataKind) -> bool {
    kind == DataKind::Input || kind.is_static()
}

fn evictable(kind: DataKind) -> bool {
    matches!(kind, DataKind::Activation | DataKind::Saved)
}

impl Replay<'_> {
    fn infeasible(&self, why: String) -> SolveError {
        SolveError::Infeasible { budget: self.budget, reason: why }
    }

    /// Frees the resident, unpinned tensor of least `h` to make room; false if none is left.
    fn evict_one(&mut self) -> bool {
        let mut best: Option<(f64, usize)> = None;
        for (d, data) in self.g.data.iter().enumerate() {
            if !self.resident[d] || self.pinned[d] > 0 || !evictable(data.kind) || data.size == 0 {
                continue;
            }
            if data.kind == DataKind::Saved && self.siblings(d).any(|s| self.pinned[s] > 0) {
                continue; // its forward's saved tensors come back together, or not at all
            }
            let cost = self.producer[d].map_or(0.0, |p| self.g.compute[p].time);
            let staleness = (self.clock - self.last_touch[d]).max(1) as f64;
            let h = cost / (data.size as f64 * staleness);
            if best.is_none_or(|(bh, _)| h < bh) {
                best = Some((h, d));
            }
        }
        match best {
            Some((_, d)) => {
                if self.g.data[d].kind == DataKind::Saved {
                    let siblings: Vec<usize> = self.siblings(d).collect();
                    for s in siblings {
                        self.free(s);
                    }
                }
                self.free(d);
                true
            }
            None => false,
        }
    }

    /// The other resident saved tensors of `d`'s forward.
    fn siblings(&self, d: usize) -> impl Iterator<Item = usize> + '_ {
        let outs = self.producer[d].map(|p| &self.g.compute[p].outputs[..]).unwrap_or(&[]);
        outs.iter().copied().filter(move |&s| s != d && self.resident[s] && self.g.data[s].kind == DataKind::Saved)
    }

    fn free(&mut self, d: usize) {
        if self.resident[d] {
            self.resident[d] = false;
            self.mem -= self.g.data[d].size;
            self.count[d] = 0;
            self.ops.push(Op::Free { tensor: Tensor::Data(d) });
        }
    }

    /// Runs compute node `c` (after making its inputs resident), evicting as needed.
    fn run(&mut self, c: usize, no_grad: bool, depth: usize) -> Result<(), SolveError> {
        if depth > self.g.compute.len() {
            return Err(self.infeasible("recomputation does not terminate".into()));
        }
        let node = &self.g.compute[c];
        for &d in &node.inputs {
            self.pinned[d] += 1;
        }
        for &d in &node.inputs {
            if !self.resident[d] {
                let Some(p) = self.producer[d] else {
                    return Err(
                        self.infeasible(format!("`{}` is gone and no forward can recompute it", self.g.data[d].name))
                    );
                };
                let saved = self.g.data[d].kind == DataKind::Saved;
                if saved {
                    // Rerun with grad: its resident outputs must go first.
                    let outs = self.g.compute[p].outputs.clone();
                    for o in outs {
                        if self.pinned[o] == 0 {
                            self.free(o);
                        }
                    }
                }
                self.run(p, !saved, depth + 1)?;
            }
        }
        let node = &self.g.compute[c];
        let mut allocs = Vec::new();
        for &d in &node.outputs {
            let kind = self.g.data[d].kind;
            if (no_grad && kind == DataKind::Saved) || kind.is_static() || allocs.contains(&d) {
                continue;
            }
            if self.resident[d] {
                if self.nprod[d] > 1 && self.count[d] < self.nprod[d] {
                    continue; // accumulates
                }
                return Err(self.infeasible(format!("`{}` would be produced twice", self.g.data[d].name)));
            }
            allocs.push(d);
        }
        let need: u64 = allocs.iter().map(|&d| self.g.data[d].size).sum::<u64>() + node.tmp;
        for &d in &node.outputs {
            self.pinned[d] += 1;
        }
        while self.evict && self.mem + need > self.budget {
            if !self.evict_one() {
                return Err(self.infeasible(format!(
                    "`{}` needs {} bytes with {} resident and nothing left to evict",
                    node.name, need, self.mem
                )));
            }
        }
        self.ops.push(Op::Compute { node: c, no_grad });
        self.clock += 1;
        for &d in &allocs {
            self.resident[d] = true;
            self.mem += self.g.data[d].size;
            self.count[d] = 1;
        }
        for &d in &node.outputs {
            if self.resident[d] && !allocs.contains(&d) && !self.g.data[d].kind.is_static() {
                self.count[d] += 1;
            }
        }
        for &d in node.inputs.iter().chain(&node.outputs) {
            self.last_touch[d] = self.clock;
        }
        for &d in node.inputs.iter().chain(&node.outputs) {
            self.pinned[d] -= 1;
        }
        // Inside a recomputation, a dropped input has served its purpose.
        if depth > 0 {
            for &d in &self.g.compute[c].inputs {
                if self.dropped[d] && evictable(self.g.data[d].kind) && self.pinned[d] == 0 {
                    self.free(d);
                }
            }
        }
        Ok(())
    }
}

/// DTR's schedule for `g` under `budget`, or `Infeasible` when eviction cannot make room.
pub fn dtr_schedule(g: &TrainingGraph, budget: u64) -> Result<Schedule, SolveError> {
    replay(g, budget, None)
}

/// The eager order with every tensor of `dropped` freed after its last forward reader
/// and recomputed (recursively) before the backward reads it; no eviction, so the
/// simulator decides whether the result fits.
pub(crate) fn drop_and_recompute(g: &TrainingGraph, dropped: &[bool]) -> Result<Schedule, SolveError> {
    replay(g, u64::MAX, Some(dropped))
}

fn replay(g: &TrainingGraph, budget: u64, dropped: Option<&[bool]>) -> Result<Schedule, SolveError> {
    let nd = g.data.len();
    let mut last_read: Vec<Option<usize>> = vec![None; nd];
    let mut producer = vec![None; nd];
    let mut nprod = vec![0u32; nd];
    let mut read = vec![false; nd];
    for (c, node) in g.compute.iter().enumerate() {
        for &d in &node.inputs {
            last_read[d] = Some(c);
            read[d] = true;
        }
        for &d in &node.outputs {
            nprod[d] += 1;
            if node.kind == ComputeKind::Forward {
                producer[d] = Some(c);
            }
        }
    }
    let mut resident = vec![false; nd];
    let mut mem = 0;
    for (d, data) in g.data.iter().enumerate() {
        if fixed(data.kind) {
            resident[d] = true;
            mem += data.size;
        }
    }
    let mut r = Replay {
        g,
        budget,
        resident,
        mem,
        last_touch: vec![0; nd],
        clock: 0,
        last_read,
        producer,
        nprod,
        count: vec![0; nd],
        pinned: vec![0; nd],
        evict: dropped.is_none(),
        dropped: dropped.map_or_else(|| vec![false; nd], |x| x.to_vec()),
        ops: Vec::new(),
    };
    // Last forward reader of each data node (for the dropped ones).
    let mut last_forward_read: Vec<Option<usize>> = vec![None; nd];
    for (c, node) in g.compute.iter().enumerate() {
        if node.kind == ComputeKind::Forward {
            for &d in &node.inputs {
                last_forward_read[d] = Some(c);
            }
        }
    }
    if r.mem > budget {
        return Err(r.infeasible(format!("inputs and static data alone take {} bytes", r.mem)));
    }
    for c in 0..g.compute.len() {
        r.run(c, false, 0)?;
        // Free what the eager order no longer reads (gradients nobody reads stay: they
        // are outputs of the step).
        // Every resident tensor, not only this node's: recomputations leave their
        // intermediates behind.
        for d in 0..nd {
            if !r.resident[d] {
                continue;
            }
            let kind = g.data[d].kind;
            let done = r.last_read[d].is_none_or(|l| l <= c);
            let freeable = evictable(kind) || (kind == DataKind::Gradient && read[d]);
            let complete = r.count[d] >= r.nprod[d];
            if freeable && done && r.resident[d] && (kind != DataKind::Gradient || complete) {
                r.free(d);
            }
            // A dropped tensor goes once the forward pass is done with it; in the backward,
            // right after the node it was recomputed for (it is recomputed again if needed).
            let forward = g.compute[c].kind == ComputeKind::Forward;
            let drop = dropped.is_some_and(|x| x[d]) && evictable(kind);
            if drop && r.resident[d] && (!forward || last_forward_read[d].is_none_or(|l| l <= c)) && r.pinned[d] == 0 {
                r.free(d);
            }
        }
    }
    Ok(Schedule::new(View::Graph, r.ops))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::baseline::store_all::graph_store_all;
    use pebble_testkit::tiny_graph;

    fn sim(g: &TrainingGraph, s: &Schedule, budget: Option<u64>) -> pebble_sim::SimReport {
        let config = pebble_sim::SimConfig { budget, ..pebble_sim::SimConfig::default() };
        pebble_sim::simulate_graph(g, s, &config).expect("the simulator accepts DTR's schedule")
    }

    #[test]
    fn with_room_to_spare_dtr_is_store_all() {
        let g = tiny_graph();
        let store_all = sim(&g, &graph_store_all(&g), None);
        let s = dtr_schedule(&g, store_all.peak_bytes).expect("fits");
        let r = sim(&g, &s, Some(store_all.peak_bytes));
        assert_eq!(r.makespan, store_all.makespan);
        assert!(!s.ops.iter().any(|op| matches!(op, Op::Compute { no_grad: true, .. })));
    }

    #[test]
    fn on_zoo_models_every_budget_is_valid_and_tighter_costs_time() {
        for (name, options) in [
            ("mlp", pebble_zoo::ModelOptions { batch: Some(4), layers: Some(4), ..Default::default() }),
            (
                "gpt",
                pebble_zoo::ModelOptions {
                    batch: Some(1),
                    seq: Some(16),
                    layers: Some(3),
                    width: Some(16),
                    heads: Some(2),
                    ..Default::default()
                },
            ),
            (
                "resnet",
                pebble_zoo::ModelOptions {
                    batch: Some(1),
                    image: Some(32),
                    layers: Some(1),
                    width: Some(4),
                    ..Default::default()
                },
            ),
        ] {
            let g = pebble_zoo::build(name, &options).expect("model").graph;
            let top = sim(&g, &graph_store_all(&g), None);
            let fixed: u64 = g.data.iter().filter(|d| fixed(d.kind)).map(|d| d.size).sum();
            let mut feasible = 0;
            for k in 1..=10 {
                // Budgets spread over the activation memory, above inputs and static data.
                let budget = fixed + (top.peak_bytes - fixed) * k / 10;
                let s = match dtr_schedule(&g, budget) {
                    Ok(s) => s,
                    Err(e) => {
                        eprintln!("{name} at {k}/10: {e}");
                        continue;
                    }
                };
                let r = sim(&g, &s, Some(budget));
                assert!(r.peak_bytes <= budget, "{name}: peak {} over {budget}", r.peak_bytes);
                assert!(r.makespan >= top.makespan * (1.0 - 1e-9), "{name}: faster than store-all");
                feasible += 1;
            }
            assert!(feasible >= 2, "{name}: DTR fits only {feasible} of 10 budgets");
        }
    }
}
