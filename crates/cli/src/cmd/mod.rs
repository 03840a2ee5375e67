//! One module per subcommand: each turns its parsed flags into output and an exit code.

pub mod bench;
pub mod graph;
pub mod info;
pub mod maxbatch;
pub mod models;
pub mod pipeline;
pub mod plan;
pub mod profile;
pub mod reproduce;
pub mod simulate;
pub mod sweep;
pub mod train;

use pebble_machine::Machine;
use pebble_solve::budget::{Budget, BudgetRequest};

/// The slowest link a model's plan or run takes, in bytes per second: a real run
/// (`train`, `maxbatch --run`) throttles its host link to it, and below it a step's
/// transfers take hours where the simulator's took microseconds (`maxbatch --run
/// --bandwidth 1` never ended); a pipeline's link between devices (see
/// [`pipeline::PipelineSource::bandwidth`]).
pub const MIN_RUN_BANDWIDTH: f64 = 1e6;

/// Refuses a real run on a host link slower than [`MIN_RUN_BANDWIDTH`]: `--bandwidth` if
/// given, else the profile's links.
pub fn check_run_link(bandwidth: Option<f64>, machine: &Machine) -> anyhow::Result<()> {
    let (flag, b) = match bandwidth {
        Some(b) => ("--bandwidth", b),
        None => ("--profile", machine.d2h.bandwidth.min(machine.h2d.bandwidth)),
    };
    if b < MIN_RUN_BANDWIDTH {
        return Err(crate::error::bad(format!(
            "{flag}: a real run throttles its host link to {b} bytes per second; it needs at least \
             {MIN_RUN_BANDWIDTH:e} (1 MB/s)"
        )));
    }
    Ok(())
}

/// How many threads run `jobs` jobs at once: one per core, at least one, at most `jobs`.
pub fn worker_count(jobs: usize) -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get()).clamp(1, jobs.max(1))
}

/// `f` over every job on `threads` threads, each taking the next job left, with a
/// progress bar labelled `what`; the results in the jobs' order. A panic in `f` is an
/// error, once every thread has been joined.
pub fn parallel_map<J: Sync, R: Send>(
    jobs: &[J],
    threads: usize,
    what: &str,
    f: impl Fn(&J) -> R + Sync,
) -> anyhow::Result<Vec<R>> {
    use std::sync::atomic::{AtomicUsize, Ordering};

    let bar = crate::progress::bar(jobs.len() as u64, what);
    let next = AtomicUsize::new(0);
    let mut results: Vec<Option<R>> = std::iter::repeat_with(|| None).take(jobs.len()).collect();
    let mut panicked = false;
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    let mut done = Vec::new();
                    loop {
                        let j = next.fetch_add(1, Ordering::Relaxed);
                        let Some(job) = jobs.get(j) else { break };
                        done.push((j, f(job)));
                        bar.inc(1);
                    }
                    done
                })
            })
            .collect();
        // Join every worker before reporting a panic, so that the scope has none left.
        for worker in workers {
            match worker.join() {
                Ok(done) => done.into_iter().for_each(|(j, r)| results[j] = Some(r)),
                Err(_) => panicked = true,
            }
        }
    });
    if panicked {
        return Err(anyhow::anyhow!("a solver panicked"));
    }
    bar.finish_and_clear();
    results.into_iter().collect::<Option<Vec<R>>>().ok_or_else(|| anyhow::anyhow!("a job was not run"))
}

/// `predicted / baseline − 1`, or 0 when the baseline takes no time.
pub fn overhead(predicted: f64, baseline: f64) -> f64 {
    if baseline > 0.0 {
        predicted / baseline - 1.0
    } else {
        0.0
    }
}

/// The caching allocator's line of a text report, where the simulator ran it.
pub fn allocator_text(report: &pebble_sim::SimReport, units: crate::source::Units) -> String {
    let Some(a) = report.allocator else { return String::new() };
    format!(
        "allocator reserved {} at its peak (allocated {}; {:.1}% of the reserved peak never in use while it lasted)\n",
        units.size(a.peak_reserved),
        units.size(a.peak_allocated),
        100.0 * a.fragmentation_at_peak
    )
}

/// The solver options from the flags on `machine`: `--bandwidth` replaces both host-link
/// directions' bandwidth; long solves draw progress on a terminal.
pub fn solve_options(args: &crate::flags::SolveArgs, machine: &Machine) -> pebble_solve::SolveOptions {
    let defaults = pebble_solve::SolveOptions::default();
    pebble_solve::SolveOptions {
        slots: args.slots.unwrap_or(defaults.slots),
        time_limit: args.time_limit,
        machine: match args.bandwidth {
            Some(b) => machine.with_bandwidth(b),
            None => *machine,
        },
        progress: crate::progress::solver_progress(),
        allocator: args.allocator.config(),
    }
}

/// The budget `--budget` or `--activation-budget` asks for, by the one memory model every
/// command uses ([`pebble_solve::budget`]): bytes in all, the executor's reserve, and the
/// share solvers plan in.
pub fn resolve_budget(
    args: &crate::flags::BudgetArgs,
    store_all_peak: u64,
    static_bytes: u64,
    machine: &Machine,
) -> anyhow::Result<Budget> {
    let request = match (args.budget, args.activation_budget) {
        (Some(b), _) => BudgetRequest::Total(b),
        (None, Some(a)) => BudgetRequest::Activation(a),
        (None, None) => return Err(crate::error::bad("give --budget or --activation-budget")),
    };
    Ok(request.resolve(store_all_peak, static_bytes, &machine.runtime))
}

/// The JSON fields every planning command prints about its budget: the budget in all,
/// the share solvers plan in, the runtime's reserve, what `100%` is (store-all's peak plus
/// its reserve), and the runtime overhead of the profile.
pub fn budget_json(budget: &Budget, machine: &Machine) -> serde_json::Value {
    serde_json::json!({
        "budget_bytes": budget.total_bytes,
        "planned_bytes": budget.planned_bytes,
        "reserve_bytes": budget.reserve_bytes,
        "store_all_budget_bytes": budget.reference_bytes,
        "runtime_overhead": machine.runtime,
    })
}

/// A percentage of `reference`, one decimal.
pub fn percent_of(value: u64, reference: u64) -> String {
    if reference == 0 {
        "-".to_string()
    } else {
        format!("{:.1}%", 100.0 * value as f64 / reference as f64)
    }
}

/// The bars of the timeline chart (`--timeline`): one per compute op and transfer the
/// simulator timed, labelled in the thesis's notation (`F3all`, `B2`, `L`; `a3`, `ā3`).
/// A forward op run a second time is a recomputation.
pub fn timeline_bars(
    problem: pebble_solve::Problem<'_>,
    schedule: &pebble_schedule::Schedule,
    spans: &[pebble_sim::Span],
) -> Vec<crate::plot::Bar> {
    use pebble_schedule::{Op, Tensor};
    use pebble_solve::Problem;

    use crate::plot::{Bar, BarKind};

    let tensor = |t: Tensor| -> Vec<String> {
        match t {
            Tensor::Activation(i) => vec![format!("a{i}")],
            Tensor::Saved(i) => vec![format!("ā{i}")],
            Tensor::Grad(i) => vec![format!("δ{i}")],
            Tensor::Weight(i) => vec![format!("w{i}")],
            Tensor::WeightGrad(i) => vec![format!("δw{i}")],
            Tensor::OptState(i) => vec![format!("opt{i}")],
            Tensor::Data(d) => match problem {
                Problem::Graph(g) if d < g.data.len() => vec![g.data[d].name.clone(), format!("d{d}")],
                _ => vec![format!("d{d}")],
            },
        }
    };
    let fraction = |mut labels: Vec<String>, f: f64| {
        if f < 1.0 {
            let part = format!("{} {:.0}%", labels[0], 100.0 * f);
            labels.insert(0, part);
        }
        labels
    };
    let mut seen = std::collections::HashSet::new();
    let mut order: Vec<&pebble_sim::Span> = spans.iter().collect();
    order.sort_by_key(|s| s.op);
    let mut bars = Vec::with_capacity(spans.len());
    // A periodic schedule runs unrolled: the span of op `k` in period `p` names op
    // `p·len + k` (any other schedule's spans are all in period 0), and each period's
    // first forward of a stage is no recomputation.
    let len = schedule.ops.len().max(1);
    for span in order {
        let (period, k) = (span.op / len, span.op % len);
        let Some(op) = schedule.ops.get(k) else { continue };
        let (kind, labels) = match *op {
            Op::Forward { stage, .. } => {
                let short = format!("F{stage}");
                let kind = if seen.insert((period, stage)) { BarKind::Forward } else { BarKind::Recompute };
                (kind, vec![op.to_string(), short])
            }
            Op::Backward { stage } => {
                let loss = matches!(problem, Problem::Chain(c) if stage == c.len()) || stage == usize::MAX;
                if loss {
                    (BarKind::Loss, vec!["L".to_string()])
                } else {
                    (BarKind::Backward, vec![op.to_string()])
                }
            }
            Op::Compute { node, no_grad } => {
                let (kind, name) = match problem {
                    Problem::Graph(g) if node < g.compute.len() => {
                        let n = &g.compute[node];
                        let kind = match n.kind {
                            pebble_graph::ComputeKind::Forward if seen.insert((period, node)) => BarKind::Forward,
                            pebble_graph::ComputeKind::Forward => BarKind::Recompute,
                            pebble_graph::ComputeKind::Backward => BarKind::Backward,
                            pebble_graph::ComputeKind::Loss => BarKind::Loss,
                        };
                        (kind, Some(if no_grad { format!("{} (no grad)", n.name) } else { n.name.clone() }))
                    }
                    _ => (BarKind::Forward, None),
                };
                (kind, name.into_iter().chain(std::iter::once(op.to_string())).collect())
            }
            Op::Offload { tensor: t, fraction: f } => (BarKind::Offload, fraction(tensor(t), f)),
            Op::Prefetch { tensor: t, fraction: f } => (BarKind::Prefetch, fraction(tensor(t), f)),
            Op::CpuUpdate { stage } => (BarKind::CpuUpdate, vec![format!("update w{stage}"), format!("w{stage}")]),
            Op::Free { .. } | Op::Run { .. } | Op::Send { .. } => continue,
        };
        bars.push(Bar { kind, start: span.start, end: span.end, labels });
    }
    bars
}

/// Refuses an existing `--timeline` file before any work, unless `--force`.
pub fn check_timeline(args: &crate::flags::TimelineArgs) -> anyhow::Result<()> {
    match &args.timeline {
        Some(path) => crate::source::check_new_file(path, "--timeline", args.force),
        None => Ok(()),
    }
}
