//! Pipelined model parallelism (Shilova, Part III): the layers of a chain spread over
//! `P` devices, with micro-batches flowing through them.
//!
//! A [`PipeSolver`] is a pure function of a [`PipeProblem`] (the [`Layers`], the device
//! count, the memory of each device, the link's bandwidth) that returns a schedule of the
//! [pipeline view](pebble_schedule::pipeline). As everywhere in pebble, a solver never
//! reports its own period or peak: [`plan_pipeline`] scores its schedule with
//! `pebble_sim::pipeline`. A solver may also say what period it *expected* (MadPipe's
//! phase 1, PipeDream's DP: the thesis's dashed lines), for comparison.
//!
//! * [`onef1b`]: 1F1B\*(T) for a contiguous partition (Alg. 6) and the search on `T`
//!   (Alg. 7); `1f1b`.
//! * [`pipedream`]: PipeDream's partitioning DP scheduled with 1F1B\*; `pipedream`.
//! * [`madpipe`]: MadPipe's phase 1, the DP and its search on `T̂` (its phase 2, an
//!   ILP, is in `pebble-ilp`, which registers `madpipe`).
//! * [`flush`]: the schedules users run today, with a flush every `m` micro-batches:
//!   `gpipe`, `1f1b` with `--microbatches`, `interleaved-1f1b`, `zb-h1`, `zb-v`.
//! * [`brute`]: exhaustive searches over allocations, the tests' oracles.

use std::time::Instant;

use pebble_graph::Layers;
use pebble_schedule::Schedule;
use pebble_sim::{simulate_pipeline, PipeConfig, PipeReport, SimError};
use thiserror::Error;

pub mod brute;
pub mod flush;
pub mod madpipe;
pub mod onef1b;
mod partition;
pub mod pipedream;

/// What a pipeline solver plans.
#[derive(Debug, Clone, Copy)]
pub struct PipeProblem<'a> {
    /// The layers.
    pub layers: &'a Layers,
    /// The number of devices `P`.
    pub devices: usize,
    /// Each device's memory in bytes; `None` = unlimited.
    pub memory: Option<u64>,
    /// Each link's bandwidth in bytes per second (`f64::INFINITY`: free communications).
    pub bandwidth: f64,
    /// Each transfer's latency in seconds.
    pub latency: f64,
    /// For the schedules with a flush: micro-batches per step; `None` lets each choose
    /// (and makes `1f1b` the periodic 1F1B\*).
    pub microbatches: Option<usize>,
    /// `interleaved-1f1b`'s virtual stages per device, `v`.
    pub virtual_stages: usize,
    /// The ILPs' time limit in seconds.
    pub time_limit: f64,
    /// Weight versions each device keeps; `None`: two for a periodic schedule
    /// (PipeDream-2BW), one with a flush. The thesis's instances give their `C·W` as
    /// the weights and set 1.
    pub weight_versions: Option<u64>,
}

impl<'a> PipeProblem<'a> {
    /// `P` devices of `memory` bytes, links of `bandwidth`, the defaults otherwise.
    pub fn new(layers: &'a Layers, devices: usize, memory: Option<u64>, bandwidth: f64) -> PipeProblem<'a> {
        PipeProblem {
            layers,
            devices,
            memory,
            bandwidth,
            latency: 0.0,
            microbatches: None,
            virtual_stages: 2,
            time_limit: 60.0,
            weight_versions: None,
        }
    }

    /// The setting of the thesis's instances (digest §6.3): `P` devices of `memory`, free
    /// communications, and one weight version (their weights are given as `C·W`).
    pub fn thesis(layers: &'a Layers, devices: usize, memory: Option<u64>) -> PipeProblem<'a> {
        PipeProblem { weight_versions: Some(1), ..PipeProblem::new(layers, devices, memory, f64::INFINITY) }
    }

    /// The simulator's configuration for this problem.
    pub fn sim_config(&self) -> PipeConfig {
        PipeConfig {
            bandwidth: self.bandwidth,
            latency: self.latency,
            memory: self.memory,
            periods: 24,
            weight_versions: self.weight_versions,
        }
    }

    /// `C(j)`: the time the boundary after layer `j` (0-based) takes on a link, its
    /// activation forward and its gradient backward.
    pub fn comm(&self, j: usize) -> f64 {
        if j + 1 >= self.layers.len() {
            return 0.0;
        }
        if self.bandwidth.is_infinite() {
            2.0 * self.latency
        } else {
            2.0 * (self.layers.boundary[j] as f64 / self.bandwidth + self.latency)
        }
    }

    /// The static bytes of layers `i..=j` in a periodic schedule (two weight versions
    /// unless the problem says otherwise).
    pub fn periodic_static(&self, i: usize, j: usize) -> u64 {
        self.layers.static_bytes(i, j, self.weight_versions.unwrap_or(2))
    }

    /// Whether `bytes` fit one device.
    pub fn fits(&self, bytes: u64) -> bool {
        self.memory.is_none_or(|m| bytes <= m)
    }

    /// MadPipe's `𝓜(i, j, g)`, as the simulator counts it: a device holding layers
    /// `i..=j` with `g` micro-batches in flight holds their periodic static bytes, `g`
    /// times what they keep between forward and backward, their largest temporary, and a
    /// buffer of `a` and of `δ` at each end that crosses devices.
    pub fn stage_memory(&self, i: usize, j: usize, g: u64) -> u64 {
        let l = self.layers;
        let n = l.len();
        let tmp = (i..=j).map(|x| l.ftmp[x].max(l.btmp[x])).max().unwrap_or(0);
        // Saturating: on a link slow enough, `g` (a count of activations in flight) grows
        // past what any memory holds, and the sum must say "too much", not wrap.
        let mut m =
            self.periodic_static(i, j).saturating_add(g.saturating_mul(l.stored_bytes(i, j))).saturating_add(tmp);
        if i > 0 {
            m = m.saturating_add(2 * l.boundary[i - 1]);
        }
        if j + 1 < n {
            m = m.saturating_add(2 * l.boundary[j]);
        }
        m
    }
}

/// A solver's schedule, with what it expected.
#[derive(Debug, Clone)]
pub struct PipeSolution {
    /// The schedule.
    pub schedule: Schedule,
    /// The period the solver's own model predicts, if it has one (the thesis's dashed
    /// line); the simulator's is the one that counts.
    pub expected_period: Option<f64>,
}

impl From<Schedule> for PipeSolution {
    fn from(schedule: Schedule) -> PipeSolution {
        PipeSolution { schedule, expected_period: None }
    }
}

/// Why a pipeline solver found nothing.
#[derive(Debug, Error, Clone, PartialEq)]
#[non_exhaustive]
pub enum PipeError {
    /// No schedule of this solver fits the memory.
    #[error("no schedule of `{solver}` fits: {why}")]
    Infeasible {
        /// The solver.
        solver: &'static str,
        /// Why.
        why: String,
    },
    /// The problem is outside what the solver handles (too many layers for an
    /// exhaustive search, a micro-batch count interleaving cannot use).
    #[error("`{solver}`: {why}")]
    Unsupported {
        /// The solver.
        solver: &'static str,
        /// Why.
        why: String,
    },
    /// The solver's schedule does not pass the simulator: a solver bug.
    #[error("solver `{solver}` produced an invalid schedule: {error}")]
    Invalid {
        /// The solver.
        solver: &'static str,
        /// The simulator's complaint.
        error: SimError,
    },
}

/// A pipeline solver.
pub trait PipeSolver: Sync {
    /// The name `pebble pipeline --solver` takes.
    fn name(&self) -> &'static str;
    /// One line: what it is and where it comes from.
    fn description(&self) -> &'static str;
    /// Plans the problem.
    fn solve(&self, problem: &PipeProblem<'_>) -> Result<PipeSolution, PipeError>;
}

/// A registered pipeline solver. Submit one with
/// `inventory::submit!(PipeRegistration(&MySolver))`.
pub struct PipeRegistration(pub &'static dyn PipeSolver);
inventory::collect!(PipeRegistration);

/// Every registered pipeline solver, sorted by name.
pub fn pipe_registry() -> Vec<&'static dyn PipeSolver> {
    let mut v: Vec<&'static dyn PipeSolver> = inventory::iter::<PipeRegistration>.into_iter().map(|r| r.0).collect();
    v.sort_by_key(|s| s.name());
    v
}

/// The pipeline solver called `name`.
pub fn pipe_solver(name: &str) -> Result<&'static dyn PipeSolver, crate::UnknownSolver> {
    let all = pipe_registry();
    all.iter()
        .copied()
        .find(|s| s.name() == name)
        .ok_or_else(|| crate::UnknownSolver { name: name.to_string(), known: all.iter().map(|s| s.name()).collect() })
}

/// A pipeline solver's schedule with the simulator's verdict on it.
#[derive(Debug, Clone)]
pub struct PipePlan {
    /// The schedule, named after its solver.
    pub schedule: Schedule,
    /// The simulator's report.
    pub report: PipeReport,
    /// The period the solver expected, if it says.
    pub expected_period: Option<f64>,
    /// Wall-clock seconds the solver took.
    pub solve_seconds: f64,
}

/// Runs `solver` and scores its schedule with the simulator, under the problem's memory.
pub fn plan_pipeline(solver: &dyn PipeSolver, problem: &PipeProblem<'_>) -> Result<PipePlan, PipeError> {
    let start = Instant::now();
    let solution = solver.solve(problem)?;
    let solve_seconds = start.elapsed().as_secs_f64();
    let schedule = solution.schedule.with_solver(solver.name());
    let report = simulate_pipeline(problem.layers, &schedule, &problem.sim_config())
        .map_err(|error| PipeError::Invalid { solver: solver.name(), error })?;
    Ok(PipePlan { schedule, report, expected_period: solution.expected_period, solve_seconds })
}

/// The simulated report of `schedule`, or `None` if it does not pass (over memory, or
/// invalid): for solvers that try several candidates and keep the best that fits.
pub fn try_schedule(problem: &PipeProblem<'_>, schedule: &Schedule) -> Option<PipeReport> {
    simulate_pipeline(problem.layers, schedule, &problem.sim_config()).ok()
}

/// The contiguous stages `first..=last` of `bounds` (each stage's last layer), placed one
/// per device in order.
pub fn contiguous_stages(bounds: &[usize]) -> Vec<pebble_schedule::PipeStage> {
    let mut first = 0;
    bounds
        .iter()
        .enumerate()
        .map(|(device, &last)| {
            let s = pebble_schedule::PipeStage { first, last, device };
            first = last + 1;
            s
        })
        .collect()
}
