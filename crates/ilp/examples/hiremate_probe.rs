//! HiRemate's own plan (no incumbents) on a zoo graph at its defaults, under variants of
//! its knobs, at a share of the activations (static memory and inputs on top, no runtime
//! reserve): docs/benchmarks.md, "A save axis on the coarse grid".
//!
//! ```sh
//! cargo run --release -p pebble-ilp --example hiremate_probe -- MODEL PERCENT [VARIANT ...]
//! LAYERS=24 cargo run --release -p pebble-ilp --example hiremate_probe -- transformer 50 'coarse=(8,4)'
//! ```
use pebble_graph::DataKind;
use pebble_ilp::hiremate::{Hiremate, HiremateConfig};
use pebble_sim::{simulate_graph, SimConfig};
use pebble_solve::{Problem, SolveOptions, Solver};
use pebble_zoo::{build, ModelOptions};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let model = args.get(1).map(String::as_str).unwrap_or("transformer");
    let pct: u64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(50);
    let which: Vec<String> = args.iter().skip(3).cloned().collect();
    let layers = std::env::var("LAYERS").ok().and_then(|l| l.parse().ok());
    let g = build(model, &ModelOptions { layers, ..ModelOptions::default() }).unwrap().graph;
    let fixed = g.static_bytes() + g.data.iter().filter(|d| d.kind == DataKind::Input).map(|d| d.size).sum::<u64>();
    let sa = pebble_solve::solver("store-all")
        .unwrap()
        .solve(Problem::Graph(&g), u64::MAX, &SolveOptions::default())
        .unwrap();
    let r = simulate_graph(&g, &sa, &SimConfig::default()).unwrap();
    let budget = fixed + (r.peak_bytes - fixed) * pct / 100;
    let own = HiremateConfig { rockmate_incumbent: false, mincut_incumbent: false, ..HiremateConfig::DEFAULT };
    let variants: Vec<(&str, HiremateConfig)> = vec![
        ("own", own),
        ("coarse=(10,10)", HiremateConfig { coarse_grid: (10, 10), ..own }),
        ("coarse=(16,1)", HiremateConfig { coarse_grid: (16, 1), ..own }),
        ("coarse=(8,4)", HiremateConfig { coarse_grid: (8, 4), ..own }),
        ("coarse=(6,6)", HiremateConfig { coarse_grid: (6, 6), ..own }),
        ("coarse=(4,4)", HiremateConfig { coarse_grid: (4, 4), ..own }),
        ("grid=(16,16)", HiremateConfig { grid: (16, 16), ..own }),
        (
            "max_sub=10",
            HiremateConfig { partition: pebble_graph::HPartitionConfig { max_sub: 10, ..own.partition }, ..own },
        ),
        (
            "max_sub=40",
            HiremateConfig { partition: pebble_graph::HPartitionConfig { max_sub: 40, ..own.partition }, ..own },
        ),
        (
            "max_top=60",
            HiremateConfig { partition: pebble_graph::HPartitionConfig { max_top: 60, ..own.partition }, ..own },
        ),
        ("limit=30", HiremateConfig { time_limit: 30.0, ..own }),
    ];
    for (name, cfg) in variants {
        if !which.is_empty() && !which.iter().any(|w| w == name) {
            continue;
        }
        let t = std::time::Instant::now();
        let s = Hiremate { config: cfg }.solve(Problem::Graph(&g), budget, &SolveOptions::default());
        let secs = t.elapsed().as_secs_f64();
        match s {
            Ok(s) => {
                let rr = simulate_graph(&g, &s, &SimConfig { budget: Some(budget), ..SimConfig::default() }).unwrap();
                println!(
                    "{name}: {:+.2}% ({secs:.0} s) optimal {:?}",
                    100.0 * (rr.makespan / r.makespan - 1.0),
                    s.optimal
                );
            }
            Err(e) => println!("{name}: {e} ({secs:.0} s)"),
        }
    }
}
