//! Run-time policies on graphs that once broke them, each replayed and checked by the
//! simulator at its budget.

use pebble_graph::TrainingGraph;
use pebble_sim::{simulate_graph, Machine, SimConfig};
use pebble_solve::policy::replay::replay;
use pebble_solve::policy::{Delta, Filter};

/// `gpt` (2 layers of width 64, sequence 64, batch 4) with op times and temporaries
/// profiled on the CPU: `lm_head`'s temporary is twice its output.
fn profiled_gpt() -> TrainingGraph {
    TrainingGraph::from_json(include_str!("data/gpt-2x64-profiled.json")).expect("the fixture is a training graph")
}

/// DELTA's prefetcher reloaded a tensor while the link was still busy with the one before
/// it; the simulator placed the next compute op (with `lm_head`'s 2 MB temporary) before
/// that reload started and did not see the reload land on top of it: 7,261,872 bytes
/// against a budget of 7,210,964. A compute op now waits until it fits beside what earlier
/// ops take later in time.
#[test]
fn delta_on_a_profiled_gpt_fits_every_budget() {
    let g = profiled_gpt();
    let machine = Machine::default().with_bandwidth(10e9);
    let mut checked = 0;
    for budget in (6_000_000..9_000_000).step_by(50_000).chain([7_210_964]) {
        for filter in [Filter::Base, Filter::Lru, Filter::Largest] {
            let Ok(r) = replay(&g, budget, &Delta::new("delta", filter, 10e9)) else { continue };
            let config = SimConfig { budget: Some(budget), ..SimConfig::on(machine) };
            let s = simulate_graph(&g, &r.schedule, &config)
                .unwrap_or_else(|e| panic!("{filter:?} at {budget} bytes: the simulator refuses: {e}"));
            assert!(s.peak_bytes <= budget);
            checked += 1;
        }
    }
    assert!(checked >= 60, "only {checked} budgets fit");
}

/// LRU and DELTA evicted attention's saved weights while its output stayed; the backward
/// that reads both then reran attention with grad, which would have made the output a
/// second time: "`h.3.attn.weights` would be produced twice", on the zoo's 4-layer `gpt`
/// at 81.5 MB (DELTA) and 82,293,197 bytes (LRU, which `auto` then reported as having no
/// plan). The rerun now frees its outputs first, read or not.
#[test]
fn a_rerun_with_grad_never_makes_an_output_twice() {
    let options = pebble_zoo::ModelOptions { layers: Some(4), ..pebble_zoo::ModelOptions::default() };
    let g = pebble_zoo::build("gpt", &options).unwrap().graph;
    let machine = options.profile.machine; // the V100's
    let checked = every_policy_fits(&g, machine, (70_000_000..100_000_000).step_by(500_000).chain([82_293_197]));
    assert!(checked >= 250, "only {checked} of 305 plans fit");
}

/// `transformers`' GPT-2 (2 layers of width 64, 4 × 32 tokens) as `pebble.torch` captured
/// it on the CPU: `add_1` (the attention mask's) makes two activations, and DTR evicted
/// one while the other stayed. A backward then reran `add_1` without grad for the evicted
/// one, which would have made the resident one a second time: "`add` would be produced
/// twice" on every budget below 2,047,232 bytes, where DELTA's policies plan down to
/// 1,546,240. A rerun now frees what it makes first, with grad or without.
#[test]
fn a_rerun_without_grad_never_makes_an_output_twice() {
    let g = pebble_testkit::captured::hf_gpt2();
    let machine = Machine::default();
    let checked = every_policy_fits(&g, machine, (1_500_000..2_700_000).step_by(25_000));
    assert!(checked >= 200, "only {checked} plans fit");
}

/// Replays every policy at each budget: none fails with an output made twice, and each
/// plan the simulator runs within the budget. Returns how many plans there were.
fn every_policy_fits(g: &TrainingGraph, machine: Machine, budgets: impl Iterator<Item = u64>) -> usize {
    let mut checked = 0;
    for budget in budgets {
        for name in pebble_solve::policy::NAMES {
            let policy = pebble_solve::policy::policy(name, machine.d2h.bandwidth).unwrap();
            let r = match replay(g, budget, policy.as_ref()) {
                Ok(r) => r,
                Err(e) => {
                    assert!(!e.to_string().contains("twice"), "{name} at {budget} bytes: {e}");
                    continue;
                }
            };
            let config = SimConfig { budget: Some(budget), ..SimConfig::on(machine) };
            let s = simulate_graph(g, &r.schedule, &config)
                .unwrap_or_else(|e| panic!("{name} at {budget} bytes: the simulator refuses: {e}"));
            assert!(s.peak_bytes <= budget, "{name} at {budget} bytes: peak {}", s.peak_bytes);
            checked += 1;
        }
    }
    checked
}
