//! `pebble train` as a library call: build a zoo model, plan it under a budget with one
//! solver, run the plan for some steps, and report measured against simulated.

use std::time::Instant;

use pebble_graph::{partition, Chain, TrainingGraph};
use pebble_machine::{Link, Machine, Profile, RuntimeOverhead};
use pebble_runtime::exec::Exec;
use pebble_runtime::profile::median;
use pebble_runtime::{Backend, LinkSpeed, OptimizerKind, RuntimeError, Session, StageTemporaries, TransferOptions};
use pebble_schedule::View;
use pebble_solve::budget::{total_for, Budget, BudgetRequest};
use pebble_solve::policy::replay::{replay_into, Replayed};
use pebble_solve::policy::Policy;
use pebble_solve::{PlanError, Problem, SolveError, SolveOptions, Solver};
use pebble_zoo::{ModelOptions, Network, OpCosts, ZooError};
use serde::Serialize;

use crate::TrainError;

/// Where the planner's op costs come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Costs {
    /// The zoo's roofline model and declared temporaries.
    Analytic,
    /// Measured on this device by the profiler before planning.
    Profiled,
    /// Profiled, then each stage's forward and backward timed in store-all steps on this
    /// device, as rotor's estimator times its modules in sequence: the ops' times are the
    /// profiler's, scaled stage by stage to what the steps measured ([`lower_timed`]).
    Steps,
}

/// What to train, how.
#[derive(Debug, Clone)]
pub struct TrainConfig {
    /// Zoo model name.
    pub model: String,
    /// Its options (batch, image, seq, layers, width, heads).
    pub options: ModelOptions,
    /// The budget, resolved against store-all's simulated peak by the profile's runtime
    /// overhead ([`BudgetRequest::resolve`]).
    pub budget: BudgetRequest,
    /// The solver's name.
    pub solver: String,
    /// `solver` names a run-time policy (`pebble_solve::policy::NAMES`) that decides
    /// inside each step as it runs ([`drive_policy`]); the offline replay of the same
    /// policy, whose decisions are the same, gives the prediction.
    pub online: bool,
    /// Steps to run.
    pub steps: usize,
    /// Seed of parameters, data and dropout.
    pub seed: u64,
    /// The optimizer.
    pub optimizer: OptimizerKind,
    /// Where the planner's costs come from.
    pub costs: Costs,
    /// Solver options (slots, time limit, and the machine the solver and the simulator
    /// plan for: `options.profile.machine`, as the other commands pass it).
    pub solve: SolveOptions,
}

/// What a run measured, beside what the simulator predicted.
#[derive(Debug, Clone, Serialize)]
pub struct TrainReport {
    /// The model.
    pub model: String,
    /// The solver.
    pub solver: String,
    /// The view the solver planned on.
    pub view: &'static str,
    /// The backend and device.
    pub device: String,
    /// Parameters.
    pub params: u64,
    /// The budget, in bytes: everything resident, the executor's reserve included.
    pub budget_bytes: u64,
    /// The part of the budget the solver planned in (`budget_bytes − reserve_bytes`).
    pub planned_bytes: u64,
    /// The part of the budget the executor keeps for what schedules do not name.
    pub reserve_bytes: u64,
    /// The profile's runtime overhead the reserve comes from.
    pub runtime_overhead: RuntimeOverhead,
    /// Parameters, their gradients and the optimizer's state, in bytes.
    pub static_bytes: u64,
    /// The loss of each step, before its update.
    pub losses: Vec<f32>,
    /// Wall-clock seconds of each step: forward, backward and the optimizer step (inside
    /// the backwards and on the host CPU for a schedule that moves weights, at the end for
    /// the others).
    pub step_seconds: Vec<f64>,
    /// The largest peak of live bytes over the steps, after one unmeasured warm-up pass
    /// (`null` where nothing counts them); host copies of offloaded tensors excepted.
    pub measured_peak_bytes: Option<u64>,
    /// The largest peak of host copies over the steps (`null` where nothing counts them).
    pub measured_host_peak_bytes: Option<u64>,
    /// Seconds the device→host link was busy in each step (offloads, throttled to the
    /// machine's link).
    pub d2h_busy: Vec<f64>,
    /// Seconds the host→device link was busy in each step (prefetches).
    pub h2d_busy: Vec<f64>,
    /// Seconds the compute stream waited for prefetches or for device memory in each step.
    pub compute_stall: Vec<f64>,
    /// The simulator's peak for the schedule.
    pub predicted_peak_bytes: u64,
    /// The simulator's peak of host memory for the schedule.
    pub predicted_host_peak_bytes: u64,
    /// The simulator's time for the schedule (seconds, by the planner's costs).
    pub predicted_time: f64,
    /// The simulator's time for the same schedule on the compute times this run
    /// measured (each stage's forward and backward: the median over the steps after the
    /// first), links and optimizer rate unchanged: what is left of the step-time error
    /// once the profile's own error is taken out (chain schedules; `None` otherwise).
    pub replayed_time: Option<f64>,
    /// The simulator's peak for the same replay: where transfers overlap compute, the
    /// peak depends on how long the compute takes beside the link, and a CPU standing in
    /// for the profile's device computes slower than its roofline (chain schedules;
    /// `None` otherwise).
    pub replayed_peak_bytes: Option<u64>,
    /// The simulator's device→host busy time.
    pub predicted_d2h_busy: f64,
    /// The simulator's host→device busy time.
    pub predicted_h2d_busy: f64,
    /// The simulator's compute stall.
    pub predicted_compute_stall: f64,
    /// The simulator's peak for store-all.
    pub store_all_predicted_peak_bytes: u64,
    /// The simulator's time for store-all.
    pub store_all_predicted_time: f64,
    /// Ops in the schedule.
    pub schedule_ops: usize,
    /// Seconds the solver took.
    pub solve_seconds: f64,
    /// Seconds the profiler took (0 with analytic costs).
    pub profile_seconds: f64,
    /// Whether a run-time policy decided inside each step (`--policy`) rather than a plan.
    pub online: bool,
    /// What the schedule that ran does in each step: offloads, reloads (prefetches) and
    /// recomputations (compute ops beyond the first of each node or stage).
    pub offloads: usize,
    /// Reloads (prefetches) per step.
    pub reloads: usize,
    /// Recomputations per step.
    pub recomputes: usize,
    /// Evictions per step, for a run-time policy (`null` for a plan).
    pub evictions: Option<usize>,
    /// The device's optimizer speed planned with, bytes of gradient per second: measured
    /// with profiled costs, the profile's otherwise (`null`: the update is not timed).
    pub device_optimizer_rate: Option<f64>,
    /// The host CPU's optimizer speed planned with: measured with profiled costs, the
    /// profile's otherwise.
    pub host_optimizer_rate: f64,
}

/// A model lowered for one backend, with the costs the planner will use.
pub struct Lowered {
    /// The network (integers sized as the backend stores them).
    pub network: Network,
    /// Its training graph.
    pub graph: TrainingGraph,
    /// Where each tensor landed in the graph.
    pub index: pebble_zoo::GraphIndex,
    /// Its chain.
    pub chain: Chain,
}

/// Builds `name` from the zoo and lowers it with `costs` (the profile's roofline when
/// `None`). The profile's integer width must be the one `B` stores integers in, so that
/// what the planner counts is what the executor allocates.
pub fn lower<B: Backend>(
    name: &str,
    options: &ModelOptions,
    costs: Option<&dyn OpCosts>,
) -> Result<Lowered, TrainError> {
    check_int_width::<B>(&options.profile)?;
    // The ops' temporaries as this backend allocates them, unless the caller says whose.
    let temporaries = options.temporaries.or(Some(pebble_runtime::backend::temporaries::<B>()));
    let options = &ModelOptions { temporaries, ..options.clone() };
    let network = pebble_zoo::build(name, options)?.network;
    let analytic = pebble_zoo::CostModel { profile: options.profile.clone() };
    let costs: &dyn OpCosts = costs.unwrap_or(&analytic);
    let (graph, index) = network.training_graph_indexed(costs, options.optimizer);
    let chain = partition::to_chain(&graph).map_err(|error| ZooError::Graph { model: name.to_string(), error })?;
    Ok(Lowered { network, graph, index, chain })
}

/// [`lower`] on costs the profiler measures on `device` (seeded `seed`).
pub fn lower_profiled<B: Backend>(
    name: &str,
    options: &ModelOptions,
    seed: u64,
    device: &B::Device,
) -> Result<Lowered, TrainError> {
    profiled::<B>(name, options, seed, device).map(|(_, lowered)| lowered)
}

/// The profiler's costs of `name`'s ops on `device`, and the model lowered on them.
fn profiled<B: Backend>(
    name: &str,
    options: &ModelOptions,
    seed: u64,
    device: &B::Device,
) -> Result<(pebble_runtime::profile::Profile, Lowered), TrainError> {
    let first = lower::<B>(name, options, None)?;
    let net = &first.network;
    let largest = net.tensors.iter().map(|t| net.bytes(&t.shape, t.elem)).max().unwrap_or(0);
    crate::check_device_holds("profiling the model's largest tensor", largest)?;
    let profile = pebble_runtime::profile::profile::<B>(&first.network, device, seed)?;
    drop(first);
    let lowered = lower::<B>(name, options, Some(&profile))?;
    Ok((profile, lowered))
}

/// Store-all steps [`lower_timed`] runs; the first is left out of the medians.
pub const TIMED_STEPS: usize = 6;

/// [`lower_profiled`], then each stage's forward and backward timed in
/// [`TIMED_STEPS`] store-all steps of `optimizer` on `device` (medians, the first step
/// left out): the profile's ops scaled to those stage times
/// ([`Profile::scaled_to_stages`](pebble_runtime::profile::Profile::scaled_to_stages)),
/// so that the chain and the graph both carry the times the ops take inside a step,
/// where the profiler times each alone. Temporary memory stays the profiler's.
pub fn lower_timed<B: Backend>(
    name: &str,
    options: &ModelOptions,
    optimizer: OptimizerKind,
    seed: u64,
    device: &B::Device,
) -> Result<Lowered, TrainError> {
    let (profile, profiled) = profiled::<B>(name, options, seed, device)?;
    let schedule = pebble_solve::baseline::store_all::store_all_schedule(Problem::Chain(&profiled.chain));
    let store_all = pebble_solve::simulate(Problem::Chain(&profiled.chain), &schedule, &Default::default())
        .map_err(TrainError::StoreAll)?;
    crate::check_device_holds("timing store-all steps (--costs steps)", store_all.peak_bytes)?;
    let mut session =
        Session::<B>::new(profiled.network.clone(), profiled.index.clone(), optimizer, seed, device.clone());
    session.set_transfers(TransferOptions { time_ops: true, ..TransferOptions::default() });
    let mut op_seconds = Vec::with_capacity(TIMED_STEPS);
    for _ in 0..TIMED_STEPS {
        op_seconds.push(session.step(&schedule)?.op_seconds);
    }
    drop(session);
    let measured = measured_chain(&profiled.chain, &schedule, &op_seconds)
        .expect("store-all steps time every op of their schedule");
    let stage_of = pebble_runtime::Program::new(profiled.network.clone()).stage_of;
    let timed = profile.scaled_to_stages(&stage_of, &profiled.chain, &measured);
    lower::<B>(name, options, Some(&timed))
}

/// Checks that `profile` plans integers as wide as `B` stores them.
fn check_int_width<B: Backend>(profile: &Profile) -> Result<(), TrainError> {
    let backend = std::mem::size_of::<B::IntElem>() as u64;
    let planned = profile.machine.runtime.int_bytes;
    if backend != planned {
        return Err(TrainError::IntWidth { profile: profile.name.clone(), planned, backend });
    }
    Ok(())
}

/// Plans `problem` with `solver` in `budget`'s planned share; when nothing fits, finds
/// the least total budget that does.
pub(crate) fn plan_within(
    solver: &dyn Solver,
    problem: Problem<'_>,
    budget: &Budget,
    solve: &SolveOptions,
    overhead: &RuntimeOverhead,
) -> Result<pebble_solve::Plan, TrainError> {
    match pebble_solve::plan(solver, problem, budget.planned_bytes, solve) {
        Ok(plan) => Ok(plan),
        Err(PlanError::Solve(SolveError::Infeasible { .. })) => {
            let min = pebble_solve::min_feasible_budget(solver, problem, solve)
                .map_err(|e| TrainError::plan(solver.name(), e))?;
            Err(TrainError::Infeasible {
                solver: solver.name().to_string(),
                budget: budget.total_bytes,
                min_budget: min.map(|planned| total_for(planned, overhead)),
            })
        }
        Err(e) => Err(TrainError::plan(solver.name(), e)),
    }
}

/// The executor's transfer options for `machine`'s links and host CPU, with the device
/// pool capped at `cap` bytes.
pub fn transfer_options(machine: &Machine, cap: Option<u64>) -> TransferOptions {
    let speed = |l: &Link| LinkSpeed { bandwidth: l.bandwidth, latency: l.latency };
    TransferOptions {
        d2h: speed(&machine.d2h),
        h2d: speed(&machine.h2d),
        device_cap: cap,
        host_cap: None,
        cpu_rate: machine.cpu_optimizer_rate,
        time_ops: false,
        prefetch_gates: Default::default(),
    }
}

/// Each prefetch of `plan` held until the compute op the simulator ran before it has
/// taken its memory ([`SimReport::prefetch_gates`](pebble_sim::SimReport::prefetch_gates)):
/// the plan's simulation at `budget` again, with its spans.
pub fn prefetch_gates(
    problem: Problem<'_>,
    plan: &pebble_solve::Plan,
    budget: u64,
    solve: &SolveOptions,
) -> std::sync::Arc<std::collections::HashMap<usize, usize>> {
    let prefetches = plan.schedule.ops.iter().any(|op| matches!(op, pebble_schedule::Op::Prefetch { .. }));
    if !prefetches {
        return Default::default();
    }
    let config = pebble_sim::SimConfig { budget: Some(budget), timeline: true, ..solve.sim_config() };
    let report = pebble_solve::simulate(problem, &plan.schedule, &config);
    std::sync::Arc::new(report.map(|r| r.prefetch_gates().into_iter().collect()).unwrap_or_default())
}

/// A [`Drive`](pebble_runtime::exec::Drive) that runs `policy` on `graph` under
/// `budget`, each op executed as soon as the policy decides it; what it ran lands in
/// `logged`.
pub fn drive_policy<'a>(
    graph: &'a TrainingGraph,
    budget: u64,
    policy: &'a dyn Policy,
    logged: &'a mut Option<Replayed>,
) -> impl FnMut(&mut Exec<'_>) -> Result<(), RuntimeError> + 'a {
    move |exec| {
        let mut failure = None;
        let mut sink = |op: &pebble_schedule::Op| match exec(op) {
            Ok(()) => true,
            Err(e) => {
                failure = Some(e);
                false
            }
        };
        let replayed = replay_into(graph, budget, policy, &mut sink);
        if let Some(e) = failure {
            return Err(e);
        }
        let replayed =
            replayed.map_err(|e| RuntimeError::Schedule { index: 0, op: policy.name().into(), why: e.to_string() })?;
        *logged = Some(replayed);
        Ok(())
    }
}

/// Plans and runs `config` on `device`.
pub fn train<B: Backend>(config: &TrainConfig, device: B::Device) -> Result<TrainReport, TrainError> {
    let solver = pebble_solve::solver(&config.solver)?;
    let mut options = config.options.clone();
    options.optimizer = config.optimizer.planner();
    let overhead = options.profile.machine.runtime;
    let (lowered, solve, profile_seconds) = lower_costed::<B>(config, &options, &device)?;
    let view = solver.views().first().copied().unwrap_or(View::Chain);
    let problem = match view {
        // No solver of `train` plans a pipeline (those run under `pebble pipeline`).
        View::Chain | View::Pipeline => Problem::Chain(&lowered.chain),
        View::Graph => Problem::Graph(&lowered.graph),
    };
    let store_all = pebble_solve::baseline::store_all::simulate_store_all(problem, &solve.sim_config())
        .map_err(TrainError::StoreAll)?;
    let static_bytes = lowered.graph.static_bytes();
    // Percentages are of what store-all needs to run: its simulated peak plus the reserve.
    let budget = config.budget.resolve(store_all.peak_bytes, static_bytes, &overhead);
    let plan = plan_within(solver, problem, &budget, &solve, &overhead)?;
    // On the CPU the host copies share the device's memory.
    crate::check_device_holds("the plan", plan.report.peak_bytes.saturating_add(plan.report.peak_host_bytes))?;
    let params = lowered.network.param_count();
    let mut session = Session::<B>::new(lowered.network, lowered.index, config.optimizer, config.seed, device);
    // Transfers go at the speed of the machine planned for, and the device pool holds the
    // schedule to its simulated peak (within what the solver planned in): an op that
    // would go above it waits for the offloads the simulator had done by then, so a link
    // that lags behind its nominal speed costs time, not memory.
    let cap = plan.report.peak_bytes.min(budget.planned_bytes);
    // Likewise the host's copies, at the simulated host peak: an offload waits for the
    // host CPU's updates the simulator has done by then.
    let host_cap = (plan.report.peak_host_bytes > 0).then_some(plan.report.peak_host_bytes);
    let prefetch_gates = prefetch_gates(problem, &plan, budget.planned_bytes, &solve);
    let options =
        TransferOptions { host_cap, time_ops: true, prefetch_gates, ..transfer_options(&solve.machine, Some(cap)) };
    session.set_transfers(options);
    session.set_temporaries(StageTemporaries::of_views(&lowered.chain, &lowered.graph));
    // One unmeasured pass first, without an update (the losses stay those of the steps):
    // what the backend allocates once and keeps (kernel caches, thread pools) is not the
    // schedule's memory. The profiler does the same for `Costs::Profiled`.
    if config.steps > 0 {
        drop(session.gradients(&plan.schedule)?);
    }
    let policy = online_policy(config, &solve)?;
    let run = Steps { graph: &lowered.graph, schedule: &plan.schedule, budget: budget.planned_bytes };
    let m = run.measure(config, &mut session, policy.as_deref())?;
    let moves = plan.schedule.moves();
    let replayed = match problem {
        Problem::Chain(chain) => {
            replay_on_measured(chain, &plan.schedule, &m.op_seconds, &solve, Some(budget.planned_bytes))
        }
        Problem::Graph(_) => None,
    };
    let (replayed_time, replayed_peak_bytes) = (replayed.as_ref().map(|r| r.makespan), replayed.map(|r| r.peak_bytes));
    Ok(TrainReport {
        model: config.model.clone(),
        solver: solver.name().to_string(),
        view: match view {
            View::Chain | View::Pipeline => "chain",
            View::Graph => "graph",
        },
        device: B::name(session.device()),
        params,
        budget_bytes: budget.total_bytes,
        planned_bytes: budget.planned_bytes,
        reserve_bytes: budget.reserve_bytes,
        runtime_overhead: overhead,
        static_bytes,
        losses: m.losses,
        step_seconds: m.step_seconds,
        measured_peak_bytes: m.peak,
        measured_host_peak_bytes: m.host_peak,
        d2h_busy: m.d2h_busy,
        h2d_busy: m.h2d_busy,
        compute_stall: m.compute_stall,
        predicted_peak_bytes: plan.report.peak_bytes,
        predicted_host_peak_bytes: plan.report.peak_host_bytes,
        predicted_time: plan.report.makespan,
        replayed_time,
        replayed_peak_bytes,
        predicted_d2h_busy: plan.report.d2h_busy,
        predicted_h2d_busy: plan.report.h2d_busy,
        predicted_compute_stall: plan.report.compute_stall,
        store_all_predicted_peak_bytes: store_all.peak_bytes,
        store_all_predicted_time: store_all.makespan,
        schedule_ops: plan.schedule.ops.len(),
        solve_seconds: plan.solve_seconds,
        profile_seconds,
        online: config.online,
        offloads: moves.offloads,
        reloads: moves.reloads,
        recomputes: moves.recomputes,
        evictions: m.evictions,
        device_optimizer_rate: solve.machine.gpu_optimizer_rate,
        host_optimizer_rate: solve.machine.cpu_optimizer_rate,
    })
}

/// The model lowered on `config`'s costs, the solver options with the optimizer rates
/// profiled where the costs are (on the device, the update the simulator charges to each
/// backward; on the host CPU, its updates of offloaded stages), and the seconds profiling
/// took.
fn lower_costed<B: Backend>(
    config: &TrainConfig,
    options: &ModelOptions,
    device: &B::Device,
) -> Result<(Lowered, SolveOptions, f64), TrainError> {
    let mut solve = config.solve.clone();
    let start = Instant::now();
    let lowered = match config.costs {
        Costs::Analytic => return Ok((lower::<B>(&config.model, options, None)?, solve, 0.0)),
        Costs::Profiled => lower_profiled::<B>(&config.model, options, config.seed, device)?,
        Costs::Steps => lower_timed::<B>(&config.model, options, config.optimizer, config.seed, device)?,
    };
    let rates = pebble_runtime::profile::optimizer_rates::<B>(&lowered.network, config.optimizer, device, config.seed)?;
    solve.machine.gpu_optimizer_rate = Some(rates.device);
    solve.machine.cpu_optimizer_rate = rates.host;
    Ok((lowered, solve, start.elapsed().as_secs_f64()))
}

/// The run-time policy `config` runs online, if it does.
fn online_policy(config: &TrainConfig, solve: &SolveOptions) -> Result<Option<Box<dyn Policy>>, TrainError> {
    if !config.online {
        return Ok(None);
    }
    pebble_solve::policy::policy(&config.solver, solve.machine.d2h.bandwidth).map(Some).map_err(|e| {
        TrainError::Solver {
            solver: config.solver.clone(),
            error: SolveError::Unsupported { solver: "train", why: e.to_string() },
        }
    })
}

/// What the steps of a run measured.
#[derive(Default)]
struct Measured {
    losses: Vec<f32>,
    step_seconds: Vec<f64>,
    d2h_busy: Vec<f64>,
    h2d_busy: Vec<f64>,
    compute_stall: Vec<f64>,
    op_seconds: Vec<Vec<f64>>,
    peak: Option<u64>,
    host_peak: Option<u64>,
    evictions: Option<usize>,
}

/// The steps of a run: the plan's schedule, or a policy deciding online within `budget`.
struct Steps<'a> {
    graph: &'a TrainingGraph,
    schedule: &'a pebble_schedule::Schedule,
    budget: u64,
}

impl Steps<'_> {
    /// Runs `config.steps` steps on `session` and measures them. A policy that decides
    /// differently online than offline is an error.
    fn measure<B: Backend>(
        &self,
        config: &TrainConfig,
        session: &mut Session<B>,
        policy: Option<&dyn Policy>,
    ) -> Result<Measured, TrainError> {
        let mut m = Measured::default();
        for _ in 0..config.steps {
            let r = match policy {
                Some(p) => {
                    let mut logged = None;
                    let report = {
                        let mut drive = drive_policy(self.graph, self.budget, p, &mut logged);
                        session.step_driven(&mut drive)?
                    };
                    let logged = logged.expect("a step that ran logged its ops");
                    m.evictions = Some(logged.counts.evictions);
                    if logged.schedule.ops != self.schedule.ops {
                        return Err(TrainError::Runtime(RuntimeError::Schedule {
                            index: 0,
                            op: config.solver.clone(),
                            why: "the policy decided differently online than offline".into(),
                        }));
                    }
                    report
                }
                None => session.step(self.schedule)?,
            };
            m.losses.push(r.loss);
            m.step_seconds.push(r.seconds);
            m.d2h_busy.push(r.transfers.d2h_busy);
            m.h2d_busy.push(r.transfers.h2d_busy);
            m.compute_stall.push(r.transfers.compute_stall);
            m.op_seconds.push(r.op_seconds);
            m.peak = m.peak.max(r.peak_bytes);
            m.host_peak = m.host_peak.max(r.host_peak_bytes);
        }
        Ok(m)
    }
}

/// The simulation of chain schedule `schedule` on `chain` with each stage's forward
/// and backward time replaced by the median of what the steps measured (`op_seconds`,
/// one entry per step and schedule op; the first step left out where there are more),
/// under `budget` as the plan was simulated. `None` where nothing was measured or the
/// simulator rejects the schedule.
pub fn replay_on_measured(
    chain: &Chain,
    schedule: &pebble_schedule::Schedule,
    op_seconds: &[Vec<f64>],
    solve: &SolveOptions,
    budget: Option<u64>,
) -> Option<pebble_sim::SimReport> {
    let measured = measured_chain(chain, schedule, op_seconds)?;
    let config = pebble_sim::SimConfig { budget, ..solve.sim_config() };
    pebble_solve::simulate(Problem::Chain(&measured), schedule, &config).ok()
}

/// `chain` with each stage's forward and backward time replaced by the median of what
/// the steps of `schedule` measured (`op_seconds`, one entry per step and schedule op;
/// the first step left out where there are more); a stage the schedule never ran keeps
/// its time. `None` where nothing was measured or a step did not time every op.
pub fn measured_chain(chain: &Chain, schedule: &pebble_schedule::Schedule, op_seconds: &[Vec<f64>]) -> Option<Chain> {
    use pebble_schedule::Op;
    let steps = if op_seconds.len() > 1 { &op_seconds[1..] } else { op_seconds };
    if steps.is_empty() {
        return None;
    }
    let mut forward = vec![Vec::new(); chain.len()];
    let mut backward = vec![Vec::new(); chain.len() + 1];
    for step in steps {
        if step.len() != schedule.ops.len() {
            return None;
        }
        for (op, &seconds) in schedule.ops.iter().zip(step) {
            match *op {
                Op::Forward { stage, .. } => forward.get_mut(stage)?.push(seconds),
                Op::Backward { stage } => backward.get_mut(stage)?.push(seconds),
                _ => {}
            }
        }
    }
    let mut measured = chain.clone();
    for (planned, times) in [(&mut measured.ftime, forward), (&mut measured.btime, backward)] {
        for (time, samples) in planned.iter_mut().zip(times) {
            if let Some(t) = median(samples) {
                *time = t;
            }
        }
    }
    Some(measured)
}

#[cfg(test)]
mod tests {
    use pebble_schedule::Op;
    use pebble_solve::baseline::store_all::store_all_schedule;
    use pebble_testkit::hand_chain;

    use super::*;

    /// What each op of `schedule` costs on `chain`, scaled by `factor`.
    fn seconds(chain: &Chain, schedule: &pebble_schedule::Schedule, factor: f64) -> Vec<f64> {
        let time = |op: &Op| match *op {
            Op::Forward { stage, .. } => chain.ftime[stage],
            Op::Backward { stage } => chain.btime[stage],
            _ => 0.0,
        };
        schedule.ops.iter().map(|op| factor * time(op)).collect()
    }

    /// Stage times as a step measures them, scaled into the ops' profile, come back out
    /// of the lowering: the executor's stages and the chain's group the same ops, so
    /// every stage lands on its measured time, and no size changes.
    #[test]
    fn ops_scaled_to_measured_stage_times_lower_to_those_times() {
        use pebble_runtime::profile::Profile as OpProfile;
        let options = pebble_testkit::gpt_options(2, 16, 16);
        let analytic = lower::<burn_flex::Flex>("gpt", &options, None).unwrap();
        let roofline = pebble_zoo::CostModel { profile: options.profile.clone() };
        let net = &analytic.network;
        let profile = OpProfile {
            forward: (0..net.ops.len()).map(|o| roofline.forward(net, o)).collect(),
            backward: (0..net.ops.len()).map(|o| roofline.backward(net, o)).collect(),
            leftover: vec![0; net.ops.len()],
        };
        let planned = lower::<burn_flex::Flex>("gpt", &options, Some(&profile)).unwrap().chain;
        let mut measured = planned.clone();
        for (s, t) in measured.ftime.iter_mut().enumerate() {
            *t *= 1.5 + s as f64;
        }
        for (s, t) in measured.btime.iter_mut().enumerate() {
            *t *= 0.5 + 0.25 * s as f64;
        }
        let stage_of = pebble_runtime::Program::new(net.clone()).stage_of;
        let scaled = profile.scaled_to_stages(&stage_of, &planned, &measured);
        let lowered = lower::<burn_flex::Flex>("gpt", &options, Some(&scaled)).unwrap().chain;
        assert!(planned.ftime.iter().chain(&planned.btime).all(|&t| t > 0.0), "every stage has time to scale");
        for (field, got, want) in
            [("ftime", &lowered.ftime, &measured.ftime), ("btime", &lowered.btime, &measured.btime)]
        {
            for (s, (g, w)) in got.iter().zip(want).enumerate() {
                assert!((g - w).abs() <= 1e-9 * w, "{field}[{s}]: {g} against the measured {w}");
            }
        }
        assert_eq!(
            (&lowered.x, &lowered.xbar, &lowered.ftmp, &lowered.btmp),
            (&planned.x, &planned.xbar, &planned.ftmp, &planned.btmp)
        );
    }

    #[test]
    fn the_replay_simulates_the_measured_stage_times() {
        let chain = hand_chain();
        let schedule = store_all_schedule(Problem::Chain(&chain));
        let solve = SolveOptions::default();
        let planned = pebble_solve::simulate(Problem::Chain(&chain), &schedule, &solve.sim_config()).unwrap().makespan;
        // The first step is left out: its times do not count.
        let own = [seconds(&chain, &schedule, 100.0), seconds(&chain, &schedule, 1.0)];
        let replayed = replay_on_measured(&chain, &schedule, &own, &solve, None).unwrap().makespan;
        assert!((replayed - planned).abs() < 1e-9, "{replayed} against {planned}");
        // Each stage's median over the steps: two steps at twice the time, one at the time.
        let doubled = [
            seconds(&chain, &schedule, 1.0),
            seconds(&chain, &schedule, 2.0),
            seconds(&chain, &schedule, 2.0),
            seconds(&chain, &schedule, 1.0),
        ];
        let replayed = replay_on_measured(&chain, &schedule, &doubled, &solve, None).unwrap().makespan;
        assert!((replayed - 2.0 * planned).abs() < 1e-9, "{replayed} against {}", 2.0 * planned);
        // A step that did not time every op of the schedule gives no replay.
        assert_eq!(replay_on_measured(&chain, &schedule, &[vec![], vec![1.0]], &solve, None), None);
        assert_eq!(replay_on_measured(&chain, &schedule, &[], &solve, None), None);
    }
}
