//! The roofline cost model: an op takes as long as the slower of its arithmetic (FLOPs
//! over the device's peak rate, matrix or vector) and its memory traffic (bytes over the
//! memory bandwidth), each derated by an achievable efficiency, plus a launch overhead.

use serde::{Deserialize, Serialize};

use crate::network::{NetOp, Network};
use crate::ops::Saved;
use crate::{DType, ZooError};

/// What a device can do.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceProfile {
    /// Name, e.g. `v100`.
    pub name: String,
    /// Peak FP32 matrix FLOP/s (convolutions, matmuls).
    pub matmul_flops_f32: f64,
    /// Peak BF16 matrix FLOP/s.
    pub matmul_flops_bf16: f64,
    /// Peak vector FLOP/s (elementwise ops).
    pub vector_flops: f64,
    /// Device memory bandwidth, bytes/s.
    pub memory_bandwidth: f64,
    /// Host↔device bandwidth per direction, bytes/s (β).
    pub link_bandwidth: f64,
    /// Device memory, bytes.
    pub memory_bytes: u64,
    /// Fraction of peak rates actually reached.
    pub efficiency: f64,
    /// Fixed cost of launching an op, seconds.
    pub launch_seconds: f64,
}

impl DeviceProfile {
    /// The built-in profiles.
    pub fn builtin() -> Vec<DeviceProfile> {
        let p = |name: &str, f32_: f64, bf16: f64, vec: f64, bw: f64, link: f64, gib: u64| DeviceProfile {
            name: name.into(),
            matmul_flops_f32: f32_,
            matmul_flops_bf16: bf16,
            vector_flops: vec,
            memory_bandwidth: bw,
            link_bandwidth: link,
            memory_bytes: gib << 30,
            efficiency: 0.7,
            launch_seconds: 5e-6,
        };
        vec![
            // Tesla V100 (PCIe, 16 GB): 15.7 TFLOP/s FP32, 125 TFLOP/s FP16 tensor cores, 900 GB/s.
            p("v100", 15.7e12, 125e12, 15.7e12, 900e9, 12e9, 16),
            // A100 (40 GB): 19.5 TFLOP/s FP32, 312 TFLOP/s BF16, 1.555 TB/s, PCIe 4.
            p("a100", 19.5e12, 312e12, 19.5e12, 1.555e12, 24e9, 40),
            // H100 SXM (80 GB): 67 TFLOP/s FP32, 989 TFLOP/s BF16 dense, 3.35 TB/s, PCIe 5.
            p("h100", 67e12, 989e12, 67e12, 3.35e12, 50e9, 80),
            // GeForce RTX 3060 (12 GB): 12.7 TFLOP/s FP32, ~51 TFLOP/s BF16, 360 GB/s.
            p("rtx3060", 12.7e12, 51e12, 12.7e12, 360e9, 24e9, 12),
        ]
    }

    /// A built-in profile by name, or a JSON file's profile if `name` is a path.
    pub fn lookup(name: &str) -> Result<DeviceProfile, ZooError> {
        if let Some(p) = Self::builtin().into_iter().find(|p| p.name == name) {
            return Ok(p);
        }
        if name.ends_with(".json") || std::path::Path::new(name).exists() {
            let text =
                std::fs::read_to_string(name).map_err(|e| ZooError::Device(format!("cannot read `{name}`: {e}")))?;
            return Self::from_json(&text).map_err(|e| ZooError::Device(format!("`{name}`: {e}")));
        }
        let names: Vec<String> = Self::builtin().into_iter().map(|p| p.name).collect();
        Err(ZooError::Device(format!(
            "unknown device profile `{name}` (built-in: {}; or a JSON file)",
            names.join(", ")
        )))
    }

    /// Reads a profile from JSON, rejecting non-positive rates.
    pub fn from_json(text: &str) -> Result<DeviceProfile, String> {
        let de = &mut serde_json::Deserializer::from_str(text);
        let p: DeviceProfile = serde_path_to_error::deserialize(de).map_err(|e| {
            let path = e.path().to_string();
            format!("field `{path}`: {}", e.into_inner())
        })?;
        for (field, v) in [
            ("matmul_flops_f32", p.matmul_flops_f32),
            ("matmul_flops_bf16", p.matmul_flops_bf16),
            ("vector_flops", p.vector_flops),
            ("memory_bandwidth", p.memory_bandwidth),
            ("link_bandwidth", p.link_bandwidth),
            ("efficiency", p.efficiency),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return Err(format!("field `{field}` must be a positive number, got {v}"));
            }
        }
        if !(p.launch_seconds.is_finite() && p.launch_seconds >= 0.0) {
            return Err(format!("field `launch_seconds` must be non-negative, got {}", p.launch_seconds));
        }
        Ok(p)
    }
}

/// Times ops on a device.
#[derive(Debug, Clone, PartialEq)]
pub struct CostModel {
    /// The device.
    pub device: DeviceProfile,
}

impl CostModel {
    fn time(&self, net: &Network, flops: f64, bytes: f64, matmul: bool) -> f64 {
        let d = &self.device;
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
