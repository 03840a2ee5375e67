//! `pebble simulate`: a schedule file through the simulator.

use std::process::ExitCode;

use pebble_schedule::View;
use pebble_sim::SimConfig;
use serde_json::json;

use super::percent_of;
use crate::error::bad;
use crate::flags::{SimulateArgs, ViewArg};
use crate::out;
use crate::plot;
use crate::source::{read_schedule, view_name, Source};

pub fn run(args: &SimulateArgs) -> anyhow::Result<ExitCode> {
    if args.view.is_some() && args.source.model_source().is_none() {
        return Err(bad("--view needs --model or --onnx: a chain or graph file has its own view"));
    }
    let schedule = read_schedule(&args.schedule)?;
    let source = Source::load(&args.source, &args.opts)?;
    let units = source.units();
    let view = match args.view {
        Some(ViewArg::Chain) => View::Chain,
        Some(ViewArg::Graph) => View::Graph,
        None => schedule.view,
    };
    let subject = source.view(view)?;
    let bandwidth = args.bandwidth.unwrap_or_else(|| source.default_bandwidth());
    let budget = match args.budget {
        Some(spec) => Some(spec.resolve(subject.store_all(bandwidth)?.peak_bytes)),
        None => None,
    };
    let config = SimConfig { budget, bandwidth, timeline: args.timeline.is_some() };
    let report = match pebble_solve::simulate(subject.problem(), &schedule, &config) {
        Ok(r) => r,
        Err(e) => {
            let message = format!("invalid schedule `{}`: {e}", args.schedule.display());
            if args.json {
                out::print_json(&json!({
                    "valid": false,
                    "view": view_name(view),
                    "budget_bytes": budget,
                    "error": e.to_string(),
                }))?;
            }
            return Err(anyhow::anyhow!(message));
        }
    };
    if let Some(path) = &args.timeline {
        let title =
            format!("device memory: {} on {}", schedule.solver.as_deref().unwrap_or("schedule"), source.label());
        plot::timeline(path, &title, &report.timeline, report.makespan, budget, units)?;
    }
    if args.json {
        out::print_json(&json!({
            "valid": true,
            "view": view_name(view),
            "solver": schedule.solver,
            "budget_bytes": budget,
            "makespan": report.makespan,
            "compute_time": report.compute_time,
            "peak_bytes": report.peak_bytes,
            "peak_host_bytes": report.peak_host_bytes,
            "compute_ops": report.compute_ops,
            "ops": schedule.ops.len(),
        }))?;
        return Ok(ExitCode::SUCCESS);
    }
    let mut text = format!(
        "valid     {} ops ({} compute) on the {} view of {}\n\
         makespan  {} (compute {})\n\
         peak      {}\n\
         host peak {}\n",
        schedule.ops.len(),
        report.compute_ops,
        view_name(view),
        source.label(),
        units.time(report.makespan),
        units.time(report.compute_time),
        units.size(report.peak_bytes),
        units.size(report.peak_host_bytes),
    );
    if let Some(b) = budget {
        text.push_str(&format!("budget    {} (peak is {} of it)\n", units.size(b), percent_of(report.peak_bytes, b)));
    }
    if let Some(path) = &args.timeline {
        text.push_str(&format!("timeline written to {}\n", path.display()));
    }
    out::print(&text)?;
    Ok(ExitCode::SUCCESS)
}
