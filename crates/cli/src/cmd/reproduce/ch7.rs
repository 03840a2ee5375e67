//! `pebble reproduce ch7`: Shilova's thesis, Ch. 7 (§7.3), in simulation: MadPipe against
//! PipeDream's partitioning scheduled with 1F1B\* (the thesis's "DP+1F1B\*"), and the
//! schedules used today (GPipe, 1F1B with a flush, interleaved 1F1B, ZB-H1, ZB-V) under
//! the same memory limits.
//!
//! The grid is the thesis's: ResNet-50, ResNet-101, Inception-v3 and DenseNet-121 at
//! 1000×1000, batch 8 (one micro-batch), on `P = 2…8` devices of `M = 3…16` GB, links of
//! β = 12 and 24 GB/s, with `C = 3` (two weight versions and a gradient: the models are
//! built with SGD, no optimizer state). The period is the steady-state time per
//! micro-batch the simulator measures (a flushed step's time over its `2P`
//! micro-batches). The thesis's Fig. 7.8 is the geometric mean over `P` and β of
//! `period(X) / period(MadPipe)` at each `M`; its headline is that PipeDream's is above
//! 1.2 below 10 GB, and up to 2–3 somewhere.
//!
//! MadPipe's phase 2 here is 1F1B\*'s construction on phase 1's stage chain
//! ([`pebble_solve::pipeline::madpipe::schedule_placement`]), not the thesis's one-minute
//! ILP: the grid has hundreds of points (`--ilp` runs the ILP as `pebble pipeline
//! --solver madpipe` does, with a 10 s limit).
//!
//! Why a case fits no solver ([`memory`]): `cases` gives each case's least memory per
//! device with one micro-batch in flight per stage, under pebble's accounting and the
//! thesis's `𝓜(i, j, g)`, and whether 1F1B\* fits the least-memory contiguous
//! allocation; `thesis_accounting` runs MadPipe and PipeDream on the layers as the
//! thesis counts them (a layer keeps its input only, no temporaries).

mod chart;
mod memory;

use std::collections::HashMap;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::anyhow;
use pebble_graph::Layers;
use pebble_solve::pipeline::{pipe_solver, plan_pipeline, PipeError, PipeProblem};
use serde_json::{json, Value};

use crate::cmd::{parallel_map, worker_count};
use crate::flags::{ModelOpts, OptimizerArg, ReproduceArgs, SizeOpts};
use crate::source::build_model;

/// The solvers, MadPipe first (the reference of the ratios).
pub const SOLVERS: [&str; 7] = ["madpipe", "pipedream", "1f1b", "gpipe", "interleaved-1f1b", "zb-h1", "zb-v"];
/// The solvers run on the layers as the thesis counts their memory: its comparison.
const THESIS_SOLVERS: [&str; 2] = ["madpipe", "pipedream"];
const MODELS: [&str; 4] = ["resnet50", "resnet101", "inception_v3", "densenet121"];
const FILES: [&str; 4] = ["ch7.json", "ch7-ratio.svg", "ch7-resnet50.svg", "ch7-ratio-models.svg"];

/// The ratio charts' reference lines: MadPipe itself, and the thesis's "over 20%".
const REFERENCES: [(f64, &str); 2] = [(1.0, "MadPipe"), (1.2, "thesis: +20% below 10 GB")];
const GB: f64 = 1e9;

#[derive(Debug, Clone)]
enum Cell {
    Feasible { period: f64, expected: Option<f64>, peak: u64, seconds: f64 },
    Infeasible,
    Failed(String),
}

impl Cell {
    fn period(&self) -> Option<f64> {
        match self {
            Cell::Feasible { period, .. } => Some(*period),
            _ => None,
        }
    }

    fn expected(&self) -> Option<f64> {
        match self {
            Cell::Feasible { expected, .. } => *expected,
            _ => None,
        }
    }
}

fn layers(name: &str, args: &ReproduceArgs) -> anyhow::Result<Layers> {
    let opts = ModelOpts {
        size: SizeOpts {
            batch: Some(crate::flags::BatchArg::Fixed(8)),
            image: Some(1000),
            seq: None,
            layers: None,
            width: None,
            heads: None,
        },
        dtype: None,
        optimizer: Some(OptimizerArg::Sgd),
        master_weights: false,
        trainable: None,
        profile: Some(args.profile()),
        device: None,
    };
    let (model, _) = build_model(name, &opts)?;
    Ok(Layers::from_chain(&model.chain))
}

fn solve(layers: &Layers, solver: &str, devices: usize, memory: f64, beta: f64, ilp: bool) -> Cell {
    let Ok(s) = pipe_solver(solver) else { return Cell::Failed(format!("no solver `{solver}`")) };
    let mut p = PipeProblem::new(layers, devices, Some(memory as u64), beta);
    p.time_limit = if ilp { 10.0 } else { 0.0 };
    match plan_pipeline(s, &p) {
        Ok(plan) => Cell::Feasible {
            period: plan.report.period,
            expected: plan.expected_period,
            peak: plan.report.peak_bytes_per_device.iter().copied().max().unwrap_or(0),
            seconds: plan.solve_seconds,
        },
        Err(PipeError::Infeasible { .. }) => Cell::Infeasible,
        Err(e) => Cell::Failed(e.to_string()),
    }
}

fn geomean(v: &[f64]) -> Option<f64> {
    (!v.is_empty()).then(|| (v.iter().map(|x| x.ln()).sum::<f64>() / v.len() as f64).exp())
}

/// A cell's key: model, P, M in tenths of GB, β in tenths of GB/s, solver.
type Key = (usize, usize, u64, u64, usize);

/// The key of model `m` on `p` devices of `mem` GB, links of `b` GB/s, under solver `s`.
fn key(m: usize, p: usize, mem: f64, b: f64, s: usize) -> Key {
    (m, p, (mem * 10.0) as u64, (b * 10.0) as u64, s)
}

/// The grid's axes: devices `P`, memories `M` (GB) and bandwidths β (GB/s).
struct Grid {
    devices: Vec<usize>,
    memories: Vec<f64>,
    betas: Vec<f64>,
}

/// The models, the grid and every cell: what the report and the charts read.
struct Results {
    models: Vec<(String, Layers)>,
    grid: Grid,
    /// The solvers, MadPipe first; a key's solver is an index into them.
    solvers: &'static [&'static str],
    cells: HashMap<Key, Cell>,
}

/// The ratios to MadPipe: per solver, its geometric mean at each memory (the JSON of
/// each), and the headline figures by solver.
type Ratios = (Vec<(String, Vec<Value>)>, serde_json::Map<String, Value>);

pub fn ch7(args: &ReproduceArgs) -> anyhow::Result<ExitCode> {
    let started = Instant::now();
    let paths = super::output_paths(args, &FILES)?;
    for name in SOLVERS {
        pipe_solver(name).map_err(|e| anyhow!("{e}"))?;
    }
    let grid = Grid::new(args.quick);
    let models: Vec<(String, Layers)> =
        MODELS.iter().map(|m| layers(m, args).map(|l| (m.to_string(), l))).collect::<anyhow::Result<_>>()?;
    let results = Results::run(models, grid, &SOLVERS, args.ilp, "pipelines")?;
    let thesis_models = results.models.iter().map(|(n, l)| (n.clone(), memory::thesis_layers(l))).collect();
    // Below 10 GB only, where the thesis's claim is (MadPipe's DP, the cost of the run,
    // has room for more allocations on these layers: a second full grid would double it).
    let mut below_10 = Grid::new(args.quick);
    below_10.memories.retain(|&m| m < 10.0);
    let thesis = Results::run(thesis_models, below_10, &THESIS_SOLVERS, args.ilp, "thesis accounting")?;
    let (ratio_rows, headline) = results.ratios();
    let Grid { devices, memories, betas } = &results.grid;
    let report = json!({
        "experiment": "Shilova's thesis, Ch. 7: MadPipe against PipeDream (DP+1F1B*) and today's schedules",
        "command": format!("pebble reproduce ch7{}{}", if args.quick { " --quick" } else { "" }, if args.ilp { " --ilp" } else { "" }),
        "models": MODELS, "batch": 8, "image": 1000, "profile": args.profile(),
        "devices": devices, "memory_gb": memories, "beta_gbps": betas,
        "madpipe_phase2": if args.ilp { "the Ch. 6 ILP on the stage chain, 10 s limit, or 1F1B*'s construction if better" } else { "1F1B*'s construction on the stage chain" },
        "ratio_to_madpipe": headline,
        "ratio_by_memory": ratio_rows.iter().map(|(n, r)| json!({ "solver": n, "by_memory": r })).collect::<Vec<_>>(),
        "points": results.points_json(),
        "cases": results.cases_json()?,
        "thesis_accounting": thesis.thesis_json(),
        "seconds": started.elapsed().as_secs_f64(),
    });
    let (ratio_svg, resnet_svg) = results.charts(&ratio_rows)?;
    let models_svg = results.model_chart()?;
    super::write_outputs(args, &paths, &report, &[&ratio_svg, &resnet_svg, &models_svg], started)
}

impl Grid {
    /// The thesis's grid, or `--quick`'s smaller one.
    fn new(quick: bool) -> Grid {
        Grid {
            devices: if quick { vec![2, 4, 8] } else { (2..=8).collect() },
            memories: if quick { vec![3.0, 6.0, 10.0, 16.0] } else { vec![3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 12.0, 16.0] },
            betas: if quick { vec![12.0] } else { vec![12.0, 24.0] },
        }
    }

    /// Every job of `models` models and `solvers` solvers, as (model, P, M, β, solver).
    fn jobs(&self, models: usize, solvers: usize) -> Vec<(usize, usize, f64, f64, usize)> {
        let mut jobs = Vec::new();
        for m in 0..models {
            for &p in &self.devices {
                for &mem in &self.memories {
                    for &b in &self.betas {
                        for s in 0..solvers {
                            jobs.push((m, p, mem, b, s));
                        }
                    }
                }
            }
        }
        jobs
    }
}

impl Results {
    /// Every cell of `solvers` on `models` over `grid`, warning of the solvers that failed.
    fn run(
        models: Vec<(String, Layers)>,
        grid: Grid,
        solvers: &'static [&'static str],
        ilp: bool,
        what: &str,
    ) -> anyhow::Result<Results> {
        let jobs = grid.jobs(models.len(), solvers.len());
        let found = parallel_map(&jobs, worker_count(8), what, |&(m, p, mem, b, s)| {
            solve(&models[m].1, solvers[s], p, mem * GB, b * GB, ilp)
        })?;
        let cells: HashMap<Key, Cell> =
            jobs.iter().zip(found).map(|(&(m, p, mem, b, s), cell)| (key(m, p, mem, b, s), cell)).collect();
        for ((m, p, mem, b, s), c) in &cells {
            if let Cell::Failed(why) = c {
                eprintln!(
                    "warning: {} on {} ({what}) with P = {p}, M = {} GB, β = {} GB/s failed: {why}",
                    solvers[*s],
                    models[*m].0,
                    *mem as f64 / 10.0,
                    *b as f64 / 10.0
                );
            }
        }
        Ok(Results { models, grid, solvers, cells })
    }

    /// Model `m` on `p` devices of `mem` GB, links of `b` GB/s, under solver `s`.
    fn cell(&self, m: usize, p: usize, mem: f64, b: f64, s: usize) -> Cell {
        self.cells.get(&key(m, p, mem, b, s)).cloned().unwrap_or(Cell::Failed("not run".into()))
    }

    /// Ratios to MadPipe: per solver, per M, over models, P and β (both feasible); and
    /// where only one of the two is feasible.
    fn ratios(&self) -> Ratios {
        let Grid { devices, memories, betas } = &self.grid;
        let mut ratio_rows = Vec::new();
        let mut headline = serde_json::Map::new();
        for (s, name) in self.solvers.iter().enumerate().skip(1) {
            let mut per_m = Vec::new();
            let (mut all, mut below_10, mut largest) = (Vec::new(), Vec::new(), (0.0f64, Value::Null));
            let (mut only_madpipe, mut only_other) = (0, 0);
            for &mem in memories {
                let mut r = Vec::new();
                for (m, _) in self.models.iter().enumerate() {
                    for &p in devices {
                        for &b in betas {
                            match (self.cell(m, p, mem, b, 0).period(), self.cell(m, p, mem, b, s).period()) {
                                (Some(mad), Some(x)) => {
                                    let q = x / mad;
                                    r.push(q);
                                    if q > largest.0 {
                                        let at = json!({ "model": self.models[m].0, "devices": p, "memory_gb": mem, "beta_gbps": b });
                                        largest = (q, at);
                                    }
                                }
                                (Some(_), None) => only_madpipe += 1,
                                (None, Some(_)) => only_other += 1,
                                (None, None) => {}
                            }
                        }
                    }
                }
                all.extend(&r);
                if mem < 10.0 {
                    below_10.extend(&r);
                }
                per_m.push(json!({ "memory_gb": mem, "geomean_ratio": geomean(&r), "cases": r.len() }));
            }
            headline.insert(
                name.to_string(),
                json!({
                    "geomean_ratio": geomean(&all),
                    "geomean_ratio_below_10gb": geomean(&below_10),
                    "largest_ratio": largest.0,
                    "largest_at": largest.1,
                    "cases_both_feasible": all.len(),
                    "cases_only_madpipe_feasible": only_madpipe,
                    "cases_only_this_feasible": only_other,
                    "cases_faster_than_madpipe": all.iter().filter(|&&q| q < 1.0 - 1e-9).count(),
                }),
            );
            ratio_rows.push((name.to_string(), per_m));
        }
        (ratio_rows, headline)
    }

    /// Every cell's JSON, in the grid's order.
    fn points_json(&self) -> Vec<Value> {
        let Grid { devices, memories, betas } = &self.grid;
        let mut points = Vec::new();
        for (m, (model, layers)) in self.models.iter().enumerate() {
            for &p in devices {
                for &mem in memories {
                    for &b in betas {
                        for (s, name) in self.solvers.iter().enumerate() {
                            let c = self.cell(m, p, mem, b, s);
                            points.push(match c {
                                Cell::Feasible { period, expected, peak, seconds } => json!({
                                    "model": model, "devices": p, "memory_gb": mem, "beta_gbps": b, "solver": name,
                                    "feasible": true, "period": period, "expected_period": expected,
                                    "speedup": layers.total_load() / period, "peak_bytes": peak, "solve_seconds": seconds,
                                }),
                                Cell::Infeasible => json!({
                                    "model": model, "devices": p, "memory_gb": mem, "beta_gbps": b, "solver": name, "feasible": false,
                                }),
                                Cell::Failed(why) => json!({
                                    "model": model, "devices": p, "memory_gb": mem, "beta_gbps": b, "solver": name, "error": why,
                                }),
                            });
                        }
                    }
                }
            }
        }
        points
    }

    /// The charts: the ratio by memory (Fig. 7.8), and ResNet-50's periods at the most
    /// devices and the first β.
    fn charts(&self, ratio_rows: &[(String, Vec<Value>)]) -> anyhow::Result<(String, String)> {
        let Grid { devices, memories, betas } = &self.grid;
        let ratio_series: Vec<crate::plot::Series> = ratio_rows
            .iter()
            .map(|(n, r)| {
                (
                    n.clone(),
                    r.iter().map(|p| (p["memory_gb"].as_f64().unwrap_or(0.0), p["geomean_ratio"].as_f64())).collect(),
                )
            })
            .collect();
        let ratio_svg = crate::plot::lines_with(
            "period / MadPipe's period (geometric mean over models, P, β)",
            "memory per device (GB)",
            "ratio to MadPipe",
            &ratio_series,
            &REFERENCES,
        )?;
        let p8 = *devices.last().unwrap_or(&2);
        let resnet: Vec<chart::PeriodLine> = self
            .solvers
            .iter()
            .enumerate()
            .map(|(s, n)| {
                let cells: Vec<(f64, Cell)> =
                    memories.iter().map(|&mem| (mem, self.cell(0, p8, mem, betas[0], s))).collect();
                let expected = cells.iter().any(|(_, c)| c.expected().is_some());
                chart::PeriodLine {
                    name: n.to_string(),
                    achieved: cells.iter().map(|(mem, c)| (*mem, c.period())).collect(),
                    expected: if expected {
                        cells.iter().map(|(mem, c)| (*mem, c.expected())).collect()
                    } else {
                        vec![]
                    },
                }
            })
            .collect();
        let resnet_svg = chart::periods(
            &format!(
                "ResNet-50, 1000×1000, batch 8, P = {p8}, β = {} GB/s (Fig. 7.3; dashed: the period each DP expected)",
                betas[0]
            ),
            "memory per device (GB)",
            "period per micro-batch (s)",
            &resnet,
        )?;
        Ok((ratio_svg, resnet_svg))
    }

    /// Fig. 7.8 as the thesis draws it: PipeDream's period over MadPipe's, one line per
    /// model (geometric mean over P and β where both are feasible).
    fn model_chart(&self) -> anyhow::Result<String> {
        let Grid { devices, memories, betas } = &self.grid;
        let pipedream = SOLVERS.iter().position(|s| *s == "pipedream").expect("pipedream is a solver");
        let series: Vec<crate::plot::Series> = self
            .models
            .iter()
            .enumerate()
            .map(|(m, (model, _))| {
                let at = |mem: f64| {
                    let both = devices.iter().flat_map(|&p| betas.iter().map(move |&b| (p, b)));
                    let r: Vec<f64> = both
                        .filter_map(|(p, b)| {
                            Some(self.cell(m, p, mem, b, pipedream).period()? / self.cell(m, p, mem, b, 0).period()?)
                        })
                        .collect();
                    geomean(&r)
                };
                (model.to_string(), memories.iter().map(|&mem| (mem, at(mem))).collect())
            })
            .collect();
        crate::plot::lines_with(
            "PipeDream's period / MadPipe's, per model (Fig. 7.8; geometric mean over P and β)",
            "memory per device (GB)",
            "ratio to MadPipe",
            &series,
            &REFERENCES,
        )
    }
}

/// Why a case no solver fits does not fit (the `cases` of `ch7.json`), from pebble's
/// accounting with one micro-batch in flight per stage.
fn reason(bytes: u64, bound: u64, floor: u64, floor_period: Option<f64>) -> &'static str {
    if bytes < bound {
        "below_lower_bound"
    } else if bytes < floor {
        "below_contiguous_floor"
    } else if floor_period.is_some() {
        "floor_allocation_fits"
    } else {
        "floor_allocation_unscheduled"
    }
}

const ACCOUNTINGS: [memory::Accounting; 2] = [memory::Accounting::Pebble, memory::Accounting::Thesis];

impl Results {
    /// Each case (model, P, M, β): how many solvers fit it; and where none does, why
    /// ([`reason`]; `floor_period`: 1F1B\* on the least-memory contiguous allocation,
    /// simulated). With each model's floors and a summary by reason and by memory.
    fn cases_json(&self) -> anyhow::Result<Value> {
        let Grid { devices, memories, betas } = &self.grid;
        let bound: Vec<[u64; 2]> =
            self.models.iter().map(|(_, l)| ACCOUNTINGS.map(|a| memory::lower_bound(l, a).0)).collect();
        let floor = |m: usize, p: usize| ACCOUNTINGS.map(|a| memory::floor(&self.models[m].1, p, a).0);
        let mut all = Vec::new();
        for m in 0..self.models.len() {
            for &p in devices {
                for &mem in memories {
                    for &b in betas {
                        let fits = (0..self.solvers.len()).filter(|&s| self.cell(m, p, mem, b, s).period().is_some());
                        all.push((m, p, mem, b, fits.count()));
                    }
                }
            }
        }
        let none: Vec<(usize, usize, f64, f64, usize)> = all.iter().copied().filter(|c| c.4 == 0).collect();
        let periods = parallel_map(&none, worker_count(8), "least-memory allocations", |&(m, p, mem, b, _)| {
            let l = &self.models[m].1;
            memory::floor_period(&PipeProblem::new(l, p, Some((mem * GB) as u64), b * GB))
        })?;
        let period_of: HashMap<Key, Option<f64>> =
            none.iter().zip(periods).map(|(&(m, p, mem, b, _), t)| (key(m, p, mem, b, 0), t)).collect();
        let mut summary: HashMap<(String, u64), usize> = HashMap::new();
        let mut points = Vec::new();
        for &(m, p, mem, b, fits) in &all {
            let (f, bytes) = (floor(m, p), (mem * GB) as u64);
            let mut point = json!({
                "model": self.models[m].0, "devices": p, "memory_gb": mem, "beta_gbps": b, "solvers_fit": fits,
                "floor_bytes": { "pebble": f[0], "thesis": f[1] },
            });
            if let Some(&t) = period_of.get(&key(m, p, mem, b, 0)) {
                let why = reason(bytes, bound[m][0], f[0], t);
                point["why"] = json!(why);
                point["floor_period"] = json!(t);
                point["thesis_floor_fits"] = json!(bytes >= f[1]);
                *summary.entry((why.to_string(), (mem * 10.0) as u64)).or_default() += 1;
                if bytes >= f[1] {
                    *summary.entry(("thesis_floor_fits".into(), (mem * 10.0) as u64)).or_default() += 1;
                }
            }
            points.push(point);
        }
        let reasons = [
            "below_lower_bound",
            "below_contiguous_floor",
            "floor_allocation_fits",
            "floor_allocation_unscheduled",
            "thesis_floor_fits",
        ];
        let count = |r: &str, mem: Option<f64>| -> usize {
            summary
                .iter()
                .filter(|((w, m), _)| w == r && mem.is_none_or(|x| *m == (x * 10.0) as u64))
                .map(|e| e.1)
                .sum()
        };
        let by_memory: Vec<Value> = memories
            .iter()
            .map(|&mem| {
                let mut o = json!({ "memory_gb": mem });
                for r in reasons {
                    o[r] = json!(count(r, Some(mem)));
                }
                o
            })
            .collect();
        let mut total = json!({ "cases": all.len(), "no_solver_fits": none.len() });
        for r in reasons {
            total[r] = json!(count(r, None));
        }
        let floors: Vec<Value> = self
            .models
            .iter()
            .enumerate()
            .map(|(m, (name, l))| {
                json!({
                    "model": name,
                    "lower_bound_bytes": { "pebble": bound[m][0], "thesis": bound[m][1] },
                    "by_devices": devices.iter().map(|&p| json!({ "devices": p, "floor": memory::floor_json(l, p) })).collect::<Vec<_>>(),
                })
            })
            .collect();
        Ok(json!({ "summary": total, "by_memory": by_memory, "floors": floors, "points": points }))
    }

    /// MadPipe and PipeDream on the layers as the thesis counts them: the ratios, the
    /// cases each fits by memory, and every point.
    fn thesis_json(&self) -> Value {
        let (rows, headline) = self.ratios();
        let Grid { devices, memories, betas } = &self.grid;
        let by_memory: Vec<Value> = memories
            .iter()
            .map(|&mem| {
                let cases: Vec<(usize, usize, f64)> = (0..self.models.len())
                    .flat_map(|m| devices.iter().flat_map(move |&p| betas.iter().map(move |&b| (m, p, b))))
                    .collect();
                let fit =
                    |s: usize| cases.iter().filter(|&&(m, p, b)| self.cell(m, p, mem, b, s).period().is_some()).count();
                let none = cases.iter().filter(|&&(m, p, b)| {
                    (0..self.solvers.len()).all(|s| self.cell(m, p, mem, b, s).period().is_none())
                });
                let mut o = json!({ "memory_gb": mem, "cases": cases.len(), "no_solver_fits": none.count() });
                for (s, name) in self.solvers.iter().enumerate() {
                    o[format!("{name}_fits")] = json!(fit(s));
                }
                o
            })
            .collect();
        json!({
            "accounting": "the thesis's M(i,j,g) (§7.1): each layer keeps its input a_(l-1) per micro-batch, no temporaries; weights C·W and buffers as pebble's; memories below 10 GB only",
            "memory_gb": memories,
            "solvers": self.solvers,
            "ratio_to_madpipe": headline,
            "ratio_by_memory": rows.iter().map(|(n, r)| json!({ "solver": n, "by_memory": r })).collect::<Vec<_>>(),
            "fits_by_memory": by_memory,
            "points": self.points_json(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_case_is_classified_by_the_first_bound_it_misses() {
        // 3 GB against ResNet-50's bound of 5.121 GB: nothing fits at all.
        assert_eq!(reason(3_000_000_000, 5_121_000_000, 5_121_000_000, None), "below_lower_bound");
        // Above the bound (any allocation) but under the contiguous floor on P = 2.
        assert_eq!(reason(6_000_000_000, 5_121_000_000, 9_750_000_000, None), "below_contiguous_floor");
        // Above the floor: 1F1B* on that allocation decides.
        assert_eq!(reason(6_000_000_000, 5_121_000_000, 5_121_000_000, Some(0.836)), "floor_allocation_fits");
        assert_eq!(reason(6_000_000_000, 5_121_000_000, 5_121_000_000, None), "floor_allocation_unscheduled");
    }
}
