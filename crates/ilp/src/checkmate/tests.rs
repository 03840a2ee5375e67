//! Tests of `checkmate` through `plan` and the simulator: validity under the budget,
//! store-all where it fits, monotonicity, no worse than the other graph solvers, the
//! least feasible budget, and an exhaustive search over recomputations on a small chain.

use pebble_graph::{ComputeKind, DataKind, TrainingGraph};
use pebble_schedule::{Op, Schedule, Tensor, View};
use pebble_sim::{SimConfig, SimReport};
use pebble_solve::baseline::store_all::graph_store_all;
use pebble_solve::{min_feasible_budget, plan, registry, solver, PlanError, Problem, SolveError, SolveOptions};
use pebble_testkit::{chain_graph, residual_graph};
use pebble_zoo::ModelOptions;

use super::*;

/// HiGHS stops within a relative gap of 10⁻⁴ of the recomputation time, which is at most
/// that fraction of the makespan.
const GAP: f64 = 1e-4;

fn options() -> SolveOptions {
    SolveOptions { time_limit: Some(60.0), ..SolveOptions::default() }
}

fn simulate(g: &TrainingGraph, s: &Schedule) -> Result<SimReport, pebble_sim::SimError> {
    pebble_sim::simulate_graph(g, s, &SimConfig { budget: None, ..SimConfig::default() })
}

fn store_all(g: &TrainingGraph) -> SimReport {
    simulate(g, &graph_store_all(g)).expect("store-all is valid")
}

fn same(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1e-300)
}

fn zoo(name: &str, o: ModelOptions) -> TrainingGraph {
    pebble_zoo::build(name, &o).unwrap_or_else(|e| panic!("{name}: {e}")).graph
}

fn mlp(layers: usize) -> TrainingGraph {
    zoo("mlp", ModelOptions { layers: Some(layers), batch: Some(4), ..Default::default() })
}

fn gpt_tiny() -> TrainingGraph {
    pebble_testkit::gpt(1, 16, 8).graph
}

/// The graphs on which the ILP solves to optimality in milliseconds at every budget.
fn graphs() -> Vec<(&'static str, TrainingGraph)> {
    vec![
        ("chain-3", chain_graph(3, true)),
        ("chain-4", chain_graph(4, false)),
        ("residual", residual_graph()),
        ("mlp-2", mlp(2)),
        ("mlp-3", mlp(3)),
    ]
}

fn checkmate() -> &'static dyn Solver {
    solver("checkmate").expect("checkmate is registered")
}

/// `points + 1` budgets from `lo` to `hi`.
fn grid(lo: u64, hi: u64, points: u64) -> Vec<u64> {
    (0..=points).map(|j| lo + (hi - lo) * j / points).collect()
}

#[test]
fn registered_for_the_graph_view_only() {
    let s = checkmate();
    assert_eq!(s.views(), &[View::Graph]);
    let chain = pebble_zoo::build("mlp", &ModelOptions { layers: Some(2), ..Default::default() }).unwrap().chain;
    let e = s.solve(Problem::Chain(&chain), 1 << 40, &options()).unwrap_err();
    assert!(matches!(e, SolveError::NotApplicable { view: View::Chain, .. }), "{e}");
}

/// (a), (b), (c) and (e): from below the least feasible budget up to the store-all peak,
/// every schedule passes the simulator under its budget, the makespan never grows with
/// the budget, and at the store-all peak it is store-all's.
#[test]
fn valid_monotone_and_store_all_at_its_peak() {
    let opts = options();
    for (name, g) in graphs() {
        let problem = Problem::Graph(&g);
        let sa = store_all(&g);
        let min = min_feasible_budget(checkmate(), problem, &opts).unwrap().expect("feasible at some budget");
        assert!(min <= sa.peak_bytes, "{name}: least budget {min} above store-all's {}", sa.peak_bytes);
        match plan(checkmate(), problem, min - 1, &opts) {
            Err(PlanError::Solve(SolveError::Infeasible { budget, .. })) => assert_eq!(budget, min - 1),
            other => panic!("{name}: below the least budget {min}: {other:?}"),
        }
        let mut previous = f64::INFINITY;
        for budget in grid(min, sa.peak_bytes, 6) {
            let p = plan(checkmate(), problem, budget, &opts).unwrap_or_else(|e| panic!("{name} at {budget}: {e}"));
            assert!(p.report.peak_bytes <= budget, "{name} at {budget}: peak {}", p.report.peak_bytes);
            assert!(p.report.makespan >= sa.makespan * (1.0 - 1e-9), "{name} at {budget}: faster than store-all");
            assert!(p.report.makespan <= previous * (1.0 + GAP), "{name} at {budget}: slower with more memory");
            previous = p.report.makespan;
        }
        let p = plan(checkmate(), problem, sa.peak_bytes, &opts).unwrap();
        assert!(same(p.report.makespan, sa.makespan), "{name}: {} vs store-all {}", p.report.makespan, sa.makespan);
        // Above the peak, too.
        let p = plan(checkmate(), problem, sa.peak_bytes * 2, &opts).unwrap();
        assert!(same(p.report.makespan, sa.makespan), "{name}: {} vs store-all {}", p.report.makespan, sa.makespan);
    }
}

/// (d): no graph solver in the registry does better at any budget by recomputation alone.
#[test]
fn no_worse_than_the_other_graph_solvers() {
    let opts = options();
    let others: Vec<&dyn Solver> =
        registry().into_iter().filter(|s| s.name() != "checkmate" && s.views().contains(&View::Graph)).collect();
    assert!(others.iter().any(|s| s.name() == "store-all"));
    let mut compared = 0;
    for (name, g) in graphs() {
        let problem = Problem::Graph(&g);
        let sa = store_all(&g);
        let lo = min_feasible_budget(checkmate(), problem, &opts).unwrap().unwrap();
        for budget in grid(lo, sa.peak_bytes, 5) {
            let mine = plan(checkmate(), problem, budget, &opts).unwrap_or_else(|e| panic!("{name} at {budget}: {e}"));
            for other in &others {
                if let Ok(p) = plan(*other, problem, budget, &opts) {
                    // Checkmate only recomputes: a schedule that also uses the host (DELTA's
                    // offloads) is not in its space.
                    let moves = p.schedule.ops.iter().any(|op| matches!(op, Op::Offload { .. } | Op::Prefetch { .. }));
                    if moves {
                        continue;
                    }
                    compared += 1;
                    assert!(
                        mine.report.makespan <= p.report.makespan * (1.0 + GAP),
                        "{name} at {budget}: checkmate {} > {} {}",
                        mine.report.makespan,
                        other.name(),
                        p.report.makespan
                    );
                }
            }
        }
    }
    assert!(compared > 20, "only {compared} comparisons");
}

/// The one-layer GPT (37 nodes, about 2,000 columns) is already hard for the ILP: at some
/// budgets just above its least one (98.5% of the store-all peak) HiGHS does not close
/// the gap in a minute. So here: store-all at its peak (the warm start), optimal
/// schedules just below the peak (solved in about a second), never slower with more
/// memory, and schedules that pass the simulator wherever HiGHS returns one within a
/// short limit, down to the least budget.
#[test]
fn gpt_one_layer() {
    let g = gpt_tiny();
    let problem = Problem::Graph(&g);
    let sa = store_all(&g);
    let opts = options();
    let p = plan(checkmate(), problem, sa.peak_bytes, &opts).unwrap();
    assert!(same(p.report.makespan, sa.makespan), "{} vs store-all {}", p.report.makespan, sa.makespan);
    let mut times = Vec::new();
    for budget in [sa.peak_bytes - sa.peak_bytes / 125, sa.peak_bytes - sa.peak_bytes / 500, sa.peak_bytes] {
        let p = plan(checkmate(), problem, budget, &opts).unwrap_or_else(|e| panic!("at {budget}: {e}"));
        assert!(p.report.peak_bytes <= budget);
        assert!(
            times.last().is_none_or(|&t| p.report.makespan <= t * (1.0 + GAP)),
            "at {budget}: slower with more memory"
        );
        times.push(p.report.makespan);
    }
    assert!(times[0] > sa.makespan * (1.0 + 1e-6), "no recomputation 0.8% below the peak: {times:?}");
    // Lower budgets, with a short limit: whatever comes back is valid.
    let short = SolveOptions { time_limit: Some(1.0), ..SolveOptions::default() };
    for per_mille in [985, 990] {
        let budget = sa.peak_bytes * per_mille / 1000;
        match plan(checkmate(), problem, budget, &short) {
            Ok(p) => assert!(p.report.peak_bytes <= budget),
            Err(PlanError::Solve(SolveError::TooLarge { .. })) => {}
            Err(e) => panic!("at {budget}: {e}"),
        }
    }
}

/// A tight budget on the residual graph forces recomputation, and the gradient with two
/// producers is accumulated, not allocated twice.
#[test]
fn recomputes_under_pressure_and_accumulates_gradients() {
    let g = residual_graph();
    let problem = Problem::Graph(&g);
    let opts = options();
    let min = min_feasible_budget(checkmate(), problem, &opts).unwrap().unwrap();
    let sa = store_all(&g);
    assert!(min < sa.peak_bytes);
    let p = plan(checkmate(), problem, min, &opts).unwrap();
    let computes: Vec<usize> = p
        .schedule
        .ops
        .iter()
        .filter_map(|op| if let Op::Compute { node, .. } = op { Some(*node) } else { None })
        .collect();
    assert!(computes.len() > g.compute.len(), "no recomputation at the least budget: {computes:?}");
    assert!(p.report.makespan > sa.makespan);
    for b in [3, 4, 5, 6] {
        assert_eq!(computes.iter().filter(|&&k| k == b).count(), 1, "node {b} must run once: {computes:?}");
    }
    // Never frees static data or inputs.
    for op in &p.schedule.ops {
        if let Op::Free { tensor: Tensor::Data(d) } = op {
            assert!(!g.data[*d].kind.is_static() && g.data[*d].kind != DataKind::Input, "frees {}", g.data[*d].name);
        }
    }
}

/// The input's gradient, read by nobody, stays to the end as in store-all.
#[test]
fn keeps_the_input_gradient() {
    let g = chain_graph(3, true);
    let g0 = g.data.iter().position(|d| d.name == "g0").unwrap();
    let sa = store_all(&g);
    let p = plan(checkmate(), Problem::Graph(&g), sa.peak_bytes, &options()).unwrap();
    assert!(!p.schedule.ops.contains(&Op::Free { tensor: Tensor::Data(g0) }));
}

/// Budgets below the fixed memory, or below what one node needs alone, are refused
/// before any solve, naming the node.
#[test]
fn obviously_infeasible_budgets() {
    let g = gpt_tiny();
    let fixed = g.static_bytes() + g.data.iter().filter(|d| d.kind == DataKind::Input).map(|d| d.size).sum::<u64>();
    for budget in [0, fixed / 2, fixed] {
        match checkmate().solve(Problem::Graph(&g), budget, &options()) {
            Err(SolveError::Infeasible { budget: b, reason }) => {
                assert_eq!(b, budget);
                assert!(reason.contains("alone needs"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
    }
}

/// An invalid graph is an error, not a panic.
#[test]
fn invalid_graph() {
    let mut g = chain_graph(2, false);
    g.compute[0].inputs.push(999);
    assert!(matches!(
        checkmate().solve(Problem::Graph(&g), 1 << 30, &options()),
        Err(SolveError::Infeasible { reason, .. }) if reason.contains("invalid training graph")
    ));
}

/// Frees after the last use before the next production, written independently of the
/// solver: the oracle's schedules.
fn oracle_schedule(g: &TrainingGraph, seq: &[usize]) -> Schedule {
    let tracked = |d: usize| !(g.data[d].kind.is_static() || g.data[d].kind == DataKind::Input);
    let mut ops = Vec::new();
    for (p, &k) in seq.iter().enumerate() {
        ops.push(Op::Compute { node: k, no_grad: false });
        let mut touched: Vec<usize> = g.compute[k].inputs.iter().chain(&g.compute[k].outputs).copied().collect();
        touched.sort_unstable();
        touched.dedup();
        for d in touched.into_iter().filter(|&d| tracked(d)) {
            // The next event of d: a read, or a production (a new copy).
            let next = seq[p + 1..].iter().find_map(|&j| {
                if g.compute[j].inputs.contains(&d) {
                    Some(true)
                } else if g.compute[j].outputs.contains(&d) {
                    Some(false)
                } else {
                    None
                }
            });
            let unread_gradient =
                g.data[d].kind == DataKind::Gradient && !g.compute.iter().any(|c| c.inputs.contains(&d));
            if next != Some(true) && !unread_gradient {
                ops.push(Op::Free { tensor: Tensor::Data(d) });
            }
        }
    }
    Schedule::new(View::Graph, ops)
}

/// (f): on a chain of three layers, every way of recomputing forward nodes stage by stage
/// (stage `t` may rerun any forward node before `t`, then runs node `t`): 2¹⁵ schedules,
/// each scored by the simulator. Checkmate's makespan is the best one that fits, at every
/// budget where the best changes, and it is infeasible below the least.
#[test]
fn optimal_against_exhaustive_search_on_a_chain() {
    let g = chain_graph(3, true);
    let n = g.compute.len();
    let forward: Vec<usize> = (0..n).filter(|&k| g.compute[k].kind == ComputeKind::Forward).collect();
    // Bits per stage: the forward nodes before it.
    let choices: Vec<Vec<usize>> = (0..n).map(|t| forward.iter().copied().filter(|&i| i < t).collect()).collect();
    let bits: usize = choices.iter().map(Vec::len).sum();
    assert_eq!(bits, 15);
    let mut results: Vec<(u64, f64)> = Vec::new();
    for mask in 0u32..(1 << bits) {
        let mut seq = Vec::new();
        let mut b = 0;
        for (t, ch) in choices.iter().enumerate() {
            for &i in ch {
                if mask >> b & 1 == 1 {
                    seq.push(i);
                }
                b += 1;
            }
            seq.push(t);
        }
        if let Ok(r) = simulate(&g, &oracle_schedule(&g, &seq)) {
            results.push((r.peak_bytes, r.makespan));
        }
    }
    // The Pareto front: the best makespan at each budget where it changes.
    results.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)));
    let mut front: Vec<(u64, f64)> = Vec::new();
    for (peak, time) in results {
        if front.last().is_none_or(|&(_, t)| time < t - 1e-9) {
            front.push((peak, time));
        }
    }
    assert!(front.len() >= 3, "a dull instance: {front:?}");
    let opts = options();
    let problem = Problem::Graph(&g);
    for &(peak, time) in &front {
        let p = plan(checkmate(), problem, peak, &opts).unwrap_or_else(|e| panic!("at {peak}: {e}"));
        assert!(same(p.report.makespan, time), "at {peak}: checkmate {} vs exhaustive {time}", p.report.makespan);
    }
    let least = front[0].0;
    assert!(matches!(
        plan(checkmate(), problem, least - 1, &opts),
        Err(PlanError::Solve(SolveError::Infeasible { .. }))
    ));
}

/// The schedule builder frees exactly what the oracle's does on store-all's sequence,
/// which is `graph_store_all`'s schedule.
#[test]
fn schedule_of_the_plain_sequence_is_store_all() {
    for (name, g) in graphs() {
        let inst = Instance::new(&g).unwrap();
        let seq: Vec<usize> = (0..g.compute.len()).collect();
        let mine = inst.schedule(&seq);
        let a = simulate(&g, &mine).unwrap();
        let b = store_all(&g);
        assert_eq!((a.peak_bytes, a.makespan), (b.peak_bytes, b.makespan), "{name}");
    }
}

fn time_of(g: &TrainingGraph, seq: &[usize]) -> f64 {
    seq.iter().map(|&k| g.compute[k].time).sum()
}

/// On the U-Net at 60% of the store-all peak, HiGHS alone finds no plan in a second; from
/// the start (DTR's plan in stages, pruned), Checkmate returns one that fits, no slower
/// than the start, nor than DTR's own plan.
#[test]
fn the_start_gives_a_plan_where_the_ilp_alone_finds_none() {
    let g = pebble_testkit::captured::unet();
    let inst = Instance::new(&g).unwrap();
    let sa = store_all(&g);
    let budget = sa.peak_bytes * 6 / 10;
    let store_all_start = inst.start_of((0..inst.n).map(|t| vec![t]).collect());
    assert!(inst.start_peak(&store_all_start) > budget);
    match inst.solve_from(&store_all_start, budget, Some(1.0)) {
        Err(IlpError::NoSolution { .. }) => {}
        other => panic!("the ILP alone: {other:?}"),
    }
    let start = inst.warm_start(budget);
    let from = simulate(&g, &inst.schedule(&start.sequence())).unwrap();
    assert!(from.peak_bytes <= budget);
    // DTR's plan takes 2.28× store-all's time here; pruned, its stages 1.13×.
    assert!(from.makespan <= 1.2 * sa.makespan, "the start: {} against store-all's {}", from.makespan, sa.makespan);
    let dtr = simulate(&g, &pebble_solve::baseline::dtr::dtr_schedule(&g, budget).unwrap()).unwrap();
    let opts = SolveOptions { time_limit: Some(1.0), ..SolveOptions::default() };
    let p = plan(checkmate(), Problem::Graph(&g), budget, &opts).unwrap();
    assert!(p.report.peak_bytes <= budget, "peak {}", p.report.peak_bytes);
    assert!(
        p.report.makespan <= from.makespan * (1.0 + 1e-9),
        "{} against the start's {}",
        p.report.makespan,
        from.makespan
    );
    assert!(p.report.makespan < dtr.makespan, "{} against DTR's {}", p.report.makespan, dtr.makespan);
}

/// On a capture, the ILP counts what the simulator counts (parameter gradients from the
/// backward on): store-all's start and each budget's start count its simulated peak, fit
/// the budget, and HiGHS keeps them (stopped at once, it returns a plan no slower).
#[test]
fn starts_count_as_the_simulator_and_highs_keeps_them() {
    let g = pebble_testkit::captured::unet();
    let inst = Instance::new(&g).unwrap();
    let sa = store_all(&g);
    let store_all_start = inst.start_of((0..inst.n).map(|t| vec![t]).collect());
    assert_eq!(inst.start_peak(&store_all_start), sa.peak_bytes);
    for pct in [55, 70, 85, 99] {
        let budget = sa.peak_bytes * pct / 100;
        let start = inst.warm_start(budget);
        let seq = start.sequence();
        let r = simulate(&g, &inst.schedule(&seq)).unwrap();
        assert_eq!(inst.start_peak(&start), r.peak_bytes, "at {pct}%");
        // Pruning recounts `S` where a rerun changes it: as counted afresh.
        assert!(start.resident == inst.start_of(start.stages.clone()).resident, "at {pct}%");
        assert!(r.peak_bytes <= budget, "at {pct}%: {} over {budget}", r.peak_bytes);
        assert!(seq.len() > g.compute.len(), "at {pct}%: no recomputation");
        let (found, _) = inst.solve_from(&start, budget, Some(1e-6)).unwrap_or_else(|e| panic!("at {pct}%: {e}"));
        assert!(time_of(&g, &found) <= time_of(&g, &seq) * (1.0 + 1e-9), "at {pct}%");
    }
}

/// On GPT-2, recompute-all in stages and DTR both need 1,546,240 bytes, where no node
/// alone needs more than 1,356,800: one byte less, no start fits, and an ILP stopped at
/// once has no plan, and says why.
#[test]
fn without_a_start_a_hurried_ilp_says_it_keeps_no_incumbent() {
    let g = pebble_testkit::captured::hf_gpt2();
    let inst = Instance::new(&g).unwrap();
    let recompute_all = inst.start_of((0..inst.n).map(|t| inst.active(t)).collect());
    assert_eq!(inst.start_peak(&recompute_all), 1_546_240);
    let budget = 1_546_239;
    assert!(inst.start_peak(&inst.warm_start(budget)) > budget, "a start fits at {budget}");
    let options = SolveOptions { time_limit: Some(1e-6), ..SolveOptions::default() };
    let text = checkmate().solve(Problem::Graph(&g), budget, &options).unwrap_err().to_string();
    assert!(text.contains("hit its time limit") && text.contains("keeps no incumbent"), "{text}");
}

/// A compute sequence in stages: reruns sorted and deduplicated into the stage of the
/// next first run, useless ones dropped; out-of-order first runs, or a backward run
/// twice, are no stages.
#[test]
fn sequences_in_stages() {
    let g = chain_graph(3, true);
    let inst = Instance::new(&g).unwrap();
    // f1 f2 f3 loss b3 b2 b1 = 0..7; f3 (2) is useless after b3 (4).
    let stages = inst.staged(&[0, 1, 2, 3, 1, 0, 4, 2, 5, 0, 0, 6]).unwrap();
    assert_eq!(stages, vec![vec![0], vec![1], vec![2], vec![3], vec![0, 1, 4], vec![5], vec![0, 6]]);
    assert_eq!(inst.staged(&[1, 0, 2, 3, 4, 5, 6]), None);
    assert_eq!(inst.staged(&[0, 1, 2, 3, 4, 4, 5, 6]), None);
    assert_eq!(inst.staged(&[0, 1, 2, 3, 4, 5]), None);
    // What is resident before each stage: a1 into f2's stage, then from its rerun in
    // stage 4 into b2's; s1 (f1's saved, which b1 alone reads) never, as f1 runs again in
    // b1's stage.
    let start = inst.start_of(stages);
    let name = |d: usize| g.data[d].name.as_str();
    let kept = |d: usize| (0..=inst.n).filter(|&t| start.resident[d][t]).collect::<Vec<_>>();
    let s1 = (0..g.data.len()).find(|&d| name(d) == "s1").unwrap();
    let a1 = (0..g.data.len()).find(|&d| name(d) == "a1").unwrap();
    assert_eq!(kept(a1), vec![1, 5]);
    assert_eq!(kept(s1), Vec::<usize>::new());
}
