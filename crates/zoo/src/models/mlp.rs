//! A small multi-layer perceptron, one block per layer.

use crate::ops::{Elem, OpKind};
use crate::{Dims, NetBuilder, Network, ZooError};

/// `--layers` linear layers of `--width` (1024 by default) on 784 inputs, ReLU between,
/// 10 classes.
pub fn mlp(d: &Dims) -> Result<Network, ZooError> {
    let mut b = NetBuilder::new("mlp", d.dtype);
    let mut h = b.input("x", vec![d.batch, 784], Elem::Float);
    let y = b.input("labels", vec![d.batch], Elem::Int);
    for i in 0..d.layers {
        b.next_stage();
        let last = i + 1 == d.layers;
        h = b.op(
            &format!("fc{i}"),
            OpKind::Linear { out_features: if last { 10 } else { d.width }, bias: true },
            &[h],
        )?;
        if !last {
            h = b.op(&format!("relu{i}"), OpKind::Relu, &[h])?;
        }
    }
    b.loss("loss", OpKind::CrossEntropy, &[h, y])?;
    b.finish()
}
