use pebble_ilp::offmate::{offmate_plan, offmate_schedule, OffmateOptions};
use pebble_schedule::{Schedule, View};
use pebble_sim::{simulate_chain, SimConfig};
use pebble_zoo::{build, ModelOptions, Profile};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let model = args.get(1).map(String::as_str).unwrap_or("gpt");
    let layers: Option<usize> = args.get(2).and_then(|s| s.parse().ok());
    let budget_gb: f64 = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(10.0);
    let profile = Profile::lookup("rtx3060").unwrap();
    let opts = ModelOptions { batch: Some(4), seq: Some(512), layers, profile: profile.clone(), ..Default::default() };
    let m = build(model, &opts).unwrap();
    let c = &m.chain;
    let l = c.len();
    let ops = pebble_solve::baseline::store_all_ops(l);
    let all = Schedule::new(View::Chain, ops).repeated();
    let machine = profile.machine;
    let r = simulate_chain(c, &all, &SimConfig::on(machine)).unwrap();
    println!(
        "L={l} store-all period {:.3} s peak {:.2} GB; w {:.2} GB g {:.2} o {:.2} static {:.2}",
        r.makespan,
        r.peak_bytes as f64 / 1e9,
        c.w.as_ref().unwrap().iter().sum::<u64>() as f64 / 1e9,
        c.g.as_ref().unwrap().iter().sum::<u64>() as f64 / 1e9,
        c.o.as_ref().unwrap().iter().sum::<u64>() as f64 / 1e9,
        c.static_bytes as f64 / 1e9
    );
    let budget = (budget_gb * 1e9) as u64;
    let t = std::time::Instant::now();
    let limit: f64 = args.get(4).and_then(|s| s.parse().ok()).unwrap_or(300.0);
    let plan = offmate_plan(
        c,
        budget,
        &machine,
        &OffmateOptions {
            time_limit: Some(limit),
            cpu_optimizer: std::env::var("NO_CPU").is_err(),
            ..OffmateOptions::default()
        },
    )
    .unwrap();
    println!(
        "MILP {:.1} s: objective {:.3} optimal {} bound {:.3} options {:?} cpu {}",
        t.elapsed().as_secs_f64(),
        plan.objective,
        plan.optimal,
        plan.lower_bound,
        plan.options.iter().map(|o| format!("{o:?}").chars().next().unwrap()).collect::<String>(),
        plan.cpu.iter().map(|&b| if b { 'C' } else { '.' }).collect::<String>()
    );
    let s = offmate_schedule(c, &plan);
    if std::env::var("STALLS").is_ok() {
        stalls(c, &s, machine, budget);
    }
    match simulate_chain(c, &s, &SimConfig { budget: Some(budget), ..SimConfig::on(machine) }) {
        Ok(r) => println!(
            "sim: period {:.3} s peak {:.2} GB host {:.2} GB cpu {:.2} s d2h {:.2} h2d {:.2} stall {:.2}",
            r.makespan,
            r.peak_bytes as f64 / 1e9,
            r.peak_host_bytes as f64 / 1e9,
            r.cpu_busy,
            r.d2h_busy,
            r.h2d_busy,
            r.compute_stall
        ),
        Err(e) => {
            println!("sim error: {e}");
            let r = simulate_chain(c, &s, &SimConfig::on(machine));
            println!("unbounded: {:?}", r.map(|r| (r.makespan, r.peak_bytes)));
        }
    }
}

/// Prints each compute op that waits, how long, and what ran on the other streams then.
#[allow(dead_code)]
pub fn stalls(c: &pebble_graph::Chain, s: &Schedule, machine: pebble_sim::Machine, budget: u64) {
    let r =
        simulate_chain(c, s, &SimConfig { budget: Some(budget), timeline: true, ..SimConfig::on(machine) }).unwrap();
    let n = s.ops.len();
    let mut prev_end = None;
    for sp in r.spans.iter().filter(|sp| sp.lane == pebble_sim::Lane::Compute) {
        if let Some(e) = prev_end {
            let gap: f64 = sp.start - e;
            if gap > 1e-3 {
                let busy: Vec<String> = r
                    .spans
                    .iter()
                    .filter(|o| o.lane != pebble_sim::Lane::Compute && o.start < sp.start && o.end > e)
                    .map(|o| format!("{:?} {} [{:.3}-{:.3}]", o.lane, s.ops[o.op % n], o.start, o.end))
                    .collect();
                println!("{:.3} stall {:.3} before {}: {}", e, gap, s.ops[sp.op % n], busy.join("; "));
            }
        }
        prev_end = Some(sp.end);
    }
}
