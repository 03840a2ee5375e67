//! Placeholder: being written.
use crate::{Dims, Network, ZooError};
/// DenseNet-121.
pub fn densenet121(_: &Dims) -> Result<Network, ZooError> { Err(ZooError::Device("todo".into())) }
/// DenseNet-161.
pub fn densenet161(_: &Dims) -> Result<Network, ZooError> { Err(ZooError::Device("todo".into())) }
/// DenseNet-169.
pub fn densenet169(_: &Dims) -> Result<Network, ZooError> { Err(ZooError::Device("todo".into())) }
/// DenseNet-201.
pub fn densenet201(_: &Dims) -> Result<Network, ZooError> { Err(ZooError::Device("todo".into())) }
