//! The full runs of the offloading oracle's checks, too long for CI (docs/benchmarks.md):
//!
//! * `solvers`: `brute_offload_bounds_the_offloading_solvers` on all 270 cases of seed 11,
//!   the 27 that need offloading on four stages included, with no limit on the search;
//! * `cuts`: `the_cuts_keep_the_optimum` on 60 chains (seed 9), searches without cuts of
//!   up to 5,000,000 simulations.
//!
//! `cargo run --release -p pebble-solve --example brute_offload_everywhere [solvers|cuts]`
//! (both without an argument). It panics where a check fails, as the tests do.

#[path = "../tests/brute_offload.rs"]
#[allow(dead_code, unused_imports)]
mod checks;

use checks::{cases, check_cuts, check_solvers, Search};

fn main() {
    let which = std::env::args().nth(1);
    let start = std::time::Instant::now();
    if which.as_deref().is_none_or(|w| w == "solvers") {
        let t = check_solvers(&cases(11), Search::default());
        println!(
            "solvers: {} solved, {} infeasible, {} too large, {} schedules compared, pofo's mean gap {:.4}, \
             over the tolerance at {:?}; {:.1} s",
            t.solved,
            t.infeasible,
            t.too_large,
            t.compared,
            t.mean_gap(),
            t.over,
            start.elapsed().as_secs_f64()
        );
    }
    if which.as_deref().is_none_or(|w| w == "cuts") {
        let start = std::time::Instant::now();
        let (compared, left_out) = check_cuts(9, 60, 5_000_000);
        println!("cuts: {compared} compared, {left_out} left out; {:.1} s", start.elapsed().as_secs_f64());
    }
}
