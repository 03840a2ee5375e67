//! The conformance suite: every registered solver (the DPs and baselines of
//! `pebble-solve` and the ILPs of this crate, which links them all), on shared fixtures,
//! for each view it declares, at several budgets: store-all's peak, the solver's least
//! feasible budget, and a point between. Every schedule a solver returns must pass the
//! simulator under the budget, peak at most at the budget, and take no less time than
//! store-all (which no schedule beats). `NotApplicable` and `TooLarge` are allowed, but
//! each solver must be exercised on at least one fixture, so a newly registered solver is
//! covered with no other step; on a view it does not declare, it must answer
//! `NotApplicable`.

use std::collections::BTreeMap;
use std::time::Instant;

use pebble_graph::{Chain, ComputeKind, TrainingGraph};
// Linked for its registrations (the ILP solvers), as the CLI links it.
use pebble_ilp as _;
use pebble_schedule::{Schedule, View};
use pebble_sim::{SimConfig, SimReport};
use pebble_solve::baseline::store_all::store_all_schedule;
use pebble_solve::{min_feasible_budget, registry, simulate, Problem, SolveError, SolveOptions, Solver};
use pebble_testkit::{
    chain_graph, gpt, hand_chain, random_chain, residual_graph, siamese, tiny_graph, weighty_chain, ChainSpec,
    GraphSpec, Rng,
};

/// Relative slack on "no faster than store-all" (floating-point sums in another order).
const REL: f64 = 1e-9;

/// Solvers that solve MILPs (`auto` runs them): only on the graphs marked `small` (HiGHS on a one-layer GPT
/// takes seconds per budget, and `min_feasible_budget` bisects over dozens).
const MILP: [&str; 5] = ["auto", "checkmate", "hiremate", "rk-checkmate", "rockmate"];

struct Fixture {
    name: &'static str,
    problem: Owned,
    /// Small enough for the MILP solvers.
    small: bool,
}

enum Owned {
    Chain(Chain),
    Graph(TrainingGraph),
}

impl Fixture {
    fn problem(&self) -> Problem<'_> {
        match &self.problem {
            Owned::Chain(c) => Problem::Chain(c),
            Owned::Graph(g) => Problem::Graph(g),
        }
    }
}

fn fixtures() -> Vec<Fixture> {
    let chain = |name, c, small| Fixture { name, problem: Owned::Chain(c), small };
    let graph = |name, g, small| Fixture { name, problem: Owned::Graph(g), small };
    let mut rng = Rng::new(0xc0f0_4a11);
    let mut homogeneous = pebble_graph::Chain::homogeneous(6, 1.0, 2.0, 4);
    homogeneous.static_bytes = 5;
    let gpt1 = gpt(1, 16, 8);
    let layered = GraphSpec::random(&mut Rng::new(6), 6).build();
    assert!(layered.producers().iter().any(|p| p.len() > 1), "the layered graph has a skip connection");
    vec![
        // Chains: heterogeneous by hand, homogeneous, random with distinct sizes, with
        // zero sizes and zero times, and a zoo model's blocks (sizes in bytes).
        chain("hand", hand_chain(), true),
        chain("homogeneous-6", homogeneous, true),
        chain("random-7", random_chain(&mut rng, 7), true),
        chain("sparse-5", ChainSpec::SPARSE.chain(&mut rng, 5), true),
        chain("gpt-1 (chain)", gpt1.chain, true),
        // Weights that dominate the activations: the weight-offloading solvers move them.
        chain("weighty-5", weighty_chain(&mut rng, 5), true),
        // Graphs: sequential, residual (a gradient with two producers), a chain of layers,
        // a Siamese K-join (multichain's shape), a layered graph with skips, and a
        // one-layer GPT (attention and residuals: not sequential).
        graph("tiny", tiny_graph(), true),
        graph("residual", linked(residual_graph()), true),
        graph("chain-graph-4", linked(chain_graph(4, false)), true),
        graph("siamese-3", siamese(3), true),
        graph("layered-6", layered, true),
        graph("gpt-1", gpt1.graph, false),
    ]
}

/// `g` with each backward node naming its forward node (`x.bwd` differentiates `x`, `b3`
/// differentiates `f3`), as the zoo's graphs do.
fn linked(mut g: TrainingGraph) -> TrainingGraph {
    for k in 0..g.compute.len() {
        if g.compute[k].kind != ComputeKind::Backward {
            continue;
        }
        let name = &g.compute[k].name;
        let target = match name.strip_suffix(".bwd") {
            Some(f) => f.to_string(),
            None => name.replacen('b', "f", 1),
        };
        let f = g.compute.iter().position(|c| c.kind == ComputeKind::Forward && c.name == target);
        g.compute[k].forward = Some(f.unwrap_or_else(|| panic!("no forward node `{target}` for `{name}`")));
    }
    g.validate().expect("still valid");
    g
}

/// The conformance check of one schedule: it passes the simulator on `problem` under
/// `budget`, peaks at most at `budget`, and takes at least `floor` (store-all's makespan)
/// within [`REL`].
fn check(problem: Problem<'_>, schedule: &Schedule, budget: u64, floor: f64) -> Result<SimReport, String> {
    if schedule.view != problem.view() {
        return Err(format!("a {:?} schedule for a {:?} problem", schedule.view, problem.view()));
    }
    let config = SimConfig { budget: Some(budget), ..SimConfig::default() };
    let r = simulate(problem, schedule, &config).map_err(|e| format!("the simulator rejects it: {e}"))?;
    if r.peak_bytes > budget {
        return Err(format!("peak {} above the budget {budget}", r.peak_bytes));
    }
    if r.makespan < floor * (1.0 - REL) {
        return Err(format!("makespan {} below store-all's {floor}", r.makespan));
    }
    Ok(r)
}

/// Runs `solver` on `fx` at its budgets: whether some budget gave a schedule (each one
/// checked), or what failed.
fn conform(solver: &dyn Solver, fx: &Fixture, options: &SolveOptions) -> Result<bool, String> {
    let name = solver.name();
    let problem = fx.problem();
    let at = |what: &str| format!("{name} on {} ({what})", fx.name);
    let store_all = store_all_schedule(problem);
    let sa = simulate(problem, &store_all, &SimConfig::default()).expect("store-all is valid");
    let low = min_feasible_budget(solver, problem, options).map_err(|e| format!("{}: {e}", at("least budget")))?;
    let mut budgets = vec![("store-all peak", sa.peak_bytes)];
    if let Some(low) = low {
        budgets.push(("least feasible", low));
        if low < sa.peak_bytes {
            budgets.push(("between", low + (sa.peak_bytes - low) / 2));
        }
    }
    let prepared = match solver.prepare(problem, options) {
        Ok(p) => p,
        Err(SolveError::NotApplicable { .. } | SolveError::TooLarge { .. } | SolveError::Unsupported { .. }) => {
            return Ok(false)
        }
        Err(e) => return Err(format!("{}: {e}", at("prepare"))),
    };
    let mut exercised = false;
    for (what, budget) in budgets {
        match prepared.solve(budget) {
            Ok(s) => {
                check(problem, &s, budget, sa.makespan).map_err(|e| format!("{} at {budget}: {e}", at(what)))?;
                exercised = true;
            }
            Err(SolveError::NotApplicable { .. } | SolveError::TooLarge { .. } | SolveError::Unsupported { .. }) => {}
            // The least feasible budget is one at which the solver was seen to succeed.
            Err(e @ SolveError::Infeasible { .. }) if Some(budget) == low => {
                return Err(format!("{} at {budget}: {e}", at(what)))
            }
            Err(SolveError::Infeasible { .. }) => {}
            Err(e) => return Err(format!("{} at {budget}: {e}", at(what))),
        }
    }
    Ok(exercised)
}

/// Every solver on every fixture of a view it declares (the MILP solvers on the small
/// ones): the fixtures each was exercised on, and every failure.
fn run_suite(fixtures: &[Fixture]) -> (BTreeMap<&'static str, Vec<&'static str>>, Vec<String>) {
    let options = SolveOptions { time_limit: Some(10.0), ..SolveOptions::default() };
    let mut coverage: BTreeMap<&'static str, Vec<&'static str>> = BTreeMap::new();
    let mut failures = Vec::new();
    let all = registry();
    // Both crates' registrations are linked in.
    for name in MILP.iter().chain(&["store-all", "rotor", "multichain"]) {
        assert!(all.iter().any(|s| s.name() == *name), "{name} is not registered");
    }
    for solver in all {
        let name = solver.name();
        assert!(!solver.views().is_empty(), "{name} declares no view");
        coverage.insert(name, Vec::new());
        for fx in fixtures {
            let problem = fx.problem();
            if !solver.views().contains(&problem.view()) {
                // A view it does not declare: NotApplicable, at any budget.
                let e = solver.solve(problem, u64::MAX >> 1, &options).err();
                if !matches!(e, Some(SolveError::NotApplicable { .. })) {
                    failures.push(format!(
                        "{name} does not declare the {:?} view but answers {e:?} on {}",
                        problem.view(),
                        fx.name
                    ));
                }
                continue;
            }
            if MILP.contains(&name) && !fx.small {
                continue;
            }
            let start = Instant::now();
            match conform(solver, fx, &options) {
                Ok(true) => coverage.get_mut(name).expect("inserted").push(fx.name),
                Ok(false) => {}
                Err(e) => failures.push(e),
            }
            eprintln!("{name} on {}: {:.2} s", fx.name, start.elapsed().as_secs_f64());
        }
    }
    (coverage, failures)
}

#[test]
fn every_registered_solver_conforms_on_every_fixture() {
    let (coverage, failures) = run_suite(&fixtures());
    for (name, on) in &coverage {
        eprintln!("{name}: {}", on.join(", "));
    }
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
    let idle: Vec<&str> = coverage.iter().filter(|(_, on)| on.is_empty()).map(|(&n, _)| n).collect();
    assert!(idle.is_empty(), "solvers exercised on no fixture: {idle:?}");
}

/// Backward nodes that name no forward node pass `TrainingGraph::validate`, and
/// `checkmate`, `dtr` and `knapsack` plan them. `rockmate` and `hiremate`, which pair each
/// backward with its forward, used to drop them and return incomplete schedules; they now
/// refuse such a graph (`Unsupported`, naming the node), and every answer passes.
#[test]
fn backward_nodes_that_name_no_forward_node() {
    let graph = |name, g| Fixture { name, problem: Owned::Graph(g), small: true };
    let (_, failures) =
        run_suite(&[graph("residual", residual_graph()), graph("chain-graph-4", chain_graph(4, false))]);
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
    let g = residual_graph();
    for name in ["rockmate", "hiremate"] {
        let solver = pebble_solve::solver(name).expect("registered");
        match pebble_solve::plan(solver, Problem::Graph(&g), u64::MAX >> 1, &SolveOptions::default()) {
            Err(pebble_solve::PlanError::Solve(SolveError::Unsupported { why, .. })) => {
                assert!(why.contains("names no forward node"), "{name}: {why}")
            }
            other => panic!("{name}: expected Unsupported, got {:?}", other.map(|p| p.report)),
        }
    }
}

/// The check above can fail: an incomplete schedule, a budget below the peak, a schedule
/// of the other view and a floor above the makespan are all caught.
#[test]
fn the_check_catches_broken_schedules() {
    let chain = hand_chain();
    let problem = Problem::Chain(&chain);
    let good = store_all_schedule(problem);
    let r = check(problem, &good, u64::MAX >> 1, 0.0).expect("store-all passes");
    assert!(check(problem, &good, r.peak_bytes, r.makespan).is_ok());
    // One byte short.
    let e = check(problem, &good, r.peak_bytes - 1, 0.0).unwrap_err();
    assert!(e.contains("rejects"), "{e}");
    // A backward dropped.
    let mut broken = good.clone();
    broken.ops.remove(broken.ops.len() - 2);
    assert!(check(problem, &broken, u64::MAX >> 1, 0.0).is_err());
    // Faster than store-all is impossible: a floor above the makespan fails.
    let e = check(problem, &good, u64::MAX >> 1, r.makespan * 1.01).unwrap_err();
    assert!(e.contains("below store-all"), "{e}");
    // The other view.
    let g = tiny_graph();
    assert!(check(Problem::Graph(&g), &good, u64::MAX >> 1, 0.0).is_err());
    assert_eq!(good.view, View::Chain);
}

/// Bad input never panics: a graph that names a tensor it does not have (an input id out
/// of range) is refused by every registered solver that plans graphs, with an error.
#[test]
fn every_graph_solver_refuses_an_invalid_graph_without_panicking() {
    let mut g = gpt(1, 16, 8).graph;
    g.compute[0].inputs.push(usize::MAX / 2);
    let (mut answered, mut failures) = (0, Vec::new());
    for solver in registry().into_iter().filter(|s| s.views().contains(&View::Graph)) {
        let name = solver.name();
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            solver.solve(Problem::Graph(&g), u64::MAX >> 1, &SolveOptions::default()).map(|_| ())
        }));
        match result {
            Ok(Err(_)) => answered += 1,
            Ok(Ok(())) => failures.push(format!("{name} planned it")),
            Err(_) => failures.push(format!("{name} panicked")),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("; "));
    assert!(answered >= 8, "only {answered} graph solvers");
}
