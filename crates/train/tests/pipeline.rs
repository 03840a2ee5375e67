//! Pipelined model parallelism run for real (issue 14): 2- and 4-device plans of `gpt`
//! and `resnet` by 1F1B* and MadPipe, run on worker threads over several micro-batches,
//! give the losses and gradients of single-device training over the same micro-batches,
//! and no worker holds more than the memory the planner was given.
//!
//! Gradients are compared bit for bit, except those of a parameter several ops read (the
//! GPT's tied embedding): its contributions are summed per worker over the micro-batches
//! and then across workers, where one device sums each micro-batch's and then the
//! micro-batches, so the two agree up to rounding (checked to 1e-5 of the gradient's
//! largest entry).

use burn_flex::{Flex, FlexDevice};
use pebble_train::pipeline::{plan, run_planned, PipelineConfig, PipelineError, PipelineReport};
use pebble_zoo::{ModelOptions, Optimizer};

/// The sizes of `gradients.rs`'s GPT; the step updates nothing, so no optimizer state for
/// the planner to count.
fn gpt() -> ModelOptions {
    ModelOptions {
        batch: Some(2),
        seq: Some(16),
        layers: Some(3),
        width: Some(32),
        heads: Some(4),
        optimizer: Optimizer::Sgd,
        ..ModelOptions::default()
    }
}

/// The sizes of `gradients.rs`'s ResNet, no optimizer state.
fn resnet() -> ModelOptions {
    ModelOptions {
        batch: Some(2),
        image: Some(32),
        layers: Some(1),
        width: Some(8),
        optimizer: Optimizer::Sgd,
        ..ModelOptions::default()
    }
}

const MICROBATCHES: usize = 6;

fn config(model: &str, options: ModelOptions, solver: &str, devices: usize, memory: Option<u64>) -> PipelineConfig {
    PipelineConfig {
        model: model.into(),
        options,
        solver: solver.into(),
        devices,
        memory,
        microbatches: MICROBATCHES,
        seed: 7,
        flush: false,
    }
}

/// The largest simulated device peak of the solver's plan, with memory `memory`
/// (`None` if it finds none).
fn max_sim_peak(cfg: &PipelineConfig) -> Option<u64> {
    plan::<Flex>(cfg).ok().map(|p| p.plan.report.peak_bytes_per_device.iter().copied().max().unwrap_or(0))
}

/// A memory limit the plan must respect: halfway between the least the solver fits in
/// (bisected to 1%) and the peak of its plan with unlimited memory.
fn limit(cfg: &PipelineConfig) -> u64 {
    let free = max_sim_peak(&PipelineConfig { memory: None, ..cfg.clone() }).expect("a plan with unlimited memory");
    let fits = |m: u64| max_sim_peak(&PipelineConfig { memory: Some(m), ..cfg.clone() }).is_some();
    let (mut lo, mut hi) = (0u64, free);
    assert!(fits(hi), "{} {}: infeasible at its own unlimited peak {free}", cfg.model, cfg.solver);
    while hi - lo > free / 100 {
        let mid = lo + (hi - lo) / 2;
        if fits(mid) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    let m = hi + (free - hi) / 2;
    if fits(m) {
        m
    } else {
        hi
    }
}

fn run(cfg: &PipelineConfig) -> PipelineReport {
    let planned = plan::<Flex>(cfg).unwrap_or_else(|e| panic!("{} {}: {e}", cfg.model, cfg.solver));
    run_planned::<Flex>(cfg, planned, FlexDevice).unwrap_or_else(|e| panic!("{} {}: {e}", cfg.model, cfg.solver))
}

/// The gradients and losses equal single-device training's, and every worker stays
/// within `memory`.
fn check_equal(r: &PipelineReport, memory: Option<u64>) {
    let tag = format!("{} {} on {} devices", r.model, r.planner, r.schedule.devices.unwrap_or(0));
    assert_eq!(r.losses.len(), MICROBATCHES);
    assert!(r.losses.iter().all(|l| l.is_finite()), "{tag}: losses {:?}", r.losses);
    assert_eq!(r.losses, r.reference_losses, "{tag}: losses");
    assert!(r.reference_grads.iter().any(|g| g.iter().any(|&x| x != 0.0)), "{tag}: all gradients are zero");
    let mut shared_diff = 0.0f32;
    for (q, (a, b)) in r.grads.iter().zip(&r.reference_grads).enumerate() {
        assert_eq!(a.len(), b.len(), "{tag}: gradient of `{}`", r.param_names[q]);
        if r.shared_params.contains(&q) {
            let scale = b.iter().fold(0.0f32, |m, x| m.max(x.abs())).max(f32::MIN_POSITIVE);
            let diff = a.iter().zip(b).fold(0.0f32, |m, (x, y)| m.max((x - y).abs()));
            assert!(diff <= 1e-5 * scale, "{tag}: shared `{}` differs by {diff} (scale {scale})", r.param_names[q]);
            shared_diff = shared_diff.max(diff / scale);
        } else {
            assert!(a == b, "{tag}: gradient of `{}` differs", r.param_names[q]);
        }
    }
    let used = r.workers.iter().filter(|w| w.passes > 0).count();
    println!(
        "{tag}: {} pipeline stages, {used} devices used, {MICROBATCHES} micro-batches, {:.3}s piped vs {:.3}s on \
         one device; shared gradients within {shared_diff:.1e} (relative)",
        r.schedule.stages.len(),
        r.seconds,
        r.reference_seconds
    );
    for w in &r.workers {
        let sim = r.simulated.peak_bytes_per_device[w.device];
        println!(
            "  device {}: stages {:?} (chain {:?}), measured peak {} (tensors {}, static {}), simulated {sim}, \
             ratio {:.3}, limit {memory:?}",
            w.device,
            w.stages,
            w.chain_stages,
            w.peak_bytes,
            w.tensor_peak_bytes,
            w.static_bytes,
            w.peak_bytes as f64 / sim.max(1) as f64
        );
        if let Some(m) = memory {
            assert!(w.peak_bytes <= m, "{tag}: device {} peaks at {} over {m}", w.device, w.peak_bytes);
            assert!(sim <= m, "{tag}: device {} simulated at {sim} over {m}", w.device);
        }
    }
}

fn check(model: &str, options: ModelOptions, solver: &str, devices: usize) {
    let cfg = config(model, options, solver, devices, None);
    let memory = limit(&cfg);
    let cfg = PipelineConfig { memory: Some(memory), ..cfg };
    let r = run(&cfg);
    assert!(r.schedule.periodic, "{model} {solver}: a periodic pattern, run with its fill and drain");
    assert_eq!(r.workers.iter().filter(|w| w.passes > 0).count(), devices, "{model} {solver}: devices used");
    check_equal(&r, Some(memory));
}

#[test]
fn gpt_1f1b_on_2_and_4_devices_matches_one_device() {
    check("gpt", gpt(), "1f1b", 2);
    check("gpt", gpt(), "1f1b", 4);
}

#[test]
fn gpt_madpipe_on_2_and_4_devices_matches_one_device() {
    check("gpt", gpt(), "madpipe", 2);
    check("gpt", gpt(), "madpipe", 4);
}

#[test]
fn resnet_1f1b_on_2_and_4_devices_matches_one_device() {
    check("resnet", resnet(), "1f1b", 2);
    check("resnet", resnet(), "1f1b", 4);
}

#[test]
fn resnet_madpipe_on_2_and_4_devices_matches_one_device() {
    check("resnet", resnet(), "madpipe", 2);
    check("resnet", resnet(), "madpipe", 4);
}

#[test]
fn flushed_schedules_match_one_device() {
    // GPipe, and interleaved 1F1B (two stages per device, sends both ways between the
    // same devices), each one step with a flush.
    for (solver, devices) in [("gpipe", 2), ("interleaved-1f1b", 2), ("1f1b", 4)] {
        let cfg = PipelineConfig { flush: true, ..config("gpt", gpt(), solver, devices, None) };
        let r = run(&cfg);
        assert!(!r.schedule.periodic, "{solver}: a flushed schedule");
        check_equal(&r, None);
    }
}

#[test]
fn a_worker_over_its_memory_fails_the_step() {
    let cfg = config("resnet", resnet(), "1f1b", 2, None);
    let planned = plan::<Flex>(&cfg).expect("plan");
    let low = planned.plan.report.peak_bytes_per_device.iter().copied().min().unwrap() / 2;
    let e = run_planned::<Flex>(&PipelineConfig { memory: Some(low), ..cfg }, planned, FlexDevice).expect_err("fails");
    assert!(matches!(e, PipelineError::Runtime(_)), "{e}");
    assert!(e.to_string().contains(&format!("over its memory of {low} bytes")), "{e}");
}

#[test]
fn split_backwards_are_refused() {
    let cfg = PipelineConfig { flush: true, ..config("gpt", gpt(), "zb-h1", 2, None) };
    let planned = plan::<Flex>(&cfg).expect("plan");
    let e = run_planned::<Flex>(&cfg, planned, FlexDevice).expect_err("refused");
    assert!(e.to_string().contains("whole backwards (B) only"), "{e}");
}
