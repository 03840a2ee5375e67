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

/// The contiguous partition into at most `P` stages whose largest device memory with one
/// micro-batch per stage ([`PipeProblem::stage_memory`] at `g = 1`) is least: every
/// pipelined schedule holds at least that, so where no partition chosen for its load
/// fits, this one may. `None` if even it does not fit the devices' memory.
pub fn least_memory(problem: &PipeProblem<'_>) -> Option<Vec<usize>> {
    let n = problem.layers.len();
    let p_max = problem.devices.clamp(1, n.max(1));
    // best[p][j]: layers 0..=j on at most p+1 stages; from[p][j]: its last stage's first.
    let mut best = vec![vec![u64::MAX; n]; p_max];
    let mut from = vec![vec![0usize; n]; p_max];
    for j in 0..n {
        best[0][j] = problem.stage_memory(0, j, 1);
        for p in 1..p_max {
            (best[p][j], from[p][j]) = (best[p - 1][j], from[p - 1][j]);
            for i in 1..=j {
                let v = best[p - 1][i - 1].max(problem.stage_memory(i, j, 1));
                if v < best[p][j] {
                    (best[p][j], from[p][j]) = (v, i);
                }
            }
        }
    }
    if n == 0 || !problem.fits(best[p_max - 1][n - 1]) {
        return None;
    }
    let mut bounds = vec![n - 1];
    let (mut p, mut j) = (p_max - 1, n - 1);
    while from[p][j] > 0 {
        j = from[p][j] - 1;
        bounds.push(j);
        p -= 1;
    }
    bounds.reverse();
    Some(bounds)
}

/// The load-only period of a contiguous partition: its largest stage or link load.
pub fn period(problem: &PipeProblem<'_>, bounds: &[usize]) -> f64 {
    let prefix = problem.layers.load_prefix();
    let mut first = 0;
    let mut worst: f64 = 0.0;
    for &last in bounds {
        worst = worst.max(prefix[last + 1] - prefix[first]).max(problem.comm(last));
        first = last + 1;
    }
    worst
}

#[cfg(test)]
mod tests {
    use super::*;
    use pebble_graph::Layers;

    /// Four layers of loads 6, 2, 2, 2 keeping 10, 100, 10, 10 bytes, boundaries of 1
    /// byte, no weights, on 2 devices. A device holding `i..=j` holds what they keep and
    /// 2 bytes of buffers at each inner end: one stage holds 130; `[0] [1..3]` 12 and 122;
    /// `[0..1] [2..3]` 112 and 22; `[0..2] [3]` 122 and 12. The least memory is 112, the
    /// split after layer 1 (period 8), where the balanced split is after layer 0 (period 6).
    #[test]
    fn the_least_memory_split_is_not_the_balanced_one() {
        let l = Layers::new(
            vec![3.0, 1.0, 1.0, 1.0],
            vec![3.0, 1.0, 1.0, 1.0],
            vec![10, 100, 10, 10],
            vec![1; 4],
            vec![0; 4],
        );
        let at = |memory| PipeProblem::new(&l, 2, memory, f64::INFINITY);
        assert_eq!(balanced_bounds(&at(None)), vec![0, 3]);
        assert_eq!(least_memory(&at(None)), Some(vec![1, 3]));
        assert_eq!(least_memory(&at(Some(112))), Some(vec![1, 3]));
        assert_eq!(least_memory(&at(Some(111))), None);
        assert_eq!(period(&at(None), &[1, 3]), 8.0);
        assert_eq!(period(&at(None), &[0, 3]), 6.0);
    }
}
