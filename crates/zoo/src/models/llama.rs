//! Llama-2 as Hugging Face's `LlamaForCausalLM` builds it (Touvron et al. 2023): a token
//! embedding, pre-norm decoder layers of RMSNorm, causal self-attention with separate
//! bias-free q, k, v projections and rotary position embedding on q and k (on the whole
//! head width), and a SwiGLU MLP `down(silu(gate(x)) * up(x))`; a final RMSNorm and an
//! untied lm head. Llama-2 trains without dropout. Both sizes use full multi-head
//! attention (grouped-query attention is only in the 70B model).
//!
//! Chain stages: the embedding is one stage, every decoder layer one stage, then the
//! final norm with the lm head; `--layers` sets the number of decoder layers.

use crate::ops::{Elem, OpKind};
use crate::{Dims, NetBuilder, Network, TensorId, ZooError};

/// Llama-2's vocabulary.
const VOCAB: usize = 32000;
/// Llama-2's `max_position_embeddings`.
pub(super) const MAX_SEQ: usize = 4096;

/// One `LlamaDecoderLayer`: `x + o(attn(rope(q), rope(k), v))` on `norm(x)`, then
/// `h + down(silu(gate(n)) * up(n))` on `n = norm(h)`.
fn layer(
    b: &mut NetBuilder,
    pre: &str,
    x: TensorId,
    width: usize,
    heads: usize,
    inter: usize,
) -> Result<TensorId, ZooError> {
    let linear = |out_features| OpKind::Linear { out_features, bias: false };
    let rope = OpKind::Rope { heads, rotary_dim: width / heads };
    let h = b.op(&format!("{pre}.input_layernorm"), OpKind::RmsNorm, &[x])?;
    let q = b.op(&format!("{pre}.self_attn.q_proj"), linear(width), &[h])?;
    let k = b.op(&format!("{pre}.self_attn.k_proj"), linear(width), &[h])?;
    let v = b.op(&format!("{pre}.self_attn.v_proj"), linear(width), &[h])?;
    let q = b.op(&format!("{pre}.self_attn.rope_q"), rope.clone(), &[q])?;
    let k = b.op(&format!("{pre}.self_attn.rope_k"), rope, &[k])?;
    let a = b.op(
        &format!("{pre}.self_attn"),
        OpKind::Attention { heads, kv_heads: heads, causal: true, dropout: 0.0 },
        &[q, k, v],
    )?;
    let a = b.op(&format!("{pre}.self_attn.o_proj"), linear(width), &[a])?;
    let x = b.op(&format!("{pre}.add_1"), OpKind::Add, &[x, a])?;
    let h = b.op(&format!("{pre}.post_attention_layernorm"), OpKind::RmsNorm, &[x])?;
    let g = b.op(&format!("{pre}.mlp.gate_proj"), linear(inter), &[h])?;
    let u = b.op(&format!("{pre}.mlp.up_proj"), linear(inter), &[h])?;
    let g = b.op(&format!("{pre}.mlp.act_fn"), OpKind::Silu, &[g])?;
    let m = b.op(&format!("{pre}.mlp.mul"), OpKind::Mul, &[g, u])?;
    let m = b.op(&format!("{pre}.mlp.down_proj"), linear(width), &[m])?;
    b.op(&format!("{pre}.add_2"), OpKind::Add, &[x, m])
}

/// A Llama-2 of `d.layers` decoder layers.
fn llama(name: &str, d: &Dims, width: usize, heads: usize, inter: usize) -> Result<Network, ZooError> {
    let mut b = NetBuilder::new(name, d.dtype);
    let tokens = b.input("tokens", vec![d.batch, d.seq], Elem::Int);
    let labels = b.input("labels", vec![d.batch, d.seq], Elem::Int);
    let mut h = b.op("embed_tokens", OpKind::Embedding { vocab: VOCAB, dim: width }, &[tokens])?;
    for i in 0..d.layers {
        b.next_stage();
        h = layer(&mut b, &format!("layers.{i}"), h, width, heads, inter)?;
    }
    b.next_stage();
    let h = b.op("norm", OpKind::RmsNorm, &[h])?;
    let logits = b.op("lm_head", OpKind::Linear { out_features: VOCAB, bias: false }, &[h])?;
    b.loss("loss", OpKind::CrossEntropy, &[logits, labels])?;
    b.finish()
}

/// Llama-2-7B: 4096 wide, 32 heads, MLP 11008 (32 layers by default).
pub fn llama2_7b(d: &Dims) -> Result<Network, ZooError> {
    llama("llama2-7b", d, 4096, 32, 11008)
}
/// Llama-2-13B: 5120 wide, 40 heads, MLP 13824 (40 layers by default).
pub fn llama2_13b(d: &Dims) -> Result<Network, ZooError> {
    llama("llama2-13b", d, 5120, 40, 13824)
}

#[cfg(test)]
mod tests;
