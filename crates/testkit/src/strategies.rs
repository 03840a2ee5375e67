//! proptest strategies for small random chains and training graphs. They shrink towards
//! fewer stages and smaller figures, so a failure reports a minimal instance.

use pebble_graph::{Chain, TrainingGraph};
use proptest::collection::vec;
use proptest::prelude::*;

use crate::graphs::{GraphSpec, Layer};

/// A time: an integer in `0..=9` seconds, or (one draw in four) a quarter in `0..=5`.
/// Both are exact in binary, so sums of times compare exactly.
fn time() -> impl Strategy<Value = f64> {
    prop_oneof![3 => (0u32..=9).prop_map(f64::from), 1 => (0u32..=20).prop_map(|q| f64::from(q) * 0.25)]
}

/// Valid chains of `1..=max_l` stages with sizes in `0..=max_size` (`xbar[i] ≥ x[i]`),
/// temporaries up to `max_size / 2`, static memory up to `4 · max_size`, and exact times.
pub fn chains(max_l: usize, max_size: u64) -> impl Strategy<Value = Chain> {
    assert!(max_l >= 1);
    (1..=max_l).prop_flat_map(move |l| {
        (
            vec(0..=max_size, l + 1),
            vec(0..=max_size, l + 1),
            vec(time(), l),
            vec(time(), l + 1),
            vec(0..=max_size / 2, l),
            vec(0..=max_size / 2, l + 1),
            0..=4 * max_size,
        )
            .prop_map(move |(x, extra, ftime, btime, ftmp, btmp, static_bytes)| {
                let xbar = (0..=l).map(|i| if i == 0 { x[0] } else { x[i] + extra[i] }).collect();
                let chain = Chain {
                    utmp: None,
                    name: Some(format!("prop-{l}")),
                    ftime,
                    btime,
                    x,
                    xbar,
                    ftmp,
                    btmp,
                    w: None,
                    g: None,
                    o: None,
                    static_bytes,
                };
                chain.validate().expect("generated chains are valid");
                chain
            })
    })
}

/// Layered graph specs ([`GraphSpec`]) of `1..=max_layers` layers with sizes in
/// `1..=max_size`: skip connections (multi-producer gradients), saved tensors, parameters
/// and backwards that read their output, in every combination.
pub fn graph_specs(max_layers: usize, max_size: u64) -> impl Strategy<Value = GraphSpec> {
    assert!(max_layers >= 1 && max_size >= 1);
    let layer = (
        1..=max_size,
        proptest::option::weighted(0.3, any::<prop::sample::Index>()),
        prop_oneof![1 => Just(0), 1 => 1..=max_size],
        prop_oneof![1 => Just(0), 1 => 1..=max_size],
        any::<bool>(),
        time(),
        time(),
        0..=max_size / 2,
    );
    (1..=max_size, vec(layer, 1..=max_layers), time()).prop_map(|(input, raw, loss_time)| {
        let layers = raw
            .into_iter()
            .enumerate()
            .map(|(k, (size, skip, saved, param, reads_output, ftime, btime, tmp))| Layer {
                size,
                // Layer k + 1 may skip from a_0 .. a_{k−1}.
                skip: skip.filter(|_| k >= 1).map(|ix| ix.index(k)),
                saved,
                param,
                reads_output,
                ftime,
                btime,
                tmp,
            })
            .collect();
        GraphSpec { input, layers, loss_time }
    })
}

/// Valid training graphs built from [`graph_specs`].
pub fn graphs(max_layers: usize, max_size: u64) -> impl Strategy<Value = TrainingGraph> {
    graph_specs(max_layers, max_size).prop_map(|s| s.build())
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest! {
        #[test]
        fn generated_chains_are_valid(c in chains(6, 20)) {
            prop_assert!((1..=6).contains(&c.len()));
            prop_assert!(c.xbar.iter().zip(&c.x).skip(1).all(|(b, x)| b >= x));
        }

        #[test]
        fn generated_graphs_are_valid(g in graphs(6, 20)) {
            prop_assert!(g.validate().is_ok());
            prop_assert_eq!(g.compute.iter().filter(|c| c.kind == pebble_graph::ComputeKind::Loss).count(), 1);
        }
    }
}
