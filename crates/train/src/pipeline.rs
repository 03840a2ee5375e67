//! Pipelined model parallelism planned and run (issue 14): a zoo model's chain seen as
//! pipeline layers ([`Layers::from_chain`]), a pipeline solver's schedule for `P`
//! devices of `M` bytes (scored by `pebble_sim::pipeline`), one step of it over `m`
//! micro-batches on `P` worker threads ([`pebble_runtime::pipeline::run`]), and, over the
//! same micro-batches, single-device training with store-all
//! ([`pebble_runtime::pipeline::single_device`]), to compare with.
//!
//! The planner sees the chain as [`pipeline_layers`] gives it (the gradients each
//! backward holds, a tied parameter on each device that reads it, as the workers hold
//! them) and one weight version per device (the step ends with a flush).
//!
//! The model is built at the micro-batch size ([`ModelOptions::batch`]): micro-batch `u`
//! is the `u`-th synthetic batch of [`MicroBatches::synthetic`], seeded from the config's
//! seed, and both runs start from the same parameters (a [`Session`]'s, drawn from that
//! seed). Nothing is updated: the step's result is its losses and its gradients summed
//! over the micro-batches.
//!
//! Solvers are taken from the pipeline registry by name (`1f1b`, `pipedream`, `gpipe`,
//! …). `madpipe` is registered by `pebble-ilp` (its phase 2 is an ILP); where that crate
//! is not linked, `madpipe` here is phase 1's allocation scheduled without the ILP
//! ([`madpipe::without_ilp`]), and [`PipelineReport::planner`] says so.

use pebble_graph::Layers;
use pebble_runtime::pipeline::{self, MicroBatches, PipeOptions, WorkerReport};
use pebble_runtime::{read_floats, Backend, OptimizerKind, Program, RuntimeError, Session, StageTemporaries};
use pebble_schedule::Schedule;
use pebble_sim::PipeReport;
use pebble_solve::pipeline::{madpipe, pipe_solver, plan_pipeline, PipeError, PipePlan, PipeProblem};
use pebble_solve::{Problem, UnknownSolver};
use pebble_zoo::ops::Elem;
use pebble_zoo::ModelOptions;

use crate::train::{lower, Lowered};
use crate::TrainError;

/// What to plan and run.
#[derive(Debug, Clone)]
pub struct PipelineConfig {
    /// Zoo model name.
    pub model: String,
    /// Its options; `batch` is the micro-batch size.
    pub options: ModelOptions,
    /// The pipeline solver's name.
    pub solver: String,
    /// Devices `P`.
    pub devices: usize,
    /// Each device's memory in bytes, for the planner and as each worker's cap (`None`:
    /// unlimited).
    pub memory: Option<u64>,
    /// Micro-batches `m` in the step.
    pub microbatches: usize,
    /// Seed of the parameters, the micro-batches and their dropout.
    pub seed: u64,
    /// Plan a schedule with a flush after the step's `microbatches` (the solver's
    /// flushed variant: `1f1b` becomes PipeDream-Flush's 1F1B; `gpipe`,
    /// `interleaved-1f1b` need it) instead of a periodic pattern, which the step runs
    /// with its fill and drain.
    pub flush: bool,
}

/// Why a pipeline run did not happen.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    /// The model (or its lowering for this backend).
    #[error(transparent)]
    Train(#[from] TrainError),
    /// No pipeline solver has this name.
    #[error(transparent)]
    UnknownSolver(#[from] UnknownSolver),
    /// The solver found no schedule (infeasible, unsupported, or a schedule the
    /// simulator rejects).
    #[error(transparent)]
    Plan(#[from] PipeError),
    /// The run failed (a worker over its memory, a schedule the executor refuses).
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
}

/// A model lowered and planned for a pipeline.
pub struct PipelinePlan {
    /// The model.
    pub lowered: Lowered,
    /// Its chain as pipeline layers.
    pub layers: Layers,
    /// The schedule and the simulator's report on it.
    pub plan: PipePlan,
    /// What planned it: the solver's name, or how `madpipe` was stood in for.
    pub planner: String,
}

/// What a pipelined step and the single-device step over the same micro-batches did.
#[derive(Debug, Clone)]
pub struct PipelineReport {
    /// The model.
    pub model: String,
    /// The solver asked for.
    pub solver: String,
    /// What planned the schedule.
    pub planner: String,
    /// The schedule that ran.
    pub schedule: Schedule,
    /// The simulator's report on it (under [`PipelineConfig::memory`]).
    pub simulated: PipeReport,
    /// Each device's memory given to the planner and the workers.
    pub memory: Option<u64>,
    /// Each micro-batch's loss, pipelined.
    pub losses: Vec<f32>,
    /// Each parameter's gradient summed over the micro-batches, pipelined.
    pub grads: Vec<Vec<f32>>,
    /// Each device's worker.
    pub workers: Vec<WorkerReport>,
    /// Wall-clock seconds of the pipelined step.
    pub seconds: f64,
    /// Each micro-batch's loss on one device (store-all).
    pub reference_losses: Vec<f32>,
    /// Each parameter's gradient summed over the micro-batches on one device.
    pub reference_grads: Vec<Vec<f32>>,
    /// Wall-clock seconds of the single-device step.
    pub reference_seconds: f64,
    /// The parameters several ops read (a tied embedding): their contributions are
    /// summed in another order on several workers (each worker over its micro-batches,
    /// then the workers) than on one device (each micro-batch's, then the micro-batches),
    /// so they agree up to rounding only; every other gradient is added in the same
    /// order in both runs.
    pub shared_params: Vec<usize>,
    /// Each parameter's name.
    pub param_names: Vec<String>,
}

/// The pipeline problem of `layers` for `config` on the profile's interconnect. A step
/// ends with a flush (its micro-batches drain before the step ends), so each device
/// keeps one version of its weights, periodic pattern or not.
fn problem<'a>(layers: &'a Layers, config: &PipelineConfig) -> PipeProblem<'a> {
    let link = &config.options.profile.machine.interconnect;
    let mut p = PipeProblem::new(layers, config.devices, config.memory, link.bandwidth);
    p.latency = link.latency;
    p.weight_versions = Some(1);
    if config.flush {
        p.microbatches = Some(config.microbatches);
    }
    p
}

/// The model's chain as pipeline layers ([`Layers::from_chain`], which already counts the
/// gradients a backward holds beside its temporaries), with a copy of each parameter
/// several chain stages read (a tied embedding) on each reader: the chain keeps such a
/// parameter, with its gradient and optimizer states, in `shared`, which lives with
/// layer 0, but a pipeline that puts a later reader on another device holds a second
/// copy there, which this adds to that reader's `weights`, `grads` and `states` (full
/// training in the model's float type). It errs on the safe side where the readers share
/// a device.
pub fn pipeline_layers(lowered: &Lowered, options: &ModelOptions) -> Layers {
    let mut layers = Layers::from_chain(&lowered.chain);
    let program = Program::new(lowered.network.clone());
    let net = &program.net;
    let last = layers.len() - 1;
    for (q, readers) in program.readers.iter().enumerate() {
        let bytes = net.bytes(&net.params[q].shape, Elem::Float);
        for &j in readers.iter().skip(1) {
            let j = j.min(last);
            layers.weights[j] += bytes;
            layers.grads[j] += bytes;
            layers.states[j] += options.optimizer.states_per_param() * bytes;
        }
    }
    layers
}

/// Builds the model for backend `B` and plans its pipeline with `config.solver`.
pub fn plan<B: Backend>(config: &PipelineConfig) -> Result<PipelinePlan, PipelineError> {
    let lowered = lower::<B>(&config.model, &config.options, None)?;
    let layers = pipeline_layers(&lowered, &config.options);
    let problem = problem(&layers, config);
    let (plan, planner) = match pipe_solver(&config.solver) {
        Ok(solver) => (plan_pipeline(solver, &problem)?, config.solver.clone()),
        Err(_) if config.solver == "madpipe" => (
            plan_pipeline(&madpipe::WithoutIlp, &problem)?,
            "madpipe (phase 1, scheduled by 1F1B*'s construction: pebble-ilp's phase 2 is not linked)".into(),
        ),
        Err(e) => return Err(e.into()),
    };
    Ok(PipelinePlan { lowered, layers, plan, planner })
}

/// Plans `config` and runs one pipelined step of it on `device`, then single-device
/// training over the same micro-batches.
pub fn run<B: Backend>(config: &PipelineConfig, device: B::Device) -> Result<PipelineReport, PipelineError> {
    let planned = plan::<B>(config)?;
    run_planned::<B>(config, planned, device)
}

/// Runs a plan made by [`plan`] for `config`: one pipelined step over
/// `config.microbatches` micro-batches, each worker capped at `config.memory`, then the
/// same micro-batches on one device with store-all, from the same parameters.
pub fn run_planned<B: Backend>(
    config: &PipelineConfig,
    planned: PipelinePlan,
    device: B::Device,
) -> Result<PipelineReport, PipelineError> {
    let PipelinePlan { lowered, plan, planner, .. } = planned;
    let chain = lowered.chain;
    let store_all = pebble_solve::baseline::store_all::store_all_schedule(Problem::Chain(&chain));
    let mut session =
        Session::<B>::new(lowered.network, lowered.index, OptimizerKind::Sgd { lr: 0.1 }, config.seed, device.clone());
    // The pools count the plan's temporaries while each chain stage's pass runs, as the
    // simulator does.
    session.set_temporaries(StageTemporaries::of(&chain));
    let net = &session.program.net;
    let param_names = net.params.iter().map(|p| p.name.clone()).collect();
    let shared_params =
        (0..net.params.len()).filter(|&q| net.ops.iter().filter(|o| o.params.contains(&q)).count() > 1).collect();
    let batches = MicroBatches::<B>::synthetic(net, config.seed, config.microbatches, &device);
    let piped = pipeline::run(&session, &plan.schedule, &batches, &PipeOptions { memory: config.memory })?;
    let reference = pipeline::single_device(&mut session, &store_all, &batches)?;
    let grads: Vec<Vec<f32>> =
        piped.grads.into_iter().map(|g| g.map_or(Ok(Vec::new()), read_floats::<B>)).collect::<Result<_, _>>()?;
    let reference_grads: Vec<Vec<f32>> =
        reference.grads.into_iter().map(|g| g.map_or(Ok(Vec::new()), read_floats::<B>)).collect::<Result<_, _>>()?;
    Ok(PipelineReport {
        model: config.model.clone(),
        solver: config.solver.clone(),
        planner,
        schedule: plan.schedule,
        simulated: plan.report,
        memory: config.memory,
        losses: piped.losses,
        grads,
        workers: piped.workers,
        seconds: piped.seconds,
        reference_losses: reference.losses,
        reference_grads,
        reference_seconds: reference.seconds,
        shared_params,
        param_names,
    })
}
