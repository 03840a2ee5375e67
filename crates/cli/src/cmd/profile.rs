//! `pebble profile`: measure every op of a zoo model on a device and write its training
//! graph (or chain) with the measured times and temporary memory, for `pebble plan
//! --graph FILE` (or `--chain FILE`) to plan on reality.

use std::process::ExitCode;

use pebble_zoo::Optimizer;

use super::train::{lift, run_target};
use crate::flags::{OptimizerArg, ProfileArgs, ViewArg};
use crate::out;

pub fn run(args: &ProfileArgs) -> anyhow::Result<ExitCode> {
    if let Some(path) = &args.output {
        crate::source::check_new_file(path, "--output", args.force)?;
    }
    let (device, mut options) = run_target(&args.model)?;
    options.optimizer = match args.optimizer {
        Some(OptimizerArg::Sgd) => Optimizer::Sgd,
        Some(OptimizerArg::Momentum) => Optimizer::Momentum,
        Some(OptimizerArg::Adam) | None => Optimizer::Adam,
    };
    let lowered = pebble_train::profile_on(device, &args.model.model, &options, args.model.seed).map_err(lift)?;
    let mut text = match args.view {
        ViewArg::Graph => lowered.graph.to_json(),
        ViewArg::Chain => lowered.chain.to_json(),
    };
    text.push('\n');
    match &args.output {
        Some(path) => crate::source::write_new_file(path, "--output", &text, args.force)?,
        None => out::print(&text)?,
    }
    Ok(ExitCode::SUCCESS)
}
