//! ResNets as torchvision builds them (v1.5: the stride sits on the 3×3 convolution of
//! a bottleneck). Chain stages follow Rotor's `nn.Sequential` rewrite: the stem's conv,
//! batch-norm, ReLU and max-pool are one stage each, every residual block is one stage,
//! then the average pool and the classifier. ResNet-1001 thus has 339 stages.

use crate::ops::{Elem, OpKind};
use crate::{Dims, NetBuilder, Network, TensorId, ZooError};

/// ResNet-200 has no torchvision count; ours is checked against the formula in tests.
pub const RESNET200_PARAMS: Option<(u64, &str)> = None;
/// ResNet-1001 is a CIFAR design (He et al. 2016b); no published ImageNet count.
pub const RESNET1001_PARAMS: Option<(u64, &str)> = None;

#[derive(Clone, Copy, PartialEq)]
enum Block {
    Basic,
    Bottleneck,
}

fn conv(
    b: &mut NetBuilder,
    name: &str,
    x: TensorId,
    out: usize,
    kernel: usize,
    stride: usize,
) -> Result<TensorId, ZooError> {
    b.op(name, OpKind::Conv2d { out_channels: out, kernel, stride, padding: kernel / 2, groups: 1, bias: false }, &[x])
}

fn conv_bn(
    b: &mut NetBuilder,
    name: &str,
    x: TensorId,
    out: usize,
    kernel: usize,
    stride: usize,
    relu: bool,
) -> Result<TensorId, ZooError> {
    let h = conv(b, &format!("{name}.conv"), x, out, kernel, stride)?;
    let h = b.op(&format!("{name}.bn"), OpKind::BatchNorm2d, &[h])?;
    if relu {
        b.op(&format!("{name}.relu"), OpKind::Relu, &[h])
    } else {
        Ok(h)
    }
}

/// A ResNet with the given block type, blocks per layer and planes per layer.
fn resnet(name: &str, d: &Dims, block: Block, layers: &[usize], planes: &[usize]) -> Result<Network, ZooError> {
    resnet_with_stem(name, d, block, layers, planes, 64)
}

/// A ResNet of basic blocks, `d.layers` per stage, `d.width` channels in the stem and
/// the first stage, doubling at each of the other three.
pub fn resnet_custom(d: &Dims) -> Result<Network, ZooError> {
    let w = d.width;
    resnet_with_stem("resnet", d, Block::Basic, &[d.layers; 4], &[w, 2 * w, 4 * w, 8 * w], w)
}

fn resnet_with_stem(
    name: &str,
    d: &Dims,
    block: Block,
    layers: &[usize],
    planes: &[usize],
    stem: usize,
) -> Result<Network, ZooError> {
    let mut b = NetBuilder::new(name, d.dtype);
    let x = b.input("images", vec![d.batch, 3, d.image, d.image], Elem::Float);
    let labels = b.input("labels", vec![d.batch], Elem::Int);
    let h = b.op(
        "conv1",
        OpKind::Conv2d { out_channels: stem, kernel: 7, stride: 2, padding: 3, groups: 1, bias: false },
        &[x],
    )?;
    b.next_stage();
    let h = b.op("bn1", OpKind::BatchNorm2d, &[h])?;
    b.next_stage();
    let h = b.op("relu", OpKind::Relu, &[h])?;
    b.next_stage();
    let mut h = b.op("maxpool", OpKind::MaxPool2d { kernel: 3, stride: 2, padding: 1 }, &[h])?;
    let expansion = if block == Block::Basic { 1 } else { 4 };
    let mut inplanes = stem;
    for (li, (&n, &p)) in layers.iter().zip(planes).enumerate() {
        for bi in 0..n {
            b.next_stage();
            let stride = if bi == 0 && li > 0 { 2 } else { 1 };
            let pre = format!("layer{}.{bi}", li + 1);
            let out = match block {
                Block::Basic => {
                    let t = conv_bn(&mut b, &format!("{pre}.1"), h, p, 3, stride, true)?;
                    conv_bn(&mut b, &format!("{pre}.2"), t, p, 3, 1, false)?
                }
                Block::Bottleneck => {
                    let t = conv_bn(&mut b, &format!("{pre}.1"), h, p, 1, 1, true)?;
                    let t = conv_bn(&mut b, &format!("{pre}.2"), t, p, 3, stride, true)?;
                    conv_bn(&mut b, &format!("{pre}.3"), t, p * expansion, 1, 1, false)?
                }
            };
            let identity = if stride != 1 || inplanes != p * expansion {
                conv_bn(&mut b, &format!("{pre}.downsample"), h, p * expansion, 1, stride, false)?
            } else {
                h
            };
            let sum = b.op(&format!("{pre}.add"), OpKind::Add, &[out, identity])?;
            h = b.op(&format!("{pre}.relu"), OpKind::Relu, &[sum])?;
            inplanes = p * expansion;
        }
    }
    b.next_stage();
    let h = b.op("avgpool", OpKind::AdaptiveAvgPool2d { out: 1 }, &[h])?;
    let h = b.op("flatten", OpKind::Reshape { shape: vec![d.batch, inplanes] }, &[h])?;
    b.next_stage();
    let logits = b.op("fc", OpKind::Linear { out_features: 1000, bias: true }, &[h])?;
    b.loss("loss", OpKind::CrossEntropy, &[logits, labels])?;
    b.finish()
}

const PLANES: [usize; 4] = [64, 128, 256, 512];

/// ResNet-18.
pub fn resnet18(d: &Dims) -> Result<Network, ZooError> {
    resnet("resnet18", d, Block::Basic, &[2, 2, 2, 2], &PLANES)
}
/// ResNet-34.
pub fn resnet34(d: &Dims) -> Result<Network, ZooError> {
    resnet("resnet34", d, Block::Basic, &[3, 4, 6, 3], &PLANES)
}
/// ResNet-50.
pub fn resnet50(d: &Dims) -> Result<Network, ZooError> {
    resnet("resnet50", d, Block::Bottleneck, &[3, 4, 6, 3], &PLANES)
}
/// ResNet-101.
pub fn resnet101(d: &Dims) -> Result<Network, ZooError> {
    resnet("resnet101", d, Block::Bottleneck, &[3, 4, 23, 3], &PLANES)
}
/// ResNet-152.
pub fn resnet152(d: &Dims) -> Result<Network, ZooError> {
    resnet("resnet152", d, Block::Bottleneck, &[3, 8, 36, 3], &PLANES)
}
/// ResNet-200 (He et al. 2016b): bottlenecks [3, 24, 36, 3].
pub fn resnet200(d: &Dims) -> Result<Network, ZooError> {
    resnet("resnet200", d, Block::Bottleneck, &[3, 24, 36, 3], &PLANES)
}
/// ResNet-1001: three stages of 111 bottlenecks (the CIFAR design of He et al. 2016b)
/// behind the ImageNet stem, with 64/128/256 planes, as Rotor ran it on 224×224 images.
pub fn resnet1001(d: &Dims) -> Result<Network, ZooError> {
    resnet("resnet1001", d, Block::Bottleneck, &[111, 111, 111], &PLANES[..3])
}

#[cfg(test)]
mod tests {
    use crate::{build, ModelOptions};

    fn small(name: &str) -> crate::Model {
        build(name, &ModelOptions { batch: Some(2), image: Some(64), ..Default::default() }).unwrap()
    }

    #[test]
    fn published_parameter_counts() {
        for name in ["resnet18", "resnet34", "resnet50", "resnet101", "resnet152"] {
            let m = small(name);
            assert_eq!(m.network.param_count(), m.spec.published_params.unwrap().0, "{name}");
        }
    }

    #[test]
    fn chain_lengths() {
        // Stem (4 stages) + blocks + avgpool + fc, as Rotor's sequential rewrite.
        assert_eq!(small("resnet18").chain.len(), 4 + 8 + 2);
        assert_eq!(small("resnet50").chain.len(), 4 + 16 + 2);
        assert_eq!(small("resnet1001").chain.len(), 339);
    }
}
