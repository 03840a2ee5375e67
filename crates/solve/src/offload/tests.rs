//! Offloading against its oracles: Theorem 9's gadget, Theorem 8 and Lemma 6 under O.7′,
//! Proposition 3's bound, and the simulator.

use pebble_graph::Chain;
use pebble_machine::Machine;
use pebble_sim::SimConfig;
use pebble_testkit::{random_chain, Rng};

use super::dynprog::{run, Slotted};
use super::*;
use crate::plan;

/// Theorem 9's reduction from 2-PARTITION (Σx = 2V): β = V, M = 2V; layers `1..n` free
/// with `ā_{i−1} = x_i`; layer `n+1` takes 1 forward and 1 backward; `ā_{n+2} = V`; no δ.
/// In pebble's format `δ_0 = a_0 = x_1` is not zero; the instances put a small `x_1` first
/// so that it never binds.
fn gadget(x: &[u64]) -> (Chain, u64, f64) {
    let n = x.len();
    let v = x.iter().sum::<u64>() / 2;
    let l = n + 2;
    let mut xbar = vec![0; l + 1];
    xbar[0] = x[0];
    xbar[1..n].copy_from_slice(&x[1..n]);
    xbar[l] = v;
    let mut xs = vec![0; l + 1];
    xs[0] = x[0];
    let mut ftime = vec![0.0; l];
    let mut btime = vec![0.0; l + 1];
    ftime[n] = 1.0;
    btime[n] = 1.0;
    let chain = Chain {
        utmp: None,
        name: None,
        ftime,
        btime,
        x: xs,
        xbar,
        ftmp: vec![0; l],
        btmp: vec![0; l + 1],
        w: None,
        g: None,
        o: None,
        static_bytes: 0,
    };
    chain.validate().unwrap();
    (chain, 2 * v, v as f64)
}

fn relaxed_dp(chain: &Chain, budget: u64, beta: f64) -> Option<f64> {
    let c = OffChain::new(chain, budget).unwrap();
    let abar = c.abar.iter().map(|&v| v as i64).collect();
    run(&Slotted::new(&c, 1, abar, beta, beta)).map(|(v, _)| v)
}

#[test]
fn theorem_9_gadget() {
    // The digest's prototype values: 2Q*/V, Q* the least subset sum ≥ V.
    for (x, want) in [(vec![2, 4, 5, 5], 9.0 / 4.0), (vec![2, 3, 7], 7.0 / 3.0), (vec![1, 1, 1, 2, 2, 3], 2.0)] {
        let (chain, budget, beta) = gadget(&x);
        let c = OffChain::new(&chain, budget).unwrap();
        assert_eq!(c.peak(), 3 * budget as u128 / 2, "{x:?}: M_peak = 3V");
        let got = relaxed_dp(&chain, budget, beta).unwrap();
        assert!((got - want).abs() < 1e-9, "{x:?}: DYNPROG {got}, want {want}");
        // Proposition 3: max(Σu, 2Q/β) = max(2, 2V/V) = 2.
        assert_eq!(lower_bound(&chain, budget, &Machine::default().with_bandwidth(beta)).unwrap(), 2.0);
    }
}

fn machine(beta: f64) -> Machine {
    Machine::default().with_bandwidth(beta)
}

fn options(beta: f64) -> SolveOptions {
    SolveOptions { machine: machine(beta), ..SolveOptions::default() }
}

/// Random chains with a budget between the least any offloading needs and `M_peak`.
fn instances(seed: u64, count: usize) -> Vec<(Chain, u64, f64)> {
    let mut rng = Rng::new(seed);
    let mut out = Vec::new();
    while out.len() < count {
        let l = rng.range(2, 7) as usize;
        let chain = random_chain(&mut rng, l);
        let c = OffChain::new(&chain, u64::MAX).unwrap();
        let peak = c.peak() as u64 + chain.static_bytes;
        let least = c.least_memory() as u64 + chain.static_bytes;
        if least >= peak {
            continue;
        }
        let budget = least + rng.range(0, peak - least);
        let beta = [0.5, 2.0, 8.0][rng.range(0, 2) as usize];
        out.push((chain, budget, beta));
    }
    out
}

#[test]
fn every_offloading_schedule_is_at_least_the_bound_and_passes_the_simulator() {
    let mut solved = 0;
    for (chain, budget, beta) in instances(11, 60) {
        let lb = lower_bound(&chain, budget, &machine(beta)).unwrap();
        for solver in [&OffloadGreedy as &dyn Solver, &OffloadDp] {
            match plan(solver, Problem::Chain(&chain), budget, &options(beta)) {
                Ok(p) => {
                    solved += 1;
                    assert!(p.report.peak_bytes <= budget);
                    assert!(
                        p.report.makespan >= lb * (1.0 - 1e-9),
                        "{}: {} < bound {lb}",
                        solver.name(),
                        p.report.makespan
                    );
                }
                Err(crate::PlanError::Solve(SolveError::Infeasible { .. })) => {}
                Err(e) => panic!("{}: {e}", solver.name()),
            }
        }
    }
    assert!(solved > 80, "only {solved} of 120 solved");
}

#[test]
fn with_enough_memory_nothing_moves() {
    for (chain, _, beta) in instances(12, 20) {
        let c = OffChain::new(&chain, u64::MAX).unwrap();
        let budget = c.peak() as u64 + chain.static_bytes;
        let sum = c.compute_time();
        assert_eq!(lower_bound(&chain, budget, &machine(beta)).unwrap(), sum);
        for solver in [&OffloadGreedy as &dyn Solver, &OffloadDp] {
            let p = plan(solver, Problem::Chain(&chain), budget, &options(beta)).unwrap();
            assert!((p.report.makespan - sum).abs() < 1e-9, "{}", solver.name());
            assert_eq!(p.report.d2h_busy, 0.0);
        }
    }
}

/// Lemma 6 and Theorem 8 under O.7′: the eager ordered no-wait schedule offloading
/// exactly `Q` is at least as fast as offloading more, and as every whole-activation
/// offload set.
#[test]
fn greedy_is_optimal_under_partial_offloading() {
    let mut checked = 0;
    for (chain, budget, beta) in instances(13, 40) {
        let c = OffChain::new(&chain, budget).unwrap();
        let config = relaxed(&SimConfig::on(machine(beta)));
        let time = |offs: &[Offloaded]| {
            no_wait_schedule(&chain, offs, budget, &config).ok().map(|s| {
                pebble_sim::simulate_chain(&chain, &s, &SimConfig { budget: Some(budget), ..config.clone() })
                    .unwrap()
                    .makespan
            })
        };
        let Some(best) = time(&greedy_offloads(&c, true)) else { continue };
        checked += 1;
        // Lemma 6: eager sets offloading more.
        let total: u64 = c.abar[..c.n].iter().sum();
        let q = c.peak() as u64 - c.memory;
        for extra in [1, 2, 5] {
            let more = (q + extra).min(total);
            let mut offs = Vec::new();
            let mut moved = 0;
            for ell in 0..c.n {
                if moved >= more || c.abar[ell] == 0 {
                    continue;
                }
                let part = (more - moved).min(c.abar[ell]);
                offs.push(Offloaded { ell, fraction: part as f64 / c.abar[ell] as f64 });
                moved += part;
            }
            if let Some(t) = time(&offs) {
                assert!(t >= best - 1e-9, "offloading {more} > Q = {q} takes {t} < {best}");
            }
        }
        // Theorem 8: every whole subset.
        for mask in 0u32..(1 << c.n) {
            let offs: Vec<Offloaded> =
                (0..c.n).filter(|&ell| mask >> ell & 1 == 1).map(|ell| Offloaded { ell, fraction: 1.0 }).collect();
            if let Some(t) = time(&offs) {
                assert!(t >= best - 1e-9, "subset {mask:b} takes {t} < greedy's {best}");
            }
        }
    }
    assert!(checked > 20, "only {checked} instances checked");
}

/// (3.3) is the simulator's peak of the keep-all schedule: the thesis's notation maps
/// onto pebble's chain as the module docs say.
#[test]
fn m_peak_is_the_simulated_keep_all_peak() {
    for (chain, _, _) in instances(12, 40) {
        let c = OffChain::new(&chain, u64::MAX).unwrap();
        let s = Schedule::new(View::Chain, keep_all_ops(chain.len()));
        let r = pebble_sim::simulate_chain(&chain, &s, &SimConfig::default()).unwrap();
        assert_eq!(r.peak_bytes, c.peak() as u64 + chain.static_bytes);
        assert_eq!(r.makespan, c.compute_time());
    }
}
