//! OffMate on the chain. Without offloading it runs in exactly the time of Rockmate's
//! plan on its blocks (rk-Rotor's DP, each block with the one option the chain gives it)
//! and of Rotor's, both with OffMate's accounting of the weight gradients. That is no
//! slower than every combination of its MILP's block options (an exhaustive search) nor
//! than the `rotor` solver's plan, and no faster than Rotor with the gradients' memory
//! given back. With offloading, its schedules run in the
//! simulator within the budget, and beat rematerialization alone when weights and
//! optimizer states are what fills the device.

use pebble_graph::Chain;
use pebble_ilp::offmate::{
    freeing_gradients, gradients_as_temporaries, offmate_schedule, rotor_freeing_gradients, BlockOption, Offmate,
    OffmateOptions, OffmatePlan,
};
use pebble_schedule::{Op, Schedule, View};
use pebble_sim::{simulate_chain, Machine, SimConfig};
use pebble_solve::remat::rk_rotor::{self, RkChain};
use pebble_solve::{Problem, Slots, SolveError, SolveOptions, Solver};
use pebble_testkit::{random_chain, Rng};

/// A random chain whose stages carry weights, gradients and Adam states.
fn trained_chain(rng: &mut Rng, l: usize, weight: (u64, u64)) -> Chain {
    let mut c = random_chain(rng, l);
    let w: Vec<u64> = (0..l).map(|_| rng.range(weight.0, weight.1)).collect();
    c.g = Some(w.clone());
    c.o = Some(w.iter().map(|w| 2 * w).collect());
    c.static_bytes += 4 * w.iter().sum::<u64>();
    c.w = Some(w);
    c
}

/// The bytes of every weight gradient of `c`.
fn g_total(c: &Chain) -> u64 {
    c.g.as_ref().map_or(0, |g| g.iter().sum())
}

fn store_all(c: &Chain) -> Schedule {
    let l = c.len();
    let ops = pebble_solve::baseline::store_all_ops(l);
    Schedule::new(View::Chain, ops).repeated()
}

/// The plan that keeps every weight and state on the device, with these block options.
fn remat_plan(l: usize, options: Vec<BlockOption>) -> OffmatePlan {
    OffmatePlan {
        options,
        cpu: vec![false; l],
        weights: vec![vec![1.0; 2 * l]; l],
        states: vec![vec![1.0; 2 * l]; l],
        objective: 0.0,
        optimal: true,
        lower_bound: f64::NAN,
    }
}

fn machine() -> Machine {
    Machine { cpu_optimizer_rate: 4.0, gpu_optimizer_rate: Some(40.0), ..Machine::default().with_bandwidth(8.0) }
}

fn options() -> SolveOptions {
    SolveOptions { machine: machine(), time_limit: Some(20.0), ..SolveOptions::default() }
}

#[test]
fn without_offloading_offmate_is_rockmates_plan_on_its_blocks() {
    let mut rng = Rng::new(11);
    let mut compared = 0;
    let mut recomputed = 0;
    let mut below_bound = 0;
    // Where Rotor (with OffMate's gradients) is strictly faster than every combination
    // of OffMate's options, and where only it fits.
    let (mut faster, mut only) = (0, 0);
    // Of the latter, where rk-Rotor has a plan too.
    let mut rockmate_equal = 0;
    // Short chains with weights that matter, then longer ones with light weights and
    // tighter budgets, where recomputing from any checkpoint pays.
    let families = [(12, (3, 7), (1, 4), (60, 100)), (8, (7, 10), (1, 2), (55, 85))];
    for (l, weight, share) in families.into_iter().flat_map(|(n, l, w, p)| std::iter::repeat_n((l, w, p), n)) {
        let l = rng.range(l.0, l.1) as usize;
        let chain = trained_chain(&mut rng, l, weight);
        let full = simulate_chain(&chain, &store_all(&chain), &SimConfig::on(machine())).unwrap().peak_bytes;
        let budget = full * rng.range(share.0, share.1) / 100;
        let config = SimConfig { budget: Some(budget), ..SimConfig::on(machine()) };
        let time = |s: &Schedule| simulate_chain(&chain, s, &config).ok().map(|r| r.makespan);
        // Every combination of keep and recompute, judged by the simulator.
        let mut best: Option<f64> = None;
        for mask in 0..(1u32 << l) {
            let opts = (0..l).map(|i| if mask >> i & 1 == 1 { BlockOption::Recompute } else { BlockOption::Keep });
            if let Some(t) = time(&offmate_schedule(&chain, &remat_plan(l, opts.collect()))) {
                best = Some(best.map_or(t, |b: f64| b.min(t)));
            }
        }
        // Rockmate on these blocks, each with the one option the chain gives it, is Rotor;
        // with each gradient freed after its update, as OffMate's schedules do.
        let rotor = rotor_freeing_gradients(&chain, budget, &options());
        let rotor_time = rotor.as_ref().and_then(time);
        if let Some(s) = &rotor {
            for (k, op) in s.ops.iter().enumerate() {
                if let Op::Backward { stage } = *op {
                    let free = Op::Free { tensor: pebble_schedule::Tensor::WeightGrad(stage) };
                    assert!(stage == l || s.ops.get(k + 1) == Some(&free), "B{stage} not followed by its free");
                }
            }
        }
        // Rockmate's own DP (rk-Rotor) on the same blocks, each with its one option, with
        // the same accounting of the gradients (exact sizes).
        let freed = gradients_as_temporaries(&chain).unwrap();
        let memory = budget.saturating_sub(freed.static_bytes);
        let rockmate = rk_rotor::rk_rotor(&RkChain::from_chain(&freed), memory, Some(memory.max(1) as usize))
            .map(|p| freeing_gradients(&chain, rk_rotor::chain_ops(&p.ops)));
        let rockmate_time = rockmate.as_ref().map(|s| time(s).expect("rk-Rotor's plan runs"));
        let plain = pebble_solve::remat::rotor::Rotor.solve(Problem::Chain(&chain), budget, &options()).ok();
        let plain_time = plain.as_ref().and_then(time);
        let ours = Offmate::solve_with(&chain, budget, &options(), &OffmateOptions::remat_only());
        match (best, ours) {
            (Some(best), Ok(s)) => {
                let t = time(&s).expect("offmate's plan runs");
                // Rotor's schedules include every combination of OffMate's options.
                let rotor_time = rotor_time.unwrap_or_else(|| panic!("no Rotor plan where OffMate's options fit"));
                assert!(rotor_time <= best * (1.0 + 1e-9), "rotor {rotor_time} vs exhaustive {best}");
                assert!(plain_time.is_none_or(|p| rotor_time <= p * (1.0 + 1e-9)), "{plain_time:?} vs {rotor_time}");
                // OffMate without offloading: exactly Rotor's time, and Rotor's plan where
                // it is strictly faster than the O-ILP's best.
                assert!((t - rotor_time).abs() <= 1e-9 * t, "offmate {t} vs rotor {rotor_time}");
                let rockmate_time = rockmate_time.unwrap_or_else(|| panic!("no rk-Rotor plan where OffMate's fit"));
                assert!((t - rockmate_time).abs() <= 1e-9 * t, "offmate {t} vs rk-rotor {rockmate_time}");
                let strictly = rotor_time < best * (1.0 - 1e-9);
                if strictly {
                    assert_eq!(s.kept_from.as_deref(), Some("rotor"));
                }
                faster += usize::from(strictly);
                // A relaxation OffMate must not beat: Rotor (exact sizes) on the chain with
                // every weight gradient's memory given back, its optimizer steps' time added
                // (the simulator charges them to the backwards).
                let relaxed = Chain { static_bytes: chain.static_bytes - g_total(&chain), g: None, ..chain.clone() };
                let exact = SolveOptions { slots: Slots::Exact, ..options() };
                let bound =
                    pebble_solve::plan(&pebble_solve::remat::rotor::Rotor, Problem::Chain(&relaxed), budget, &exact)
                        .unwrap_or_else(|e| panic!("rotor has no plan where offmate has one: {e}"));
                let bound = bound.report.makespan + g_total(&chain) as f64 / machine().gpu_optimizer_rate.unwrap();
                assert!(bound <= t * (1.0 + 1e-9), "relaxed rotor {bound} vs offmate {t}");
                below_bound += usize::from(bound < t * (1.0 - 1e-9));
                assert!(!s.ops.iter().any(|op| matches!(op, Op::Offload { .. } | Op::Prefetch { .. })));
                compared += 1;
                recomputed += usize::from(s.ops.iter().filter(|op| matches!(op, Op::Forward { .. })).count() > l);
            }
            (None, Ok(s)) => {
                // Only Rotor's plan fits: it recomputes where the O-ILP cannot.
                assert_eq!(s.kept_from.as_deref(), Some("rotor"));
                let t = time(&s).expect("offmate's plan runs");
                assert!((t - rotor_time.unwrap()).abs() <= 1e-9 * t, "offmate {t} vs rotor {rotor_time:?}");
                if let Some(r) = rockmate_time {
                    assert!((t - r).abs() <= 1e-9 * t, "offmate {t} vs rk-rotor {r}");
                    rockmate_equal += 1;
                }
                only += 1;
            }
            (None, Err(SolveError::Infeasible { .. })) => {
                assert_eq!((rotor_time, plain_time, rockmate_time), (None, None, None))
            }
            (best, ours) => panic!("exhaustive {best:?}, offmate {ours:?}"),
        }
    }
    assert!(compared >= 8, "only {compared} instances compared");
    assert!(recomputed >= 2, "recomputation never needed: the check is weak");
    assert!(faster >= 1 && only >= 4, "Rotor strictly faster {faster} times, alone feasible {only}");
    assert!(rockmate_equal >= 4, "rk-Rotor's plan where only Rotor's fits: {rockmate_equal}");
    println!(
        "{compared} compared, Rotor strictly faster on {faster}, alone feasible on {only} \
         ({rockmate_equal} with rk-Rotor's too); the relaxation below on {below_bound}"
    );
}

#[test]
fn with_offloading_offmate_fits_where_rematerialization_cannot() {
    let mut rng = Rng::new(5);
    let mut beaten = 0;
    for case in 0..6 {
        let l = rng.range(4, 7) as usize;
        // Heavy weights: the states alone are most of the memory.
        let chain = trained_chain(&mut rng, l, (20, 40));
        let full = simulate_chain(&chain, &store_all(&chain), &SimConfig::on(machine())).unwrap().peak_bytes;
        let budget = full * 55 / 100;
        let config = SimConfig { budget: Some(budget), ..SimConfig::on(machine()) };
        // Rematerialization alone cannot: the weights, gradients and states stay.
        assert!(matches!(
            Offmate::solve_with(&chain, budget, &options(), &OffmateOptions::remat_only()),
            Err(SolveError::Infeasible { .. })
        ));
        match Offmate::solve_with(&chain, budget, &options(), &OffmateOptions::default()) {
            Ok(s) => {
                assert!(s.periodic);
                let r = simulate_chain(&chain, &s, &config).unwrap();
                assert!(r.peak_bytes <= budget);
                assert!(r.makespan >= r.compute_time - 1e-9);
                assert!(s.ops.iter().any(|op| matches!(op.tensor(), Some(pebble_schedule::Tensor::Weight(_)))
                    || matches!(op, Op::CpuUpdate { .. })));
                beaten += 1;
            }
            Err(SolveError::Infeasible { .. }) => {}
            Err(e) => panic!("case {case}: {e}"),
        }
    }
    assert!(beaten >= 4, "offmate fitted only {beaten} of 6 instances");
}

#[test]
fn a_chain_without_optimizer_states_is_refused_by_name() {
    let mut rng = Rng::new(1);
    let mut chain = trained_chain(&mut rng, 3, (1, 3));
    chain.o = None;
    match Offmate::solve_with(&chain, u64::MAX, &options(), &OffmateOptions::default()) {
        Err(SolveError::Unsupported { why, .. }) => assert!(why.contains("`o`"), "{why}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn host_memory_bounds_what_offmate_puts_there() {
    let mut rng = Rng::new(9);
    let chain = trained_chain(&mut rng, 6, (20, 40));
    let full = simulate_chain(&chain, &store_all(&chain), &SimConfig::on(machine())).unwrap().peak_bytes;
    let budget = full * 60 / 100;
    let roomy = Offmate::solve_with(&chain, budget, &options(), &OffmateOptions::default()).unwrap();
    let host = simulate_chain(&chain, &roomy, &SimConfig::on(machine())).unwrap().peak_host_bytes;
    assert!(host > 0);
    // With less host memory than that plan used, the plan changes and stays within it.
    let mut changed = 0;
    for percent in [99, 95, 90, 80, 70] {
        let small = Machine { host_memory: host * percent / 100, ..machine() };
        let tight = SolveOptions { machine: small, ..options() };
        if let Ok(s) = Offmate::solve_with(&chain, budget, &tight, &OffmateOptions::default()) {
            let r = simulate_chain(&chain, &s, &SimConfig { budget: Some(budget), ..SimConfig::on(small) }).unwrap();
            assert!(r.peak_host_bytes <= small.host_memory && r.peak_bytes <= budget);
            changed += 1;
        }
    }
    assert!(changed >= 1, "no plan within less host memory than the roomy plan's {host}");
    // With almost none, nothing can leave the device: the budget cannot be met.
    let none = SolveOptions { machine: Machine { host_memory: 1, ..machine() }, ..options() };
    assert!(matches!(
        Offmate::solve_with(&chain, budget, &none, &OffmateOptions::default()),
        Err(SolveError::Infeasible { .. })
    ));
}

/// The practice baselines' plans are OffMate's candidates: wherever `paged-adam`,
/// `zero-offload` or `zero-infinity` has a plan, `offmate` has one no slower, and where
/// it keeps a baseline's, it says whose and runs in the best baseline's time. On chains
/// of a few heavy layers, whose weights and states a fixed policy frees layer by layer,
/// a policy's plan is kept at some budgets (10 of the 33 compared).
#[test]
fn offmate_fits_wherever_a_practice_baseline_does() {
    use pebble_solve::baseline::{paged_adam::PagedAdam, zero};
    let baselines: [&dyn Solver; 3] = [&PagedAdam, &zero::ZeroOffload, &zero::ZeroInfinity];
    let mut rng = Rng::new(23);
    let (mut compared, mut kept) = (0, 0);
    for _ in 0..6 {
        let l = rng.range(3, 6) as usize;
        let chain = trained_chain(&mut rng, l, (30, 60));
        let full = simulate_chain(&chain, &store_all(&chain), &SimConfig::on(machine())).unwrap().peak_bytes;
        for percent in [30, 40, 50, 60, 70, 85] {
            let budget = full * percent / 100;
            let config = SimConfig { budget: Some(budget), ..SimConfig::on(machine()) };
            let time = |s: &Schedule| simulate_chain(&chain, s, &config).map(|r| r.makespan);
            let best = baselines
                .iter()
                .filter_map(|b| b.solve(Problem::Chain(&chain), budget, &options()).ok())
                .map(|s| time(&s).expect("a baseline's plan runs in its budget"))
                .min_by(f64::total_cmp);
            let ours = Offmate::solve_with(&chain, budget, &options(), &OffmateOptions::default());
            match (best, ours) {
                (Some(best), Ok(s)) => {
                    let t = time(&s).expect("offmate's plan runs in its budget");
                    assert!(t <= best * (1.0 + 1e-9), "offmate {t} vs the best baseline {best} at {percent}%");
                    let from = s.kept_from.as_deref();
                    if matches!(from, Some("paged-adam" | "zero-offload" | "zero-infinity")) {
                        kept += 1;
                        assert!((t - best).abs() <= 1e-9 * t, "a baseline's plan kept at {t}, the best is {best}");
                    }
                    compared += 1;
                }
                (None, _) => {}
                (Some(best), Err(e)) => panic!("a baseline runs in {best} at {percent}%, offmate: {e}"),
            }
        }
    }
    assert!(compared >= 10 && kept >= 1, "{compared} budgets compared, a baseline's plan kept at {kept}");
    println!("{compared} budgets compared, a baseline's plan kept at {kept}");
}
