//! Contiguous partitions of the layers into pipeline stages, by PipeDream's DP (Narayanan
//! et al., SOSP 2019, §3.1), with no replication: `A(j, p) = min_{i<j} max(A(i, p−1),
//! C(i), U(i+1, j))`, `A(j, 1) = U(1, j)`, over at most `P` stages.
//!
//! With its memory filter ([`partition`] with `memory_filter`, the `pipedream` solver's),
//! it is the one of PipeDream's public optimizer (`--use_memory_constraint`): a candidate
//! stage at position `p` is kept if its activations and parameters, times the number of
//! workers after it (`N − p`), fit the memory; the last stage always passes. With none it
//! is the balanced partition ([`balanced_bounds`]) that `1f1b`, `gpipe` and `zb-h1` run on.

use super::PipeProblem;

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

/// The contiguous partition into at most `P` stages with the smallest load-only period
/// (the largest stage or link load): PipeDream's DP with no memory filter.
pub fn balanced_bounds(problem: &PipeProblem<'_>) -> Vec<usize> {
    partition(problem, false).expect("with no memory filter a partition always exists").0
}
