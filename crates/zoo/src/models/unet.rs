//! Placeholder: being written.
use crate::{Dims, Network, ZooError};
/// Published count.
pub const UNET_PARAMS: Option<(u64, &str)> = None;
/// U-Net.
pub fn unet(_: &Dims) -> Result<Network, ZooError> { Err(ZooError::Device("todo".into())) }
