//! Where a plan's measured peak leaves the simulator's: runs one step of `SOLVER`'s plan
//! (or `POLICY`'s replayed schedule) of a zoo model on burn-flex. On the graph, op by op:
//! prints each op after which the measured peak rose, beside the simulator's memory at
//! that op (the largest timeline point inside its span), both in MiB and above the step's
//! start. On the chain (a chain solver's plan), whose executor runs a step whole: the
//! chain's stage sizes, the measured peak and the op where the simulator peaks.
//!
//! Usage: cargo run --release -p pebble-train --example memory_trace -- MODEL SOLVER PERCENT [LAYERS SEQ BATCH WIDTH HEADS]

use burn_flex::{Flex, FlexDevice};
use pebble_ilp as _;
use pebble_runtime::memory::{self, CountingAlloc};
use pebble_runtime::{OptimizerKind, Session};
use pebble_sim::Lane;
use pebble_solve::{Problem, SolveOptions};
use pebble_zoo::ModelOptions;

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

fn mib(b: f64) -> String {
    format!("{:9.2}", b / (1u64 << 20) as f64)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 3 {
        eprintln!("usage: memory_trace MODEL SOLVER|POLICY PERCENT [LAYERS SEQ BATCH WIDTH HEADS]");
        std::process::exit(2);
    }
    let arg = |k: usize| args.get(k).and_then(|a| a.parse().ok());
    let (model, solver) = (args[0].as_str(), args[1].as_str());
    let percent: f64 = args[2].parse().expect("PERCENT");
    let optimizer = OptimizerKind::AdamW { lr: 1e-3, weight_decay: 0.01 };
    let options = ModelOptions {
        layers: arg(3),
        seq: arg(4),
        batch: arg(5),
        width: arg(6),
        heads: arg(7),
        optimizer: optimizer.planner(),
        ..Default::default()
    };
    let lowered = pebble_train::lower::<Flex>(model, &options, None).expect("model");
    let solve = SolveOptions { machine: options.profile.machine, ..SolveOptions::default() };
    let graph = &lowered.graph;
    // A chain solver plans the chain; the rest, and the policies, the graph.
    let on_chain = pebble_solve::solver(solver).is_ok_and(|s| s.views().first() == Some(&pebble_schedule::View::Chain));
    let problem = if on_chain { Problem::Chain(&lowered.chain) } else { Problem::Graph(graph) };
    let sim = solve.sim_config();
    let all = pebble_solve::baseline::store_all::store_all_schedule(problem);
    let top = pebble_solve::simulate(problem, &all, &sim).expect("store-all").peak_bytes;
    let fixed = graph.static_bytes();
    let budget = fixed + ((top - fixed) as f64 * percent / 100.0) as u64;
    let schedule = match pebble_solve::policy::policy(solver, solve.machine.d2h.bandwidth) {
        Ok(p) => pebble_solve::policy::replay::replay(graph, budget, p.as_ref()).expect("replayed").schedule,
        Err(_) => {
            let s = pebble_solve::solver(solver).expect("a solver");
            pebble_solve::plan(s, problem, budget, &solve).expect("a plan").schedule
        }
    };
    let config = pebble_sim::SimConfig { budget: Some(budget), timeline: true, ..sim };
    let report = pebble_solve::simulate(problem, &schedule, &config).expect("simulated");
    let at_op = |k: usize| -> f64 {
        let Some(s) = report.spans.iter().find(|s| s.op == k && s.lane == Lane::Compute) else { return f64::NAN };
        let before = report.timeline.iter().rfind(|p| p.time <= s.start).map_or(0, |p| p.bytes);
        let inside = report.timeline.iter().filter(|p| p.time >= s.start && p.time < s.end).map(|p| p.bytes);
        inside.fold(before, u64::max) as f64
    };
    let mut session = Session::<Flex>::new(lowered.network.clone(), lowered.index.clone(), optimizer, 3, FlexDevice);
    session.set_temporaries(pebble_runtime::StageTemporaries::of_views(&lowered.chain, &lowered.graph));
    if on_chain {
        // The chain executor runs a step whole: its measured peak, and where the simulator
        // puts its own, beside the chain's stage sizes.
        let c = &lowered.chain;
        for i in 0..c.len() {
            println!(
                "stage {i:3}: x {} xbar {} ftmp {} btmp {} (MiB)",
                mib(c.x[i + 1] as f64),
                mib(c.xbar[i + 1] as f64),
                mib(c.ftmp[i] as f64),
                mib(c.btmp[i] as f64)
            );
        }
        let peak_op = (0..schedule.ops.len()).max_by(|&a, &b| at_op(a).total_cmp(&at_op(b))).unwrap_or(0);
        for _ in 0..2 {
            let r = session.step(&schedule).expect("a step");
            println!(
                "predicted {} at op {peak_op} {}, measured {} MiB",
                mib(report.peak_bytes as f64),
                schedule.ops[peak_op],
                mib(r.peak_bytes.expect("counting") as f64)
            );
        }
        return;
    }
    for step in 0..2 {
        let mut trace: Vec<(usize, u64)> = Vec::new();
        let mut base = None;
        let mut drive = |exec: &mut pebble_runtime::exec::Exec<'_>| {
            base = Some(memory::live());
            for (k, op) in schedule.ops.iter().enumerate() {
                exec(op)?;
                trace.push((k, memory::peak()));
            }
            Ok(())
        };
        let r = session.step_driven(&mut drive).expect("a step");
        let measured = r.peak_bytes.expect("counting");
        let base = base.expect("ran");
        let resident = measured as f64 - (trace.iter().map(|t| t.1).max().unwrap_or(base) - base) as f64;
        println!(
            "step {step}: budget {} predicted {} measured {} MiB (resident {})",
            mib(budget as f64),
            mib(report.peak_bytes as f64),
            mib(measured as f64),
            mib(resident)
        );
        if step == 0 {
            continue;
        }
        let mut last = base;
        for &(k, peak) in &trace {
            if peak > last {
                let m = resident + (peak - base) as f64;
                let s = at_op(k);
                println!(
                    "  op {k:4} {:<40} measured {} sim {} diff {}",
                    schedule.ops[k].to_string(),
                    mib(m),
                    mib(s),
                    mib(m - s)
                );
                last = peak;
            }
        }
    }
}
