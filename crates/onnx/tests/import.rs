//! The importer against the ONNX test suite's "light" models (fetched once by
//! `scripts/fetch-onnx-models.sh` into `models/onnx/`) and against small graphs written
//! here with the crate's own protobuf messages.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use pebble_graph::DataKind;
use pebble_onnx::proto::{
    AttributeProto, Dimension, DimensionValue, GraphProto, ModelProto, NodeProto, OperatorSetIdProto, TensorProto,
    TensorShapeProto, TypeProto, TypeProtoTensor, ValueInfoProto,
};
use pebble_onnx::{import_bytes, import_file, ImportOptions, OnnxError};
use pebble_solve::{Problem, SolveOptions};
use pebble_zoo::ops::{Elem, Operand, Saved};
use pebble_zoo::{build, CostModel, ModelOptions, Network, OpKind, Optimizer};
use prost::Message;

/// `models/onnx/` with every light model, fetched once if missing.
fn models() -> PathBuf {
    static FETCHED: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    FETCHED.get_or_init(|| pebble_onnx::fetch_light_models(&root)).clone().unwrap_or_else(|e| panic!("{e}"))
}

fn light(name: &str, batch: usize) -> Network {
    let path = models().join(format!("light_{name}.onnx"));
    import_file(&path, &ImportOptions { batch: Some(batch), ..Default::default() })
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Bytes of the data nodes of these kinds in the network's training graph.
fn bytes_of(net: &Network, kinds: &[DataKind]) -> u64 {
    let g = net.training_graph(&CostModel::default_v100(), Optimizer::Adam);
    g.data.iter().filter(|d| kinds.contains(&d.kind)).map(|d| d.size).sum()
}

/// The store-all peak in the simulator.
fn store_all_peak(net: &Network) -> u64 {
    let g = net.training_graph(&CostModel::default_v100(), Optimizer::Adam);
    g.validate().unwrap_or_else(|e| panic!("{}: {e}", net.name));
    let solver = pebble_solve::solver("store-all").expect("registered");
    pebble_solve::plan(solver, Problem::Graph(&g), u64::MAX, &SolveOptions::default())
        .unwrap_or_else(|e| panic!("{}: {e}", net.name))
        .report
        .peak_bytes
}

trait DefaultV100 {
    fn default_v100() -> CostModel;
}

impl DefaultV100 for CostModel {
    fn default_v100() -> CostModel {
        CostModel { profile: ModelOptions::default().profile }
    }
}

#[test]
fn resnet50_matches_the_zoo() {
    let onnx = light("resnet50", 32);
    let zoo = build("resnet50", &ModelOptions { batch: Some(32), image: Some(224), ..Default::default() })
        .expect("zoo resnet50")
        .network;
    assert_eq!(onnx.param_count(), 25_557_032);
    assert_eq!(zoo.param_count(), 25_557_032);
    // Op for op the same memory: activations, saved extras (batch-norm statistics, pool
    // indices), inputs, parameters and their states, and thus the same store-all peak.
    for kinds in [
        &[DataKind::Activation][..],
        &[DataKind::Saved],
        &[DataKind::Input],
        &[DataKind::Gradient],
        &[DataKind::Parameter, DataKind::ParamGrad, DataKind::OptimizerState],
    ] {
        assert_eq!(bytes_of(&onnx, kinds), bytes_of(&zoo, kinds), "{kinds:?}");
    }
    let activations = bytes_of(&onnx, &[DataKind::Activation, DataKind::Saved]);
    // The max-pool's 32×64×56×56 indices in 4-byte integers, as the executor stores them
    // (25,690,112 bytes fewer than in int64).
    assert_eq!(activations, 4_833_554_944, "activation and saved bytes at batch 32");
    assert_eq!(store_all_peak(&onnx), store_all_peak(&zoo));
    // 4-byte integers: the pool indices (25,690,112 bytes) and the 32 labels (128 bytes)
    // take half of what int64 took.
    assert_eq!(store_all_peak(&onnx), 3_157_967_104);
    let kinds = |n: &Network| n.ops.iter().map(|o| o.kind.name()).collect::<Vec<_>>();
    let (a, b) = (kinds(&onnx), kinds(&zoo));
    assert_eq!(a.len(), b.len());
    // The zoo pools with an adaptive average pool, the file with a 7×7 one: same output.
    let differ: Vec<_> = a.iter().zip(&b).filter(|(x, y)| x != y).collect();
    assert_eq!(differ, vec![(&"avg_pool2d", &"adaptive_avg_pool2d")]);
}

#[test]
fn every_light_model_imports_validates_and_plans() {
    // Published counts where there is one (torchvision, BVLC); ours for the others.
    let params: [(&str, u64); 9] = [
        ("resnet50", 25_557_032),
        ("densenet121", 8_062_504), // torchvision's 7,978,856 plus the Scale layers' 2·C per batch norm
        ("inception_v1", 6_998_552), // BVLC GoogLeNet without its auxiliary heads
        ("inception_v2", 11_214_888),
        ("vgg19", 143_667_240),
        ("shufflenet", 1_393_320),
        ("squeezenet", 1_235_496), // SqueezeNet 1.1
        ("bvlc_alexnet", 60_965_224),
        ("zfnet512", 87_250_536),
    ];
    for (name, count) in params {
        let net = light(name, 4);
        assert_eq!(net.param_count(), count, "{name}");
        assert!(net.stages() > 10, "{name}: {} stages", net.stages());
        let g = net.training_graph(&CostModel::default_v100(), Optimizer::Adam);
        g.validate().unwrap_or_else(|e| panic!("{name}: {e}"));
        pebble_graph::partition::to_chain(&g).unwrap_or_else(|e| panic!("{name}: no chain: {e}"));
        let peak = store_all_peak(&net);
        assert!(peak > g.static_bytes(), "{name}: peak {peak}");
        let loss = net.ops.last().expect("ops");
        assert_eq!(loss.kind, OpKind::CrossEntropy, "{name}");
        assert_eq!(net.tensors[loss.inputs[0]].shape, vec![4, 1000], "{name}: logits");
    }
}

#[test]
fn the_batch_follows_hard_coded_reshapes() {
    // ShuffleNet's channel shuffles reshape to [1, g, C/g, H, W]: with batch 3, to [3, ...].
    let net = light("shufflenet", 3);
    let permutes: Vec<_> = net.ops.iter().filter(|o| matches!(o.kind, OpKind::Permute { .. })).collect();
    assert_eq!(permutes.len(), 16);
    assert_eq!(net.tensors[permutes[0].inputs[0]].shape, vec![3, 4, 28, 56, 56]);
    assert_eq!(permutes[0].decl.output, vec![3, 28, 4, 56, 56]);
    // Without a batch, the file's.
    let one = import_file(&models().join("light_resnet50.onnx"), &ImportOptions::default()).expect("imports");
    assert_eq!(one.tensors[0].shape, vec![1, 3, 224, 224]);
}

#[test]
fn stages_cut_where_one_tensor_crosses() {
    let net = light("resnet50", 2);
    // conv, bn, relu, maxpool, then per bottleneck: the block up to its sum, the ReLU
    // after it; then the pool (with the flatten view) and the classifier.
    assert_eq!(net.stages(), 4 + 16 * 2 + 2);
    let op = |name: &str| net.ops.iter().find(|o| o.name == name).expect(name);
    assert_eq!(op("n4").stage, op("n14").stage, "a bottleneck is one stage");
    assert_eq!(op("n15").stage, op("n14").stage + 1);
}

// ---- Small graphs written here --------------------------------------------------------

fn dims(shape: &[i64], batch: Option<&str>) -> TypeProto {
    let dim = shape
        .iter()
        .enumerate()
        .map(|(k, &d)| Dimension {
            value: Some(match (k, batch) {
                (0, Some(sym)) => DimensionValue::DimParam(sym.to_string()),
                _ => DimensionValue::DimValue(d),
            }),
        })
        .collect();
    TypeProto { tensor_type: Some(TypeProtoTensor { elem_type: 1, shape: Some(TensorShapeProto { dim }) }) }
}

fn value(name: &str, shape: &[i64], batch: Option<&str>) -> ValueInfoProto {
    ValueInfoProto { name: name.into(), r#type: Some(dims(shape, batch)) }
}

fn weight(name: &str, shape: &[i64]) -> TensorProto {
    TensorProto { name: name.into(), dims: shape.to_vec(), data_type: 1, ..Default::default() }
}

fn ints_tensor(name: &str, v: &[i64]) -> TensorProto {
    TensorProto {
        name: name.into(),
        dims: vec![v.len() as i64],
        data_type: 7,
        int64_data: v.to_vec(),
        ..Default::default()
    }
}

fn ints(name: &str, v: &[i64]) -> AttributeProto {
    AttributeProto { name: name.into(), r#type: 7, ints: v.to_vec(), ..Default::default() }
}

fn int(name: &str, v: i64) -> AttributeProto {
    AttributeProto { name: name.into(), r#type: 2, i: v, ..Default::default() }
}

fn node(op: &str, name: &str, inputs: &[&str], outputs: &[&str], attrs: Vec<AttributeProto>) -> NodeProto {
    NodeProto {
        op_type: op.into(),
        name: name.into(),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: outputs.iter().map(|s| s.to_string()).collect(),
        attribute: attrs,
        ..Default::default()
    }
}

fn model(nodes: Vec<NodeProto>, initializers: Vec<TensorProto>, input: ValueInfoProto, output: &str) -> Vec<u8> {
    model_with_inputs(nodes, initializers, vec![input], output)
}

fn model_with_inputs(
    nodes: Vec<NodeProto>,
    initializers: Vec<TensorProto>,
    inputs: Vec<ValueInfoProto>,
    output: &str,
) -> Vec<u8> {
    ModelProto {
        ir_version: 8,
        opset_import: vec![OperatorSetIdProto { domain: String::new(), version: 13 }],
        producer_name: "pebble tests".into(),
        graph: Some(GraphProto {
            node: nodes,
            name: "g".into(),
            initializer: initializers,
            input: inputs,
            // No shapes beyond the input's: the importer infers them.
            output: vec![ValueInfoProto { name: output.into(), r#type: None }],
            value_info: vec![],
        }),
    }
    .encode_to_vec()
}

/// A small CNN exercising shape inference: `SAME_UPPER` convolution, a ceil-mode pool
/// with asymmetric padding, per-channel scale and bias, a shape computed with `Shape`,
/// `Gather` and `Concat`, a weight shared by two `MatMul`s and a trailing softmax.
fn small_cnn() -> Vec<u8> {
    let nodes = vec![
        node(
            "Conv",
            "conv",
            &["x", "w"],
            &["c"],
            vec![
                ints("strides", &[2, 2]),
                AttributeProto { name: "auto_pad".into(), r#type: 3, s: b"SAME_UPPER".to_vec(), ..Default::default() },
            ],
        ),
        node("Mul", "scale", &["c", "s"], &["m"], vec![]),
        node("Add", "shift", &["m", "b"], &["a"], vec![]),
        node("Relu", "relu", &["a"], &["r"], vec![]),
        node(
            "MaxPool",
            "pool",
            &["r"],
            &["p"],
            vec![ints("kernel_shape", &[3, 3]), ints("strides", &[2, 2]), int("ceil_mode", 1)],
        ),
        node("Shape", "shape", &["p"], &["ps"], vec![]),
        node("Gather", "batch", &["ps", "zero"], &["n"], vec![int("axis", 0)]),
        node("Concat", "target", &["n", "minus1"], &["t"], vec![int("axis", 0)]),
        node("Reshape", "flatten", &["p", "t"], &["f"], vec![]),
        node("MatMul", "fc1", &["f", "wfc"], &["h"], vec![]),
        node("Add", "fc1.bias", &["h", "bfc"], &["hb"], vec![]),
        node("Relu", "relu2", &["hb"], &["h2"], vec![]),
        node("MatMul", "fc2", &["h2", "wsq"], &["o"], vec![]),
        node("Softmax", "prob", &["o"], &["y"], vec![]),
    ];
    let inits = vec![
        weight("w", &[8, 3, 3, 3]),
        weight("s", &[8, 1, 1]),
        weight("b", &[1, 8, 1, 1]),
        TensorProto {
            name: "zero".into(),
            dims: vec![1],
            data_type: 7,
            raw_data: 0i64.to_le_bytes().to_vec(),
            ..Default::default()
        },
        ints_tensor("minus1", &[-1]),
        weight("wfc", &[8 * 5 * 5, 16]),
        weight("bfc", &[16]),
        weight("wsq", &[16, 16]),
    ];
    model(nodes, inits, value("x", &[1, 3, 19, 19], Some("N")), "y")
}

#[test]
fn shapes_are_inferred_without_value_infos() {
    let net =
        import_bytes(&small_cnn(), "small", &ImportOptions { batch: Some(6), ..Default::default() }).expect("imports");
    let by_name = |n: &str| net.ops.iter().find(|o| o.name == n).unwrap_or_else(|| panic!("no op {n}"));
    // SAME_UPPER with stride 2: ceil(19/2) = 10, padding 1 on each side.
    assert_eq!(
        by_name("conv").kind,
        OpKind::Conv2d { out_channels: 8, kernel: 3, stride: 2, padding: 1, groups: 1, bias: false }
    );
    // The scale and the shift fuse into one per-channel affine map.
    assert_eq!(by_name("scale").kind, OpKind::ChannelAffine { dim: 1, scale: true, bias: true });
    assert!(net.ops.iter().all(|o| o.name != "shift"));
    // Ceil mode on 10: ceil((10 - 3) / 2) + 1 = 5 windows, one row of padding at the end.
    assert_eq!(by_name("pool").kind, OpKind::Pool2d { max: true, kernel: [3, 3], stride: [2, 2], pads: [0, 0, 1, 1] });
    assert_eq!(by_name("pool").decl.output, vec![6, 8, 5, 5]);
    // The flatten target was computed from the batch, and is a view.
    assert_eq!(by_name("flatten").decl.output, vec![6, 200]);
    assert!(by_name("flatten").decl.view);
    assert_eq!(by_name("fc1").kind, OpKind::Linear { out_features: 16, bias: true });
    // The softmax head is dropped: the loss reads fc2's logits.
    let loss = net.ops.last().expect("loss");
    assert_eq!(net.tensors[loss.inputs[0]].name, "fc2");
    assert_eq!(net.tensors[loss.inputs[1]].shape, vec![6]);
    assert_eq!(net.param_count(), 8 * 27 + 8 + 8 + 200 * 16 + 16 + 16 * 16);
    net.training_graph(&CostModel::default_v100(), Optimizer::Sgd).validate().expect("valid");
}

#[test]
fn a_shared_weight_is_one_parameter() {
    let nodes =
        vec![node("MatMul", "a", &["x", "w"], &["h"], vec![]), node("MatMul", "b", &["h", "w"], &["y"], vec![])];
    let bytes = model(nodes, vec![weight("w", &[4, 4])], value("x", &[2, 4], None), "y");
    let net = import_bytes(&bytes, "tied", &ImportOptions::default()).expect("imports");
    assert_eq!(net.params.len(), 1);
    assert_eq!(net.ops[0].params, net.ops[1].params);
}

#[test]
fn a_symbolic_batch_needs_a_batch_size() {
    let err = import_bytes(&small_cnn(), "small", &ImportOptions::default()).expect_err("no batch");
    assert!(matches!(err, OnnxError::Input { .. }), "{err}");
    assert!(err.to_string().contains("`N`") && err.to_string().contains("batch size"), "{err}");
}

#[test]
fn malformed_bytes_are_errors() {
    let good = std::fs::read(models().join("light_resnet50.onnx")).expect("file");
    let mut cases: Vec<Vec<u8>> = vec![
        Vec::new(),
        b"this is not a protobuf at all".to_vec(),
        vec![0xff; 64],
        good[..good.len() / 2].to_vec(),
        good[..101].to_vec(),
    ];
    // Corrupt bytes at a few places of a real model.
    for at in [3, 50, 500, 5000, 50_000] {
        let mut b = good.clone();
        b[at] ^= 0x5a;
        cases.push(b);
    }
    let mut errors = 0;
    for (i, bytes) in cases.iter().enumerate() {
        // No panic whatever the bytes; the first five are errors for sure.
        let result = import_bytes(bytes, "bad", &ImportOptions { batch: Some(2), ..Default::default() });
        if i < 5 {
            let err = result.expect_err("garbage imports");
            assert!(matches!(err, OnnxError::Decode(_) | OnnxError::Malformed(_)), "case {i}: {err}");
        }
        errors += 1;
    }
    assert_eq!(errors, cases.len());
    let err = import_file(Path::new("no/such/file.onnx"), &ImportOptions::default()).expect_err("missing");
    assert!(err.to_string().contains("no/such/file.onnx"), "{err}");
}

#[test]
fn unsupported_ops_are_named() {
    let nodes =
        vec![node("Conv", "conv", &["x", "w"], &["c"], vec![]), node("Sigmoid", "gate", &["c"], &["s"], vec![])];
    let bytes = model(nodes, vec![weight("w", &[4, 3, 1, 1])], value("x", &[1, 3, 8, 8], None), "s");
    let err = import_bytes(&bytes, "m", &ImportOptions::default()).expect_err("Sigmoid");
    assert!(matches!(&err, OnnxError::UnsupportedOp { op, node, .. } if op == "Sigmoid" && node == "gate"), "{err}");
    assert_eq!(err.to_string(), "node `gate`: unsupported op `Sigmoid`");
    // A known op used in a way pebble cannot represent.
    let nodes = vec![node("Split", "heads", &["x"], &["a", "b"], vec![int("axis", 0)])];
    let err = import_bytes(&model(nodes, vec![], value("x", &[2, 2], None), "a"), "m", &ImportOptions::default())
        .expect_err("split along the batch");
    assert!(err.to_string().starts_with("node `heads` (Split): unsupported: a split of [2, 2] along axis 0"), "{err}");
    // Absurd split sizes are an error naming the node, not an overflow.
    let nodes = vec![node("Split", "heads", &["x", "parts"], &["a", "b"], vec![int("axis", -1)])];
    let bytes = model(nodes, vec![ints_tensor("parts", &[i64::MAX, i64::MAX])], value("x", &[2, 2], None), "a");
    let err = import_bytes(&bytes, "m", &ImportOptions::default()).expect_err("absurd sizes");
    assert!(err.to_string().starts_with("node `heads` (Split): split sizes"), "{err}");
    let up = |strides: &[i64]| {
        let attrs = vec![ints("kernel_shape", &[2, 2]), ints("strides", strides)];
        let nodes = vec![node("ConvTranspose", "up", &["x", "w"], &["y"], attrs)];
        model(nodes, vec![weight("w", &[3, 4, 2, 2])], value("x", &[1, 3, 8, 8], None), "y")
    };
    let err = import_bytes(&up(&[1, 1]), "m", &ImportOptions::default()).expect_err("stride 1");
    assert!(
        err.to_string().starts_with("node `up` (ConvTranspose): unsupported: kernel [2, 2], strides [1, 1]"),
        "{err}"
    );
    let net =
        import_bytes(&up(&[2, 2]), "m", &ImportOptions { batch: Some(5), ..Default::default() }).expect("stride 2");
    assert_eq!(net.ops[0].kind, OpKind::ConvTranspose2d { out_channels: 4, kernel: 2, bias: false });
    assert_eq!(net.ops[0].decl.output, vec![5, 4, 16, 16]);
    assert_eq!(net.param_count(), 3 * 4 * 2 * 2);
    // A shape mismatch names the node and the weight.
    let nodes = vec![node("Conv", "conv", &["x", "w"], &["c"], vec![])];
    let err = import_bytes(
        &model(nodes, vec![weight("w", &[4, 5, 1, 1])], value("x", &[1, 3, 8, 8], None), "c"),
        "m",
        &ImportOptions::default(),
    )
    .expect_err("channels");
    assert!(err.to_string().contains("node `conv` (Conv)") && err.to_string().contains("weight `w`"), "{err}");
}

#[test]
fn the_new_ops_declare_shapes_and_saved_tensors() {
    let x = |shape: &[usize]| Operand { shape: shape.to_vec(), elem: Elem::Float };
    let lrn = OpKind::Lrn { size: 5, alpha: 1e-4, beta: 0.75, bias: 1.0 }.declare(&[x(&[2, 8, 4, 4])]).expect("lrn");
    assert_eq!(lrn.output, vec![2, 8, 4, 4]);
    assert_eq!(lrn.saved, vec![Saved::Input(0), Saved::Output]);
    let p = OpKind::Permute { perm: vec![0, 2, 1, 3] }.declare(&[x(&[2, 3, 5, 7])]).expect("permute");
    assert_eq!(p.output, vec![2, 5, 3, 7]);
    assert!(!p.view && p.saved.is_empty());
    assert!(OpKind::Permute { perm: vec![0, 0, 1, 2] }.declare(&[x(&[2, 3, 5, 7])]).is_err());
    let a = OpKind::ChannelAffine { dim: 1, scale: true, bias: true }.declare(&[x(&[2, 3, 5, 5])]).expect("affine");
    assert_eq!(a.params, vec![("weight", vec![3]), ("bias", vec![3])]);
    assert_eq!(a.saved, vec![Saved::Input(0)]);
    let b = OpKind::ChannelAffine { dim: 1, scale: false, bias: true }.declare(&[x(&[2, 3, 5, 5])]).expect("bias");
    assert!(b.saved.is_empty());
    let pool = OpKind::Pool2d { max: true, kernel: [3, 3], stride: [2, 2], pads: [0, 0, 1, 1] };
    let d = pool.declare(&[x(&[1, 4, 112, 112])]).expect("pool");
    assert_eq!(d.output, vec![1, 4, 56, 56]);
    assert_eq!(d.saved.len(), 2);
    let avg = OpKind::Pool2d { max: false, kernel: [7, 7], stride: [1, 1], pads: [0, 0, 1, 1] };
    assert_eq!(avg.declare(&[x(&[1, 4, 6, 6])]).expect("avg").output, vec![1, 4, 1, 1]);
}

/// Attention as PyTorch exports it unfused: a packed projection split three ways, the
/// scores and the mix as products of two activations, and a causal mask that is a graph
/// input of its own size (not batched).
#[test]
fn unfused_attention_imports_with_an_unbatched_mask() {
    let nodes = vec![
        node("Split", "qkv", &["x", "parts"], &["q", "k", "v"], vec![int("axis", -1)]),
        node("Transpose", "kt", &["k"], &["kt"], vec![ints("perm", &[0, 2, 1])]),
        node("MatMul", "scores", &["q", "kt"], &["s"], vec![]),
        node("Add", "masked", &["s", "mask"], &["sm"], vec![]),
        node("Softmax", "probs", &["sm"], &["p"], vec![int("axis", -1)]),
        node("MatMul", "mix", &["p", "v"], &["o"], vec![]),
        node("MatMul", "head", &["o", "w"], &["y"], vec![]),
    ];
    let inits = vec![ints_tensor("parts", &[2, 2, 2]), weight("w", &[2, 5])];
    let bytes = model_with_inputs(nodes, inits, vec![value("x", &[1, 4, 6], None), value("mask", &[4, 4], None)], "y");
    let net = import_bytes(&bytes, "attn", &ImportOptions { batch: Some(3), ..Default::default() }).expect("imports");
    let by_name = |n: &str| net.ops.iter().find(|o| o.name == n).unwrap_or_else(|| panic!("no op {n}"));
    // Each part of the split is a slice of the last dimension.
    assert_eq!(by_name("qkv.0").kind, OpKind::Slice { start: 0, len: 2 });
    assert_eq!(by_name("qkv.2").kind, OpKind::Slice { start: 4, len: 2 });
    // The mask keeps its [4, 4]: only the tokens take the batch.
    let mask = net.tensors.iter().find(|t| t.name == "mask").expect("mask input");
    assert_eq!(mask.shape, vec![4, 4]);
    let scores = by_name("scores");
    assert_eq!(scores.kind, OpKind::MatMul);
    assert_eq!(scores.decl.output, vec![3, 4, 4]);
    // 3 × 4 × 4 outputs of 2 multiply-adds each; the backward reads both factors.
    assert_eq!(scores.decl.forward_flops, 2.0 * 48.0 * 2.0);
    assert_eq!(scores.decl.saved, vec![Saved::Input(0), Saved::Input(1)]);
    assert_eq!(by_name("mix").decl.output, vec![3, 4, 2]);
    assert_eq!(by_name("head").kind, OpKind::Linear { out_features: 5, bias: false });
    assert_eq!(net.param_count(), 10);
    net.training_graph(&CostModel::default_v100(), Optimizer::Sgd).validate().expect("valid");
    // Two activations that do not multiply are named.
    let bad = OpKind::MatMul.declare(&[
        Operand { shape: vec![3, 4, 2], elem: Elem::Float },
        Operand { shape: vec![3, 4, 2], elem: Elem::Float },
    ]);
    assert!(bad.expect_err("shapes").to_string().contains("cannot multiply [3, 4, 2] by [3, 4, 2]"));
}
