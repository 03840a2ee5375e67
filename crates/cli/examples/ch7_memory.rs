//! Why `pebble reproduce ch7`'s small-memory cases fit no solver, measured (issue 48):
//! for each model of the grid (1000×1000, batch 8, SGD), the layers' memory terms, and
//! the least memory per device any allocation needs with one micro-batch in flight per
//! stage (`g = 1`), under pebble's accounting and the thesis's `𝓜(i, j, g)` (§7.1).
//!
//! `cargo run --release -p pebble-cli --example ch7_memory [MODEL…]`; with `--cases
//! docs/ch7.json`, each case of that report no solver fits, classified: below the bound
//! no allocation goes under, below the least-memory contiguous allocation, or above it
//! (then 1F1B\* on that allocation is simulated).

#[path = "../src/cmd/reproduce/ch7/memory.rs"]
#[allow(dead_code)]
mod memory;

use memory::{floor, floor_period, kept, layer_input, lower_bound, stage_terms, Accounting};
use pebble_graph::Layers;
use pebble_solve::pipeline::PipeProblem;

const GB: f64 = 1e9;

fn gb(b: u64) -> String {
    format!("{:.3}", b as f64 / GB)
}

fn layers(name: &str) -> Layers {
    let options = pebble_zoo::ModelOptions {
        batch: Some(8),
        image: Some(1000),
        optimizer: pebble_zoo::Optimizer::Sgd,
        ..Default::default()
    };
    let model = pebble_zoo::build(name, &options).unwrap_or_else(|e| panic!("{name}: {e}"));
    Layers::from_chain(&model.chain)
}

/// Each layer's terms, in GB: its input, what pebble keeps, weights, temporary, output.
fn table(l: &Layers) {
    println!("  layer  a_(l-1)  stored(pebble)  stored/a  C*W    tmp    a_l    alone: pebble  thesis");
    for x in 0..l.len() {
        let (p, t) = (stage_terms(l, x, x, 1, Accounting::Pebble), stage_terms(l, x, x, 1, Accounting::Thesis));
        println!(
            "  {x:>5}  {:>7}  {:>14}  {:>8.1}  {:>5}  {:>5}  {:>5}  {:>13}  {:>6}",
            gb(layer_input(l, x)),
            gb(kept(l, x, Accounting::Pebble)),
            kept(l, x, Accounting::Pebble) as f64 / kept(l, x, Accounting::Thesis).max(1) as f64,
            gb(p.weights),
            gb(p.temporary),
            gb(l.boundary[x]),
            gb(p.total()),
            gb(t.total()),
        );
    }
}

/// The floors on `P` devices under both accountings, with the terms of the largest stage.
fn floors(l: &Layers, devices: &[usize]) {
    for acc in [Accounting::Pebble, Accounting::Thesis] {
        let (bound, layer, (i, j)) = lower_bound(l, acc);
        let t = stage_terms(l, i, j, 1, acc);
        println!(
            "  {:<6} any allocation, any P: >= {} GB (layer {layer}, best in stage {i}..={j}: C*W {} + kept {} + tmp {} + buffers {})",
            acc.name(),
            gb(bound),
            gb(t.weights),
            gb(t.activations),
            gb(t.temporary),
            gb(t.buffers)
        );
        for &p in devices {
            let (bytes, stages) = floor(l, p, acc);
            let (i, j) = stages.iter().copied().max_by_key(|&(i, j)| stage_terms(l, i, j, 1, acc).total()).unwrap();
            let t = stage_terms(l, i, j, 1, acc);
            println!(
                "  {:<6} P = {p}: contiguous floor {} GB on {} stages; largest {i}..={j}: C*W {} + kept {} + tmp {} + buffers {}",
                acc.name(),
                gb(bytes),
                stages.len(),
                gb(t.weights),
                gb(t.activations),
                gb(t.temporary),
                gb(t.buffers)
            );
        }
    }
}

/// 1F1B\* on the least-memory contiguous allocation (pebble's accounting), simulated at
/// `M` GB and β = 12 GB/s: its period, or that it does not fit.
fn schedules(l: &Layers, devices: &[usize], memories: &[f64]) {
    for &p in devices {
        let cells: Vec<String> = memories
            .iter()
            .map(|&m| {
                let problem = PipeProblem::new(l, p, Some((m * GB) as u64), 12e9);
                match floor_period(&problem) {
                    Some(t) => format!("{m} GB: period {t:.3} s"),
                    None => format!("{m} GB: does not fit"),
                }
            })
            .collect();
        println!("  least-memory allocation with 1F1B*, P = {p}: {}", cells.join("; "));
    }
}

/// The cases of a `ch7.json` that no solver fits, classified by memory (GB).
fn cases(path: &str) {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let report: serde_json::Value = serde_json::from_str(&text).expect("a ch7.json");
    let mut fits: std::collections::BTreeMap<(String, u64, u64, u64), usize> = Default::default();
    for p in report["points"].as_array().expect("points") {
        let k = |f: &str| (p[f].as_f64().unwrap_or(0.0) * 10.0) as u64;
        let key = (p["model"].as_str().unwrap_or("").to_string(), k("devices") / 10, k("memory_gb"), k("beta_gbps"));
        *fits.entry(key).or_default() += usize::from(p["feasible"].as_bool() == Some(true));
    }
    let mut models: std::collections::HashMap<String, Layers> = Default::default();
    let mut by: std::collections::BTreeMap<(u64, &str), usize> = Default::default();
    for ((model, p, mem, beta), n) in &fits {
        let l = models.entry(model.clone()).or_insert_with(|| layers(model));
        let bytes = *mem as f64 / 10.0 * GB;
        let why = if *n > 0 {
            "some solver fits"
        } else if bytes < lower_bound(l, Accounting::Pebble).0 as f64 {
            "below the bound (any allocation)"
        } else if bytes < floor(l, *p as usize, Accounting::Pebble).0 as f64 {
            "below the contiguous floor"
        } else {
            let problem = PipeProblem::new(l, *p as usize, Some(bytes as u64), *beta as f64 / 10.0 * GB);
            match floor_period(&problem) {
                Some(_) => "floor allocation fits (1F1B*)",
                None => "floor allocation unscheduled",
            }
        };
        *by.entry((*mem, why)).or_default() += 1;
        if *n == 0 && bytes >= floor(l, *p as usize, Accounting::Thesis).0 as f64 {
            *by.entry((*mem, "(thesis's floor fits)")).or_default() += 1;
        }
    }
    for ((mem, why), n) in by {
        println!("  {:>4} GB  {why:<34} {n}", mem as f64 / 10.0);
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--cases") {
        cases(args.get(1).map_or("docs/ch7.json", String::as_str));
        return;
    }
    let models: Vec<&str> = if args.is_empty() {
        vec!["resnet50", "resnet101", "inception_v3", "densenet121"]
    } else {
        args.iter().map(String::as_str).collect()
    };
    for name in models {
        let l = layers(name);
        let weights: u64 = l.static_bytes(0, l.len() - 1, 2);
        println!(
            "{name}: {} layers, C*W of the whole chain {} GB (C = 3: two versions and a gradient)",
            l.len(),
            gb(weights)
        );
        table(&l);
        floors(&l, &[2, 4, 8]);
        schedules(&l, &[4, 8], &[3.0, 4.0, 5.0, 6.0]);
        println!();
    }
}
