//! Placeholder: being written.
use crate::{Dims, Network, ZooError};
/// Published count.
pub const TRANSFORMER_PARAMS: Option<(u64, &str)> = None;
/// Transformer.
pub fn transformer(_: &Dims) -> Result<Network, ZooError> { Err(ZooError::Device("todo".into())) }
