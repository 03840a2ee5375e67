//! Run-time policies inside the executor (issue 13): a step runs each op as the policy
//! decides it (`Session::step_driven`, fed by `policy::replay::replay_into`), with
//! evictions, recomputations, offloads and reloads on the transfer threads. The losses
//! and parameters equal store-all's bit for bit, step after step, and the ops the step
//! ran are the offline replay's, which the simulator times and checks.

use burn_flex::{Flex, FlexDevice};
use pebble_runtime::exec::Drive;
use pebble_runtime::{OptimizerKind, Session};
use pebble_solve::policy::replay::replay;
use pebble_solve::policy::{policy, NAMES};
use pebble_solve::{Problem, SolveOptions};
use pebble_train::{drive_policy, lower, transfer_options};
use pebble_zoo::ModelOptions;

const ADAM: OptimizerKind = OptimizerKind::AdamW { lr: 1e-2, weight_decay: 0.01 };

/// Runs every policy on `model` at budgets between half and all of its activation
/// memory; whether one offloaded.
fn check(model: &str, options: ModelOptions) -> bool {
    let lowered = lower::<Flex>(model, &options, None).expect("model");
    let graph = lowered.graph.clone();
    let machine = options.profile.machine;
    let solve = SolveOptions { machine, ..SolveOptions::default() };
    let store_all = pebble_solve::baseline::store_all::store_all_schedule(Problem::Graph(&graph));
    let top = pebble_solve::simulate(Problem::Graph(&graph), &store_all, &solve.sim_config()).expect("store-all");
    // Budgets above the least any schedule needs: burn-flex's temporaries can dwarf the
    // activations (the MLP's weight-gradient matmuls).
    let fixed = pebble_testkit::least_graph_memory(&graph);
    let session = || Session::<Flex>::new(lowered.network.clone(), lowered.index.clone(), ADAM, 3, FlexDevice);
    let mut reference = session();
    let want: Vec<f32> = (0..3).map(|_| reference.step(&store_all).expect("store-all").loss).collect();
    let want_params = reference.parameters().expect("parameters");
    let (mut ran, mut offloaded) = (0, false);
    for name in NAMES {
        let p = policy(name, machine.d2h.bandwidth).unwrap();
        for k in 5..=9 {
            let budget = fixed + (top.peak_bytes - fixed) * k / 10;
            let Ok(offline) = replay(&graph, budget, p.as_ref()) else { continue };
            let what = format!("{model} {name} at {k}/10");
            let mut s = session();
            s.set_transfers(transfer_options(&machine, None));
            let mut losses = Vec::new();
            for _ in 0..3 {
                let mut logged = None;
                {
                    let mut drive = drive_policy(&graph, budget, p.as_ref(), &mut logged);
                    let drive: &mut Drive<'_> = &mut drive;
                    losses.push(s.step_driven(drive).unwrap_or_else(|e| panic!("{what}: {e}")).loss);
                }
                let logged = logged.expect("the step logged its ops");
                assert_eq!(logged.schedule.ops, offline.schedule.ops, "{what}: online and offline decide differently");
                offloaded |= logged.counts.offloads > 0;
            }
            assert_eq!(losses, want, "{what}: the losses differ");
            assert!(s.parameters().expect("parameters") == want_params, "{what}: the parameters differ");
            // The simulator replays what ran, within the budget (the compute waiting for
            // offloads to release memory, as the executor's does).
            let config = pebble_sim::SimConfig { budget: Some(budget), ..solve.sim_config() };
            let sim = pebble_solve::simulate(Problem::Graph(&graph), &offline.schedule, &config)
                .unwrap_or_else(|e| panic!("{what}: the simulator refuses the log: {e}"));
            assert!(sim.peak_bytes <= budget, "{what}: simulated peak {} over {budget}", sim.peak_bytes);
            ran += 1;
        }
    }
    assert!(ran >= 3, "{model}: only {ran} policy runs fit");
    offloaded
}

#[test]
fn policies_decide_inside_the_step_and_train_as_store_all_does() {
    let mlp = check("mlp", ModelOptions { batch: Some(4), layers: Some(4), ..ModelOptions::default() });
    let gpt = check(
        "gpt",
        ModelOptions {
            batch: Some(2),
            seq: Some(16),
            layers: Some(2),
            width: Some(16),
            heads: Some(2),
            ..ModelOptions::default()
        },
    );
    let resnet = check(
        "resnet",
        ModelOptions { batch: Some(2), image: Some(32), layers: Some(1), width: Some(8), ..ModelOptions::default() },
    );
    assert!(mlp || gpt || resnet, "no policy offloaded");
}
