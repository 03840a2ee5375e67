//! The chain names each stage's weight gradients (`g`) and optimizer states (`o`), and
//! they add up to the graph's.

use pebble_graph::DataKind;
use pebble_zoo::{build, ModelOptions};

fn total(v: &Option<Vec<u64>>) -> u64 {
    v.as_ref().expect("the zoo names them").iter().sum()
}

#[test]
fn gradients_and_states_per_stage_add_up_to_the_graphs() {
    for name in ["gpt", "mlp", "resnet18"] {
        let opts = ModelOptions { batch: Some(2), ..ModelOptions::default() };
        let m = build(name, &opts).unwrap();
        let of = |kind: DataKind| m.graph.data.iter().filter(|d| d.kind == kind).map(|d| d.size).sum::<u64>();
        let (grads, states) = (of(DataKind::ParamGrad), of(DataKind::OptimizerState));
        // `gpt` ties its embedding to its head: that parameter's gradient and state stay
        // unnamed (two stages read it).
        let tied = if name == "gpt" {
            m.network
                .params
                .iter()
                .find(|p| p.name.contains("wte"))
                .map_or(0, |p| 4 * p.shape.iter().product::<usize>() as u64)
        } else {
            0
        };
        assert_eq!(total(&m.chain.g), grads - tied, "{name}");
        assert_eq!(total(&m.chain.o), states - 2 * tied, "{name}");
        // Adam: two states per parameter, so twice the gradients, stage by stage.
        let (g, o) = (m.chain.g.as_ref().unwrap(), m.chain.o.as_ref().unwrap());
        assert!(g.iter().zip(o).all(|(g, o)| *o == 2 * g), "{name}: {g:?} {o:?}");
        assert!(grads > 0);
        assert!(m.chain.static_bytes >= total(&m.chain.w) + total(&m.chain.g) + total(&m.chain.o));
        m.chain.validate().unwrap();
    }
}
