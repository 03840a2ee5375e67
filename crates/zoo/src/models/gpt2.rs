//! GPT-2 as Hugging Face's `GPT2LMHeadModel` builds it (Radford et al. 2019): learned
//! token and position embeddings, pre-LN blocks of packed causal self-attention and a
//! GELU (tanh) MLP, a final LayerNorm, and an lm head tied to the token embedding.
//! Dropout is 0.1 everywhere (`embd_pdrop`, `attn_pdrop`, `resid_pdrop`).
//!
//! Chain stages: the embeddings (token + position + dropout) are one stage, every block
//! is one stage, then `ln_f` with the lm head; `--layers` sets the number of blocks.

use crate::ops::{Elem, OpKind};
use crate::{Dims, NetBuilder, Network, TensorId, ZooError};

/// GPT-2's vocabulary.
const VOCAB: usize = 50257;
/// GPT-2's `n_positions`: the longest sequence it embeds.
pub(super) const POSITIONS: usize = 1024;
/// `embd_pdrop`, `attn_pdrop`, `resid_pdrop`.
const DROPOUT: f64 = 0.1;

/// One GPT-2 block (`GPT2Block`): `x + drop(attn(ln_1(x)))`, then `h + drop(mlp(ln_2(h)))`.
fn block(b: &mut NetBuilder, pre: &str, x: TensorId, width: usize, heads: usize) -> Result<TensorId, ZooError> {
    let h = b.op(&format!("{pre}.ln_1"), OpKind::LayerNorm { bias: true }, &[x])?;
    let qkv = b.op(&format!("{pre}.attn.c_attn"), OpKind::Linear { out_features: 3 * width, bias: true }, &[h])?;
    let a = b.op(
        &format!("{pre}.attn"),
        OpKind::Attention { heads, kv_heads: heads, causal: true, dropout: DROPOUT },
        &[qkv],
    )?;
    let a = b.op(&format!("{pre}.attn.c_proj"), OpKind::Linear { out_features: width, bias: true }, &[a])?;
    let a = b.op(&format!("{pre}.attn.resid_dropout"), OpKind::Dropout { p: DROPOUT }, &[a])?;
    let x = b.op(&format!("{pre}.add_1"), OpKind::Add, &[a, x])?;
    let h = b.op(&format!("{pre}.ln_2"), OpKind::LayerNorm { bias: true }, &[x])?;
    let h = b.op(&format!("{pre}.mlp.c_fc"), OpKind::Linear { out_features: 4 * width, bias: true }, &[h])?;
    let h = b.op(&format!("{pre}.mlp.act"), OpKind::Gelu, &[h])?;
    let h = b.op(&format!("{pre}.mlp.c_proj"), OpKind::Linear { out_features: width, bias: true }, &[h])?;
    let h = b.op(&format!("{pre}.mlp.dropout"), OpKind::Dropout { p: DROPOUT }, &[h])?;
    b.op(&format!("{pre}.add_2"), OpKind::Add, &[h, x])
}

/// The vocabulary of the `gpt` model of any size.
const SMALL_VOCAB: usize = 1024;

/// A GPT-2 of `d.layers` blocks, `d.width` wide with `d.heads` heads, on a 1,024-token
/// vocabulary: small enough to train for real on a CPU.
pub fn custom(d: &Dims) -> Result<Network, ZooError> {
    gpt2_vocab("gpt", d, d.width, d.heads, SMALL_VOCAB)
}

/// A GPT-2 of `d.layers` blocks of the given width and heads.
fn gpt2(name: &str, d: &Dims, width: usize, heads: usize) -> Result<Network, ZooError> {
    gpt2_vocab(name, d, width, heads, VOCAB)
}

fn gpt2_vocab(name: &str, d: &Dims, width: usize, heads: usize, vocab: usize) -> Result<Network, ZooError> {
    let mut b = NetBuilder::new(name, d.dtype);
    let tokens = b.input("tokens", vec![d.batch, d.seq], Elem::Int);
    let positions = b.input("positions", vec![d.seq], Elem::Int);
    let labels = b.input("labels", vec![d.batch, d.seq], Elem::Int);
    let tok = b.op("wte", OpKind::Embedding { vocab, dim: width }, &[tokens])?;
    let pos = b.op("wpe", OpKind::Embedding { vocab: POSITIONS, dim: width }, &[positions])?;
    let h = b.op("embed.add", OpKind::Add, &[tok, pos])?;
    let mut h = b.op("drop", OpKind::Dropout { p: DROPOUT }, &[h])?;
    for i in 0..d.layers {
        b.next_stage();
        h = block(&mut b, &format!("h.{i}"), h, width, heads)?;
    }
    b.next_stage();
    let h = b.op("ln_f", OpKind::LayerNorm { bias: true }, &[h])?;
    let wte = b.params_of(tok);
    let logits = b.op_tied("lm_head", OpKind::Linear { out_features: vocab, bias: false }, &[h], &wte)?;
    b.loss("loss", OpKind::CrossEntropy, &[logits, labels])?;
    b.finish()
}

/// GPT-2 small: 768 wide, 12 heads (12 blocks by default).
pub fn small(d: &Dims) -> Result<Network, ZooError> {
    gpt2("gpt2-small", d, 768, 12)
}
/// GPT-2 medium: 1024 wide, 16 heads (24 blocks by default).
pub fn medium(d: &Dims) -> Result<Network, ZooError> {
    gpt2("gpt2-medium", d, 1024, 16)
}
/// GPT-2 large: 1280 wide, 20 heads (36 blocks by default).
pub fn large(d: &Dims) -> Result<Network, ZooError> {
    gpt2("gpt2-large", d, 1280, 20)
}
/// GPT-2 xl: 1600 wide, 25 heads (48 blocks by default).
pub fn xl(d: &Dims) -> Result<Network, ZooError> {
    gpt2("gpt2-xl", d, 1600, 25)
}

#[cfg(test)]
mod tests;
