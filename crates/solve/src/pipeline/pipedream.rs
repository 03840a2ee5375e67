//! PipeDream's partitioning (Narayanan et al., SOSP 2019, §3.1) for a straight pipeline,
//! scheduled with the memory-optimal 1F1B\* (Shilova's "DP+1F1B\*", Ch. 7).
//!
//! The DP ([`partition`]) runs with the memory filter of PipeDream's public optimizer,
//! whose count misses the stage's own activation, the second weight version and the
//! buffers, which is why the DP's period (the thesis's dashed line) is optimistic:
//! 1F1B\* then needs a longer period to fit, or nothing fits at all.

pub use super::partition::partition;

use super::onef1b::best_schedule;
use super::{PipeError, PipeProblem, PipeRegistration, PipeSolution, PipeSolver};

/// `pipedream`: PipeDream's DP partition, scheduled with 1F1B\* at the smallest period
/// that fits (Alg. 7).
pub struct PipeDream;

impl PipeSolver for PipeDream {
    fn name(&self) -> &'static str {
        "pipedream"
    }
    fn description(&self) -> &'static str {
        "PipeDream's contiguous partitioning DP with its memory filter (Narayanan et al. 2019), \
         scheduled with 1F1B* at the smallest period that fits (Shilova's DP+1F1B*)"
    }
    fn solve(&self, problem: &PipeProblem<'_>) -> Result<PipeSolution, PipeError> {
        let infeasible = |why: &str| PipeError::Infeasible { solver: "pipedream", why: why.into() };
        let (bounds, dp) =
            partition(problem, true).ok_or_else(|| infeasible("no partition passes PipeDream's memory filter"))?;
        let (schedule, _) = best_schedule(problem, &bounds)
            .ok_or_else(|| infeasible("PipeDream's partition does not fit the memory under any 1F1B* period"))?;
        Ok(PipeSolution { schedule, expected_period: Some(dp) })
    }
}

inventory::submit!(PipeRegistration(&PipeDream));
