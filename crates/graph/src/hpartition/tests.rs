use super::*;
use crate::{ComputeNode, DataNode};

/// A small deterministic RNG (xorshift64*), so the randomized tests need no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// A random DAG numbered in a topological order: each node reads 0 to 3 earlier nodes,
/// mostly recent ones.
fn random_dag(rng: &mut Rng, n: usize) -> Vec<Vec<usize>> {
    (0..n)
        .map(|v| {
            if v == 0 {
                return Vec::new();
            }
            let k = rng.below(4).min(v);
            let mut p: Vec<usize> =
                (0..k).map(|_| if rng.below(3) == 0 { rng.below(v) } else { v - 1 - rng.below(v.min(4)) }).collect();
            p.sort_unstable();
            p.dedup();
            p
        })
        .collect()
}

/// A training graph whose forward graph is `preds`: op `i` reads the activations of its
/// predecessors (or the input), writes activation `a{i}` of `sizes[i]` and a saved tensor;
/// the loss reads the activations nobody else reads; one backward per forward op.
fn graph_from_dag(preds: &[Vec<usize>], sizes: &[u64], ops: &[&str]) -> TrainingGraph {
    let n = preds.len();
    let data_node = |name: String, kind, size| DataNode { name, kind, size };
    let node = |name: String, kind, inputs, outputs, op: Option<&str>, forward| ComputeNode {
        name,
        kind,
        time: 1.0,
        tmp: 0,
        inputs,
        outputs,
        op: op.map(str::to_string),
        forward,
        stage: None,
    };
    // data: 0 = input, then per op: activation 1+3i, saved 2+3i, gradient 3+3i.
    let (act, saved, grad) = (|i: usize| 1 + 3 * i, |i: usize| 2 + 3 * i, |i: usize| 3 + 3 * i);
    let mut data = vec![data_node("x".into(), DataKind::Input, 1)];
    for (i, &size) in sizes.iter().enumerate() {
        data.push(data_node(format!("a{i}"), DataKind::Activation, size));
        data.push(data_node(format!("s{i}"), DataKind::Saved, 1));
        data.push(data_node(format!("g{i}"), DataKind::Gradient, size));
    }
    let mut used = vec![false; n];
    for p in preds {
        for &u in p {
            used[u] = true;
        }
    }
    let mut compute = Vec::new();
    for (i, p) in preds.iter().enumerate() {
        let inputs = if p.is_empty() { vec![0] } else { p.iter().map(|&u| act(u)).collect() };
        compute.push(node(format!("f{i}"), ComputeKind::Forward, inputs, vec![act(i), saved(i)], Some(ops[i]), None));
    }
    let sinks: Vec<usize> = (0..n).filter(|&i| !used[i]).collect();
    compute.push(node(
        "loss".into(),
        ComputeKind::Loss,
        sinks.iter().map(|&i| act(i)).collect(),
        sinks.iter().map(|&i| grad(i)).collect(),
        None,
        None,
    ));
    for i in (0..n).rev() {
        let mut inputs = vec![grad(i), saved(i)];
        inputs.extend(preds[i].iter().map(|&u| act(u)));
        let outputs = preds[i].iter().map(|&u| grad(u)).collect();
        compute.push(node(format!("b{i}"), ComputeKind::Backward, inputs, outputs, Some(ops[i]), Some(i)));
    }
    let g = TrainingGraph { name: None, compute, data, param_grads_from_backward: false };
    g.validate().expect("test graphs are valid");
    g
}

fn uniform_graph(preds: &[Vec<usize>]) -> TrainingGraph {
    let n = preds.len();
    graph_from_dag(preds, &vec![10; n], &vec!["op"; n])
}

fn chain(n: usize) -> Vec<Vec<usize>> {
    (0..n).map(|i| if i == 0 { vec![] } else { vec![i - 1] }).collect()
}

/// `k` diamonds in a row: `a → b, a → c, (b, c) → d`, each `d` the next `a`... plus a
/// residual `a → d`, so each diamond has 4 ops.
fn chain_of_diamonds(k: usize) -> Vec<Vec<usize>> {
    let mut preds = vec![vec![]];
    for _ in 0..k {
        let a = preds.len() - 1;
        preds.push(vec![a]); // b
        preds.push(vec![a]); // c
        preds.push(vec![a + 1, a + 2]); // d
        preds.push(vec![a, a + 3]); // e = a + d (residual)
    }
    preds
}

/// Depth of a part: 0 for an op, 1 + the deepest part for a cluster.
fn depth(h: &Hierarchy, part: Part) -> usize {
    match part {
        Part::Op(_) => 0,
        Part::Cluster(c) => 1 + h.clusters[c].parts.iter().map(|&p| depth(h, p)).max().unwrap_or(0),
    }
}

/// Checks every structural promise of a hierarchy.
fn check_hierarchy(g: &TrainingGraph, h: &Hierarchy, cfg: &HPartitionConfig) {
    let forward: Vec<ComputeId> =
        g.compute.iter().enumerate().filter(|(_, c)| c.kind == ComputeKind::Forward).map(|(i, _)| i).collect();
    let fg = ForwardGraph::new(g);
    let mut local = vec![usize::MAX; g.compute.len()];
    for (i, &c) in forward.iter().enumerate() {
        local[c] = i;
    }
    assert_eq!(h.top, h.clusters.len() - 1, "the top cluster comes last");
    assert_eq!(h.clusters[h.top].ops, forward, "the top cluster holds every forward op");
    // Each op is a leaf of exactly one cluster; each non-top cluster is a part of exactly one.
    let mut op_seen = vec![0; g.compute.len()];
    let mut cluster_seen = vec![0; h.clusters.len()];
    for (ci, c) in h.clusters.iter().enumerate() {
        let cap = if ci == h.top { cfg.max_top } else { cfg.max_sub };
        assert!(c.parts.len() <= cap, "cluster {ci} has {} parts > {cap}", c.parts.len());
        if ci != h.top || forward.len() > 1 {
            assert!(c.parts.len() >= 2, "cluster {ci} has a single part");
        }
        let mut ops = Vec::new();
        for &p in &c.parts {
            match p {
                Part::Op(o) => {
                    op_seen[o] += 1;
                    ops.push(o);
                }
                Part::Cluster(k) => {
                    assert!(k < ci, "children before parents");
                    cluster_seen[k] += 1;
                    ops.extend(&h.clusters[k].ops);
                }
            }
        }
        ops.sort_unstable();
        assert_eq!(ops, c.ops, "cluster {ci}: ops are the union of its parts' ops, in list order");
        // Contracted graph: each edge between two parts goes forward in `parts`.
        let mut part_of = HashMap::new();
        for (pi, &p) in c.parts.iter().enumerate() {
            let ops: Vec<ComputeId> = match p {
                Part::Op(o) => vec![o],
                Part::Cluster(k) => h.clusters[k].ops.clone(),
            };
            for o in ops {
                part_of.insert(local[o], pi);
            }
        }
        for (v, ps) in fg.preds.iter().enumerate() {
            for &u in ps {
                if let (Some(&pu), Some(&pv)) = (part_of.get(&u), part_of.get(&v)) {
                    assert!(pu <= pv, "cluster {ci}: edge from part {pu} to part {pv} goes backward");
                }
            }
        }
        // Every cluster is convex in the forward graph.
        let nodes: Vec<usize> = c.ops.iter().map(|&o| local[o]).collect();
        assert!(is_convex(&fg.preds, &nodes), "cluster {ci} is not convex");
    }
    for &o in &forward {
        assert_eq!(op_seen[o], 1, "op {o} appears {} times as a leaf", op_seen[o]);
    }
    for (ci, &n) in cluster_seen.iter().enumerate() {
        assert_eq!(n, usize::from(ci != h.top), "cluster {ci} is a part of {n} clusters");
    }
}

// a → b, a → c, b → d, c → d, d → e (digest §8.2 item 7).
const A: usize = 0;
const B: usize = 1;
const C: usize = 2;
const D: usize = 3;
const E: usize = 4;

fn diamond_tail() -> Vec<Vec<usize>> {
    vec![vec![], vec![A], vec![A], vec![B, C], vec![D]]
}

#[test]
fn the_thesis_example_has_the_four_candidates_of_d() {
    let preds = diamond_tail();
    let idom = closest_common_ancestors(&preds);
    assert_eq!(idom, vec![None, Some(A), Some(A), Some(A), Some(D)]);
    let cands = candidates_of(&preds, &idom, D, 20);
    let sets: Vec<Vec<usize>> = cands.iter().map(|c| c.nodes.clone()).collect();
    assert_eq!(sets, vec![vec![A, B, C, D], vec![B, C, D], vec![A, B, C], vec![B, C]]);
    for c in &cands {
        assert_eq!(c.head, Some(A));
        assert!(is_valid_region(&preds, c), "{c:?}");
        assert!(is_convex(&preds, &c.nodes), "{c:?}");
    }
    // With a cap of 3 nodes, only the two 3-node... and the 2-node ones remain.
    let small: Vec<Vec<usize>> = candidates_of(&preds, &idom, D, 3).into_iter().map(|c| c.nodes).collect();
    assert_eq!(small, vec![vec![B, C, D], vec![A, B, C], vec![B, C]]);
    // e has a single predecessor: its only candidate is {d, e}, rooted at d.
    let e = candidates_of(&preds, &idom, E, 20);
    assert_eq!(e, vec![Candidate { nodes: vec![D, E], head: Some(D) }]);
    // {b, c, d} ∪ {d, e} = {b, c, d, e}, rooted at a.
    let u = union_candidates(&cands[1], &e[0]);
    assert_eq!(u, Candidate { nodes: vec![B, C, D, E], head: Some(A) });
    assert_eq!(union_candidates(&e[0], &cands[1]), u, "the union is symmetric");
    assert!(is_valid_region(&preds, &u) && is_convex(&preds, &u.nodes));
    // Non-convex sets are caught: {a, d} skips b and c.
    assert!(!is_convex(&preds, &[A, D]));
    assert!(!is_valid_region(&preds, &Candidate { nodes: vec![B, D], head: Some(A) }));
}

#[test]
fn a_literal_common_ancestor_would_not_be_a_root() {
    // a → b → x, a → c → x, v → b: the only common ancestor of b and c is a, but v enters
    // {b, c, x} from the side; the dominator of x is the global source.
    let (a, v, b, c, x) = (0, 1, 2, 3, 4);
    let preds = vec![vec![], vec![], vec![a, v], vec![a], vec![b, c]];
    let idom = closest_common_ancestors(&preds);
    assert_eq!(idom[x], None);
    assert!(!is_valid_region(&preds, &Candidate { nodes: vec![b, c, x], head: Some(a) }));
    let cands = candidates_of(&preds, &idom, x, 20);
    let sets: Vec<Vec<usize>> = cands.iter().map(|c| c.nodes.clone()).collect();
    assert_eq!(sets, vec![vec![a, v, b, c, x], vec![a, v, b, c]]);
}

#[test]
fn random_candidates_and_their_unions_are_convex_regions() {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut unions = 0;
    for case in 0..200 {
        let n = 5 + rng.below(36);
        let preds = random_dag(&mut rng, n);
        let cands = flow_candidates(&preds, usize::MAX);
        assert!(!cands.is_empty() || n < 2);
        for c in &cands {
            assert!(is_valid_region(&preds, c), "case {case}: {c:?} in {preds:?}");
            assert!(is_convex(&preds, &c.nodes), "case {case}: {c:?} in {preds:?}");
        }
        for (i, c) in cands.iter().enumerate() {
            for d in &cands[i + 1..] {
                if c.nodes.iter().any(|v| d.nodes.binary_search(v).is_ok()) {
                    let u = union_candidates(c, d);
                    assert!(is_valid_region(&preds, &u), "case {case}: {c:?} ∪ {d:?} = {u:?} in {preds:?}");
                    assert!(is_convex(&preds, &u.nodes), "case {case}: {u:?} in {preds:?}");
                    // A union of a union stays a region too.
                    let third = &cands[(i * 7 + case) % cands.len()];
                    if third.nodes.iter().any(|v| u.nodes.binary_search(v).is_ok()) {
                        let w = union_candidates(&u, third);
                        assert!(is_valid_region(&preds, &w), "case {case}: {u:?} ∪ {third:?} = {w:?}");
                        assert!(is_convex(&preds, &w.nodes));
                    }
                    unions += 1;
                }
            }
        }
    }
    assert!(unions > 10_000, "the test exercised {unions} unions");
}

#[test]
fn random_graphs_give_valid_hierarchies() {
    let mut rng = Rng(42);
    let mut deep = 0;
    for case in 0..200 {
        let n = 5 + rng.below(36);
        let preds = random_dag(&mut rng, n);
        let sizes: Vec<u64> = (0..n).map(|_| 1 + rng.below(100) as u64).collect();
        let g = graph_from_dag(&preds, &sizes, &vec!["op"; n]);
        let cfg = HPartitionConfig { max_sub: 2 + rng.below(5), max_top: 2 + rng.below(7), alpha: 0.5 };
        let h = h_partition(&g, &cfg).unwrap_or_else(|e| panic!("case {case}: {e}"));
        check_hierarchy(&g, &h, &cfg);
        if depth(&h, Part::Cluster(h.top)) >= 3 {
            deep += 1;
        }
    }
    assert!(deep > 50, "only {deep} hierarchies have 3 levels or more");
}

#[test]
fn a_small_graph_is_one_top_cluster_of_ops() {
    let g = uniform_graph(&chain_of_diamonds(3)); // 13 ops
    let h = h_partition(&g, &HPartitionConfig::default()).unwrap();
    assert_eq!(h.clusters.len(), 1);
    assert_eq!(h.top, 0);
    let ops: Vec<Part> = (0..13).map(Part::Op).collect();
    assert_eq!(h.clusters[0].parts, ops);
    assert_eq!(h.clusters[0].ops, (0..13).collect::<Vec<_>>());
    // A single op still gets its top cluster.
    let one = uniform_graph(&chain(1));
    let h = h_partition(&one, &HPartitionConfig::default()).unwrap();
    assert_eq!(h.clusters[h.top].parts, vec![Part::Op(0)]);
}

#[test]
fn a_60_op_chain_is_cut_into_runs_of_8() {
    let g = uniform_graph(&chain(60));
    let cfg = HPartitionConfig { max_sub: 8, max_top: 10, alpha: 0.5 };
    let h = h_partition(&g, &cfg).unwrap();
    check_hierarchy(&g, &h, &cfg);
    let top = &h.clusters[h.top];
    assert!(top.parts.len() <= 10);
    assert!(depth(&h, Part::Cluster(h.top)) >= 2);
    // Equal activations of size 10. The first run reads the graph input, not an
    // activation: {0..k} scores 10·√k, below a pair's 20·√2 up to k = 8, so it grows to
    // the cap first. Then every pair (20·√2 ≈ 28.3), then pairs of pairs (20·2 = 40),
    // then pairs of quads (20·√8 ≈ 56.6) from the left, until 10 nodes remain:
    // 1 + 26 pairs → 1 + 13 quads = 14 → four merges → 5 octets and 5 quads.
    let runs: Vec<Vec<ComputeId>> = top
        .parts
        .iter()
        .map(|&p| match p {
            Part::Cluster(c) => h.clusters[c].ops.clone(),
            Part::Op(o) => vec![o],
        })
        .collect();
    let sizes: Vec<usize> = runs.iter().map(Vec::len).collect();
    assert_eq!(sizes, vec![8, 8, 8, 8, 8, 4, 4, 4, 4, 4]);
    assert_eq!(runs[1], (8..16).collect::<Vec<_>>());
    assert_eq!(runs[9], (56..60).collect::<Vec<_>>());
}

#[test]
fn a_long_chain_gets_several_levels() {
    let g = uniform_graph(&chain(200));
    let cfg = HPartitionConfig { max_sub: 4, max_top: 4, alpha: 0.5 };
    let h = h_partition(&g, &cfg).unwrap();
    check_hierarchy(&g, &h, &cfg);
    // 200 ops in groups of at most 4 need ceil(log4(200/4)) + 1 = 4 levels of clusters at least.
    assert!(depth(&h, Part::Cluster(h.top)) >= 4, "depth {}", depth(&h, Part::Cluster(h.top)));
}

#[test]
fn groups_cut_at_small_activations() {
    // Blocks of 4 ops (a diamond) joined by a small activation: the groups are the blocks.
    let k = 8;
    let preds: Vec<Vec<usize>> = (0..4 * k)
        .map(|i| {
            let base = i - i % 4;
            match i % 4 {
                0 if i == 0 => vec![],
                0 => vec![i - 1],
                1 | 2 => vec![base],
                _ => vec![base + 1, base + 2],
            }
        })
        .collect();
    let sizes: Vec<u64> = (0..4 * k).map(|i| if i % 4 == 3 { 1 } else { 100 }).collect();
    let ops: Vec<&str> = (0..4 * k).map(|i| ["conv", "relu", "gelu", "add"][i % 4]).collect();
    let g = graph_from_dag(&preds, &sizes, &ops);
    let cfg = HPartitionConfig { max_sub: 4, max_top: 8, alpha: 0.5 };
    let h = h_partition(&g, &cfg).unwrap();
    check_hierarchy(&g, &h, &cfg);
    let top = &h.clusters[h.top];
    assert_eq!(top.parts.len(), k);
    for (b, &p) in top.parts.iter().enumerate() {
        let Part::Cluster(c) = p else { panic!("part {b} is an op") };
        assert_eq!(h.clusters[c].ops, (4 * b..4 * b + 4).collect::<Vec<_>>());
    }
    // The first block reads the input (not an activation), the last one feeds the loss:
    // the other six are identical.
    let classes = identical_clusters(&g, &h);
    let block_class: Vec<usize> =
        top.parts.iter().map(|&p| if let Part::Cluster(c) = p { classes[c] } else { 0 }).collect();
    let first_middle = block_class[1];
    assert_eq!(&block_class[1..k - 1], &vec![first_middle; k - 2][..]);
    assert_ne!(block_class[0], first_middle);
    assert_eq!(classes[h.top], h.top);
}

#[test]
fn identical_motifs_are_classed_together() {
    // Three 3-op motifs x → y → z in a row; the third one has a bigger middle activation.
    let preds = chain(9);
    let sizes = [10, 20, 10, 10, 20, 10, 10, 30, 10];
    let ops = ["lin", "relu", "lin", "lin", "relu", "lin", "lin", "relu", "lin"];
    let g = graph_from_dag(&preds, &sizes, &ops);
    let motif = |o: usize| Cluster { parts: (o..o + 3).map(Part::Op).collect(), ops: (o..o + 3).collect() };
    let mut h = Hierarchy { clusters: vec![motif(0), motif(3), motif(6)], top: 3 };
    h.clusters.push(Cluster { parts: (0..3).map(Part::Cluster).collect(), ops: (0..9).collect() });
    // Motif 0 reads the graph input (size 1), motif 1 an activation of size 10, and
    // motif 2 has a middle activation of size 30: all different.
    let classes = identical_clusters(&g, &h);
    assert_eq!(classes, vec![0, 1, 2, 3]);
    // Four motifs after a leading op: motif 3's middle activation differs; motif 4 feeds
    // the loss, which reads its output as the next motif would: identical to 1 and 2.
    let preds = chain(13);
    let sizes = [10, 10, 20, 10, 10, 20, 10, 10, 30, 10, 10, 20, 10];
    let ops = ["lin"; 13];
    let g = graph_from_dag(&preds, &sizes, &ops);
    let motif = |o: usize| Cluster { parts: (o..o + 3).map(Part::Op).collect(), ops: (o..o + 3).collect() };
    let mut clusters = vec![motif(1), motif(4), motif(7), motif(10)];
    let mut top_parts = vec![Part::Op(0)];
    top_parts.extend((0..4).map(Part::Cluster));
    clusters.push(Cluster { parts: top_parts, ops: (0..13).collect() });
    let h = Hierarchy { clusters, top: 4 };
    assert_eq!(identical_clusters(&g, &h), vec![0, 0, 2, 0, 4]);
    // Same ops but split differently into parts: not identical.
    let mut h2 = h.clone();
    h2.clusters.insert(0, Cluster { parts: vec![Part::Op(4), Part::Op(5)], ops: vec![4, 5] });
    h2.clusters[2] = Cluster { parts: vec![Part::Cluster(0), Part::Op(6)], ops: vec![4, 5, 6] };
    for c in &mut h2.clusters[5].parts {
        if let Part::Cluster(k) = c {
            *k += 1;
        }
    }
    h2.top = 5;
    assert_eq!(identical_clusters(&g, &h2), vec![0, 1, 2, 3, 1, 5]);
}

/// Partitions with the default configuration, checks the hierarchy, prints its shape (and
/// the time, for the record: no test asserts it), and returns it with its class count.
fn partition_and_report(name: &str, g: &TrainingGraph) -> (Hierarchy, usize) {
    let cfg = HPartitionConfig::default();
    let start = std::time::Instant::now();
    let h = h_partition(g, &cfg).unwrap();
    let took = start.elapsed();
    check_hierarchy(g, &h, &cfg);
    let classes = identical_clusters(g, &h);
    let distinct = classes.iter().enumerate().filter(|&(i, &c)| i == c).count();
    eprintln!(
        "{name}: {} ops, {} clusters ({distinct} distinct), depth {}, top {} parts, partitioned in {took:?}",
        h.clusters[h.top].ops.len(),
        h.clusters.len(),
        depth(&h, Part::Cluster(h.top)),
        h.clusters[h.top].parts.len(),
    );
    (h, distinct)
}

#[test]
fn a_chain_of_diamonds_of_1500_ops_partitions() {
    let g = uniform_graph(&chain_of_diamonds(375)); // 1501 ops
    let (h, distinct) = partition_and_report("chain of diamonds", &g);
    assert!(distinct < h.clusters.len() / 2, "repeated blocks give repeated clusters");
}

#[test]
fn bad_configs_are_rejected() {
    let g = uniform_graph(&chain(5));
    for cfg in [
        HPartitionConfig { max_sub: 1, ..Default::default() },
        HPartitionConfig { max_top: 1, ..Default::default() },
        HPartitionConfig { alpha: f64::NAN, ..Default::default() },
    ] {
        assert!(matches!(h_partition(&g, &cfg), Err(GraphError::Invalid(_))), "{cfg:?}");
    }
}

#[test]
fn without_candidates_a_level_falls_back_to_consecutive_pairs() {
    // Six entry ops all read by one op z: no node has a candidate of 2 or 3 nodes (the
    // sources have no predecessor, z has 7 ancestors), so the level groups consecutive
    // pairs of the topological order, cheapest first: pairs of sources cost 20·√2, a
    // pair with z costs 60·√2.
    let preds = vec![vec![], vec![], vec![], vec![], vec![], vec![], vec![0, 1, 2, 3, 4, 5]];
    let g = uniform_graph(&preds);
    assert!(flow_candidates(&preds, 3).is_empty());
    let cfg = HPartitionConfig { max_sub: 3, max_top: 4, alpha: 0.5 };
    let h = h_partition(&g, &cfg).unwrap();
    check_hierarchy(&g, &h, &cfg);
    let runs: Vec<Vec<ComputeId>> = h.clusters[h.top]
        .parts
        .iter()
        .map(|&p| match p {
            Part::Cluster(c) => h.clusters[c].ops.clone(),
            Part::Op(o) => vec![o],
        })
        .collect();
    assert_eq!(runs, vec![vec![0, 1], vec![2, 3], vec![4, 5], vec![6]]);
}

/// A Transformer-like forward graph: `enc` encoder layers (self-attention and MLP, 25
/// ops), then `dec` decoder layers (self-attention, cross-attention on the encoder's
/// output, MLP: 44 ops). Returns the predecessors, sizes and op names.
fn transformer(enc: usize, dec: usize) -> (Vec<Vec<usize>>, Vec<u64>, Vec<&'static str>) {
    struct B {
        preds: Vec<Vec<usize>>,
        sizes: Vec<u64>,
        ops: Vec<&'static str>,
    }
    impl B {
        fn op(&mut self, name: &'static str, preds: &[usize], size: u64) -> usize {
            self.preds.push(preds.to_vec());
            self.sizes.push(size);
            self.ops.push(name);
            self.preds.len() - 1
        }
        fn attention(&mut self, x: usize, kv: Option<usize>) -> usize {
            let ln = self.op("layer_norm", &[x], 16);
            let src = kv.unwrap_or(ln);
            let q = self.op("linear", &[ln], 16);
            let k = self.op("linear", &[src], 16);
            let v = self.op("linear", &[src], 16);
            let (qr, kr, vr) =
                (self.op("reshape", &[q], 16), self.op("reshape", &[k], 16), self.op("reshape", &[v], 16));
            let kt = self.op("transpose", &[kr], 16);
            let s = self.op("matmul", &[qr, kt], 64);
            let sc = self.op("scale", &[s], 64);
            let m = self.op("mask", &[sc], 64);
            let sm = self.op("softmax", &[m], 64);
            let dr = self.op("dropout", &[sm], 64);
            let o = self.op("matmul", &[dr, vr], 16);
            let ot = self.op("transpose", &[o], 16);
            let or = self.op("reshape", &[ot], 16);
            let p = self.op("linear", &[or], 16);
            let pd = self.op("dropout", &[p], 16);
            self.op("add", &[x, pd], 16)
        }
        fn mlp(&mut self, x: usize) -> usize {
            let ln = self.op("layer_norm", &[x], 16);
            let f1 = self.op("linear", &[ln], 64);
            let ge = self.op("gelu", &[f1], 64);
            let f2 = self.op("linear", &[ge], 16);
            let d = self.op("dropout", &[f2], 16);
            self.op("add", &[x, d], 16)
        }
    }
    let mut b = B { preds: Vec::new(), sizes: Vec::new(), ops: Vec::new() };
    let emb = b.op("embedding", &[], 16);
    let mut x = b.op("dropout", &[emb], 16);
    for _ in 0..enc {
        x = b.attention(x, None);
        x = b.mlp(x);
    }
    let enc_out = b.op("layer_norm", &[x], 16);
    let demb = b.op("embedding", &[], 16);
    let mut y = b.op("dropout", &[demb], 16);
    for _ in 0..dec {
        y = b.attention(y, None);
        y = b.attention(y, Some(enc_out));
        y = b.mlp(y);
    }
    let ln = b.op("layer_norm", &[y], 16);
    b.op("linear", &[ln], 128);
    (b.preds, b.sizes, b.ops)
}

#[test]
fn an_encoder_decoder_transformer_partitions() {
    let (preds, sizes, ops) = transformer(24, 24);
    let g = graph_from_dag(&preds, &sizes, &ops);
    let (h, distinct) = partition_and_report("transformer 24+24", &g);
    assert_eq!(h.clusters[h.top].ops.len(), 24 * 25 + 24 * 44 + 7);
    assert!(distinct < h.clusters.len() / 2, "repeated layers give repeated clusters");
}

#[test]
fn an_encoder_decoder_transformer_is_shallow() {
    // The cross-attention joins are reached from both inputs: their a(x) is the virtual
    // source and their candidates are too big, so a level's candidates run out with far
    // more than max_top nodes left. The level goes on with runs of consecutive nodes
    // rather than leaving one group per level (1663 → 210 → 100 → 79 → 60 → 41 → 30
    // nodes, depth 5, before; 1663 → 120 → 30, depth 3, now).
    let (preds, sizes, ops) = transformer(24, 24);
    let g = graph_from_dag(&preds, &sizes, &ops);
    let cfg = HPartitionConfig::default();
    let h = h_partition(&g, &cfg).unwrap();
    check_hierarchy(&g, &h, &cfg);
    let d = depth(&h, Part::Cluster(h.top));
    assert!(d <= 3, "depth {d}");
    for (ci, c) in h.clusters.iter().enumerate() {
        let cap = if ci == h.top { cfg.max_top } else { cfg.max_sub };
        assert!((2..=cap).contains(&c.parts.len()), "cluster {ci} has {} parts", c.parts.len());
    }
}
