//! Placeholder: being written.
use crate::{Dims, Network, ZooError};
/// VGG-16.
pub fn vgg16(_: &Dims) -> Result<Network, ZooError> { Err(ZooError::Device("todo".into())) }
