//! The intermediate representation every pebble planner works on.
//!
//! A training step has two views:
//!
//! * [`Chain`]: rotor's format (`ftime, btime, x, xbar, ftmp, btmp`), a sequence of
//!   stages, each with one forward and one backward. Rotor, Revolve and the
//!   offloading DPs plan on it. See Shilova's thesis, Ch. 2.
//! * [`TrainingGraph`]: the bipartite forward+backward data-flow graph of Zhao's
//!   thesis, Ch. 1, with compute nodes and data nodes. Checkmate, Rockmate and
//!   HiRemate plan on it.
//!
//! A [`Partition`](partition) of a training graph into blocks turns it into a chain.
//! Sizes are `u64` bytes (or plain units for hand-written chains); times are `f64`
//! seconds (or plain units). Nothing here knows about solvers, schedules or Burn.
//!
//! ```
//! use pebble_graph::Chain;
//! let chain = Chain::homogeneous(3, 1.0, 1.0, 1);
//! assert_eq!(chain.len(), 3);
//! assert_eq!(chain.x.len(), 4);
//! ```
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod chain;
pub mod cut;
mod error;
pub mod hpartition;
mod layers;
pub mod partition;
mod training;
pub mod units;

pub use chain::{Chain, MAX_SIZE, MAX_TIME};
pub use error::GraphError;
pub use hpartition::{h_partition, identical_clusters, Cluster, HPartitionConfig, Hierarchy, Part};
pub use layers::Layers;
pub use partition::Retention;
pub use training::{ComputeId, ComputeKind, ComputeNode, DataId, DataKind, DataNode, TrainingGraph};
