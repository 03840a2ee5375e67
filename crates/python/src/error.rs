//! What goes wrong, as the Python module raises it: bad input (a `pebble.PebbleError`, a
//! `ValueError`), a budget no plan fits (`pebble.InfeasibleError`, with the least budget
//! that does), or pebble itself failing (a schedule the simulator rejects: a solver bug).

/// Why a call failed.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// The message, naming the argument and field at fault.
    pub message: String,
    /// What kind of failure.
    pub kind: Kind,
}

/// The kinds of [`ApiError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Malformed JSON, a field out of range, an unknown name, a solver that does not plan
    /// this problem.
    BadInput,
    /// No plan fits the budget; the least budget that does, if any.
    Infeasible {
        /// The least feasible budget, bytes.
        least_budget: Option<u64>,
    },
    /// pebble failed: a solver's schedule the simulator rejects.
    Failed,
}

impl ApiError {
    /// Bad input.
    pub fn bad(message: impl Into<String>) -> ApiError {
        ApiError { message: message.into(), kind: Kind::BadInput }
    }

    /// pebble failed.
    pub fn failed(message: impl Into<String>) -> ApiError {
        ApiError { message: message.into(), kind: Kind::Failed }
    }

    /// No plan of `solver` fits `budget` bytes; `least` is the least budget that fits.
    pub fn infeasible(solver: &str, budget: u64, least: Option<u64>, why: Option<&str>) -> ApiError {
        let mut message = match least {
            Some(m) => format!(
                "infeasible: no schedule of `{solver}` fits in {budget} bytes; the least feasible budget is {m} bytes"
            ),
            None => format!("infeasible: no schedule of `{solver}` fits in {budget} bytes, nor in any budget"),
        };
        if let Some(why) = why {
            message.push_str(&format!(" ({why})"));
        }
        ApiError { message, kind: Kind::Infeasible { least_budget: least } }
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// A result of the JSON API.
pub type Result<T> = std::result::Result<T, ApiError>;
