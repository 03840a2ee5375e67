//! `pebble graph`: a model's chain or training graph as JSON.

use std::process::ExitCode;

use crate::flags::{GraphArgs, ViewArg};
use crate::out;
use crate::source::load_model;

pub fn run(args: &GraphArgs) -> anyhow::Result<ExitCode> {
    if let Some(path) = &args.output {
        crate::source::check_new_file(path, "--output", args.force)?;
    }
    let (model, _) = load_model(args.model.model_source(), &args.opts)?;
    let mut text = match args.view {
        ViewArg::Chain => model.chain.to_json(),
        ViewArg::Graph => model.graph.to_json(),
    };
    text.push('\n');
    match &args.output {
        Some(path) => crate::source::write_new_file(path, "--output", &text, args.force)?,
        None => out::print(&text)?,
    }
    Ok(ExitCode::SUCCESS)
}
