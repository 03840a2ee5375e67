//! Placeholder: being written.
use crate::{Dims, Network, ZooError};
/// GPT-2 small.
pub fn small(_: &Dims) -> Result<Network, ZooError> { Err(ZooError::Device("todo".into())) }
/// GPT-2 medium.
pub fn medium(_: &Dims) -> Result<Network, ZooError> { Err(ZooError::Device("todo".into())) }
/// GPT-2 large.
pub fn large(_: &Dims) -> Result<Network, ZooError> { Err(ZooError::Device("todo".into())) }
/// GPT-2 xl.
pub fn xl(_: &Dims) -> Result<Network, ZooError> { Err(ZooError::Device("todo".into())) }
