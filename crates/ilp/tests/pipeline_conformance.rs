//! The pipeline conformance suite, `conformance.rs`'s sibling for the other registry:
//! every registered pipeline solver (those of `pebble-solve` and the MILPs of this crate,
//! which links them all) on shared small fixtures (testkit chains seen as layers), on two
//! and three devices, with free and costly links, periodic and with a flush, at unlimited
//! memory and then at the least peak any solver reached there. Each answer is a plan,
//! `Unsupported`, or `Infeasible` (only under a memory limit); each plan is simulated
//! again here, with no memory limit: its stages cover the layers in chain order on the
//! problem's devices, its report is the plan's, every device peaks within the memory, its
//! period is no shorter than its busiest device's or link's work, and the period its
//! solver expected, if it says one, keeps what that solver's model promises ([`PROMISES`]).
//! A newly registered pipeline solver is covered with no other step.

use std::collections::BTreeMap;
use std::time::Instant;

use pebble_graph::Layers;
// Linked for its registrations (`pipeline-ilp`, `madpipe`), as the CLI links it.
use pebble_ilp as _;
use pebble_schedule::Schedule;
use pebble_sim::{simulate_pipeline, PipeConfig};
use pebble_solve::pipeline::{pipe_registry, pipe_solver, plan_pipeline, PipeError, PipePlan, PipeProblem, PipeSolver};
use pebble_testkit::{gpt, hand_chain, random_chain, weighty_chain, Rng};

/// Relative slack between periods that sum the same times in another order.
const REL: f64 = 1e-9;

/// Relative slack on an ILP's period (HiGHS's tolerances), as `pipeline_ilp.rs` allows.
const ILP_REL: f64 = 1e-6;

/// What a solver's own period (`PipeSolution::expected_period`) promises of the simulated
/// one. Every such period is at least [`work_floor`]; a solver that reports one must be
/// listed in [`PROMISES`], so that a new one says what its number means.
#[derive(Debug, Clone, Copy)]
enum Promise {
    /// The schedule runs at most at it: an ILP's pattern, whose constraints hold its
    /// period (the incumbent's, when HiGHS stops at the time limit).
    Bound,
    /// It is the load-only period of the schedule's own placement ([`load_only_period`]),
    /// which the schedule cannot beat: PipeDream's DP, whose partition 1F1B\* schedules.
    LoadOnly,
    /// An estimate for an allocation the solver may not keep (MadPipe's phase 1: its
    /// special device's activations underestimated on purpose, its load rounded up, and
    /// 1F1B\* on other allocations kept where it runs faster): nothing beyond the floor.
    Estimate,
}

const PROMISES: [(&str, Promise); 3] =
    [("madpipe", Promise::Estimate), ("pipedream", Promise::LoadOnly), ("pipeline-ilp", Promise::Bound)];

struct Fixture {
    name: &'static str,
    layers: Layers,
}

fn fixtures() -> Vec<Fixture> {
    let mut rng = Rng::new(0x91be_11e5);
    let fixture = |name, chain| Fixture { name, layers: Layers::from_chain(&chain) };
    vec![
        // Three layers of distinct times and sizes, worked out by hand elsewhere.
        fixture("hand", hand_chain()),
        // Random integer sizes and times; then weights that dominate the activations (and
        // a weight-gradient half of each backward for Zero Bubble's `W`).
        fixture("random-5", random_chain(&mut rng, 5)),
        fixture("weighty-5", weighty_chain(&mut rng, 5)),
        // A zoo model's blocks, sizes in bytes and times in seconds.
        fixture("gpt-1", gpt(1, 16, 8).chain),
    ]
}

/// The devices, whether links take time, and the micro-batches of a flush (`None`: each
/// solver chooses, and `1f1b` is the periodic 1F1B\*).
#[derive(Debug, Clone, Copy)]
struct Setting {
    devices: usize,
    links: bool,
    microbatches: Option<usize>,
}

const SETTINGS: [Setting; 3] = [
    Setting { devices: 2, links: false, microbatches: None },
    Setting { devices: 3, links: true, microbatches: None },
    Setting { devices: 2, links: true, microbatches: Some(4) },
];

fn problem(layers: &Layers, setting: Setting, memory: Option<u64>) -> PipeProblem<'_> {
    let bandwidth = if setting.links { link_bandwidth(layers) } else { f64::INFINITY };
    PipeProblem {
        microbatches: setting.microbatches,
        time_limit: 5.0,
        ..PipeProblem::new(layers, setting.devices, memory, bandwidth)
    }
}

/// A bandwidth at which an average boundary takes a quarter of an average layer's load
/// on its link, each way.
fn link_bandwidth(l: &Layers) -> f64 {
    let bytes = l.boundary.iter().sum::<u64>() as f64;
    if bytes == 0.0 {
        f64::INFINITY
    } else {
        4.0 * bytes / l.total_load()
    }
}

/// The load-only period of a schedule's placement: per micro-batch, the work of its
/// busiest device (the `F` and `B` of every layer of its stages) or link (each boundary
/// between consecutive stages on two devices, both ways: `PipeProblem::comm`).
fn load_only_period(problem: &PipeProblem<'_>, schedule: &Schedule) -> f64 {
    let l = problem.layers;
    let mut device = vec![0.0; problem.devices];
    let mut link: BTreeMap<(usize, usize), f64> = BTreeMap::new();
    for (k, st) in schedule.stages.iter().enumerate() {
        device[st.device] += l.load(st.first, st.last);
        if let Some(next) = schedule.stages.get(k + 1).filter(|next| next.device != st.device) {
            *link.entry((st.device.min(next.device), st.device.max(next.device))).or_default() += problem.comm(st.last);
        }
    }
    device.into_iter().chain(link.into_values()).fold(0.0, f64::max)
}

/// What no placement beats: the average load over the devices, and the heaviest layer.
fn work_floor(problem: &PipeProblem<'_>) -> f64 {
    let l = problem.layers;
    (0..l.len()).map(|i| l.load(i, i)).fold(l.total_load() / problem.devices as f64, f64::max)
}

/// The conformance check of one plan of the solver called `solver`.
fn check(problem: &PipeProblem<'_>, solver: &str, plan: &PipePlan) -> Result<(), String> {
    let schedule = &plan.schedule;
    let n = problem.layers.len();
    let mut next = 0;
    for st in &schedule.stages {
        if st.first != next || st.last < st.first || st.last >= n {
            return Err(format!("stage {st:?} where layer {next} of {n} comes next"));
        }
        if st.device >= problem.devices {
            return Err(format!("stage {st:?} on a device beyond the {}", problem.devices));
        }
        next = st.last + 1;
    }
    if next != n {
        return Err(format!("the stages end before layer {next} of {n}"));
    }
    let config = PipeConfig { memory: None, ..problem.sim_config() };
    let r = simulate_pipeline(problem.layers, schedule, &config)
        .map_err(|e| format!("the simulator rejects it with no memory limit: {e}"))?;
    if r.period != plan.report.period || r.peak_bytes_per_device != plan.report.peak_bytes_per_device {
        return Err(format!(
            "simulated again: period {}, peaks {:?}; the plan says {}, {:?}",
            r.period, r.peak_bytes_per_device, plan.report.period, plan.report.peak_bytes_per_device
        ));
    }
    if let Some(m) = problem.memory {
        if let Some((d, peak)) = r.peak_bytes_per_device.iter().enumerate().find(|&(_, &peak)| peak > m) {
            return Err(format!("device {d} peaks at {peak}, above the memory {m}"));
        }
    }
    let load = load_only_period(problem, schedule);
    if r.period < load * (1.0 - REL) {
        return Err(format!("period {} below its placement's load-only {load}", r.period));
    }
    let Some(expected) = plan.expected_period else { return Ok(()) };
    let promise = PROMISES
        .iter()
        .find(|(name, _)| *name == solver)
        .map(|&(_, promise)| promise)
        .ok_or_else(|| format!("expects {expected}, and PROMISES does not say what that means"))?;
    let floor = work_floor(problem);
    let kept = expected >= floor * (1.0 - REL)
        && match promise {
            Promise::Bound => r.period <= expected * (1.0 + ILP_REL) + 1e-9,
            Promise::LoadOnly => (expected - load).abs() <= REL * load,
            Promise::Estimate => true,
        };
    if !kept {
        return Err(format!(
            "expects {expected} ({promise:?}): simulated {}, load-only {load}, floor {floor}",
            r.period
        ));
    }
    Ok(())
}

/// What the suite saw: plans per solver, `Infeasible` answers, expected periods per
/// solver, and every failure.
#[derive(Default)]
struct Outcome {
    plans: BTreeMap<&'static str, usize>,
    infeasible: usize,
    expected: BTreeMap<&'static str, usize>,
    failures: Vec<String>,
}

/// Every registered pipeline solver on every fixture and setting: first with unlimited
/// memory, then with the least peak some solver reached there (so that some fit it and
/// others must adapt or answer `Infeasible`).
fn run_suite() -> Outcome {
    let solvers = pipe_registry();
    let mut out = Outcome::default();
    for solver in &solvers {
        out.plans.insert(solver.name(), 0);
    }
    for fx in fixtures() {
        for setting in SETTINGS {
            if let Some(least) = run_problem(&solvers, &fx, setting, None, &mut out) {
                run_problem(&solvers, &fx, setting, Some(least), &mut out);
            }
        }
    }
    out
}

/// Every solver of `solvers` on one problem, its answers checked into `out`: the least
/// peak of their plans (the largest peak of a plan's devices), if any plans.
fn run_problem(
    solvers: &[&dyn PipeSolver],
    fx: &Fixture,
    setting: Setting,
    memory: Option<u64>,
    out: &mut Outcome,
) -> Option<u64> {
    let p = problem(&fx.layers, setting, memory);
    let mut least = None;
    for solver in solvers {
        let name = solver.name();
        let at = format!("{name} on {} ({setting:?}, memory {memory:?})", fx.name);
        let start = Instant::now();
        let answer = plan_pipeline(*solver, &p);
        let seconds = start.elapsed().as_secs_f64();
        match answer {
            Ok(plan) => {
                eprintln!("{at}: period {} in {seconds:.2} s", plan.report.period);
                if let Err(e) = check(&p, name, &plan) {
                    out.failures.push(format!("{at}: {e}"));
                    continue;
                }
                *out.plans.get_mut(name).expect("registered") += 1;
                if plan.expected_period.is_some() {
                    *out.expected.entry(name).or_default() += 1;
                }
                let peak = plan.report.peak_bytes_per_device.iter().copied().max().unwrap_or(0);
                least = Some(least.map_or(peak, |m: u64| m.min(peak)));
            }
            Err(e) => {
                eprintln!("{at}: {e} ({seconds:.2} s)");
                match e {
                    PipeError::Unsupported { .. } => {}
                    PipeError::Infeasible { .. } if memory.is_some() => out.infeasible += 1,
                    e => out.failures.push(format!("{at}: {e}")),
                }
            }
        }
    }
    least
}

#[test]
fn every_registered_pipeline_solver_conforms_on_every_fixture() {
    let out = run_suite();
    assert!(out.failures.is_empty(), "{} failures:\n{}", out.failures.len(), out.failures.join("\n"));
    for (name, plans) in &out.plans {
        eprintln!("{name}: {plans} plans, {} with an expected period", out.expected.get(name).unwrap_or(&0));
    }
    // Both crates' registrations are linked in.
    for name in ["1f1b", "gpipe", "interleaved-1f1b", "madpipe", "pipedream", "pipeline-ilp", "zb-h1", "zb-v"] {
        assert!(out.plans.contains_key(name), "{name} is not registered");
    }
    // Not vacuous: every solver plans somewhere (most of the 24 problems), the limited
    // memory binds for some, and every promise is put to the test.
    let total: usize = out.plans.values().sum();
    assert!(total >= 100, "only {total} plans");
    let idle: Vec<_> = out.plans.iter().filter(|&(_, &n)| n < 4).collect();
    assert!(idle.is_empty(), "solvers with fewer than 4 plans: {idle:?}");
    assert!(out.infeasible > 0, "the limited memory never binds");
    for (name, _) in PROMISES {
        assert!(
            out.expected.get(name).is_some_and(|&n| n >= 4),
            "{name}'s promise is barely tested: {:?}",
            out.expected
        );
    }
}

/// The check above can fail: a stage on a device the problem lacks, a memory one byte
/// short, a report that is not the simulator's, and each promise broken.
#[test]
fn the_check_catches_broken_plans() {
    let layers = Layers::from_chain(&hand_chain());
    let setting = Setting { devices: 2, links: true, microbatches: None };
    let p = problem(&layers, setting, None);
    let plan = plan_pipeline(pipe_solver("pipedream").expect("registered"), &p).expect("plans");
    check(&p, "pipedream", &plan).expect("conforms");
    let fails = |p: &PipeProblem<'_>, solver: &str, plan: &PipePlan, what: &str| {
        let e = check(p, solver, plan).expect_err(what);
        assert!(e.contains(what), "{e}");
    };
    let mut off = plan.clone();
    off.schedule.stages[1].device = 2;
    fails(&p, "pipedream", &off, "beyond the 2");
    let peak = *plan.report.peak_bytes_per_device.iter().max().expect("devices");
    fails(&problem(&layers, setting, Some(peak - 1)), "pipedream", &plan, "above the memory");
    let mut faster = plan.clone();
    faster.report.period /= 2.0;
    fails(&p, "pipedream", &faster, "the plan says");
    // The period it expects, against each promise.
    let period = plan.report.period;
    let expecting = |expected: f64| PipePlan { expected_period: Some(expected), ..plan.clone() };
    fails(&p, "1f1b", &expecting(period), "PROMISES");
    fails(&p, "pipedream", &expecting(period * 1.5), "LoadOnly");
    fails(&p, "pipeline-ilp", &expecting(period * 0.9), "Bound");
    check(&p, "pipeline-ilp", &expecting(period * 1.1)).expect("an upper bound");
    fails(&p, "madpipe", &expecting(work_floor(&p) * 0.9), "Estimate");
}
