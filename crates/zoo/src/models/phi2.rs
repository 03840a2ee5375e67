//! Phi-2 as Hugging Face's `PhiForCausalLM` builds `microsoft/phi-2`: a token embedding
//! (its dropout has p = 0 and is left out), decoder layers in which attention and the
//! MLP run in parallel on the same LayerNorm output and add to the residual
//! (`x + drop(attn(n)) + drop(mlp(n))`, `resid_pdrop` 0.1), a final LayerNorm and an
//! untied lm head with a bias. Attention has biased q, k, v and `dense` projections and
//! partial rotary embedding (`partial_rotary_factor` 0.4: 32 of each head's 80 dims);
//! attention dropout is 0. The MLP is `fc2(gelu_new(fc1(n)))`.
//!
//! Chain stages: the embedding is one stage, every decoder layer one stage, then the
//! final LayerNorm with the lm head; `--layers` sets the number of decoder layers.

use crate::ops::{Elem, OpKind};
use crate::{Dims, NetBuilder, Network, TensorId, ZooError};

const VOCAB: usize = 51200;
const WIDTH: usize = 2560;
const HEADS: usize = 32;
const INTER: usize = 10240;
/// `partial_rotary_factor` 0.4 of the head width 80.
const ROTARY_DIM: usize = 32;
/// `max_position_embeddings`.
pub(super) const MAX_SEQ: usize = 2048;
/// `resid_pdrop`.
const DROPOUT: f64 = 0.1;

/// One `PhiDecoderLayer`.
fn layer(b: &mut NetBuilder, pre: &str, x: TensorId) -> Result<TensorId, ZooError> {
    let linear = |out_features| OpKind::Linear { out_features, bias: true };
    let rope = OpKind::Rope { heads: HEADS, rotary_dim: ROTARY_DIM };
    let n = b.op(&format!("{pre}.input_layernorm"), OpKind::LayerNorm { bias: true }, &[x])?;
    let q = b.op(&format!("{pre}.self_attn.q_proj"), linear(WIDTH), &[n])?;
    let k = b.op(&format!("{pre}.self_attn.k_proj"), linear(WIDTH), &[n])?;
    let v = b.op(&format!("{pre}.self_attn.v_proj"), linear(WIDTH), &[n])?;
    let q = b.op(&format!("{pre}.self_attn.rope_q"), rope.clone(), &[q])?;
    let k = b.op(&format!("{pre}.self_attn.rope_k"), rope, &[k])?;
    let a = b.op(
        &format!("{pre}.self_attn"),
        OpKind::Attention { heads: HEADS, kv_heads: HEADS, causal: true, dropout: 0.0 },
        &[q, k, v],
    )?;
    let a = b.op(&format!("{pre}.self_attn.dense"), linear(WIDTH), &[a])?;
    let a = b.op(&format!("{pre}.resid_dropout_attn"), OpKind::Dropout { p: DROPOUT }, &[a])?;
    let m = b.op(&format!("{pre}.mlp.fc1"), linear(INTER), &[n])?;
    let m = b.op(&format!("{pre}.mlp.act"), OpKind::Gelu, &[m])?;
    let m = b.op(&format!("{pre}.mlp.fc2"), linear(WIDTH), &[m])?;
    let m = b.op(&format!("{pre}.resid_dropout_mlp"), OpKind::Dropout { p: DROPOUT }, &[m])?;
    let s = b.op(&format!("{pre}.add_1"), OpKind::Add, &[a, m])?;
    b.op(&format!("{pre}.add_2"), OpKind::Add, &[s, x])
}

/// Phi-2 (32 decoder layers by default).
pub fn phi2(d: &Dims) -> Result<Network, ZooError> {
    let mut b = NetBuilder::new("phi2", d.dtype);
    let tokens = b.input("tokens", vec![d.batch, d.seq], Elem::Int);
    let labels = b.input("labels", vec![d.batch, d.seq], Elem::Int);
    let mut h = b.op("embed_tokens", OpKind::Embedding { vocab: VOCAB, dim: WIDTH }, &[tokens])?;
    for i in 0..d.layers {
        b.next_stage();
        h = layer(&mut b, &format!("layers.{i}"), h)?;
    }
    b.next_stage();
    let h = b.op("final_layernorm", OpKind::LayerNorm { bias: true }, &[h])?;
    let logits = b.op("lm_head", OpKind::Linear { out_features: VOCAB, bias: true }, &[h])?;
    b.loss("loss", OpKind::CrossEntropy, &[logits, labels])?;
    b.finish()
}

#[cfg(test)]
mod tests {
    use crate::{build, ModelOptions, ZooError};

    fn tiny(layers: Option<usize>) -> crate::Model {
        build("phi2", &ModelOptions { batch: Some(1), seq: Some(8), layers, ..Default::default() }).unwrap()
    }

    #[test]
    fn published_parameter_count() {
        let m = tiny(None);
        assert_eq!(m.network.param_count(), m.spec.published_params.unwrap().0);
        assert_eq!(m.network.param_count(), 2_779_683_840);
    }

    #[test]
    fn chain_lengths() {
        // Embedding + one stage per decoder layer + final norm/lm head.
        assert_eq!(tiny(None).chain.len(), 1 + 32 + 1);
        assert_eq!(tiny(Some(5)).chain.len(), 1 + 5 + 1);
    }

    #[test]
    fn sequence_beyond_the_context_is_an_error() {
        let err = build("phi2", &ModelOptions { batch: Some(1), seq: Some(2049), ..Default::default() }).unwrap_err();
        assert!(matches!(err, ZooError::BadOption { option: "seq", .. }), "{err}");
    }
}
