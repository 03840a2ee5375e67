//! The backends pebble runs on, chosen at run time: burn-flex on the CPU, and burn-cuda
//! when built with the `cuda` feature. The CUDA backend loads the driver and compiles its
//! kernels with NVRTC when it starts, so the binary builds without CUDA installed.

use pebble_zoo::ModelOptions;

use crate::train::{self, Lowered, TrainConfig, TrainError, TrainReport};

/// burn-flex, on the CPU.
pub type Cpu = burn_flex::Flex;

/// burn-cuda, on an NVIDIA GPU.
#[cfg(feature = "cuda")]
pub type Gpu = burn_cuda::Cuda;

/// Device memory in use on the first CUDA device, as CubeCL's memory manager reports it.
#[cfg(feature = "cuda")]
fn cuda_bytes_in_use() -> u64 {
    use cubecl::Runtime;
    let client = cubecl::cuda::CudaRuntime::client(&burn_cuda::CudaDevice::default());
    client.memory_usage().map(|u| u.bytes_in_use).unwrap_or(0)
}

/// Whether the CUDA driver library can be found where the loader looks for it. Burn's
/// CUDA backend panics in a worker thread when it cannot load it, so we ask first.
pub fn cuda_driver_present() -> bool {
    let mut dirs: Vec<std::path::PathBuf> =
        std::env::var_os("LD_LIBRARY_PATH").map(|v| std::env::split_paths(&v).collect()).unwrap_or_default();
    for d in [
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib64",
        "/usr/lib",
        "/usr/local/nvidia/lib64",
        "/usr/local/cuda/lib64",
        "/usr/lib/wsl/lib",
    ] {
        dirs.push(d.into());
    }
    let names = ["libcuda.so.1", "libcuda.so", "libnvcuda.so"];
    dirs.iter().any(|d| names.iter().any(|n| d.join(n).exists()))
        || std::process::Command::new("ldconfig")
            .arg("-p")
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).contains("libcuda.so"))
            .unwrap_or(false)
}

/// Prepares measurement on `kind`: on CUDA, the device-memory probe.
fn setup(kind: DeviceKind) -> Result<(), TrainError> {
    if kind == DeviceKind::Cuda && cfg!(feature = "cuda") && !cuda_driver_present() {
        return Err(TrainError::Input(
            "--device cuda: no CUDA driver (libcuda.so) found; run on a machine with an NVIDIA GPU".into(),
        ));
    }
    match kind {
        DeviceKind::Cpu => crate::memory::set_probe(None),
        #[cfg(feature = "cuda")]
        DeviceKind::Cuda => crate::memory::set_probe(Some(cuda_bytes_in_use)),
        #[cfg(not(feature = "cuda"))]
        DeviceKind::Cuda => {}
    }
    Ok(())
}

/// Where to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceKind {
    /// The CPU.
    Cpu,
    /// The first CUDA device.
    Cuda,
}

#[cfg(not(feature = "cuda"))]
fn no_cuda() -> TrainError {
    TrainError::Input(
        "--device cuda: this binary was built without the `cuda` feature (cargo build --features cuda)".into(),
    )
}

/// [`train::train`] on the chosen device.
pub fn train_on(kind: DeviceKind, config: &TrainConfig) -> Result<TrainReport, TrainError> {
    setup(kind)?;
    match kind {
        DeviceKind::Cpu => train::train::<Cpu>(config, burn_flex::FlexDevice),
        #[cfg(feature = "cuda")]
        DeviceKind::Cuda => train::train::<Gpu>(config, burn_cuda::CudaDevice::default()),
        #[cfg(not(feature = "cuda"))]
        DeviceKind::Cuda => Err(no_cuda()),
    }
}

/// Builds `name`, profiles its ops on the chosen device, and lowers it with the measured costs.
pub fn profile_on(kind: DeviceKind, name: &str, options: &ModelOptions, seed: u64) -> Result<Lowered, TrainError> {
    setup(kind)?;
    fn go<B: burn_backend::Backend>(
        name: &str,
        options: &ModelOptions,
        seed: u64,
        device: B::Device,
    ) -> Result<Lowered, TrainError> {
        let first = train::lower::<B>(name, options, None)?;
        let profile = crate::profile::profile::<B>(&first.network, &device, seed)?;
        train::lower::<B>(name, options, Some(&profile))
    }
    match kind {
        DeviceKind::Cpu => go::<Cpu>(name, options, seed, burn_flex::FlexDevice),
        #[cfg(feature = "cuda")]
        DeviceKind::Cuda => go::<Gpu>(name, options, seed, burn_cuda::CudaDevice::default()),
        #[cfg(not(feature = "cuda"))]
        DeviceKind::Cuda => Err(no_cuda()),
    }
}

/// [`bench::compare`](crate::bench::compare) on the chosen device.
pub fn bench_on(
    kind: DeviceKind,
    name: &str,
    options: &ModelOptions,
    steps: usize,
    seed: u64,
) -> Result<crate::bench::BenchReport, TrainError> {
    setup(kind)?;
    match kind {
        DeviceKind::Cpu => crate::bench::compare::<Cpu>(name, options, steps, seed, burn_flex::FlexDevice),
        #[cfg(feature = "cuda")]
        DeviceKind::Cuda => crate::bench::compare::<Gpu>(name, options, steps, seed, burn_cuda::CudaDevice::default()),
        #[cfg(not(feature = "cuda"))]
        DeviceKind::Cuda => Err(no_cuda()),
    }
}
