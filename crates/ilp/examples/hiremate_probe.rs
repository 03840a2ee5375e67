//! HiRemate's own plan (no incumbents) on a zoo graph at its defaults, under variants of
//! its knobs, at a share of the activations (static memory and inputs on top, no runtime
//! reserve): docs/benchmarks.md, "Save axes on the large clusters". `own` is `hiremate`'s
//! defaults; `coarse=(P,S)` and `save_axes=LIMITS` change the large clusters' grid and the
//! time their save axes may take (`coarse=(8,1)`: no save axes, as before 2026-11-28).
//!
//! ```sh
//! cargo run --release -p pebble-ilp --example hiremate_probe -- MODEL PERCENT [VARIANT ...]
//! LAYERS=24 cargo run --release -p pebble-ilp --example hiremate_probe -- transformer 50 own 'coarse=(8,1)'
//! ```
use pebble_ilp::hiremate::{Hiremate, HiremateConfig};
use pebble_sim::{simulate_graph, SimConfig};
use pebble_solve::baseline::store_all::simulate_store_all;
use pebble_solve::{Problem, SolveOptions, Solver};
use pebble_zoo::{build, ModelOptions};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let model = args.get(1).map(String::as_str).unwrap_or("transformer");
    let pct: u64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(50);
    let which: Vec<String> = args.iter().skip(3).cloned().collect();
    let layers = std::env::var("LAYERS").ok().and_then(|l| l.parse().ok());
    let g = build(model, &ModelOptions { layers, ..ModelOptions::default() }).unwrap().graph;
    let fixed = g.fixed_bytes();
    let r = simulate_store_all(Problem::Graph(&g), &SimConfig::default()).unwrap();
    let budget = fixed + (r.peak_bytes - fixed) * pct / 100;
    let own = HiremateConfig {
        rockmate_incumbent: false,
        mincut_incumbent: false,
        start_incumbent: false,
        ..HiremateConfig::DEFAULT
    };
    let variants: Vec<(&str, HiremateConfig)> = vec![
        ("own", own),
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
    // Besides the named variants, `coarse=(P,S)`, `save_axes=LIMITS` and both, as
    // `coarse=(P,S),save_axes=LIMITS`.
    let parsed: Vec<(String, HiremateConfig)> = which
        .iter()
        .filter(|w| !variants.iter().any(|(n, _)| n == w))
        .filter_map(|w| {
            let mut cfg = own;
            for part in w.split("),") {
                let part = part.trim_end_matches(')');
                if let Some(g) = part.strip_prefix("coarse=(") {
                    let (p, s) = g.split_once(',')?;
                    cfg.coarse_grid = (p.parse().ok()?, s.parse().ok()?);
                } else if let Some(x) = part.strip_prefix("save_axes=") {
                    cfg.save_axes = x.parse().ok()?;
                } else {
                    return None;
                }
            }
            Some((w.clone(), cfg))
        })
        .collect();
    let named = variants.into_iter().map(|(n, c)| (n.to_string(), c));
    for (name, cfg) in named.chain(parsed) {
        if !which.is_empty() && !which.contains(&name) {
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
