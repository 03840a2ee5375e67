//! Tests of the baseline solvers through `plan` and the simulator.

use pebble_graph::Chain;
use pebble_schedule::{ForwardMode, Op, Schedule, View};
use pebble_sim::SimReport;

use super::*;
use crate::{min_feasible_budget, plan, solver, PlanError, Problem, SolveError, SolveOptions};
use pebble_testkit::{random_chains, tiny_graph};

/// A budget nothing reaches. (Not `u64::MAX`: see the report on the simulator's budget
/// comparison.)
const BIG: u64 = 1 << 50;

const BASELINES: [&str; 5] = ["store-all", "sequential", "chen-sqrt", "recompute-all", "revolve"];

fn sim(chain: &Chain, ops: Vec<Op>) -> SimReport {
    let s = Schedule::new(View::Chain, ops);
    simulate_unbounded(Problem::Chain(chain), &s, &SolveOptions::default())
        .unwrap_or_else(|e| panic!("{} rejected on {chain:?}: {e}", s.to_notation()))
}

fn sum(v: &[f64]) -> f64 {
    v.iter().sum()
}

/// A chain with distinct times and sizes, L = 3.
use pebble_testkit::hand_chain;

#[test]
fn registry_lists_the_baselines() {
    for name in BASELINES {
        assert_eq!(solver(name).map(|s| s.name()), Ok(name));
    }
    assert_eq!(solver("revolve-optimal").map(|s| s.name()), Ok("revolve-optimal"));
    let unknown = solver("rotr").map(|s| s.name()).unwrap_err();
    assert!(unknown.known.contains(&"rotor") && unknown.to_string().contains("known: "), "{unknown}");
    let g = tiny_graph();
    for name in ["sequential", "chen-sqrt", "recompute-all", "revolve"] {
        let e = solver(name).unwrap().solve(Problem::Graph(&g), BIG, &SolveOptions::default()).unwrap_err();
        assert!(matches!(e, SolveError::NotApplicable { view: View::Graph, .. }), "{name}: {e}");
    }
}

#[test]
fn every_baseline_fits_between_recompute_all_and_store_all() {
    let options = SolveOptions::default();
    for (n, chain) in random_chains(0x5eed_0001, 80, 8).iter().enumerate() {
        let l = chain.len();
        let problem = Problem::Chain(chain);
        let sp = sim(chain, store_all_ops(l)).peak_bytes;
        let rp = sim(chain, recompute_all_ops(l)).peak_bytes;
        let (lo, hi) = (rp.min(sp), rp.max(sp));
        let budgets: Vec<u64> = (0..=6).map(|j| lo + (hi - lo) * j / 6).chain([hi + 1, BIG]).collect();
        for &budget in &budgets {
            let mut times = std::collections::BTreeMap::new();
            for name in BASELINES {
                match plan(solver(name).unwrap(), problem, budget, &options) {
                    Ok(p) => {
                        assert!(p.report.peak_bytes <= budget, "{name} on chain {n}");
                        assert!(p.report.makespan >= chain.ideal_time() - 1e-9, "{name} on chain {n}");
                        times.insert(name, p.report.makespan);
                    }
                    Err(PlanError::Solve(SolveError::Infeasible { .. })) => {
                        let must = match name {
                            "store-all" | "sequential" => budget >= sp,
                            "recompute-all" | "revolve" => budget >= rp,
                            _ => false,
                        };
                        assert!(
                            !must,
                            "{name} failed at budget {budget} on chain {n} (store-all {sp}, recompute-all {rp})"
                        );
                    }
                    Err(e) => panic!("{name} on chain {n} at budget {budget}: {e}"),
                }
            }
            // Sequential tries every k, chen-sqrt's and store-all's (k = 1) among them;
            // revolve's candidates include recompute-all (c = 1).
            for other in ["chen-sqrt", "store-all"] {
                if let Some(t) = times.get(other) {
                    assert!(times["sequential"] <= t + 1e-9, "sequential slower than {other} on chain {n}");
                }
            }
            if let Some(t) = times.get("recompute-all") {
                assert!(times["revolve"] <= t + 1e-9, "revolve slower than recompute-all on chain {n}");
            }
            if let Some(t) = times.get("store-all") {
                assert!(same_time(*t, chain.ideal_time()));
            }
        }
    }
}

#[test]
fn store_all_makespan_is_one_of_everything() {
    for chain in random_chains(7, 30, 12) {
        let r = sim(&chain, store_all_ops(chain.len()));
        assert_eq!(r.makespan, sum(&chain.ftime) + sum(&chain.btime));
        assert_eq!(r.compute_ops, 2 * chain.len() + 1);
    }
}

#[test]
fn recompute_all_makespan_by_hand() {
    let chain = hand_chain();
    // Stage j runs forward once in the forward pass and once more before each B_i, i ≥ j:
    // 4×1 + 3×2 + 2×4 = 18 forward time, plus 100 of backward.
    let r = sim(&chain, recompute_all_ops(3));
    assert_eq!(r.makespan, 118.0);
    assert_eq!(r.compute_ops, 3 + 1 + 4 + 3 + 2);
    let p = plan(solver("recompute-all").unwrap(), Problem::Chain(&chain), BIG, &SolveOptions::default()).unwrap();
    assert_eq!(p.report.makespan, 118.0);
    // Σ_j ftime[j]·(L − j + 1) + Σ btime on random chains.
    for chain in random_chains(11, 30, 10) {
        let l = chain.len();
        let f: f64 = chain.ftime.iter().enumerate().map(|(j, t)| t * (l - j + 1) as f64).sum();
        assert_eq!(sim(&chain, recompute_all_ops(l)).makespan, f + sum(&chain.btime));
    }
}

/// Peaks under Table 2.1 (an op holds its inputs, outputs and overhead on top of what is
/// stored; `F_all` keeps its input, `F_∅` consumes it, `B_i` consumes `δ_{i+1}`, `ā_{i+1}`
/// and a plain `a_i` but keeps a saved `ā_i`; the loss likewise).
#[test]
fn chain_peaks_by_hand() {
    let chain = Chain {
        utmp: None,
        name: None,
        ftime: vec![1.0, 1.0],
        btime: vec![1.0, 1.0, 1.0],
        x: vec![4, 3, 5],
        xbar: vec![4, 6, 9],
        ftmp: vec![2, 1],
        btmp: vec![3, 2, 7],
        w: None,
        g: None,
        o: None,
        static_bytes: 10,
    };
    // store-all: F0all 10+4+6+2 = 22; F1all 10+4+6+9+1 = 30; loss 10+4+6+9+5+7 = 41;
    // B1 10+4+6+9+5+3+2 = 39; B0 10+4+6+3+4+3 = 30.
    assert_eq!(sim(&chain, store_all_ops(2)).peak_bytes, 41);
    // recompute-all: F0ck 19, F1none 23, loss 31, F0ck 24, F1all 32, B1 36, F0all 25, B0 30.
    assert_eq!(sim(&chain, recompute_all_ops(2)).peak_bytes, 36);
}

#[test]
fn sequential_with_two_segments_on_four_stages() {
    let chain = Chain::homogeneous(4, 1.0, 1.0, 1);
    let s = Schedule::new(View::Chain, sequential_ops(4, 2));
    assert_eq!(s.to_notation(), "F0ck F1none F2all F3all B4 B3 B2 F0all F1all B1 B0");
    let times = Chain { ftime: vec![1.0, 2.0, 4.0, 8.0], btime: vec![16.0, 32.0, 64.0, 128.0, 256.0], ..chain.clone() };
    // Stages 0 and 1 run forward twice.
    assert_eq!(sim(&times, s.ops.clone()).makespan, 2.0 * 3.0 + 12.0 + 496.0);
    // The solver, given exactly that schedule's peak, does at least as well.
    let peak = sim(&times, s.ops).peak_bytes;
    let p = plan(solver("sequential").unwrap(), Problem::Chain(&times), peak, &SolveOptions::default()).unwrap();
    assert!(p.report.makespan <= 514.0 && p.report.peak_bytes <= peak);
}

#[test]
fn chen_uses_ceil_sqrt_segments() {
    let chain = Chain::homogeneous(10, 1.0, 1.0, 1);
    let p = plan(solver("chen-sqrt").unwrap(), Problem::Chain(&chain), BIG, &SolveOptions::default()).unwrap();
    // k = 4 segments of 2, 2, 2, 4 stages: the first six stages run forward twice.
    assert_eq!(p.schedule.ops, sequential_ops(10, 4));
    assert_eq!(p.report.makespan, 10.0 + 6.0 + 11.0);
    let e = plan(solver("chen-sqrt").unwrap(), Problem::Chain(&chain), 1, &SolveOptions::default()).unwrap_err();
    assert!(matches!(e, PlanError::Solve(SolveError::Infeasible { budget: 1, .. })));
}

#[test]
fn revolve_at_large_budget_recomputes_every_stage_once() {
    let chain = hand_chain();
    let p = plan(solver("revolve").unwrap(), Problem::Chain(&chain), BIG, &SolveOptions::default()).unwrap();
    // c = L: checkpoint every activation, then F_i all before each B_i.
    assert_eq!(p.schedule.to_notation(), "F0ck F1ck F2ck B3 F2all B2 F1all B1 F0all B0");
    // Store-all's 7 + 100, plus every forward once more: 107 + 7.
    assert_eq!(p.report.makespan, 114.0);
    for chain in random_chains(3, 30, 9) {
        let p = plan(solver("revolve").unwrap(), Problem::Chain(&chain), BIG, &SolveOptions::default()).unwrap();
        assert_eq!(p.report.makespan, chain.ideal_time() + sum(&chain.ftime));
        let forwards = p.schedule.ops.iter().filter(|o| matches!(o, Op::Forward { .. })).count();
        assert_eq!(forwards, 2 * chain.len());
    }
}

#[test]
fn revolve_forward_counts_follow_opt0() {
    // On a homogeneous chain each candidate c runs t(L+1, c) forwards plus L inserted F_all.
    let l = 9;
    let table = crate::remat::revolve::Opt0Table::new(l, l + 2, 1.0, 1.0);
    let chain = Chain::homogeneous(l, 1.0, 1.0, 1);
    for c in 1..=l {
        let s = revolve::revolve_schedule(&table, l, c);
        let steps = crate::remat::revolve::binomial_forward_steps(l as u64 + 1, c as u64).unwrap();
        let r = sim(&chain, s.ops.clone());
        assert_eq!(r.makespan, (steps + l as u64) as f64 + (l + 1) as f64, "c = {c}");
        let ck = s.ops.iter().filter(|o| matches!(o, Op::Forward { mode: ForwardMode::Checkpoint, .. })).count();
        assert!(ck >= 1);
    }
    assert_eq!(revolve::revolve_schedule(&table, l, 1).ops, recompute_all_ops(l));
}

#[test]
fn min_feasible_budgets() {
    let options = SolveOptions::default();
    for chain in random_chains(0xb0d9e7, 25, 7) {
        let l = chain.len();
        let problem = Problem::Chain(&chain);
        let sp = sim(&chain, store_all_ops(l)).peak_bytes;
        let rp = sim(&chain, recompute_all_ops(l)).peak_bytes;
        assert_eq!(min_feasible_budget(solver("store-all").unwrap(), problem, &options).unwrap(), Some(sp));
        assert_eq!(min_feasible_budget(solver("recompute-all").unwrap(), problem, &options).unwrap(), Some(rp));
        let seq = (1..=l).map(|k| sim(&chain, sequential_ops(l, k)).peak_bytes).min().unwrap();
        assert_eq!(min_feasible_budget(solver("sequential").unwrap(), problem, &options).unwrap(), Some(seq));
        let table = crate::remat::revolve::Opt0Table::new(l, l + 2, 1.0, 1.0);
        let rev = (1..=l).map(|c| sim(&chain, revolve::revolve_schedule(&table, l, c).ops).peak_bytes).min().unwrap();
        assert_eq!(min_feasible_budget(solver("revolve").unwrap(), problem, &options).unwrap(), Some(rev));
        assert!(rev <= rp);
    }
    let g = tiny_graph();
    assert_eq!(min_feasible_budget(solver("revolve").unwrap(), Problem::Graph(&g), &options).unwrap(), None);
    assert_eq!(min_feasible_budget(solver("store-all").unwrap(), Problem::Graph(&g), &options).unwrap(), Some(77));
}

#[test]
fn graph_store_all_by_hand() {
    let g = tiny_graph();
    let s = store_all::graph_store_all(&g);
    // a2 dies after the loss; a1 and da2 after f2.bwd; s1 and da1 after f1.bwd; dx is
    // the step's output and stays; x, w, gw are never freed.
    assert_eq!(
        s.to_notation(),
        "C0 C1 C2 [free Data(5)] C3 [free Data(3)] [free Data(6)] C4 [free Data(4)] [free Data(7)]"
    );
    let p = plan(solver("store-all").unwrap(), Problem::Graph(&g), 1000, &SolveOptions::default()).unwrap();
    // Resident from the start: x 10 + w 4 + gw 4 = 18.
    // f1: 18 + a1 20 + s1 6 + tmp 3 = 47, then 44; f2: 44 + a2 8 + tmp 2 = 54, then 52;
    // loss: 52 + da2 8 + tmp 1 = 61, then 60, a2 freed: 52;
    // f2.bwd: 52 + da1 20 + tmp 5 = 77 (gw is resident already), then 72, a1 and da2 freed: 44;
    // f1.bwd: 44 + dx 10 = 54, then s1 and da1 freed: 28.
    assert_eq!(p.report.peak_bytes, 77);
    assert_eq!(p.report.makespan, 10.5);
    let e = plan(solver("store-all").unwrap(), Problem::Graph(&g), 76, &SolveOptions::default()).unwrap_err();
    assert!(matches!(e, PlanError::Solve(SolveError::Infeasible { budget: 76, .. })), "{e}");
}

#[test]
fn long_chains_plan() {
    // Every baseline on a 60-stage chain, at a budget between recompute-all and store-all.
    let mut rng = pebble_testkit::Rng::new(60);
    let chain = pebble_testkit::random_chain(&mut rng, 60);
    let sp = sim(&chain, store_all_ops(60)).peak_bytes;
    let rp = sim(&chain, recompute_all_ops(60)).peak_bytes;
    let budget = (sp + rp) / 2;
    for name in ["sequential", "recompute-all", "revolve"] {
        let p = plan(solver(name).unwrap(), Problem::Chain(&chain), budget, &SolveOptions::default()).unwrap();
        assert!(p.report.peak_bytes <= budget);
    }
}
