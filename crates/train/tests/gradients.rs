//! A plan changes nothing in the numbers: under every solver, the loss and every
//! parameter gradient of a step equal the store-all run's, bit for bit on the CPU
//! (the executor runs the same kernels in the same order; recomputation replays dropout).

use burn_flex::{Flex, FlexDevice};
use pebble_ilp as _;
use pebble_runtime::{read_floats, OptimizerKind, Session};
use pebble_schedule::{Schedule, View};
use pebble_solve::{Problem, SolveOptions};
use pebble_train::lower;
use pebble_zoo::ModelOptions;

const SOLVERS: [&str; 6] = ["sequential", "chen-sqrt", "revolve", "recompute-all", "rotor", "rotor-optimal"];

/// The ILP graph solvers (`pebble-ilp`); rk-Checkmate, the slowest, on the MLP only.
const ILP_SOLVERS: [&str; 2] = ["rockmate", "hiremate"];

fn opts(
    batch: usize,
    image: Option<usize>,
    seq: Option<usize>,
    layers: usize,
    width: Option<usize>,
    heads: Option<usize>,
) -> ModelOptions {
    ModelOptions { batch: Some(batch), image, seq, layers: Some(layers), width, heads, ..ModelOptions::default() }
}

fn grads_of(session: &mut Session<Flex>, schedule: &Schedule) -> (Vec<f32>, Vec<Vec<f32>>) {
    let out = session.gradients(schedule).unwrap_or_else(|e| panic!("{:?}: {e}", schedule.solver));
    let loss = read_floats::<Flex>(out.loss).expect("loss");
    let grads =
        out.grads.into_iter().map(|g| g.map(|g| read_floats::<Flex>(g).expect("grad")).unwrap_or_default()).collect();
    (loss, grads)
}

fn check(model: &str, options: ModelOptions, ilp: &[&str]) {
    let lowered = lower::<Flex>(model, &options, None).expect("model");
    let chain = lowered.chain.clone();
    let graph = lowered.graph.clone();
    let mut session =
        Session::<Flex>::new(lowered.network, lowered.index, OptimizerKind::Sgd { lr: 0.1 }, 7, FlexDevice);
    let reference =
        grads_of(&mut session, &pebble_solve::baseline::store_all::store_all_schedule(Problem::Chain(&chain)));
    assert!(reference.0[0].is_finite(), "{model}: loss {}", reference.0[0]);
    assert!(reference.1.iter().any(|g| g.iter().any(|&x| x != 0.0)), "{model}: all gradients are zero");
    let graph_store_all = pebble_solve::baseline::store_all::store_all_schedule(Problem::Graph(&graph));
    assert_eq!(graph_store_all.view, View::Graph);
    assert!(
        grads_of(&mut session, &graph_store_all) == reference,
        "{model}: graph store-all differs from chain store-all"
    );
    let options = SolveOptions::default();
    let sim = options.sim_config();
    // Graph schedules with recomputation (DTR's evictions) and offloads (DELTA's): the
    // same numbers.
    let graph_peak =
        pebble_solve::simulate(Problem::Graph(&graph), &graph_store_all, &sim).expect("store-all").peak_bytes;
    // Budgets above the least any schedule needs: burn-flex's temporaries can dwarf the
    // activations (the MLP's weight-gradient matmuls).
    let fixed = pebble_testkit::least_graph_memory(&graph);
    let mut recomputed = false;
    let mut offloaded = false;
    for name in ["dtr", "delta", "lru", "largest"] {
        let policy = pebble_solve::solver(name).expect("registered");
        let mut checked = 0;
        for k in 1..10 {
            let budget = fixed + (graph_peak - fixed) * k / 10;
            let Ok(plan) = pebble_solve::plan(policy, Problem::Graph(&graph), budget, &options) else { continue };
            checked += 1;
            let ops = &plan.schedule.ops;
            recomputed |=
                ops.iter().filter(|op| matches!(op, pebble_schedule::Op::Compute { .. })).count() > graph.compute.len();
            offloaded |= ops.iter().any(|op| matches!(op, pebble_schedule::Op::Offload { .. }));
            assert!(
                grads_of(&mut session, &plan.schedule) == reference,
                "{model} {name} at {budget}: gradients differ"
            );
        }
        // Each policy plans at 90% at least, and below it on these models.
        assert!(checked >= 2, "{model} {name}: a plan at {checked} of the nine budgets");
    }
    assert!(offloaded, "{model}: no budget made DELTA offload");
    assert!(recomputed, "{model}: no budget made DTR recompute");
    // The ILP solvers' schedules (recomputation, forwards without grad that a later
    // grad-mode forward of the same node redoes): the tightest of 60%, 70%, 80% of the
    // activation memory that the solver meets, and 90%; one preparation for the four.
    let mut no_grad = false;
    for &name in ilp {
        let solver = pebble_solve::solver(name).expect("registered");
        let tenths = [6u64, 7, 8, 9];
        let budgets: Vec<u64> = tenths.iter().map(|k| fixed + (graph_peak - fixed) * k / 10).collect();
        let mut plans = pebble_solve::plan_many(solver, Problem::Graph(&graph), &budgets, &options)
            .unwrap_or_else(|e| panic!("{model} {name}: {e}"));
        let loose = plans.pop().expect("four budgets").unwrap_or_else(|e| panic!("{model} {name} at 90%: {e}"));
        let tight = plans
            .into_iter()
            .zip(tenths)
            .find_map(|(plan, k)| plan.map_err(|e| println!("{model} {name} at {k}0%: {e}")).ok().map(|p| (k, p)));
        let tight = tight.unwrap_or_else(|| panic!("{model} {name}: infeasible at 80% of the activation memory"));
        for (k, plan) in [tight, (9, loose)] {
            let computes = plan.schedule.ops.iter().filter(|op| matches!(op, pebble_schedule::Op::Compute { .. }));
            println!("{model} {name} at {k}0%: {} computes ({} nodes)", computes.count(), graph.compute.len());
            no_grad |=
                plan.schedule.ops.iter().any(|op| matches!(op, pebble_schedule::Op::Compute { no_grad: true, .. }));
            assert!(grads_of(&mut session, &plan.schedule) == reference, "{model} {name} at {k}0%: gradients differ");
        }
    }
    assert!(ilp.is_empty() || no_grad, "{model}: no ILP schedule runs a forward without grad");
    for name in SOLVERS {
        let solver = pebble_solve::solver(name).expect("registered");
        let problem = Problem::Chain(&chain);
        let min = pebble_solve::min_feasible_budget(solver, problem, &options).unwrap().expect("some budget fits");
        let top =
            pebble_solve::simulate(problem, &pebble_solve::baseline::store_all::store_all_schedule(problem), &sim)
                .expect("store-all")
                .peak_bytes;
        // Tight budgets force recomputation.
        for budget in [min, min + (top.saturating_sub(min)) / 3] {
            let plan = pebble_solve::plan(solver, problem, budget, &options).expect("plan");
            let got = grads_of(&mut session, &plan.schedule);
            assert_eq!(got.0, reference.0, "{model} {name} at {budget}: loss");
            for (p, (a, b)) in got.1.iter().zip(&reference.1).enumerate() {
                assert!(a == b, "{model} {name} at {budget}: gradient of parameter {p} differs");
            }
        }
    }
}

#[test]
fn mlp_gradients_do_not_depend_on_the_plan() {
    let ilp = [ILP_SOLVERS[0], ILP_SOLVERS[1], "rk-checkmate"];
    // The kernels' temporaries: burn-flex's (a 4 MB weight gradient's copy) dwarf this
    // MLP's activations, and no budget would make a policy evict. What runs is the same.
    let kernels = Some(pebble_zoo::Temporaries::Kernels);
    check(
        "mlp",
        ModelOptions { batch: Some(4), layers: Some(4), temporaries: kernels, ..ModelOptions::default() },
        &ilp,
    );
}

#[test]
fn resnet_gradients_do_not_depend_on_the_plan() {
    // The kernels' temporaries: on burn-flex the stem convolution's unfolded input is this
    // small ResNet's peak, and no budget would make DTR recompute. What runs is the same.
    let options = ModelOptions {
        temporaries: Some(pebble_zoo::Temporaries::Kernels),
        ..opts(2, Some(32), None, 1, Some(8), None)
    };
    check("resnet", options, &ILP_SOLVERS);
}

#[test]
fn gpt_gradients_do_not_depend_on_the_plan() {
    check("gpt", opts(2, None, Some(16), 3, Some(32), Some(4)), &ILP_SOLVERS);
}
