//! `pebble reproduce ch4`: Shilova's thesis, Ch. 4 (§4.4), in simulation: pofo
//! (offloading and rematerialization together) against remat only (`rotor`), offload
//! only (`offload-dp`, DYNPROG) and the two heuristics (`autocapper`, `opportunist`) on
//! the chains of zoo CNNs.
//!
//! For each model: `T_seq` is store-all's makespan (no memory limit), `M^high` its
//! simulated peak, `M^low` the simulated peak of `recompute-all`, and the budget at `α` is
//! `M(α) = (1−α)·M^low + α·M^high`, the memory solvers plan in (the simulator's peak,
//! static memory included; the executor's runtime reserve plays no part, as in the
//! thesis's simulations). Overhead is `makespan / T_seq − 1`. The experiment sweeps `α`
//! at β = 12 GB/s (Fig. 4.2), β at α = 0.2 (Fig. 4.3), records the share of the saved
//! activations `ā_0..ā_L` offloaded (Fig. 4.4), and finds by bisection the least budget
//! at which pofo (and rotor) stay within 20% overhead: the activation-memory division
//! factor of the thesis's headline ("4 to 6 times less memory").

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::anyhow;
use pebble_graph::Chain;
use pebble_machine::Machine;
use pebble_schedule::{Op, Schedule};
use pebble_solve::{PlanError, Problem, SolveError, SolveOptions};
use plotters::prelude::*;
use serde_json::{json, Value};

use crate::cmd::{overhead, parallel_map, worker_count};
use crate::flags::{ModelOpts, ReproduceArgs, SizeOpts};
use crate::out;
use crate::plot::COLORS;
use crate::source::{build_model, Subject};

/// The solvers of Figs. 4.2–4.3, in the order of the charts' legends.
pub const SOLVERS: [&str; 5] = ["rotor", "offload-dp", "pofo", "autocapper", "opportunist"];
/// The solvers that offload and recompute (Fig. 4.4).
const MIXED: [&str; 3] = ["pofo", "autocapper", "opportunist"];
/// β of the α sweep, bytes per second.
const BETA: f64 = 12e9;
/// α of the β sweep.
const ALPHA: f64 = 0.2;
/// The overhead of the headline's division factor.
const LIMIT: f64 = 0.2;
/// Bisection steps on the budget for the division factor (`--quick`: 5).
const STEPS: usize = 8;
const QUICK_STEPS: usize = 5;
/// The solvers whose division factor is searched.
const FACTOR_SOLVERS: [&str; 2] = ["pofo", "rotor"];

/// The output files, in `--out-dir`.
const FILES: [&str; 4] = ["ch4.json", "ch4-alpha.svg", "ch4-beta.svg", "ch4-offloaded.svg"];

/// One model's chain and its references.
struct Setup {
    name: String,
    chain: Chain,
    machine: Machine,
    t_seq: f64,
    m_high: u64,
    m_low: u64,
    /// `Σ ā_0..ā_L`.
    saved_bytes: u64,
}

impl Setup {
    fn budget(&self, alpha: f64) -> u64 {
        ((1.0 - alpha) * self.m_low as f64 + alpha * self.m_high as f64).round() as u64
    }
}

/// What one solver did at one budget and bandwidth.
#[derive(Debug, Clone)]
enum Cell {
    Feasible { makespan: f64, peak: u64, offloaded: f64, d2h_busy: f64, seconds: f64 },
    Infeasible,
    Failed(String),
}

/// The least budget found within [`LIMIT`] overhead.
#[derive(Debug, Clone, Copy)]
struct Threshold {
    budget: u64,
    overhead: f64,
}

/// A unit of work for the thread pool.
#[derive(Debug, Clone, Copy)]
enum Job {
    /// Model, point (α, β), solver.
    Point(usize, usize, usize),
    /// Model, solver name: the bisection for the division factor.
    Bisect(usize, &'static str),
}

/// What a [`Job`] found, with its key in [`Results`].
enum Done {
    Point((usize, usize, usize), Cell),
    Bisect((usize, &'static str), Option<Threshold>),
}

/// The experiment's grid, models and results: what its JSON, charts and summary read.
struct Results {
    alphas: Vec<f64>,
    betas: Vec<f64>,
    /// The (α, β) points, each once: the α sweep at β = 12 GB/s and the β sweep at α = 0.2.
    points: Vec<(f64, f64)>,
    setups: Vec<Setup>,
    /// By (model, point, solver).
    cells: HashMap<(usize, usize, usize), Cell>,
    /// By (model, solver name), for [`FACTOR_SOLVERS`].
    thresholds: HashMap<(usize, &'static str), Option<Threshold>>,
}

pub fn ch4(args: &ReproduceArgs) -> anyhow::Result<ExitCode> {
    let started = Instant::now();
    let steps = if args.quick { QUICK_STEPS } else { STEPS };
    let paths = super::output_paths(args, &FILES)?;
    for name in SOLVERS.iter().chain(["recompute-all"].iter()) {
        crate::source::find_solver(name, "reproduce")?;
    }
    let (alphas, betas, points) = grid(args.quick);
    let setups = args.models.iter().map(|name| setup(name.trim(), args)).collect::<anyhow::Result<Vec<_>>>()?;
    let jobs = jobs(&setups, points.len());
    let threads = worker_count(jobs.len());
    let done = parallel_map(&jobs, threads, "solves", |&job| match job {
        Job::Point(m, p, s) => {
            let (alpha, beta) = points[p];
            let setup = &setups[m];
            Done::Point((m, p, s), solve(setup, SOLVERS[s], setup.budget(alpha), beta))
        }
        Job::Bisect(m, name) => Done::Bisect((m, name), bisect(&setups[m], name, steps)),
    })?;
    let mut results = Results { alphas, betas, points, setups, cells: HashMap::new(), thresholds: HashMap::new() };
    for d in done {
        match d {
            Done::Point(key, cell) => {
                results.cells.insert(key, cell);
            }
            Done::Bisect(key, threshold) => {
                results.thresholds.insert(key, threshold);
            }
        }
    }
    for ((m, p, s), c) in &results.cells {
        if let Cell::Failed(why) = c {
            let (a, b) = results.points[*p];
            let name = &results.setups[*m].name;
            eprintln!("warning: {} on {name} at α = {a}, β = {} GB/s failed: {why}", SOLVERS[*s], b / 1e9);
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let command = command_line(args);
    let report = json!({
        "experiment": "ch4",
        "command": command,
        "profile": args.profile(),
        "batch": args.batch,
        "image": args.image,
        "quick": args.quick,
        "solvers": SOLVERS,
        "alphas": results.alphas,
        "betas": results.betas,
        "beta_of_alpha_sweep": BETA,
        "alpha_of_beta_sweep": ALPHA,
        "overhead_limit": LIMIT,
        "bisection_steps": steps,
        "threads": threads,
        "run_seconds": seconds,
        "models": (0..results.setups.len()).map(|m| results.model_json(m)).collect::<Vec<Value>>(),
    });
    let svgs = results.charts(args, &paths)?;
    let svgs: Vec<&str> = svgs.iter().map(String::as_str).collect();
    super::write_outputs(args, &paths, &report, &svgs, started)?;
    let mut summary = results.summary();
    summary.push_str(&format!("\n{command}: {seconds:.0} s on {threads} threads\n"));
    for path in &paths {
        summary.push_str(&format!("wrote {}\n", path.display()));
    }
    out::print(&summary)?;
    Ok(ExitCode::SUCCESS)
}

/// The α and β of the sweeps, and the (α, β) points, each once: the α sweep at β = 12
/// GB/s and the β sweep at α = 0.2.
fn grid(quick: bool) -> (Vec<f64>, Vec<f64>, Vec<(f64, f64)>) {
    // 0.1 to 1 by tenths, and 0.75, the thesis's high-memory point (§4.4).
    let alphas: Vec<f64> = if quick {
        vec![0.2, 0.5, 0.75]
    } else {
        let mut a: Vec<f64> = (1..=10).map(|i| i as f64 / 10.0).chain([0.75]).collect();
        a.sort_by(f64::total_cmp);
        a
    };
    let betas: Vec<f64> = if quick { vec![12e9, 36e9] } else { vec![12e9, 18e9, 24e9, 36e9] };
    let mut points: Vec<(f64, f64)> = alphas.iter().map(|&a| (a, BETA)).collect();
    for &b in &betas {
        if !points.iter().any(|&(a, bb)| same(a, ALPHA) && same(bb, b)) {
            points.push((ALPHA, b));
        }
    }
    (alphas, betas, points)
}

/// Every job: the slow ones first (pofo's bisections, then its points), so that two
/// threads end together.
fn jobs(setups: &[Setup], points: usize) -> Vec<Job> {
    let mut jobs: Vec<Job> = Vec::new();
    let by_size = {
        let mut m: Vec<usize> = (0..setups.len()).collect();
        m.sort_by_key(|&i| std::cmp::Reverse(setups[i].chain.len()));
        m
    };
    for &m in &by_size {
        jobs.push(Job::Bisect(m, "pofo"));
    }
    let order = ["pofo", "autocapper", "rotor", "offload-dp", "opportunist"];
    for (rank, name) in order.iter().enumerate() {
        let s = SOLVERS.iter().position(|n| n == name).unwrap_or(rank);
        for &m in &by_size {
            for p in 0..points {
                jobs.push(Job::Point(m, p, s));
            }
            if *name == "rotor" {
                jobs.push(Job::Bisect(m, "rotor"));
            }
        }
    }
    jobs
}

impl Results {
    /// The point `(alpha, beta)`'s index, if the grid has it.
    fn find(&self, alpha: f64, beta: f64) -> Option<usize> {
        self.points.iter().position(|&(a, b)| same(a, alpha) && same(b, beta))
    }

    /// Model `m` at point `p` under solver `s`.
    fn cell(&self, m: usize, p: usize, s: usize) -> Cell {
        self.cells.get(&(m, p, s)).cloned().unwrap_or(Cell::Failed("not run".into()))
    }

    /// The overhead in percent of solver `s` on model `m` at point `p`, if feasible.
    fn overhead_at(&self, m: usize, p: Option<usize>, s: usize) -> Option<f64> {
        match self.cell(m, p?, s) {
            Cell::Feasible { makespan, .. } => Some(100.0 * overhead(makespan, self.setups[m].t_seq)),
            _ => None,
        }
    }

    /// The share in percent of the saved activations that solver `s` offloads on model
    /// `m` at point `p`, if feasible.
    fn share_at(&self, m: usize, p: Option<usize>, s: usize) -> Option<f64> {
        match self.cell(m, p?, s) {
            Cell::Feasible { offloaded, .. } => Some(100.0 * share(offloaded, self.setups[m].saved_bytes)),
            _ => None,
        }
    }

    /// One point's JSON: its α, β and budget, and each solver's result.
    fn point_json(&self, m: usize, p: usize) -> Value {
        let setup = &self.setups[m];
        let (alpha, beta) = self.points[p];
        let budget = setup.budget(alpha);
        let mut by_solver = serde_json::Map::new();
        for (s, name) in SOLVERS.iter().enumerate() {
            let v = match self.cell(m, p, s) {
                Cell::Feasible { makespan, peak, offloaded, d2h_busy, seconds } => json!({
                    "feasible": true,
                    "makespan": makespan,
                    "overhead": overhead(makespan, setup.t_seq),
                    "peak_bytes": peak,
                    "offloaded_bytes": offloaded,
                    "offloaded_share": share(offloaded, setup.saved_bytes),
                    "d2h_busy": d2h_busy,
                    "solve_seconds": seconds,
                }),
                Cell::Infeasible => json!({ "feasible": false }),
                Cell::Failed(why) => json!({ "feasible": false, "error": why }),
            };
            by_solver.insert(name.to_string(), v);
        }
        json!({
            "alpha": alpha,
            "beta": beta,
            "budget_bytes": budget,
            "activation_bytes": budget.saturating_sub(setup.chain.static_bytes),
            "solvers": by_solver,
        })
    }

    /// One model's JSON: its references, both sweeps and the division factors.
    fn model_json(&self, m: usize) -> Value {
        let setup = &self.setups[m];
        let alpha_sweep: Vec<Value> =
            self.alphas.iter().filter_map(|&a| self.find(a, BETA)).map(|p| self.point_json(m, p)).collect();
        let beta_sweep: Vec<Value> =
            self.betas.iter().filter_map(|&b| self.find(ALPHA, b)).map(|p| self.point_json(m, p)).collect();
        let mut factors = serde_json::Map::new();
        for name in FACTOR_SOLVERS {
            let v = match self.thresholds.get(&(m, name)).copied().flatten() {
                Some(t) => json!({
                    "budget_bytes": t.budget,
                    "activation_bytes": t.budget.saturating_sub(setup.chain.static_bytes),
                    "overhead": t.overhead,
                    "factor": factor(setup, t.budget),
                    // Within the limit already at M^low: the factor is M^low's, a
                    // lower bound on what the solver could do with less.
                    "at_m_low": t.budget == setup.m_low,
                }),
                None => Value::Null,
            };
            factors.insert(name.to_string(), v);
        }
        json!({
            "model": setup.name,
            "stages": setup.chain.len(),
            "static_bytes": setup.chain.static_bytes,
            "t_seq": setup.t_seq,
            "m_high_bytes": setup.m_high,
            "m_low_bytes": setup.m_low,
            "saved_bytes": setup.saved_bytes,
            // The factor at M^low: no plan divides the activations further.
            "factor_ceiling": factor(setup, setup.m_low),
            "alpha_sweep": alpha_sweep,
            "beta_sweep": beta_sweep,
            "division_factor": factors,
        })
    }

    /// The three charts (Figs. 4.2–4.4), in the order of `paths[1..]`.
    fn charts(&self, args: &ReproduceArgs, paths: &[PathBuf]) -> anyhow::Result<Vec<String>> {
        let (alphas, betas) = (&self.alphas, &self.betas);
        let panels = |curve: &dyn Fn(usize, usize) -> Points, solvers: &[usize]| -> Vec<Panel> {
            (0..self.setups.len())
                .map(|m| Panel {
                    title: self.setups[m].name.clone(),
                    curves: solvers.iter().map(|&s| (s, curve(m, s))).collect(),
                })
                .collect()
        };
        let all: Vec<usize> = (0..SOLVERS.len()).collect();
        let mixed: Vec<usize> = MIXED.iter().filter_map(|name| SOLVERS.iter().position(|n| n == name)).collect();
        let alpha_panels =
            panels(&|m, s| alphas.iter().map(|&a| (a, self.overhead_at(m, self.find(a, BETA), s))).collect(), &all);
        let beta_panels = panels(
            &|m, s| betas.iter().map(|&b| (b / 1e9, self.overhead_at(m, self.find(ALPHA, b), s))).collect(),
            &all,
        );
        let share_panels =
            panels(&|m, s| alphas.iter().map(|&a| (a, self.share_at(m, self.find(a, BETA), s))).collect(), &mixed);
        let sizes = format!("batch {}, {}×{}, {}", args.batch, args.image, args.image, args.profile());
        let svgs = [
            render_marked(
                &format!("Time overhead vs memory (α), β = 12 GB/s; {sizes}"),
                (
                    "α: budget = (1−α)·M_low + α·M_high (÷4, ÷6: the budgets dividing the activations by 4 and 6)",
                    "overhead over T_seq (%)",
                ),
                &SOLVERS,
                &alpha_panels,
                (Some(100.0), Some((20.0, "thesis: pofo within +20%"))),
                &self.setups.iter().map(division_marks).collect::<Vec<_>>(),
            ),
            render(
                &format!("Time overhead vs bandwidth, α = 0.2; {sizes}"),
                "β (GB/s)",
                "overhead over T_seq (%)",
                &SOLVERS,
                &beta_panels,
                Some(100.0),
                Some((20.0, "thesis: pofo within +20%")),
            ),
            render(
                &format!("Share of the saved activations offloaded, β = 12 GB/s; {sizes}"),
                "α: budget = (1−α)·M_low + α·M_high",
                "offloaded / Σ ā_i (%)",
                &SOLVERS,
                &share_panels,
                None,
                None,
            ),
        ];
        paths[1..]
            .iter()
            .zip(svgs)
            .map(|(path, svg)| svg.map_err(|e| anyhow!("`{}`: cannot draw the plot: {e}", path.display())))
            .collect()
    }

    /// The summary's tables: every point's overheads (and pofo's offloaded share), then
    /// the division factors.
    fn summary(&self) -> String {
        let fmt = |c: Cell, setup: &Setup| match c {
            Cell::Feasible { makespan, .. } => format!("{:+.1}%", 100.0 * overhead(makespan, setup.t_seq)),
            Cell::Infeasible => "—".to_string(),
            Cell::Failed(_) => "error".to_string(),
        };
        let mut header = vec!["model".to_string(), "α".to_string(), "β GB/s".to_string()];
        header.extend(SOLVERS.iter().map(|s| s.to_string()));
        header.push("pofo offl.".to_string());
        let mut rows = Vec::new();
        for (m, setup) in self.setups.iter().enumerate() {
            for (p, &(alpha, beta)) in self.points.iter().enumerate() {
                let mut row = vec![setup.name.clone(), format!("{alpha:.2}"), format!("{:.0}", beta / 1e9)];
                row.extend((0..SOLVERS.len()).map(|s| fmt(self.cell(m, p, s), setup)));
                let pofo = SOLVERS.iter().position(|n| *n == "pofo").unwrap_or(0);
                row.push(self.share_at(m, Some(p), pofo).map_or("—".to_string(), |v| format!("{v:.0}%")));
                rows.push(row);
            }
        }
        let right: Vec<bool> = (0..header.len()).map(|i| i > 0).collect();
        let mut summary = out::table(&header, &rows, &right);
        let fheader: Vec<String> =
            ["model", "M_high − static", "ceiling (M_low)", "pofo ≤20%", "factor", "rotor ≤20%", "factor"]
                .map(String::from)
                .to_vec();
        let gib = pebble_graph::units::format_bytes;
        let frows: Vec<Vec<String>> = self
            .setups
            .iter()
            .enumerate()
            .map(|(m, setup)| {
                let mut row = vec![
                    setup.name.clone(),
                    gib(setup.m_high.saturating_sub(setup.chain.static_bytes)),
                    format!("{:.2}", factor(setup, setup.m_low)),
                ];
                for name in FACTOR_SOLVERS {
                    match self.thresholds.get(&(m, name)).copied().flatten() {
                        Some(t) => {
                            row.push(gib(t.budget.saturating_sub(setup.chain.static_bytes)));
                            row.push(format!("{:.2}", factor(setup, t.budget)));
                        }
                        None => row.extend(["—".to_string(), "—".to_string()]),
                    }
                }
                row
            })
            .collect();
        summary.push('\n');
        summary.push_str("activation memory divided, at ≤ 20% overhead:\n");
        summary.push_str(&out::table(&fheader, &frows, &[false, true, true, true, true, true, true]));
        summary
    }
}

/// Two parameters equal up to rounding.
fn same(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
}

/// `part / whole`, 0 for an empty whole.
fn share(part: f64, whole: u64) -> f64 {
    if whole > 0 {
        part / whole as f64
    } else {
        0.0
    }
}

/// `(M^high − static) / (budget − static)`.
fn factor(setup: &Setup, budget: u64) -> f64 {
    let s = setup.chain.static_bytes;
    setup.m_high.saturating_sub(s) as f64 / budget.saturating_sub(s).max(1) as f64
}

/// Where the thesis's ÷4 and ÷6 fall on a model's α axis (the budgets that divide its
/// activation memory by 4 and 6), for those at or above `M^low`.
fn division_marks(setup: &Setup) -> Vec<(f64, String)> {
    let s = setup.chain.static_bytes;
    let (high, low) = (setup.m_high.saturating_sub(s) as f64, setup.m_low.saturating_sub(s) as f64);
    [4.0, 6.0]
        .iter()
        .filter(|&&k| high / k >= low && high > low)
        .map(|&k| ((high / k - low) / (high - low), format!("÷{k}")))
        .collect()
}

/// The command line that reproduces this run.
fn command_line(args: &ReproduceArgs) -> String {
    format!(
        "pebble reproduce ch4 --models {} --batch {} --image {} --profile {}{}",
        args.models.join(","),
        args.batch,
        args.image,
        args.profile(),
        if args.quick { " --quick" } else { "" }
    )
}

/// Builds a model's chain and its references.
fn setup(name: &str, args: &ReproduceArgs) -> anyhow::Result<Setup> {
    let (chain, machine) = if name.ends_with(".json") { chain_file(name, args)? } else { zoo_chain(name, args)? };
    let name =
        if name.ends_with(".json") { chain.name.clone().unwrap_or_else(|| name.to_string()) } else { name.to_string() };
    let subject = Subject::Chain(chain);
    let store_all = subject.store_all(&machine)?;
    let Subject::Chain(chain) = subject else { unreachable!("built as a chain") };
    let recompute_all = pebble_solve::solver("recompute-all").map_err(|e| anyhow!("{e}"))?;
    let m_low = pebble_solve::plan(recompute_all, Problem::Chain(&chain), u64::MAX, &options_for(&machine, BETA))
        .map_err(|e| anyhow!("{name}: recompute-all: {e}"))?
        .report
        .peak_bytes
        .min(store_all.peak_bytes);
    let saved_bytes = chain.xbar.iter().sum();
    Ok(Setup { name, chain, machine, t_seq: store_all.makespan, m_high: store_all.peak_bytes, m_low, saved_bytes })
}

/// A zoo model's chain at `--batch` and `--image`, and its profile's machine.
fn zoo_chain(name: &str, args: &ReproduceArgs) -> anyhow::Result<(Chain, Machine)> {
    let opts = ModelOpts {
        size: SizeOpts {
            batch: Some(crate::flags::BatchArg::Fixed(args.batch)),
            image: Some(args.image),
            seq: None,
            layers: None,
            width: None,
            heads: None,
        },
        dtype: None,
        optimizer: None,
        master_weights: false,
        trainable: None,
        profile: Some(args.profile()),
        device: None,
    };
    let (model, options) = build_model(name, &opts)?;
    Ok((model.chain, options.profile.machine))
}

/// A chain file in bytes and seconds (as `pebble graph --view chain` writes it, e.g.
/// `scripts/ch4_eager_chains.py`'s), planned on `--profile`'s machine.
fn chain_file(path: &str, args: &ReproduceArgs) -> anyhow::Result<(Chain, Machine)> {
    let flag = "--models";
    let text = crate::source::read_file(std::path::Path::new(path), flag)?;
    let chain = Chain::from_json(&text).map_err(|e| crate::error::bad(format!("{flag} `{path}`: {e}")))?;
    let profile = crate::source::lookup_profile("--profile", &args.profile())?;
    Ok((chain, profile.machine))
}

/// The solver options at bandwidth `beta`, both directions.
fn options_for(machine: &Machine, beta: f64) -> SolveOptions {
    SolveOptions {
        machine: machine.with_bandwidth(beta),
        progress: pebble_solve::Progress::none(),
        ..SolveOptions::default()
    }
}

/// Bytes offloaded by a schedule: `Σ fraction × size` over its offloads.
fn offloaded_bytes(chain: &Chain, schedule: &Schedule) -> f64 {
    schedule
        .ops
        .iter()
        .map(|op| match *op {
            Op::Offload { tensor, fraction } => pebble_schedule::lower::tensor_bytes(chain, tensor) as f64 * fraction,
            _ => 0.0,
        })
        .sum()
}

/// One solver at one budget and bandwidth.
fn solve(setup: &Setup, name: &str, budget: u64, beta: f64) -> Cell {
    let solver = match pebble_solve::solver(name) {
        Ok(s) => s,
        Err(e) => return Cell::Failed(e.to_string()),
    };
    match pebble_solve::plan(solver, Problem::Chain(&setup.chain), budget, &options_for(&setup.machine, beta)) {
        Ok(plan) => Cell::Feasible {
            makespan: plan.report.makespan,
            peak: plan.report.peak_bytes,
            offloaded: offloaded_bytes(&setup.chain, &plan.schedule),
            d2h_busy: plan.report.d2h_busy,
            seconds: plan.solve_seconds,
        },
        Err(PlanError::Solve(SolveError::Infeasible { .. })) => Cell::Infeasible,
        Err(e) => Cell::Failed(e.to_string()),
    }
}

/// The least budget in `[M^low, M^high]` at which `name`'s overhead is at most [`LIMIT`]
/// at β = 12 GB/s, by bisection (`steps` steps; overhead taken as falling with memory).
fn bisect(setup: &Setup, name: &str, steps: usize) -> Option<Threshold> {
    let ok = |budget: u64| match solve(setup, name, budget, BETA) {
        Cell::Feasible { makespan, .. } => {
            let o = overhead(makespan, setup.t_seq);
            (o <= LIMIT).then_some(o)
        }
        _ => None,
    };
    let (mut lo, mut hi) = (setup.m_low, setup.m_high);
    let mut best = Threshold { budget: hi, overhead: ok(hi)? };
    if let Some(o) = ok(lo) {
        return Some(Threshold { budget: lo, overhead: o });
    }
    for _ in 0..steps {
        let mid = lo + (hi - lo) / 2;
        match ok(mid) {
            Some(o) => {
                best = Threshold { budget: mid, overhead: o };
                hi = mid;
            }
            None => lo = mid,
        }
    }
    Some(best)
}

/// A curve's `(x, y)` points, `None` where infeasible.
pub(super) type Points = Vec<(f64, Option<f64>)>;

/// One panel of a chart: a model, and a curve per solver (its index in the chart's
/// names) of `(x, y)` points, `None` where infeasible.
pub(super) struct Panel {
    pub title: String,
    pub curves: Vec<(usize, Points)>,
}

/// Draws one panel per model in a grid, a line with markers per solver; values above
/// `cap` are drawn at it (offload-only's overhead at low memory would flatten the rest);
/// `reference` (a value and its label) is a dashed line across every panel.
pub(super) fn render(
    title: &str,
    x_desc: &str,
    y_desc: &str,
    names: &[&str],
    panels: &[Panel],
    cap: Option<f64>,
    reference: Option<(f64, &str)>,
) -> Result<String, String> {
    render_marked(title, (x_desc, y_desc), names, panels, (cap, reference), &[])
}

/// [`render`], with dashed vertical lines in each panel: `marks[i]`, the x and label of
/// each of panel `i`'s (the axis stretches to show them).
fn render_marked(
    title: &str,
    (x_desc, y_desc): (&str, &str),
    names: &[&str],
    panels: &[Panel],
    (cap, reference): (Option<f64>, Option<(f64, &str)>),
    marks: &[Vec<(f64, String)>],
) -> Result<String, String> {
    let err = |e: &dyn std::fmt::Display| e.to_string();
    let cols = panels.len().clamp(1, 3);
    let rows = panels.len().div_ceil(cols).max(1);
    let size = ((cols as u32 * 520).max(960), rows as u32 * 400 + 50);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, size).into_drawing_area();
        root.fill(&WHITE).map_err(|e| err(&e))?;
        let root = root.titled(title, ("sans-serif", 22)).map_err(|e| err(&e))?;
        let areas = root.split_evenly((rows, cols));
        for (i, (panel, area)) in panels.iter().zip(areas.iter()).enumerate() {
            let panel_marks = marks.get(i).map(Vec::as_slice).unwrap_or(&[]);
            let xs = panel.curves.iter().flat_map(|c| c.1.iter().map(|p| p.0)).chain(panel_marks.iter().map(|m| m.0));
            let (xmin, xmax) = xs.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), x| (a.min(x), b.max(x)));
            let (xmin, xmax) = if xmin.is_finite() { (xmin, xmax) } else { (0.0, 1.0) };
            let ys = panel.curves.iter().flat_map(|c| c.1.iter().filter_map(|p| p.1));
            let ymax = ys.fold(0.0f64, f64::max);
            let clipped = cap.is_some_and(|c| ymax > c);
            let top = match cap {
                Some(c) if ymax > c => c,
                _ => ymax,
            };
            let caption = if clipped {
                format!("{} (above {top:.0}% drawn at {top:.0}%)", panel.title)
            } else {
                panel.title.clone()
            };
            let top = if top > 0.0 { top * 1.15 } else { 1.0 };
            let xpad = if xmax > xmin { 0.04 * (xmax - xmin) } else { 0.5 };
            let top = if clipped { cap.unwrap_or(top) * 1.05 } else { top };
            let mut chart = ChartBuilder::on(area)
                .caption(caption, ("sans-serif", 16))
                .margin(10)
                .x_label_area_size(40)
                .y_label_area_size(55)
                .build_cartesian_2d((xmin - xpad)..(xmax + xpad), (-0.03 * top)..top)
                .map_err(|e| err(&e))?;
            chart.configure_mesh().x_desc(x_desc).y_desc(y_desc).draw().map_err(|e| err(&e))?;
            if let Some((y, label)) = reference {
                crate::plot::reference_line(&mut chart, (xmin, xmax), y, (label, 12))?;
            }
            for (x, label) in panel_marks {
                let line =
                    DashedLineSeries::new(vec![(*x, 0.0), (*x, 0.97 * top)], 6, 4, BLACK.mix(0.4).stroke_width(1));
                chart.draw_series(line).map_err(|e| err(&e))?;
                let font = ("sans-serif", 12).into_font().color(&BLACK.mix(0.7));
                chart
                    .draw_series(std::iter::once(Text::new(label.clone(), (*x, 0.97 * top), font)))
                    .map_err(|e| err(&e))?;
            }
            for (s, points) in &panel.curves {
                let color = COLORS[*s % COLORS.len()];
                let limit = cap.unwrap_or(f64::INFINITY);
                let pts: Vec<Option<(f64, f64)>> = points.iter().map(|&(x, y)| y.map(|y| (x, y.min(limit)))).collect();
                for run in crate::plot::runs(&pts) {
                    chart.draw_series(LineSeries::new(run, color.stroke_width(2))).map_err(|e| err(&e))?;
                }
                let feasible = pts.iter().flatten().copied();
                let series = match s % 4 {
                    0 => chart.draw_series(feasible.map(|p| Circle::new(p, 4, color.filled()))),
                    1 => chart.draw_series(feasible.map(|p| TriangleMarker::new(p, 6, color.filled()))),
                    2 => chart.draw_series(
                        feasible.map(|p| EmptyElement::at(p) + Rectangle::new([(-4, -4), (4, 4)], color.filled())),
                    ),
                    _ => chart.draw_series(feasible.map(|p| Cross::new(p, 5, color.stroke_width(2)))),
                }
                .map_err(|e| err(&e))?;
                if i == 0 {
                    series
                        .label(names[*s])
                        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
                }
            }
            if i == 0 {
                chart
                    .configure_series_labels()
                    .position(SeriesLabelPosition::UpperRight)
                    .background_style(WHITE.mix(0.9))
                    .border_style(BLACK)
                    .draw()
                    .map_err(|e| err(&e))?;
            }
        }
        root.present().map_err(|e| err(&e))?;
    }
    Ok(svg)
}

#[cfg(test)]
mod tests {
    use super::super::run;
    use super::*;
    use crate::flags::Experiment;

    /// `reproduce ch4 --quick` on a tiny ResNet: every solver at every point, and pofo
    /// (which contains rotor's and offload-dp's schedules) never slower than either.
    #[test]
    fn quick_ch4_on_a_tiny_model() {
        let dir = std::env::temp_dir().join(format!("pebble-reproduce-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let args = ReproduceArgs {
            experiment: Experiment::Ch4,
            models: vec!["resnet18".to_string()],
            batch: 2,
            image: 64,
            profile: Some("v100".to_string()),
            out_dir: dir.clone(),
            quick: true,
            ilp: false,
            force: false,
        };
        run(&args).unwrap();
        // The files exist now: a second run is refused without --force.
        assert!(run(&args).is_err());
        let json: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("ch4.json")).unwrap()).unwrap();
        for file in &FILES[1..] {
            assert!(std::fs::read_to_string(dir.join(file)).unwrap().contains("<svg"));
        }
        let models = json["models"].as_array().unwrap();
        assert_eq!(models.len(), 1);
        let model = &models[0];
        assert!(model["division_factor"]["pofo"]["factor"].as_f64().unwrap() >= 1.0);
        let sweeps = [&model["alpha_sweep"], &model["beta_sweep"]];
        let points: Vec<&Value> = sweeps.iter().flat_map(|s| s.as_array().unwrap().iter()).collect();
        assert_eq!(points.len(), 3 + 2);
        for point in points {
            let solvers = &point["solvers"];
            for name in SOLVERS {
                assert!(solvers[name]["feasible"].is_boolean(), "{name} missing at {point}");
                assert!(solvers[name].get("error").is_none(), "{name} failed at {point}");
            }
            let pofo = solvers["pofo"]["overhead"].as_f64();
            for other in ["rotor", "offload-dp"] {
                if let Some(o) = solvers[other]["overhead"].as_f64() {
                    let p = pofo.unwrap_or_else(|| panic!("pofo infeasible where {other} is: {point}"));
                    assert!(p <= o + 1e-9, "pofo {p} > {other} {o} at {point}");
                }
            }
        }
        // The same chain read from a file (`--models FILE.json`) gives the same figures.
        let file = dir.join("resnet18-chain.json");
        std::fs::write(&file, zoo_chain("resnet18", &args).unwrap().0.to_json()).unwrap();
        let from_file =
            ReproduceArgs { models: vec![file.display().to_string()], out_dir: dir.join("from-file"), ..args.clone() };
        run(&from_file).unwrap();
        let again: Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("from-file/ch4.json")).unwrap()).unwrap();
        let again = &again["models"][0];
        for key in ["m_high_bytes", "m_low_bytes", "t_seq", "static_bytes", "stages"] {
            assert_eq!(again[key], model[key], "{key}");
        }
        let ceiling = again["factor_ceiling"].as_f64().unwrap();
        let (high, low, s) = (
            model["m_high_bytes"].as_f64().unwrap(),
            model["m_low_bytes"].as_f64().unwrap(),
            model["static_bytes"].as_f64().unwrap(),
        );
        assert!((ceiling - (high - s) / (low - s)).abs() < 1e-9 && ceiling > 1.0, "{ceiling}");
        let overheads = |m: &Value| -> Vec<Value> {
            let points = m["alpha_sweep"].as_array().unwrap();
            points.iter().flat_map(|p| SOLVERS.map(|n| p["solvers"][n]["overhead"].clone())).collect()
        };
        assert_eq!(overheads(again), overheads(model));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
