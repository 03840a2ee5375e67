//! U-Net (Ronneberger et al. 2015) as the popular `milesial/Pytorch-UNet` builds it with
//! `UNet(n_channels=3, n_classes=2, bilinear=False)`: a double convolution (3×3, no
//! bias, batch norm, ReLU, twice) at each level, four down steps (2×2 max-pool then a
//! double convolution: 64 → 128 → 256 → 512 → 1024 channels), four up steps (a 2×2
//! transposed convolution with bias halving the channels, concatenated after the skip
//! connection, then a double convolution), and a 1×1 convolution with bias to 2 classes.
//!
//! The loss is per-pixel cross-entropy against labels `[N, H, W]`. PyTorch's
//! `cross_entropy` reads the `[N, 2, H, W]` logits directly; our op takes the classes
//! last, so the logits are *viewed* as `[N, H, W, 2]` (a [`OpKind::Reshape`], which
//! allocates nothing). That view is not a real permutation, but the memory and FLOPs are
//! those of the PyTorch step, which needs no permutation either.
//!
//! milesial pads the up-sampled map when an odd size was halved; we do not, so the image
//! side must be a multiple of 16 (anything else is a [`ZooError::BadOption`]).
//!
//! Chain stages are milesial's module children: `inc`, `down1`–`down4`, `up1`–`up4`,
//! `outc`: 10 stages. The skip connections cross the cuts in between, and the chain
//! view counts them at each.

use crate::ops::{Elem, OpKind};
use crate::{Dims, NetBuilder, Network, TensorId, ZooError};

/// milesial's `UNet(3, 2, bilinear=False)`, counted from its definition in the tests
/// (and the count its users report).
pub const UNET_PARAMS: Option<(u64, &str)> = Some((31_037_698, "milesial/Pytorch-UNet, UNet(3, 2, bilinear=False)"));

/// Output classes.
const CLASSES: usize = 2;

/// `DoubleConv`: (3×3 convolution without bias → BN → ReLU) × 2, named as milesial's
/// `double_conv.{0..5}`.
fn double_conv(b: &mut NetBuilder, name: &str, x: TensorId, out: usize) -> Result<TensorId, ZooError> {
    let mut h = x;
    for i in [0, 3] {
        let conv = OpKind::Conv2d { out_channels: out, kernel: 3, stride: 1, padding: 1, groups: 1, bias: false };
        h = b.op(&format!("{name}.double_conv.{i}"), conv, &[h])?;
        h = b.op(&format!("{name}.double_conv.{}", i + 1), OpKind::BatchNorm2d, &[h])?;
        h = b.op(&format!("{name}.double_conv.{}", i + 2), OpKind::Relu, &[h])?;
    }
    Ok(h)
}

/// U-Net with 3 input channels and 2 classes, transposed convolutions up.
pub fn unet(d: &Dims) -> Result<Network, ZooError> {
    if !d.image.is_multiple_of(16) {
        return Err(ZooError::BadOption {
            model: "unet".into(),
            option: "image",
            why: format!("must be a multiple of 16 (four halvings), got {}", d.image),
        });
    }
    let mut b = NetBuilder::new("unet", d.dtype);
    let x = b.input("images", vec![d.batch, 3, d.image, d.image], Elem::Float);
    let labels = b.input("labels", vec![d.batch, d.image, d.image], Elem::Int);
    let mut skips = vec![double_conv(&mut b, "inc", x, 64)?];
    for (i, out) in [128, 256, 512, 1024].into_iter().enumerate() {
        b.next_stage();
        let name = format!("down{}", i + 1);
        let prev = *skips.last().expect("inc");
        let h = b.op(&format!("{name}.maxpool"), OpKind::MaxPool2d { kernel: 2, stride: 2, padding: 0 }, &[prev])?;
        skips.push(double_conv(&mut b, &format!("{name}.conv"), h, out)?);
    }
    let mut h = skips.pop().expect("bottom");
    for (i, out) in [512, 256, 128, 64].into_iter().enumerate() {
        b.next_stage();
        let name = format!("up{}", i + 1);
        let skip = skips.pop().expect("one skip per level");
        let up =
            b.op(&format!("{name}.up"), OpKind::ConvTranspose2d { out_channels: out, kernel: 2, bias: true }, &[h])?;
        // milesial: torch.cat([x2, x1], dim=1), the skip first.
        let cat = b.op(&format!("{name}.concat"), OpKind::Concat { dim: 1 }, &[skip, up])?;
        h = double_conv(&mut b, &format!("{name}.conv"), cat, out)?;
    }
    b.next_stage();
    let conv = OpKind::Conv2d { out_channels: CLASSES, kernel: 1, stride: 1, padding: 0, groups: 1, bias: true };
    let logits = b.op("outc.conv", conv, &[h])?;
    let logits =
        b.op("logits_classes_last", OpKind::Reshape { shape: vec![d.batch, d.image, d.image, CLASSES] }, &[logits])?;
    b.loss("loss", OpKind::CrossEntropy, &[logits, labels])?;
    b.finish()
}

#[cfg(test)]
mod tests {
    use crate::{build, ModelOptions, ZooError};

    /// The count from milesial's definition: `DoubleConv(i, o)` has `9·i·o + 9·o·o`
    /// weights and two batch norms of `2o`; `ConvTranspose2d(i, i/2, 2)` has `4·i·i/2`
    /// weights and `i/2` biases; `OutConv` has `64·2 + 2`.
    fn milesial_count() -> u64 {
        let dc = |i: u64, o: u64| 9 * i * o + 9 * o * o + 4 * o;
        let up = |i: u64| 4 * i * (i / 2) + i / 2 + dc(i, i / 2);
        dc(3, 64)
            + dc(64, 128)
            + dc(128, 256)
            + dc(256, 512)
            + dc(512, 1024)
            + up(1024)
            + up(512)
            + up(256)
            + up(128)
            + 64 * 2
            + 2
    }

    #[test]
    fn published_parameter_count_and_chain() {
        assert_eq!(milesial_count(), 31_037_698);
        let m = build("unet", &ModelOptions { batch: Some(1), image: Some(16), ..Default::default() }).unwrap();
        assert_eq!(m.network.param_count(), 31_037_698);
        assert_eq!(m.network.param_count(), m.spec.published_params.unwrap().0);
        // inc, 4 downs, 4 ups, outc.
        assert_eq!(m.chain.len(), 10);
    }

    #[test]
    fn builds_at_default_sizes() {
        let m = build("unet", &ModelOptions::default()).unwrap();
        assert_eq!((m.dims.batch, m.dims.image), (8, 256));
        let bottom = m.network.ops.iter().find(|o| o.name == "down4.conv.double_conv.5").unwrap();
        assert_eq!(m.network.tensors[bottom.output].shape, vec![8, 1024, 16, 16]);
        let out = m.network.ops.iter().find(|o| o.name == "outc.conv").unwrap();
        assert_eq!(m.network.tensors[out.output].shape, vec![8, 2, 256, 256]);
        // The skip of `inc` crosses every cut up to `up4`: x[i] counts it for i = 1..=8.
        let inc = (8 * 64 * 256 * 256 * 4) as u64;
        assert!((1..=8).all(|i| m.chain.x[i] >= inc));
    }

    #[test]
    fn bad_image_sizes_are_errors() {
        for image in [8, 20, 100] {
            let e =
                build("unet", &ModelOptions { batch: Some(1), image: Some(image), ..Default::default() }).unwrap_err();
            assert!(matches!(e, ZooError::BadOption { option: "image", .. }), "{image}: {e}");
        }
    }

    #[test]
    fn mismatched_skip_is_a_shape_error() {
        // What the size check guards against: an odd side halved (5 → 2) and doubled
        // back (→ 4) no longer fits its skip connection; the op library says so.
        use crate::{DType, Elem, NetBuilder, OpKind};
        let mut b = NetBuilder::new("t", DType::F32);
        let skip = b.input("skip", vec![1, 64, 5, 5], Elem::Float);
        let low = b.input("low", vec![1, 128, 2, 2], Elem::Float);
        let up = b.op("up", OpKind::ConvTranspose2d { out_channels: 64, kernel: 2, bias: true }, &[low]).unwrap();
        let e = b.op("cat", OpKind::Concat { dim: 1 }, &[skip, up]).unwrap_err();
        assert!(matches!(e, ZooError::Shape { op: "concat", .. }), "{e}");
    }
}
