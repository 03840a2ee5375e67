//! The executor runs offloads and prefetches (issue 11, item 5): store-all with some
//! saved sets moved to the host after their forward and brought back before their
//! backward changes no number, holds less device memory by what it moved, keeps the
//! host copies apart, and times its transfers on the throttled links.
//!
//! The allocation counters are global to the process: the tests of this binary take
//! turns (`LOCK`).

use std::sync::Mutex;

use burn_flex::{Flex, FlexDevice};
use pebble_graph::units::BudgetSpec;
use pebble_runtime::memory::{self, CountingAlloc};
use pebble_runtime::{read_floats, LinkSpeed, OptimizerKind, RuntimeError, Session, StageTemporaries, TransferOptions};
use pebble_schedule::{ForwardMode, Op, Schedule, Tensor, View};
use pebble_solve::{Problem, SolveOptions};
use pebble_train::train::train;
use pebble_train::{lower, BudgetRequest, Costs, TrainConfig};
use pebble_zoo::ModelOptions;

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

static LOCK: Mutex<()> = Mutex::new(());

fn lock() -> std::sync::MutexGuard<'static, ()> {
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// Store-all (`F0all … F{L-1}all L B{L-1} … B0`), with `Saved(i)` for each `i` in `saved`
/// offloaded right after the forward that makes it and prefetched `lead` compute ops
/// before `B_i`, the first backward that reads it (as `a_i`); `lead = 0` is right before.
fn offloading(l: usize, saved: &[usize], lead: usize) -> Schedule {
    let mut ops = Vec::new();
    for i in 0..l {
        ops.push(Op::Forward { stage: i, mode: ForwardMode::KeepAll });
        if saved.contains(&(i + 1)) {
            ops.push(Op::Offload { tensor: Tensor::Saved(i + 1), fraction: 1.0 });
        }
    }
    for j in (0..=l).rev() {
        for &i in saved {
            if (i + lead).min(l) == j {
                ops.push(Op::Prefetch { tensor: Tensor::Saved(i), fraction: 1.0 });
            }
        }
        ops.push(Op::Backward { stage: j });
    }
    Schedule::new(View::Chain, ops)
}

fn store_all(l: usize) -> Schedule {
    offloading(l, &[], 0)
}

/// A GPT small enough for the tests: 3 layers of width 32 over 16 tokens, batch 2.
fn tiny_gpt() -> ModelOptions {
    ModelOptions {
        batch: Some(2),
        seq: Some(16),
        layers: Some(3),
        width: Some(32),
        heads: Some(4),
        ..ModelOptions::default()
    }
}

fn mlp_options() -> ModelOptions {
    ModelOptions { batch: Some(256), layers: Some(6), ..ModelOptions::default() }
}

/// A session on `model` and its chain's `xbar` (the bytes of each saved set).
fn session(model: &str, options: ModelOptions) -> (Session<Flex>, Vec<u64>) {
    let lowered = lower::<Flex>(model, &options, None).expect("model");
    let xbar = lowered.chain.xbar.clone();
    let optimizer = OptimizerKind::Sgd { lr: 0.1 };
    (Session::<Flex>::new(lowered.network, lowered.index, optimizer, 5, FlexDevice), xbar)
}

type Numbers = (Vec<f32>, Vec<Vec<f32>>);

fn numbers(session: &mut Session<Flex>, schedule: &Schedule) -> Numbers {
    let out = session.gradients(schedule).unwrap_or_else(|e| panic!("{e}"));
    let loss = read_floats::<Flex>(out.loss).expect("loss");
    let grads =
        out.grads.into_iter().map(|g| g.map(|g| read_floats::<Flex>(g).expect("grad")).unwrap_or_default()).collect();
    (loss, grads)
}

/// The device and host peaks of `schedule`, the least over three steps (the first warms
/// up what the kernels keep), and the last step's transfers.
fn peaks(session: &mut Session<Flex>, schedule: &Schedule) -> (u64, u64, pebble_runtime::TransferReport) {
    let mut best = (u64::MAX, u64::MAX);
    let mut last = None;
    for _ in 0..3 {
        let r = session.step(schedule).unwrap_or_else(|e| panic!("{e}"));
        best = (best.0.min(r.peak_bytes.expect("counting")), best.1.min(r.host_peak_bytes.expect("counting")));
        last = Some(r.transfers);
    }
    (best.0, best.1, last.expect("three steps"))
}

#[test]
fn offloading_saved_sets_changes_no_number_and_saves_their_memory() {
    let _turn = lock();
    let (mut session, xbar) = session("mlp", mlp_options());
    let l = xbar.len() - 1;
    let saved = [1, 2, 3];
    let moved: u64 = saved.iter().map(|&i| xbar[i]).sum();
    let reference = numbers(&mut session, &store_all(l));
    for lead in [0, 2] {
        assert!(numbers(&mut session, &offloading(l, &saved, lead)) == reference, "lead {lead}: the numbers differ");
    }
    let host_before = memory::host_live();
    let (full, full_host, none) = peaks(&mut session, &store_all(l));
    let (peak, host, moves) = peaks(&mut session, &offloading(l, &saved, 0));
    // Every host copy was made and dropped inside a host scope.
    assert_eq!(memory::host_live(), host_before, "host copies left behind");
    println!("store-all {full} (host {full_host}), offloading {peak} (host {host}), moved {moved}: {moves:?}");
    assert_eq!((none.offloaded_bytes, none.prefetched_bytes, full_host), (0, 0, 0));
    assert_eq!((moves.offloaded_bytes, moves.prefetched_bytes), (moved, moved));
    // At the loss, store-all holds ā_1 … ā_6; the offloading schedule only ā_4 … ā_6,
    // and its backward never holds more (each ā_i comes back when ā_{i+1} is gone).
    let saving = full as i64 - peak as i64;
    assert!(
        saving as f64 >= 0.9 * moved as f64 && saving as f64 <= 1.1 * moved as f64,
        "offloading {moved} bytes saved {saving} bytes of the measured peak ({full} → {peak})"
    );
    assert!(none.device_pool_peak - moves.device_pool_peak == moved, "{none:?} {moves:?}");
    // The host held the three copies at once, each in one buffer (a copy is made by an
    // exact op whose buffer burn-flex hands over, not copied twice to align it).
    let off = host as f64 / moved as f64 - 1.0;
    assert!(off.abs() <= 0.01, "host peak {host} for {moved} bytes moved");
}

#[test]
fn gpt_offloads_change_no_number() {
    let _turn = lock();
    let options = tiny_gpt();
    let (mut session, xbar) = session("gpt", options);
    let l = xbar.len() - 1;
    let reference = numbers(&mut session, &store_all(l));
    // Every saved set, with its inner tensors (attention weights, dropout masks).
    let all: Vec<usize> = (1..=l).collect();
    for lead in [0, 1, l] {
        assert!(numbers(&mut session, &offloading(l, &all, lead)) == reference, "lead {lead}: the numbers differ");
    }
}

/// A link on which moving `bytes` takes `seconds`.
fn link(bytes: u64, seconds: f64) -> LinkSpeed {
    LinkSpeed { bandwidth: bytes as f64 / seconds, latency: 0.0 }
}

#[test]
fn a_slow_link_stalls_the_compute_stream_and_a_fast_one_does_not() {
    let _turn = lock();
    let (mut session, xbar) = session("mlp", mlp_options());
    let l = xbar.len() - 1;
    let saved = [1, 2, 3];
    let moved: u64 = saved.iter().map(|&i| xbar[i]).sum();
    // 50 ms for one saved set, each way; the prefetch right before its reader.
    let slow = link(xbar[1], 0.05);
    session.set_transfers(TransferOptions { d2h: slow, h2d: slow, device_cap: None, ..TransferOptions::default() });
    let (_, _, r) = peaks(&mut session, &offloading(l, &saved, 0));
    println!("slow: {r:?}");
    let ideal = moved as f64 / slow.bandwidth;
    assert!(r.d2h_busy >= ideal && r.d2h_busy < ideal + 0.1, "d2h busy {} for {ideal} s of bytes", r.d2h_busy);
    assert!(r.h2d_busy >= ideal && r.h2d_busy < ideal + 0.1, "h2d busy {} for {ideal} s of bytes", r.h2d_busy);
    // B_i waits for all of ā_i's prefetch, issued right after B_{i+1} ended.
    assert!(r.compute_stall >= 0.9 * ideal, "compute stall {} with prefetches of {ideal} s in all", r.compute_stall);
    // A link a thousand times faster, each prefetch issued one backward earlier: the
    // compute stream barely waits.
    let fast = link(xbar[1], 0.00005);
    session.set_transfers(TransferOptions { d2h: fast, h2d: fast, device_cap: None, ..TransferOptions::default() });
    let (_, _, r) = peaks(&mut session, &offloading(l, &saved, 1));
    println!("fast: {r:?}");
    assert!(r.compute_stall < 0.05 * ideal, "compute stall {} on a fast link", r.compute_stall);
}

#[test]
fn compute_waits_under_the_cap_for_offloads_to_release_memory() {
    let _turn = lock();
    let (mut session, xbar) = session("mlp", mlp_options());
    let l = xbar.len() - 1;
    let saved = [1, 2, 3];
    let moved: u64 = saved.iter().map(|&i| xbar[i]).sum();
    let schedule = offloading(l, &saved, 0);
    // The pool holds what the offloading schedule needs when its offloads keep up:
    // store-all's pool peak (at B4, timing aside) less what it moves.
    let (_, _, none) = peaks(&mut session, &store_all(l));
    let cap = none.device_pool_peak - moved;
    // Slow offloads (200 ms each), fast prefetches: the forwards must wait for ā_1, ā_2
    // to reach the host before they can make ā_4, ā_5.
    let slow = link(xbar[1], 0.2);
    session.set_transfers(TransferOptions { d2h: slow, device_cap: Some(cap), ..TransferOptions::default() });
    let (_, _, capped) = peaks(&mut session, &schedule);
    println!("cap {cap}: {capped:?}");
    assert!(capped.device_pool_peak <= cap, "{capped:?}");
    assert!(capped.compute_stall >= 0.05, "the forwards did not wait for memory: {capped:?}");
    // Below what the step starts with, nothing in flight can help: the first op fails.
    session.set_transfers(TransferOptions { device_cap: Some(1024), ..TransferOptions::default() });
    match session.gradients(&schedule) {
        Err(e @ RuntimeError::Transfer { index: 0, .. }) => {
            let text = e.to_string();
            assert!(text.contains("F0all") && text.contains("no offload in flight"), "{text}");
        }
        Err(e) => panic!("expected a transfer error at op 0, got {e}"),
        Ok(_) => panic!("a 1 KiB cap was met"),
    }
}

/// `train` caps the pool at the schedule's simulated peak: the pool, with the chain's
/// temporaries, counts exactly what the simulator does, so a plan without transfers
/// never waits or fails under it, even at the least budget its solver meets.
#[test]
fn plans_without_transfers_fit_the_pool_at_their_least_budget() {
    let _turn = lock();
    let gpt = tiny_gpt();
    let mlp = ModelOptions { batch: Some(8), layers: Some(4), ..ModelOptions::default() };
    let optimizer = OptimizerKind::Sgd { lr: 0.1 };
    for (model, mut options) in [("gpt", gpt), ("mlp", mlp)] {
        options.optimizer = optimizer.planner();
        let lowered = lower::<Flex>(model, &options, None).expect("model");
        let chain = lowered.chain.clone();
        let problem = Problem::Chain(&chain);
        let solve = SolveOptions { machine: options.profile.machine, ..SolveOptions::default() };
        let mut session = Session::<Flex>::new(lowered.network, lowered.index, optimizer, 5, FlexDevice);
        for name in ["store-all", "sequential", "chen-sqrt", "revolve", "recompute-all", "rotor", "rotor-optimal"] {
            let solver = pebble_solve::solver(name).expect("registered");
            let min = pebble_solve::min_feasible_budget(solver, problem, &solve).unwrap().expect("some budget fits");
            let plan = pebble_solve::plan(solver, problem, min, &solve).expect("plan");
            let simulated = plan.report.peak_bytes;
            session.set_transfers(pebble_train::transfer_options(&solve.machine, Some(simulated)));
            session.set_temporaries(StageTemporaries::of(&chain));
            let out = session.gradients(&plan.schedule).unwrap_or_else(|e| panic!("{model} {name} at {min}: {e}"));
            let pool = out.transfers.device_pool_peak;
            println!("{model} {name}: pool {pool} simulated {simulated}");
            assert_eq!(pool, simulated, "{model} {name}");
            assert_eq!(out.transfers.compute_stall, 0.0, "{model} {name}");
        }
    }
}

/// The offloading solvers' schedules run on `gpt`, `resnet` and `mlp`: at budgets that
/// make them offload, on the machine's links, under the cap of their budget with their
/// temporaries counted, with store-all's numbers.
#[test]
fn offloading_solvers_schedules_run_with_store_alls_numbers() {
    let _turn = lock();
    let optimizer = OptimizerKind::Sgd { lr: 0.1 };
    let gpt = tiny_gpt();
    let resnet =
        ModelOptions { batch: Some(2), image: Some(32), layers: Some(1), width: Some(8), ..ModelOptions::default() };
    for (model, options) in [("mlp", mlp_options()), ("gpt", gpt), ("resnet", resnet)] {
        let options = ModelOptions { optimizer: optimizer.planner(), ..options };
        let lowered = lower::<Flex>(model, &options, None).expect("model");
        let chain = lowered.chain.clone();
        let problem = Problem::Chain(&chain);
        let l = chain.len();
        let solve = SolveOptions { machine: options.profile.machine, ..SolveOptions::default() };
        let mut session = Session::<Flex>::new(lowered.network, lowered.index, optimizer, 5, FlexDevice);
        let reference = numbers(&mut session, &store_all(l));
        let top = pebble_solve::simulate(problem, &store_all(l), &solve.sim_config()).expect("store-all").peak_bytes;
        let mut moved = 0;
        for name in ["offload-greedy", "offload-dp", "pofo", "autocapper", "opportunist"] {
            let solver = pebble_solve::solver(name).expect("registered");
            let min = pebble_solve::min_feasible_budget(solver, problem, &solve).unwrap().expect("some budget fits");
            for budget in [min, (min + top.max(min)) / 2] {
                let plan = pebble_solve::plan(solver, problem, budget, &solve).expect("plan");
                let transfers = plan.schedule.ops.iter().filter(|o| matches!(o, Op::Offload { .. })).count();
                println!("{model} {name} at {budget} (min {min}, store-all {top}): {transfers} offloads");
                session.set_transfers(pebble_train::transfer_options(&solve.machine, Some(budget)));
                session.set_temporaries(StageTemporaries::of(&chain));
                let what = format!("{model} {name} at {budget}");
                let out = session.gradients(&plan.schedule).unwrap_or_else(|e| panic!("{what}: {e}"));
                assert!(out.transfers.device_pool_peak <= budget, "{what}: {:?}", out.transfers);
                moved += out.transfers.offloaded_bytes;
                assert!(numbers(&mut session, &plan.schedule) == reference, "{what}: the numbers differ");
            }
        }
        // On burn-flex the small ResNet's peak is its stem convolution's unfolded input,
        // before anything can be offloaded: its least budget is store-all's (measured:
        // 1,892,584 bytes for every solver), so only the GPT and the MLP must offload.
        assert!(moved > 0 || model == "resnet", "{model}: no solver offloaded anything");
    }
}

/// `train` runs an offloading plan on the machine's links and reports what its transfers
/// did beside what the simulator predicted.
#[test]
fn train_reports_measured_transfers_beside_simulated_ones() {
    let _turn = lock();
    let options = mlp_options();
    let config = TrainConfig {
        model: "mlp".into(),
        solve: SolveOptions { machine: options.profile.machine, ..SolveOptions::default() },
        options,
        budget: BudgetRequest::Total(BudgetSpec::Percent(95.0)),
        solver: "offload-dp".into(),
        online: false,
        steps: 2,
        seed: 3,
        optimizer: OptimizerKind::Sgd { lr: 0.01 },
        costs: Costs::Analytic,
    };
    let r = train::<Flex>(&config, FlexDevice).expect("train");
    println!("{r:?}");
    assert!(r.predicted_d2h_busy > 0.0 && r.predicted_h2d_busy > 0.0, "offload-dp did not offload at 95%");
    assert_eq!((r.d2h_busy.len(), r.h2d_busy.len(), r.compute_stall.len()), (2, 2, 2));
    // The link is throttled to the machine's: a step's transfers take at least the
    // simulated busy time (the same bytes at the same bandwidth and latency).
    for (&d2h, &h2d) in r.d2h_busy.iter().zip(&r.h2d_busy) {
        assert!(d2h >= r.predicted_d2h_busy && h2d >= r.predicted_h2d_busy, "{r:?}");
    }
    // The host copies are measured apart (the memory test holds the device peak to the
    // budget, with profiled costs), at what the simulator counts.
    let host = r.measured_host_peak_bytes.expect("counting") as f64;
    assert!((host / r.predicted_host_peak_bytes as f64 - 1.0).abs() <= 0.01, "{r:?}");
}

/// DELTA on a 4-layer GPT at 40% and 50% brings two tensors back just before the loss.
/// The simulator starts the second once the loss has begun (one link), and the plan is
/// tight there; the executor's link, faster than the profile's beside a slow CPU, took
/// both before the compute stream reached the loss, which then found the pool full ("no
/// offload in flight will release any": in release builds, every time). Each prefetch
/// now waits for the compute op the simulator ran before it (`SimReport::prefetch_gates`;
/// the gate itself is tested in `pebble-runtime`'s `transfer.rs`, where no race decides).
#[test]
fn prefetches_take_memory_in_the_simulators_order() {
    let _turn = lock();
    let options = ModelOptions {
        layers: Some(4),
        width: Some(128),
        heads: Some(4),
        seq: Some(256),
        batch: Some(8),
        ..Default::default()
    };
    for percent in [40.0, 50.0] {
        let config = TrainConfig {
            model: "gpt".into(),
            solve: SolveOptions { machine: options.profile.machine, ..SolveOptions::default() },
            options: options.clone(),
            budget: BudgetRequest::Activation(BudgetSpec::Percent(percent)),
            solver: "delta".into(),
            online: true,
            steps: 1,
            seed: 1,
            optimizer: OptimizerKind::AdamW { lr: 1e-3, weight_decay: 0.01 },
            costs: Costs::Analytic,
        };
        let r = train::<Flex>(&config, FlexDevice).unwrap_or_else(|e| panic!("delta at {percent}%: {e}"));
        assert!(r.reloads > 0, "delta at {percent}% brought nothing back: {r:?}");
        assert!(r.measured_peak_bytes.expect("counting") <= r.budget_bytes, "{r:?}");
    }
}

#[test]
fn partial_transfers_are_refused_naming_the_op() {
    let _turn = lock();
    let (mut session, xbar) =
        session("mlp", ModelOptions { batch: Some(4), layers: Some(3), ..ModelOptions::default() });
    let l = xbar.len() - 1;
    for op in [
        Op::Offload { tensor: Tensor::Saved(1), fraction: 0.5 },
        Op::Prefetch { tensor: Tensor::Saved(1), fraction: 0.25 },
    ] {
        let mut schedule = offloading(l, &[1], 0);
        let k = schedule.ops.iter().position(|o| std::mem::discriminant(o) == std::mem::discriminant(&op)).unwrap();
        schedule.ops[k] = op;
        match session.gradients(&schedule) {
            Err(e @ RuntimeError::Schedule { .. }) => {
                let text = e.to_string();
                assert!(text.starts_with(&format!("schedule op {k} ({op})")), "{text}");
                assert!(text.contains("whole tensors"), "{text}");
            }
            Err(e) => panic!("expected a schedule error, got {e}"),
            Ok(_) => panic!("{op} ran"),
        }
    }
}
