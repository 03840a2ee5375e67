//! Scaled dot-product attention (packed or q, k, v; causal; dropout on the weights) and rotary embeddings.
//!
//! Attention takes one packed `[B, S, 3E]` input (q | k | v along the last dimension) or
//! `q [B, S, E]`, `k, v [B, S, E_kv]`; with fewer key/value heads (grouped-query), query
//! head `h` reads key/value head `h / (heads / kv_heads)`. Scores are scaled by
//! `1/√head_dim`, causally masked when asked, soft-maxed (the saved `weights`, before
//! dropout), dropped out with a keep-mask drawn on the host from a stream of the op's seed
//! distinct from the dropout op's (the saved `mask`), and applied to the values; heads are
//! merged back into `[B, S, E]`. The backward recomputes nothing but the head views of its
//! saved inputs.
//!
//! Rope rotates the first `rotary_dim` dimensions of each head of a `[B, S, E]` input in
//! the GPT-NeoX / Llama "rotate half" convention: with `i < rotary_dim/2`, the pair
//! `(x[i], x[i + rotary_dim/2])` turns by `pos · 10000^(−2i/rotary_dim)`, `pos` the index
//! along dimension 1. Its backward is the inverse rotation; it saves nothing.

use burn_backend::tensor::{BoolTensor, FloatTensor};
use burn_backend::{Backend, DType, TensorMetadata};
use pebble_zoo::{NetOp, OpKind};

use super::util::{
    self, apply_keep, bool_const, dims, float_const, narrow, reshape, saved_bool, saved_float, sc, shape,
};
use super::{float_in, unsupported, Forward, Grads, OpCtx};
use crate::{RuntimeError, Value};

/// Rope's frequency base.
const ROPE_BASE: f64 = 10_000.0;

pub(super) fn forward<B: Backend>(
    op: &NetOp,
    inputs: Vec<Value<B>>,
    ctx: &OpCtx<'_, B>,
) -> Result<Forward<B>, RuntimeError> {
    let mut floats = Vec::with_capacity(inputs.len());
    for (k, v) in inputs.into_iter().enumerate() {
        floats.push(float_in(op, v, k)?);
    }
    match &op.kind {
        OpKind::Attention { heads, kv_heads, causal, dropout } => {
            let a = Attn::new::<B>(op, *heads, *kv_heads, &floats)?;
            let (q, k, v) = a.split::<B>(floats);
            let qh = a.heads_of::<B>(q, a.heads);
            let kh = a.repeat_kv::<B>(a.heads_of::<B>(k, a.kv_heads));
            let vh = a.repeat_kv::<B>(a.heads_of::<B>(v, a.kv_heads));
            let scores = B::float_mul_scalar(B::float_matmul(qh, B::float_transpose(kh)), sc(a.scale()));
            let scores = if *causal {
                let mask = causal_mask::<B>(a.b, a.heads, a.s, ctx.device);
                B::float_mask_fill(scores, mask, sc(f64::NEG_INFINITY))
            } else {
                scores
            };
            let weights = util::softmax_last::<B>(scores);
            let mut extras = Vec::new();
            let dropped = if *dropout > 0.0 {
                let keep = attention_keep::<B>(ctx.seed, &a.weights_dims(), *dropout, ctx.device);
                let wd = apply_keep::<B>(weights.clone(), keep.clone(), *dropout);
                if ctx.grad {
                    extras.push(Value::Float(weights));
                    extras.push(Value::Bool(keep));
                }
                wd
            } else {
                if ctx.grad {
                    extras.push(Value::Float(weights.clone()));
                }
                weights
            };
            let out = a.merge::<B>(B::float_matmul(dropped, vh));
            Ok(Forward { output: Value::Float(out), extras })
        }
        OpKind::Rope { heads, rotary_dim } => {
            let x = floats.pop().ok_or_else(|| unsupported(op, "missing input 0"))?;
            let out = rope::<B>(op, x, *heads, *rotary_dim, 1.0, ctx.device)?;
            Ok(Forward { output: Value::Float(out), extras: Vec::new() })
        }
        _ => Err(unsupported(op, "not attention")),
    }
}

pub(super) fn backward<B: Backend>(
    op: &NetOp,
    _input_dims: &[Vec<usize>],
    grad_out: FloatTensor<B>,
    saved: Vec<Value<B>>,
    needs: &[bool],
    ctx: &OpCtx<'_, B>,
) -> Result<Grads<B>, RuntimeError> {
    match &op.kind {
        OpKind::Attention { heads, kv_heads, dropout, .. } => {
            let n_in = op.decl.saved.len() - if *dropout > 0.0 { 2 } else { 1 };
            let mut saved = saved.into_iter().enumerate();
            let mut inputs = Vec::with_capacity(n_in);
            for _ in 0..n_in {
                let (i, v) = saved.next().ok_or_else(|| unsupported(op, "missing saved input"))?;
                inputs.push(saved_float(op, v, i)?);
            }
            let (i, v) = saved.next().ok_or_else(|| unsupported(op, "missing saved weights"))?;
            let weights = saved_float(op, v, i)?;
            let keep = match saved.next() {
                Some((i, v)) => Some(saved_bool(op, v, i)?),
                None => None,
            };
            let a = Attn::new::<B>(op, *heads, *kv_heads, &inputs)?;
            let (need_q, need_k, need_v) =
                if n_in == 1 { (needs[0], needs[0], needs[0]) } else { (needs[0], needs[1], needs[2]) };
            let (q, k, v) = a.split::<B>(inputs);
            let g = a.heads_of::<B>(grad_out, a.heads);
            let vh = a.repeat_kv::<B>(a.heads_of::<B>(v, a.kv_heads));
            let dv = need_v.then(|| {
                let wd = match &keep {
                    Some(m) => apply_keep::<B>(weights.clone(), m.clone(), *dropout),
                    None => weights.clone(),
                };
                a.merge::<B>(a.reduce_kv::<B>(B::float_matmul(B::float_transpose(wd), g.clone())))
            });
            let (dq, dk) = if need_q || need_k {
                let dwd = B::float_matmul(g, B::float_transpose(vh));
                let dw = match keep {
                    Some(m) => apply_keep::<B>(dwd, m, *dropout),
                    None => dwd,
                };
                let ds = B::float_mul_scalar(util::softmax_last_backward::<B>(weights, dw), sc(a.scale()));
                let dq = need_q.then(|| {
                    let kh = a.repeat_kv::<B>(a.heads_of::<B>(k, a.kv_heads));
                    a.merge::<B>(B::float_matmul(ds.clone(), kh))
                });
                let dk = need_k.then(|| {
                    let qh = a.heads_of::<B>(q, a.heads);
                    a.merge::<B>(a.reduce_kv::<B>(B::float_matmul(B::float_transpose(ds), qh)))
                });
                (dq, dk)
            } else {
                (None, None)
            };
            let inputs = if n_in == 1 {
                let packed = match (dq, dk, dv) {
                    (Some(dq), Some(dk), Some(dv)) => Some(B::float_cat(vec![dq, dk, dv], 2)),
                    _ => None,
                };
                vec![packed]
            } else {
                vec![dq, dk, dv]
            };
            Ok(Grads { inputs, params: Vec::new() })
        }
        OpKind::Rope { heads, rotary_dim } => {
            let dx = if needs.first().copied().unwrap_or(false) {
                Some(rope::<B>(op, grad_out, *heads, *rotary_dim, -1.0, ctx.device)?)
            } else {
                None
            };
            Ok(Grads { inputs: vec![dx], params: Vec::new() })
        }
        _ => Err(unsupported(op, "not attention")),
    }
}

/// The shapes of one attention op.
struct Attn {
    b: usize,
    s: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    packed: bool,
}

impl Attn {
    fn new<B: Backend>(
        op: &NetOp,
        heads: usize,
        kv_heads: usize,
        inputs: &[FloatTensor<B>],
    ) -> Result<Attn, RuntimeError> {
        let d = dims(&inputs[0]);
        if d.len() != 3 || heads == 0 || kv_heads == 0 || !heads.is_multiple_of(kv_heads) {
            return Err(unsupported(op, &format!("input {d:?} with {heads} heads / {kv_heads} kv heads")));
        }
        let packed = inputs.len() == 1;
        let e = if packed { d[2] / 3 } else { d[2] };
        Ok(Attn { b: d[0], s: d[1], heads, kv_heads, head_dim: e / heads, packed })
    }

    fn scale(&self) -> f64 {
        1.0 / (self.head_dim as f64).sqrt()
    }

    fn weights_dims(&self) -> [usize; 4] {
        [self.b, self.heads, self.s, self.s]
    }

    /// `q, k, v` as `[B, S, E]`, `[B, S, E_kv]` (slices of the packed input).
    fn split<B: Backend>(&self, mut inputs: Vec<FloatTensor<B>>) -> (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>) {
        if self.packed {
            let x = inputs.pop().expect("one input");
            let e = self.heads * self.head_dim;
            (narrow::<B>(x.clone(), 2, 0, e), narrow::<B>(x.clone(), 2, e, e), narrow::<B>(x, 2, 2 * e, e))
        } else {
            let v = inputs.pop().expect("three inputs");
            let k = inputs.pop().expect("three inputs");
            let q = inputs.pop().expect("three inputs");
            (q, k, v)
        }
    }

    /// `[B, S, h·d]` → `[B, h, S, d]`.
    fn heads_of<B: Backend>(&self, t: FloatTensor<B>, h: usize) -> FloatTensor<B> {
        B::float_swap_dims(reshape::<B>(t, &[self.b, self.s, h, self.head_dim]), 1, 2)
    }

    /// `[B, h, S, d]` → `[B, S, h·d]`.
    fn merge<B: Backend>(&self, t: FloatTensor<B>) -> FloatTensor<B> {
        let h = dims(&t)[1];
        reshape::<B>(B::float_swap_dims(t, 1, 2), &[self.b, self.s, h * self.head_dim])
    }

    fn group(&self) -> usize {
        self.heads / self.kv_heads
    }

    /// `[B, kv_heads, S, d]` → `[B, heads, S, d]`, each kv head serving `group` query heads.
    fn repeat_kv<B: Backend>(&self, t: FloatTensor<B>) -> FloatTensor<B> {
        let g = self.group();
        if g == 1 {
            return t;
        }
        let (b, kv, s, d) = (self.b, self.kv_heads, self.s, self.head_dim);
        let t = B::float_repeat_dim(reshape::<B>(t, &[b, kv, 1, s, d]), 2, g);
        reshape::<B>(t, &[b, kv * g, s, d])
    }

    /// The transpose of [`Attn::repeat_kv`]: sums each group of query heads.
    fn reduce_kv<B: Backend>(&self, t: FloatTensor<B>) -> FloatTensor<B> {
        let g = self.group();
        if g == 1 {
            return t;
        }
        let (b, kv, s, d) = (self.b, self.kv_heads, self.s, self.head_dim);
        let t = B::float_sum_dim(reshape::<B>(t, &[b, kv, g, s, d]), 2);
        reshape::<B>(t, &[b, kv, s, d])
    }
}

/// True above the diagonal (key after query), `[B, H, S, S]`.
fn causal_mask<B: Backend>(b: usize, h: usize, s: usize, device: &B::Device) -> BoolTensor<B> {
    let mask: Vec<bool> = (0..s * s).map(|i| i % s > i / s).collect();
    let m = bool_const::<B>(mask, &[1, 1, s, s], device);
    B::bool_expand(m, shape(&[b, h, s, s]))
}

/// The attention dropout keep-mask: the op's seed, on its own stream.
fn attention_keep<B: Backend>(seed: u64, d: &[usize; 4], p: f64, device: &B::Device) -> BoolTensor<B> {
    let n = d.iter().product();
    bool_const::<B>(util::keep_mask(util::derive_seed(seed, util::TAG_ATTENTION), n, p), d, device)
}

/// Rotates (`sign = 1`) or rotates back (`sign = −1`) the first `rotary_dim` dimensions of
/// each head of `x [B, S, E]`.
fn rope<B: Backend>(
    op: &NetOp,
    x: FloatTensor<B>,
    heads: usize,
    rotary_dim: usize,
    sign: f64,
    device: &B::Device,
) -> Result<FloatTensor<B>, RuntimeError> {
    let d = dims(&x);
    if d.len() != 3 {
        return Err(unsupported(op, &format!("rope expects a [B, S, E] input, got {d:?}")));
    }
    if rotary_dim == 0 {
        return Ok(x);
    }
    let (b, s, e) = (d[0], d[1], d[2]);
    let hd = e / heads;
    let half = rotary_dim / 2;
    let (cos, sin) = rope_tables::<B>(s, half, sign, x.dtype(), device);
    let full = [b, s, heads, half];
    let cos = B::float_expand(cos, shape(&full));
    let sin = B::float_expand(sin, shape(&full));
    let x4 = reshape::<B>(x, &[b, s, heads, hd]);
    let x1 = narrow::<B>(x4.clone(), 3, 0, half);
    let x2 = narrow::<B>(x4.clone(), 3, half, half);
    let o1 = B::float_sub(B::float_mul(x1.clone(), cos.clone()), B::float_mul(x2.clone(), sin.clone()));
    let o2 = B::float_add(B::float_mul(x2, cos), B::float_mul(x1, sin));
    let mut parts = vec![o1, o2];
    if rotary_dim < hd {
        parts.push(narrow::<B>(x4, 3, rotary_dim, hd - rotary_dim));
    }
    Ok(reshape::<B>(B::float_cat(parts, 3), &d))
}

/// `cos` and `sign·sin` of `pos · base^(−2i/rotary_dim)`, `[1, S, 1, rotary_dim/2]`.
fn rope_tables<B: Backend>(
    s: usize,
    half: usize,
    sign: f64,
    dtype: DType,
    device: &B::Device,
) -> (FloatTensor<B>, FloatTensor<B>) {
    let rotary = (2 * half) as f64;
    let mut cos = Vec::with_capacity(s * half);
    let mut sin = Vec::with_capacity(s * half);
    for pos in 0..s {
        for i in 0..half {
            let theta = pos as f64 * ROPE_BASE.powf(-((2 * i) as f64) / rotary);
            cos.push(theta.cos() as f32);
            sin.push((sign * theta.sin()) as f32);
        }
    }
    let d = [1, s, 1, half];
    (float_const::<B>(cos, &d, dtype, device), float_const::<B>(sin, &d, dtype, device))
}
