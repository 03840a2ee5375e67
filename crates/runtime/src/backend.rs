//! The backends pebble runs on, chosen at run time: burn-flex on the CPU, and burn-cuda
//! when built with the `cuda` feature. The CUDA backend loads the driver and compiles its
//! kernels with NVRTC when it starts, so the binary builds without CUDA installed.
//!
//! Code generic over the backend runs on the one a [`DeviceKind`] names through
//! [`run_on`]: callers (`pebble-train`) never name burn-flex or burn-cuda themselves, so
//! the `cuda` feature lives here alone.

use burn_backend::Backend;

/// burn-flex, on the CPU.
pub type Cpu = burn_flex::Flex;

/// burn-cuda, on an NVIDIA GPU.
#[cfg(feature = "cuda")]
pub type Gpu = burn_cuda::Cuda;

/// Whose temporary memory the ops hold on backend `B`: burn-flex's own allocations
/// (measured, `OpDecl::burn_flex_tmp`), or the kernels' declarations elsewhere (burn-cuda's
/// are not measured yet).
pub fn temporaries<B: Backend>() -> pebble_zoo::Temporaries {
    if std::any::TypeId::of::<B>() == std::any::TypeId::of::<Cpu>() {
        pebble_zoo::Temporaries::BurnFlex
    } else {
        pebble_zoo::Temporaries::Kernels
    }
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

/// Where to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceKind {
    /// The CPU.
    Cpu,
    /// The first CUDA device.
    Cuda,
}

/// Why a device cannot be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Unavailable {
    /// CUDA was asked for, and this binary was built without the `cuda` feature.
    #[error("this binary was built without the `cuda` feature (cargo build --features cuda)")]
    CudaNotBuilt,
    /// CUDA was asked for, and the driver library cannot be found on this machine.
    #[error("no CUDA driver (libcuda.so) found; run on a machine with an NVIDIA GPU")]
    NoCudaDriver,
}

/// Prepares measurement on `kind` (on CUDA, the device-memory probe), or says why the
/// device cannot be used.
pub fn prepare(kind: DeviceKind) -> Result<(), Unavailable> {
    match kind {
        DeviceKind::Cpu => {
            crate::memory::set_probe(None);
            crate::memory::set_thread_hook(None)
        }
        #[cfg(feature = "cuda")]
        DeviceKind::Cuda => {
            if !cuda_driver_present() {
                return Err(Unavailable::NoCudaDriver);
            }
            crate::memory::set_probe(Some(crate::cuda::bytes_in_use));
            crate::memory::set_thread_hook(Some(crate::cuda::register_stream))
        }
        #[cfg(not(feature = "cuda"))]
        DeviceKind::Cuda => return Err(Unavailable::CudaNotBuilt),
    }
    Ok(())
}

/// Work generic over the backend, for [`run_on`] (Rust has no generic closures).
pub trait OnBackend {
    /// What the work gives.
    type Output;
    /// Does the work on backend `B`, on `device`.
    fn run<B: Backend>(self, device: B::Device) -> Self::Output;
}

/// Runs `work` on the backend `kind` names, on its first device, after [`prepare`].
pub fn run_on<W: OnBackend>(kind: DeviceKind, work: W) -> Result<W::Output, Unavailable> {
    prepare(kind)?;
    match kind {
        DeviceKind::Cpu => Ok(work.run::<Cpu>(burn_flex::FlexDevice)),
        #[cfg(feature = "cuda")]
        DeviceKind::Cuda => Ok(work.run::<Gpu>(burn_cuda::CudaDevice::default())),
        #[cfg(not(feature = "cuda"))]
        DeviceKind::Cuda => Err(Unavailable::CudaNotBuilt),
    }
}
