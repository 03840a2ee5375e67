//! Deterministic random chains and small hand-built problems for the tests.

use pebble_graph::{Chain, ComputeKind, ComputeNode, DataKind, DataNode, TrainingGraph};

/// SplitMix64: small, deterministic, good enough for test instances.
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    pub(crate) fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo + 1)
    }
}

/// A random valid chain of `l` stages with small integer sizes and times (so that sums
/// of times are exact).
pub(crate) fn random_chain(rng: &mut Rng, l: usize) -> Chain {
    let x: Vec<u64> = (0..=l).map(|_| rng.range(1, 20)).collect();
    let xbar: Vec<u64> = (0..=l).map(|i| if i == 0 { x[0] } else { x[i] + rng.range(0, 15) }).collect();
    let chain = Chain {
        name: Some(format!("random-{l}")),
        ftime: (0..l).map(|_| rng.range(1, 9) as f64).collect(),
        btime: (0..=l).map(|_| rng.range(1, 9) as f64).collect(),
        x,
        xbar,
        ftmp: (0..l).map(|_| rng.range(0, 6)).collect(),
        btmp: (0..=l).map(|_| rng.range(0, 6)).collect(),
        w: None,
        static_bytes: rng.range(0, 50),
    };
    chain.validate().expect("random chains are valid");
    chain
}

/// `n` random chains of 1 to `max_l` stages, the same on every run.
pub(crate) fn random_chains(seed: u64, n: usize, max_l: usize) -> Vec<Chain> {
    let mut rng = Rng::new(seed);
    (0..n)
        .map(|_| {
            let l = rng.range(1, max_l as u64) as usize;
            random_chain(&mut rng, l)
        })
        .collect()
}

/// A two-layer network as a training graph (see `graph_store_all_by_hand`).
///
/// Data: 0 `x` input 10, 1 `w` parameter 4, 2 `gw` its gradient 4, 3 `a1` activation
/// 20, 4 `s1` saved 6, 5 `a2` activation 8, 6 `da2` gradient 8, 7 `da1` gradient 20,
/// 8 `dx` gradient 10. Compute: 0 `f1` (x, w → a1, s1; tmp 3), 1 `f2` (a1, w → a2;
/// tmp 2), 2 `loss` (a2 → da2; tmp 1), 3 `f2.bwd` (da2, a1, w → da1, gw; tmp 5),
/// 4 `f1.bwd` (da1, s1, x, w → dx, gw; tmp 0).
pub(crate) fn tiny_graph() -> TrainingGraph {
    let data = |name: &str, kind, size| DataNode { name: name.into(), kind, size };
    let node = |name: &str, kind, time, tmp, inputs: &[usize], outputs: &[usize], forward| ComputeNode {
        name: name.into(),
        kind,
        time,
        tmp,
        inputs: inputs.to_vec(),
        outputs: outputs.to_vec(),
        op: None,
        forward,
        stage: None,
    };
    let g = TrainingGraph {
        name: Some("tiny".into()),
        data: vec![
            data("x", DataKind::Input, 10),
            data("w", DataKind::Parameter, 4),
            data("gw", DataKind::ParamGrad, 4),
            data("a1", DataKind::Activation, 20),
            data("s1", DataKind::Saved, 6),
            data("a2", DataKind::Activation, 8),
            data("da2", DataKind::Gradient, 8),
            data("da1", DataKind::Gradient, 20),
            data("dx", DataKind::Gradient, 10),
        ],
        compute: vec![
            node("f1", ComputeKind::Forward, 1.0, 3, &[0, 1], &[3, 4], None),
            node("f2", ComputeKind::Forward, 2.0, 2, &[3, 1], &[5], None),
            node("loss", ComputeKind::Loss, 0.5, 1, &[5], &[6], None),
            node("f2.bwd", ComputeKind::Backward, 4.0, 5, &[6, 3, 1], &[7, 2], Some(1)),
            node("f1.bwd", ComputeKind::Backward, 3.0, 0, &[7, 4, 0, 1], &[8, 2], Some(0)),
        ],
    };
    g.validate().expect("the tiny graph is valid");
    g
}

/// A hand-made 3-stage chain with distinct times and sizes, temporary memory and static
/// bytes: the fixture whose figures the baseline and discretization tests work out by hand.
pub(crate) fn hand_chain() -> Chain {
    Chain {
        name: Some("hand".into()),
        ftime: vec![1.0, 2.0, 4.0],
        btime: vec![10.0, 20.0, 30.0, 40.0],
        x: vec![4, 3, 5, 2],
        xbar: vec![4, 6, 9, 7],
        ftmp: vec![2, 1, 3],
        btmp: vec![3, 2, 4, 7],
        w: None,
        static_bytes: 10,
    }
}
