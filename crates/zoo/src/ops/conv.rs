//! The convolutions: `conv2d`, `conv_transpose2d` and `conv2d_rect`.
//! Their forward and backward are in `pebble-runtime`'s `ops/conv.rs`.

use super::{count, Inputs, OpDecl, OpKind};
use crate::ZooError;

/// Declares a convolution for its inputs, or says why the shapes do not fit.
pub(super) fn declare(kind: &OpKind, inputs: &Inputs<'_>) -> Result<OpDecl, ZooError> {
    let mut d = OpDecl::blank();
    match kind {
        OpKind::Conv2d { out_channels, kernel, stride, padding, groups, bias } => {
            inputs.arity(1)?;
            inputs.float(0)?;
            let (n, c, h, w) = inputs.image("conv2d")?;
            if *stride == 0 || *groups == 0 || c % groups != 0 || out_channels % groups != 0 {
                return Err(inputs
                    .bad(format!("channels {c} → {out_channels} do not divide into {groups} groups (or stride 0)")));
            }
            if h + 2 * padding < *kernel || w + 2 * padding < *kernel {
                return Err(inputs.bad(format!("kernel {kernel} larger than the padded input {h}×{w}")));
            }
            let ho = (h + 2 * padding - kernel) / stride + 1;
            let wo = (w + 2 * padding - kernel) / stride + 1;
            d.output = vec![n, *out_channels, ho, wo];
            let macs = count(&[n, *out_channels, ho, wo, c / groups, *kernel, *kernel]);
            d.weighted(vec![*out_channels, c / groups, *kernel, *kernel], bias.then_some(*out_channels), macs);
            let unsliced = burn_weight_grad(*out_channels * (c / groups), (h, w), (ho, wo), *padding, *stride);
            d.conv_temporaries(inputs, macs / *out_channels as f64, (*kernel, *stride), unsliced);
        }
        OpKind::ConvTranspose2d { out_channels, kernel, bias } => {
            inputs.arity(1)?;
            inputs.float(0)?;
            let (n, c, h, w) = inputs.image("conv_transpose2d")?;
            d.output = vec![n, *out_channels, h * kernel, w * kernel];
            let macs = count(&[n, c, h, w, *out_channels, *kernel, *kernel]);
            d.weighted(vec![c, *out_channels, *kernel, *kernel], bias.then_some(*out_channels), macs);
            d.conv_temporaries(inputs, macs / c as f64, (1, 2), 0);
        }
        OpKind::Conv2dRect { out_channels, kernel_h, kernel_w, stride, pad_h, pad_w, bias } => {
            inputs.arity(1)?;
            inputs.float(0)?;
            let (n, c, h, w) = inputs.image("conv2d_rect")?;
            if *stride == 0 || *kernel_h == 0 || *kernel_w == 0 {
                return Err(inputs.bad(format!("kernel {kernel_h}×{kernel_w} or stride {stride} is zero")));
            }
            if h + 2 * pad_h < *kernel_h || w + 2 * pad_w < *kernel_w {
                return Err(inputs.bad(format!("kernel {kernel_h}×{kernel_w} larger than the padded input {h}×{w}")));
            }
            let ho = (h + 2 * pad_h - kernel_h) / stride + 1;
            let wo = (w + 2 * pad_w - kernel_w) / stride + 1;
            d.output = vec![n, *out_channels, ho, wo];
            let macs = count(&[n, *out_channels, ho, wo, c, *kernel_h, *kernel_w]);
            d.weighted(vec![*out_channels, c, *kernel_h, *kernel_w], bias.then_some(*out_channels), macs);
            let unsliced = burn_weight_grad(*out_channels * c, (h + 2 * pad_h, w + 2 * pad_w), (ho, wo), 0, *stride);
            d.conv_temporaries(inputs, macs / *out_channels as f64, ((*kernel_h).min(*kernel_w), *stride), unsliced);
        }
        _ => unreachable!("{} is not a convolution", kind.name()),
    }
    Ok(d)
}

/// Elements of Burn's weight gradient of a strided convolution before it is sliced to the
/// kernel: `channels` (out × in per group) planes of the input convolved with the output's
/// gradient dilated by the stride, `h + 2p − s(ho − 1)` by `w + 2p − s(wo − 1)`. The
/// executor copies the kernel out of it, so both are live for a moment (0 at stride 1,
/// where it is the kernel). Saturates far below `usize::MAX`: a byte count is this times
/// a float's size.
fn burn_weight_grad(channels: usize, (h, w): (usize, usize), (ho, wo): (usize, usize), p: usize, s: usize) -> usize {
    if s == 1 {
        return 0;
    }
    let side = |x: usize, xo: usize| (x + 2 * p).saturating_sub(s.saturating_mul(xo.saturating_sub(1)));
    channels.saturating_mul(side(h, ho)).saturating_mul(side(w, wo)).min(usize::MAX >> 8)
}
