//! The practice baselines `zero-offload`, `zero-infinity` and `paged-adam`: a period
//! worked out by hand, every schedule through the simulator within its budget, and how
//! their peaks compare on a zoo model.

use pebble_graph::Chain;
use pebble_machine::{Machine, Profile};
use pebble_schedule::{ForwardMode, Op, Schedule, Tensor, View};
use pebble_sim::{simulate_chain, SimConfig, SimReport};
use pebble_solve::baseline::paged_adam::{paged_adam_ops, paging_order, PagedAdam};
use pebble_solve::baseline::store_all::store_all_schedule;
use pebble_solve::baseline::zero::{zero_infinity_ops, zero_offload_ops, Activations, ZeroInfinity, ZeroOffload};
use pebble_solve::{min_feasible_budget, plan, solver, Problem, SolveError, SolveOptions, Solver};
use pebble_testkit::{random_chains, Rng};

const PRACTICE: [&str; 3] = ["zero-offload", "zero-infinity", "paged-adam"];

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * (1.0 + a.abs().max(b.abs()))
}

/// L = 2: forwards 1, backwards 2, the loss 1; a_i alone 1 byte, ā_1 = ā_2 = 5 (so that
/// checkpointing saves memory), no temporary memory. Weights 10, gradients 10, optimizer
/// states 20 per stage, and 5 static bytes beyond them (85 in all).
fn hand() -> Chain {
    Chain {
        utmp: None,
        name: Some("practice".into()),
        ftime: vec![1.0, 1.0],
        btime: vec![2.0, 2.0, 1.0],
        x: vec![1, 1, 1],
        xbar: vec![1, 5, 5],
        ftmp: vec![0, 0],
        btmp: vec![0, 0, 0],
        w: Some(vec![10, 10]),
        g: Some(vec![10, 10]),
        o: Some(vec![20, 20]),
        static_bytes: 85,
    }
}

/// Links of 10 bytes per time unit each way, no latency; the CPU steps 5 bytes of
/// gradient per unit, the device 10.
fn hand_options() -> SolveOptions {
    let machine = Machine { cpu_optimizer_rate: 5.0, gpu_optimizer_rate: Some(10.0), ..Machine::default() };
    SolveOptions { machine: machine.with_bandwidth(10.0), ..SolveOptions::default() }
}

fn config(options: &SolveOptions, budget: Option<u64>) -> SimConfig {
    SimConfig { budget, ..SimConfig::on(options.machine) }
}

fn sim(chain: &Chain, schedule: &Schedule, options: &SolveOptions) -> SimReport {
    simulate_chain(chain, schedule, &config(options, None))
        .unwrap_or_else(|e| panic!("{} rejected: {e}", schedule.to_notation()))
}

/// The minimum budget an `Infeasible` error names ("… needs at least P bytes …").
fn named_minimum(e: &SolveError) -> u64 {
    let SolveError::Infeasible { reason, .. } = e else { panic!("not infeasible: {e}") };
    let rest = reason.split("needs at least ").nth(1).unwrap_or_else(|| panic!("no minimum in `{reason}`"));
    rest.split_whitespace().next().and_then(|p| p.parse().ok()).unwrap_or_else(|| panic!("no number in `{reason}`"))
}

fn notation(ops: Vec<Op>) -> String {
    Schedule::new(View::Chain, ops).to_notation()
}

#[test]
fn the_practice_baselines_are_registered_chain_solvers() {
    for name in PRACTICE {
        let s = solver(name).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(s.name(), name);
        assert_eq!(s.views(), &[View::Chain]);
    }
    let g = pebble_testkit::tiny_graph();
    for name in PRACTICE {
        let e = solver(name).unwrap().solve(Problem::Graph(&g), 1 << 40, &SolveOptions::default()).unwrap_err();
        assert!(matches!(e, SolveError::NotApplicable { view: View::Graph, .. }), "{name}: {e}");
    }
}

#[test]
fn a_chain_without_gradients_or_states_is_refused_naming_the_field() {
    let full = hand();
    for (field, strip) in [
        ("`w`", (|c: &mut Chain| c.w = None) as fn(&mut Chain)),
        ("`g`", |c: &mut Chain| c.g = None),
        ("`o`", |c: &mut Chain| c.o = None),
    ] {
        let mut c = full.clone();
        strip(&mut c);
        if field == "`w`" {
            c.g = None; // a chain with `g` needs `w`; without `w` it names neither
        }
        for name in PRACTICE {
            let e = solver(name).unwrap().solve(Problem::Chain(&c), 1 << 40, &hand_options()).unwrap_err();
            match &e {
                SolveError::Unsupported { solver, why } => {
                    assert_eq!(*solver, name);
                    assert!(why.contains(field), "{name} without {field}: {why}");
                }
                e => panic!("{name} without {field}: {e}"),
            }
        }
    }
}

#[test]
fn zero_offloads_period_by_hand() {
    let (c, options) = (hand(), hand_options());
    let store_all_ops = zero_offload_ops(&c, Activations::StoreAll);
    assert_eq!(
        notation(store_all_ops.clone()),
        "[prefetch Weight(0) 1] [prefetch Weight(1) 1] F0all F1all B2 \
         B1 [offload WeightGrad(1) 1] [cpu update 1] [free Weight(1)] \
         B0 [offload WeightGrad(0) 1] [cpu update 0] [free Weight(0)]"
    );
    // The steady state, times from the end of the previous period's B0 (t = 0): its
    // gradient goes to the host 0–1 (10 bytes at 10 a unit), the CPU steps 1–3 (10 bytes at
    // 5 a unit; its stage-1 step ended earlier). W0 can only come back once stepped: 3–4,
    // then W1 4–5. F0 4–5, F1 5–6, the loss 6–7, B1 7–9 (no device update: its stage is
    // updated on the CPU). G1 goes out 9–10, the CPU steps it 10–12, W1's device copy is
    // dropped at 9. B0 9–11, G0 out 11–12, its step 12–14 (the CPU is busy until 12), W0
    // back 14–15: the next F0 starts at 15, a period of 11 (7 of compute, 4 of stall).
    let s = Schedule::new(View::Chain, store_all_ops).repeated();
    let r = sim(&c, &s, &options);
    assert!(close(r.makespan, 11.0), "{}", r.makespan);
    assert!(close(r.compute_time, 7.0) && close(r.compute_stall, 4.0), "{} {}", r.compute_time, r.compute_stall);
    assert!(close(r.cpu_busy, 4.0) && close(r.d2h_busy, 2.0) && close(r.h2d_busy, 2.0));
    // Device peak in B1: 5 unnamed static + a_0 1 + W0, W1 20 + ā_1, ā_2 10 + δ_2 1 +
    // δ_1 1 + G1 10 = 48 (no state ever on the device, no gradient before its backward).
    // Host: both states (40) and both weights (20), and both gradients from 11 (G0's
    // offload starts) to 12 (G1's step ends): 80.
    assert_eq!(r.peak_bytes, 48);
    assert_eq!(r.peak_host_bytes, 80);
    // Plain store-all with the update on the device: 85 + a_0 + ā_1 + ā_2 + δ_2 + δ_1 = 98,
    // in 7 + 2 × 10/10 = 9.
    let plain = sim(&c, &store_all_schedule(Problem::Chain(&c)), &options);
    assert_eq!(plain.peak_bytes, 98);
    assert!(close(plain.makespan, 9.0), "{}", plain.makespan);

    // A checkpoint per block: F0ck F1all L B1 F0all B0. B1 holds a_1 alone (1) instead of
    // ā_1 (5): 44. The recomputation F0all (9–10) delays B0 to 10–12, G0 12–13, its step
    // 13–15, W0 15–16, the next F0 16: a period of 12.
    let ck = Schedule::new(View::Chain, zero_offload_ops(&c, Activations::CheckpointBlocks)).repeated();
    assert!(notation(ck.ops.clone()).contains("F0ck F1all B2 B1"), "{}", notation(ck.ops.clone()));
    let rk = sim(&c, &ck, &options);
    assert!(close(rk.makespan, 12.0), "{}", rk.makespan);
    assert_eq!(rk.peak_bytes, 44);

    // The solver: store-all at 48 and above, the checkpoints down to 44, nothing below.
    let z = &ZeroOffload;
    let at = |b: u64| plan(z, Problem::Chain(&c), b, &options);
    let p = at(48).unwrap();
    assert!(p.schedule.periodic);
    assert_eq!(p.schedule.ops, s.ops);
    assert!(close(p.report.makespan, 11.0) && p.report.peak_bytes == 48);
    let p = at(47).unwrap();
    assert_eq!(p.schedule.ops, ck.ops);
    assert!(close(p.report.makespan, 12.0) && p.report.peak_bytes == 44);
    let e = z.solve(Problem::Chain(&c), 43, &options).unwrap_err();
    assert_eq!(named_minimum(&e), 44, "{e}");
    assert_eq!(min_feasible_budget(z, Problem::Chain(&c), &options).unwrap(), Some(44));
}

#[test]
fn zero_infinity_fetches_each_blocks_weights_one_op_ahead() {
    let c = hand();
    assert_eq!(
        notation(zero_infinity_ops(&c, Activations::StoreAll)),
        "[prefetch Weight(0) 1] [prefetch Weight(1) 1] F0all [free Weight(0)] F1all B2 [prefetch Weight(0) 1] \
         B1 [offload WeightGrad(1) 1] [cpu update 1] [free Weight(1)] \
         B0 [offload WeightGrad(0) 1] [cpu update 0] [free Weight(0)]"
    );
    // With a checkpoint per block, the backward's F0all and B0 share one fetch.
    assert_eq!(
        notation(zero_infinity_ops(&c, Activations::CheckpointBlocks)),
        "[prefetch Weight(0) 1] [prefetch Weight(1) 1] F0ck [free Weight(0)] F1all B2 [prefetch Weight(0) 1] \
         B1 [offload WeightGrad(1) 1] [cpu update 1] [free Weight(1)] \
         F0all B0 [offload WeightGrad(0) 1] [cpu update 0] [free Weight(0)]"
    );
}

#[test]
fn paged_adam_pages_the_largest_states_first_and_only_as_many_as_needed() {
    assert_eq!(paging_order(&[5, 0, 9, 5]), vec![2, 0, 3]);
    // Stage 0 has the larger state (30 bytes, stage 1's 20), and the links are fast (100
    // a unit) so that paging a state costs less than recomputing a block.
    let mut c = hand();
    c.o = Some(vec![30, 20]);
    c.static_bytes = 95;
    let options = SolveOptions { machine: hand_options().machine.with_bandwidth(100.0), ..hand_options() };
    assert_eq!(
        notation(paged_adam_ops(2, &[false, true], Activations::StoreAll)),
        "F0all F1all B2 [prefetch OptState(1) 1] B1 [offload OptState(1) 1] B0"
    );
    let z = &PagedAdam;
    let full = sim(&c, &store_all_schedule(Problem::Chain(&c)), &options).peak_bytes;
    // 95 + a_0 + ā_1 + ā_2 + δ_2 + δ_1 = 108 in B1.
    assert_eq!(full, 108);
    // Plenty of memory: nothing paged, plain store-all.
    let p = plan(z, Problem::Chain(&c), full, &options).unwrap();
    assert!(p.schedule.ops.iter().all(|op| op.is_compute()), "{}", p.schedule.to_notation());
    // Just under: paging O0 (the larger) is cheaper than recomputing F0 (0.3 of waiting
    // against 1). B1 then holds 108 − 30 = 78, B0 the state again: 103.
    let p = plan(z, Problem::Chain(&c), full - 1, &options).unwrap();
    let pages: Vec<Tensor> = p.schedule.ops.iter().filter_map(|op| op.tensor()).collect();
    assert_eq!(pages, vec![Tensor::OptState(0), Tensor::OptState(0)], "{}", p.schedule.to_notation());
    assert_eq!(p.report.peak_bytes, 103);
    // Both paged, B0 holds 45 + O0 30 + a_0 + ā_1 + δ_1 + δ_0 = 83 (O1 has left during
    // O0's page-in): the least any candidate needs.
    // Its minimum budget pages both and runs.
    let low = min_feasible_budget(z, Problem::Chain(&c), &options).unwrap().unwrap();
    assert_eq!(low, 83);
    let p = plan(z, Problem::Chain(&c), low, &options).unwrap();
    for i in 0..2 {
        assert!(p.schedule.ops.contains(&Op::Prefetch { tensor: Tensor::OptState(i), fraction: 1.0 }));
    }
    let e = z.solve(Problem::Chain(&c), low - 1, &options).unwrap_err();
    assert_eq!(named_minimum(&e), low, "{e}");
}

/// Random chains given weights, gradients (the trainable part) and states, some stages
/// without parameters.
fn optimizer_chains() -> Vec<Chain> {
    let mut rng = Rng::new(0x0ff1_0ad5);
    random_chains(0x5eed_0ff1, 24, 6)
        .into_iter()
        .map(|mut c| {
            let l = c.len();
            let w: Vec<u64> = (0..l).map(|_| if rng.range(0, 4) == 0 { 0 } else { rng.range(5, 40) }).collect();
            let g: Vec<u64> = w.clone();
            let o: Vec<u64> = w.iter().map(|&x| 2 * x).collect();
            c.static_bytes += w.iter().chain(&g).chain(&o).sum::<u64>();
            (c.w, c.g, c.o) = (Some(w), Some(g), Some(o));
            c
        })
        .collect()
}

#[test]
fn every_schedule_runs_in_the_simulator_within_its_budget() {
    // Links of 8 bytes a unit, the CPU stepping 2 bytes a unit, the device 4.
    let machine = Machine { cpu_optimizer_rate: 2.0, gpu_optimizer_rate: Some(4.0), ..Machine::default() };
    let options = SolveOptions { machine: machine.with_bandwidth(8.0), ..SolveOptions::default() };
    let mut chains = optimizer_chains();
    chains.push(hand());
    for (n, c) in chains.iter().enumerate() {
        let problem = Problem::Chain(c);
        let top = sim(c, &store_all_schedule(problem), &options).peak_bytes;
        for name in PRACTICE {
            let s = solver(name).unwrap();
            let low = min_feasible_budget(s, problem, &options).unwrap().unwrap_or_else(|| panic!("{name}, chain {n}"));
            let e = s.solve(problem, low - 1, &options).unwrap_err();
            assert_eq!(named_minimum(&e), low, "{name}, chain {n}: {e}");
            for budget in [low, low + (top.max(low) - low) / 2, top.max(low)] {
                let p = plan(s, problem, budget, &options).unwrap_or_else(|e| panic!("{name}, chain {n}: {e}"));
                assert!(p.schedule.periodic, "{name}");
                let r = simulate_chain(c, &p.schedule, &config(&options, Some(budget)))
                    .unwrap_or_else(|e| panic!("{name}, chain {n} at {budget}: {e}"));
                assert!(r.peak_bytes <= budget, "{name}, chain {n}: {} > {budget}", r.peak_bytes);
            }
        }
    }
}

#[test]
fn on_gpt_the_practice_baselines_save_what_they_should() {
    let profile = Profile::lookup("rtx3060").unwrap();
    let options = SolveOptions { machine: profile.machine, ..SolveOptions::default() };
    let model_options = pebble_zoo::ModelOptions { profile, ..pebble_zoo::ModelOptions::default() };
    let model = pebble_zoo::build("gpt", &model_options).unwrap();
    let c = &model.chain;
    let problem = Problem::Chain(c);
    let o = c.o.as_ref().unwrap();
    let (states, largest) = (o.iter().sum::<u64>(), *o.iter().max().unwrap());
    let store_all = sim(c, &store_all_schedule(problem), &options);
    // Each solver's plan within `budget`, checked against the simulator under that budget.
    let at = |s: &dyn Solver, budget: u64| {
        let p = plan(s, problem, budget, &options).unwrap_or_else(|e| panic!("{}: {e}", s.name()));
        let r = simulate_chain(c, &p.schedule, &config(&options, Some(budget))).unwrap();
        assert!(r.peak_bytes <= budget && p.schedule.periodic, "{}", s.name());
        p
    };
    // With store-all's memory each keeps every activation, so what it saves is what it
    // offloads. ZeRO-Offload never holds a state on the device, nor a gradient before its
    // backward.
    let roomy = store_all.peak_bytes;
    let offload = at(&ZeroOffload, roomy);
    let infinity = at(&ZeroInfinity, roomy);
    for p in [&offload, &infinity] {
        let checkpoints = |op: &Op| matches!(op, Op::Forward { mode: ForwardMode::Checkpoint, .. });
        assert!(!p.schedule.ops.iter().any(checkpoints), "{}", p.schedule.to_notation());
    }
    let (po, pi) = (offload.report.peak_bytes, infinity.report.peak_bytes);
    assert!(po + (states - largest) <= roomy, "zero-offload {po}, store-all {roomy}, states {states}");
    // ZeRO-Infinity holds two stages' weights at a time, not all of them.
    assert!(pi < po, "zero-infinity {pi}, zero-offload {po}");
    // One byte short of store-all, paged Adam pages a state (the largest) rather than
    // recompute.
    let paged = at(&PagedAdam, roomy - 1);
    assert!(paged.report.peak_bytes < roomy);
    assert!(paged.schedule.ops.iter().any(|op| matches!(op.tensor(), Some(Tensor::OptState(_)))));
    assert!(paged.report.makespan < offload.report.makespan);
    // At their least budgets (a checkpoint per block), the order holds.
    let least = |s: &dyn Solver| min_feasible_budget(s, problem, &options).unwrap().unwrap();
    let (lo, li, lp) = (least(&ZeroOffload), least(&ZeroInfinity), least(&PagedAdam));
    assert!(li < lo && lo < lp && lp < roomy, "{li} {lo} {lp} {roomy}");
    eprintln!(
        "gpt on rtx3060: store-all {roomy} B in {:.2} ms; zero-offload {po} B in {:.2} ms (least {lo}); \
         zero-infinity {pi} B in {:.2} ms (least {li}); paged-adam {} B in {:.2} ms (least {lp}); states {states}",
        store_all.makespan * 1e3,
        offload.report.makespan * 1e3,
        infinity.report.makespan * 1e3,
        paged.report.peak_bytes,
        paged.report.makespan * 1e3,
    );
}

/// What `pebble-ilp`'s conformance suite asks of every registered solver, on its
/// one-layer GPT chain with the default machine: at store-all's peak, the least feasible
/// budget and a point between, a schedule that the simulator runs within the budget and
/// that is no faster than store-all.
#[test]
fn they_conform_on_a_one_layer_gpt_chain() {
    let model = pebble_testkit::gpt(1, 16, 8);
    let (c, options) = (&model.chain, SolveOptions::default());
    let problem = Problem::Chain(c);
    let sa = sim(c, &store_all_schedule(problem), &options);
    for name in PRACTICE {
        let s = solver(name).unwrap();
        let low = min_feasible_budget(s, problem, &options).unwrap().unwrap();
        assert!(low < sa.peak_bytes, "{name}: {low} against store-all's {}", sa.peak_bytes);
        for budget in [sa.peak_bytes, low, low + (sa.peak_bytes - low) / 2] {
            let p = plan(s, problem, budget, &options).unwrap_or_else(|e| panic!("{name} at {budget}: {e}"));
            let r = simulate_chain(c, &p.schedule, &config(&options, Some(budget))).unwrap();
            assert!(r.peak_bytes <= budget);
            assert!(r.makespan >= sa.makespan * (1.0 - 1e-9), "{name}: {} < {}", r.makespan, sa.makespan);
        }
    }
}
