//! The schedules users run today, each one training step over `m` micro-batches ending
//! with a flush.

use pebble_schedule::Schedule;

use super::{PipeError, PipeProblem};

/// Synchronous 1F1B with a flush every `m` micro-batches on the contiguous partition
/// `bounds`.
pub fn one_f_one_b(_problem: &PipeProblem<'_>, _bounds: &[usize], _m: usize) -> Result<Schedule, PipeError> {
    Err(PipeError::Unsupported { solver: "1f1b", why: "not yet".into() })
}
