//! Option selection (§3.4.5): which of its parts' options a cluster's H-graph keeps.

use super::{HiremateConfig, Selection};
use crate::hgraph::{HGraph, HKind, HOption};

/// Option selection (§3.4.5): at most `cfg.max_options` over the H-graph's pairs, each
/// at least one. [`Selection::Phantom`] is the thesis: each pair's quota in proportion
/// to its count, chosen by spread on the phantom. [`Selection::Pareto`] first drops the
/// options another beats on both times, the phantom, both overheads and the reads
/// ([`dominated`]), then shares the cap evenly (water-filling: no pair gets more than
/// the level at which the quotas fill the cap) and spreads within each quota. A
/// forward's fast-forward options (beyond its backward's) are always kept.
pub(super) fn select_options(mut h: HGraph, cfg: &HiremateConfig) -> (HGraph, Vec<Vec<usize>>) {
    let mut remap: Vec<Vec<usize>> = h.nodes.iter().map(|n| (0..n.options.len()).collect()).collect();
    let pairs: Vec<(usize, usize)> = (0..h.nodes.len())
        .filter_map(|f| {
            let HKind::Forward { pair } = h.nodes[f].kind else { return None };
            let b = h.nodes.iter().position(|n| n.kind == HKind::Backward { pair })?;
            Some((f, b))
        })
        .collect();
    // The candidates of each pair, by its backward's option index.
    let candidates: Vec<Vec<usize>> = pairs
        .iter()
        .map(|&(f, b)| {
            let nb = h.nodes[b].options.len();
            match cfg.selection {
                Selection::Phantom => (0..nb).collect(),
                Selection::Pareto => {
                    let both = |o: usize| (&h.nodes[f].options[o], &h.nodes[b].options[o]);
                    (0..nb).filter(|&o| !(0..nb).any(|p| dominated(both(o), both(p), o, p))).collect()
                }
            }
        })
        .collect();
    let counts: Vec<usize> = candidates.iter().map(Vec::len).collect();
    let total: usize = counts.iter().sum();
    let quotas: Vec<usize> = if total <= cfg.max_options {
        counts.clone()
    } else {
        match cfg.selection {
            Selection::Phantom => counts
                .iter()
                .map(|&nb| ((cfg.max_options * nb) as f64 / total as f64).floor().max(1.0) as usize)
                .collect(),
            Selection::Pareto => {
                let fill = |q: usize| counts.iter().map(|&c| c.min(q)).sum::<usize>();
                let mut q = 1;
                while fill(q + 1) <= cfg.max_options && q < *counts.iter().max().unwrap_or(&1) {
                    q += 1;
                }
                counts.iter().map(|&c| c.min(q).max(1)).collect()
            }
        }
    };
    for (i, &(f, b)) in pairs.iter().enumerate() {
        let nb = h.nodes[b].options.len();
        if counts[i] == nb && nb <= quotas[i] {
            continue;
        }
        let values: Vec<u64> = candidates[i].iter().map(|&o| h.nodes[f].options[o].phantom).collect();
        let keep: Vec<usize> = spread(&values, quotas[i]).into_iter().map(|j| candidates[i][j]).collect();
        let nf = h.nodes[f].options.len();
        let mut fkeep = keep.clone();
        fkeep.extend(nb..nf);
        h.nodes[f].options = fkeep.iter().map(|&o| h.nodes[f].options[o].clone()).collect();
        h.nodes[b].options = keep.iter().map(|&o| h.nodes[b].options[o].clone()).collect();
        remap[f] = fkeep;
        remap[b] = keep;
    }
    (h, remap)
}

/// Whether option `o` of a pair (its forward's and its backward's [`HOption`]s) is
/// never better than option `p`: no faster forward or backward, no smaller phantom or
/// overhead, no fewer reads. Of two equal options the later is the dominated one.
fn dominated(o: (&HOption, &HOption), p: (&HOption, &HOption), io: usize, ip: usize) -> bool {
    if io == ip {
        return false;
    }
    let key = |x: (&HOption, &HOption)| (x.0.time, x.1.time, x.0.phantom, x.0.overhead, x.1.overhead);
    let (a, b) = (key(o), key(p));
    let no_worse = b.0 <= a.0 && b.1 <= a.1 && b.2 <= a.2 && b.3 <= a.3 && b.4 <= a.4;
    let reads = p.1.reads.iter().all(|d| o.1.reads.contains(d));
    no_worse && reads && (a != b || o.1.reads.len() != p.1.reads.len() || ip < io)
}

/// The spread greedy (§3.4.5, Fig. 3.7): the largest value, the smallest, then the one
/// closest to the middle of the widest gap between chosen values, and so on. Returns
/// indices, in the order chosen.
pub fn spread(values: &[u64], quota: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..values.len()).collect();
    order.sort_by_key(|&i| (std::cmp::Reverse(values[i]), i));
    let mut chosen: Vec<usize> = Vec::new();
    if order.is_empty() || quota == 0 {
        return chosen;
    }
    chosen.push(order[0]);
    if quota >= 2 && order.len() >= 2 {
        chosen.push(*order.last().expect("nonempty"));
    }
    while chosen.len() < quota.min(values.len()) {
        let mut vals: Vec<u64> = chosen.iter().map(|&i| values[i]).collect();
        vals.sort_unstable();
        // The widest gap between consecutive chosen values, and its middle.
        let (lo, hi) =
            vals.windows(2).map(|w| (w[0], w[1])).max_by_key(|&(a, b)| (b - a, std::cmp::Reverse(a))).unwrap_or((0, 0));
        let mid = (lo + hi) as f64 / 2.0;
        let next = (0..values.len())
            .filter(|i| !chosen.contains(i))
            .min_by(|&a, &b| {
                let da = (values[a] as f64 - mid).abs();
                let db = (values[b] as f64 - mid).abs();
                da.total_cmp(&db).then(a.cmp(&b))
            })
            .expect("fewer chosen than values");
        chosen.push(next);
    }
    chosen
}

#[cfg(test)]
mod tests {
    use super::spread;

    /// The research digest's §8.3 B: peaks {100, 90, 80, 55, 50, 20, 10}, quota 3 →
    /// 100, then 10, then 55 (closest to the middle, 55).
    #[test]
    fn spread_picks_the_extremes_then_the_middle() {
        let v = [100, 90, 80, 55, 50, 20, 10];
        let picked: Vec<u64> = spread(&v, 3).iter().map(|&i| v[i]).collect();
        assert_eq!(picked, vec![100, 10, 55]);
    }
}
