//! PipeDream's partitioning (Narayanan et al., SOSP 2019, §3.1) for a straight pipeline,
//! scheduled with the memory-optimal 1F1B\* (Shilova's "DP+1F1B\*", Ch. 7).
//!
//! The DP, with no replication: `A(j, p) = min_{i<j} max(A(i, p−1), C(i), U(i+1, j))`,
//! `A(j, 1) = U(1, j)`, over at most `P` stages. Its memory filter is the one of
//! PipeDream's public optimizer (`--use_memory_constraint`): a candidate stage at
//! position `p` is kept if its activations and parameters, times the number of workers
//! after it (`N − p`), fit the memory; the last stage always passes. That count misses
//! the stage's own activation, the second weight version and the buffers, which is why
//! the DP's period (the thesis's dashed line) is optimistic: 1F1B\* then needs a longer
//! period to fit, or nothing fits at all.

use super::onef1b::best_schedule;
use super::{PipeError, PipeProblem, PipeRegistration, PipeSolution, PipeSolver};

/// The DP's best contiguous partition (each stage's last layer) and its period, with
/// PipeDream's memory filter or none; `None` if no partition passes the filter.
pub fn partition(problem: &PipeProblem<'_>, memory_filter: bool) -> Option<(Vec<usize>, f64)> {
    let l = problem.layers;
    let n = l.len();
    let p_max = problem.devices.max(1);
    let prefix = l.load_prefix();
    let load = |i: usize, j: usize| prefix[j + 1] - prefix[i];
    let passes = |i: usize, j: usize, position: usize| {
        if !memory_filter {
            return true;
        }
        let bytes: u64 = (i..=j).map(|x| l.stored[x] + l.weights[x]).sum();
        problem.fits(bytes.saturating_mul((problem.devices.saturating_sub(position)) as u64))
    };
    // a[p][j]: layers 0..=j on exactly p+1 stages; arg for the back-track.
    let mut a = vec![vec![f64::INFINITY; n]; p_max];
    let mut arg = vec![vec![usize::MAX; n]; p_max];
    for (j, a0) in a[0].iter_mut().enumerate() {
        if passes(0, j, 1) {
            *a0 = load(0, j);
        }
    }
    for p in 1..p_max {
        for j in p..n {
            for i in (p - 1)..j {
                if a[p - 1][i].is_infinite() || !passes(i + 1, j, p + 1) {
                    continue;
                }
                let v = a[p - 1][i].max(problem.comm(i)).max(load(i + 1, j));
                if v < a[p][j] {
                    a[p][j] = v;
                    arg[p][j] = i;
                }
            }
        }
    }
    let (p, &best) = a.iter().map(|row| &row[n - 1]).enumerate().min_by(|x, y| x.1.total_cmp(y.1))?;
    if best.is_infinite() {
        return None;
    }
    let mut bounds = vec![n - 1];
    let (mut p, mut j) = (p, n - 1);
    while p > 0 {
        j = arg[p][j];
        bounds.push(j);
        p -= 1;
    }
    bounds.reverse();
    Some((bounds, best))
}

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
