//! The speed benchmark of issue 14 (docs/benchmarks.md, "MadPipe's phase 1: solve time"):
//! MadPipe's phase 1 (Alg. 8's ten DP runs on the thesis's grid) on ResNet-50, ResNet-101
//! and DenseNet-121 at 1000×1000, batch 8, on P = 2, 4 and 8 devices of M = 8 GB,
//! β = 12 GB/s.
//!
//! `cargo run --release -p pebble-solve --example madpipe_phase1_speed`

use pebble_graph::Layers;
use pebble_solve::pipeline::{madpipe, PipeProblem};

fn main() {
    let options = pebble_zoo::ModelOptions {
        batch: Some(8),
        image: Some(1000),
        optimizer: pebble_zoo::Optimizer::Sgd,
        ..Default::default()
    };
    for name in ["resnet50", "resnet101", "densenet121"] {
        let model = pebble_zoo::build(name, &options).unwrap();
        let l = Layers::from_chain(&model.chain);
        for devices in [2, 4, 8] {
            let p = PipeProblem::new(&l, devices, Some(8_000_000_000), 12e9);
            let start = std::time::Instant::now();
            let a = madpipe::phase1(&p, 10, madpipe::Grid::default());
            let secs = start.elapsed().as_secs_f64();
            println!(
                "{name} ({} layers), P = {devices}: phase 1 {secs:.3} s, expected period {:?}",
                l.len(),
                a.map(|a| a.expected_period)
            );
        }
    }
}
