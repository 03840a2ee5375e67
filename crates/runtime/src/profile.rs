//! The profiler: each op's time and temporary memory, measured on the device it runs on,
//! the way Rockmate's graph builder measures them (Zhao §2.10): run the op alone on
//! random operands of its shapes, synchronize, and read the clock and the allocator.
//!
//! Temporary memory is the peak above what was live before the op plus what it leaves
//! (its outputs); it is measured where allocations are counted (the CPU with
//! [`CountingAlloc`](crate::memory::CountingAlloc)), and taken from the declaration
//! elsewhere. Ops of the same kind on the same shapes are measured once.

use std::collections::HashMap;
use std::time::Instant;

use burn_backend::tensor::FloatTensor;
use burn_backend::{Backend, TensorData, TensorMetadata};
use pebble_graph::Chain;
use pebble_zoo::ops::Saved;
use pebble_zoo::{Elem, Network, OpCosts, OpKind};

use crate::ops::{self, OpCtx};
use crate::optim::{self, OptimizerKind};
use crate::rng::SplitMix;
use crate::value::sync;
use crate::{memory, RuntimeError, Value};

/// Measured costs of every op of a network.
#[derive(Debug, Clone, PartialEq)]
pub struct Profile {
    /// Forward of each op: (seconds, temporary bytes).
    pub forward: Vec<(f64, u64)>,
    /// Backward of each op (for the loss: forward and backward at once).
    pub backward: Vec<(f64, u64)>,
    /// Bytes each op (forward or backward, the larger) leaves live beyond its results'
    /// own sizes: a buffer a result keeps alive whole where it is a slice of it (0
    /// where nothing counts allocations). The simulator frees an op's temporaries at
    /// its end; what is left here, it never counts.
    pub leftover: Vec<u64>,
}

impl OpCosts for Profile {
    fn forward(&self, _net: &Network, op: usize) -> (f64, u64) {
        self.forward[op]
    }
    fn backward(&self, _net: &Network, op: usize) -> (f64, u64) {
        self.backward[op]
    }
}

impl Profile {
    /// This profile with each stage's ops scaled to the stage times measured in whole
    /// steps: every forward of an op in stage `s` (`stage_of`, as [`Program`](crate::Program)
    /// groups them) by `measured.ftime[s] / planned.ftime[s]`, every backward by the same
    /// ratio of `btime` (the loss's stage `L` by `btime[L]`), where `planned` is the chain
    /// lowered from this profile. A chain lowered from the result has `measured`'s
    /// times; a stage whose ops this profile timed at zero keeps them at zero.
    pub fn scaled_to_stages(&self, stage_of: &[usize], planned: &Chain, measured: &Chain) -> Profile {
        let ratio = |planned: Option<&f64>, measured: Option<&f64>| match (planned, measured) {
            (Some(&p), Some(&m)) if p > 0.0 => m / p,
            _ => 1.0,
        };
        let scale = |costs: &[(f64, u64)], times: fn(&Chain) -> &Vec<f64>| -> Vec<(f64, u64)> {
            costs
                .iter()
                .zip(stage_of)
                .map(|(&(t, tmp), &s)| (t * ratio(times(planned).get(s), times(measured).get(s)), tmp))
                .collect()
        };
        Profile {
            forward: scale(&self.forward, |c| &c.ftime),
            backward: scale(&self.backward, |c| &c.btime),
            leftover: self.leftover.clone(),
        }
    }
}

fn float_bytes<B: Backend>(t: &FloatTensor<B>) -> u64 {
    (t.shape().num_elements() * t.dtype().size()) as u64
}

/// Repetitions of each measurement after one warm-up; the median counts.
const REPEATS: usize = 5;

/// A random operand of `shape`: floats in `[-1, 1)`, integers below `range`.
fn operand<B: Backend>(shape: &[usize], elem: Elem, range: u64, rng: &mut SplitMix, device: &B::Device) -> Value<B> {
    let n: usize = shape.iter().product();
    match elem {
        Elem::Float => Value::Float(B::float_from_data(
            TensorData::new((0..n).map(|_| 2.0 * rng.unit() - 1.0).collect::<Vec<f32>>(), shape.to_vec()),
            device,
        )),
        Elem::Int | Elem::Byte => {
            let ids: Vec<i64> = (0..n).map(|_| rng.below(range) as i64).collect();
            Value::Int(B::int_from_data(TensorData::new(ids, shape.to_vec()).convert::<B::IntElem>(), device))
        }
    }
}

/// What [`measure`] found: seconds, temporary bytes and bytes left over (`None` where
/// nothing counts allocations).
type Measured = (f64, Option<(u64, u64)>);

/// Times `f` (median of [`REPEATS`] after a warm-up) and measures its temporary bytes,
/// the peak above `live before + kept(result)`, and what it leaves live beyond
/// `kept(result)`: the least over the repeats, since a cache the backend grows (a
/// thread's packing buffer, met on another thread) is left once, a result's buffer
/// every time.
fn measure<B: Backend, T>(
    device: &B::Device,
    mut f: impl FnMut() -> Result<T, RuntimeError>,
    kept: impl Fn(&T) -> u64,
) -> Result<Measured, RuntimeError> {
    drop(f()?);
    let mut times = Vec::with_capacity(REPEATS);
    let (mut tmp, mut left) = (0u64, u64::MAX);
    for _ in 0..REPEATS {
        sync::<B>(device)?;
        let before = memory::start_step();
        let start = Instant::now();
        let out = f()?;
        sync::<B>(device)?;
        times.push(start.elapsed().as_secs_f64());
        tmp = tmp.max(memory::peak().saturating_sub(before + kept(&out)));
        left = left.min(memory::live().saturating_sub(before + kept(&out)));
        drop(out);
    }
    let time = median(times).expect("REPEATS is at least one");
    Ok((time, memory::counting().then_some((tmp, left))))
}

/// The median of `samples` (the upper one of an even count); `None` when there are none.
pub fn median(mut samples: Vec<f64>) -> Option<f64> {
    samples.sort_by(f64::total_cmp);
    samples.get(samples.len() / 2).copied()
}

/// Profiles every op of `net` on `device`.
pub fn profile<B: Backend>(net: &Network, device: &B::Device, seed: u64) -> Result<Profile, RuntimeError> {
    let float = net.dtype.bytes();
    let mut rng = SplitMix(seed ^ 0x9F0F);
    // Ops of one kind on the same shapes: (forward, backward) costs, measured once.
    type Costs = ((f64, u64), (f64, u64), u64);
    let mut seen: HashMap<String, Costs> = HashMap::new();
    let mut forward = vec![(0.0, 0); net.ops.len()];
    let mut backward = vec![(0.0, 0); net.ops.len()];
    let mut leftover = vec![0; net.ops.len()];
    for (o, op) in net.ops.iter().enumerate() {
        if op.decl.view {
            continue;
        }
        let shapes: Vec<&Vec<usize>> = op.inputs.iter().map(|&t| &net.tensors[t].shape).collect();
        let key = format!("{:?}{:?}", op.kind, shapes);
        if let Some(&(f, b, l)) = seen.get(&key) {
            (forward[o], backward[o], leftover[o]) = (f, b, l);
            continue;
        }
        let range = |k: usize| -> u64 {
            match (&op.kind, k) {
                (OpKind::Embedding { vocab, .. }, 0) => *vocab as u64,
                (OpKind::CrossEntropy, 1) => net.tensors[op.inputs[0]].shape.last().copied().unwrap_or(2) as u64,
                _ => 2,
            }
        };
        let inputs: Vec<Value<B>> = op
            .inputs
            .iter()
            .enumerate()
            .map(|(k, &t)| operand::<B>(&net.tensors[t].shape, net.tensors[t].elem, range(k), &mut rng, device))
            .collect();
        let params: Vec<FloatTensor<B>> = op
            .params
            .iter()
            .map(|&p| operand::<B>(&net.params[p].shape, Elem::Float, 2, &mut rng, device).float().expect("float"))
            .collect();
        let needs: Vec<bool> = op.inputs.iter().map(|&t| net.tensors[t].requires_grad).collect();
        let ctx = OpCtx { device, grad: true, seed: 1 };
        // Where nothing counts allocations, the declarations for this network's executor.
        let (declared_f, declared_b) = op.decl.tmp_bytes(net.temporaries, float);
        if op.decl.loss {
            let (t, m) = measure::<B, _>(
                device,
                || ops::loss(op, inputs.clone(), &needs, &ctx),
                |out| out.inputs.iter().flatten().map(float_bytes::<B>).sum::<u64>() + float_bytes::<B>(&out.value),
            )?;
            backward[o] = (t, m.map_or(declared_b, |m| m.0));
            leftover[o] = m.map_or(0, |m| m.1);
            continue;
        }
        let (tf, mf) = measure::<B, _>(
            device,
            || ops::forward(op, inputs.clone(), &params, &ctx),
            |out| out.output.bytes() + out.extras.iter().map(Value::bytes).sum::<u64>(),
        )?;
        forward[o] = (tf, mf.map_or(declared_f, |m| m.0));
        leftover[o] = mf.map_or(0, |m| m.1);
        if net.tensors[op.output].requires_grad {
            let out = ops::forward(op, inputs.clone(), &params, &ctx)?;
            let grad_out =
                operand::<B>(&net.tensors[op.output].shape, Elem::Float, 2, &mut rng, device).float().expect("float");
            let mut extras = out.extras.into_iter();
            let saved: Vec<Value<B>> = op
                .decl
                .saved
                .iter()
                .map(|s| match s {
                    Saved::Input(k) => inputs[*k].clone(),
                    Saved::Output => out.output.clone(),
                    Saved::Extra { .. } => extras.next().expect("one extra per declaration"),
                })
                .collect();
            let dims: Vec<Vec<usize>> = op.inputs.iter().map(|&t| net.tensors[t].shape.clone()).collect();
            // Parameter gradients are resident buffers the backward writes (the executor
            // frees their zeros before it, [`Runner::zeroed`](crate::exec)): what it
            // leaves, as the input gradients are.
            let (tb, mb) = measure::<B, _>(
                device,
                || ops::backward(op, &dims, grad_out.clone(), saved.clone(), &params, &needs, &ctx),
                |g| g.inputs.iter().flatten().chain(&g.params).map(float_bytes::<B>).sum::<u64>(),
            )?;
            backward[o] = (tb, mb.map_or(declared_b, |m| m.0));
            leftover[o] = leftover[o].max(mb.map_or(0, |m| m.1));
        }
        seen.insert(key, (forward[o], backward[o], leftover[o]));
    }
    Ok(Profile { forward, backward, leftover })
}

/// The optimizer's speed, in bytes of gradient updated per second.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OptimizerRates {
    /// On the device: the update fused into a stage's backward, [`optim::apply`].
    pub device: f64,
    /// On the host CPU: the update of an offloaded stage, [`optim::apply_slices`].
    pub host: f64,
}

/// Measures one optimizer step over every parameter of `net`, as the executor runs it:
/// on `device` (each parameter through [`optim::apply`], its operands fresh so that the
/// backend updates in place as it does in a step) and on the host CPU (through
/// [`optim::apply_slices`] on host slices). Median of [`REPEATS`] after a warm-up.
pub fn optimizer_rates<B: Backend>(
    net: &Network,
    optimizer: OptimizerKind,
    device: &B::Device,
    seed: u64,
) -> Result<OptimizerRates, RuntimeError> {
    let mut rng = SplitMix(seed ^ 0x0B71);
    let adam = matches!(optimizer, OptimizerKind::AdamW { .. });
    let mut draw = |n: usize, scale: f32| -> Vec<f32> { (0..n).map(|_| scale * (2.0 * rng.unit() - 1.0)).collect() };
    // Each parameter's (weights, gradient, first moment, second moment).
    let operands: Vec<(Vec<usize>, [Vec<f32>; 4])> = net
        .params
        .iter()
        .map(|p| {
            let n: usize = p.shape.iter().product();
            let v: Vec<f32> = draw(n, 1e-4).into_iter().map(f32::abs).collect();
            (p.shape.clone(), [draw(n, 1.0), draw(n, 1e-2), draw(n, 1e-3), v])
        })
        .collect();
    let bytes: f64 = operands.iter().map(|(_, [w, ..])| (w.len() * std::mem::size_of::<f32>()) as f64).sum();
    if bytes == 0.0 {
        return Ok(OptimizerRates { device: f64::INFINITY, host: f64::INFINITY });
    }
    let tensor = |shape: &[usize], v: &[f32]| B::float_from_data(TensorData::new(v.to_vec(), shape.to_vec()), device);
    let mut on_device = Vec::with_capacity(REPEATS + 1);
    let mut on_host = Vec::with_capacity(REPEATS + 1);
    for _ in 0..=REPEATS {
        let fresh: Vec<_> = operands
            .iter()
            .map(|(shape, [w, g, m, v])| {
                (tensor(shape, w), tensor(shape, g), adam.then(|| (tensor(shape, m), tensor(shape, v))))
            })
            .collect();
        sync::<B>(device)?;
        let start = Instant::now();
        let updated: Vec<_> = fresh.into_iter().map(|(w, g, mv)| optim::apply::<B>(optimizer, 1, w, g, mv)).collect();
        sync::<B>(device)?;
        on_device.push(start.elapsed().as_secs_f64());
        drop(updated);
        let mut host: Vec<[Vec<f32>; 4]> = operands.iter().map(|(_, o)| o.clone()).collect();
        let start = Instant::now();
        for [w, g, m, v] in &mut host {
            optim::apply_slices(optimizer, 1, w, g, adam.then_some((&mut m[..], &mut v[..])));
        }
        on_host.push(start.elapsed().as_secs_f64());
    }
    // The first of each is the warm-up.
    let after_warm_up = |mut t: Vec<f64>| median(t.split_off(1)).expect("REPEATS is at least one");
    Ok(OptimizerRates { device: bytes / after_warm_up(on_device), host: bytes / after_warm_up(on_host) })
}

#[cfg(test)]
mod tests {
    use super::median;

    #[test]
    fn median_is_the_middle_sample_and_the_upper_of_an_even_count() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), Some(3.0));
        assert_eq!(median(Vec::new()), None);
    }
}
