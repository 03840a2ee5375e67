//! The op library against Burn's autodiff: for every op, the explicit backward (given only
//! the declared saved tensors) must give the gradients that `Autodiff<Flex>` computes by
//! differentiating the same forward; a forward without grad must be bit-identical to one
//! with grad; random ops must repeat under the same seed; the extras must match the
//! declaration; losses must match autodiff on `loss_value`.

use burn_autodiff::Autodiff;
use burn_backend::ops::{BoolTensorOps, FloatTensorOps, IntTensorOps};
use burn_backend::tensor::FloatTensor;
use burn_backend::{get_device_settings, read_sync, AutodiffBackend, Backend, TensorData, TensorMetadata};
use burn_flex::{Flex, FlexDevice};
use pebble_runtime::ops::{self, OpCtx};
use pebble_runtime::rng::SplitMix;
use pebble_runtime::{RuntimeError, Value};
use pebble_zoo::ops::{Operand, Saved};
use pebble_zoo::ModelOptions;
use pebble_zoo::{build, DType, Elem, NetBuilder, NetOp, NetParam, Network, OpKind, TensorId};
use std::collections::HashMap;

type F = Flex;
type A = Autodiff<Flex>;

const DEV: FlexDevice = FlexDevice;

// ---------------------------------------------------------------------------------------
// Helpers

/// Test data from the executor's generator ([`SplitMix`]).
struct Rng(SplitMix);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0.next_u64()
    }
    /// Uniform in [-1, 1).
    fn float(&mut self) -> f32 {
        2.0 * self.0.unit() - 1.0
    }
    fn floats(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.float()).collect()
    }
    fn below(&mut self, n: u64) -> i64 {
        self.0.below(n) as i64
    }
}

/// An input of a test case: float of a shape, or integers below a bound.
#[derive(Clone)]
enum In {
    F(Vec<usize>),
    I(Vec<usize>, u64),
}

impl In {
    fn shape(&self) -> &[usize] {
        match self {
            In::F(s) | In::I(s, _) => s,
        }
    }
    fn elem(&self) -> Elem {
        match self {
            In::F(_) => Elem::Float,
            In::I(..) => Elem::Int,
        }
    }
}

/// Host data of an input.
#[derive(Clone)]
enum Host {
    F(Vec<f32>, Vec<usize>),
    I(Vec<i64>, Vec<usize>),
}

fn numel(d: &[usize]) -> usize {
    d.iter().product()
}

/// The op for these inputs, declared by the zoo.
fn net_op(kind: OpKind, inputs: &[In]) -> NetOp {
    let operands: Vec<Operand> = inputs.iter().map(|i| Operand { shape: i.shape().to_vec(), elem: i.elem() }).collect();
    let decl = kind.declare(&operands).expect("declaration");
    let n = inputs.len();
    NetOp {
        name: format!("test.{}", kind.name()),
        params: (0..decl.params.len()).collect(),
        inputs: (0..n).collect(),
        output: n,
        stage: 0,
        kind,
        decl,
    }
}

fn float_tensor<B: Backend<Device = FlexDevice>>(v: &[f32], d: &[usize]) -> FloatTensor<B> {
    B::float_from_data(TensorData::new(v.to_vec(), d.to_vec()), &DEV)
}

fn value<B: Backend<Device = FlexDevice>>(h: &Host) -> Value<B> {
    match h {
        Host::F(v, d) => Value::Float(float_tensor::<B>(v, d)),
        Host::I(v, d) => {
            let dtype = get_device_settings::<B>(&DEV).int_dtype;
            Value::Int(B::int_from_data(TensorData::new(v.clone(), d.clone()).convert_dtype(dtype.into()), &DEV))
        }
    }
}

fn read<B: Backend>(t: FloatTensor<B>) -> Vec<f32> {
    read_sync(B::float_into_data(t)).expect("read").convert::<f32>().to_vec::<f32>().expect("f32")
}

fn read_value(v: &Value<F>) -> Vec<u8> {
    // Bitwise image of a value, for bit-identity checks.
    match v.clone() {
        Value::Float(t) => read::<F>(t).iter().flat_map(|x| x.to_bits().to_le_bytes()).collect(),
        Value::Int(t) => read_sync(F::int_into_data(t))
            .expect("read")
            .convert::<i64>()
            .to_vec::<i64>()
            .expect("i64")
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect(),
        Value::Bool(t) => read_bools(t).into_iter().map(u8::from).collect(),
    }
}

fn read_bools(t: burn_backend::tensor::BoolTensor<F>) -> Vec<bool> {
    let d = read_sync(F::bool_into_data(t)).expect("read");
    d.convert_dtype(burn_backend::DType::U8).to_vec::<u8>().expect("u8").into_iter().map(|b| b != 0).collect()
}

/// `max |a − b|` and the largest `|b|`.
fn max_err(a: &[f32], b: &[f32]) -> (f32, f32) {
    assert_eq!(a.len(), b.len(), "lengths differ");
    let err = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max);
    let scale = b.iter().map(|y| y.abs()).fold(0.0, f32::max);
    (err, scale)
}

fn assert_close(what: &str, got: &[f32], want: &[f32], tol: f32) {
    let (err, scale) = max_err(got, want);
    // Shown with `--nocapture`.
    println!("{what}: max error {err:e} (scale {scale:e})");
    assert!(
        err <= tol * scale.max(1.0) && got.iter().all(|x| x.is_finite()),
        "{what}: max error {err:e} (scale {scale:e}, tolerance {tol:e})"
    );
}

/// Random host data for the inputs.
fn host_inputs(inputs: &[In], rng: &mut Rng) -> Vec<Host> {
    inputs
        .iter()
        .map(|i| match i {
            In::F(d) => Host::F(rng.floats(numel(d)), d.clone()),
            In::I(d, bound) => Host::I((0..numel(d)).map(|_| rng.below(*bound)).collect(), d.clone()),
        })
        .collect()
}

fn ctx(grad: bool, seed: u64) -> OpCtx<'static, F> {
    OpCtx { device: &DEV, grad, seed }
}

/// The saved tensors the declaration lists, from a forward with grad.
fn saved_of(op: &NetOp, inputs: &[Value<F>], output: &Value<F>, extras: &[Value<F>]) -> Vec<Value<F>> {
    let mut ex = extras.iter();
    op.decl
        .saved
        .iter()
        .map(|s| match s {
            Saved::Input(k) => inputs[*k].clone(),
            Saved::Output => output.clone(),
            Saved::Extra { .. } => ex.next().expect("one extra per declared extra").clone(),
        })
        .collect()
}

/// Checks the extras against the declaration.
fn check_extras(op: &NetOp, extras: &[Value<F>]) {
    let declared: Vec<(&Vec<usize>, Elem)> = op
        .decl
        .saved
        .iter()
        .filter_map(|s| match s {
            Saved::Extra { shape, elem, .. } => Some((shape, *elem)),
            _ => None,
        })
        .collect();
    assert_eq!(extras.len(), declared.len(), "{}: number of extras", op.name);
    for (i, (v, (shape, elem))) in extras.iter().zip(declared).enumerate() {
        assert_eq!(&v.dims(), shape, "{}: extra {i} shape", op.name);
        let kind = match elem {
            Elem::Float => "float",
            Elem::Int => "int",
            Elem::Byte => "bool",
        };
        assert_eq!(v.kind(), kind, "{}: extra {i} kind", op.name);
        // As wide as the planner counts it (max pooling's indices too, which burn-flex
        // returns as i64).
        let width = match elem {
            Elem::Float => 4,
            Elem::Int => std::mem::size_of::<<F as burn_backend::BackendTypes>::IntElem>() as u64,
            Elem::Byte => 1,
        };
        let n: usize = shape.iter().product();
        assert_eq!(v.bytes(), n as u64 * width, "{}: extra {i} bytes", op.name);
    }
}

/// What [`check_op`] found, for further checks.
struct Checked {
    op: NetOp,
    host: Vec<Host>,
    output: Vec<f32>,
    extras: Vec<Value<F>>,
}

/// The main check: explicit backward vs autodiff; no-grad forward bit-identical; extras
/// as declared; a second forward with the same seed bit-identical.
fn check_op(kind: OpKind, inputs: &[In], seed: u64) -> Checked {
    check_op_tol(kind, inputs, seed, 1e-4)
}

fn check_op_tol(kind: OpKind, inputs: &[In], seed: u64, tol: f32) -> Checked {
    let op = net_op(kind, inputs);
    let mut rng = Rng(SplitMix(seed));
    let host = host_inputs(inputs, &mut rng);
    let params: Vec<(Vec<f32>, Vec<usize>)> =
        op.decl.params.iter().map(|(_, d)| (rng.floats(numel(d)), d.clone())).collect();
    let r = rng.floats(numel(&op.decl.output));
    let op_seed = rng.next();
    let name = op.name.clone();

    // Burn's autodiff on our forward, reduced with the weighting r.
    let ad_in: Vec<Value<A>> = host
        .iter()
        .map(|h| match value::<A>(h) {
            Value::Float(t) => Value::Float(A::float_set_require_grad(t, true)),
            v => v,
        })
        .collect();
    let ad_params: Vec<FloatTensor<A>> =
        params.iter().map(|(v, d)| A::float_set_require_grad(float_tensor::<A>(v, d), true)).collect();
    let actx = OpCtx::<A> { device: &DEV, grad: false, seed: op_seed };
    let ad_out = ops::forward::<A>(&op, ad_in.clone(), &ad_params, &actx).expect("autodiff forward");
    assert!(ad_out.extras.is_empty(), "{name}: extras without grad");
    let ad_out = ad_out.output.float().expect("float output");
    let ad_out_host = read::<A>(ad_out.clone());
    let loss = A::float_sum(A::float_mul(ad_out, float_tensor::<A>(&r, &op.decl.output)));
    let grads = A::backward(loss);
    let ad_in_grads: Vec<Option<Vec<f32>>> = ad_in
        .iter()
        .map(|v| match v {
            Value::Float(t) => Some(read::<F>(A::grad(t, &grads).expect("input gradient"))),
            _ => None,
        })
        .collect();
    let ad_param_grads: Vec<Vec<f32>> =
        ad_params.iter().map(|p| read::<F>(A::grad(p, &grads).expect("parameter gradient"))).collect();

    // Ours on Flex.
    let f_in: Vec<Value<F>> = host.iter().map(value::<F>).collect();
    let f_params: Vec<FloatTensor<F>> = params.iter().map(|(v, d)| float_tensor::<F>(v, d)).collect();
    let fwd = ops::forward::<F>(&op, f_in.clone(), &f_params, &ctx(true, op_seed)).expect("forward with grad");
    check_extras(&op, &fwd.extras);
    assert_eq!(fwd.output.dims(), op.decl.output, "{name}: output shape");
    let out_bits = read_value(&fwd.output);
    let nograd = ops::forward::<F>(&op, f_in.clone(), &f_params, &ctx(false, op_seed)).expect("forward without grad");
    assert!(nograd.extras.is_empty(), "{name}: extras without grad");
    assert!(read_value(&nograd.output) == out_bits, "{name}: forward without grad is not bit-identical");
    let again = ops::forward::<F>(&op, f_in.clone(), &f_params, &ctx(true, op_seed)).expect("forward again");
    assert!(read_value(&again.output) == out_bits, "{name}: forward is not deterministic");
    for (a, b) in again.extras.iter().zip(&fwd.extras) {
        assert!(read_value(a) == read_value(b), "{name}: extras are not deterministic");
    }
    let output = match &fwd.output {
        Value::Float(t) => read::<F>(t.clone()),
        _ => panic!("{name}: float output expected"),
    };
    assert_close(&format!("{name}: forward vs autodiff forward"), &output, &ad_out_host, 1e-5);

    let input_dims: Vec<Vec<usize>> = inputs.iter().map(|i| i.shape().to_vec()).collect();
    let needs: Vec<bool> = inputs.iter().map(|i| matches!(i, In::F(_))).collect();
    let saved = saved_of(&op, &f_in, &fwd.output, &fwd.extras);
    // A backward that does not read the parameters gets none.
    let bparams: &[FloatTensor<F>] = if op.decl.backward_reads_params { &f_params } else { &[] };
    let g = ops::backward::<F>(
        &op,
        &input_dims,
        float_tensor::<F>(&r, &op.decl.output),
        saved,
        bparams,
        &needs,
        &ctx(true, op_seed),
    )
    .expect("backward");
    assert_eq!(g.inputs.len(), inputs.len(), "{name}: one gradient slot per input");
    assert_eq!(g.params.len(), params.len(), "{name}: one gradient per parameter");
    for (k, (ours, theirs)) in g.inputs.into_iter().zip(&ad_in_grads).enumerate() {
        match (ours, theirs) {
            (Some(t), Some(want)) => {
                assert_eq!(t.shape().to_vec(), input_dims[k], "{name}: input {k} gradient shape");
                assert_close(&format!("{name}: input {k} gradient"), &read::<F>(t), want, tol);
            }
            (None, None) => {}
            (o, t) => panic!("{name}: input {k} gradient present {} vs autodiff {}", o.is_some(), t.is_some()),
        }
    }
    for (j, (ours, want)) in g.params.into_iter().zip(&ad_param_grads).enumerate() {
        assert_eq!(ours.shape().to_vec(), params[j].1, "{name}: parameter {j} gradient shape");
        assert_close(&format!("{name}: parameter {j} gradient"), &read::<F>(ours), want, tol);
    }
    Checked { op, host, output, extras: fwd.extras }
}

/// A loss against autodiff on `loss_value`.
fn check_loss(kind: OpKind, inputs: &[In], seed: u64) -> (f32, Vec<Host>) {
    let op = net_op(kind, inputs);
    assert!(op.decl.loss);
    let mut rng = Rng(SplitMix(seed));
    let host = host_inputs(inputs, &mut rng);
    let name = op.name.clone();

    let ad_in: Vec<Value<A>> = host
        .iter()
        .map(|h| match value::<A>(h) {
            Value::Float(t) => Value::Float(A::float_set_require_grad(t, true)),
            v => v,
        })
        .collect();
    let actx = OpCtx::<A> { device: &DEV, grad: false, seed: 1 };
    let v = ops::loss_value::<A>(&op, ad_in.clone(), &actx).expect("loss value");
    assert_eq!(v.shape().to_vec(), vec![1], "{name}: one-element value");
    let ad_value = read::<A>(v.clone());
    let grads = A::backward(v);
    let want: Vec<Option<Vec<f32>>> = ad_in
        .iter()
        .map(|v| match v {
            Value::Float(t) => Some(read::<F>(A::grad(t, &grads).expect("gradient"))),
            _ => None,
        })
        .collect();

    let f_in: Vec<Value<F>> = host.iter().map(value::<F>).collect();
    let needs: Vec<bool> = inputs.iter().map(|i| matches!(i, In::F(_))).collect();
    let out = ops::loss::<F>(&op, f_in.clone(), &needs, &ctx(true, 1)).expect("loss");
    let value = read::<F>(out.value);
    assert_eq!(value.len(), 1, "{name}: one-element value");
    assert_close(&format!("{name}: value"), &value, &ad_value, 1e-5);
    let plain = read::<F>(ops::loss_value::<F>(&op, f_in, &ctx(false, 1)).expect("loss value"));
    assert_eq!(plain[0].to_bits(), value[0].to_bits(), "{name}: loss_value and loss differ");
    assert_eq!(out.inputs.len(), inputs.len());
    for (k, (ours, theirs)) in out.inputs.into_iter().zip(&want).enumerate() {
        match (ours, theirs) {
            (Some(t), Some(w)) => assert_close(&format!("{name}: input {k} gradient"), &read::<F>(t), w, 1e-4),
            (None, None) => {}
            (o, t) => panic!("{name}: input {k} gradient present {} vs autodiff {}", o.is_some(), t.is_some()),
        }
    }
    (value[0], host)
}

fn floats(h: &Host) -> &[f32] {
    match h {
        Host::F(v, _) => v,
        Host::I(..) => panic!("float input expected"),
    }
}

fn f(d: &[usize]) -> In {
    In::F(d.to_vec())
}

// ---------------------------------------------------------------------------------------
// Linear, embedding, shape and arithmetic ops

#[test]
fn linear_matches_autodiff() {
    let c = check_op(OpKind::Linear { out_features: 4, bias: true }, &[f(&[2, 3, 5])], 1);
    assert_eq!(c.op.decl.params[0].1, vec![4, 5]);
    check_op(OpKind::Linear { out_features: 3, bias: false }, &[f(&[6, 7])], 2);
    check_op(OpKind::Linear { out_features: 2, bias: true }, &[f(&[5])], 3);
}

#[test]
fn linear_uses_pytorch_layout() {
    let op = net_op(OpKind::Linear { out_features: 2, bias: true }, &[f(&[1, 3])]);
    let x = Value::Float(float_tensor::<F>(&[1.0, 2.0, 3.0], &[1, 3]));
    let w = float_tensor::<F>(&[1.0, 0.0, 0.0, 0.0, 1.0, 1.0], &[2, 3]);
    let b = float_tensor::<F>(&[10.0, 20.0], &[2]);
    let y = ops::forward::<F>(&op, vec![x], &[w, b], &ctx(false, 0)).unwrap().output.float().unwrap();
    assert_eq!(read::<F>(y), vec![11.0, 25.0]);
}

#[test]
fn embedding_matches_autodiff() {
    let c = check_op(OpKind::Embedding { vocab: 10, dim: 6 }, &[In::I(vec![2, 5], 10)], 4);
    assert_eq!(c.output.len(), 2 * 5 * 6);
    // Repeated ids accumulate: all ids equal.
    check_op(OpKind::Embedding { vocab: 3, dim: 4 }, &[In::I(vec![7], 1)], 5);
}

#[test]
fn embedding_through_net_builder() {
    let mut b = NetBuilder::new("emb", DType::F32);
    let ids = b.input("ids", vec![2, 4], Elem::Int);
    let y = b.input("y", vec![2, 4], Elem::Int);
    let e = b.op("wte", OpKind::Embedding { vocab: 9, dim: 5 }, &[ids]).unwrap();
    let h = b.op("head", OpKind::Linear { out_features: 9, bias: false }, &[e]).unwrap();
    b.loss("loss", OpKind::CrossEntropy, &[h, y]).unwrap();
    let net = b.finish().unwrap();
    let op = &net.ops[0];
    let mut rng = Rng(SplitMix(9));
    let idv: Vec<i64> = (0..8).map(|_| rng.below(9)).collect();
    let ids = value::<F>(&Host::I(idv.clone(), vec![2, 4]));
    let table = rng.floats(45);
    let w = float_tensor::<F>(&table, &[9, 5]);
    let out = ops::forward::<F>(op, vec![ids], &[w], &ctx(true, 0)).unwrap();
    let got = read::<F>(out.output.float().unwrap());
    for (i, &id) in idv.iter().enumerate() {
        assert_eq!(&got[i * 5..i * 5 + 5], &table[id as usize * 5..id as usize * 5 + 5]);
    }
}

#[test]
fn add_matches_autodiff() {
    check_op(OpKind::Add, &[f(&[2, 3, 4]), f(&[2, 3, 4])], 6);
    let c = check_op(OpKind::Add, &[f(&[2, 3, 4]), f(&[3, 4])], 7);
    let (x, y) = (floats(&c.host[0]), floats(&c.host[1]));
    let want: Vec<f32> = (0..24).map(|i| x[i] + y[i % 12]).collect();
    assert_eq!(c.output, want);
    check_op(OpKind::Add, &[f(&[2, 3, 4]), f(&[4])], 8);
}

#[test]
fn mul_matches_autodiff() {
    check_op(OpKind::Mul, &[f(&[2, 3, 4]), f(&[2, 3, 4])], 9);
}

#[test]
fn concat_matches_autodiff() {
    let c = check_op(OpKind::Concat { dim: 1 }, &[f(&[2, 3, 4]), f(&[2, 2, 4])], 10);
    assert_eq!(c.op.decl.output, vec![2, 5, 4]);
    check_op(OpKind::Concat { dim: 2 }, &[f(&[2, 3, 4]), f(&[2, 3, 1]), f(&[2, 3, 2])], 11);
    check_op(OpKind::Concat { dim: 0 }, &[f(&[2, 3])], 12);
}

#[test]
fn reshape_and_slice_match_autodiff() {
    check_op(OpKind::Reshape { shape: vec![6, 4] }, &[f(&[2, 3, 4])], 13);
    let c = check_op(OpKind::Slice { start: 2, len: 3 }, &[f(&[2, 3, 8])], 14);
    let x = floats(&c.host[0]);
    let want: Vec<f32> = (0..6).flat_map(|r| x[r * 8 + 2..r * 8 + 5].to_vec()).collect();
    assert_eq!(c.output, want);
    check_op(OpKind::Slice { start: 0, len: 8 }, &[f(&[2, 8])], 15);
}

#[test]
fn views_of_integer_tensors() {
    let op = net_op(OpKind::Reshape { shape: vec![6] }, &[In::I(vec![2, 3], 5)]);
    let ids = value::<F>(&Host::I(vec![0, 1, 2, 3, 4, 0], vec![2, 3]));
    let out = ops::forward::<F>(&op, vec![ids.clone()], &[], &ctx(false, 0)).unwrap();
    assert_eq!(out.output.kind(), "int");
    assert_eq!(out.output.dims(), vec![6]);
    let op = net_op(OpKind::Slice { start: 1, len: 2 }, &[In::I(vec![2, 3], 5)]);
    let out = ops::forward::<F>(&op, vec![ids], &[], &ctx(false, 0)).unwrap();
    assert_eq!(out.output.kind(), "int");
    assert_eq!(out.output.dims(), vec![2, 2]);
}

// ---------------------------------------------------------------------------------------
// Activations and dropout

#[test]
fn activations_match_autodiff() {
    let c = check_op(OpKind::Relu, &[f(&[2, 3, 7])], 20);
    let x = floats(&c.host[0]);
    assert_eq!(c.output, x.iter().map(|v| v.max(0.0)).collect::<Vec<_>>());
    let c = check_op(OpKind::Gelu, &[f(&[2, 3, 7])], 21);
    let x = floats(&c.host[0]);
    let want: Vec<f32> = x
        .iter()
        .map(|&v| {
            let v = v as f64;
            (0.5 * v * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (v + 0.044715 * v * v * v)).tanh())) as f32
        })
        .collect();
    assert_close("gelu (tanh form)", &c.output, &want, 1e-6);
    let c = check_op(OpKind::Silu, &[f(&[2, 3, 7])], 22);
    let x = floats(&c.host[0]);
    let want: Vec<f32> = x.iter().map(|&v| v / (1.0 + (-v).exp())).collect();
    assert_close("silu", &c.output, &want, 1e-6);
    let c = check_op(OpKind::Softmax, &[f(&[2, 3, 7])], 23);
    for row in c.output.chunks(7) {
        assert!((row.iter().sum::<f32>() - 1.0).abs() < 1e-6);
    }
}

#[test]
fn gelu_with_large_inputs() {
    // Saturated tanh on both sides: the gradient is 0 or 1, never NaN.
    let op = net_op(OpKind::Gelu, &[f(&[4])]);
    let x = float_tensor::<F>(&[-30.0, -8.0, 8.0, 30.0], &[4]);
    let out = ops::forward::<F>(&op, vec![Value::Float(x.clone())], &[], &ctx(true, 0)).unwrap();
    let y = read::<F>(out.output.float().unwrap());
    assert_close("gelu far out", &y, &[0.0, 0.0, 8.0, 30.0], 1e-6);
    let g = ops::backward::<F>(
        &op,
        &[vec![4]],
        float_tensor::<F>(&[1.0; 4], &[4]),
        vec![Value::Float(x)],
        &[],
        &[true],
        &ctx(true, 0),
    )
    .unwrap();
    assert_close("gelu far-out gradient", &read::<F>(g.inputs[0].clone().unwrap()), &[0.0, 0.0, 1.0, 1.0], 1e-6);
}

#[test]
fn dropout_matches_autodiff_and_repeats() {
    let p = 0.3;
    let c = check_op(OpKind::Dropout { p }, &[f(&[4, 5, 6])], 24);
    let x = floats(&c.host[0]);
    let Value::Bool(mask) = c.extras[0].clone() else { panic!("bool mask") };
    let keep = read_bools(mask);
    let kept = keep.iter().filter(|&&k| k).count();
    assert!(kept > 60 && kept < 110, "kept {kept} of 120");
    for i in 0..x.len() {
        let want = if keep[i] { x[i] / (1.0 - p as f32) } else { 0.0 };
        assert!((c.output[i] - want).abs() < 1e-6);
    }
    // Another seed, another mask; p = 0 keeps everything.
    let op = net_op(OpKind::Dropout { p }, &[f(&[4, 5, 6])]);
    let xv = Value::Float(float_tensor::<F>(x, &[4, 5, 6]));
    let a = ops::forward::<F>(&op, vec![xv.clone()], &[], &ctx(false, 1)).unwrap();
    let b = ops::forward::<F>(&op, vec![xv.clone()], &[], &ctx(false, 2)).unwrap();
    assert!(read_value(&a.output) != read_value(&b.output), "seeds 1 and 2 drew the same mask");
    let c0 = check_op(OpKind::Dropout { p: 0.0 }, &[f(&[3, 4])], 25);
    assert_eq!(c0.output, floats(&c0.host[0]));
}

// ---------------------------------------------------------------------------------------
// Normalizations

#[test]
fn batch_norm_matches_autodiff() {
    let c = check_op(OpKind::BatchNorm2d, &[f(&[3, 4, 5, 5])], 30);
    // Saved mean and invstd are the batch statistics.
    let x = floats(&c.host[0]);
    let (n, ch, hw) = (3, 4, 25);
    let Value::Float(mean) = c.extras[0].clone() else { panic!() };
    let Value::Float(invstd) = c.extras[1].clone() else { panic!() };
    let (mean, invstd) = (read::<F>(mean), read::<F>(invstd));
    for k in 0..ch {
        let vals: Vec<f64> =
            (0..n).flat_map(|i| (0..hw).map(move |j| (i * ch + k) * hw + j)).map(|i| x[i] as f64).collect();
        let m = vals.iter().sum::<f64>() / vals.len() as f64;
        let var = vals.iter().map(|v| (v - m) * (v - m)).sum::<f64>() / vals.len() as f64;
        assert!((mean[k] as f64 - m).abs() < 1e-5);
        assert!((invstd[k] as f64 - 1.0 / (var + 1e-5).sqrt()).abs() < 1e-3);
    }
}

#[test]
fn layer_and_rms_norm_match_autodiff() {
    let c = check_op(OpKind::LayerNorm { bias: true }, &[f(&[2, 3, 8])], 31);
    assert_eq!(c.extras.len(), 2);
    check_op(OpKind::LayerNorm { bias: false }, &[f(&[4, 16])], 32);
    let c = check_op(OpKind::RmsNorm, &[f(&[2, 3, 8])], 33);
    let x = floats(&c.host[0]);
    let Value::Float(rstd) = c.extras[0].clone() else { panic!() };
    let rstd = read::<F>(rstd);
    for (r, row) in x.chunks(8).enumerate() {
        let ms = row.iter().map(|v| (v * v) as f64).sum::<f64>() / 8.0;
        assert!((rstd[r] as f64 - 1.0 / (ms + 1e-6).sqrt()).abs() < 1e-4);
    }
}

// ---------------------------------------------------------------------------------------
// Convolutions and pooling

#[test]
fn conv2d_matches_autodiff() {
    let k = |out_channels, kernel, stride, padding, groups, bias| OpKind::Conv2d {
        out_channels,
        kernel,
        stride,
        padding,
        groups,
        bias,
    };
    check_op(k(4, 3, 1, 1, 1, true), &[f(&[2, 3, 6, 6])], 40);
    check_op(k(6, 3, 2, 1, 3, false), &[f(&[2, 6, 7, 7])], 41);
    check_op(k(5, 1, 1, 0, 1, true), &[f(&[1, 4, 3, 3])], 42);
}

#[test]
fn conv2d_rect_matches_autodiff() {
    let kind =
        OpKind::Conv2dRect { out_channels: 4, kernel_h: 1, kernel_w: 3, stride: 1, pad_h: 0, pad_w: 1, bias: true };
    check_op(kind, &[f(&[2, 3, 5, 6])], 43);
    let kind =
        OpKind::Conv2dRect { out_channels: 2, kernel_h: 3, kernel_w: 1, stride: 2, pad_h: 1, pad_w: 0, bias: false };
    check_op(kind, &[f(&[2, 3, 6, 5])], 44);
}

#[test]
fn conv_transpose2d_matches_autodiff() {
    let c = check_op(OpKind::ConvTranspose2d { out_channels: 2, kernel: 2, bias: true }, &[f(&[2, 3, 4, 4])], 45);
    assert_eq!(c.op.decl.output, vec![2, 2, 8, 8]);
    check_op(OpKind::ConvTranspose2d { out_channels: 3, kernel: 3, bias: false }, &[f(&[1, 2, 2, 3])], 46);
}

#[test]
fn pooling_matches_autodiff() {
    check_op(OpKind::MaxPool2d { kernel: 2, stride: 2, padding: 0 }, &[f(&[2, 3, 6, 6])], 50);
    check_op(OpKind::MaxPool2d { kernel: 3, stride: 2, padding: 1 }, &[f(&[2, 3, 7, 7])], 51);
    check_op(OpKind::AvgPool2d { kernel: 2, stride: 2, padding: 0 }, &[f(&[2, 3, 6, 6])], 52);
    let c = check_op(OpKind::AvgPool2d { kernel: 3, stride: 2, padding: 1 }, &[f(&[1, 1, 5, 5])], 53);
    // count_include_pad: the corner window sums 4 entries over 9.
    let x = floats(&c.host[0]);
    let corner = (x[0] + x[1] + x[5] + x[6]) / 9.0;
    assert!((c.output[0] - corner).abs() < 1e-6, "{} vs {corner}", c.output[0]);
    check_op(OpKind::AdaptiveAvgPool2d { out: 1 }, &[f(&[2, 3, 7, 7])], 54);
    check_op(OpKind::AdaptiveAvgPool2d { out: 3 }, &[f(&[2, 2, 7, 5])], 55);
}

// ---------------------------------------------------------------------------------------
// Attention and rope

/// Naive attention on the host (no dropout): q [B,S,E], k, v [B,S,Ekv].
#[allow(clippy::too_many_arguments)]
fn host_attention(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    (b, s, e): (usize, usize, usize),
    heads: usize,
    kv_heads: usize,
    causal: bool,
    (qs, ks, vs, stride): (usize, usize, usize, usize),
) -> Vec<f32> {
    // Entries are at row·stride + offset + column (to read a packed input).
    let hd = e / heads;
    let g = heads / kv_heads;
    let mut out = vec![0.0f32; b * s * e];
    for bi in 0..b {
        for h in 0..heads {
            let kh = h / g;
            for i in 0..s {
                let qrow = (bi * s + i) * stride + qs + h * hd;
                let mut scores = vec![f64::NEG_INFINITY; s];
                for (j, sc) in scores.iter_mut().enumerate() {
                    if causal && j > i {
                        continue;
                    }
                    let krow = (bi * s + j) * stride + ks + kh * hd;
                    *sc = (0..hd).map(|d| q[qrow + d] as f64 * k[krow + d] as f64).sum::<f64>() / (hd as f64).sqrt();
                }
                let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = scores.iter().map(|x| (x - m).exp()).sum();
                for d in 0..hd {
                    let mut acc = 0.0;
                    for (j, sc) in scores.iter().enumerate() {
                        let vrow = (bi * s + j) * stride + vs + kh * hd;
                        acc += (sc - m).exp() / z * v[vrow + d] as f64;
                    }
                    out[(bi * s + i) * e + h * hd + d] = acc as f32;
                }
            }
        }
    }
    out
}

#[test]
fn packed_attention_matches_autodiff_and_reference() {
    for causal in [false, true] {
        let kind = OpKind::Attention { heads: 2, kv_heads: 2, causal, dropout: 0.0 };
        let c = check_op(kind, &[f(&[2, 5, 24])], 60 + causal as u64);
        let x = floats(&c.host[0]);
        let want = host_attention(x, x, x, (2, 5, 8), 2, 2, causal, (0, 8, 16, 24));
        assert_close("packed attention vs host", &c.output, &want, 1e-5);
        let Value::Float(w) = c.extras[0].clone() else { panic!() };
        let w = read::<F>(w);
        for (r, row) in w.chunks(5).enumerate() {
            assert!((row.iter().sum::<f32>() - 1.0).abs() < 1e-5);
            if causal {
                let i = r % 5;
                assert!(row[i + 1..].iter().all(|&x| x == 0.0), "causal weights above the diagonal");
            }
        }
    }
}

#[test]
fn packed_causal_attention_with_dropout() {
    let kind = OpKind::Attention { heads: 2, kv_heads: 2, causal: true, dropout: 0.2 };
    let c = check_op(kind.clone(), &[f(&[2, 6, 24])], 62);
    assert_eq!(c.extras.len(), 2);
    assert_eq!(c.extras[1].kind(), "bool");
    // The attention mask is not the dropout op's mask for the same seed.
    let seed = 77;
    let att = net_op(kind, &[f(&[2, 6, 24])]);
    let x = Value::Float(float_tensor::<F>(floats(&c.host[0]), &[2, 6, 24]));
    let a = ops::forward::<F>(&att, vec![x], &[], &ctx(true, seed)).unwrap();
    let drop = net_op(OpKind::Dropout { p: 0.2 }, &[f(&[2, 2, 6, 6])]);
    let ones = Value::Float(float_tensor::<F>(&[1.0; 144], &[2, 2, 6, 6]));
    let d = ops::forward::<F>(&drop, vec![ones], &[], &ctx(true, seed)).unwrap();
    assert!(read_value(&a.extras[1]) != read_value(&d.extras[0]), "attention and dropout share a mask stream");
}

#[test]
fn grouped_query_attention_matches_autodiff_and_reference() {
    let kind = OpKind::Attention { heads: 4, kv_heads: 2, causal: true, dropout: 0.0 };
    let c = check_op(kind, &[f(&[2, 5, 8]), f(&[2, 5, 4]), f(&[2, 5, 4])], 63);
    let (q, k, v) = (floats(&c.host[0]), floats(&c.host[1]), floats(&c.host[2]));
    // host_attention reads q with stride E and k, v with stride E_kv: run it per tensor.
    let hd = 2;
    let mut want = vec![0.0; 2 * 5 * 8];
    for bi in 0..2 {
        for h in 0..4 {
            let kh = h / 2;
            for i in 0..5 {
                let mut sc: Vec<f64> = (0..5)
                    .map(|j| {
                        if j > i {
                            return f64::NEG_INFINITY;
                        }
                        (0..hd)
                            .map(|d| q[(bi * 5 + i) * 8 + h * hd + d] as f64 * k[(bi * 5 + j) * 4 + kh * hd + d] as f64)
                            .sum::<f64>()
                            / (hd as f64).sqrt()
                    })
                    .collect();
                let m = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                sc.iter_mut().for_each(|x| *x = (*x - m).exp());
                let z: f64 = sc.iter().sum();
                for d in 0..hd {
                    want[(bi * 5 + i) * 8 + h * hd + d] =
                        (0..5).map(|j| sc[j] / z * v[(bi * 5 + j) * 4 + kh * hd + d] as f64).sum::<f64>() as f32;
                }
            }
        }
    }
    assert_close("GQA vs host", &c.output, &want, 1e-5);
    let kind = OpKind::Attention { heads: 2, kv_heads: 1, causal: false, dropout: 0.25 };
    check_op(kind, &[f(&[1, 4, 6]), f(&[1, 4, 3]), f(&[1, 4, 3])], 64);
}

#[test]
fn rope_matches_autodiff_and_reference() {
    for (rotary, seed) in [(4, 70), (8, 71)] {
        let c = check_op(OpKind::Rope { heads: 2, rotary_dim: rotary }, &[f(&[2, 5, 16])], seed);
        let x = floats(&c.host[0]);
        let half = rotary / 2;
        for bi in 0..2 {
            for pos in 0..5 {
                for h in 0..2 {
                    let base = (bi * 5 + pos) * 16 + h * 8;
                    for i in 0..8 {
                        let want = if i < rotary {
                            let j = i % half;
                            let theta = pos as f64 / 10000f64.powf(2.0 * j as f64 / rotary as f64);
                            let (x1, x2) = (x[base + j] as f64, x[base + j + half] as f64);
                            if i < half {
                                x1 * theta.cos() - x2 * theta.sin()
                            } else {
                                x2 * theta.cos() + x1 * theta.sin()
                            }
                        } else {
                            x[base + i] as f64
                        };
                        assert!((c.output[base + i] as f64 - want).abs() < 1e-5, "rope at {base}+{i}");
                    }
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Losses

#[test]
fn cross_entropy_matches_autodiff_and_reference() {
    let (value, host) = check_loss(OpKind::CrossEntropy, &[f(&[2, 3, 5]), In::I(vec![2, 3], 5)], 80);
    let (x, labels) = match (&host[0], &host[1]) {
        (Host::F(x, _), Host::I(l, _)) => (x, l),
        _ => panic!(),
    };
    let mut want = 0.0f64;
    for (r, row) in x.chunks(5).enumerate() {
        let m = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
        let lse = m + row.iter().map(|v| (*v as f64 - m).exp()).sum::<f64>().ln();
        want += lse - row[labels[r] as usize] as f64;
    }
    want /= 6.0;
    assert!((value as f64 - want).abs() < 1e-5, "{value} vs {want}");
    check_loss(OpKind::CrossEntropy, &[f(&[4, 10]), In::I(vec![4], 10)], 81);
}

#[test]
fn mse_matches_autodiff_and_reference() {
    let (value, host) = check_loss(OpKind::Mse, &[f(&[3, 4]), f(&[3, 4])], 82);
    let (x, y) = (floats(&host[0]), floats(&host[1]));
    let want = x.iter().zip(y).map(|(a, b)| ((a - b) * (a - b)) as f64).sum::<f64>() / 12.0;
    assert!((value as f64 - want).abs() < 1e-6);
}

// ---------------------------------------------------------------------------------------
// Contract violations are errors, not panics

#[test]
fn mismatched_operands_are_errors() {
    let op = net_op(OpKind::Linear { out_features: 4, bias: true }, &[f(&[2, 5])]);
    let x = Value::Float(float_tensor::<F>(&[0.0; 12], &[2, 6]));
    let w = float_tensor::<F>(&[0.0; 20], &[4, 5]);
    let b = float_tensor::<F>(&[0.0; 4], &[4]);
    let e = ops::forward::<F>(&op, vec![x], &[w.clone(), b.clone()], &ctx(false, 0));
    assert!(matches!(e, Err(RuntimeError::Unsupported { .. })));
    // Parameters of the wrong shape.
    let x = Value::Float(float_tensor::<F>(&[0.0; 10], &[2, 5]));
    let e = ops::forward::<F>(&op, vec![x.clone()], &[b.clone(), w.clone()], &ctx(false, 0));
    assert!(matches!(e, Err(RuntimeError::Unsupported { .. })));
    // Missing parameters.
    let e = ops::forward::<F>(&op, vec![x.clone()], &[], &ctx(false, 0));
    assert!(e.is_err());
    // A backward with the wrong saved tensors or gradient.
    let g = float_tensor::<F>(&[0.0; 8], &[2, 4]);
    let e = ops::backward::<F>(&op, &[vec![2, 5]], g.clone(), vec![], &[w.clone(), b.clone()], &[true], &ctx(true, 0));
    assert!(e.is_err());
    let e = ops::backward::<F>(
        &op,
        &[vec![2, 5]],
        float_tensor::<F>(&[0.0; 10], &[2, 5]),
        vec![x.clone()],
        &[w.clone(), b.clone()],
        &[true],
        &ctx(true, 0),
    );
    assert!(e.is_err());
    let e = ops::backward::<F>(
        &op,
        &[vec![2, 5]],
        g.clone(),
        vec![Value::Bool(F::float_greater_elem(
            float_tensor::<F>(&[0.0; 10], &[2, 5]),
            0.0f32.into(),
            get_device_settings::<F>(&DEV).bool_dtype,
        ))],
        &[w.clone(), b.clone()],
        &[true],
        &ctx(true, 0),
    );
    assert!(e.is_err());
    let ok = ops::backward::<F>(&op, &[vec![2, 5]], g, vec![x], &[w, b], &[true], &ctx(true, 0));
    assert!(ok.is_ok());
    // Float labels, integer logits.
    let ce = net_op(OpKind::CrossEntropy, &[f(&[2, 3]), In::I(vec![2], 3)]);
    let l = Value::Float(float_tensor::<F>(&[0.0; 2], &[2]));
    let lg = Value::Float(float_tensor::<F>(&[0.0; 6], &[2, 3]));
    assert!(ops::loss::<F>(&ce, vec![lg, l], &[true, false], &ctx(true, 0)).is_err());
    // A loss through forward, a non-loss through loss.
    assert!(ops::forward::<F>(&ce, vec![], &[], &ctx(true, 0)).is_err());
}

// ---------------------------------------------------------------------------------------
// Whole networks: the op library's forward and backward, chained as an executor would,
// against Burn's autodiff on the same forward

/// The bound of an integer input: the vocabulary of the embedding, or the classes of the
/// loss, it feeds.
fn int_bound(net: &Network, t: TensorId) -> u64 {
    let mut bound = u64::MAX;
    for op in &net.ops {
        for (k, &i) in op.inputs.iter().enumerate() {
            if i != t {
                continue;
            }
            let b = match &op.kind {
                OpKind::Embedding { vocab, .. } => *vocab as u64,
                OpKind::CrossEntropy if k == 1 => *net.tensors[op.inputs[0]].shape.last().expect("logits") as u64,
                OpKind::Reshape { .. } | OpKind::Slice { .. } => int_bound(net, op.output),
                _ => u64::MAX,
            };
            bound = bound.min(b);
        }
    }
    bound
}

/// Parameter values: `U(−1, 1)·√(3/fan_in)` for matrices and kernels, `1 + 0.1·U` for
/// 1-D weights (norms), `0.1·U` for biases.
fn init_param(p: &NetParam, rng: &mut Rng) -> Vec<f32> {
    let n = numel(&p.shape);
    let u = rng.floats(n);
    if p.shape.len() >= 2 {
        let fan_in = (n / p.shape[0]).max(1) as f32;
        u.into_iter().map(|x| x * (3.0 / fan_in).sqrt()).collect()
    } else if p.name.ends_with("weight") {
        u.into_iter().map(|x| 1.0 + 0.1 * x).collect()
    } else {
        u.into_iter().map(|x| 0.1 * x).collect()
    }
}

fn accumulate(slot: &mut Option<FloatTensor<F>>, g: FloatTensor<F>) {
    *slot = Some(match slot.take() {
        Some(a) => F::float_add(a, g),
        None => g,
    });
}

fn check_network(name: &str, options: ModelOptions, tol: f32) {
    let model = build(name, &options).expect("model");
    check_net(&model.network, tol);
}

fn check_net(net: &Network, tol: f32) {
    let name = net.name.as_str();
    let mut rng = Rng(SplitMix(0xC0FFEE));
    let mut host: HashMap<TensorId, Host> = HashMap::new();
    for (t, tensor) in net.tensors.iter().enumerate() {
        if tensor.producer.is_none() {
            let n = numel(&tensor.shape);
            let h = match tensor.elem {
                Elem::Float => Host::F(rng.floats(n), tensor.shape.clone()),
                Elem::Int => {
                    let b = int_bound(net, t).clamp(1, 1 << 20);
                    Host::I((0..n).map(|_| rng.below(b)).collect(), tensor.shape.clone())
                }
                Elem::Byte => panic!("{name}: byte input"),
            };
            host.insert(t, h);
        }
    }
    let params: Vec<Vec<f32>> = net.params.iter().map(|p| init_param(p, &mut rng)).collect();
    let seed = |o: usize| 1000 + o as u64;

    // Ours: forward with grad, then the explicit backward in reverse.
    let f_params: Vec<FloatTensor<F>> =
        params.iter().zip(&net.params).map(|(v, p)| float_tensor::<F>(v, &p.shape)).collect();
    let mut vals: HashMap<TensorId, Value<F>> = host.iter().map(|(&t, h)| (t, value::<F>(h))).collect();
    let mut extras: Vec<Vec<Value<F>>> = vec![Vec::new(); net.ops.len()];
    let mut grads: HashMap<TensorId, Option<FloatTensor<F>>> = HashMap::new();
    let mut loss = f32::NAN;
    for (o, op) in net.ops.iter().enumerate() {
        let ins: Vec<Value<F>> = op.inputs.iter().map(|t| vals[t].clone()).collect();
        if op.decl.loss {
            let needs: Vec<bool> = op.inputs.iter().map(|&t| net.tensors[t].requires_grad).collect();
            let out = ops::loss::<F>(op, ins, &needs, &ctx(true, seed(o))).unwrap_or_else(|e| panic!("{name}: {e}"));
            loss = read::<F>(out.value)[0];
            for (k, g) in out.inputs.into_iter().enumerate() {
                if let Some(g) = g {
                    accumulate(grads.entry(op.inputs[k]).or_default(), g);
                }
            }
        } else {
            let p: Vec<FloatTensor<F>> = op.params.iter().map(|&p| f_params[p].clone()).collect();
            let fwd = ops::forward::<F>(op, ins, &p, &ctx(true, seed(o))).unwrap_or_else(|e| panic!("{name}: {e}"));
            check_extras(op, &fwd.extras);
            vals.insert(op.output, fwd.output);
            extras[o] = fwd.extras;
        }
    }
    let mut pgrads: Vec<Option<FloatTensor<F>>> = vec![None; net.params.len()];
    for (o, op) in net.ops.iter().enumerate().rev() {
        if op.decl.loss {
            continue;
        }
        let Some(Some(g)) = grads.remove(&op.output) else { continue };
        let input_dims: Vec<Vec<usize>> = op.inputs.iter().map(|&t| net.tensors[t].shape.clone()).collect();
        let needs: Vec<bool> = op.inputs.iter().map(|&t| net.tensors[t].requires_grad).collect();
        let ins: Vec<Value<F>> = op.inputs.iter().map(|t| vals[t].clone()).collect();
        let saved = saved_of(op, &ins, &vals[&op.output], &extras[o]);
        let p: Vec<FloatTensor<F>> = if op.decl.backward_reads_params {
            op.params.iter().map(|&p| f_params[p].clone()).collect()
        } else {
            Vec::new()
        };
        let gr = ops::backward::<F>(op, &input_dims, g, saved, &p, &needs, &ctx(true, seed(o)))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        for (k, gi) in gr.inputs.into_iter().enumerate() {
            if let Some(gi) = gi {
                accumulate(grads.entry(op.inputs[k]).or_default(), gi);
            }
        }
        for (j, gp) in gr.params.into_iter().enumerate() {
            accumulate(&mut pgrads[op.params[j]], gp);
        }
    }

    // Burn's autodiff on the same forward.
    let a_params: Vec<FloatTensor<A>> = params
        .iter()
        .zip(&net.params)
        .map(|(v, p)| A::float_set_require_grad(float_tensor::<A>(v, &p.shape), true))
        .collect();
    let mut avals: HashMap<TensorId, Value<A>> = host.iter().map(|(&t, h)| (t, value::<A>(h))).collect();
    let mut aloss = None;
    for (o, op) in net.ops.iter().enumerate() {
        let ins: Vec<Value<A>> = op.inputs.iter().map(|t| avals[t].clone()).collect();
        let actx = OpCtx::<A> { device: &DEV, grad: false, seed: seed(o) };
        if op.decl.loss {
            aloss = Some(ops::loss_value::<A>(op, ins, &actx).expect("loss value"));
        } else {
            let p: Vec<FloatTensor<A>> = op.params.iter().map(|&p| a_params[p].clone()).collect();
            avals.insert(op.output, ops::forward::<A>(op, ins, &p, &actx).expect("forward").output);
        }
    }
    let aloss = aloss.expect("a loss");
    let want_loss = read::<A>(aloss.clone())[0];
    assert!((loss - want_loss).abs() <= 1e-5 * want_loss.abs().max(1.0), "{name}: loss {loss} vs {want_loss}");
    let agrads = A::backward(aloss);
    for (j, p) in net.params.iter().enumerate() {
        let want =
            read::<F>(A::grad(&a_params[j], &agrads).unwrap_or_else(|| panic!("{name}: no grad for {}", p.name)));
        let got = read::<F>(pgrads[j].take().unwrap_or_else(|| panic!("{name}: no explicit grad for {}", p.name)));
        assert_close(&format!("{name}: {}", p.name), &got, &want, tol);
    }
}

#[test]
fn mlp_network_matches_autodiff() {
    check_network("mlp", ModelOptions { batch: Some(4), ..Default::default() }, 1e-3);
}

#[test]
fn resnet_network_matches_autodiff() {
    let options =
        ModelOptions { batch: Some(2), image: Some(16), layers: Some(1), width: Some(8), ..Default::default() };
    check_network("resnet", options, 1e-3);
}

#[test]
fn gpt_network_matches_autodiff() {
    let options = ModelOptions {
        batch: Some(2),
        seq: Some(8),
        layers: Some(2),
        width: Some(32),
        heads: Some(2),
        ..Default::default()
    };
    check_network("gpt", options, 1e-3);
}

#[test]
fn other_zoo_networks_match_autodiff() {
    for (name, o) in [
        ("unet", ModelOptions { batch: Some(1), image: Some(16), ..Default::default() }),
        ("siamese", ModelOptions { batch: Some(2), image: Some(32), ..Default::default() }),
        ("densenet121", ModelOptions { batch: Some(1), image: Some(32), ..Default::default() }),
        ("transformer", ModelOptions { batch: Some(1), seq: Some(4), layers: Some(1), ..Default::default() }),
        ("inception_v3", ModelOptions { batch: Some(1), image: Some(75), ..Default::default() }),
    ] {
        check_network(name, o, 1e-3);
    }
}

/// A small Llama-like network: RMSNorm, rope on q and k, grouped-query causal attention
/// with dropout, a SwiGLU MLP, then a slice / concat / reshape detour before the head.
fn mini_llama() -> Network {
    let mut b = NetBuilder::new("mini_llama", DType::F32);
    let tokens = b.input("tokens", vec![2, 6], Elem::Int);
    let labels = b.input("labels", vec![2, 6], Elem::Int);
    let lin = |out_features| OpKind::Linear { out_features, bias: false };
    let x = b.op("embed", OpKind::Embedding { vocab: 50, dim: 16 }, &[tokens]).unwrap();
    let n = b.op("norm1", OpKind::RmsNorm, &[x]).unwrap();
    let q = b.op("q", lin(16), &[n]).unwrap();
    let k = b.op("k", lin(8), &[n]).unwrap();
    let v = b.op("v", lin(8), &[n]).unwrap();
    let q = b.op("rope_q", OpKind::Rope { heads: 4, rotary_dim: 2 }, &[q]).unwrap();
    let k = b.op("rope_k", OpKind::Rope { heads: 2, rotary_dim: 4 }, &[k]).unwrap();
    let attention = OpKind::Attention { heads: 4, kv_heads: 2, causal: true, dropout: 0.1 };
    let a = b.op("attn", attention, &[q, k, v]).unwrap();
    let a = b.op("o", lin(16), &[a]).unwrap();
    let x = b.op("add1", OpKind::Add, &[x, a]).unwrap();
    let n = b.op("norm2", OpKind::RmsNorm, &[x]).unwrap();
    let g = b.op("gate", lin(24), &[n]).unwrap();
    let u = b.op("up", lin(24), &[n]).unwrap();
    let g = b.op("silu", OpKind::Silu, &[g]).unwrap();
    let m = b.op("mul", OpKind::Mul, &[g, u]).unwrap();
    let d = b.op("down", lin(16), &[m]).unwrap();
    let x = b.op("add2", OpKind::Add, &[x, d]).unwrap();
    let lo = b.op("lo", OpKind::Slice { start: 0, len: 6 }, &[x]).unwrap();
    let hi = b.op("hi", OpKind::Slice { start: 6, len: 10 }, &[x]).unwrap();
    let x = b.op("swap", OpKind::Concat { dim: 2 }, &[hi, lo]).unwrap();
    let x = b.op("flat", OpKind::Reshape { shape: vec![12, 16] }, &[x]).unwrap();
    let x = b.op("norm3", OpKind::LayerNorm { bias: false }, &[x]).unwrap();
    let logits = b.op("head", OpKind::Linear { out_features: 50, bias: true }, &[x]).unwrap();
    let labels = b.op("labels_flat", OpKind::Reshape { shape: vec![12] }, &[labels]).unwrap();
    b.loss("loss", OpKind::CrossEntropy, &[logits, labels]).unwrap();
    b.finish().unwrap()
}

/// A small convolutional network of every image op, ending in an MSE.
fn mini_convnet() -> Network {
    let mut b = NetBuilder::new("mini_convnet", DType::F32);
    let img = b.input("image", vec![2, 3, 8, 8], Elem::Float);
    let target = b.input("target", vec![2, 5], Elem::Float);
    let rect =
        OpKind::Conv2dRect { out_channels: 4, kernel_h: 1, kernel_w: 3, stride: 1, pad_h: 0, pad_w: 1, bias: true };
    let x = b.op("rect", rect, &[img]).unwrap();
    let x = b.op("bn", OpKind::BatchNorm2d, &[x]).unwrap();
    let x = b.op("relu", OpKind::Relu, &[x]).unwrap();
    let up = b.op("up", OpKind::ConvTranspose2d { out_channels: 4, kernel: 2, bias: true }, &[x]).unwrap();
    let down = b.op("pool", OpKind::MaxPool2d { kernel: 2, stride: 2, padding: 0 }, &[up]).unwrap();
    let conv = OpKind::Conv2d { out_channels: 4, kernel: 3, stride: 1, padding: 1, groups: 2, bias: false };
    let side = b.op("conv", conv, &[x]).unwrap();
    let x = b.op("cat", OpKind::Concat { dim: 1 }, &[down, side]).unwrap();
    let x = b.op("gelu", OpKind::Gelu, &[x]).unwrap();
    let x = b.op("avg", OpKind::AvgPool2d { kernel: 3, stride: 2, padding: 1 }, &[x]).unwrap();
    let x = b.op("drop", OpKind::Dropout { p: 0.25 }, &[x]).unwrap();
    let x = b.op("gap", OpKind::AdaptiveAvgPool2d { out: 1 }, &[x]).unwrap();
    let x = b.op("flat", OpKind::Reshape { shape: vec![2, 8] }, &[x]).unwrap();
    let x = b.op("soft", OpKind::Softmax, &[x]).unwrap();
    let x = b.op("fc", OpKind::Linear { out_features: 5, bias: true }, &[x]).unwrap();
    b.loss("loss", OpKind::Mse, &[x, target]).unwrap();
    b.finish().unwrap()
}

#[test]
fn mini_networks_of_every_op_match_autodiff() {
    check_net(&mini_llama(), 1e-3);
    check_net(&mini_convnet(), 1e-3);
}
