//! Inception-v3 as torchvision builds it (`Inception3`, `transform_input=False`),
//! without the auxiliary classifier (`aux_logits=False`): a network has one loss here,
//! and the auxiliary head only adds a side branch off `Mixed_6e`. Every `BasicConv2d`
//! is a convolution without bias, a batch norm and a ReLU; the factorized 1×n and n×1
//! convolutions use [`OpKind::Conv2dRect`]. The branch pools are average pools 3×3
//! (stride 1, padding 1) in the A, C and E modules, and max-pools 3×3 (stride 2) in the
//! reductions B and D.
//!
//! Chain stages follow torchvision's module children: the five stem convolutions and
//! two max-pools (7 stages), the eleven Mixed modules (one stage each), the average
//! pool, the dropout and the classifier: 21 stages. Images must be at least 75×75, as
//! torchvision says.

use crate::ops::{Elem, OpKind};
use crate::{Dims, NetBuilder, Network, TensorId, ZooError};

/// torchvision's count with `aux_logits=False` (27,161,264 with the auxiliary head,
/// whose 3,326,696 parameters are not modelled here).
pub const INCEPTION_V3_PARAMS: Option<(u64, &str)> = Some((23_834_568, "torchvision (aux_logits=False)"));

/// `BasicConv2d` with a `kh × kw` kernel: convolution (no bias), batch norm, ReLU.
fn basic(
    b: &mut NetBuilder,
    name: &str,
    x: TensorId,
    out: usize,
    (kh, kw): (usize, usize),
    stride: usize,
    (ph, pw): (usize, usize),
) -> Result<TensorId, ZooError> {
    let kind = if kh == kw && ph == pw {
        OpKind::Conv2d { out_channels: out, kernel: kh, stride, padding: ph, groups: 1, bias: false }
    } else {
        OpKind::Conv2dRect { out_channels: out, kernel_h: kh, kernel_w: kw, stride, pad_h: ph, pad_w: pw, bias: false }
    };
    let h = b.op(&format!("{name}.conv"), kind, &[x])?;
    let h = b.op(&format!("{name}.bn"), OpKind::BatchNorm2d, &[h])?;
    b.op(&format!("{name}.relu"), OpKind::Relu, &[h])
}

/// A square `BasicConv2d` with stride 1 and "same" padding.
fn same(b: &mut NetBuilder, name: &str, x: TensorId, out: usize, k: usize) -> Result<TensorId, ZooError> {
    basic(b, name, x, out, (k, k), 1, (k / 2, k / 2))
}

/// A 1×7 (`wide`) or 7×1 `BasicConv2d` with "same" padding (also 1×3 / 3×1 for `n = 3`).
fn factor(b: &mut NetBuilder, name: &str, x: TensorId, out: usize, n: usize, wide: bool) -> Result<TensorId, ZooError> {
    if wide {
        basic(b, name, x, out, (1, n), 1, (0, n / 2))
    } else {
        basic(b, name, x, out, (n, 1), 1, (n / 2, 0))
    }
}

fn avg_pool(b: &mut NetBuilder, name: &str, x: TensorId) -> Result<TensorId, ZooError> {
    b.op(name, OpKind::AvgPool2d { kernel: 3, stride: 1, padding: 1 }, &[x])
}

fn concat(b: &mut NetBuilder, name: &str, xs: &[TensorId]) -> Result<TensorId, ZooError> {
    b.op(&format!("{name}.concat"), OpKind::Concat { dim: 1 }, xs)
}

/// `InceptionA`: 64 + 64 + 96 + `pool_features` channels out.
fn inception_a(b: &mut NetBuilder, p: &str, x: TensorId, pool_features: usize) -> Result<TensorId, ZooError> {
    let b1 = same(b, &format!("{p}.branch1x1"), x, 64, 1)?;
    let b5 = same(b, &format!("{p}.branch5x5_1"), x, 48, 1)?;
    let b5 = same(b, &format!("{p}.branch5x5_2"), b5, 64, 5)?;
    let b3 = same(b, &format!("{p}.branch3x3dbl_1"), x, 64, 1)?;
    let b3 = same(b, &format!("{p}.branch3x3dbl_2"), b3, 96, 3)?;
    let b3 = same(b, &format!("{p}.branch3x3dbl_3"), b3, 96, 3)?;
    let bp = avg_pool(b, &format!("{p}.avg_pool"), x)?;
    let bp = same(b, &format!("{p}.branch_pool"), bp, pool_features, 1)?;
    concat(b, p, &[b1, b5, b3, bp])
}

/// `InceptionB` (grid reduction 35 → 17): 384 + 96 + input channels out.
fn inception_b(b: &mut NetBuilder, p: &str, x: TensorId) -> Result<TensorId, ZooError> {
    let b3 = basic(b, &format!("{p}.branch3x3"), x, 384, (3, 3), 2, (0, 0))?;
    let bd = same(b, &format!("{p}.branch3x3dbl_1"), x, 64, 1)?;
    let bd = same(b, &format!("{p}.branch3x3dbl_2"), bd, 96, 3)?;
    let bd = basic(b, &format!("{p}.branch3x3dbl_3"), bd, 96, (3, 3), 2, (0, 0))?;
    let bp = b.op(&format!("{p}.max_pool"), OpKind::MaxPool2d { kernel: 3, stride: 2, padding: 0 }, &[x])?;
    concat(b, p, &[b3, bd, bp])
}

/// `InceptionC` (7×7 factorized into 1×7 and 7×1): 4 × 192 = 768 channels out.
fn inception_c(b: &mut NetBuilder, p: &str, x: TensorId, c7: usize) -> Result<TensorId, ZooError> {
    let b1 = same(b, &format!("{p}.branch1x1"), x, 192, 1)?;
    let b7 = same(b, &format!("{p}.branch7x7_1"), x, c7, 1)?;
    let b7 = factor(b, &format!("{p}.branch7x7_2"), b7, c7, 7, true)?;
    let b7 = factor(b, &format!("{p}.branch7x7_3"), b7, 192, 7, false)?;
    let bd = same(b, &format!("{p}.branch7x7dbl_1"), x, c7, 1)?;
    let bd = factor(b, &format!("{p}.branch7x7dbl_2"), bd, c7, 7, false)?;
    let bd = factor(b, &format!("{p}.branch7x7dbl_3"), bd, c7, 7, true)?;
    let bd = factor(b, &format!("{p}.branch7x7dbl_4"), bd, c7, 7, false)?;
    let bd = factor(b, &format!("{p}.branch7x7dbl_5"), bd, 192, 7, true)?;
    let bp = avg_pool(b, &format!("{p}.avg_pool"), x)?;
    let bp = same(b, &format!("{p}.branch_pool"), bp, 192, 1)?;
    concat(b, p, &[b1, b7, bd, bp])
}

/// `InceptionD` (grid reduction 17 → 8): 320 + 192 + input channels out.
fn inception_d(b: &mut NetBuilder, p: &str, x: TensorId) -> Result<TensorId, ZooError> {
    let b3 = same(b, &format!("{p}.branch3x3_1"), x, 192, 1)?;
    let b3 = basic(b, &format!("{p}.branch3x3_2"), b3, 320, (3, 3), 2, (0, 0))?;
    let b7 = same(b, &format!("{p}.branch7x7x3_1"), x, 192, 1)?;
    let b7 = factor(b, &format!("{p}.branch7x7x3_2"), b7, 192, 7, true)?;
    let b7 = factor(b, &format!("{p}.branch7x7x3_3"), b7, 192, 7, false)?;
    let b7 = basic(b, &format!("{p}.branch7x7x3_4"), b7, 192, (3, 3), 2, (0, 0))?;
    let bp = b.op(&format!("{p}.max_pool"), OpKind::MaxPool2d { kernel: 3, stride: 2, padding: 0 }, &[x])?;
    concat(b, p, &[b3, b7, bp])
}

/// `InceptionE` (expanded filter banks): 320 + 768 + 768 + 192 = 2048 channels out.
fn inception_e(b: &mut NetBuilder, p: &str, x: TensorId) -> Result<TensorId, ZooError> {
    let b1 = same(b, &format!("{p}.branch1x1"), x, 320, 1)?;
    let b3 = same(b, &format!("{p}.branch3x3_1"), x, 384, 1)?;
    let b3a = factor(b, &format!("{p}.branch3x3_2a"), b3, 384, 3, true)?;
    let b3b = factor(b, &format!("{p}.branch3x3_2b"), b3, 384, 3, false)?;
    let bd = same(b, &format!("{p}.branch3x3dbl_1"), x, 448, 1)?;
    let bd = same(b, &format!("{p}.branch3x3dbl_2"), bd, 384, 3)?;
    let bda = factor(b, &format!("{p}.branch3x3dbl_3a"), bd, 384, 3, true)?;
    let bdb = factor(b, &format!("{p}.branch3x3dbl_3b"), bd, 384, 3, false)?;
    let bp = avg_pool(b, &format!("{p}.avg_pool"), x)?;
    let bp = same(b, &format!("{p}.branch_pool"), bp, 192, 1)?;
    // torch.cat of the inner pairs, then of the four branches: one concatenation here.
    concat(b, p, &[b1, b3a, b3b, bda, bdb, bp])
}

/// Inception-v3 (torchvision, `aux_logits=False`, `transform_input=False`).
pub fn inception_v3(d: &Dims) -> Result<Network, ZooError> {
    let mut b = NetBuilder::new("inception_v3", d.dtype);
    let x = b.input("images", vec![d.batch, 3, d.image, d.image], Elem::Float);
    let labels = b.input("labels", vec![d.batch], Elem::Int);
    let h = basic(&mut b, "Conv2d_1a_3x3", x, 32, (3, 3), 2, (0, 0))?;
    b.next_stage();
    let h = basic(&mut b, "Conv2d_2a_3x3", h, 32, (3, 3), 1, (0, 0))?;
    b.next_stage();
    let h = basic(&mut b, "Conv2d_2b_3x3", h, 64, (3, 3), 1, (1, 1))?;
    b.next_stage();
    let h = b.op("maxpool1", OpKind::MaxPool2d { kernel: 3, stride: 2, padding: 0 }, &[h])?;
    b.next_stage();
    let h = basic(&mut b, "Conv2d_3b_1x1", h, 80, (1, 1), 1, (0, 0))?;
    b.next_stage();
    let h = basic(&mut b, "Conv2d_4a_3x3", h, 192, (3, 3), 1, (0, 0))?;
    b.next_stage();
    let mut h = b.op("maxpool2", OpKind::MaxPool2d { kernel: 3, stride: 2, padding: 0 }, &[h])?;
    for (name, pool_features) in [("Mixed_5b", 32), ("Mixed_5c", 64), ("Mixed_5d", 64)] {
        b.next_stage();
        h = inception_a(&mut b, name, h, pool_features)?;
    }
    b.next_stage();
    h = inception_b(&mut b, "Mixed_6a", h)?;
    for (name, c7) in [("Mixed_6b", 128), ("Mixed_6c", 160), ("Mixed_6d", 160), ("Mixed_6e", 192)] {
        b.next_stage();
        h = inception_c(&mut b, name, h, c7)?;
    }
    b.next_stage();
    h = inception_d(&mut b, "Mixed_7a", h)?;
    for name in ["Mixed_7b", "Mixed_7c"] {
        b.next_stage();
        h = inception_e(&mut b, name, h)?;
    }
    b.next_stage();
    let h = b.op("avgpool", OpKind::AdaptiveAvgPool2d { out: 1 }, &[h])?;
    let h = b.op("flatten", OpKind::Reshape { shape: vec![d.batch, 2048] }, &[h])?;
    b.next_stage();
    let h = b.op("dropout", OpKind::Dropout { p: 0.5 }, &[h])?;
    b.next_stage();
    let logits = b.op("fc", OpKind::Linear { out_features: 1000, bias: true }, &[h])?;
    b.loss("loss", OpKind::CrossEntropy, &[logits, labels])?;
    b.finish()
}

#[cfg(test)]
mod tests {
    use crate::{build, ModelOptions, ZooError};

    /// torchvision's count, summed from its definition: `BasicConv2d(i, o, kh × kw)`
    /// has `i·o·kh·kw + 2o` parameters.
    fn torchvision_count() -> u64 {
        let bc = |i: u64, o: u64, kh: u64, kw: u64| i * o * kh * kw + 2 * o;
        let stem = bc(3, 32, 3, 3) + bc(32, 32, 3, 3) + bc(32, 64, 3, 3) + bc(64, 80, 1, 1) + bc(80, 192, 3, 3);
        let a = |i: u64, pf: u64| {
            bc(i, 64, 1, 1)
                + bc(i, 48, 1, 1)
                + bc(48, 64, 5, 5)
                + bc(i, 64, 1, 1)
                + bc(64, 96, 3, 3)
                + bc(96, 96, 3, 3)
                + bc(i, pf, 1, 1)
        };
        let b = |i: u64| bc(i, 384, 3, 3) + bc(i, 64, 1, 1) + bc(64, 96, 3, 3) + bc(96, 96, 3, 3);
        let c = |c7: u64| {
            bc(768, 192, 1, 1)
                + bc(768, c7, 1, 1)
                + bc(c7, c7, 1, 7)
                + bc(c7, 192, 7, 1)
                + bc(768, c7, 1, 1)
                + 3 * bc(c7, c7, 7, 1)
                + bc(c7, 192, 1, 7)
                + bc(768, 192, 1, 1)
        };
        let d =
            bc(768, 192, 1, 1) + bc(192, 320, 3, 3) + bc(768, 192, 1, 1) + 2 * bc(192, 192, 1, 7) + bc(192, 192, 3, 3);
        let e = |i: u64| {
            bc(i, 320, 1, 1)
                + bc(i, 384, 1, 1)
                + 2 * bc(384, 384, 1, 3)
                + bc(i, 448, 1, 1)
                + bc(448, 384, 3, 3)
                + 2 * bc(384, 384, 1, 3)
                + bc(i, 192, 1, 1)
        };
        let fc = 2048 * 1000 + 1000;
        stem + a(192, 32) + a(256, 64) + a(288, 64) + b(288) + c(128) + 2 * c(160) + c(192) + d + e(1280) + e(2048) + fc
    }

    #[test]
    fn published_parameter_count() {
        // The auxiliary head would add conv0 (768·128 + 256), conv1 (128·768·25 + 1536)
        // and fc (768·1000 + 1000): 3,326,696, for torchvision's 27,161,264.
        assert_eq!(torchvision_count(), 23_834_568);
        assert_eq!(torchvision_count() + 98_560 + 2_459_136 + 769_000, 27_161_264);
        let m = build("inception_v3", &ModelOptions { batch: Some(1), image: Some(75), ..Default::default() }).unwrap();
        assert_eq!(m.network.param_count(), 23_834_568);
        assert_eq!(m.network.param_count(), m.spec.published_params.unwrap().0);
        // 5 stem convolutions + 2 max-pools, 11 Mixed modules, avgpool, dropout, fc.
        assert_eq!(m.chain.len(), 7 + 11 + 3);
    }

    #[test]
    fn builds_at_default_sizes() {
        let m = build("inception_v3", &ModelOptions { batch: Some(1), ..Default::default() }).unwrap();
        assert_eq!(m.dims.image, 299);
        let shape = |name: &str| {
            let op = m.network.ops.iter().find(|o| o.name == name).unwrap();
            m.network.tensors[op.output].shape.clone()
        };
        assert_eq!(shape("maxpool2"), vec![1, 192, 35, 35]);
        assert_eq!(shape("Mixed_5d.concat"), vec![1, 288, 35, 35]);
        assert_eq!(shape("Mixed_6e.concat"), vec![1, 768, 17, 17]);
        assert_eq!(shape("Mixed_7c.concat"), vec![1, 2048, 8, 8]);
        assert!(m.network.ops.iter().any(|o| o.kind.name() == "conv2d_rect"));
    }

    #[test]
    fn too_small_images_are_an_error() {
        let e =
            build("inception_v3", &ModelOptions { batch: Some(1), image: Some(64), ..Default::default() }).unwrap_err();
        assert!(matches!(e, ZooError::Shape { .. }), "{e}");
    }
}
