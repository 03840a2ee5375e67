//! A Siamese network: two images through one embedding network (shared weights), the two
//! embeddings concatenated and classified as "same" or "different".
//!
//! The embedding network is four blocks of 3×3 convolution (no bias), batch norm, ReLU
//! and 2×2 max-pool with 64, 128, 256 and 256 channels, then a global average pool and
//! `Linear(256, 256)`. The second branch reuses every parameter of the first
//! ([`NetBuilder::op_tied`]), so the parameters are named after branch `a`. The head is
//! `Linear(512, 2)` on the concatenated embeddings, with cross-entropy on labels `[N]`.
//!
//! Chain stages: branch `a`'s four blocks and its pool + linear (5 stages), the same for
//! branch `b`, then the head: 11 stages. Branch `a`'s embedding crosses branch `b`'s
//! cuts; a multi-chain solver can treat the two branches as chains joined by the head.
//! Images must be at least 16×16 (four halvings). No published parameter count.

use crate::ops::{Elem, OpKind};
use crate::{Dims, NetBuilder, Network, ParamId, TensorId, ZooError};

/// Channels of the embedding's convolution blocks.
const CHANNELS: [usize; 4] = [64, 128, 256, 256];
/// Embedding width.
const EMBED: usize = 256;

/// One branch: records its ops' parameters, or reuses those of the branch it ties to.
struct Branch<'a> {
    prefix: &'static str,
    tied: Option<&'a [Vec<ParamId>]>,
    params: Vec<Vec<ParamId>>,
}

impl Branch<'_> {
    fn op(&mut self, b: &mut NetBuilder, name: &str, kind: OpKind, x: TensorId) -> Result<TensorId, ZooError> {
        let name = format!("{}.{name}", self.prefix);
        let t = match self.tied {
            Some(p) => b.op_tied(&name, kind, &[x], &p[self.params.len()])?,
            None => b.op(&name, kind, &[x])?,
        };
        self.params.push(b.params_of(t));
        Ok(t)
    }

    /// The embedding of `x`, one stage per block and one for the pool and linear.
    fn embed(&mut self, b: &mut NetBuilder, d: &Dims, x: TensorId) -> Result<TensorId, ZooError> {
        let mut h = x;
        for (i, &c) in CHANNELS.iter().enumerate() {
            b.next_stage();
            let conv = OpKind::Conv2d { out_channels: c, kernel: 3, stride: 1, padding: 1, groups: 1, bias: false };
            h = self.op(b, &format!("block{}.conv", i + 1), conv, h)?;
            h = self.op(b, &format!("block{}.bn", i + 1), OpKind::BatchNorm2d, h)?;
            h = self.op(b, &format!("block{}.relu", i + 1), OpKind::Relu, h)?;
            h =
                self.op(b, &format!("block{}.pool", i + 1), OpKind::MaxPool2d { kernel: 2, stride: 2, padding: 0 }, h)?;
        }
        b.next_stage();
        h = self.op(b, "avgpool", OpKind::AdaptiveAvgPool2d { out: 1 }, h)?;
        h = self.op(b, "flatten", OpKind::Reshape { shape: vec![d.batch, CHANNELS[3]] }, h)?;
        self.op(b, "fc", OpKind::Linear { out_features: EMBED, bias: true }, h)
    }
}

/// The Siamese network on pairs of `image × image` RGB images.
pub fn siamese(d: &Dims) -> Result<Network, ZooError> {
    let mut b = NetBuilder::new("siamese", d.dtype);
    let xa = b.input("images_a", vec![d.batch, 3, d.image, d.image], Elem::Float);
    let xb = b.input("images_b", vec![d.batch, 3, d.image, d.image], Elem::Float);
    let labels = b.input("labels", vec![d.batch], Elem::Int);
    let mut a = Branch { prefix: "a", tied: None, params: Vec::new() };
    let ea = a.embed(&mut b, d, xa)?;
    let mut branch_b = Branch { prefix: "b", tied: Some(&a.params), params: Vec::new() };
    let eb = branch_b.embed(&mut b, d, xb)?;
    b.next_stage();
    let h = b.op("head.concat", OpKind::Concat { dim: 1 }, &[ea, eb])?;
    let logits = b.op("head.fc", OpKind::Linear { out_features: 2, bias: true }, &[h])?;
    b.loss("loss", OpKind::CrossEntropy, &[logits, labels])?;
    b.finish()
}

#[cfg(test)]
mod tests {
    use crate::{build, ModelOptions, ZooError};

    #[test]
    fn shared_parameters_and_chain() {
        let m = build("siamese", &ModelOptions { batch: Some(2), image: Some(16), ..Default::default() }).unwrap();
        let convs = 3 * 64 * 9 + 64 * 128 * 9 + 128 * 256 * 9 + 256 * 256 * 9;
        let bns = 2 * (64 + 128 + 256 + 256);
        let embed = 256 * 256 + 256;
        let head = 512 * 2 + 2;
        // Counted once: the second branch adds no parameters.
        assert_eq!(m.network.param_count(), (convs + bns + embed + head) as u64);
        assert_eq!(m.network.param_count(), 1_028_418);
        let fc = |name: &str| m.network.ops.iter().find(|o| o.name == name).unwrap().params.clone();
        assert_eq!(fc("a.fc"), fc("b.fc"));
        assert_eq!(fc("a.block3.bn"), fc("b.block3.bn"));
        assert!(m.spec.published_params.is_none());
        // Two branches of 4 blocks + pool/linear, then the head.
        assert_eq!(m.chain.len(), 2 * 5 + 1);
    }

    #[test]
    fn builds_at_default_sizes() {
        let m = build("siamese", &ModelOptions::default()).unwrap();
        let pool = m.network.ops.iter().find(|o| o.name == "b.block4.pool").unwrap();
        assert_eq!(m.network.tensors[pool.output].shape, vec![32, 256, 8, 8]);
    }

    #[test]
    fn too_small_images_are_an_error() {
        let e = build("siamese", &ModelOptions { batch: Some(1), image: Some(8), ..Default::default() }).unwrap_err();
        assert!(matches!(e, ZooError::Shape { op: "max_pool2d", .. }), "{e}");
    }
}
