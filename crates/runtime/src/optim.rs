//! The optimizer step: one function, whoever runs it. The session's end-of-step update,
//! the update fused into a stage's backward and the host CPU's update of an offloaded
//! stage all call [`apply`], so that on the same values they compute the same bits (on
//! the CPU backend, the device and the host run the very same code).

use burn_backend::tensor::FloatTensor;
use burn_backend::Backend;

/// The optimizer a session updates its parameters with.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum OptimizerKind {
    /// Plain SGD: no state.
    Sgd {
        /// Learning rate.
        lr: f64,
    },
    /// AdamW (Loshchilov & Hutter): two states per parameter.
    AdamW {
        /// Learning rate.
        lr: f64,
        /// Decoupled weight decay.
        weight_decay: f64,
    },
}

impl OptimizerKind {
    /// The planner's name for its state (`sgd` holds none, `adam` two per parameter).
    pub fn planner(self) -> pebble_zoo::Optimizer {
        match self {
            OptimizerKind::Sgd { .. } => pebble_zoo::Optimizer::Sgd,
            OptimizerKind::AdamW { .. } => pebble_zoo::Optimizer::Adam,
        }
    }
}

/// A parameter's optimizer state: AdamW's two moments (none for SGD).
pub(crate) type Moments<B> = (FloatTensor<B>, FloatTensor<B>);

/// One optimizer step of parameter `p` with gradient `g` at step `t` (1-based): the new
/// parameter and moments. Owned operands are updated in place where the backend can.
pub(crate) fn apply<B: Backend>(
    optimizer: OptimizerKind,
    t: i32,
    p: FloatTensor<B>,
    g: FloatTensor<B>,
    moments: Option<Moments<B>>,
) -> (FloatTensor<B>, Option<Moments<B>>) {
    match optimizer {
        OptimizerKind::Sgd { lr } => (B::float_sub(p, B::float_mul_scalar(g, (lr as f32).into())), moments),
        OptimizerKind::AdamW { lr, weight_decay } => {
            let (b1, b2, eps) = (0.9f32, 0.999f32, 1e-8f32);
            let (m, v) = moments.expect("AdamW keeps two moments per parameter");
            let (c1, c2) = (1.0 - b1.powi(t), 1.0 - b2.powi(t));
            // One parameter-sized temporary at a time (an operand the backend owns alone is
            // updated in place, burn-flex's left operand): `g`'s share of each moment, then
            // the step's direction, made in the reciprocal's buffer as 1/(√v̂ + ε)·m / c₁.
            let m = B::float_add(B::float_mul_scalar(m, b1.into()), B::float_mul_scalar(g.clone(), (1.0 - b1).into()));
            let v = B::float_add(
                B::float_mul_scalar(v, b2.into()),
                B::float_mul_scalar(B::float_mul(g.clone(), g), (1.0 - b2).into()),
            );
            let denom = B::float_add_scalar(B::float_sqrt(B::float_div_scalar(v.clone(), c2.into())), eps.into());
            let dir = B::float_div_scalar(B::float_mul(B::float_recip(denom), m.clone()), c1.into());
            let decayed = B::float_mul_scalar(p, ((1.0 - lr * weight_decay) as f32).into());
            (B::float_sub(decayed, B::float_mul_scalar(dir, (lr as f32).into())), Some((m, v)))
        }
    }
}

/// [`apply`] on host slices, in place, element by element: the same `f32` operations in
/// the same order as the backend's elementwise ops (on the CPU backend, bit for bit the
/// same results, as the tests check), with no temporaries. The host CPU's update runs
/// it on the host copies of an offloaded stage.
pub(crate) fn apply_slices(
    optimizer: OptimizerKind,
    t: i32,
    p: &mut [f32],
    g: &[f32],
    moments: Option<(&mut [f32], &mut [f32])>,
) {
    match optimizer {
        OptimizerKind::Sgd { lr } => {
            let lr = lr as f32;
            for (p, &g) in p.iter_mut().zip(g) {
                *p -= g * lr;
            }
        }
        OptimizerKind::AdamW { lr, weight_decay } => {
            let (b1, b2, eps) = (0.9f32, 0.999f32, 1e-8f32);
            let (m, v) = moments.expect("AdamW keeps two moments per parameter");
            let (c1, c2) = (1.0 - b1.powi(t), 1.0 - b2.powi(t));
            let (decay, lr) = ((1.0 - lr * weight_decay) as f32, lr as f32);
            for (((p, &g), m), v) in p.iter_mut().zip(g).zip(m.iter_mut()).zip(v.iter_mut()) {
                *m = *m * b1 + g * (1.0 - b1);
                *v = *v * b2 + (g * g) * (1.0 - b2);
                let dir = ((1.0 / ((*v / c2).sqrt() + eps)) * *m) / c1;
                *p = *p * decay - dir * lr;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn_backend::TensorData;
    use burn_flex::{Flex, FlexDevice};

    fn tensor(v: &[f32]) -> FloatTensor<Flex> {
        <Flex as burn_backend::ops::FloatTensorOps<Flex>>::float_from_data(
            TensorData::new(v.to_vec(), [v.len()]),
            &FlexDevice,
        )
    }

    fn values(t: FloatTensor<Flex>) -> Vec<f32> {
        crate::read_floats::<Flex>(t).unwrap()
    }

    #[test]
    fn the_host_loop_computes_the_backends_bits() {
        let mut rng = crate::rng::SplitMix(7);
        let n = 4099;
        let mut draw = |scale: f32| -> Vec<f32> { (0..n).map(|_| (2.0 * rng.unit() - 1.0) * scale).collect() };
        let (mut p, g, mut m, v0) = (draw(1.0), draw(1e-2), draw(1e-3), draw(1e-4));
        let mut v: Vec<f32> = v0.iter().map(|x| x.abs()).collect();
        // Edge values: zeros, signed zeros, tiny and large gradients.
        let mut g = g;
        g[..6].copy_from_slice(&[0.0, -0.0, 1e-30, -1e30, 3.5, f32::MIN_POSITIVE]);
        for optimizer in [OptimizerKind::AdamW { lr: 3e-3, weight_decay: 0.01 }, OptimizerKind::Sgd { lr: 0.1 }] {
            for t in [1, 2, 7, 1000] {
                let adam = matches!(optimizer, OptimizerKind::AdamW { .. });
                let moments = adam.then(|| (tensor(&m), tensor(&v)));
                let (bp, bm) = apply::<Flex>(optimizer, t, tensor(&p), tensor(&g), moments);
                apply_slices(optimizer, t, &mut p, &g, adam.then_some((&mut m[..], &mut v[..])));
                let bits = |x: &[f32]| x.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&values(bp)), bits(&p), "{optimizer:?} t {t}: parameters");
                if let Some((bm, bv)) = bm {
                    assert_eq!(bits(&values(bm)), bits(&m), "t {t}: first moments");
                    assert_eq!(bits(&values(bv)), bits(&v), "t {t}: second moments");
                }
            }
        }
    }
}
