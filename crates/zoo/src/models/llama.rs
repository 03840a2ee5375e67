//! Placeholder: being written.
use crate::{Dims, Network, ZooError};
/// Llama-2-7B.
pub fn llama2_7b(_: &Dims) -> Result<Network, ZooError> { Err(ZooError::Device("todo".into())) }
/// Llama-2-13B.
pub fn llama2_13b(_: &Dims) -> Result<Network, ZooError> { Err(ZooError::Device("todo".into())) }
