//! Placeholder: being written.
use crate::{Dims, Network, ZooError};
/// Phi-2.
pub fn phi2(_: &Dims) -> Result<Network, ZooError> { Err(ZooError::Device("todo".into())) }
