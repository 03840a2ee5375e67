//! Rockmate's and HiRemate's [`Solver::prepare`]: one preparation serves every budget and
//! gives the schedules independent solves give (nothing is kept between calls), and the
//! progress callback reaches its total once per preparation.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use pebble_graph::TrainingGraph;
use pebble_solve::{plan, plan_many, PlanError, Problem, Progress, SolveError, SolveOptions, Solver};
use pebble_zoo::ModelOptions;

use crate::{hiremate, rockmate, Hiremate, Rockmate};

/// Two layers: HiRemate's top cluster, cut at Rockmate's blocks, has five sub-clusters
/// (H-Partition alone, its second partition, makes one flat cluster of it). Three layers
/// take four times as long (6 s a preparation, where this test makes five).
fn gpt() -> TrainingGraph {
    let o = ModelOptions {
        layers: Some(2),
        width: Some(64),
        heads: Some(2),
        seq: Some(32),
        batch: Some(1),
        ..Default::default()
    };
    pebble_zoo::build("gpt", &o).unwrap().graph
}

/// Counts the reports, and those that say a preparation is done, of one `what`. HiRemate
/// also reports Rockmate's blocks, its incumbent's preparation, under Rockmate's label;
/// no other label may appear.
#[derive(Default)]
struct Counter {
    calls: AtomicUsize,
    finished: AtomicUsize,
    last: Mutex<Option<(usize, usize)>>,
}

fn counting(what: &'static str) -> (SolveOptions, Arc<Counter>) {
    let counter = Arc::new(Counter::default());
    let c = counter.clone();
    let progress = Progress::new(move |w, done, total| {
        if w != what {
            assert_eq!(w, rockmate::PROGRESS, "reported beside {what}");
            return;
        }
        assert!(done <= total, "{done} of {total}");
        c.calls.fetch_add(1, Ordering::SeqCst);
        if done == total {
            c.finished.fetch_add(1, Ordering::SeqCst);
        }
        *c.last.lock().unwrap() = Some((done, total));
    });
    (SolveOptions { progress, ..SolveOptions::default() }, counter)
}

/// Three budgets from store-all's peak down, the last too small for anything.
fn budgets(g: &TrainingGraph) -> Vec<u64> {
    let peak = pebble_solve::plan(
        pebble_solve::solver("store-all").unwrap(),
        Problem::Graph(g),
        u64::MAX,
        &SolveOptions::default(),
    )
    .unwrap()
    .report
    .peak_bytes;
    let fixed = g.fixed_bytes();
    vec![peak, fixed + (peak - fixed) * 9 / 10, fixed]
}

fn prepared_once_and_pure(solver: &dyn Solver, what: &'static str) {
    let g = gpt();
    let problem = Problem::Graph(&g);
    let budgets = budgets(&g);
    let (options, many) = counting(what);
    let together = plan_many(solver, problem, &budgets, &options).unwrap();
    // One preparation for the three budgets, and its last report is its total.
    assert_eq!(many.finished.load(Ordering::SeqCst), 1, "{what}");
    let (done, total) = many.last.lock().unwrap().expect("reported");
    assert_eq!(done, total);
    assert!(total > 0 && many.calls.load(Ordering::SeqCst) == total + 1, "{what}: 0, 1, …, {total}");
    let (options, apart) = counting(what);
    let mut feasible = 0;
    for (&b, together) in budgets.iter().zip(&together) {
        let alone = plan(solver, problem, b, &options);
        match (together, &alone) {
            (Ok(t), Ok(a)) => {
                assert_eq!(t.schedule, a.schedule, "{what} at {b}");
                assert!(t.report.peak_bytes <= b);
                feasible += 1;
            }
            (Err(t), Err(a)) => {
                assert_eq!(t, a, "{what} at {b}");
                assert!(matches!(t, PlanError::Solve(SolveError::Infeasible { budget, .. }) if *budget == b), "{t}");
            }
            (t, a) => panic!("{what} at {b}: {t:?} together, {a:?} alone"),
        }
    }
    // `solve` is `prepare`, then one budget.
    let b = budgets[1];
    let solved = solver.solve(problem, b, &SolveOptions::default()).map(|s| s.with_solver(solver.name()));
    assert_eq!(solved.ok(), together[1].as_ref().ok().map(|p| p.schedule.clone()), "{what} at {b}");
    assert_eq!(feasible, 2, "{what}");
    assert_eq!(apart.finished.load(Ordering::SeqCst), budgets.len(), "{what}: one preparation per plan");
}

#[test]
fn rockmate_prepares_once_and_gives_what_plan_gives() {
    prepared_once_and_pure(&Rockmate, rockmate::PROGRESS);
}

#[test]
fn hiremate_prepares_once_and_gives_what_plan_gives() {
    prepared_once_and_pure(&Hiremate::DEFAULT, hiremate::PROGRESS);
}

/// A graph the preparation refuses fails each budget as `solve` always did (infeasible,
/// with the reason), and a chain is not for them at all.
#[test]
fn a_failed_preparation_fails_each_budget() {
    let mut g = gpt();
    g.compute[0].inputs.push(usize::MAX / 2);
    for solver in [&Rockmate as &dyn Solver, &Hiremate::DEFAULT] {
        let results = plan_many(solver, Problem::Graph(&g), &[1 << 30, 1 << 40], &SolveOptions::default()).unwrap();
        for (r, b) in results.into_iter().zip([1u64 << 30, 1 << 40]) {
            match r {
                Err(PlanError::Solve(SolveError::Infeasible { budget, reason })) => {
                    assert_eq!(budget, b);
                    assert!(reason.contains("invalid training graph"), "{reason}");
                }
                other => panic!("{}: {other:?}", solver.name()),
            }
        }
        let chain = pebble_zoo::build("mlp", &ModelOptions { layers: Some(2), ..Default::default() }).unwrap().chain;
        assert!(matches!(
            solver.prepare(Problem::Chain(&chain), &SolveOptions::default()).err(),
            Some(SolveError::NotApplicable { .. })
        ));
    }
}
