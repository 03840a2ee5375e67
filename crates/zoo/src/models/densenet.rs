//! DenseNets as torchvision builds them (Huang et al. 2017, DenseNet-BC): a 7×7 stem,
//! four dense blocks joined by transitions (BN, ReLU, 1×1 convolution halving the
//! channels, 2×2 average pool), a final BN and ReLU, global average pool and classifier.
//! A dense layer is BN, ReLU, 1×1 convolution to `4 × growth` channels, BN, ReLU, 3×3
//! convolution to `growth` channels (no dropout: torchvision's `drop_rate` is 0).
//!
//! torchvision's dense layer concatenates the list of all earlier features at its start.
//! Here each layer ends by concatenating its new features onto the running tensor, as
//! memory-efficient DenseNets and Rotor's sequential rewrite do, so that one tensor
//! crosses each cut. The next layer's batch norm saves that concatenation, as
//! torchvision's saves its own.
//!
//! Chain stages follow torchvision's modules: the stem's conv, norm, ReLU and max-pool
//! (4 stages), every dense layer and every transition (one stage each), the final norm,
//! the ReLU with the average pool, and the classifier. DenseNet-121 thus has 68 stages.
//! Images must be at least 32×32 (five halvings).

use crate::ops::{Elem, OpKind};
use crate::{Dims, NetBuilder, Network, TensorId, ZooError};

/// Size of the bottleneck: the 1×1 convolution outputs `BN_SIZE × growth` channels.
const BN_SIZE: usize = 4;

fn conv(b: &mut NetBuilder, name: &str, x: TensorId, out: usize, kernel: usize) -> Result<TensorId, ZooError> {
    b.op(
        name,
        OpKind::Conv2d { out_channels: out, kernel, stride: 1, padding: kernel / 2, groups: 1, bias: false },
        &[x],
    )
}

/// BN → ReLU → convolution, named as torchvision's `norm{k}`, `relu{k}`, `conv{k}`.
fn bn_relu_conv(
    b: &mut NetBuilder,
    pre: &str,
    k: &str,
    x: TensorId,
    out: usize,
    kernel: usize,
) -> Result<TensorId, ZooError> {
    let h = b.op(&format!("{pre}.norm{k}"), OpKind::BatchNorm2d, &[x])?;
    let h = b.op(&format!("{pre}.relu{k}"), OpKind::Relu, &[h])?;
    conv(b, &format!("{pre}.conv{k}"), h, out, kernel)
}

/// A DenseNet with the given growth rate, blocks and stem width.
fn densenet(name: &str, d: &Dims, growth: usize, blocks: &[usize], init: usize) -> Result<Network, ZooError> {
    let mut b = NetBuilder::new(name, d.dtype);
    let x = b.input("images", vec![d.batch, 3, d.image, d.image], Elem::Float);
    let labels = b.input("labels", vec![d.batch], Elem::Int);
    let h = b.op(
        "features.conv0",
        OpKind::Conv2d { out_channels: init, kernel: 7, stride: 2, padding: 3, groups: 1, bias: false },
        &[x],
    )?;
    b.next_stage();
    let h = b.op("features.norm0", OpKind::BatchNorm2d, &[h])?;
    b.next_stage();
    let h = b.op("features.relu0", OpKind::Relu, &[h])?;
    b.next_stage();
    let mut feat = b.op("features.pool0", OpKind::MaxPool2d { kernel: 3, stride: 2, padding: 1 }, &[h])?;
    let mut channels = init;
    for (bi, &layers) in blocks.iter().enumerate() {
        for li in 0..layers {
            b.next_stage();
            let pre = format!("features.denseblock{}.denselayer{}", bi + 1, li + 1);
            let h = bn_relu_conv(&mut b, &pre, "1", feat, BN_SIZE * growth, 1)?;
            let new = bn_relu_conv(&mut b, &pre, "2", h, growth, 3)?;
            feat = b.op(&format!("{pre}.concat"), OpKind::Concat { dim: 1 }, &[feat, new])?;
            channels += growth;
        }
        if bi + 1 < blocks.len() {
            b.next_stage();
            let pre = format!("features.transition{}", bi + 1);
            let h = bn_relu_conv(&mut b, &pre, "", feat, channels / 2, 1)?;
            channels /= 2;
            feat = b.op(&format!("{pre}.pool"), OpKind::AvgPool2d { kernel: 2, stride: 2, padding: 0 }, &[h])?;
        }
    }
    b.next_stage();
    let h = b.op("features.norm5", OpKind::BatchNorm2d, &[feat])?;
    b.next_stage();
    let h = b.op("relu", OpKind::Relu, &[h])?;
    let h = b.op("avgpool", OpKind::AdaptiveAvgPool2d { out: 1 }, &[h])?;
    let h = b.op("flatten", OpKind::Reshape { shape: vec![d.batch, channels] }, &[h])?;
    b.next_stage();
    let logits = b.op("classifier", OpKind::Linear { out_features: 1000, bias: true }, &[h])?;
    b.loss("loss", OpKind::CrossEntropy, &[logits, labels])?;
    b.finish()
}

/// DenseNet-121: growth 32, blocks (6, 12, 24, 16), stem 64.
pub fn densenet121(d: &Dims) -> Result<Network, ZooError> {
    densenet("densenet121", d, 32, &[6, 12, 24, 16], 64)
}
/// DenseNet-161: growth 48, blocks (6, 12, 36, 24), stem 96.
pub fn densenet161(d: &Dims) -> Result<Network, ZooError> {
    densenet("densenet161", d, 48, &[6, 12, 36, 24], 96)
}
/// DenseNet-169: growth 32, blocks (6, 12, 32, 32), stem 64.
pub fn densenet169(d: &Dims) -> Result<Network, ZooError> {
    densenet("densenet169", d, 32, &[6, 12, 32, 32], 64)
}
/// DenseNet-201: growth 32, blocks (6, 12, 48, 32), stem 64.
pub fn densenet201(d: &Dims) -> Result<Network, ZooError> {
    densenet("densenet201", d, 32, &[6, 12, 48, 32], 64)
}

#[cfg(test)]
mod tests {
    use crate::{build, ModelOptions, ZooError};

    const ALL: [(&str, usize); 4] =
        [("densenet121", 58), ("densenet161", 78), ("densenet169", 82), ("densenet201", 98)];

    fn small(name: &str) -> crate::Model {
        build(name, &ModelOptions { batch: Some(2), image: Some(32), ..Default::default() }).unwrap()
    }

    #[test]
    fn published_parameter_counts_and_chain_lengths() {
        for (name, layers) in ALL {
            let m = small(name);
            assert_eq!(m.network.param_count(), m.spec.published_params.unwrap().0, "{name}");
            // Stem (4 stages) + dense layers + 3 transitions + norm5 + relu/avgpool + classifier.
            assert_eq!(m.chain.len(), 4 + layers + 3 + 3, "{name}");
        }
    }

    #[test]
    fn builds_at_default_sizes() {
        let m = build("densenet121", &ModelOptions { batch: Some(1), ..Default::default() }).unwrap();
        let norm5 = m.network.ops.iter().find(|o| o.name == "features.norm5").unwrap();
        assert_eq!(m.network.tensors[norm5.output].shape, vec![1, 1024, 7, 7]);
        // One tensor crosses each cut inside a dense block: the running concatenation.
        let layer = m.network.ops.iter().find(|o| o.name == "features.denseblock1.denselayer6.concat").unwrap();
        assert_eq!(m.network.tensors[layer.output].shape, vec![1, 64 + 6 * 32, 56, 56]);
        let cut = m.network.ops[m.network.tensors[layer.output].producer.unwrap()].stage + 1;
        assert_eq!(m.chain.x[cut], ((64 + 6 * 32) * 56 * 56 * 4) as u64);
        for name in ["densenet161", "densenet169", "densenet201"] {
            build(name, &ModelOptions { batch: Some(1), ..Default::default() }).unwrap();
        }
    }

    #[test]
    fn too_small_images_are_an_error() {
        let e =
            build("densenet121", &ModelOptions { batch: Some(1), image: Some(16), ..Default::default() }).unwrap_err();
        assert!(matches!(e, ZooError::Shape { .. }), "{e}");
    }
}
