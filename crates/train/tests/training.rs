//! Training under a plan is training: 50 steps of a GPT under `rotor` at 50% of
//! store-all's peak give the same losses as store-all, step for step, and the loss falls.

use burn_flex::{Flex, FlexDevice};
use pebble_graph::units::BudgetSpec;
use pebble_solve::SolveOptions;
use pebble_train::train::train;
use pebble_train::{BudgetRequest as Budget, Costs, OptimizerKind, TrainConfig};
use pebble_zoo::ModelOptions;

fn config(solver: &str, budget: Budget) -> TrainConfig {
    let options = ModelOptions {
        batch: Some(2),
        seq: Some(256),
        layers: Some(6),
        width: Some(32),
        heads: Some(4),
        ..ModelOptions::default()
    };
    TrainConfig {
        model: "gpt".into(),
        solve: SolveOptions { machine: options.profile.machine, ..SolveOptions::default() },
        options,
        budget,
        solver: solver.into(),
        online: false,
        steps: 50,
        seed: 11,
        optimizer: OptimizerKind::AdamW { lr: 3e-3, weight_decay: 0.01 },
        costs: Costs::Analytic,
    }
}

#[test]
fn rotor_at_half_the_peak_trains_as_store_all_does() {
    let store_all =
        train::<Flex>(&config("store-all", Budget::Total(BudgetSpec::Percent(100.0))), FlexDevice).expect("store-all");
    let rotor = train::<Flex>(&config("rotor", Budget::Total(BudgetSpec::Percent(50.0))), FlexDevice).expect("rotor");
    assert!(rotor.predicted_peak_bytes <= store_all.store_all_predicted_peak_bytes / 2);
    assert_eq!(rotor.losses, store_all.losses, "same seed, same losses");
    let (first, last) = (store_all.losses[0], store_all.losses[49]);
    assert!(last < 0.8 * first, "the loss falls: {first} → {last}");
}

/// Costs timed in store-all steps (`--costs steps`) plan a schedule that trains as
/// store-all does, and the time spent profiling and timing is reported.
#[test]
fn a_plan_on_costs_timed_in_steps_trains_as_store_all_does() {
    let mut timed = config("rotor", Budget::Total(BudgetSpec::Percent(70.0)));
    timed.steps = 3;
    timed.costs = Costs::Steps;
    let timed = train::<Flex>(&timed, FlexDevice).expect("rotor on timed costs");
    let mut store_all = config("store-all", Budget::Total(BudgetSpec::Percent(100.0)));
    store_all.steps = 3;
    let store_all = train::<Flex>(&store_all, FlexDevice).expect("store-all");
    assert!(timed.recomputes > 0, "the plan recomputes at 70%");
    assert_eq!(timed.losses, store_all.losses, "same seed, same losses");
    assert!(timed.profile_seconds > 0.0);
}
