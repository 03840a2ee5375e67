//! H-Partition: HiRemate's hierarchical partitioner (Zhao's thesis, §3.3, Algorithm 7).
//!
//! It works on the **forward graph** of a [`TrainingGraph`]: its vertices are the forward
//! compute nodes, with an edge `u → v` when `v` reads an [`DataKind::Activation`] that `u`
//! produces. Backward nodes follow their forward nodes into the same cluster, so they play
//! no part here.
//!
//! One level of the hierarchy is built greedily from **candidate groups**:
//!
//! * for each node `x`, `a(x)` is the closest common ancestor of its direct predecessors
//!   in the dominator sense: the nearest node through which every path from the (virtual)
//!   global source to `x` passes, i.e. its immediate dominator. The global source stands
//!   for all the entry points and is never part of a group;
//! * the candidates of `x` are the nodes on the paths from `a(x)` to `x`, with or without
//!   `x`, with or without `a(x)`, when they have between 2 and `M^l` nodes of the level;
//! * the candidate with the lowest score `s(C) = (interface memory of C) × (#ops in C)^α`
//!   is wrapped into a group (ties: the smallest node); every other candidate that
//!   intersects it becomes its union with it, and is dropped if that has more than `M^l`
//!   nodes or equals the group; this repeats until no candidate is left or the level has
//!   at most `M^t` nodes (a group counting as one). A group never takes the whole level,
//!   so the top cluster has at least 2 and at most `M^t` parts.
//!
//! Every group then becomes a node of the next level, until the level has at most `M^t`
//! nodes; those form the top cluster. A level whose candidates run out while it still has
//! more than `M^t` nodes (there are none, or too few: in an encoder-decoder Transformer
//! the cross-attention joins are reached from both inputs, so their `a(x)` is the virtual
//! source and their candidates are too big) goes on with the same greedy over pairs of
//! consecutive nodes of a topological order of the level with its groups so far
//! contracted, a node weighing the parts it holds (a contiguous range of a topological
//! order is convex, and so is the union of two intersecting ones). So each level shrinks
//! by about a factor `M^l`, or to `M^t` nodes, rather than by as little as one group.
//!
//! **Validity.** Every candidate is a *single-entry region*: it has a root `h` that reaches
//! all of it, and every edge entering it from outside either leaves `h` (when `h` is not
//! in it) or enters `h` (when it is). This is the thesis's Property 3 extended to the
//! variants that include `a(x)`; the thesis's Lemma 3.3.1, Lemma 3.3.2 and Theorem 3.3.2
//! carry over: such a region is convex (Def 3.3.1), the union of two intersecting ones is
//! one, and contracting any family of disjoint ones at once creates no cycle. Taking
//! `a(x)` as the immediate dominator (rather than any minimal common ancestor of the
//! predecessors, which in a DAG need not be unique) is what makes the candidates of `x`
//! regions: with a literal common ancestor, a predecessor of a member can enter from the
//! side. It coincides with the thesis's `a(x)` on the thesis's examples, and it is what
//! the reference implementation's "flows" compute.
//!
//! [`identical_clusters`] finds the clusters that compute the same thing, so that a
//! hierarchical solver solves each class once (§3.3.5).

use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, HashMap, HashSet};

use crate::{ComputeId, ComputeKind, DataKind, GraphError, TrainingGraph};

#[cfg(test)]
mod tests;

/// The parameters of H-Partition (the thesis's `M^l`, `M^t` and α; the reference
/// implementation's defaults).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HPartitionConfig {
    /// `M^l`: the most parts of a cluster below the top (at least 2). Default 20.
    pub max_sub: usize,
    /// `M^t`: the most parts of the top cluster (at least 2). Default 30.
    pub max_top: usize,
    /// α: the exponent of the number of ops in the score. Default 0.5.
    pub alpha: f64,
}

impl HPartitionConfig {
    /// The defaults, as a constant.
    pub const DEFAULT: HPartitionConfig = HPartitionConfig { max_sub: 20, max_top: 30, alpha: 0.5 };
}

impl Default for HPartitionConfig {
    fn default() -> Self {
        HPartitionConfig::DEFAULT
    }
}

/// A node of the hierarchy at some level: a single forward op or a sub-cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Part {
    /// A forward compute node of the graph.
    Op(ComputeId),
    /// A cluster, by its index in [`Hierarchy::clusters`].
    Cluster(usize),
}

/// A cluster of the hierarchy (an H-Cluster, Def 3.2.1, seen through its forward ops).
#[derive(Debug, Clone)]
pub struct Cluster {
    /// Its parts (at most `max_sub`, or `max_top` for the top one), listed in a
    /// topological order of the forward graph with each part contracted into one node.
    pub parts: Vec<Part>,
    /// Every forward op inside, recursively, in the graph's list order.
    pub ops: Vec<ComputeId>,
}

/// The result of H-Partition: a tree of clusters.
#[derive(Debug, Clone)]
pub struct Hierarchy {
    /// All the clusters, children before their parents.
    pub clusters: Vec<Cluster>,
    /// The index of the top cluster, which holds every forward op.
    pub top: usize,
}

/// Partitions the forward graph of `g` into a hierarchy of clusters (Algorithm 7).
///
/// If `g` has at most `max_top` forward ops, the hierarchy is one top cluster of
/// [`Part::Op`]s. No cluster other than the top one has a single part.
pub fn h_partition(g: &TrainingGraph, cfg: &HPartitionConfig) -> Result<Hierarchy, GraphError> {
    if cfg.max_sub < 2 {
        return Err(GraphError::Invalid(format!("H-Partition: max_sub must be at least 2, got {}", cfg.max_sub)));
    }
    if cfg.max_top < 2 {
        return Err(GraphError::Invalid(format!("H-Partition: max_top must be at least 2, got {}", cfg.max_top)));
    }
    if !cfg.alpha.is_finite() {
        return Err(GraphError::Invalid(format!("H-Partition: alpha must be finite, got {}", cfg.alpha)));
    }
    g.validate()?;
    let fg = ForwardGraph::new(g);
    if fg.ops.is_empty() {
        return Err(GraphError::Invalid("H-Partition: the graph has no forward op".into()));
    }
    let mut clusters: Vec<Cluster> = Vec::new();
    let mut level =
        Level::new(&fg, fg.ops.iter().map(|&c| Part::Op(c)).collect(), (0..fg.ops.len()).map(|i| vec![i]).collect())?;
    while level.len() > cfg.max_top {
        let mut groups =
            select_groups(&level, flow_candidates(&level.preds, cfg.max_sub), cfg, true, &vec![1; level.len()]);
        if level.len() - groups.iter().map(|g| g.len() - 1).sum::<usize>() > cfg.max_top {
            groups = continue_with_runs(&fg, &level, groups, cfg)?;
        }
        debug_assert!(!groups.is_empty(), "a level with more than max_top >= 2 nodes always has a pair to group");
        let mut grouped = vec![false; level.len()];
        let mut parts = Vec::new();
        let mut ops = Vec::new();
        for group in groups {
            let mut inside: Vec<usize> = group.iter().flat_map(|&v| level.ops[v].iter().copied()).collect();
            inside.sort_unstable();
            for &v in &group {
                grouped[v] = true;
            }
            clusters.push(Cluster {
                parts: group.iter().map(|&v| level.parts[v]).collect(),
                ops: inside.iter().map(|&i| fg.ops[i]).collect(),
            });
            parts.push(Part::Cluster(clusters.len() - 1));
            ops.push(inside);
        }
        for ((&part, o), _) in level.parts.iter().zip(&level.ops).zip(&grouped).filter(|(_, &g)| !g) {
            parts.push(part);
            ops.push(o.clone());
        }
        level = Level::new(&fg, parts, ops)?;
    }
    clusters.push(Cluster { parts: level.parts, ops: fg.ops });
    Ok(Hierarchy { top: clusters.len() - 1, clusters })
}

/// For each cluster of `h`, the index of the first cluster that computes the same thing.
///
/// Two clusters are identical when their ops, in list order, have the same op string,
/// time, temporary memory, input and output data (kind and size), the same internal
/// wiring (for each input, the relative position of its producer inside the cluster and
/// which of its outputs it is, or "from outside"), the same outputs read outside the
/// cluster (by a forward op or the loss), the same backward nodes (time, temporary
/// memory, data sizes), and the same split into parts, identical part by part (so that
/// the solutions of one apply to the other).
pub fn identical_clusters(g: &TrainingGraph, h: &Hierarchy) -> Vec<usize> {
    #[derive(PartialEq, Eq, Hash)]
    enum Tok<'a> {
        Op(Option<&'a str>),
        N(u64),
        Internal(usize, usize),
        External(DataKind, u64),
        Part(usize),
        SubCluster(usize, usize),
    }
    let producers = g.producers();
    let consumers = g.consumers();
    let mut backward: Vec<Vec<ComputeId>> = vec![Vec::new(); g.compute.len()];
    for (c, node) in g.compute.iter().enumerate() {
        if let (ComputeKind::Backward, Some(f)) = (node.kind, node.forward) {
            if f < backward.len() {
                backward[f].push(c);
            }
        }
    }
    let mut classes: Vec<usize> = Vec::with_capacity(h.clusters.len());
    let mut seen: HashMap<Vec<Tok>, usize> = HashMap::new();
    let mut pos: HashMap<ComputeId, usize> = HashMap::new();
    for (ci, cluster) in h.clusters.iter().enumerate() {
        pos.clear();
        pos.extend(cluster.ops.iter().enumerate().map(|(i, &c)| (c, i)));
        let mut key: Vec<Tok> = Vec::new();
        for &c in &cluster.ops {
            let node = &g.compute[c];
            key.extend([
                Tok::Op(node.op.as_deref()),
                Tok::N(node.time.to_bits()),
                Tok::N(node.tmp),
                Tok::N(node.inputs.len() as u64),
            ]);
            for &d in &node.inputs {
                let inside = match producers[d][..] {
                    [p] => pos.get(&p).map(|&i| (i, g.compute[p].outputs.iter().position(|&o| o == d).unwrap_or(0))),
                    _ => None,
                };
                key.push(match inside {
                    Some((i, k)) => Tok::Internal(i, k),
                    None => Tok::External(g.data[d].kind, g.data[d].size),
                });
            }
            key.push(Tok::N(node.outputs.len() as u64));
            for &d in &node.outputs {
                let read_outside = consumers[d].iter().any(|&u| {
                    matches!(g.compute[u].kind, ComputeKind::Forward | ComputeKind::Loss) && !pos.contains_key(&u)
                });
                key.extend([Tok::External(g.data[d].kind, g.data[d].size), Tok::N(read_outside as u64)]);
            }
            key.push(Tok::N(backward[c].len() as u64));
            for &b in &backward[c] {
                let bn = &g.compute[b];
                key.extend([Tok::N(bn.time.to_bits()), Tok::N(bn.tmp), Tok::N(bn.inputs.len() as u64)]);
                key.extend(bn.inputs.iter().chain(&bn.outputs).map(|&d| Tok::External(g.data[d].kind, g.data[d].size)));
            }
        }
        key.push(Tok::N(cluster.parts.len() as u64));
        for part in &cluster.parts {
            key.push(match *part {
                Part::Op(c) => Tok::Part(pos.get(&c).copied().unwrap_or(usize::MAX)),
                Part::Cluster(k) => {
                    let class = if k < ci { classes[k] } else { k };
                    let first = h.clusters.get(k).and_then(|s| s.ops.first()).and_then(|c| pos.get(c)).copied();
                    Tok::SubCluster(class, first.unwrap_or(usize::MAX))
                }
            });
        }
        classes.push(*seen.entry(key).or_insert(ci));
    }
    classes
}

/// The forward graph: forward ops (local ids in list order, which is topological) and the
/// activations that may be part of an interface.
struct ForwardGraph {
    /// Local id → compute id.
    ops: Vec<ComputeId>,
    /// Direct predecessors, by local id.
    preds: Vec<Vec<usize>>,
    /// Activations produced by a forward op and read by a forward op or the loss.
    data: Vec<Activation>,
}

struct Activation {
    size: u64,
    /// Forward producers (local ids).
    producers: Vec<usize>,
    /// Forward consumers (local ids).
    consumers: Vec<usize>,
    /// Read by the loss node.
    by_loss: bool,
}

impl ForwardGraph {
    fn new(g: &TrainingGraph) -> ForwardGraph {
        let ops: Vec<ComputeId> =
            g.compute.iter().enumerate().filter(|(_, c)| c.kind == ComputeKind::Forward).map(|(i, _)| i).collect();
        let mut local = vec![usize::MAX; g.compute.len()];
        for (i, &c) in ops.iter().enumerate() {
            local[c] = i;
        }
        let nd = g.data.len();
        let mut producers = vec![Vec::new(); nd];
        let mut consumers = vec![Vec::new(); nd];
        let mut by_loss = vec![false; nd];
        let is_act = |d: usize| g.data[d].kind == DataKind::Activation;
        for (c, node) in g.compute.iter().enumerate() {
            match node.kind {
                ComputeKind::Forward => {
                    for &d in node.outputs.iter().filter(|&&d| is_act(d)) {
                        producers[d].push(local[c]);
                    }
                    for &d in node.inputs.iter().filter(|&&d| is_act(d)) {
                        consumers[d].push(local[c]);
                    }
                }
                ComputeKind::Loss => {
                    for &d in node.inputs.iter().filter(|&&d| is_act(d)) {
                        by_loss[d] = true;
                    }
                }
                ComputeKind::Backward => {}
            }
        }
        let mut preds = vec![Vec::new(); ops.len()];
        let mut data = Vec::new();
        for d in 0..nd {
            let (mut p, mut c) = (std::mem::take(&mut producers[d]), std::mem::take(&mut consumers[d]));
            p.sort_unstable();
            p.dedup();
            c.sort_unstable();
            c.dedup();
            for &v in &c {
                preds[v].extend(p.iter().copied().filter(|&u| u != v));
            }
            if !p.is_empty() && (!c.is_empty() || by_loss[d]) {
                data.push(Activation { size: g.data[d].size, producers: p, consumers: c, by_loss: by_loss[d] });
            }
        }
        for p in &mut preds {
            p.sort_unstable();
            p.dedup();
        }
        ForwardGraph { ops, preds, data }
    }
}

/// One level of the hierarchy: the forward graph with each part contracted into a node.
/// Nodes are numbered in a topological order.
struct Level {
    parts: Vec<Part>,
    /// The forward ops of each node (local ids, sorted).
    ops: Vec<Vec<usize>>,
    /// Direct predecessors (all smaller ids), sorted.
    preds: Vec<Vec<usize>>,
    /// For each activation of the forward graph: the nodes that produce it, and those that read it.
    producers: Vec<Vec<usize>>,
    consumers: Vec<Vec<usize>>,
    /// For each activation: its size, and whether the loss reads it.
    sizes: Vec<u64>,
    by_loss: Vec<bool>,
    /// For each node: the activations it produces or reads that cross its boundary.
    touch: Vec<Vec<usize>>,
}

impl Level {
    fn new(fg: &ForwardGraph, parts: Vec<Part>, ops: Vec<Vec<usize>>) -> Result<Level, GraphError> {
        let n = parts.len();
        let mut node_of = vec![usize::MAX; fg.ops.len()];
        for (v, o) in ops.iter().enumerate() {
            for &i in o {
                node_of[i] = v;
            }
        }
        let mut succs: Vec<Vec<usize>> = vec![Vec::new(); n];
        for (i, ps) in fg.preds.iter().enumerate() {
            for &p in ps {
                if node_of[p] != node_of[i] {
                    succs[node_of[p]].push(node_of[i]);
                }
            }
        }
        let mut indeg = vec![0usize; n];
        for s in &mut succs {
            s.sort_unstable();
            s.dedup();
            for &v in s.iter() {
                indeg[v] += 1;
            }
        }
        // Kahn's algorithm, the node with the first op first.
        let mut ready: BinaryHeap<Reverse<(usize, usize)>> =
            (0..n).filter(|&v| indeg[v] == 0).map(|v| Reverse((ops[v][0], v))).collect();
        let mut rank = vec![usize::MAX; n];
        let mut order = Vec::with_capacity(n);
        while let Some(Reverse((_, v))) = ready.pop() {
            rank[v] = order.len();
            order.push(v);
            for &w in &succs[v] {
                indeg[w] -= 1;
                if indeg[w] == 0 {
                    ready.push(Reverse((ops[w][0], w)));
                }
            }
        }
        if order.len() < n {
            return Err(GraphError::Invalid(
                "H-Partition: contracting the groups made a cycle in the forward graph (a bug)".into(),
            ));
        }
        let mut preds = vec![Vec::new(); n];
        for (v, s) in succs.iter().enumerate() {
            for &w in s {
                preds[rank[w]].push(rank[v]);
            }
        }
        for p in &mut preds {
            p.sort_unstable();
        }
        let map = |ids: &[usize]| {
            let mut m: Vec<usize> = ids.iter().map(|&i| rank[node_of[i]]).collect();
            m.sort_unstable();
            m.dedup();
            m
        };
        let producers: Vec<Vec<usize>> = fg.data.iter().map(|a| map(&a.producers)).collect();
        let consumers: Vec<Vec<usize>> = fg.data.iter().map(|a| map(&a.consumers)).collect();
        let mut touch = vec![Vec::new(); n];
        for (k, a) in fg.data.iter().enumerate() {
            let (p, c) = (&producers[k], &consumers[k]);
            let internal = !a.by_loss && p.len() == 1 && c.iter().all(|&v| v == p[0]);
            if !internal {
                let mut nodes: Vec<usize> = p.iter().chain(c).copied().collect();
                nodes.sort_unstable();
                nodes.dedup();
                for v in nodes {
                    touch[v].push(k);
                }
            }
        }
        let mut new_parts = Vec::with_capacity(n);
        let mut new_ops = Vec::with_capacity(n);
        let mut ops = ops;
        for &v in &order {
            new_parts.push(parts[v]);
            new_ops.push(std::mem::take(&mut ops[v]));
        }
        Ok(Level {
            parts: new_parts,
            ops: new_ops,
            preds,
            producers,
            consumers,
            sizes: fg.data.iter().map(|a| a.size).collect(),
            by_loss: fg.data.iter().map(|a| a.by_loss).collect(),
            touch,
        })
    }

    fn len(&self) -> usize {
        self.parts.len()
    }
}

/// Scores candidate groups: `(in + out interface memory) × (#ops)^α`.
struct Scorer {
    inside: Vec<bool>,
    stamp: Vec<u32>,
    round: u32,
}

impl Scorer {
    fn new(level: &Level) -> Scorer {
        Scorer { inside: vec![false; level.len()], stamp: vec![0; level.producers.len()], round: 0 }
    }

    fn score(&mut self, level: &Level, nodes: &[usize], alpha: f64) -> f64 {
        self.round += 1;
        for &v in nodes {
            self.inside[v] = true;
        }
        let mut mem: u64 = 0;
        let mut ops = 0usize;
        for &v in nodes {
            ops += level.ops[v].len();
            for &k in &level.touch[v] {
                if self.stamp[k] == self.round {
                    continue;
                }
                self.stamp[k] = self.round;
                let (p, c) = (&level.producers[k], &level.consumers[k]);
                let made_in = p.iter().any(|&u| self.inside[u]);
                let made_out = p.iter().any(|&u| !self.inside[u]);
                let read_in = c.iter().any(|&u| self.inside[u]);
                let read_out = level.by_loss[k] || c.iter().any(|&u| !self.inside[u]);
                if (read_in && made_out) || (made_in && read_out) {
                    mem = mem.saturating_add(level.sizes[k]);
                }
            }
        }
        for &v in nodes {
            self.inside[v] = false;
        }
        mem as f64 * (ops as f64).powf(alpha)
    }
}

/// A candidate group of nodes (sorted), with its root: the node `h` that reaches all of
/// it and through which every edge entering it passes (`None`: the virtual global source).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Candidate {
    pub(crate) nodes: Vec<usize>,
    pub(crate) head: Option<usize>,
}

/// For each node of a DAG numbered in a topological order (`preds[v]` all below `v`),
/// `a(x)`: its immediate dominator from a virtual source that precedes every entry point,
/// i.e. the closest common ancestor of its direct predecessors in the dominator tree.
/// `None` is the virtual source.
pub(crate) fn closest_common_ancestors(preds: &[Vec<usize>]) -> Vec<Option<usize>> {
    let n = preds.len();
    let mut idom: Vec<Option<usize>> = vec![None; n];
    let mut depth = vec![0usize; n];
    let depth_of = |depth: &[usize], a: Option<usize>| a.map_or(0, |a| depth[a]);
    for x in 0..n {
        debug_assert!(preds[x].iter().all(|&p| p < x), "nodes must be numbered in a topological order");
        let mut a = preds[x].first().copied();
        for &p in preds[x].iter().skip(1) {
            let mut b = Some(p);
            while a != b {
                if depth_of(&depth, a) >= depth_of(&depth, b) {
                    a = a.and_then(|v| idom[v]);
                } else {
                    b = b.and_then(|v| idom[v]);
                }
            }
        }
        idom[x] = a;
        depth[x] = depth_of(&depth, a) + 1;
    }
    idom
}

/// The candidates of node `x` (Algorithm 7, line 3): the nodes on the paths from
/// `a = idom[x]` to `x`, with and without `x`, with and without `a` (in that order:
/// both, without `a`, without `x`, neither), keeping those with 2 to `max_size` nodes.
/// The virtual source is never included.
pub(crate) fn candidates_of(preds: &[Vec<usize>], idom: &[Option<usize>], x: usize, max_size: usize) -> Vec<Candidate> {
    let head = idom[x];
    // Walking back from x without passing through a(x) visits exactly the nodes on the
    // paths from a(x) to x (a(x) dominates x), a(x) excluded.
    let limit = max_size.saturating_add(1);
    let mut seen: HashSet<usize> = HashSet::from([x]);
    let mut stack = vec![x];
    while let Some(v) = stack.pop() {
        for &p in &preds[v] {
            if Some(p) != head && seen.insert(p) {
                if seen.len() > limit {
                    return Vec::new();
                }
                stack.push(p);
            }
        }
    }
    let mut body: Vec<usize> = seen.into_iter().collect();
    body.sort_unstable();
    let without_x: Vec<usize> = body.iter().copied().filter(|&v| v != x).collect();
    let mut variants = Vec::with_capacity(4);
    match head {
        Some(a) => {
            let with_a = |s: &[usize]| {
                let mut s = s.to_vec();
                s.insert(0, a); // a precedes every node it reaches
                s
            };
            variants.push(with_a(&body));
            variants.push(body);
            variants.push(with_a(&without_x));
            variants.push(without_x);
        }
        None => {
            variants.push(body);
            variants.push(without_x);
        }
    }
    variants
        .into_iter()
        .filter(|s| s.len() >= 2 && s.len() <= max_size)
        .map(|nodes| Candidate { nodes, head })
        .collect()
}

/// All the candidates of a DAG numbered in a topological order, without duplicates.
pub(crate) fn flow_candidates(preds: &[Vec<usize>], max_size: usize) -> Vec<Candidate> {
    let idom = closest_common_ancestors(preds);
    let mut seen: HashSet<Vec<usize>> = HashSet::new();
    let mut out = Vec::new();
    for x in 0..preds.len() {
        for c in candidates_of(preds, &idom, x, max_size) {
            if seen.insert(c.nodes.clone()) {
                out.push(c);
            }
        }
    }
    out
}

/// The fallback candidates: pairs of consecutive nodes of the topological order.
fn sequence_candidates(n: usize) -> Vec<Candidate> {
    (1..n).map(|v| Candidate { nodes: vec![v - 1, v], head: None }).collect()
}

/// Finishes a level whose candidates ran out while it still has more than `max_top` nodes
/// (a group counting as one): contracts the groups formed so far, then runs the greedy over
/// runs of consecutive nodes of a topological order of the contracted level, each node
/// weighing the nodes of `level` it holds, so that a group still has at most `max_sub`
/// of them. Returns the groups of `level`: each run expanded, and the earlier groups that
/// no run took.
///
/// A run is convex in the contracted level, hence its expansion is convex in `level`
/// (every group is, and contracting them left a DAG).
fn continue_with_runs(
    fg: &ForwardGraph,
    level: &Level,
    groups: Vec<Vec<usize>>,
    cfg: &HPartitionConfig,
) -> Result<Vec<Vec<usize>>, GraphError> {
    let mut grouped = vec![false; level.len()];
    for &v in groups.iter().flatten() {
        grouped[v] = true;
    }
    let mut units = groups;
    units.extend((0..level.len()).filter(|&v| !grouped[v]).map(|v| vec![v]));
    let ops: Vec<Vec<usize>> = units
        .iter()
        .map(|u| {
            let mut o: Vec<usize> = u.iter().flat_map(|&v| level.ops[v].iter().copied()).collect();
            o.sort_unstable();
            o
        })
        .collect();
    // The parts only label the units, to find them after Level::new reorders them.
    let contracted = Level::new(fg, (0..units.len()).map(Part::Cluster).collect(), ops)?;
    let unit_of: Vec<usize> = contracted
        .parts
        .iter()
        .map(|p| match *p {
            Part::Cluster(u) => u,
            Part::Op(_) => unreachable!("the contracted level is labelled with units"),
        })
        .collect();
    let weight: Vec<usize> = unit_of.iter().map(|&u| units[u].len()).collect();
    let runs = select_groups(&contracted, sequence_candidates(contracted.len()), cfg, false, &weight);
    let mut taken = vec![false; units.len()];
    let mut out = Vec::with_capacity(runs.len());
    for run in runs {
        let mut nodes = Vec::new();
        for v in run {
            taken[unit_of[v]] = true;
            nodes.extend(units[unit_of[v]].iter().copied());
        }
        nodes.sort_unstable();
        out.push(nodes);
    }
    out.extend(units.into_iter().zip(taken).filter(|(u, t)| !t && u.len() >= 2).map(|(u, _)| u));
    Ok(out)
}

/// The union of two intersecting candidates, with its root (Theorem 3.3.2): the root of
/// the one whose root the other contains or shares.
pub(crate) fn union_candidates(c: &Candidate, d: &Candidate) -> Candidate {
    let mut nodes = Vec::with_capacity(c.nodes.len() + d.nodes.len());
    let (mut i, mut j) = (0, 0);
    while i < c.nodes.len() || j < d.nodes.len() {
        let next = match (c.nodes.get(i), d.nodes.get(j)) {
            (Some(&a), Some(&b)) => match a.cmp(&b) {
                Ordering::Less => {
                    i += 1;
                    a
                }
                Ordering::Greater => {
                    j += 1;
                    b
                }
                Ordering::Equal => {
                    i += 1;
                    j += 1;
                    a
                }
            },
            (Some(&a), None) => {
                i += 1;
                a
            }
            (None, Some(&b)) => {
                j += 1;
                b
            }
            (None, None) => unreachable!(),
        };
        nodes.push(next);
    }
    let contains = |s: &Candidate, h: Option<usize>| h.is_some_and(|h| s.nodes.binary_search(&h).is_ok());
    let head = if c.head == d.head || contains(c, d.head) {
        c.head
    } else {
        // By Lemma 3.3.2, d contains c's root.
        d.head
    };
    Candidate { nodes, head }
}

/// Whether `nodes` is convex in a DAG numbered in a topological order (Def 3.3.1): no
/// path leaves it and comes back.
pub(crate) fn is_convex(preds: &[Vec<usize>], nodes: &[usize]) -> bool {
    let n = preds.len();
    let mut inside = vec![false; n];
    for &v in nodes {
        inside[v] = true;
    }
    // below[v]: v is reached from the set by a path of length >= 1.
    let mut below = vec![false; n];
    for v in 0..n {
        below[v] = preds[v].iter().any(|&p| inside[p] || below[p]);
    }
    // above[v]: v reaches the set by a path of length >= 1.
    let mut above = vec![false; n];
    for v in (0..n).rev() {
        if inside[v] || above[v] {
            for &p in &preds[v] {
                above[p] = true;
            }
        }
    }
    (0..n).all(|v| inside[v] || !(below[v] && above[v]))
}

/// Whether `c` is a single-entry region (the thesis's Property 3, extended to a root
/// inside the set): its root reaches all of it, and every edge entering it leaves the
/// root or enters the root.
pub(crate) fn is_valid_region(preds: &[Vec<usize>], c: &Candidate) -> bool {
    let n = preds.len();
    let mut inside = vec![false; n];
    for &v in &c.nodes {
        inside[v] = true;
    }
    let entries_ok =
        c.nodes.iter().all(|&u| Some(u) == c.head || preds[u].iter().all(|&p| inside[p] || Some(p) == c.head));
    let reached = match c.head {
        None => true,
        Some(h) => {
            let mut from_h = vec![false; n];
            from_h[h] = true;
            for v in h + 1..n {
                from_h[v] = preds[v].iter().any(|&p| from_h[p]);
            }
            c.nodes.iter().all(|&v| from_h[v])
        }
    };
    !c.nodes.is_empty() && entries_ok && reached
}

/// A heap entry: the lowest score first, then the smallest node, then the oldest candidate.
struct Entry {
    score: f64,
    first: usize,
    id: usize,
    version: u32,
}

impl Ord for Entry {
    fn cmp(&self, other: &Self) -> Ordering {
        other.score.total_cmp(&self.score).then(other.first.cmp(&self.first)).then(other.id.cmp(&self.id))
    }
}
impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Entry {}

/// The greedy of Algorithm 7 (lines 4–7) on one level: the groups it forms (each sorted,
/// with at least 2 nodes), disjoint. `weight[v]` is the number of parts node `v` stands
/// for (1 but in [`continue_with_runs`]); a group weighs at most `max_sub`.
fn select_groups(
    level: &Level,
    mut cands: Vec<Candidate>,
    cfg: &HPartitionConfig,
    regions: bool,
    weight: &[usize],
) -> Vec<Vec<usize>> {
    let n = level.len();
    let size = |nodes: &[usize]| nodes.iter().map(|&v| weight[v]).sum::<usize>();
    // A group of the whole level would leave a top cluster of one part, with more than
    // max_top parts below it (the loop runs while n > max_top): the cap excludes it.
    let cap = cfg.max_sub.min(weight.iter().sum::<usize>() - 1);
    cands.retain(|c| size(&c.nodes) <= cap);
    let mut alive = vec![true; cands.len()];
    let mut version = vec![0u32; cands.len()];
    let mut stamp = vec![0usize; cands.len()];
    let mut alive_sets: HashSet<Vec<usize>> = cands.iter().map(|c| c.nodes.clone()).collect();
    let mut node_cands: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (i, c) in cands.iter().enumerate() {
        for &v in &c.nodes {
            node_cands[v].push(i);
        }
    }
    let mut scorer = Scorer::new(level);
    let mut heap: BinaryHeap<Entry> = cands
        .iter()
        .enumerate()
        .map(|(id, c)| Entry { score: scorer.score(level, &c.nodes, cfg.alpha), first: c.nodes[0], id, version: 0 })
        .collect();
    let mut group_of: Vec<Option<usize>> = vec![None; n];
    let mut groups: Vec<Option<Vec<usize>>> = Vec::new();
    let mut count = n;
    let mut round = 0;
    while count > cfg.max_top {
        let Some(e) = heap.pop() else { break };
        if !alive[e.id] || version[e.id] != e.version {
            continue;
        }
        alive[e.id] = false;
        let c = cands[e.id].clone();
        alive_sets.remove(&c.nodes);
        debug_assert!(is_convex(&level.preds, &c.nodes), "H-Partition selected a non-convex group {:?}", c.nodes);
        debug_assert!(!regions || is_valid_region(&level.preds, &c), "H-Partition: {c:?} is not a region");
        let gid = groups.len();
        for &v in &c.nodes {
            if let Some(old) = group_of[v] {
                if let Some(o) = groups[old].take() {
                    count += o.len() - 1;
                }
            }
            group_of[v] = Some(gid);
        }
        count -= c.nodes.len() - 1;
        round += 1;
        for &v in &c.nodes {
            let mut k = 0;
            while k < node_cands[v].len() {
                let j = node_cands[v][k];
                k += 1;
                if !alive[j] || stamp[j] == round {
                    continue;
                }
                stamp[j] = round;
                let u = union_candidates(&cands[j], &c);
                alive_sets.remove(&cands[j].nodes);
                if size(&u.nodes) > cap || u.nodes == c.nodes || alive_sets.contains(&u.nodes) {
                    alive[j] = false;
                    continue;
                }
                for &w in &u.nodes {
                    if cands[j].nodes.binary_search(&w).is_err() {
                        node_cands[w].push(j);
                    }
                }
                alive_sets.insert(u.nodes.clone());
                version[j] += 1;
                heap.push(Entry {
                    score: scorer.score(level, &u.nodes, cfg.alpha),
                    first: u.nodes[0],
                    id: j,
                    version: version[j],
                });
                cands[j] = u;
            }
        }
        groups.push(Some(c.nodes));
    }
    groups.into_iter().flatten().collect()
}
