//! `plan_or_least`: a solver that finds nothing at the budget asked, but something below
//! it (its feasibility is not monotone, as time-limited MILPs can be), gives the plan
//! found below; one that fits nowhere below gives the least budget it fits.

use pebble_schedule::{Schedule, View};
use pebble_solve::baseline::store_all::store_all_schedule;
use pebble_solve::{plan_or_least, simulate, Fit, Problem, SolveError, SolveOptions, Solver};

/// Store-all's schedule wherever the budget lies in one of `ranges` (bytes, half-open),
/// "infeasible" elsewhere, except that in `hurried` (half-open) it stops at its time limit
/// without a plan (`TooLarge`), as a time-limited MILP at a tight budget does.
struct Patchy {
    ranges: Vec<(u64, u64)>,
    hurried: (u64, u64),
}

impl Solver for Patchy {
    fn name(&self) -> &'static str {
        "patchy"
    }
    fn description(&self) -> &'static str {
        "store-all on some budgets only"
    }
    fn views(&self) -> &'static [View] {
        &[View::Graph]
    }
    fn solve(&self, problem: Problem<'_>, budget: u64, _: &SolveOptions) -> Result<Schedule, SolveError> {
        if self.ranges.iter().any(|&(lo, hi)| (lo..hi).contains(&budget)) {
            Ok(store_all_schedule(problem))
        } else if (self.hurried.0..self.hurried.1).contains(&budget) {
            Err(SolveError::TooLarge { solver: "patchy", why: "its time limit".into() })
        } else {
            Err(SolveError::Infeasible { budget, reason: "not in its ranges".into() })
        }
    }
}

#[test]
fn a_plan_below_the_budget_is_returned_when_none_is_found_at_it() {
    let g = pebble_testkit::tiny_graph();
    let problem = Problem::Graph(&g);
    let options = SolveOptions::default();
    let peak = store_all_peak(problem, &options);
    // Fits from the peak to twice it and from four times it, not in between.
    let solver = Patchy { ranges: vec![(peak, 2 * peak), (4 * peak, u64::MAX)], hurried: (0, 0) };
    match plan_or_least(&solver, problem, 3 * peak, &options).expect("plans") {
        Fit::Plan { plan, at } => {
            assert_eq!(at, Some(peak));
            assert_eq!(plan.report.peak_bytes, peak);
        }
        Fit::Infeasible { min_budget } => panic!("infeasible, least {min_budget:?}"),
    }
    // At a budget where it fits, the plan is made there.
    assert!(matches!(plan_or_least(&solver, problem, peak + 1, &options), Ok(Fit::Plan { at: None, .. })));
    // Below every feasible budget: infeasible, with the least one.
    match plan_or_least(&solver, problem, peak - 1, &options).expect("answers") {
        Fit::Infeasible { min_budget } => assert_eq!(min_budget, Some(peak)),
        Fit::Plan { at, .. } => panic!("planned at {at:?}"),
    }
}

/// Below the least budget a time-limited solver plans, it may stop without a plan rather
/// than prove there is none (HiRemate's top H-ILP on GPT-2 between 1,356,800 bytes, which
/// no plan goes below, and 1,546,240). Such a probe counts as "does not fit" in the search
/// for the least budget: it used to end the search with "nor in any budget".
#[test]
fn the_least_budget_passes_over_budgets_where_the_solver_ran_out_of_time() {
    let g = pebble_testkit::tiny_graph();
    let problem = Problem::Graph(&g);
    let options = SolveOptions::default();
    let peak = store_all_peak(problem, &options);
    let solver = Patchy { ranges: vec![(peak, u64::MAX)], hurried: (peak / 2, peak) };
    match plan_or_least(&solver, problem, peak / 4, &options).expect("answers") {
        Fit::Infeasible { min_budget } => assert_eq!(min_budget, Some(peak)),
        Fit::Plan { at, .. } => panic!("planned at {at:?}"),
    }
}

/// Store-all's simulated peak: where `Patchy`'s ranges start.
fn store_all_peak(problem: Problem<'_>, options: &SolveOptions) -> u64 {
    simulate(problem, &store_all_schedule(problem), &options.sim_config()).expect("simulates").peak_bytes
}
