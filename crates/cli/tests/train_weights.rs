//! `pebble train` runs the plans that move weights, their gradients and optimizer states
//! (issue 12): weight offloading (`weight-offload`, `l2l`) and the host CPU's update
//! (`zero-offload`) train the small `mlp` and `gpt` exactly as store-all does, and report
//! the host copies beside the simulated ones.

mod common;

use common::ok;
use serde_json::Value;

const TINY_GPT: [&str; 12] =
    ["--model", "gpt", "--layers", "2", "--width", "32", "--heads", "4", "--seq", "32", "--batch", "2"];
const MLP: [&str; 6] = ["--model", "mlp", "--batch", "4", "--layers", "3"];

/// Trains 3 steps with AdamW. The link is throttled to 0.2 GB/s: a weight gradient's
/// offload then outlasts the next backward, so the next gradient's copy is queued behind
/// it and reaches the host while the CPU still updates the first, in the run as in the
/// simulation. At full speed, on a loaded machine, the backward could outlast the CPU's
/// update and the host would hold one gradient where the simulator counts two.
fn train(model: &[&str], solver: &str, budget: &str) -> Value {
    let mut args = vec!["train"];
    args.extend_from_slice(model);
    args.extend_from_slice(&["--solver", solver, "--budget", budget, "--steps", "3", "--optimizer", "adamw"]);
    args.extend_from_slice(&["--bandwidth", "2e8", "--json"]);
    ok(&args).json()
}

#[test]
fn weight_moving_plans_train_as_store_all_does() {
    for (model, plans) in [
        // (Store-all updates after its step; these plans inside their backwards, beside
        // the update's temporary, a 4 MB weight's. Store-all's backward holds as much for
        // burn-flex's copy of that weight's new gradient, so at 100% weight-offload keeps
        // every weight; at 95% it moves them.)
        (&MLP[..], [("weight-offload", "95%"), ("l2l", "95%"), ("zero-offload", "100%")]),
        (&TINY_GPT[..], [("weight-offload", "93%"), ("l2l", "93%"), ("zero-offload", "100%")]),
    ] {
        let store_all = train(model, "store-all", "100%");
        for (solver, budget) in plans {
            let what = format!("{} {solver} at {budget}", model[1]);
            let run = train(model, solver, budget);
            assert_eq!(run["losses"], store_all["losses"], "{what}");
            // It moved weights over the link, and the host held what the simulator counts.
            assert!(run["d2h_busy"][0].as_f64() > Some(0.0), "{what}: {run}");
            let (host, simulated) =
                (run["measured_host_peak_bytes"].as_f64(), run["predicted_host_peak_bytes"].as_f64());
            let (host, simulated) = (host.expect("counted"), simulated.expect("simulated"));
            assert!(
                simulated > 0.0 && (host / simulated - 1.0).abs() <= 0.05,
                "{what}: host {host}, simulated {simulated}"
            );
        }
    }
}
