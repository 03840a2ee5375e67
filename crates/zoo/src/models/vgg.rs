//! VGG-16 as torchvision builds it (configuration "D", no batch norm): thirteen 3×3
//! convolutions with ReLU in five groups, each group closed by a 2×2 max-pool, an
//! adaptive average pool to 7×7 and the three-layer classifier with dropout.
//!
//! Chain stages follow torchvision's modules, with each weighted layer and the
//! activation (and dropout) right after it kept together: 13 conv+ReLU stages, 5
//! max-pool stages, the average pool, and the three classifier layers: 22 stages.
//! Images must be at least 32×32 (five halvings).

use crate::ops::{Elem, OpKind};
use crate::{Dims, NetBuilder, Network, ZooError};

/// Channels per convolution, `0` for a max-pool (torchvision's `cfgs["D"]`).
const CFG_D: [usize; 18] = [64, 64, 0, 128, 128, 0, 256, 256, 256, 0, 512, 512, 512, 0, 512, 512, 512, 0];

/// VGG-16.
pub fn vgg16(d: &Dims) -> Result<Network, ZooError> {
    let mut b = NetBuilder::new("vgg16", d.dtype);
    let x = b.input("images", vec![d.batch, 3, d.image, d.image], Elem::Float);
    let labels = b.input("labels", vec![d.batch], Elem::Int);
    let mut h = x;
    // torchvision numbers the modules of `features` in order (conv, relu, ..., pool).
    let mut index = 0;
    for &v in &CFG_D {
        b.next_stage();
        if v == 0 {
            h = b.op(&format!("features.{index}"), OpKind::MaxPool2d { kernel: 2, stride: 2, padding: 0 }, &[h])?;
            index += 1;
        } else {
            let conv = OpKind::Conv2d { out_channels: v, kernel: 3, stride: 1, padding: 1, groups: 1, bias: true };
            h = b.op(&format!("features.{index}"), conv, &[h])?;
            h = b.op(&format!("features.{}", index + 1), OpKind::Relu, &[h])?;
            index += 2;
        }
    }
    b.next_stage();
    let h = b.op("avgpool", OpKind::AdaptiveAvgPool2d { out: 7 }, &[h])?;
    let mut h = b.op("flatten", OpKind::Reshape { shape: vec![d.batch, 512 * 7 * 7] }, &[h])?;
    for (i, out) in [(0, 4096), (3, 4096)] {
        b.next_stage();
        h = b.op(&format!("classifier.{i}"), OpKind::Linear { out_features: out, bias: true }, &[h])?;
        h = b.op(&format!("classifier.{}", i + 1), OpKind::Relu, &[h])?;
        h = b.op(&format!("classifier.{}", i + 2), OpKind::Dropout { p: 0.5 }, &[h])?;
    }
    b.next_stage();
    let logits = b.op("classifier.6", OpKind::Linear { out_features: 1000, bias: true }, &[h])?;
    b.loss("loss", OpKind::CrossEntropy, &[logits, labels])?;
    b.finish()
}

#[cfg(test)]
mod tests {
    use crate::{build, ModelOptions, ZooError};

    #[test]
    fn published_parameter_count_and_chain() {
        let m = build("vgg16", &ModelOptions { batch: Some(2), image: Some(32), ..Default::default() }).unwrap();
        assert_eq!(m.network.param_count(), 138_357_544);
        assert_eq!(m.network.param_count(), m.spec.published_params.unwrap().0);
        // 13 conv+ReLU, 5 max-pools, the average pool, 3 classifier layers.
        assert_eq!(m.chain.len(), 13 + 5 + 1 + 3);
    }

    #[test]
    fn builds_at_default_sizes() {
        let m = build("vgg16", &ModelOptions::default()).unwrap();
        assert_eq!(m.dims.image, 224);
        let last_pool = m.network.ops.iter().rfind(|o| o.name == "features.30").unwrap();
        assert_eq!(m.network.tensors[last_pool.output].shape, vec![32, 512, 7, 7]);
    }

    #[test]
    fn too_small_images_are_an_error() {
        let e = build("vgg16", &ModelOptions { batch: Some(1), image: Some(16), ..Default::default() }).unwrap_err();
        assert!(matches!(e, ZooError::Shape { op: "max_pool2d", .. }), "{e}");
    }
}
