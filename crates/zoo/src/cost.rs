//! The roofline cost model: an op takes as long as the slower of its arithmetic (FLOPs
//! over the device's peak rate, matrix or vector) and its memory traffic (bytes over the
//! memory bandwidth), each derated by an achievable efficiency, plus a launch overhead.

use pebble_machine::Profile;

use crate::network::{NetOp, Network, OpCosts};
use crate::ops::Saved;
use crate::DType;

/// Times ops on a device.
#[derive(Debug, Clone, PartialEq)]
pub struct CostModel {
    /// The device's profile (its compute rates).
    pub profile: Profile,
}

impl CostModel {
    fn time(&self, net: &Network, flops: f64, bytes: f64, matmul: bool) -> f64 {
        let d = &self.profile;
        let rate = if matmul {
            match net.dtype {
                DType::F32 => d.matmul_flops_f32,
                DType::Bf16 => d.matmul_flops_bf16,
            }
        } else {
            d.vector_flops
        };
        (flops / rate).max(bytes / d.memory_bandwidth) / d.efficiency + d.launch_seconds
    }

    fn io_bytes(net: &Network, op: &NetOp) -> (f64, f64) {
        let t = |id: usize| net.bytes(&net.tensors[id].shape, net.tensors[id].elem) as f64;
        let inputs: f64 = op.inputs.iter().map(|&i| t(i)).sum();
        let output = t(op.output);
        let params: f64 = op.params.iter().map(|&p| net.bytes(&net.params[p].shape, crate::Elem::Float) as f64).sum();
        let extras: f64 = op
            .decl
            .saved
            .iter()
            .map(|s| match s {
                Saved::Extra { shape, elem, .. } => net.bytes(shape, *elem) as f64,
                _ => 0.0,
            })
            .sum();
        let fwd = inputs + output + params + extras;
        // Backward reads the output gradient, the saved tensors and the parameters, and
        // writes input and parameter gradients.
        let bwd = output + inputs + extras + 2.0 * params + inputs;
        (fwd, bwd)
    }

    /// Forward time of an op.
    pub fn forward_time(&self, net: &Network, op: &NetOp) -> f64 {
        if op.decl.view {
            return 0.0;
        }
        let (fwd, _) = Self::io_bytes(net, op);
        self.time(net, op.decl.forward_flops, fwd, op.decl.matmul)
    }

    /// Backward time of an op.
    pub fn backward_time(&self, net: &Network, op: &NetOp) -> f64 {
        if op.decl.view {
            return 0.0;
        }
        let (_, bwd) = Self::io_bytes(net, op);
        self.time(net, op.decl.backward_flops, bwd, op.decl.matmul)
    }
}

impl OpCosts for CostModel {
    fn forward(&self, net: &Network, op: usize) -> (f64, u64) {
        let o = &net.ops[op];
        (self.forward_time(net, o), o.decl.tmp_bytes(net.temporaries, net.dtype.bytes()).0)
    }
    fn backward(&self, net: &Network, op: usize) -> (f64, u64) {
        let o = &net.ops[op];
        let tmp = o.decl.tmp_bytes(net.temporaries, net.dtype.bytes()).1;
        if o.decl.loss {
            return (self.forward_time(net, o) + self.backward_time(net, o), tmp);
        }
        (self.backward_time(net, o), tmp)
    }
}
