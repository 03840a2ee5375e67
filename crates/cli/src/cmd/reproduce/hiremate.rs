//! `pebble reproduce hiremate`: why HiRemate lost to Rockmate, one suspect at a time
//! (issue 15), and where HiRemate stands against Rockmate and Rotor.
//!
//! What it runs, on the V100 profile's roofline costs with Adam, every budget a share of
//! the activations (`--activation-budget`):
//! * **the suspects** on GPT-2 small (50%, 40%) and large (50%, 30%): HiRemate as it was
//!   before issue 15 ([`HiremateConfig::BEFORE_ISSUE_15`]: H-Partition alone, 8 peak
//!   budgets per cluster, the thesis' option selection with `N_o = 60`, no correction
//!   terms), then that with one change each, then every change (today's `hiremate`), and
//!   that with the correction terms too;
//! * **the non-sequential models** (U-Net, the encoder-decoder Transformer,
//!   Inception-v3, DenseNet-121) at 50%: `hiremate` against `rockmate` and `rotor`.
//!
//! Each run reports the simulator's overhead and peak, the solve time, and whether every
//! MILP was solved to optimality (the schedule's `optimal`). With `--quick`, GPT-2 small
//! only.

use std::process::ExitCode;
use std::time::Instant;

use anyhow::anyhow;
use pebble_graph::units::BudgetSpec;
use pebble_ilp::hiremate::{Hiremate, HiremateConfig, Selection};
use pebble_solve::budget::BudgetRequest;
use pebble_solve::{PlanError, Problem, SolveError, SolveOptions, Solver};
use pebble_zoo::ModelOptions;
use serde_json::{json, Value};

use crate::flags::ReproduceArgs;

/// The output file, in `--out-dir`.
const FILE: &str = "hiremate.json";

/// The sequential cases of the issue's acceptance: model and share of the activations.
const GPT_CASES: [(&str, f64); 4] =
    [("gpt2-small", 50.0), ("gpt2-small", 40.0), ("gpt2-large", 50.0), ("gpt2-large", 30.0)];

/// The non-sequential models, at half their activations.
const GRAPH_CASES: [(&str, f64); 4] =
    [("unet", 50.0), ("transformer", 50.0), ("inception_v3", 50.0), ("densenet121", 50.0)];

/// A HiRemate variant: its name in the table and its knobs.
fn variants() -> Vec<(&'static str, HiremateConfig)> {
    let before = HiremateConfig::BEFORE_ISSUE_15;
    vec![
        ("before issue 15", before),
        ("(peak, save) grid 10×10", HiremateConfig { grid: (10, 10), ..before }),
        ("grid, N_o 400", HiremateConfig { grid: (10, 10), max_options: 400, ..before }),
        (
            "grid, N_o 400, Pareto",
            HiremateConfig { grid: (10, 10), max_options: 400, selection: Selection::Pareto, ..before },
        ),
        ("Pareto selection, even quotas", HiremateConfig { selection: Selection::Pareto, ..before }),
        ("N_o 60 → 400", HiremateConfig { max_options: 400, ..before }),
        ("blocks first", HiremateConfig { blocks_first: true, ..before }),
        ("correction terms (3.34)", HiremateConfig { correction_terms: true, ..before }),
        (
            "all but the incumbents (Rockmate's, the min cut's and Checkmate's start)",
            HiremateConfig {
                rockmate_incumbent: false,
                mincut_incumbent: false,
                start_incumbent: false,
                ..HiremateConfig::DEFAULT
            },
        ),
        ("all (hiremate)", HiremateConfig::DEFAULT),
        ("all, with correction terms", HiremateConfig { correction_terms: true, ..HiremateConfig::DEFAULT }),
    ]
}

pub fn hiremate(args: &ReproduceArgs) -> anyhow::Result<ExitCode> {
    let started = Instant::now();
    let paths = super::output_paths(args, &[FILE])?;
    let profile = crate::source::lookup_profile("--profile", &args.profile())?;
    let options = SolveOptions { machine: profile.machine, ..SolveOptions::default() };
    let gpt: Vec<(&str, f64)> = GPT_CASES.iter().copied().filter(|(m, _)| !args.quick || *m == "gpt2-small").collect();
    let mut suspects = Vec::new();
    for &(model, percent) in &gpt {
        let case = Case::new(model, percent, &profile)?;
        let mut row = json!({ "model": model, "activation_percent": percent });
        for (name, config) in variants() {
            row[name] = case.run(&Hiremate { config }, &options);
            eprintln!("{model} at {percent}%: {name}: {}", row[name]);
        }
        for solver in ["rockmate", "rotor"] {
            row[solver] = case.run(pebble_solve::solver(solver)?, &options);
        }
        suspects.push(row);
    }
    let mut graphs = Vec::new();
    for &(model, percent) in GRAPH_CASES.iter().filter(|_| !args.quick) {
        let case = Case::new(model, percent, &profile)?;
        let mut row = json!({ "model": model, "activation_percent": percent });
        for solver in ["hiremate", "rockmate", "rotor"] {
            row[solver] = case.run(pebble_solve::solver(solver)?, &options);
            eprintln!("{model} at {percent}%: {solver}: {}", row[solver]);
        }
        graphs.push(row);
    }
    let report = json!({
        "experiment": "hiremate",
        "profile": args.profile(),
        "suspects": suspects,
        "graphs": graphs,
    });
    println!("{}", table(&report));
    super::write_outputs(args, &paths, &report, &[], started)
}

/// One model at one budget, in both views (`rotor` plans the chain).
struct Case {
    model: pebble_zoo::Model,
    /// Planned bytes and store-all's time: graph view, chain view.
    graph: (u64, f64),
    chain: (u64, f64),
}

impl Case {
    fn new(name: &str, percent: f64, profile: &pebble_machine::Profile) -> anyhow::Result<Case> {
        let options = ModelOptions { profile: profile.clone(), ..ModelOptions::default() };
        let model = pebble_zoo::build(name, &options).map_err(|e| anyhow!("{name}: {e}"))?;
        let resolve = |problem: Problem<'_>, static_bytes: u64| -> anyhow::Result<(u64, f64)> {
            let report = pebble_solve::baseline::store_all::simulate_store_all(
                problem,
                &pebble_sim::SimConfig::on(profile.machine),
            )?;
            let budget = BudgetRequest::Activation(BudgetSpec::Percent(percent)).resolve(
                report.peak_bytes,
                static_bytes,
                &profile.machine.runtime,
            );
            Ok((budget.planned_bytes, report.makespan))
        };
        let static_bytes = model.graph.static_bytes();
        let graph = resolve(Problem::Graph(&model.graph), static_bytes)?;
        let chain = resolve(Problem::Chain(&model.chain), static_bytes)?;
        Ok(Case { model, graph, chain })
    }

    /// Plans with `solver` (on the graph if it can): overhead, peak, solve time and
    /// optimality, or why not.
    fn run(&self, solver: &dyn Solver, options: &SolveOptions) -> Value {
        let started = Instant::now();
        let ((planned, baseline), problem) = if solver.views().contains(&pebble_schedule::View::Graph) {
            (self.graph, Problem::Graph(&self.model.graph))
        } else {
            (self.chain, Problem::Chain(&self.model.chain))
        };
        match pebble_solve::plan(solver, problem, planned, options) {
            Ok(plan) => json!({
                "overhead": plan.report.makespan / baseline - 1.0,
                "peak_bytes": plan.report.peak_bytes,
                "solve_seconds": started.elapsed().as_secs_f64(),
                "optimal": plan.schedule.optimal,
            }),
            Err(PlanError::Solve(SolveError::Infeasible { .. })) => json!({ "infeasible": true }),
            Err(e) => json!({ "error": e.to_string() }),
        }
    }
}

/// The report as Markdown tables: overhead (solve seconds) per variant.
fn table(report: &Value) -> String {
    let cell = |v: &Value| match v.get("overhead").and_then(Value::as_f64) {
        Some(o) => format!(
            "{:+.1}% ({:.0} s{})",
            100.0 * o,
            v["solve_seconds"].as_f64().unwrap_or(0.0),
            if v["optimal"] == json!(false) { ", not proven" } else { "" }
        ),
        None if v.get("infeasible").is_some() => "infeasible".into(),
        None => "error".into(),
    };
    let mut out = String::new();
    let names: Vec<&str> = variants().into_iter().map(|(n, _)| n).chain(["rockmate", "rotor"]).collect();
    out.push_str(&format!(
        "| variant | {} |\n|---|",
        report["suspects"].as_array().map_or(String::new(), |rows| {
            rows.iter()
                .map(|r| format!("{} @ {}%", r["model"].as_str().unwrap_or(""), r["activation_percent"]))
                .collect::<Vec<_>>()
                .join(" | ")
        })
    ));
    for _ in report["suspects"].as_array().into_iter().flatten() {
        out.push_str("---|");
    }
    out.push('\n');
    for name in &names {
        out.push_str(&format!("| {name} |"));
        for row in report["suspects"].as_array().into_iter().flatten() {
            out.push_str(&format!(" {} |", cell(&row[*name])));
        }
        out.push('\n');
    }
    if let Some(rows) = report["graphs"].as_array().filter(|r| !r.is_empty()) {
        out.push_str("\n| model | `hiremate` | `rockmate` | `rotor` |\n|---|---|---|---|\n");
        for row in rows {
            out.push_str(&format!(
                "| {} @ {}% | {} | {} | {} |\n",
                row["model"].as_str().unwrap_or(""),
                row["activation_percent"],
                cell(&row["hiremate"]),
                cell(&row["rockmate"]),
                cell(&row["rotor"])
            ));
        }
    }
    out
}
