//! `pebble simulate`: a schedule file through the simulator.

use std::process::ExitCode;

use pebble_schedule::View;
use pebble_sim::SimConfig;
use serde_json::json;

use super::{check_timeline, percent_of, resolve_budget, timeline_bars};
use crate::error::bad;
use crate::flags::{SimulateArgs, ViewArg};
use crate::out;
use crate::plot;
use crate::source::{read_schedule, view_name, Source};

pub fn run(args: &SimulateArgs) -> anyhow::Result<ExitCode> {
    if args.view.is_some() && args.source.model_source().is_none() {
        return Err(bad("--view needs --model or --onnx: a chain or graph file has its own view"));
    }
    check_timeline(&args.timeline)?;
    let schedule = read_schedule(&args.schedule)?;
    if schedule.view == View::Pipeline {
        return pipeline(args, &schedule);
    }
    let (source, machine) = Source::load(&args.source, &args.opts)?;
    let machine = match args.bandwidth {
        Some(b) => machine.with_bandwidth(b),
        None => machine,
    };
    let units = source.units();
    let view = match args.view {
        Some(ViewArg::Chain) => View::Chain,
        Some(ViewArg::Graph) => View::Graph,
        None => schedule.view,
    };
    let subject = source.view(view)?;
    // The budget means what it means in `plan` and `train`: the schedule is checked
    // against the share solvers plan in.
    let resolved = match args.budget.given() {
        Some(flags) => {
            let store_all = subject.store_all(&machine)?;
            Some(resolve_budget(&flags, store_all.peak_bytes, source.param_state_bytes(&subject), &machine)?)
        }
        None => None,
    };
    let budget = resolved.map(|b| b.planned_bytes);
    let config = SimConfig {
        budget,
        machine,
        timeline: args.timeline.timeline.is_some(),
        allocator: args.allocator.config(),
        ..SimConfig::default()
    };
    let report = match pebble_solve::simulate(subject.problem(), &schedule, &config) {
        Ok(r) => r,
        Err(e) => {
            let mut message = format!("invalid schedule `{}`: {e}", args.schedule.display());
            let here = source.describe(&subject);
            if let Some(planned) = schedule.planned_for.as_ref().filter(|&p| *p != here) {
                message.push_str(&format!("\n(it was planned for {planned}; this is {here})"));
            }
            if args.json {
                out::print_json(&json!({
                    "valid": false,
                    "view": view_name(view),
                    "budget_bytes": resolved.map(|b| b.total_bytes),
                    "planned_bytes": budget,
                    "error": e.to_string(),
                }))?;
            }
            return Err(anyhow::anyhow!(message));
        }
    };
    if let Some(path) = &args.timeline.timeline {
        let budget_text = match resolved {
            Some(b) if b.reserve_bytes > 0 => {
                format!("budget {} ({} planned)", units.size(b.total_bytes), units.size(b.planned_bytes))
            }
            Some(b) => format!("budget {}", units.size(b.total_bytes)),
            None => "no budget".to_string(),
        };
        let chart = plot::Timeline {
            title: format!("{} on {}, {budget_text}", schedule.solver.as_deref().unwrap_or("schedule"), source.label()),
            units,
            bars: timeline_bars(subject.problem(), &schedule, &report.spans),
            moves: schedule.moves(),
            report: &report,
            budget: resolved.map(|b| {
                let line = if b.reserve_bytes > 0 { "budget (the share solvers plan in)" } else { "budget" };
                (b.planned_bytes, line.to_string())
            }),
        };
        plot::timeline(path, args.timeline.force, &chart)?;
    }
    if args.json {
        out::print_json(&json!({
            "valid": true,
            "view": view_name(view),
            "solver": schedule.solver,
            "budget_bytes": resolved.map(|b| b.total_bytes),
            "planned_bytes": budget,
            "makespan": report.makespan,
            "compute_time": report.compute_time,
            "peak_bytes": report.peak_bytes,
            "peak_host_bytes": report.peak_host_bytes,
            "d2h_busy": report.d2h_busy,
            "h2d_busy": report.h2d_busy,
            "cpu_busy": report.cpu_busy,
            "compute_stall": report.compute_stall,
            "compute_ops": report.compute_ops,
            "ops": schedule.ops.len(),
            "periodic": schedule.periodic,
            "periods_simulated": report.periods,
            "moves": schedule.moves(),
            "allocator": report.allocator,
        }))?;
        return Ok(ExitCode::SUCCESS);
    }
    let mut text = format!(
        "valid     {} ops ({} compute) on the {} view of {}\n\
         makespan  {} (compute {})\n\
         peak      {}\n\
         host peak {}\n\
         links     busy {} to the host, {} back; compute stalled {}\n",
        schedule.ops.len(),
        report.compute_ops,
        view_name(view),
        source.label(),
        units.time(report.makespan),
        units.time(report.compute_time),
        units.size(report.peak_bytes),
        units.size(report.peak_host_bytes),
        units.time(report.d2h_busy),
        units.time(report.h2d_busy),
        units.time(report.compute_stall),
    );
    if report.cpu_busy > 0.0 {
        text.push_str(&format!("cpu       optimizer steps on the host CPU busy {}\n", units.time(report.cpu_busy)));
    }
    text.push_str(&super::allocator_text(&report, units));
    if schedule.periodic {
        text.push_str(&format!(
            "periodic  the makespan is the steady-state period, after {} periods simulated; the times are per period\n",
            report.periods
        ));
    }
    if let Some(b) = resolved {
        text.push_str(&format!(
            "budget    {} ({} planned, {} kept by the runtime; peak is {} of the planned share)\n",
            units.size(b.total_bytes),
            units.size(b.planned_bytes),
            units.size(b.reserve_bytes),
            percent_of(report.peak_bytes, b.planned_bytes)
        ));
    }
    if let Some(path) = &args.timeline.timeline {
        text.push_str(&format!("timeline written to {}\n", path.display()));
    }
    out::print(&text)?;
    Ok(ExitCode::SUCCESS)
}

/// A pipeline schedule (as `pebble pipeline --export pebble` writes it) through the
/// pipeline simulator: `--budget` is then each device's memory in bytes, `--bandwidth`
/// the link between two devices (default: the profile's interconnect for a model, free
/// for a file), and `--timeline` draws its Gantt chart.
fn pipeline(args: &SimulateArgs, schedule: &pebble_schedule::Schedule) -> anyhow::Result<ExitCode> {
    use pebble_graph::units::BudgetSpec;
    if args.budget.activation_budget.is_some() {
        return Err(bad("--activation-budget: a pipeline schedule takes each device's memory as --budget SIZE"));
    }
    let memory = match args.budget.budget {
        None => None,
        Some(BudgetSpec::Bytes(b)) => Some(b),
        Some(_) => {
            return Err(bad("--budget: give each device's memory as a size for a pipeline schedule, not a percentage"))
        }
    };
    let source = super::pipeline::PipelineSource::load(&args.source, &args.opts)?;
    let config = pebble_sim::PipeConfig::new(source.bandwidth(args.bandwidth)?, memory);
    let report = pebble_sim::simulate_pipeline(&source.layers, schedule, &config)
        .map_err(|e| anyhow::anyhow!("invalid schedule `{}`: {e}", args.schedule.display()))?;
    if let Some(path) = &args.timeline.timeline {
        let title = format!("{} on {}", schedule.solver.as_deref().unwrap_or("schedule"), source.label);
        let svg = crate::gantt::render(&title, schedule, &report).map_err(|e| anyhow::anyhow!("--timeline: {e}"))?;
        crate::source::write_new_file(path, "--timeline", &svg, args.timeline.force)?;
    }
    if args.json {
        out::print_json(&json!({
            "valid": true,
            "view": "pipeline",
            "period": report.period,
            "throughput": report.throughput,
            "step_time": report.step_time,
            "bubble": report.bubble,
            "peak_bytes_per_device": report.peak_bytes_per_device,
            "busy_per_device": report.busy_per_device,
            "link_busy": report.link_busy,
        }))?;
    } else {
        out::print(&format!(
            "valid pipeline schedule: period {} per micro-batch, bubble {:.1}%, peaks {:?}\n",
            crate::source::significant(report.period),
            100.0 * report.bubble,
            report.peak_bytes_per_device
        ))?;
    }
    Ok(ExitCode::SUCCESS)
}
