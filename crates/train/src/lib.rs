//! Plans a model and runs the plan: the composition of pebble's planner crates (`zoo`,
//! `solve`, `sim`) and its executor (`runtime`).
//!
//! [`train::train`] builds a zoo model, lowers it with analytic or profiled costs,
//! resolves the budget by the one memory model every command uses
//! ([`pebble_solve::budget`]: the user's budget counts everything, the executor's reserve
//! of the profile's [`RuntimeOverhead`](pebble_machine::RuntimeOverhead) comes off it,
//! solvers plan in the rest), plans with one solver, runs the schedule for some steps
//! and reports what it measured beside what the simulator predicted. [`bench::compare`]
//! sets Burn's own autodiff beside pebble's plans. [`train_on`], [`profile_on`] and
//! [`bench_on`] run them on the backend a [`DeviceKind`] names.
//!
//! `pebble-runtime` only executes: everything here that plans stays out of it.

pub mod bench;
pub mod device;
pub mod pipeline;
pub mod train;

pub use device::{bench_on, pipeline_on, profile_on, train_on};
pub use pebble_runtime::{DeviceKind, OptimizerKind};
pub use pebble_solve::budget::BudgetRequest;
pub use train::{
    drive_policy, lower, lower_profiled, replay_on_measured, transfer_options, Costs, Lowered, TrainConfig, TrainReport,
};

use pebble_graph::units::format_bytes;
use pebble_runtime::{RuntimeError, Unavailable};
use pebble_sim::SimError;
use pebble_solve::{PlanError, SolveError, UnknownSolver};
use pebble_zoo::ZooError;

/// Why a run did not happen.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// The model cannot be built: an unknown name, an option it does not take, shapes
    /// its ops refuse, or (a zoo bug) a graph that does not lower to a chain.
    #[error(transparent)]
    Model(#[from] ZooError),
    /// No registered solver has this name (the error lists the known ones).
    #[error(transparent)]
    UnknownSolver(#[from] UnknownSolver),
    /// The profile plans integers of another width than the backend stores them in: its
    /// `machine.runtime.int_bytes` does not describe this executor.
    #[error(
        "profile `{profile}` plans integers of {planned} bytes (machine.runtime.int_bytes), but the backend stores \
         them in {backend} bytes"
    )]
    IntWidth {
        /// The profile's name.
        profile: String,
        /// The profile's `int_bytes`.
        planned: u64,
        /// `size_of::<B::IntElem>()`.
        backend: u64,
    },
    /// The solver returns no schedule for a reason other than the budget: it does not
    /// plan this view, or the problem is too large for it.
    #[error("{error}")]
    Solver {
        /// The solver's name.
        solver: String,
        /// What it said.
        error: SolveError,
    },
    /// No schedule of the solver fits the budget. Both budgets are totals (everything
    /// resident, the executor's reserve included), as the user gives them.
    #[error("{}", infeasible_message(solver, *budget, *min_budget))]
    Infeasible {
        /// The solver's name.
        solver: String,
        /// The budget asked for, in bytes.
        budget: u64,
        /// The least budget the solver fits in, in bytes, if any does.
        min_budget: Option<u64>,
    },
    /// Planning failed for a reason that is pebble's, not the user's: the solver's
    /// schedule does not pass the simulator ([`PlanError::Invalid`], a solver bug).
    #[error(transparent)]
    SolverBug(PlanError),
    /// The simulator rejects store-all's schedule, which every budget is measured
    /// against (a bug of store-all or of the simulator).
    #[error("the simulator rejects store-all's schedule: {0}")]
    StoreAll(SimError),
    /// The device has less memory free than a run needs: refused before it starts,
    /// where an allocation would abort the process.
    #[error(
        "{what} needs {}, and the device has {} free; lower the budget or the model's sizes (--batch, --seq, --image)",
        format_bytes(*needed),
        format_bytes(*available)
    )]
    DeviceMemory {
        /// What would run.
        what: &'static str,
        /// Bytes it needs on the device.
        needed: u64,
        /// Bytes the device has free ([`pebble_runtime::memory::device_available`]).
        available: u64,
    },
    /// The device asked for cannot be used here.
    #[error(transparent)]
    Device(#[from] Unavailable),
    /// The run failed.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
}

/// What [`TrainError::Infeasible`] says.
fn infeasible_message(solver: &str, budget: u64, min_budget: Option<u64>) -> String {
    match min_budget {
        Some(m) => format!(
            "infeasible: no schedule of `{solver}` fits in {}; the minimum feasible budget is {}",
            format_bytes(budget),
            format_bytes(m)
        ),
        None => format!("infeasible: no schedule of `{solver}` fits in any budget"),
    }
}

/// Refuses to start what the device cannot hold: `needed` bytes against what it has
/// free, where that is known ([`pebble_runtime::memory::device_available`]).
pub(crate) fn check_device_holds(what: &'static str, needed: u64) -> Result<(), TrainError> {
    match pebble_runtime::memory::device_available() {
        Some(available) if needed > available => Err(TrainError::DeviceMemory { what, needed, available }),
        _ => Ok(()),
    }
}

impl TrainError {
    /// A failure of [`pebble_solve::plan`] or [`pebble_solve::min_feasible_budget`] other
    /// than infeasibility.
    fn plan(solver: &str, error: PlanError) -> TrainError {
        match error {
            PlanError::Solve(error) => TrainError::Solver { solver: solver.to_string(), error },
            other => TrainError::SolverBug(other),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn infeasible_says_what_the_cli_prints() {
        let e = TrainError::Infeasible { solver: "rotor".into(), budget: 1024, min_budget: Some(4096) };
        assert_eq!(
            e.to_string(),
            "infeasible: no schedule of `rotor` fits in 1.000 KiB; the minimum feasible budget is 4.000 KiB"
        );
        let e = TrainError::Infeasible { solver: "rotor".into(), budget: 1024, min_budget: None };
        assert_eq!(e.to_string(), "infeasible: no schedule of `rotor` fits in any budget");
    }
}
