//! `auto` against the solvers it runs, each run alone: on a zoo model's chain and graph
//! at budgets from store-all's peak to below every solver's, its plan is the fastest of
//! theirs (the same simulated time as their minimum), each candidate's time is what that
//! solver gives alone, and it is infeasible exactly where all of them are. The MILP
//! solvers of this crate take part: `auto` finds them in the registry.

use std::collections::BTreeMap;

// Linked for its registrations (the ILP solvers), as the CLI links it.
use pebble_ilp as _;
use pebble_schedule::View;
use pebble_solve::auto::{self, solvers_for};
use pebble_solve::baseline::store_all::simulate_store_all;
use pebble_solve::{min_feasible_budget, plan, PlanError, Problem, SolveError, SolveOptions};
use pebble_zoo::ModelOptions;

fn mlp() -> pebble_zoo::Model {
    let options = ModelOptions { layers: Some(4), width: Some(64), batch: Some(8), ..ModelOptions::default() };
    pebble_zoo::build("mlp", &options).expect("mlp builds")
}

fn options() -> SolveOptions {
    // Ample for every MILP here (they solve to optimality in well under a second), so a
    // solver run alone and inside `auto` solve the same problem.
    SolveOptions { time_limit: Some(120.0), ..SolveOptions::default() }
}

/// Each solver's simulated time alone at `budget` (`None`: no plan), by name.
fn alone(problem: Problem<'_>, budget: u64, opts: &SolveOptions) -> BTreeMap<&'static str, Option<f64>> {
    solvers_for(problem.view(), None)
        .expect("registered")
        .into_iter()
        .map(|s| {
            let time = match plan(s, problem, budget, opts) {
                Ok(p) => Some(p.report.makespan),
                Err(PlanError::Solve(_)) => None,
                Err(e) => panic!("{} at {budget}: {e}", s.name()),
            };
            (s.name(), time)
        })
        .collect()
}

fn same(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs())
}

#[test]
fn auto_is_the_fastest_of_the_solvers_it_runs() {
    let model = mlp();
    let opts = options();
    let mut planned = 0;
    let mut infeasible = 0;
    for problem in [Problem::Chain(&model.chain), Problem::Graph(&model.graph)] {
        let view = problem.view();
        let names: Vec<&str> = solvers_for(view, None).unwrap().iter().map(|s| s.name()).collect();
        // The MILPs of this crate are found through the registry.
        let milp = if view == View::Graph { "checkmate" } else { "offmate" };
        assert!(names.contains(&milp), "{view:?}: {names:?}");
        assert!(!names.contains(&"auto"));
        let peak = simulate_store_all(problem, &opts.sim_config()).unwrap().peak_bytes;
        let fixed = match problem {
            Problem::Chain(c) => c.static_bytes,
            Problem::Graph(g) => g.fixed_bytes(),
        };
        for share in [1.0, 0.7, 0.4, 0.0] {
            let budget = fixed + ((peak - fixed) as f64 * share) as u64;
            let at = format!("{view:?} at {budget} ({share} of the activations)");
            let times = alone(problem, budget, &opts);
            let best = times.values().flatten().copied().fold(f64::INFINITY, f64::min);
            let out = auto::run(problem, budget, &opts);
            eprintln!(
                "{at}: {:?} of {} solvers, {} with a plan",
                out.winner,
                names.len(),
                times.values().flatten().count()
            );
            // Every applicable solver is a candidate; none was skipped for time, and where
            // store-all fits (it runs first), nothing after it runs: nothing beats it.
            let ran: Vec<&str> = out.candidates.iter().map(|c| c.solver).collect();
            assert_eq!(ran.len(), names.len(), "{at}: {ran:?}");
            assert_eq!(ran[0], "store-all");
            let unbeaten = times["store-all"].is_some();
            for c in &out.candidates[1..] {
                let skipped = c.error.as_deref() == Some(auto::UNBEATEN);
                assert_eq!(skipped, unbeaten, "{at}: {c:?}");
            }
            for c in out.candidates.iter().filter(|c| c.error.as_deref() != Some(auto::UNBEATEN)) {
                assert!(!c.error.as_deref().unwrap_or("").starts_with("not run"), "{at}: {c:?}");
                match (c.time, times[c.solver]) {
                    (Some(t), Some(u)) => assert!(same(t, u), "{at}: {} {t} in auto, {u} alone", c.solver),
                    (None, None) => assert!(c.error.is_some(), "{at}: {c:?}"),
                    (t, u) => panic!("{at}: {} gives {t:?} in auto, {u:?} alone", c.solver),
                }
            }
            match &out.best {
                Some(p) => {
                    planned += 1;
                    assert!(same(p.report.makespan, best), "{at}: auto {} against the best {best}", p.report.makespan);
                    assert!(p.report.peak_bytes <= budget, "{at}");
                    let winner = out.winner.expect("a winner with a plan");
                    assert_eq!(p.schedule.kept_from.as_deref(), Some(winner), "{at}");
                    assert!(same(times[winner].expect("the winner plans alone"), best), "{at}");
                    if share == 1.0 {
                        // Nothing beats store-all, which runs first: it wins the ties.
                        assert_eq!(winner, "store-all", "{at}");
                    }
                    // The first of equals: no solver run before the winner is as fast.
                    let before = ran.iter().take_while(|n| **n != winner);
                    for n in before {
                        assert!(times[n].is_none_or(|t| t > best && !same(t, best)), "{at}: {n} ties {winner}");
                    }
                    // Through the registry, as `pebble plan --solver auto`.
                    let registered = pebble_solve::solver("auto").unwrap();
                    let p2 = plan(registered, problem, budget, &opts).expect("auto plans");
                    assert!(same(p2.report.makespan, best), "{at}: registry's auto {}", p2.report.makespan);
                    assert_eq!(p2.schedule.solver.as_deref(), Some("auto"));
                    assert_eq!(p2.schedule.kept_from.as_deref(), Some(winner));
                }
                None => {
                    infeasible += 1;
                    assert!(best.is_infinite(), "{at}: auto found nothing, alone the best is {best}");
                    assert!(out.winner.is_none());
                    let registered = pebble_solve::solver("auto").unwrap();
                    let e = plan(registered, problem, budget, &opts).unwrap_err();
                    assert!(matches!(e, PlanError::Solve(SolveError::Infeasible { .. })), "{at}: {e}");
                }
            }
        }
    }
    // Both outcomes were seen: the grid reaches below every solver.
    assert!(planned >= 6 && infeasible >= 1, "{planned} planned, {infeasible} infeasible");
}

/// `auto`'s least feasible budget is at most the least of its first tier's (they always
/// run), and `auto` plans there.
#[test]
fn auto_fits_wherever_a_fast_solver_fits() {
    let model = mlp();
    let opts = SolveOptions { time_limit: Some(5.0), ..SolveOptions::default() };
    let problem = Problem::Chain(&model.chain);
    let registered = pebble_solve::solver("auto").unwrap();
    let least = min_feasible_budget(registered, problem, &opts).unwrap().expect("auto fits somewhere");
    let fast = solvers_for(View::Chain, Some(&["rotor", "chen-sqrt", "recompute-all"])).unwrap();
    let least_fast =
        fast.iter().filter_map(|s| min_feasible_budget(*s, problem, &opts).unwrap()).min().expect("rotor fits");
    assert!(least <= least_fast, "auto {least}, the fast solvers {least_fast}");
    let p = plan(registered, problem, least, &opts).expect("auto plans at its least budget");
    assert!(p.report.peak_bytes <= least);
}
