//! Fixtures for pebble's tests, in one place instead of a copy per crate: a deterministic
//! RNG ([`Rng`]), random chains ([`ChainSpec`], [`random_chain`]), hand-made chains and
//! training graphs whose figures the tests work out by hand ([`hand_chain`],
//! [`tiny_graph`], [`residual_graph`], ...), a builder for more ([`GraphBuilder`]), small
//! zoo models ([`gpt`]), PyTorch models as `pebble.torch` captured them ([`captured`]) and
//! proptest strategies ([`strategies`]).
//!
//! A dev-dependency only (`publish = false`): it knows chains and graphs
//! (`pebble-graph`) and the zoo, never solvers, schedules or the simulator, so that any
//! planner crate can use it in its own unit tests without a second copy of itself.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod captured;
mod chains;
mod graphs;
mod rng;
pub mod strategies;

pub use chains::{hand_chain, random_chain, random_chains, small_chain, weighty_chain, ChainSpec, Times};
pub use graphs::{
    chain_graph, data, gpt, gpt_options, least_graph_memory, node, random_graph, residual_graph, siamese, tiny_graph,
    GraphBuilder, GraphSpec, Layer,
};
pub use rng::Rng;
