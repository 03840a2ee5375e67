//! `pebble sweep`: the time overhead of several solvers over a range of budgets.
//!
//! The budgets are evenly spaced from what `recompute-all` needs (the least memory any
//! baseline needs, or `l2l`'s when the sweep has a weight-offloading solver and that is
//! less; 10% of store-all's when that solver is not registered or the source has no
//! chain view) up to what store-all needs, both with the profile's runtime reserve
//! (see `pebble_solve::budget`): a budget here means what `--budget` means in `plan` and
//! `train`. Each solver plans its own view (see `Source::view_for`) at every budget,
//! prepared once ([`pebble_solve::plan_many`]), and its overhead is over store-all's time
//! on that view. Percentages of the budget column are of what store-all needs on the
//! chain view when some solver plans it, on the graph view otherwise.

use std::path::Path;
use std::process::ExitCode;

use pebble_machine::Machine;
use pebble_schedule::View;
use pebble_sim::SimReport;
use pebble_solve::bound::Bound;
use pebble_solve::{PlanError, SolveError, SolveOptions, Solver};
use serde_json::json;

use super::{overhead, parallel_map, solve_options, worker_count};
use crate::flags::{SweepArgs, SweepChart};
use crate::out;
use crate::plot::{self, Curve, Throughput};
use crate::source::{find_solver, view_name, Source, Subject, Units};

/// What one solver did at one budget.
#[derive(Debug, Clone)]
enum Cell {
    Feasible {
        peak: u64,
        time: f64,
        overhead: f64,
    },
    Infeasible,
    /// The solver failed otherwise (a schedule the simulator rejects, a problem too large).
    Failed(String),
}

/// A view of the source with its store-all reference.
struct Reference {
    subject: Subject,
    store_all: SimReport,
}

/// The solvers `pebble sweep` compares when `--solvers` is not given: pebble's own
/// (Rotor's DP on the chain, Rockmate on the graph) beside the baselines a practitioner
/// knows (plain autograd, and PyTorch's `checkpoint_sequential`). HiRemate is left to
/// `--solvers`: its top-level ILP at every budget takes minutes on GPT-2, where these
/// four take seconds.
pub const DEFAULT_SOLVERS: &str = "store-all,sequential,rotor,rockmate";

pub fn run(args: &SweepArgs) -> anyhow::Result<ExitCode> {
    if let Some(path) = &args.svg {
        crate::source::check_new_file(path, "--svg", args.force)?;
    }
    if let Some(devices) = args.devices {
        return pipeline(args, devices);
    }
    let names: Vec<String> = match &args.solvers {
        Some(names) => names.clone(),
        None => DEFAULT_SOLVERS.split(',').map(String::from).collect(),
    };
    // Bounds (a time, no schedule) are drawn beside the solvers, after them.
    let bounds: Vec<&Bound> = names.iter().filter_map(|name| pebble_solve::bound::bound(name.trim())).collect();
    let solvers = names
        .iter()
        .filter(|name| pebble_solve::bound::bound(name.trim()).is_none())
        .map(|name| find_solver(name.trim(), "--solvers"))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let (source, machine) = Source::load(&args.source, &args.opts)?;
    let options = SolveOptions { progress: pebble_solve::Progress::none(), ..solve_options(&args.solve, &machine) };
    let (views, view_of) = references(&source, &solvers, !bounds.is_empty(), &options)?;
    let reference = views.iter().position(|r| r.subject.view() == View::Chain).unwrap_or(0);
    let hi = views[reference].store_all.peak_bytes;
    let moves_weights = names.iter().any(|n| pebble_solve::weights::SOLVERS.contains(&n.trim()));
    let lo = least_memory(&views[reference].subject, &options, moves_weights).unwrap_or(hi / 10).min(hi);
    let budgets = spaced(lo, hi, args.points as u64);
    let cells = solve_all(&solvers, &bounds, (&views, &view_of, reference), &budgets, &options)?;
    let sweep = Sweep {
        source: &source,
        machine: &machine,
        columns: solvers.iter().map(|s| s.name()).chain(bounds.iter().map(|b| b.name)).collect(),
        solvers: solvers.len(),
        views,
        view_of,
        reference,
        budgets,
        lo,
        hi,
        cells,
    };
    for (s, solver) in solvers.iter().enumerate() {
        let failed = (0..sweep.budgets.len()).map(|b| sweep.cell(b, s)).find(|c| matches!(c, Cell::Failed(_)));
        if let Some(Cell::Failed(why)) = failed {
            eprintln!("warning: solver `{}` failed: {why}", solver.name());
        }
    }
    if let Some(path) = &args.svg {
        match args.chart {
            SweepChart::Overhead => sweep.draw(path, args.force)?,
            SweepChart::Throughput => sweep.draw_throughput(path, args.force)?,
        }
    }
    if args.json {
        out::print_json(&sweep.json())?;
        return Ok(ExitCode::SUCCESS);
    }
    out::print(&sweep.table())?;
    if let Some(path) = &args.svg {
        eprintln!("wrote {}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}

/// The views the solvers plan, each built and simulated once, and the index of each
/// solver's; with `chain_too` (bounds in the sweep), the chain view even if no solver
/// plans it.
fn references(
    source: &Source,
    solvers: &[&dyn Solver],
    chain_too: bool,
    options: &SolveOptions,
) -> anyhow::Result<(Vec<Reference>, Vec<usize>)> {
    let mut views: Vec<Reference> = Vec::new();
    let mut view_of: Vec<usize> = Vec::with_capacity(solvers.len());
    for solver in solvers {
        let subject = source.view_for(*solver)?;
        let index = match views.iter().position(|r| r.subject.view() == subject.view()) {
            Some(i) => i,
            None => {
                let store_all = subject.store_all(&options.machine)?;
                views.push(Reference { subject, store_all });
                views.len() - 1
            }
        };
        view_of.push(index);
    }
    if chain_too && !views.iter().any(|r| r.subject.view() == View::Chain) {
        let subject = source.view(View::Chain)?;
        let store_all = subject.store_all(&options.machine)?;
        views.push(Reference { subject, store_all });
    }
    Ok((views, view_of))
}

/// `n` budgets evenly spaced from `lo` to `hi` (just `hi` when `n` is 1).
fn spaced(lo: u64, hi: u64, n: u64) -> Vec<u64> {
    if n == 1 {
        vec![hi]
    } else {
        (0..n).map(|i| lo + ((hi - lo) as u128 * i as u128 / (n - 1) as u128) as u64).collect()
    }
}

/// Every solver at every budget, one job per solver (prepared once, planned at every
/// budget) on all cores, then each bound at every budget on the chain view (cheap: a
/// closed form): `cells[s][b]`, solvers first. `views` is the views, each solver's, and
/// the chain view's.
fn solve_all(
    solvers: &[&dyn Solver],
    bounds: &[&Bound],
    (views, view_of, reference): (&[Reference], &[usize], usize),
    budgets: &[u64],
    options: &SolveOptions,
) -> anyhow::Result<Vec<Vec<Cell>>> {
    let jobs: Vec<(&dyn Solver, &Reference)> = solvers.iter().zip(view_of).map(|(s, &v)| (*s, &views[v])).collect();
    let threads = worker_count(solvers.len());
    let mut cells = parallel_map(&jobs, threads, "solvers", |&(solver, view)| solve(solver, view, budgets, options))?;
    let chain = &views[reference];
    cells.extend(bounds.iter().map(|bound| budgets.iter().map(|&b| bound_cell(bound, chain, b, options)).collect()));
    Ok(cells)
}

/// A sweep's results: every column (solvers, then bounds) at every budget, and what
/// its outputs print beside them.
struct Sweep<'a> {
    source: &'a Source,
    machine: &'a Machine,
    /// Every column's name, solvers first, then bounds.
    columns: Vec<&'static str>,
    /// How many of the columns are solvers.
    solvers: usize,
    views: Vec<Reference>,
    /// The view each solver plans, an index into `views`.
    view_of: Vec<usize>,
    /// The view of the percentages and of the bounds: the chain view if there is one.
    reference: usize,
    /// The budgets (planned bytes), evenly spaced from `lo` to `hi`.
    budgets: Vec<u64>,
    lo: u64,
    hi: u64,
    /// `cells[s][b]`: column `s` at budget `b`.
    cells: Vec<Vec<Cell>>,
}

impl Sweep<'_> {
    /// A budget in all: planned bytes with the runtime's reserve.
    fn total(&self, planned: u64) -> u64 {
        pebble_solve::budget::total_for(planned, &self.machine.runtime)
    }

    /// Column `s` at budget `b`.
    fn cell(&self, b: usize, s: usize) -> Cell {
        self.cells.get(s).and_then(|c| c.get(b)).cloned().unwrap_or(Cell::Failed("not run".into()))
    }

    /// Samples a step trains: the model's batch; 1 for a chain or graph file (then a
    /// throughput is in steps).
    fn batch(&self) -> Option<usize> {
        match self.source {
            Source::Model { model, .. } => Some(model.dims.batch),
            _ => None,
        }
    }

    /// Samples per second (per time unit for a chain file) of a step taking `time`.
    fn throughput(&self, time: f64) -> f64 {
        self.batch().unwrap_or(1) as f64 / time
    }

    /// Draws each column's throughput against its simulated peak to `path` (`--svg` with
    /// `--chart throughput`): its distinct schedules, `sequential`'s as separate crosses.
    fn draw_throughput(&self, path: &Path, force: bool) -> anyhow::Result<()> {
        let columns: Vec<Throughput> = self
            .columns
            .iter()
            .enumerate()
            .map(|(s, name)| {
                let mut seen: Vec<(u64, u64)> = Vec::new();
                let mut points = Vec::new();
                for b in 0..self.budgets.len() {
                    if let Cell::Feasible { peak, time, .. } = self.cell(b, s) {
                        if !seen.contains(&(peak, time.to_bits())) {
                            seen.push((peak, time.to_bits()));
                            points.push((peak, self.throughput(time)));
                        }
                    }
                }
                Throughput { name: name.to_string(), points, separate: *name == "sequential" }
            })
            .collect();
        let y_desc = match (self.source, self.source.units()) {
            (_, Units::Plain) => "throughput (steps per time unit)",
            (Source::Model { model, .. }, _) if model.spec.image.is_some() => "throughput (images/s)",
            (Source::Model { .. }, _) => "throughput (samples/s)",
            _ => "throughput (steps/s)",
        };
        let title = format!("{}: throughput vs peak memory", self.source.label());
        plot::throughput(path, force, (&title, y_desc), self.source.units(), &columns)
    }

    /// Draws the overheads against the budgets to `path` (`--svg`).
    fn draw(&self, path: &Path, force: bool) -> anyhow::Result<()> {
        let curves: Vec<Curve> = self
            .columns
            .iter()
            .enumerate()
            .map(|(s, name)| Curve {
                name: name.to_string(),
                points: self
                    .budgets
                    .iter()
                    .enumerate()
                    .map(|(b, &budget)| match self.cell(b, s) {
                        Cell::Feasible { overhead, .. } => (self.total(budget), Some(100.0 * overhead)),
                        _ => (self.total(budget), None),
                    })
                    .collect(),
            })
            .collect();
        let title = format!("{}: time overhead vs memory", self.source.label());
        let range = (self.total(self.lo), self.total(self.hi));
        plot::sweep(path, force, &title, self.source.units(), range, self.total(self.hi), &curves)
    }

    /// The `--json` report: the references, the budgets, and each column's points.
    fn json(&self) -> serde_json::Value {
        let solvers_json: Vec<_> = self
            .columns
            .iter()
            .enumerate()
            .map(|(s, name)| {
                let view = &self.views[self.view_of.get(s).copied().unwrap_or(self.reference)];
                let points: Vec<_> = self
                    .budgets
                    .iter()
                    .enumerate()
                    .map(|(b, &budget)| {
                        let total = self.total(budget);
                        match self.cell(b, s) {
                            Cell::Feasible { peak, time, overhead } => json!({
                                "budget_bytes": total, "planned_bytes": budget, "feasible": true,
                                "predicted_peak_bytes": (s < self.solvers).then_some(peak), "predicted_time": time, "overhead": overhead,
                                "throughput": self.throughput(time),
                            }),
                            Cell::Infeasible => {
                                json!({ "budget_bytes": total, "planned_bytes": budget, "feasible": false })
                            }
                            Cell::Failed(why) => json!({
                                "budget_bytes": total, "planned_bytes": budget, "feasible": false, "error": why,
                            }),
                        }
                    })
                    .collect();
                json!({
                    "solver": name,
                    "bound": s >= self.solvers,
                    "view": view_name(view.subject.view()),
                    "baseline_time": view.store_all.makespan,
                    "points": points,
                })
            })
            .collect();
        let reference = &self.views[self.reference];
        json!({
            "source": self.source.label(),
            "batch": self.batch(),
            "view": view_name(reference.subject.view()),
            "store_all_peak_bytes": self.hi,
            "store_all_budget_bytes": self.total(self.hi),
            "store_all_time": reference.store_all.makespan,
            "budgets": self.budgets.iter().map(|&b| self.total(b)).collect::<Vec<_>>(),
            "planned_budgets": self.budgets,
            "runtime_overhead": self.machine.runtime,
            "solvers": solvers_json,
        })
    }

    /// The table: a row per budget, with its share of store-all's and each column's
    /// overhead.
    fn table(&self) -> String {
        let (budgets, hi, units) = (&self.budgets, self.hi, self.source.units());
        // Enough decimals that neighbouring budgets read apart (static memory can make the
        // whole range a fraction of a percent).
        let step = if budgets.len() > 1 {
            100.0 * (hi - self.lo) as f64 / (budgets.len() - 1) as f64 / hi.max(1) as f64
        } else {
            100.0
        };
        let decimals = if step > 0.0 { (1.0 - step.log10().floor()).clamp(1.0, 4.0) as usize } else { 1 };
        let mut header = vec!["budget".to_string(), "of store-all".to_string()];
        header.extend(self.columns.iter().map(|name| name.to_string()));
        let rows: Vec<Vec<String>> = budgets
            .iter()
            .enumerate()
            .map(|(b, &budget)| {
                let mut row =
                    vec![units.size(self.total(budget)), percent(self.total(budget), self.total(hi), decimals)];
                row.extend((0..self.columns.len()).map(|s| match self.cell(b, s) {
                    Cell::Feasible { overhead, .. } => format!("{:+.1}%", 100.0 * overhead),
                    Cell::Infeasible => "—".to_string(),
                    Cell::Failed(_) => "error".to_string(),
                }));
                row
            })
            .collect();
        let right: Vec<bool> = (0..header.len()).map(|_| true).collect();
        out::table(&header, &rows, &right)
    }
}

/// The peak of `recompute-all` on this view, if that solver is registered and plans it;
/// with `moves_weights` (a weight-offloading solver or bound in the sweep), the lower of
/// that and `l2l`'s, which keeps one layer's weights at a time.
fn least_memory(subject: &Subject, options: &SolveOptions, moves_weights: bool) -> Option<u64> {
    let peak = |name: &str| {
        let solver = pebble_solve::solver(name).ok()?;
        Some(pebble_solve::plan(solver, subject.problem(), u64::MAX, options).ok()?.report.peak_bytes)
    };
    let remat = peak("recompute-all");
    let weights = if moves_weights { peak("l2l") } else { None };
    remat.into_iter().chain(weights).min()
}

/// One solver at every budget (planned bytes), prepared once.
fn solve(solver: &dyn Solver, view: &Reference, budgets: &[u64], options: &SolveOptions) -> Vec<Cell> {
    let cell = |r: Result<pebble_solve::Plan, PlanError>| match r {
        Ok(plan) => Cell::Feasible {
            peak: plan.report.peak_bytes,
            time: plan.report.makespan,
            overhead: overhead(plan.report.makespan, view.store_all.makespan),
        },
        Err(PlanError::Solve(SolveError::Infeasible { .. })) => Cell::Infeasible,
        Err(e) => Cell::Failed(e.to_string()),
    };
    match pebble_solve::plan_many(solver, view.subject.problem(), budgets, options) {
        Ok(plans) => plans.into_iter().map(cell).collect(),
        Err(e) => budgets.iter().map(|_| cell(Err(e.clone()))).collect(),
    }
}

/// A bound at one budget (planned bytes), on the chain view. Its "peak" is the budget:
/// a bound has no schedule to measure.
fn bound_cell(bound: &Bound, view: &Reference, budget: u64, options: &SolveOptions) -> Cell {
    let Subject::Chain(chain) = &view.subject else { return Cell::Failed("no chain view".into()) };
    match (bound.time)(chain, budget, &options.machine) {
        Ok(time) => Cell::Feasible { peak: budget, time, overhead: overhead(time, view.store_all.makespan) },
        Err(SolveError::Infeasible { .. }) => Cell::Infeasible,
        Err(e) => Cell::Failed(e.to_string()),
    }
}

/// `value` as a percentage of `reference` with `decimals` decimals.
fn percent(value: u64, reference: u64, decimals: usize) -> String {
    if reference == 0 {
        return "-".to_string();
    }
    format!("{:.decimals$}%", 100.0 * value as f64 / reference as f64)
}

/// The solvers of the pipeline mode when `--solvers` is not given.
pub const DEFAULT_PIPELINE_SOLVERS: &str = "madpipe,pipedream,1f1b,zb-h1";

/// `pebble sweep --devices P`: the throughput of pipeline solvers against the memory of
/// each device, from `1/(2P)` of what one device would need to run the model with weight
/// stashing (its static bytes with two weight versions and every stored activation) up
/// to twice that (a pipeline holds several micro-batches' activations at once).
fn pipeline(args: &SweepArgs, devices: usize) -> anyhow::Result<ExitCode> {
    use pebble_solve::pipeline::{pipe_solver, plan_pipeline, PipeError, PipeProblem};
    // As `pebble pipeline` checks it (10^12 devices aborted allocating the problem).
    super::pipeline::check_devices(devices)?;
    if args.solve.slots.is_some() {
        return Err(crate::error::bad("--slots: a pipeline is planned without memory slots (drop it with --devices)"));
    }
    let names: Vec<String> = match &args.solvers {
        Some(names) => names.iter().map(|n| n.trim().to_string()).collect(),
        None => DEFAULT_PIPELINE_SOLVERS.split(',').map(String::from).collect(),
    };
    let solvers = names
        .iter()
        .map(|n| pipe_solver(n).map_err(|e| crate::error::bad(format!("--solvers: {e}"))))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let source = super::pipeline::PipelineSource::load(&args.source, &args.opts)?;
    let layers = &source.layers;
    let is_file = source.units == crate::source::Units::Plain;
    let bandwidth = source.bandwidth(args.solve.bandwidth)?;
    let one = layers.static_bytes(0, layers.len() - 1, 2) + layers.stored_bytes(0, layers.len() - 1);
    let n = args.points as u64;
    let (lo, hi) = (one / (2 * devices as u64).max(1), 2 * one);
    let memories: Vec<u64> = (0..n).map(|i| if n == 1 { hi } else { lo + (hi - lo) * i / (n - 1) }).collect();
    let bar = crate::progress::bar((memories.len() * solvers.len()) as u64, "pipelines");
    let mut rows = Vec::new();
    let mut series: Vec<plot::Series> = Vec::new();
    let scale = if is_file { 1.0 } else { (1u64 << 30) as f64 };
    for solver in &solvers {
        let mut points = Vec::new();
        for &m in &memories {
            let mut problem = PipeProblem::new(layers, devices, Some(m), bandwidth);
            problem.time_limit = args.solve.time_limit.unwrap_or(problem.time_limit);
            let cell = match plan_pipeline(*solver, &problem) {
                Ok(plan) => Some(plan.report.throughput),
                Err(PipeError::Infeasible { .. }) => None,
                // As `pebble pipeline` says it: more stages than layers is bad input (it was exit 1).
                Err(e @ PipeError::Unsupported { .. }) => return Err(crate::error::bad(e.to_string())),
                Err(e) => return Err(e.into()),
            };
            bar.inc(1);
            rows.push(json!({ "solver": solver.name(), "memory_bytes": m, "throughput": cell }));
            points.push((m as f64 / scale, cell));
        }
        series.push((plot::legend_name(solver.name(), &points), points));
    }
    bar.finish_and_clear();
    if let Some(path) = &args.svg {
        let svg = plot::lines(
            &format!("{}: {devices} devices", source.label),
            if is_file { "memory per device (units)" } else { "memory per device (GiB)" },
            "throughput (micro-batches per time unit)",
            &series,
        )?;
        crate::source::write_new_file(path, "--svg", &svg, args.force)?;
    }
    if args.json {
        out::print_json(
            &json!({ "devices": devices, "bandwidth": if bandwidth.is_finite() { json!(bandwidth) } else { json!("inf") }, "points": rows }),
        )?;
        return Ok(ExitCode::SUCCESS);
    }
    let mut header = vec!["memory/device".to_string()];
    header.extend(solvers.iter().map(|s| s.name().to_string()));
    let table_rows: Vec<Vec<String>> = memories
        .iter()
        .enumerate()
        .map(|(i, &m)| {
            let mut row = vec![if is_file { m.to_string() } else { format!("{:.2} GiB", m as f64 / scale) }];
            row.extend(series.iter().map(|s| s.1[i].1.map_or("infeasible".into(), |t| format!("{t:.4}"))));
            row
        })
        .collect();
    let right = vec![true; header.len()];
    out::print(&format!(
        "throughput (micro-batches per second) on {devices} devices\n{}",
        out::table(&header, &table_rows, &right)
    ))?;
    Ok(ExitCode::SUCCESS)
}
