//! Static memory under mixed precision (`master_weights`) and partial training
//! (`trainable`): exact byte counts, per parameter tensor.

use pebble_graph::DataKind;
use pebble_zoo::{build, DType, Model, ModelOptions, Optimizer, ParamMemory, ZooError};

/// A small GPT-2 whose width (15) is odd, so that halving some tensors rounds up.
fn gpt(options: ModelOptions) -> Result<Model, ZooError> {
    build(
        "gpt",
        &ModelOptions { batch: Some(1), seq: Some(8), layers: Some(2), width: Some(15), heads: Some(3), ..options },
    )
}

/// Elements of each parameter tensor (each tied parameter once).
fn tensor_sizes(model: &Model) -> Vec<u64> {
    model.network.params.iter().map(|p| p.shape.iter().product::<usize>() as u64).collect()
}

/// Bytes of the graph's data nodes of `kind`.
fn bytes_of(model: &Model, kind: DataKind) -> u64 {
    model.graph.data.iter().filter(|d| d.kind == kind).map(|d| d.size).sum()
}

#[test]
fn master_weights_keep_an_fp32_copy_and_fp32_adam_states() {
    let model = gpt(ModelOptions { dtype: DType::Bf16, master_weights: true, ..Default::default() }).expect("builds");
    let p = model.network.param_count();
    assert!(p > 0);
    // bf16 weights and gradients; fp32 master copy and Adam's two fp32 moments.
    assert_eq!(model.graph.static_bytes(), p * 2 + p * 2 + p * (1 + 2) * 4);
    assert_eq!(bytes_of(&model, DataKind::Parameter), 2 * p);
    assert_eq!(bytes_of(&model, DataKind::ParamGrad), 2 * p);
    assert_eq!(bytes_of(&model, DataKind::OptimizerState), 12 * p);
    // Without the master copy, bf16 sizes everything alike.
    let plain = gpt(ModelOptions { dtype: DType::Bf16, ..Default::default() }).expect("builds");
    assert_eq!(plain.graph.static_bytes(), p * 2 * (1 + 1 + 2));
    // SGD keeps no state, but the master copy stays.
    let sgd =
        gpt(ModelOptions { dtype: DType::Bf16, master_weights: true, optimizer: Optimizer::Sgd, ..Default::default() })
            .expect("builds");
    assert_eq!(sgd.graph.static_bytes(), p * 2 + p * 2 + p * 4);
    // Only memory changes: the same nodes are timed alike.
    let times = |m: &Model| m.graph.compute.iter().map(|c| c.time).collect::<Vec<_>>();
    assert_eq!(times(&model), times(&plain));
    assert!(model.graph.validate().is_ok());
}

#[test]
fn master_weights_need_bf16() {
    let err = gpt(ModelOptions { master_weights: true, ..Default::default() }).expect_err("f32 has no master copy");
    assert!(matches!(err, ZooError::BadOption { option: "master-weights", .. }), "{err:?}");
    assert!(err.to_string().contains("--master-weights"), "{err}");
}

#[test]
fn partial_training_scales_gradients_and_states_per_tensor() {
    let full = gpt(ModelOptions::default()).expect("builds");
    let sizes = tensor_sizes(&full);
    let p: u64 = sizes.iter().sum();
    assert!(sizes.iter().any(|n| n % 2 == 1), "some tensor must round up: {sizes:?}");
    assert_eq!(full.graph.static_bytes(), 4 * 4 * p);
    // f32 Adam: whole weights, and ⌈n/2⌉ elements of gradient and two moments per tensor.
    let half = gpt(ModelOptions { trainable: Some(0.5), ..Default::default() }).expect("builds");
    let trained: u64 = sizes.iter().map(|n| n.div_ceil(2)).sum();
    assert!(trained > p / 2, "rounding up adds elements");
    assert_eq!(half.graph.static_bytes(), 4 * p + trained * 4 * (1 + 2));
    assert_eq!(bytes_of(&half, DataKind::Parameter), 4 * p);
    assert_eq!(bytes_of(&half, DataKind::ParamGrad), 4 * trained);
    // 1%: ⌈n/100⌉ per tensor, at least one element each.
    let lora = gpt(ModelOptions { trainable: Some(0.01), ..Default::default() }).expect("builds");
    let trained: u64 = sizes.iter().map(|n| n.div_ceil(100)).sum();
    assert_eq!(lora.graph.static_bytes(), 4 * p + trained * 4 * 3);
    // With mixed precision: bf16 weights and trainable gradients, fp32 master and moments.
    let both =
        gpt(ModelOptions { dtype: DType::Bf16, master_weights: true, trainable: Some(0.01), ..Default::default() })
            .expect("builds");
    assert_eq!(both.graph.static_bytes(), 2 * p + 2 * trained + trained * (1 + 2) * 4);
    // A fraction of 1 is full training; times never change.
    let one = gpt(ModelOptions { trainable: Some(1.0), ..Default::default() }).expect("builds");
    assert_eq!(one.graph, full.graph);
    let times = |m: &Model| m.graph.compute.iter().map(|c| c.time).collect::<Vec<_>>();
    assert_eq!(times(&half), times(&full));
}

#[test]
fn trainable_fractions_outside_zero_to_one_are_bad_options() {
    for a in [0.0, -0.5, 1.0 + 1e-9, 2.0, f64::NAN, f64::INFINITY] {
        let err = gpt(ModelOptions { trainable: Some(a), ..Default::default() }).expect_err("rejected");
        assert!(matches!(err, ZooError::BadOption { option: "trainable", .. }), "{a}: {err:?}");
        assert!(err.to_string().contains("--trainable"), "{err}");
    }
}

#[test]
fn trainable_elements_round_up_to_whole_elements() {
    let at = |trainable: f64| ParamMemory { trainable, ..ParamMemory::new(Optimizer::Adam) };
    assert_eq!(at(0.5).trainable_elements(7), 4);
    assert_eq!(at(0.5).trainable_elements(8), 4);
    // 0.07 × 100 is 7.000000000000001 in floats: still 7 elements.
    assert_eq!(at(0.07).trainable_elements(100), 7);
    assert_eq!(at(0.071).trainable_elements(100), 8);
    assert_eq!(at(1e-12).trainable_elements(1000), 1);
    assert_eq!(at(1.0).trainable_elements(1000), 1000);
    assert_eq!(at(0.5).trainable_elements(0), 0);
    assert_eq!(at(0.5).trainable_elements(1), 1);
}
