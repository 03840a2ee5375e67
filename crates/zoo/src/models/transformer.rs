//! The encoder-decoder Transformer of Vaswani et al. (2017), base size, laid out as
//! `torch.nn.Transformer(d_model=512, nhead=8, 6, 6, dim_feedforward=2048, dropout=0.1)`
//! with its default post-LN layers (`norm_first=False`), ReLU feed-forward and the final
//! LayerNorms of the encoder and decoder stacks, plus the paper's shared source/target
//! vocabulary: one 37000-token embedding read by both the source and the target tokens
//! and tied to the output projection (bias-free).
//!
//! Left out, as they allocate nothing that a backward saves and own no parameters: the
//! √d scaling of the embeddings and the sinusoidal positional encoding. The dropout the
//! paper applies to the sum of embedding and positions is kept (on the embedding).
//! Source and target both have `d.seq` tokens.
//!
//! Attention follows `nn.MultiheadAttention`: self-attention is one packed `in_proj`
//! (3E × E and 3E bias) into packed attention; cross-attention projects q from the
//! decoder and the packed k, v from the encoder output (the same `in_proj`, split: the
//! count is the same), then `out_proj`. Attention dropout is 0.1, as
//! `TransformerEncoderLayer` passes its dropout to its attention.
//!
//! Chain stages: the source embedding; each encoder layer; the encoder's final norm with
//! the target embedding; each decoder layer; the decoder's final norm with the output
//! projection: `2·layers + 3`. The encoder output feeds every decoder layer, so it
//! crosses every decoder cut (the chain view counts it at each; the graph view is exact).

use crate::ops::{Elem, OpKind};
use crate::{Dims, NetBuilder, Network, TensorId, ZooError};

/// `torch.nn.Transformer` base (44,140,544) plus the shared 37000 × 512 embedding
/// (18,944,000). The paper's "65M" is a rounded figure for a slightly different layout.
pub const TRANSFORMER_PARAMS: Option<(u64, &str)> =
    Some((63_084_544, "torch.nn.Transformer base + shared 37000-token embedding"));

const VOCAB: usize = 37000;
const WIDTH: usize = 512;
const HEADS: usize = 8;
const FFN: usize = 2048;
const DROPOUT: f64 = 0.1;

fn linear(out_features: usize) -> OpKind {
    OpKind::Linear { out_features, bias: true }
}

fn attention(causal: bool) -> OpKind {
    OpKind::Attention { heads: HEADS, kv_heads: HEADS, causal, dropout: DROPOUT }
}

/// `norm(x + dropout(y))`, the post-LN residual of every sublayer.
fn residual(b: &mut NetBuilder, pre: &str, k: usize, x: TensorId, y: TensorId) -> Result<TensorId, ZooError> {
    let y = b.op(&format!("{pre}.dropout{k}"), OpKind::Dropout { p: DROPOUT }, &[y])?;
    let s = b.op(&format!("{pre}.add{k}"), OpKind::Add, &[x, y])?;
    b.op(&format!("{pre}.norm{k}"), OpKind::LayerNorm { bias: true }, &[s])
}

/// Packed self-attention: `in_proj`, attention, `out_proj`.
fn self_attention(b: &mut NetBuilder, pre: &str, x: TensorId, causal: bool) -> Result<TensorId, ZooError> {
    let qkv = b.op(&format!("{pre}.in_proj"), linear(3 * WIDTH), &[x])?;
    let a = b.op(pre, attention(causal), &[qkv])?;
    b.op(&format!("{pre}.out_proj"), linear(WIDTH), &[a])
}

/// The feed-forward sublayer: `linear2(dropout(relu(linear1(x))))`.
fn feed_forward(b: &mut NetBuilder, pre: &str, x: TensorId) -> Result<TensorId, ZooError> {
    let h = b.op(&format!("{pre}.linear1"), linear(FFN), &[x])?;
    let h = b.op(&format!("{pre}.relu"), OpKind::Relu, &[h])?;
    let h = b.op(&format!("{pre}.dropout"), OpKind::Dropout { p: DROPOUT }, &[h])?;
    b.op(&format!("{pre}.linear2"), linear(WIDTH), &[h])
}

/// `TransformerEncoderLayer`, post-LN.
fn encoder_layer(b: &mut NetBuilder, pre: &str, x: TensorId) -> Result<TensorId, ZooError> {
    let a = self_attention(b, &format!("{pre}.self_attn"), x, false)?;
    let x = residual(b, pre, 1, x, a)?;
    let f = feed_forward(b, pre, x)?;
    residual(b, pre, 2, x, f)
}

/// `TransformerDecoderLayer`, post-LN: masked self-attention, cross-attention on the
/// encoder output `memory`, feed-forward.
fn decoder_layer(b: &mut NetBuilder, pre: &str, x: TensorId, memory: TensorId) -> Result<TensorId, ZooError> {
    let a = self_attention(b, &format!("{pre}.self_attn"), x, true)?;
    let x = residual(b, pre, 1, x, a)?;
    let ca = format!("{pre}.multihead_attn");
    let q = b.op(&format!("{ca}.q_proj"), linear(WIDTH), &[x])?;
    let kv = b.op(&format!("{ca}.kv_proj"), linear(2 * WIDTH), &[memory])?;
    let k = b.op(&format!("{ca}.k"), OpKind::Slice { start: 0, len: WIDTH }, &[kv])?;
    let v = b.op(&format!("{ca}.v"), OpKind::Slice { start: WIDTH, len: WIDTH }, &[kv])?;
    let a = b.op(&ca, attention(false), &[q, k, v])?;
    let a = b.op(&format!("{ca}.out_proj"), linear(WIDTH), &[a])?;
    let x = residual(b, pre, 2, x, a)?;
    let f = feed_forward(b, pre, x)?;
    residual(b, pre, 3, x, f)
}

/// The base Transformer with `d.layers` encoder and `d.layers` decoder layers.
pub fn transformer(d: &Dims) -> Result<Network, ZooError> {
    let mut b = NetBuilder::new("transformer", d.dtype);
    let src = b.input("src_tokens", vec![d.batch, d.seq], Elem::Int);
    let tgt = b.input("tgt_tokens", vec![d.batch, d.seq], Elem::Int);
    let labels = b.input("labels", vec![d.batch, d.seq], Elem::Int);
    let embedding = OpKind::Embedding { vocab: VOCAB, dim: WIDTH };
    let src_emb = b.op("src_embed", embedding.clone(), &[src])?;
    let shared = b.params_of(src_emb);
    let mut h = b.op("src_embed.dropout", OpKind::Dropout { p: DROPOUT }, &[src_emb])?;
    for i in 0..d.layers {
        b.next_stage();
        h = encoder_layer(&mut b, &format!("encoder.layers.{i}"), h)?;
    }
    b.next_stage();
    let memory = b.op("encoder.norm", OpKind::LayerNorm { bias: true }, &[h])?;
    let tgt_emb = b.op_tied("tgt_embed", embedding, &[tgt], &shared)?;
    let mut h = b.op("tgt_embed.dropout", OpKind::Dropout { p: DROPOUT }, &[tgt_emb])?;
    for i in 0..d.layers {
        b.next_stage();
        h = decoder_layer(&mut b, &format!("decoder.layers.{i}"), h, memory)?;
    }
    b.next_stage();
    let h = b.op("decoder.norm", OpKind::LayerNorm { bias: true }, &[h])?;
    let logits = b.op_tied("generator", OpKind::Linear { out_features: VOCAB, bias: false }, &[h], &shared)?;
    b.loss("loss", OpKind::CrossEntropy, &[logits, labels])?;
    b.finish()
}

#[cfg(test)]
mod tests {
    use crate::{build, ModelOptions};

    fn tiny(layers: Option<usize>) -> crate::Model {
        build("transformer", &ModelOptions { batch: Some(1), seq: Some(8), layers, ..Default::default() }).unwrap()
    }

    #[test]
    fn parameter_count() {
        // nn.MultiheadAttention(512, 8): in_proj 3·512² + 3·512, out_proj 512² + 512.
        let (e, f) = (512u64, 2048u64);
        let mha = 4 * e * e + 4 * e;
        let ffn = 2 * e * f + f + e;
        let norm = 2 * e;
        let encoder = 6 * (mha + ffn + 2 * norm) + norm;
        let decoder = 6 * (2 * mha + ffn + 3 * norm) + norm;
        assert_eq!(encoder + decoder, 44_140_544, "torch.nn.Transformer() base");
        let m = tiny(None);
        assert_eq!(m.network.param_count(), encoder + decoder + 37_000 * e);
        assert_eq!(m.network.param_count(), m.spec.published_params.unwrap().0);
    }

    #[test]
    fn embedding_is_shared_and_tied() {
        let m = tiny(Some(1));
        let op = |n: &str| m.network.ops.iter().find(|o| o.name == n).unwrap();
        assert_eq!(op("tgt_embed").params, op("src_embed").params);
        assert_eq!(op("generator").params, op("src_embed").params);
    }

    #[test]
    fn chain_lengths() {
        // Source embedding, encoder layers, encoder norm + target embedding, decoder
        // layers, decoder norm + output projection.
        assert_eq!(tiny(None).chain.len(), 2 * 6 + 3);
        assert_eq!(tiny(Some(2)).chain.len(), 2 * 2 + 3);
    }

    #[test]
    fn encoder_output_crosses_every_decoder_cut() {
        let m = build(
            "transformer",
            &ModelOptions { batch: Some(2), seq: Some(16), layers: Some(3), ..Default::default() },
        )
        .unwrap();
        let act = 2 * 16 * 512 * 4;
        // Cuts into decoder layers 1 and 2 carry the decoder stream and the memory.
        for i in [1 + 3 + 1 + 1, 1 + 3 + 1 + 2] {
            assert_eq!(m.chain.x[i], 2 * act, "x[{i}]");
        }
        // Cuts inside the encoder carry one stream.
        assert_eq!(m.chain.x[2], act);
    }
}
