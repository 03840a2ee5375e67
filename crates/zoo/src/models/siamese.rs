//! Placeholder: being written.
use crate::{Dims, Network, ZooError};
/// Siamese.
pub fn siamese(_: &Dims) -> Result<Network, ZooError> { Err(ZooError::Device("todo".into())) }
