//! `pebble._core`: pebble's planner for Python, built by maturin (`crates/python/pyproject.toml`).
//!
//! Every function takes and returns JSON text (the Python side does `json.loads` and
//! `json.dumps`): problems in the serde formats of `pebble_graph::TrainingGraph` and
//! `pebble_graph::Chain`, schedules as `pebble plan -o` writes them. Bad input raises
//! `pebble.PebbleError` (a `ValueError`) naming the argument and field; a budget no plan
//! fits raises `pebble.InfeasibleError` (a `PebbleError`) whose `least_budget` is the
//! least budget that fits (or `None`). Nothing panics into Python: a panic, a bug, is a
//! `PebbleError` that says so. Solves release the GIL.
//!
//! The logic is in [`api`], plain Rust that the crate's tests call without Python; this
//! file wraps each function. `pebble-ilp` is linked so that its MILP solvers register.

pub mod api;
#[cfg(test)]
mod chain_expand_tests;
mod chain_view;
pub mod error;
mod options;
mod problem;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::error::{ApiError, Kind};

// Links the ILP solvers (`checkmate`, `rockmate`, `hiremate`, `offmate`) into the
// registry: they register themselves with `inventory`, which sees only linked crates.
use pebble_ilp as _;

pyo3::create_exception!(
    pebble,
    PebbleError,
    PyValueError,
    "pebble refused the input (naming the argument and field) or failed."
);
pyo3::create_exception!(
    pebble,
    InfeasibleError,
    PebbleError,
    "No plan fits the budget; `least_budget` is the least budget that fits, in bytes, or None."
);

/// The Python exception of an [`ApiError`].
fn py_err(py: Python<'_>, e: ApiError) -> PyErr {
    match e.kind {
        Kind::Infeasible { least_budget } => {
            let err = InfeasibleError::new_err(e.message);
            if let Err(set) = err.value(py).setattr("least_budget", least_budget) {
                return set;
            }
            err
        }
        Kind::BadInput | Kind::Failed => PebbleError::new_err(e.message),
    }
}

/// Runs `f` without the GIL and converts its error; a panic (a bug) becomes a
/// `PebbleError` saying so, rather than PyO3's `PanicException`.
fn detached<T: Send>(py: Python<'_>, f: impl FnOnce() -> error::Result<T> + Send) -> PyResult<T> {
    let result = py.detach(|| std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)));
    match result {
        Ok(r) => r.map_err(|e| py_err(py, e)),
        Err(panic) => {
            let why = pebble_solve::auto::panic_message(&*panic);
            Err(PebbleError::new_err(format!("pebble panicked (a bug; please report it): {why}")))
        }
    }
}

/// Every registered solver: a JSON list of `{"name", "description", "views"}`.
#[pyfunction]
fn solvers() -> String {
    api::solvers()
}

/// The built-in machine profiles: a JSON list of profiles.
#[pyfunction]
fn profiles() -> String {
    api::profiles()
}

/// A built-in profile by name, or a JSON profile file's, as JSON.
#[pyfunction]
fn profile(py: Python<'_>, name: &str) -> PyResult<String> {
    detached(py, || api::profile(name))
}

/// A size (`"6GiB"`, `"512MB"`, `"1024"`) in bytes.
#[pyfunction]
fn parse_size(py: Python<'_>, size: &str) -> PyResult<u64> {
    detached(py, || api::parse_size(size))
}

/// A budget (`"6GiB"` or `"50%"`): JSON `{"bytes": n}` or `{"percent": p}`.
#[pyfunction]
fn parse_budget(py: Python<'_>, budget: &str) -> PyResult<String> {
    detached(py, || api::parse_budget(budget))
}

/// Plans `problem` with `solver` within `budget` bytes; JSON in and out.
#[pyfunction]
#[pyo3(signature = (problem, solver, budget, options = "{}"))]
fn plan(py: Python<'_>, problem: &str, solver: &str, budget: u64, options: &str) -> PyResult<String> {
    detached(py, || api::plan(problem, solver, budget, options))
}

/// The least budget in which `solver` plans `problem`, or None.
#[pyfunction]
#[pyo3(signature = (problem, solver, options = "{}"))]
fn least_budget(py: Python<'_>, problem: &str, solver: &str, options: &str) -> PyResult<Option<u64>> {
    detached(py, || api::least_budget(problem, solver, options))
}

/// The program a schedule means on the problem, as JSON.
#[pyfunction]
fn lower(py: Python<'_>, problem: &str, schedule: &str) -> PyResult<String> {
    detached(py, || api::lower(problem, schedule))
}

/// The simulator's report on a schedule, as JSON.
#[pyfunction]
#[pyo3(signature = (problem, schedule, options = "{}"))]
fn simulate(py: Python<'_>, problem: &str, schedule: &str, options: &str) -> PyResult<String> {
    detached(py, || api::simulate(problem, schedule, options))
}

/// The chain view of a training graph, `{"chain", "stages"}` as JSON, or None.
#[pyfunction]
fn to_chain(py: Python<'_>, graph: &str) -> PyResult<Option<String>> {
    detached(py, || api::to_chain(graph))
}

/// The module.
#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    py.get_type::<PebbleError>().setattr("least_budget", py.None())?;
    m.add("PebbleError", py.get_type::<PebbleError>())?;
    m.add("InfeasibleError", py.get_type::<InfeasibleError>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_function(wrap_pyfunction!(solvers, m)?)?;
    m.add_function(wrap_pyfunction!(profiles, m)?)?;
    m.add_function(wrap_pyfunction!(profile, m)?)?;
    m.add_function(wrap_pyfunction!(parse_size, m)?)?;
    m.add_function(wrap_pyfunction!(parse_budget, m)?)?;
    m.add_function(wrap_pyfunction!(plan, m)?)?;
    m.add_function(wrap_pyfunction!(least_budget, m)?)?;
    m.add_function(wrap_pyfunction!(lower, m)?)?;
    m.add_function(wrap_pyfunction!(simulate, m)?)?;
    m.add_function(wrap_pyfunction!(to_chain, m)?)?;
    Ok(())
}
