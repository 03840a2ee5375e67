use crate::{build, ModelOptions, ZooError};

fn tiny(name: &str, layers: Option<usize>) -> crate::Model {
    build(name, &ModelOptions { batch: Some(1), seq: Some(8), layers, ..Default::default() }).unwrap()
}

#[test]
fn published_parameter_counts() {
    for (name, count) in [("llama2-7b", 6_738_415_616), ("llama2-13b", 13_015_864_320)] {
        let m = tiny(name, None);
        assert_eq!(m.network.param_count(), count, "{name}");
        assert_eq!(m.network.param_count(), m.spec.published_params.unwrap().0, "{name}");
    }
}

#[test]
fn builds_at_default_sizes() {
    let m = build("llama2-7b", &ModelOptions::default()).unwrap();
    assert_eq!(m.dims.seq, 512);
    assert_eq!(m.chain.len(), 34);
}

#[test]
fn chain_lengths() {
    // Embedding + one stage per decoder layer + norm/lm head.
    assert_eq!(tiny("llama2-7b", None).chain.len(), 1 + 32 + 1);
    assert_eq!(tiny("llama2-13b", None).chain.len(), 1 + 40 + 1);
    assert_eq!(tiny("llama2-7b", Some(2)).chain.len(), 1 + 2 + 1);
}

#[test]
fn sequence_beyond_the_context_is_an_error() {
    let err = build("llama2-7b", &ModelOptions { batch: Some(1), seq: Some(4097), ..Default::default() }).unwrap_err();
    assert!(matches!(err, ZooError::BadOption { option: "seq", .. }), "{err}");
}
