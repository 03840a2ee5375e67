//! `knapsack`: the knapsack step of PyTorch's compile partitioner's activation-memory
//! budget alone, on the training graph (`pytorch-mincut` is the partitioner: the
//! knapsack, then the min cut).
//!
//! Every tensor the backward reads from the forward (an activation or a saved tensor) is
//! an item: keeping it costs its size, dropping it costs the time of the forward that
//! recomputes it. A 0/1 knapsack (dynamic programming over memory discretized into
//! [`SLOTS`] units, as the partitioner's `dp_knapsack` does) keeps the set of greatest
//! recomputation time within a capacity; the rest is freed after the forward pass and
//! recomputed before the backward reads it. The solver tries a ladder of capacities and
//! returns the fastest schedule whose simulated peak fits the budget.

use pebble_graph::TrainingGraph;
use pebble_schedule::{Schedule, View};

use super::fastest_fitting;
pub use super::partitioner::SLOTS;
use super::partitioner::{knapsack, Network};
use crate::policy::replay::drop_and_recompute;
use crate::{Problem, SolveError, SolveOptions, Solver};

/// Capacities tried, evenly spaced from nothing kept to everything kept.
const LADDER: u64 = 24;

/// PyTorch's activation-memory-budget knapsack.
pub struct Knapsack;

impl Solver for Knapsack {
    fn name(&self) -> &'static str {
        "knapsack"
    }

    fn description(&self) -> &'static str {
        "the knapsack step of PyTorch's partitioner alone: keep the saved tensors of most recompute time, recompute \
         the rest on demand (see pytorch-mincut)"
    }

    fn views(&self) -> &'static [View] {
        &[View::Graph]
    }

    fn solve(&self, problem: Problem<'_>, budget: u64, options: &SolveOptions) -> Result<Schedule, SolveError> {
        let g = super::valid_graph(problem, "knapsack")?;
        let items = items(g);
        let total: u64 = items.iter().map(|&(d, _)| g.data[d].size).sum();
        let candidates: Vec<Schedule> = (0..=LADDER)
            .filter_map(|k| {
                let keep = keep_within(g, &items, total * k / LADDER);
                let mut dropped = vec![false; g.data.len()];
                for (&(d, _), kept) in items.iter().zip(&keep) {
                    dropped[d] = !kept;
                }
                drop_and_recompute(g, &dropped).ok()
            })
            .collect();
        fastest_fitting(problem, budget, options, "knapsack", candidates)
    }
}

inventory::submit!(crate::Registration(&Knapsack));

/// The knapsack's items: each forward-made tensor a backward reads, with the time of the
/// forward that would recompute it.
fn items(g: &TrainingGraph) -> Vec<(usize, f64)> {
    let net = Network::new(g);
    (0..g.data.len())
        .filter(|&d| net.needed[d])
        .filter_map(|d| net.producer[d].map(|p| (d, g.compute[p].time)))
        .collect()
}

/// Which items to keep: the greatest total recomputation time whose sizes, rounded up to
/// `capacity / SLOTS` units, fit `capacity`.
fn keep_within(g: &TrainingGraph, items: &[(usize, f64)], capacity: u64) -> Vec<bool> {
    let sizes: Vec<u64> = items.iter().map(|&(d, _)| g.data[d].size).collect();
    let values: Vec<f64> = items.iter().map(|&(_, v)| v).collect();
    knapsack(&sizes, &values, capacity)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::baseline::store_all::graph_store_all;

    fn sim(g: &TrainingGraph, s: &Schedule) -> pebble_sim::SimReport {
        let config = pebble_sim::SimConfig::default();
        pebble_sim::simulate_graph(g, s, &config).expect("the simulator accepts the schedule")
    }

    #[test]
    fn knapsack_keeps_the_most_time_within_the_capacity() {
        let g = pebble_testkit::gpt(2, 16, 16).graph;
        let items = items(&g);
        assert!(items.len() > 10);
        let total: u64 = items.iter().map(|&(d, _)| g.data[d].size).sum();
        for k in 0..=8 {
            let cap = total * k / 8;
            let keep = keep_within(&g, &items, cap);
            let kept: u64 = items.iter().zip(&keep).filter(|(_, &k)| k).map(|(&(d, _), _)| g.data[d].size).sum();
            assert!(kept <= cap, "kept {kept} over {cap}");
        }
        // Every rung of the ladder is a valid schedule, slower the less it keeps.
        let top = sim(&g, &graph_store_all(&g));
        let none = sim(&g, &drop_and_recompute(&g, &vec![true; g.data.len()]).expect("valid"));
        assert!(none.makespan > top.makespan);
        assert!(none.peak_bytes < top.peak_bytes);
        let all = sim(&g, &drop_and_recompute(&g, &vec![false; g.data.len()]).expect("valid"));
        assert_eq!(all.makespan, top.makespan);
    }

    #[test]
    fn solver_fits_the_budget_between_the_extremes() {
        let g = pebble_zoo::build(
            "resnet",
            &pebble_zoo::ModelOptions {
                batch: Some(1),
                image: Some(32),
                layers: Some(1),
                width: Some(4),
                ..Default::default()
            },
        )
        .expect("model")
        .graph;
        let top = sim(&g, &graph_store_all(&g));
        let low = sim(&g, &drop_and_recompute(&g, &vec![true; g.data.len()]).expect("valid"));
        let options = SolveOptions::default();
        let mut last = f64::INFINITY;
        for k in 0..=4 {
            let budget = low.peak_bytes + (top.peak_bytes - low.peak_bytes) * k / 4;
            let plan = crate::plan(&Knapsack, Problem::Graph(&g), budget, &options).expect("fits");
            assert!(plan.report.peak_bytes <= budget);
            assert!(plan.report.makespan <= last * (1.0 + 1e-9), "more memory, more time");
            last = plan.report.makespan;
        }
        assert_eq!(last, top.makespan);
    }
}
