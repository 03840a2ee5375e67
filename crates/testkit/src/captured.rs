//! Training graphs of PyTorch models as `pebble.torch` captured them on the CPU (op times
//! profiled there), for the planner crates' tests without PyTorch.

use pebble_graph::TrainingGraph;

/// `transformers`' `GPT2LMHeadModel` (2 layers of width 64, 2 heads, 4 × 32 tokens): 73
/// compute nodes; `add_1` (the attention mask's) makes two activations; store-all's peak
/// is 2,696,192 bytes; parameter gradients made by the backward.
pub fn hf_gpt2() -> TrainingGraph {
    TrainingGraph::from_json(include_str!("../data/hf-gpt2-captured.json")).expect("the GPT-2 capture")
}

/// The Python tests' U-Net (`crates/python/tests/conftest.py`: two levels down and up,
/// skip connections concatenated, BatchNorm in training mode) on 2 images of 32²: 63
/// compute nodes; store-all's peak is 1,185,528 bytes.
pub fn unet() -> TrainingGraph {
    TrainingGraph::from_json(include_str!("../data/unet-captured.json")).expect("the U-Net capture")
}
