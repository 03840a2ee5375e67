//! pebble's machine model: the one description of the hardware that the simulator, the
//! solvers and the executor share.
//!
//! A [`Profile`] names a device and holds two things:
//! * its compute rates (matrix and vector FLOP/s, memory bandwidth, efficiency, launch
//!   cost), which only the zoo's roofline cost model reads;
//! * its [`Machine`]: device and host memory, the host link in each direction
//!   ([`Link`]: bandwidth and latency), the number of devices and their interconnect,
//!   the CPU's optimizer rate, and the [`RuntimeOverhead`] the executor needs beyond what
//!   a schedule holds.
//!
//! Profiles are built in (`v100`, `a100`, `h100`, `rtx3060`, with published figures) or
//! read from JSON ([`Profile::lookup`], [`Profile::from_json`]); a malformed file is a
//! [`ProfileError`] naming the field.
//!
//! ```
//! use pebble_machine::Profile;
//! let v100 = Profile::lookup("v100").unwrap();
//! assert_eq!(v100.machine.device_memory, 16 << 30);
//! // The solver plans in what the executor leaves of a budget, and a percentage budget
//! // is of what store-all needs to run, that reserve included.
//! let overhead = &v100.machine.runtime;
//! let budget = overhead.budget_for(1 << 30);
//! assert!(overhead.planned(budget) >= 1 << 30);
//! assert!(overhead.planned(budget - 1) < 1 << 30);
//! ```
#![deny(missing_docs)]
#![forbid(unsafe_code)]

use serde::{Deserialize, Serialize};
use thiserror::Error;

pub mod names;

/// One direction of a link: a transfer of `n` bytes takes `latency + n / bandwidth`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Link {
    /// Bytes per second (per time unit of the problem, for hand-written chains).
    pub bandwidth: f64,
    /// Seconds (time units) before the first byte arrives.
    #[serde(default)]
    pub latency: f64,
}

impl Link {
    /// A link of `bandwidth` and no latency.
    pub const fn with_bandwidth(bandwidth: f64) -> Link {
        Link { bandwidth, latency: 0.0 }
    }

    /// How long `bytes` take over this link.
    pub fn transfer_time(&self, bytes: f64) -> f64 {
        self.latency + bytes / self.bandwidth
    }
}

/// What the executor needs beyond the tensors a schedule names: the allocator's and
/// tensors' metadata, its own bookkeeping, the width of its integers. Every command plans
/// with it, so `plan`, `simulate` and `train` give one budget the same meaning.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuntimeOverhead {
    /// Bytes kept back from every budget.
    pub reserve_bytes: u64,
    /// Parts per ten thousand of the budget kept back on top (100 = 1%).
    pub reserve_per_10k: u64,
    /// Bytes of one integer element (token ids, labels): 4 for Burn's backends.
    pub int_bytes: u64,
}

impl RuntimeOverhead {
    /// No overhead: an abstract machine (hand-written chains and graphs); integers as
    /// wide as the executor's.
    pub const NONE: RuntimeOverhead = RuntimeOverhead { reserve_bytes: 0, reserve_per_10k: 0, int_bytes: 4 };

    /// pebble's executor on Burn: 64 KiB + 1% (measured at 35 KB on the CPU for the small
    /// test models, with room for the allocator on a GPU), 4-byte integers (`i32`, the
    /// `IntElem` of burn-flex and burn-cuda).
    pub const BURN: RuntimeOverhead = RuntimeOverhead { reserve_bytes: 64 << 10, reserve_per_10k: 100, int_bytes: 4 };

    /// The part of `budget` the executor keeps for itself.
    pub fn reserve(&self, budget: u64) -> u64 {
        let share = (budget as u128 * self.reserve_per_10k as u128 / 10_000) as u64;
        self.reserve_bytes.saturating_add(share)
    }

    /// The part of `budget` a solver may plan into.
    pub fn planned(&self, budget: u64) -> u64 {
        budget.saturating_sub(self.reserve(budget))
    }

    /// The least budget that leaves `planned` bytes to the solver (saturating at
    /// `u64::MAX`).
    pub fn budget_for(&self, planned: u64) -> u64 {
        if self.reserve_per_10k >= 10_000 {
            return u64::MAX;
        }
        // planned(b) is non-decreasing in b; start from the real-valued solution and step.
        let guess = (planned as u128 + self.reserve_bytes as u128) * 10_000 / (10_000 - self.reserve_per_10k as u128);
        let mut b = guess.min(u64::MAX as u128) as u64;
        while b > 0 && self.planned(b - 1) >= planned {
            b -= 1;
        }
        while self.planned(b) < planned {
            if b == u64::MAX {
                return u64::MAX;
            }
            b += 1;
        }
        b
    }
}

/// The hardware one training step runs on.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Machine {
    /// Memory of one device, bytes.
    pub device_memory: u64,
    /// Host memory available for offloaded tensors, bytes.
    pub host_memory: u64,
    /// Device → host (offloads).
    pub d2h: Link,
    /// Host → device (prefetches).
    pub h2d: Link,
    /// Number of devices.
    pub devices: u32,
    /// Device ↔ device, per direction, between two neighbouring devices.
    pub interconnect: Link,
    /// Bytes of parameters the CPU updates per second in an optimizer step (Adam), α_C in
    /// Zhao's OffMate.
    pub cpu_optimizer_rate: f64,
    /// Bytes of parameters the device updates per second in an optimizer step, α_G in
    /// Zhao's OffMate. `None` (the default): the update is not timed apart from the
    /// backward (as in the chain's `btime`). With a rate, a chain that names its weight
    /// gradients (`g`) charges `g[i] / rate` to each update fused into `B_i`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_optimizer_rate: Option<f64>,
    /// What the executor needs beyond the schedule.
    pub runtime: RuntimeOverhead,
}

impl Default for Machine {
    /// An abstract machine for hand-written problems: unlimited memory, one device, links
    /// of 16e9 bytes per time unit with no latency, no runtime overhead.
    fn default() -> Self {
        Machine {
            device_memory: u64::MAX,
            host_memory: u64::MAX,
            d2h: Link::with_bandwidth(16e9),
            h2d: Link::with_bandwidth(16e9),
            devices: 1,
            interconnect: Link::with_bandwidth(16e9),
            cpu_optimizer_rate: 1e9,
            gpu_optimizer_rate: None,
            runtime: RuntimeOverhead::NONE,
        }
    }
}

impl Machine {
    /// This machine with both host-link directions at `bandwidth` (`--bandwidth`).
    pub fn with_bandwidth(self, bandwidth: f64) -> Machine {
        Machine { d2h: Link { bandwidth, ..self.d2h }, h2d: Link { bandwidth, ..self.h2d }, ..self }
    }

    /// Checks every figure, naming the first bad field (`machine.d2h.bandwidth`).
    pub fn validate(&self) -> Result<(), ProfileError> {
        let bad = |field: &str, why: String| Err(ProfileError::Field { field: format!("machine.{field}"), why });
        for (field, link) in [("d2h", &self.d2h), ("h2d", &self.h2d), ("interconnect", &self.interconnect)] {
            if !(link.bandwidth.is_finite() && link.bandwidth > 0.0) {
                return bad(
                    &format!("{field}.bandwidth"),
                    format!("must be a positive number, got {}", link.bandwidth),
                );
            }
            if !(link.latency.is_finite() && link.latency >= 0.0) {
                return bad(&format!("{field}.latency"), format!("must be non-negative, got {}", link.latency));
            }
        }
        if self.device_memory == 0 {
            return bad("device_memory", "must be positive".into());
        }
        if self.devices == 0 {
            return bad("devices", "must be at least 1".into());
        }
        if !(self.cpu_optimizer_rate.is_finite() && self.cpu_optimizer_rate > 0.0) {
            return bad("cpu_optimizer_rate", format!("must be a positive number, got {}", self.cpu_optimizer_rate));
        }
        if let Some(rate) = self.gpu_optimizer_rate {
            if !(rate.is_finite() && rate > 0.0) {
                return bad("gpu_optimizer_rate", format!("must be a positive number, got {rate}"));
            }
        }
        if self.runtime.reserve_per_10k >= 10_000 {
            return bad(
                "runtime.reserve_per_10k",
                format!("must be below 10000, got {}", self.runtime.reserve_per_10k),
            );
        }
        if !matches!(self.runtime.int_bytes, 1 | 2 | 4 | 8) {
            return bad("runtime.int_bytes", format!("must be 1, 2, 4 or 8, got {}", self.runtime.int_bytes));
        }
        Ok(())
    }
}

/// A named device: its compute rates (for the roofline cost model) and its [`Machine`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Profile {
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
    /// Fraction of peak rates actually reached.
    pub efficiency: f64,
    /// Fixed cost of launching an op, seconds.
    pub launch_seconds: f64,
    /// Memory, links, devices, CPU and runtime overhead.
    pub machine: Machine,
}

/// Why a profile could not be read.
#[derive(Debug, Error, Clone, PartialEq)]
#[non_exhaustive]
pub enum ProfileError {
    /// No built-in profile has this name and no such file exists.
    #[error("unknown device profile `{name}` (built-in: {known}; or a JSON file){}", names::did_you_mean(.name, .known.split(", ")))]
    Unknown {
        /// The name asked for.
        name: String,
        /// The built-in names, comma-separated.
        known: String,
    },
    /// The file could not be read.
    #[error("cannot read `{path}`: {why}")]
    Read {
        /// The path.
        path: String,
        /// The I/O error.
        why: String,
    },
    /// The text is not a JSON profile at all (bad syntax, cut short, not an object), or
    /// lacks a top-level field (named in `why`).
    #[error("not a JSON device profile: {why}")]
    Malformed {
        /// What the parser found.
        why: String,
    },
    /// A field is missing, malformed or out of range.
    #[error("field `{field}`: {why}")]
    Field {
        /// The field's path, e.g. `machine.h2d.bandwidth`.
        field: String,
        /// What is wrong with it.
        why: String,
    },
}

/// The JSON form: today's (`machine`), or the flat form of earlier releases
/// (`link_bandwidth`, `memory_bytes`), read into today's with the other figures defaulted
/// from the abstract machine.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ProfileFile {
    name: String,
    matmul_flops_f32: f64,
    matmul_flops_bf16: f64,
    vector_flops: f64,
    memory_bandwidth: f64,
    efficiency: f64,
    launch_seconds: f64,
    #[serde(default)]
    machine: Option<Machine>,
    #[serde(default)]
    link_bandwidth: Option<f64>,
    #[serde(default)]
    memory_bytes: Option<u64>,
}

const GIB: u64 = 1 << 30;

impl Profile {
    /// The built-in profiles. Sources of each figure are in the comments.
    pub fn builtin() -> Vec<Profile> {
        #[allow(clippy::too_many_arguments)]
        let p = |name: &str, f32_: f64, bf16: f64, bw: f64, machine: Machine| Profile {
            name: name.into(),
            matmul_flops_f32: f32_,
            matmul_flops_bf16: bf16,
            vector_flops: f32_,
            memory_bandwidth: bw,
            efficiency: 0.7,
            launch_seconds: 5e-6,
            machine,
        };
        let pcie = |bandwidth: f64| Link { bandwidth, latency: 10e-6 };
        vec![
            // Tesla V100 (16 GB): 15.7 TFLOP/s FP32, 125 TFLOP/s FP16 tensor cores, 900 GB/s.
            // PCIe 3.0 x16: 12 GB/s each way, as Shilova's Ch. 4 and the weight-offloading
            // paper measure. DGX-1: 8 GPUs, NVLink 2 (25 GB/s per link and direction),
            // 512 GB of host memory. CPU Adam: 1.1 GB/s of parameters (OffMate's α_C).
            p(
                "v100",
                15.7e12,
                125e12,
                900e9,
                Machine {
                    device_memory: 16 * GIB,
                    host_memory: 512 * GIB,
                    d2h: pcie(12e9),
                    h2d: pcie(12e9),
                    devices: 8,
                    interconnect: Link { bandwidth: 25e9, latency: 5e-6 },
                    cpu_optimizer_rate: 1.1e9,
                    gpu_optimizer_rate: None,
                    runtime: RuntimeOverhead::BURN,
                },
            ),
            // A100 (40 GB): 19.5 TFLOP/s FP32, 312 TFLOP/s BF16, 1.555 TB/s. PCIe 4.0 x16:
            // 24 GB/s each way in practice. DGX A100: 8 GPUs, NVLink 3 over NVSwitch
            // (300 GB/s per direction), 1 TB of host memory.
            p(
                "a100",
                19.5e12,
                312e12,
                1.555e12,
                Machine {
                    device_memory: 40 * GIB,
                    host_memory: 1024 * GIB,
                    d2h: pcie(24e9),
                    h2d: pcie(24e9),
                    devices: 8,
                    interconnect: Link { bandwidth: 300e9, latency: 5e-6 },
                    cpu_optimizer_rate: 1.1e9,
                    gpu_optimizer_rate: None,
                    runtime: RuntimeOverhead::BURN,
                },
            ),
            // H100 SXM (80 GB): 67 TFLOP/s FP32, 989 TFLOP/s BF16 dense, 3.35 TB/s. PCIe 5.0
            // x16: 50 GB/s each way in practice. DGX H100: 8 GPUs, NVLink 4 (450 GB/s per
            // direction), 2 TB of host memory.
            p(
                "h100",
                67e12,
                989e12,
                3.35e12,
                Machine {
                    device_memory: 80 * GIB,
                    host_memory: 2048 * GIB,
                    d2h: pcie(50e9),
                    h2d: pcie(50e9),
                    devices: 8,
                    interconnect: Link { bandwidth: 450e9, latency: 5e-6 },
                    cpu_optimizer_rate: 1.1e9,
                    gpu_optimizer_rate: None,
                    runtime: RuntimeOverhead::BURN,
                },
            ),
            // GeForce RTX 3060 (12 GB): 12.7 TFLOP/s FP32, ~51 TFLOP/s BF16, 360 GB/s. Zhao's
            // OffMate machine (Table 4.2): one GPU, 10.4 GB/s measured each way, an
            // i3-10105F with 128 GB, CPU Adam at 1.1 GB/s, GPU Adam at 16.6 GB/s (α_G). No peer link: PCIe through the host.
            p(
                "rtx3060",
                12.7e12,
                51e12,
                360e9,
                Machine {
                    device_memory: 12 * GIB,
                    host_memory: 128 * GIB,
                    d2h: pcie(10.4e9),
                    h2d: pcie(10.4e9),
                    devices: 1,
                    interconnect: pcie(10.4e9),
                    cpu_optimizer_rate: 1.1e9,
                    gpu_optimizer_rate: Some(16.6e9),
                    runtime: RuntimeOverhead::BURN,
                },
            ),
        ]
    }

    /// The built-in profiles' names, comma-separated.
    pub fn builtin_names() -> String {
        Self::builtin().into_iter().map(|p| p.name).collect::<Vec<_>>().join(", ")
    }

    /// A built-in profile by name, or a JSON file's profile if `name` is a path.
    pub fn lookup(name: &str) -> Result<Profile, ProfileError> {
        if let Some(p) = Self::builtin().into_iter().find(|p| p.name == name) {
            return Ok(p);
        }
        if name.ends_with(".json") || std::path::Path::new(name).exists() {
            let text = std::fs::read_to_string(name)
                .map_err(|e| ProfileError::Read { path: name.to_string(), why: e.to_string() })?;
            return Self::from_json(&text);
        }
        Err(ProfileError::Unknown { name: name.to_string(), known: Self::builtin_names() })
    }

    /// Reads a profile from JSON, rejecting non-positive rates.
    pub fn from_json(text: &str) -> Result<Profile, ProfileError> {
        let de = &mut serde_json::Deserializer::from_str(text);
        let f: ProfileFile = serde_path_to_error::deserialize(de).map_err(|e| {
            let field = e.path().to_string();
            let e = e.into_inner();
            match e.classify() {
                serde_json::error::Category::Data if field != "." && !field.starts_with('[') => {
                    ProfileError::Field { field, why: e.to_string() }
                }
                _ => ProfileError::Malformed { why: e.to_string() },
            }
        })?;
        let field = |field: &str, why: String| ProfileError::Field { field: field.into(), why };
        let machine = match (f.machine, f.link_bandwidth, f.memory_bytes) {
            (Some(m), None, None) => m,
            (Some(_), _, _) => {
                return Err(field(
                    "link_bandwidth",
                    "give the link in `machine.d2h` and `machine.h2d`, and memory in `machine.device_memory`, not both forms"
                        .into(),
                ))
            }
            (None, link, memory) => {
                let base = Machine { runtime: RuntimeOverhead::BURN, ..Machine::default() };
                let base = match link {
                    Some(b) => base.with_bandwidth(b),
                    None => base,
                };
                Machine { device_memory: memory.unwrap_or(base.device_memory), interconnect: base.h2d, ..base }
            }
        };
        // Rates below a million per second would time a model's ops beyond what a chain
        // or graph holds (1e15 s); no device or CPU core is that slow.
        for (name, v) in [
            ("matmul_flops_f32", f.matmul_flops_f32),
            ("matmul_flops_bf16", f.matmul_flops_bf16),
            ("vector_flops", f.vector_flops),
            ("memory_bandwidth", f.memory_bandwidth),
        ] {
            if !(v.is_finite() && v >= 1e6) {
                return Err(field(name, format!("must be a number of at least 1e6 per second, got {v:?}")));
            }
        }
        if !(f.efficiency.is_finite() && f.efficiency > 0.0 && f.efficiency <= 1.0) {
            return Err(field(
                "efficiency",
                format!("must be a fraction of the peak in (0, 1], got {:?}", f.efficiency),
            ));
        }
        if !(f.launch_seconds.is_finite() && (0.0..=1.0).contains(&f.launch_seconds)) {
            return Err(field("launch_seconds", format!("must be between 0 and 1 s, got {:?}", f.launch_seconds)));
        }
        machine.validate()?;
        Ok(Profile {
            name: f.name,
            matmul_flops_f32: f.matmul_flops_f32,
            matmul_flops_bf16: f.matmul_flops_bf16,
            vector_flops: f.vector_flops,
            memory_bandwidth: f.memory_bandwidth,
            efficiency: f.efficiency,
            launch_seconds: f.launch_seconds,
            machine,
        })
    }

    /// The profile as JSON, in the form [`Profile::from_json`] reads.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a profile serializes")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtins_round_trip_and_validate() {
        for p in Profile::builtin() {
            p.machine.validate().unwrap();
            assert_eq!(Profile::from_json(&p.to_json()).unwrap(), p, "{}", p.name);
        }
    }

    #[test]
    fn published_figures() {
        let v100 = Profile::lookup("v100").unwrap().machine;
        assert_eq!((v100.d2h.bandwidth, v100.h2d.bandwidth), (12e9, 12e9));
        assert_eq!(v100.devices, 8);
        let rtx = Profile::lookup("rtx3060").unwrap().machine;
        assert_eq!((rtx.h2d.bandwidth, rtx.cpu_optimizer_rate, rtx.devices), (10.4e9, 1.1e9, 1));
        assert_eq!(rtx.host_memory, 128 << 30);
    }

    #[test]
    fn reserve_and_budget_for_are_inverse() {
        let o = RuntimeOverhead::BURN;
        assert_eq!(o.reserve(0), 65536);
        assert_eq!(o.reserve(1_000_000), 65536 + 10_000);
        assert_eq!(o.planned(1_000), 0);
        for planned in [0u64, 1, 99, 12345, 1 << 20, 1_475_671_988, 1 << 40, u64::MAX / 2] {
            let b = o.budget_for(planned);
            assert!(o.planned(b) >= planned, "{planned}");
            assert!(b == 0 || o.planned(b - 1) < planned, "{planned}: {b} is not the least");
        }
        assert_eq!(RuntimeOverhead::NONE.budget_for(777), 777);
        assert_eq!(o.budget_for(u64::MAX), u64::MAX);
    }

    #[test]
    fn transfer_time_adds_latency() {
        let l = Link { bandwidth: 10.0, latency: 0.5 };
        assert_eq!(l.transfer_time(20.0), 2.5);
    }

    #[test]
    fn errors_name_the_field() {
        let v100 = Profile::lookup("v100").unwrap().to_json();
        let bad = v100.replace("\"devices\": 8", "\"devices\": 0");
        assert_eq!(
            Profile::from_json(&bad),
            Err(ProfileError::Field { field: "machine.devices".into(), why: "must be at least 1".into() })
        );
        let bad = v100.replace("\"bandwidth\": 12000000000.0", "\"bandwidth\": -1.0");
        assert!(
            matches!(Profile::from_json(&bad), Err(ProfileError::Field { field, .. }) if field == "machine.d2h.bandwidth")
        );
        let bad = v100.replace("\"devices\"", "\"gpus\"");
        let err = Profile::from_json(&bad).unwrap_err().to_string();
        assert!(err.contains("gpus"), "{err}");
        assert!(matches!(Profile::lookup("tpu"), Err(ProfileError::Unknown { .. })));
    }

    #[test]
    fn text_that_is_no_profile_is_called_so() {
        // A TOML file, a cut-short one, an array, and an object without the fields: no
        // field to blame (the parser's path would read `[0]` or `.`).
        for text in ["[device]\nmemory = 1\n", "{\"name\": \"x\"", "[1, 2]", "{}"] {
            let err = Profile::from_json(text).unwrap_err();
            assert!(matches!(err, ProfileError::Malformed { .. }), "{text}: {err:?}");
            assert!(err.to_string().starts_with("not a JSON device profile: "), "{err}");
        }
        assert!(Profile::from_json("{}").unwrap_err().to_string().contains("missing field `name`"));
        // A field inside is still named.
        let v100 = Profile::lookup("v100").unwrap().to_json();
        let bad = v100.replace("\"efficiency\": 0.7", "\"efficiency\": \"high\"");
        assert!(matches!(Profile::from_json(&bad), Err(ProfileError::Field { field, .. }) if field == "efficiency"));
    }

    /// Rates that would time a model's ops beyond what a chain holds, and an efficiency
    /// above the peak, are refused by name (they used to surface as a zoo graph error).
    #[test]
    fn absurd_rates_name_the_field() {
        let text = |field: &str, value: &str| {
            let mut v: serde_json::Value = serde_json::from_str(
                r#"{"name":"x","matmul_flops_f32":1e12,"matmul_flops_bf16":2e12,"vector_flops":1e12,
                "memory_bandwidth":1e11,"efficiency":0.5,"launch_seconds":0.0}"#,
            )
            .unwrap();
            v[field] = serde_json::from_str(value).unwrap();
            v.to_string()
        };
        for (field, value) in [
            ("matmul_flops_f32", "1e-300"),
            ("vector_flops", "999999"),
            ("memory_bandwidth", "0"),
            ("efficiency", "1.5"),
            ("efficiency", "0"),
            ("launch_seconds", "2"),
        ] {
            let err = Profile::from_json(&text(field, value)).unwrap_err();
            assert!(matches!(&err, ProfileError::Field { field: f, .. } if f == field), "{field} = {value}: {err}");
        }
        for (field, value) in [("vector_flops", "1e6"), ("efficiency", "1"), ("launch_seconds", "1")] {
            assert!(Profile::from_json(&text(field, value)).is_ok(), "{field} = {value}");
        }
    }

    #[test]
    fn legacy_flat_profiles_still_read() {
        let text = r#"{"name":"old","matmul_flops_f32":1e12,"matmul_flops_bf16":2e12,"vector_flops":1e12,
            "memory_bandwidth":1e11,"link_bandwidth":8e9,"memory_bytes":1073741824,"efficiency":0.5,
            "launch_seconds":0.0}"#;
        let p = Profile::from_json(text).unwrap();
        assert_eq!((p.machine.d2h.bandwidth, p.machine.h2d.bandwidth), (8e9, 8e9));
        assert_eq!(p.machine.device_memory, 1 << 30);
        assert_eq!(p.machine.runtime, RuntimeOverhead::BURN);
    }
}
