//! [`train`](crate::train::train), [`bench::compare`](crate::bench::compare) and the
//! profiler's lowering on the backend a [`DeviceKind`] names, through the executor's
//! [`run_on`]: burn-flex on the CPU, burn-cuda with the `cuda` feature.

use pebble_runtime::backend::{run_on, OnBackend};
use pebble_runtime::{Backend, DeviceKind};
use pebble_zoo::ModelOptions;

use crate::bench::{self, BenchReport};
use crate::train::{self, Lowered, TrainConfig, TrainReport};
use crate::TrainError;

/// [`train::train`] on the chosen device.
pub fn train_on(kind: DeviceKind, config: &TrainConfig) -> Result<TrainReport, TrainError> {
    struct Work<'a>(&'a TrainConfig);
    impl OnBackend for Work<'_> {
        type Output = Result<TrainReport, TrainError>;
        fn run<B: Backend>(self, device: B::Device) -> Self::Output {
            train::train::<B>(self.0, device)
        }
    }
    run_on(kind, Work(config))?
}

/// Builds `name`, profiles its ops on the chosen device, and lowers it with the measured
/// costs ([`train::lower_profiled`]).
pub fn profile_on(kind: DeviceKind, name: &str, options: &ModelOptions, seed: u64) -> Result<Lowered, TrainError> {
    struct Work<'a> {
        name: &'a str,
        options: &'a ModelOptions,
        seed: u64,
    }
    impl OnBackend for Work<'_> {
        type Output = Result<Lowered, TrainError>;
        fn run<B: Backend>(self, device: B::Device) -> Self::Output {
            train::lower_profiled::<B>(self.name, self.options, self.seed, &device)
        }
    }
    run_on(kind, Work { name, options, seed })?
}

/// [`bench::compare`] on the chosen device.
pub fn bench_on(
    kind: DeviceKind,
    name: &str,
    options: &ModelOptions,
    steps: usize,
    seed: u64,
) -> Result<BenchReport, TrainError> {
    struct Work<'a> {
        name: &'a str,
        options: &'a ModelOptions,
        steps: usize,
        seed: u64,
    }
    impl OnBackend for Work<'_> {
        type Output = Result<BenchReport, TrainError>;
        fn run<B: Backend>(self, device: B::Device) -> Self::Output {
            bench::compare::<B>(self.name, self.options, self.steps, self.seed, device)
        }
    }
    run_on(kind, Work { name, options, steps, seed })?
}

/// [`pipeline::run`](crate::pipeline::run) on the chosen device: one pipelined step and
/// the same micro-batches on one device.
pub fn pipeline_on(
    kind: DeviceKind,
    config: &crate::pipeline::PipelineConfig,
) -> Result<crate::pipeline::PipelineReport, crate::pipeline::PipelineError> {
    struct Work<'a>(&'a crate::pipeline::PipelineConfig);
    impl OnBackend for Work<'_> {
        type Output = Result<crate::pipeline::PipelineReport, crate::pipeline::PipelineError>;
        fn run<B: Backend>(self, device: B::Device) -> Self::Output {
            crate::pipeline::run::<B>(self.0, device)
        }
    }
    run_on(kind, Work(config)).map_err(|e| crate::pipeline::PipelineError::Train(e.into()))?
}
