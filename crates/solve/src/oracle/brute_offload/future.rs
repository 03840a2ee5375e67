//! The bound on what is to come: from each state, the least compute time to the end at
//! each level of `Q̂` (Dijkstra backwards over the states).

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::sequences::{Ctx, Node};
use crate::oracle::brute::Cost;

/// Lower bounds on the rest of a schedule from each state of the compute-sequence graph
/// (`act`, `sav`, `f`; which tensors are unread dropped, a relaxation): for each level
/// `q`, `h[q][s]` is the least compute time from `s` to the end with no op whose excess
/// needs more than `q` bytes moved (`Q̂`, see the module docs; Dijkstra backwards from the
/// end). A completion whose largest `Q̂` is `Q` takes at least its compute time, and at
/// least `max(g, Q/β↓) + Q/β↑` (the transfer bound at that op).
pub(super) struct Future {
    index: rustc_hash::FxHashMap<u32, usize>,
    levels: Vec<u64>,
    h: Vec<Vec<f64>>,
}

impl Future {
    /// A state's key: its `act`, `sav` and `f`.
    fn key(n: &Node) -> u32 {
        n.act | n.sav << 8 | (n.f as u32) << 16
    }

    /// Explores the states from `root` and computes `h` at each level.
    pub(super) fn new(ctx: &Ctx<'_>, root: &Node) -> Future {
        let mut index = rustc_hash::FxHashMap::default();
        let mut states = vec![*root];
        index.insert(Self::key(root), 0);
        let mut edges: Vec<(usize, usize, f64, u64)> = Vec::new();
        let mut moves = Vec::new();
        let mut k = 0;
        while k < states.len() {
            let n = states[k];
            moves.clear();
            ctx.moves(&n, &mut moves);
            for &(_, next, q) in &moves {
                let next = Node { unread_act: 0, unread_sav: 0, g: 0.0, m1: 0.0, m2: 0.0, ..next };
                let id = *index.entry(Self::key(&next)).or_insert_with(|| {
                    states.push(next);
                    states.len() - 1
                });
                edges.push((k, id, next.g - n.g, q));
            }
            k += 1;
        }
        // Edge durations: the moves' `g` increments (from a zero start).
        let mut levels: Vec<u64> = edges.iter().map(|e| e.3).collect();
        levels.push(0);
        levels.sort_unstable();
        levels.dedup();
        if levels.len() > 48 {
            let last = *levels.last().unwrap();
            let step = levels.len() as f64 / 47.0;
            let mut thin: Vec<u64> = (0..47).map(|i| levels[(i as f64 * step) as usize]).collect();
            thin.push(last);
            thin.dedup();
            levels = thin;
        }
        let mut into: Vec<Vec<(usize, f64, u64)>> = vec![Vec::new(); states.len()];
        for &(a, b, d, q) in &edges {
            into[b].push((a, d, q));
        }
        let h = levels
            .iter()
            .map(|&level| {
                let mut dist = vec![f64::INFINITY; states.len()];
                let mut heap = BinaryHeap::new();
                for (i, s) in states.iter().enumerate() {
                    if s.f == 0 {
                        dist[i] = 0.0;
                        heap.push(Reverse((Cost(0.0), i)));
                    }
                }
                while let Some(Reverse((Cost(d), b))) = heap.pop() {
                    if d > dist[b] {
                        continue;
                    }
                    for &(a, dt, q) in &into[b] {
                        if q <= level && d + dt < dist[a] {
                            dist[a] = d + dt;
                            heap.push(Reverse((Cost(d + dt), a)));
                        }
                    }
                }
                dist
            })
            .collect();
        Future { index, levels, h }
    }

    /// A lower bound on the makespan of every completion of `n`.
    pub(super) fn bound(&self, ctx: &Ctx<'_>, n: &Node) -> f64 {
        let Some(&s) = self.index.get(&Self::key(n)) else { return f64::INFINITY };
        let mut lb = f64::INFINITY;
        for i in 0..self.levels.len() {
            let rest = self.h[i][s];
            if rest == f64::INFINITY {
                continue;
            }
            let transfer = if i == 0 {
                0.0
            } else {
                let q = self.levels[i - 1] + 1;
                n.g.max(ctx.off_time(q)) + ctx.pre_time(q)
            };
            lb = lb.min((n.g + rest).max(transfer));
        }
        lb
    }
}
