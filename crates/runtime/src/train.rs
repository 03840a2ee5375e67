//! `pebble train` as a library call: build a zoo model, plan it under a budget with one
//! solver, run the plan for some steps, and report measured against simulated.

use std::time::Instant;

use burn_backend::Backend;
use pebble_graph::units::BudgetSpec;
use pebble_graph::{partition, Chain, TrainingGraph};
use pebble_schedule::{Schedule, View};
use pebble_solve::{Problem, SolveOptions};
use pebble_zoo::{ModelOptions, Network, OpCosts};
use serde::Serialize;

use crate::session::{OptimizerKind, Session};
use crate::RuntimeError;

/// The memory budget of a run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Budget {
    /// Everything resident, static memory included (`P%` of the store-all peak).
    Total(BudgetSpec),
    /// Everything but parameters, their gradients and the optimizer's state, which are
    /// added to it (`P%` of the store-all peak minus that static memory).
    Activation(BudgetSpec),
}

/// Where the planner's op costs come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Costs {
    /// The zoo's roofline model and declared temporaries.
    Analytic,
    /// Measured on this device by the profiler before planning.
    Profiled,
}

/// What to train, how.
#[derive(Debug, Clone)]
pub struct TrainConfig {
    /// Zoo model name.
    pub model: String,
    /// Its options (batch, image, seq, layers, width, heads).
    pub options: ModelOptions,
    /// The budget.
    pub budget: Budget,
    /// The solver's name.
    pub solver: String,
    /// Steps to run.
    pub steps: usize,
    /// Seed of parameters, data and dropout.
    pub seed: u64,
    /// The optimizer.
    pub optimizer: OptimizerKind,
    /// Where the planner's costs come from.
    pub costs: Costs,
    /// Solver options (slots, time limit).
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
    /// The budget, in bytes.
    pub budget_bytes: u64,
    /// Parameters, their gradients and the optimizer's state, in bytes.
    pub static_bytes: u64,
    /// The loss of each step, before its update.
    pub losses: Vec<f32>,
    /// Wall-clock seconds of each step's forward and backward.
    pub step_seconds: Vec<f64>,
    /// The largest peak of live bytes over the steps (`null` where nothing counts them).
    pub measured_peak_bytes: Option<u64>,
    /// The simulator's peak for the schedule.
    pub predicted_peak_bytes: u64,
    /// The simulator's time for the schedule (seconds, by the planner's costs).
    pub predicted_time: f64,
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
}

/// Why a run did not happen.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// Bad input: an unknown model or solver, an option the model does not take.
    #[error("{0}")]
    Input(String),
    /// No schedule of the solver fits.
    #[error("{message}")]
    Infeasible {
        /// What to tell the user.
        message: String,
        /// The least budget the solver fits in, if any.
        min_budget: Option<u64>,
    },
    /// The run failed.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
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

/// Builds `name` from the zoo with integers as wide as `B` stores them, and lowers it
/// with `costs`.
pub fn lower<B: Backend>(
    name: &str,
    options: &ModelOptions,
    costs: Option<&dyn OpCosts>,
) -> Result<Lowered, TrainError> {
    let model = pebble_zoo::build(name, options).map_err(|e| TrainError::Input(e.to_string()))?;
    let mut network = model.network;
    network.int_bytes = std::mem::size_of::<B::IntElem>() as u64;
    let analytic = pebble_zoo::CostModel { device: options.device.clone() };
    let costs: &dyn OpCosts = costs.unwrap_or(&analytic);
    let (graph, index) = network.training_graph_indexed(costs, options.optimizer);
    let chain = partition::to_chain(&graph).map_err(|e| TrainError::Input(format!("model `{name}`: {e}")))?;
    Ok(Lowered { network, graph, index, chain })
}

/// What the executor keeps of a budget for what schedules do not model: allocator and
/// tensor metadata, the executor's own bookkeeping (measured at 35 KB on the CPU for the
/// small test models). Solvers plan in the rest, so that the measured peak stays within
/// the budget.
pub fn reserve(budget: u64) -> u64 {
    (64 << 10) + budget / 100
}

/// The least budget that leaves `planned` bytes to the solver after [`reserve`].
pub fn budget_for(planned: u64) -> u64 {
    let b = (planned + (64 << 10)).saturating_mul(100).div_ceil(99);
    (b.saturating_sub(2)..=b).find(|&b| b - reserve(b) >= planned).unwrap_or(b)
}

/// Plans and runs `config` on `device`.
pub fn train<B: Backend>(config: &TrainConfig, device: B::Device) -> Result<TrainReport, TrainError> {
    let solver = pebble_solve::solver(&config.solver).ok_or_else(|| {
        let known: Vec<&str> = pebble_solve::registry().iter().map(|s| s.name()).collect();
        TrainError::Input(format!("--solver: unknown solver `{}` (known: {})", config.solver, known.join(", ")))
    })?;
    let mut options = config.options.clone();
    options.optimizer = config.optimizer.planner();
    let mut profile_seconds = 0.0;
    let lowered = match config.costs {
        Costs::Analytic => lower::<B>(&config.model, &options, None)?,
        Costs::Profiled => {
            let start = Instant::now();
            let first = lower::<B>(&config.model, &options, None)?;
            let profile = crate::profile::profile::<B>(&first.network, &device, config.seed)?;
            profile_seconds = start.elapsed().as_secs_f64();
            lower::<B>(&config.model, &options, Some(&profile))?
        }
    };
    let view = solver.views().first().copied().unwrap_or(View::Chain);
    let problem = match view {
        View::Chain => Problem::Chain(&lowered.chain),
        View::Graph => Problem::Graph(&lowered.graph),
    };
    let sim = |schedule: &Schedule| {
        let cfg = pebble_sim::SimConfig { budget: None, bandwidth: config.solve.bandwidth, timeline: false };
        pebble_solve::simulate(problem, schedule, &cfg)
            .map_err(|e| RuntimeError::Other(format!("the simulator rejects the schedule: {e}")))
    };
    let store_all = sim(&pebble_solve::baseline::store_all::store_all_schedule(problem))?;
    let static_bytes = lowered.graph.static_bytes();
    // Percentages are of what store-all needs to run: its simulated peak plus the reserve.
    let reference = budget_for(store_all.peak_bytes);
    let budget = match config.budget {
        Budget::Total(b) => b.resolve(reference),
        Budget::Activation(a) => a.resolve(reference.saturating_sub(static_bytes)).saturating_add(static_bytes),
    };
    let plan = match pebble_solve::plan(solver, problem, budget.saturating_sub(reserve(budget)), &config.solve) {
        Ok(plan) => plan,
        Err(pebble_solve::PlanError::Solve(pebble_solve::SolveError::Infeasible { .. })) => {
            // The least budget whose share left to the solver fits.
            let min = pebble_solve::min_feasible_budget(solver, problem, &config.solve).map(budget_for);
            let message = match min {
                Some(m) => format!(
                    "infeasible: no schedule of `{}` fits in {} bytes; the minimum feasible budget is {} bytes",
                    solver.name(),
                    budget,
                    m
                ),
                None => format!("infeasible: no schedule of `{}` fits in any budget", solver.name()),
            };
            return Err(TrainError::Infeasible { message, min_budget: min });
        }
        Err(e) => return Err(TrainError::Input(format!("--solver {}: {e}", solver.name()))),
    };
    let params = lowered.network.param_count();
    let mut session = Session::<B>::new(lowered.network, lowered.index, config.optimizer, config.seed, device);
    let mut losses = Vec::new();
    let mut step_seconds = Vec::new();
    let mut measured: Option<u64> = None;
    for _ in 0..config.steps {
        let r = session.step(&plan.schedule)?;
        losses.push(r.loss);
        step_seconds.push(r.seconds);
        if let Some(p) = r.peak_bytes {
            measured = Some(measured.map_or(p, |m| m.max(p)));
        }
    }
    Ok(TrainReport {
        model: config.model.clone(),
        solver: solver.name().to_string(),
        view: match view {
            View::Chain => "chain",
            View::Graph => "graph",
        },
        device: B::name(session.device()),
        params,
        budget_bytes: budget,
        static_bytes,
        losses,
        step_seconds,
        measured_peak_bytes: measured,
        predicted_peak_bytes: plan.report.peak_bytes,
        predicted_time: plan.report.makespan,
        store_all_predicted_peak_bytes: store_all.peak_bytes,
        store_all_predicted_time: store_all.makespan,
        schedule_ops: plan.schedule.ops.len(),
        solve_seconds: plan.solve_seconds,
        profile_seconds,
    })
}
