//! Placeholder: being written.
use crate::{Dims, Network, ZooError};
/// Published count.
pub const INCEPTION_V3_PARAMS: Option<(u64, &str)> = None;
/// Inception-v3.
pub fn inception_v3(_: &Dims) -> Result<Network, ZooError> { Err(ZooError::Device("todo".into())) }
