use crate::{build, ModelOptions, ZooError};

fn tiny(name: &str, layers: Option<usize>) -> crate::Model {
    build(name, &ModelOptions { batch: Some(1), seq: Some(8), layers, ..Default::default() }).unwrap()
}

#[test]
fn published_parameter_counts() {
    // Hugging Face's counts, the tied lm head counted once.
    for name in ["gpt2-small", "gpt2-medium", "gpt2-large", "gpt2-xl"] {
        let m = tiny(name, None);
        assert_eq!(m.network.param_count(), m.spec.published_params.unwrap().0, "{name}");
    }
}

#[test]
fn lm_head_is_tied_to_the_token_embedding() {
    let m = tiny("gpt2-small", Some(1));
    let op = |n: &str| m.network.ops.iter().find(|o| o.name == n).unwrap();
    assert_eq!(op("lm_head").params, op("wte").params);
}

#[test]
fn chain_lengths() {
    // Embeddings + one stage per block + ln_f/lm head.
    assert_eq!(tiny("gpt2-small", None).chain.len(), 1 + 12 + 1);
    assert_eq!(tiny("gpt2-xl", None).chain.len(), 1 + 48 + 1);
    assert_eq!(tiny("gpt2-small", Some(3)).chain.len(), 1 + 3 + 1);
}

#[test]
fn sequence_beyond_the_positions_is_an_error() {
    let err = build("gpt2-small", &ModelOptions { batch: Some(1), seq: Some(1025), ..Default::default() }).unwrap_err();
    assert!(matches!(err, ZooError::BadOption { option: "seq", .. }), "{err}");
    assert!(build(
        "gpt2-small",
        &ModelOptions { batch: Some(1), seq: Some(1024), layers: Some(1), ..Default::default() }
    )
    .is_ok());
}

/// Store-all activation memory of GPT-2 small, batch 4, seq 1024, fp32. By hand, with
/// T = B·S = 4096 tokens, E = 768, 12 heads, 4-byte floats and 1-byte masks, a block
/// saves its ln_1 stats (8T), ln_1 output (4TE), the packed qkv (12TE), the attention
/// weights (4·B·12·S²) and their dropout mask (B·12·S²), the attention output (4TE),
/// a dropout mask (TE), ln_2's input and stats (4TE + 8T), ln_2's output (4TE), the
/// GELU input and output (2·16TE), another mask (TE) and its output (4TE):
/// 66·TE + 16T + 5·12·B·S² bytes ≈ 459 MB. Twelve blocks ≈ 5.13 GiB; the embeddings
/// (mask and output, 5TE) and the head (ln_f stats and output, 4TE + 8T, and the
/// 4·T·50257 logits ≈ 0.77 GiB; ln_f's input is the last block's output) bring it to
/// ≈ 5.92 GiB. The bracket [5, 40] GiB is the plausibility check; the hand count is
/// the exact one.
#[test]
fn activation_memory_of_gpt2_small() {
    let m = build("gpt2-small", &ModelOptions { batch: Some(4), seq: Some(1024), ..Default::default() }).unwrap();
    let (t, e, s, b, h, v) = (4096u64, 768u64, 1024u64, 4u64, 12u64, 50257u64);
    let block = 66 * t * e + 16 * t + 5 * h * b * s * s;
    let expected = 12 * block + 5 * t * e + 4 * t * e + 8 * t + 4 * t * v;
    let saved: u64 = m.chain.xbar[1..].iter().sum();
    let gib = saved as f64 / (1u64 << 30) as f64;
    println!("gpt2-small b4 s1024 fp32: store-all saved = {saved} B = {gib:.3} GiB (hand count {expected} B)");
    assert!((5.0..40.0).contains(&gib), "{gib} GiB");
    assert_eq!(saved, expected);
}
