//! The pipeline solvers against the thesis's instances (Shilova Part III; digest §6.3)
//! and against exhaustive search, every schedule held to the simulator.

use pebble_graph::Layers;
use pebble_solve::pipeline::{brute, madpipe, onef1b, pipe_solver, pipedream, plan_pipeline, PipeError, PipeProblem};

fn thesis(costs: &[f64], weights: &[u64]) -> Layers {
    Layers::from_costs(costs).with_weights(weights.to_vec())
}

fn problem(l: &Layers, devices: usize, memory: Option<u64>) -> PipeProblem<'_> {
    PipeProblem::thesis(l, devices, memory)
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * b.abs().max(1.0)
}

#[test]
fn t1_contiguous_three_general_two() {
    let l = thesis(&[1.0, 2.0, 1.0], &[0, 0, 0]);
    let p = problem(&l, 2, None);
    assert!(close(brute::contiguous(&p).0, 3.0));
    assert!(close(brute::general(&p).0, 2.0));
    let plan = plan_pipeline(pipe_solver("pipedream").unwrap(), &p).unwrap();
    assert!(close(plan.report.period, 3.0), "pipedream {}", plan.report.period);
    let plan = plan_pipeline(pipe_solver("1f1b").unwrap(), &p).unwrap();
    assert!(close(plan.report.period, 3.0), "1f1b {}", plan.report.period);
}

#[test]
fn t2_only_a_general_allocation_fits() {
    let l = thesis(&[1.0, 2.0, 1.0], &[1, 2, 1]);
    let p = problem(&l, 2, Some(2));
    assert!(brute::contiguous(&p).0.is_infinite());
    assert!(close(brute::general(&p).0, 2.0));
    let e = plan_pipeline(pipe_solver("pipedream").unwrap(), &p).unwrap_err();
    assert!(matches!(e, PipeError::Infeasible { .. }), "{e}");
}

/// Thm 17's chain `C_k` on `P = 2k+1` devices.
fn c_k(k: usize) -> Layers {
    let eps = 1.0 / (2 * k + 1) as f64;
    let mut costs = Vec::new();
    for _ in 0..k {
        costs.extend([k as f64, eps, (k - 1) as f64, eps]);
    }
    costs.push(k as f64);
    costs.extend(std::iter::repeat_n(eps, (k - 2) * (2 * k + 1) + 1));
    costs.push(1.0);
    Layers::from_costs(&costs)
}

#[test]
fn t3_contiguous_is_almost_twice_the_general_period() {
    for (k, contiguous) in [(2, 16.0 / 5.0), (3, 36.0 / 7.0), (4, 64.0 / 9.0)] {
        let l = c_k(k);
        let p = problem(&l, 2 * k + 1, None);
        let (bounds, dp) = pipedream::partition(&p, false).unwrap();
        assert!(close(dp, contiguous), "k = {k}: contiguous {dp}");
        assert!(close(onef1b::min_period(&p, &bounds), contiguous));
        // The general optimum is the average load, k, reached by the proof's allocation:
        // the k+1 layers of cost k alone, each cost k−1 with 2k+1 layers of cost ε, the
        // last with the layer of cost 1.
        assert!(close(l.total_load() / p.devices as f64, k as f64));
        let mut device = vec![0; l.len()];
        let mut next_eps_device = k + 1;
        let mut eps_on = 0;
        let mut big = 0;
        for (i, d) in device.iter_mut().enumerate() {
            let c = l.uf[i] + l.ub[i];
            *d = if close(c, k as f64) {
                big += 1;
                big - 1
            } else if close(c, (k - 1) as f64) || close(c, 1.0) && i + 1 == l.len() {
                let d = next_eps_device;
                next_eps_device += 1;
                d.min(2 * k)
            } else {
                eps_on += 1;
                k + 1 + (eps_on - 1) / (2 * k + 1)
            };
        }
        // The cost-1 layer went to the last device; the ε's fill devices k+1..2k−1.
        assert!(close(brute::load_period(&p, &device), k as f64), "k = {k}");
    }
}

#[test]
fn t4_memory_makes_the_gap_unbounded() {
    let l = thesis(&[1.0, 1.0, 1.0, 3.0, 2.0, 2.0, 2.0], &[2, 2, 2, 3, 1, 1, 1]);
    let p = problem(&l, 5, Some(3));
    assert!(close(brute::contiguous(&p).0, 6.0));
    assert!(close(brute::general(&p).0, 3.0));
    let a = madpipe::phase1(&p, 10, madpipe::Grid::default()).unwrap();
    let (_, period) = madpipe::schedule_placement(&p, &a.pipe_stages()).unwrap();
    assert!(close(period, 4.0), "madpipe {period}");
}

/// A small deterministic generator (no dependency needed for a few hundred numbers).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> f64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[test]
fn pipedream_is_the_best_contiguous_partition() {
    let mut rng = Lcg(7);
    for case in 0..200 {
        let n = 2 + (rng.next() * 7.0) as usize;
        let devices = 1 + (rng.next() * 4.0) as usize;
        let uf: Vec<f64> = (0..n).map(|_| 0.5 + rng.next() * 4.0).collect();
        let ub: Vec<f64> = uf.iter().map(|f| f * (1.0 + rng.next())).collect();
        let boundary: Vec<u64> = (0..n).map(|_| (rng.next() * 6.0) as u64).collect();
        let l = Layers::new(uf, ub, vec![1; n], boundary, vec![0; n]);
        let bandwidth = if case % 3 == 0 { f64::INFINITY } else { 1.0 + rng.next() * 3.0 };
        let p = PipeProblem::new(&l, devices, None, bandwidth);
        let (best, _) = brute::contiguous(&p);
        let plan = plan_pipeline(pipe_solver("pipedream").unwrap(), &p).unwrap();
        assert!(close(plan.expected_period.unwrap(), best), "case {case}: DP {:?} vs {best}", plan.expected_period);
        assert!(
            plan.report.period <= best * (1.0 + 1e-9),
            "case {case}: simulated {} above the load-only period {best}",
            plan.report.period
        );
        assert!(plan.report.period >= best * (1.0 - 1e-9), "case {case}: below the load bound");
    }
}

#[test]
fn one_f_one_b_star_fits_where_its_groups_say() {
    // Alg. 7 on random chains: the chosen period's pattern fits, the next smaller
    // candidate's does not, and every stage holds its group's count of activations.
    let mut rng = Lcg(11);
    for case in 0..100 {
        let n = 2 + (rng.next() * 5.0) as usize;
        let uf: Vec<f64> = (0..n).map(|_| 0.5 + rng.next() * 2.0).collect();
        let ub: Vec<f64> = uf.iter().map(|f| 2.0 * f).collect();
        let stored: Vec<u64> = (0..n).map(|_| 1 + (rng.next() * 9.0) as u64).collect();
        let l = Layers::new(uf, ub, stored.clone(), vec![0; n], vec![0; n]);
        let bounds: Vec<usize> = (0..n).collect();
        let all = problem(&l, n, None);
        let memory = stored.iter().map(|s| s * n as u64).max().unwrap() * (3 + case % 5) as u64 / 8;
        let p = problem(&l, n, Some(memory));
        let Some((schedule, _)) = onef1b::best_schedule(&p, &bounds) else {
            // Nothing fits even one activation per stage.
            assert!(stored.iter().any(|&s| s > memory), "case {case}");
            continue;
        };
        let r = pebble_sim::simulate_pipeline(&l, &schedule, &all.sim_config()).unwrap();
        for (i, &peak) in r.peak_bytes_per_device.iter().enumerate() {
            assert_eq!(peak % stored[i], 0, "case {case}");
            assert!(peak <= memory);
        }
    }
}

/// The speed benchmark of issue 14 (docs/benchmarks.md): MadPipe's phase 1 on ResNet-101
/// at 1000×1000, batch 8, P = 8, M = 8 GB, β = 12 GB/s. Run it in release:
/// `cargo test --release -p pebble-solve --test pipeline -- --ignored --nocapture phase1_speed`.
#[test]
#[ignore = "a benchmark: run in release"]
fn phase1_speed() {
    let options = pebble_zoo::ModelOptions {
        batch: Some(8),
        image: Some(1000),
        optimizer: pebble_zoo::Optimizer::Sgd,
        ..Default::default()
    };
    for name in ["resnet50", "resnet101", "densenet121"] {
        let model = pebble_zoo::build(name, &options).unwrap();
        let l = Layers::from_chain(&model.chain);
        for devices in [2, 4, 8] {
            let p = PipeProblem::new(&l, devices, Some(8_000_000_000), 12e9);
            let start = std::time::Instant::now();
            let a = madpipe::phase1(&p, 10, madpipe::Grid::default());
            let secs = start.elapsed().as_secs_f64();
            println!(
                "{name} ({} layers), P = {devices}: phase 1 {secs:.3} s, expected period {:?}",
                l.len(),
                a.map(|a| a.expected_period)
            );
        }
    }
}
