//! `pebble pipeline`: plan pipelined model parallelism with one solver, score the plan in
//! the pipeline simulator, and report the period, the throughput, the allocation, the
//! peak per device and the bubble; optionally draw its Gantt chart and export it.

use std::process::ExitCode;

use pebble_graph::Layers;
use pebble_schedule::View;
use pebble_solve::pipeline::{pipe_solver, plan_pipeline, PipeError, PipeProblem};
use serde_json::json;

use crate::error::bad;
use crate::flags::{ExportFormat, MemoryLimit, ModelOpts, PipelineArgs, SourceArgs};
use crate::out;
use crate::source::{check_new_file, significant, write_new_file, Source, Subject, Units};

/// The most micro-batches (and weight versions) a step may have: as many as a schedule
/// file may hold.
const MAX_MICROBATCHES: usize = pebble_schedule::pipeline::MAX_MICROBATCHES;
/// The most virtual stages per device of interleaved-1f1b.
const MAX_VIRTUAL_STAGES: usize = 64;
/// The most devices a pipeline is planned (or run) on: as many as a schedule file may name.
const MAX_DEVICES: usize = pebble_schedule::pipeline::MAX_DEVICES;

/// A source seen as pipeline layers, with the defaults of the pipeline flags: a model's
/// profile gives them; a chain or graph file has none (one device, unlimited memory,
/// free links). `pipeline`, `simulate` and `sweep --devices` read their flags through it.
pub struct PipelineSource {
    /// The layers.
    pub layers: Layers,
    /// A title.
    pub label: String,
    /// How sizes and times read.
    pub units: Units,
    /// The profile's machine, for a model.
    machine: Option<pebble_machine::Machine>,
}

impl PipelineSource {
    /// Loads the source's chain view as layers.
    pub fn load(source: &SourceArgs, opts: &ModelOpts) -> anyhow::Result<PipelineSource> {
        let (loaded, machine) = Source::load(source, opts)?;
        let Subject::Chain(chain) = loaded.view(View::Chain)? else {
            return Err(bad("a pipeline is planned on a chain view"));
        };
        let machine = matches!(loaded, Source::Model { .. }).then_some(machine);
        Ok(PipelineSource { layers: Layers::from_chain(&chain), label: loaded.label(), units: loaded.units(), machine })
    }

    /// `--devices`, or the profile's count (1 for a file).
    pub fn devices(&self, flag: Option<usize>) -> usize {
        flag.unwrap_or(self.machine.map_or(1, |m| m.devices as usize))
    }

    /// `--memory`, or the profile's device memory (unlimited for a file).
    pub fn memory(&self, flag: Option<MemoryLimit>) -> Option<u64> {
        flag.map_or(self.machine.map(|m| m.device_memory), |m| m.0)
    }

    /// `--bandwidth`, or the profile's interconnect (free links for a file). For a model,
    /// at least [`super::MIN_RUN_BANDWIDTH`] bytes per second, the bound a real run has:
    /// below it a period is hours long. (At `--bandwidth 1e-9` MadPipe's activation count
    /// times a layer's bytes once overflowed; its sums saturate now.)
    pub fn bandwidth(&self, flag: Option<f64>) -> anyhow::Result<f64> {
        let b = flag.unwrap_or(self.machine.map_or(f64::INFINITY, |m| m.interconnect.bandwidth));
        if self.units == Units::Bytes && b < super::MIN_RUN_BANDWIDTH {
            let flag = if flag.is_some() { "--bandwidth" } else { "--profile" };
            return Err(bad(format!(
                "{flag}: a link of {b} bytes per second between devices; a pipeline needs at least {:e} (1 MB/s)",
                super::MIN_RUN_BANDWIDTH
            )));
        }
        Ok(b)
    }
}

/// What the command plans on: the layers and the machine's defaults for the flags.
pub struct PipelineSetup {
    /// The layers.
    pub layers: Layers,
    /// `P`.
    pub devices: usize,
    /// Each device's memory.
    pub memory: Option<u64>,
    /// Each link's bandwidth.
    pub bandwidth: f64,
    /// A title.
    pub label: String,
    /// How sizes and times read.
    pub units: Units,
}

impl PipelineSetup {
    /// Loads the source and resolves `--devices`, `--memory` and `--bandwidth`: a model's
    /// profile gives the defaults; a chain or graph file has none (unlimited memory, free
    /// links, one device unless `--devices`).
    pub fn load(args: &PipelineArgs) -> anyhow::Result<PipelineSetup> {
        let source = PipelineSource::load(&args.source, &args.opts)?;
        let devices = source.devices(args.devices);
        check_devices(devices)?;
        let (memory, bandwidth) = (source.memory(args.memory), source.bandwidth(args.bandwidth)?);
        let PipelineSource { layers, label, units, .. } = source;
        Ok(PipelineSetup { layers, devices, memory, bandwidth, label, units })
    }

    /// The problem, with the command's solver options (checked by [`check_flags`]).
    pub fn problem(&self, args: &PipelineArgs) -> anyhow::Result<PipeProblem<'_>> {
        let mut p = PipeProblem::new(&self.layers, self.devices, self.memory, self.bandwidth);
        p.microbatches = args.microbatches;
        p.virtual_stages = args.virtual_stages;
        p.weight_versions = args.weight_versions;
        p.time_limit = args.time_limit;
        Ok(p)
    }

    /// A size as the source's units read.
    pub fn size(&self, bytes: u64) -> String {
        match self.units {
            Units::Bytes => format!("{} GiB", significant(bytes as f64 / (1u64 << 30) as f64)),
            Units::Plain => bytes.to_string(),
        }
    }
}

/// The limits of the flags, checked before anything is loaded, planned or spawned: the one
/// validation of `pipeline`, with and without `--run`.
fn check_flags(args: &PipelineArgs) -> anyhow::Result<()> {
    // `--devices` as given; the profile's count is checked where it is read (`PipelineSetup::load`).
    if let Some(devices) = args.devices {
        check_devices(devices)?;
    }
    if args.microbatches == Some(0) {
        return Err(bad("--microbatches: must be at least 1"));
    }
    if args.virtual_stages == 0 {
        return Err(bad("--virtual-stages: must be at least 1"));
    }
    if args.weight_versions == Some(0) {
        return Err(bad("--weight-versions: must be at least 1"));
    }
    // A step's schedule lists every micro-batch's ops on every device: beyond these
    // it no longer fits in memory, and no pipeline runs so many.
    for (flag, value, most) in [
        ("--microbatches", args.microbatches, MAX_MICROBATCHES),
        ("--virtual-stages", Some(args.virtual_stages), MAX_VIRTUAL_STAGES),
        ("--weight-versions", args.weight_versions.map(|v| v as usize), MAX_MICROBATCHES),
    ] {
        if let Some(v) = value.filter(|&v| v > most) {
            return Err(bad(format!("{flag}: {v} is more than any pipeline uses (at most {most})")));
        }
    }
    if args.run {
        check_run_flags(args)?;
    }
    Ok(())
}

/// `--devices` (or the profile's count): at least 1, at most [`MAX_DEVICES`].
pub(crate) fn check_devices(devices: usize) -> anyhow::Result<()> {
    if devices == 0 {
        return Err(bad("--devices: must be at least 1"));
    }
    if devices > MAX_DEVICES {
        return Err(bad(format!("--devices {devices}: at most {MAX_DEVICES}")));
    }
    Ok(())
}

/// What `--run` cannot honour: it plans on the profile's interconnect with the solvers'
/// own settings and one weight version (the step ends with a flush; see
/// `pebble_train::pipeline`), and draws or exports nothing. A flag asking otherwise is
/// refused, not ignored.
fn check_run_flags(args: &PipelineArgs) -> anyhow::Result<()> {
    if args.gantt.is_some() || args.export.is_some() {
        return Err(bad("--run: plans and runs one step; draw or export the plan without --run"));
    }
    let layers = Layers::from_costs(&[0.0]);
    let planned = PipeProblem::new(&layers, 1, None, f64::INFINITY);
    let refused = if args.bandwidth.is_some() {
        Some("--bandwidth: --run plans on the profile's interconnect and its workers' transfers are not timed".into())
    } else if args.virtual_stages != planned.virtual_stages {
        Some(format!("--virtual-stages: --run plans with {} virtual stages per device", planned.virtual_stages))
    } else if args.weight_versions.is_some_and(|v| v != 1) {
        Some("--weight-versions: --run keeps one weight version per device (its step ends with a flush)".into())
    } else if args.time_limit != planned.time_limit {
        Some(format!("--time-limit: --run gives the ILPs {} s", planned.time_limit))
    } else {
        None
    };
    match refused {
        Some(why) => Err(bad(format!("{why}; plan without --run to use it"))),
        None => Ok(()),
    }
}

/// The layers of each device, as ranges: `0-12, 30-31`.
fn ranges(layers: &[usize]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < layers.len() {
        let mut j = i;
        while j + 1 < layers.len() && layers[j + 1] == layers[j] + 1 {
            j += 1;
        }
        out.push(if i == j { layers[i].to_string() } else { format!("{}-{}", layers[i], layers[j]) });
        i = j + 1;
    }
    out.join(", ")
}

pub fn run(args: &PipelineArgs) -> anyhow::Result<ExitCode> {
    let solver = pipe_solver(&args.solver).map_err(|e| bad(format!("--solver: {e}")))?;
    check_flags(args)?;
    if args.run {
        return run_for_real(args);
    }
    if let Some(path) = &args.gantt {
        check_new_file(path, "--gantt", args.force)?;
    }
    if let Some(path) = &args.output {
        check_new_file(path, "--output", args.force)?;
    }
    let setup = PipelineSetup::load(args)?;
    let problem = setup.problem(args)?;
    let progress = crate::progress::spinner(&format!("{}: planning", solver.name()));
    let result = plan_pipeline(solver, &problem);
    progress.finish_and_clear();
    let plan = match result {
        Ok(plan) => plan,
        Err(PipeError::Infeasible { why, .. }) => {
            let message = format!(
                "`{}` finds no pipeline of {} on {} device(s) of {}: {why}",
                solver.name(),
                setup.label,
                setup.devices,
                setup.memory.map_or("unlimited memory".into(), |m| setup.size(m)),
            );
            if args.json {
                out::print_json(&json!({ "feasible": false, "solver": solver.name(), "reason": message }))?;
                return Ok(ExitCode::from(1));
            }
            return Err(crate::error::Infeasible(message).into());
        }
        Err(e @ PipeError::Unsupported { .. }) => return Err(bad(e.to_string())),
        Err(e) => return Err(e.into()),
    };
    let r = &plan.report;
    let allocation = plan.schedule.allocation();
    let mut layer_device = vec![0usize; setup.layers.len()];
    for (d, layers) in allocation.iter().enumerate() {
        for &l in layers {
            layer_device[l] = d;
        }
    }
    let sequential = setup.layers.total_load();
    if let Some(path) = &args.gantt {
        let title = format!("{}: {} on {} devices", setup.label, solver.name(), setup.devices);
        let svg = crate::gantt::render(&title, &plan.schedule, r).map_err(|e| anyhow::anyhow!("--gantt: {e}"))?;
        write_new_file(path, "--gantt", &svg, args.force)?;
    }
    if let Some(format) = args.export {
        let text = match format {
            ExportFormat::Pebble => plan.schedule.to_json(),
            ExportFormat::Torch => export_torch(&plan.schedule, &problem)?,
        };
        match &args.output {
            Some(path) => write_new_file(path, "--output", &text, args.force)?,
            None => out::print(&text)?,
        }
        if args.output.is_none() {
            return Ok(ExitCode::SUCCESS);
        }
    }
    if args.json {
        out::print_json(&json!({
            "feasible": true,
            "solver": solver.name(),
            "devices": setup.devices,
            "memory_bytes": setup.memory,
            "bandwidth": if setup.bandwidth.is_finite() { json!(setup.bandwidth) } else { json!("inf") },
            "periodic": plan.schedule.periodic,
            "microbatches": plan.schedule.microbatches,
            "period": r.period,
            "throughput": r.throughput,
            "step_time": r.step_time,
            "expected_period": plan.expected_period,
            "speedup": sequential / r.period,
            "bubble": r.bubble,
            "allocation": layer_device,
            "stages": plan.schedule.stages,
            "peak_bytes_per_device": r.peak_bytes_per_device,
            "busy_per_device": r.busy_per_device,
            "link_busy": r.link_busy,
            "solve_seconds": plan.solve_seconds,
        }))?;
        return Ok(ExitCode::SUCCESS);
    }
    let time = |t: f64| match setup.units {
        Units::Bytes => format!("{} s", significant(t)),
        Units::Plain => significant(t),
    };
    let mut text = format!(
        "{}: `{}` on {} devices, {} each, links {}\n",
        setup.label,
        solver.name(),
        setup.devices,
        setup.memory.map_or("unlimited memory".into(), |m| setup.size(m)),
        if setup.bandwidth.is_infinite() {
            "free".into()
        } else if setup.units == Units::Bytes {
            format!("{} GB/s", significant(setup.bandwidth / 1e9))
        } else {
            format!("{} units per time unit", significant(setup.bandwidth))
        },
    );
    text.push_str(&format!(
        "period {} per micro-batch ({} micro-batches/s), {}× one device{}{}\n",
        time(r.period),
        significant(r.throughput),
        significant(sequential / r.period),
        plan.expected_period.map_or(String::new(), |e| format!("; the solver expected {}", time(e))),
        r.step_time.map_or(String::new(), |s| format!(
            "; a step of {} micro-batches takes {}",
            plan.schedule.microbatches.unwrap_or(1),
            time(s)
        )),
    ));
    text.push_str(&format!(
        "bubble {:.1}%, busiest link {:.0}% busy\n",
        100.0 * r.bubble,
        100.0 * r.link_busy / r.period
    ));
    let rows: Vec<Vec<String>> = allocation
        .iter()
        .enumerate()
        .map(|(d, layers)| {
            vec![
                d.to_string(),
                if layers.is_empty() { "idle".into() } else { ranges(layers) },
                setup.size(r.peak_bytes_per_device[d]),
                format!("{:.0}%", 100.0 * r.busy_per_device[d] / r.period),
            ]
        })
        .collect();
    let header = ["device", "layers", "peak", "busy"].map(String::from);
    text.push_str(&out::table(&header, &rows, &[true, false, true, true]));
    out::print(&text)?;
    Ok(ExitCode::SUCCESS)
}

/// The plan in PyTorch's action format, over `--microbatches` (or the schedule's own
/// count, at least `2P`) micro-batches.
fn export_torch(schedule: &pebble_schedule::Schedule, problem: &PipeProblem<'_>) -> anyhow::Result<String> {
    let m = match (schedule.periodic, problem.microbatches) {
        (false, _) => schedule.microbatches.unwrap_or(1),
        (true, Some(m)) => m,
        (true, None) => 2 * problem.devices,
    };
    pebble_schedule::torch::export(schedule, m).map_err(|e| bad(format!("--export torch: {e}")))
}

/// `--run`: plans the zoo model as the executor sees it (`pebble_train::pipeline`: the
/// chain's layers with a copy of each tied parameter on each device that reads it) and
/// runs one pipelined step on the CPU beside the same micro-batches on one device.
fn run_for_real(args: &PipelineArgs) -> anyhow::Result<ExitCode> {
    use pebble_train::pipeline::{PipelineConfig, PipelineError};
    let Some(model) = &args.source.model else {
        return Err(bad("--run: runs a zoo model (--model); a chain or graph file has no tensors"));
    };
    let options = crate::source::model_options(&args.opts)?;
    // `check_flags` has checked the flags given; these defaults are within its limits.
    let devices = args.devices.unwrap_or(2);
    let microbatches = args.microbatches.unwrap_or(2 * devices);
    let flushed = pebble_solve::pipeline::flush::NAMES.contains(&args.solver.as_str())
        || (args.solver == "1f1b" && args.microbatches.is_some());
    let config = PipelineConfig {
        model: model.clone(),
        options,
        solver: args.solver.clone(),
        devices,
        memory: args.memory.and_then(|m| m.0),
        microbatches,
        seed: 0,
        flush: flushed,
    };
    let progress = crate::progress::spinner("planning and running one pipelined step");
    let result = pebble_train::pipeline_on(pebble_train::DeviceKind::Cpu, &config);
    progress.finish_and_clear();
    // The same outcomes as without `--run`: what the flags ask for that cannot be had
    // (an unknown model, an option it does not take, more stages than layers, a solver
    // whose schedules the executor cannot run) is bad input, exit 2; these were exit 1.
    let report = match result {
        Ok(r) => r,
        Err(PipelineError::Plan(e @ PipeError::Infeasible { .. })) => {
            return Err(crate::error::Infeasible(e.to_string()).into())
        }
        Err(PipelineError::Plan(e @ PipeError::Unsupported { .. })) => return Err(bad(e.to_string())),
        Err(PipelineError::UnknownSolver(e)) => return Err(bad(format!("--solver: {e}"))),
        Err(PipelineError::Train(e)) => return Err(super::train::lift(e)),
        Err(PipelineError::Runtime(e @ pebble_runtime::RuntimeError::Unsupported { .. })) => {
            return Err(bad(format!("--solver {}: --run cannot run its schedules: {e}", args.solver)))
        }
        Err(e) => return Err(e.into()),
    };
    // Relative to each gradient's largest entry.
    let grad_diff = report
        .grads
        .iter()
        .zip(&report.reference_grads)
        .map(|(a, b)| {
            let scale = b.iter().fold(0f32, |m, x| m.max(x.abs())).max(f32::MIN_POSITIVE);
            a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / scale
        })
        .fold(0f32, f32::max);
    let losses_equal = report.losses == report.reference_losses;
    let peaks: Vec<u64> = report.workers.iter().map(|w| w.peak_bytes).collect();
    let within = config.memory.is_none_or(|m| peaks.iter().all(|&p| p <= m));
    if args.json {
        out::print_json(&json!({
            "model": report.model,
            "solver": report.solver,
            "planner": report.planner,
            "devices": devices,
            "microbatches": microbatches,
            "memory_bytes": config.memory,
            "losses": report.losses,
            "reference_losses": report.reference_losses,
            "losses_equal": losses_equal,
            "max_relative_gradient_difference": grad_diff,
            "measured_peak_bytes_per_device": peaks,
            "simulated_peak_bytes_per_device": report.simulated.peak_bytes_per_device,
            "within_memory": within,
            "seconds": report.seconds,
            "reference_seconds": report.reference_seconds,
        }))?;
        return Ok(ExitCode::SUCCESS);
    }
    let mib = |b: u64| format!("{:.2} MiB", b as f64 / (1u64 << 20) as f64);
    let mut text = format!(
        "{} on {devices} workers, {microbatches} micro-batches, planned by {}\n\
         losses {} one device's ({:.4} … {:.4}); gradients within {grad_diff:.1e} of one device's\n\
         step {:.3} s pipelined, {:.3} s on one device\n",
        report.model,
        report.planner,
        if losses_equal { "equal to" } else { "differ from" },
        report.losses.first().copied().unwrap_or(f32::NAN),
        report.losses.last().copied().unwrap_or(f32::NAN),
        report.seconds,
        report.reference_seconds,
    );
    let rows: Vec<Vec<String>> = report
        .workers
        .iter()
        .map(|w| {
            vec![
                w.device.to_string(),
                mib(w.peak_bytes),
                mib(report.simulated.peak_bytes_per_device.get(w.device).copied().unwrap_or(0)),
                config.memory.map_or("-".into(), mib),
            ]
        })
        .collect();
    let header = ["device", "measured peak", "simulated", "memory"].map(String::from);
    text.push_str(&out::table(&header, &rows, &[true, true, true, true]));
    out::print(&text)?;
    Ok(if within && losses_equal { ExitCode::SUCCESS } else { ExitCode::from(1) })
}
