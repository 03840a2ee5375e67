//! `pebble train --policy` (issue 13): a run-time policy decides inside each step, with no
//! solver; the losses are store-all's, and bad requests name their flag. And any `train`
//! run whose measured peak is over its budget warns.

mod common;

use common::{ok, pebble};

const GPT: [&str; 12] =
    ["--model", "gpt", "--layers", "2", "--width", "64", "--heads", "4", "--seq", "64", "--batch", "4"];

fn train(extra: &[&str]) -> serde_json::Value {
    let mut args = vec!["train"];
    args.extend_from_slice(&GPT);
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--steps", "2", "--json"]);
    ok(&args).json()
}

#[test]
fn policies_train_online_as_store_all_does() {
    let store_all = train(&["--solver", "store-all", "--budget", "100%"]);
    assert_eq!(store_all["online"], false);
    assert!(store_all["evictions"].is_null());
    assert_eq!((store_all["offloads"].as_u64(), store_all["recomputes"].as_u64()), (Some(0), Some(0)));
    for (policy, budget) in [("dtr", "85%"), ("delta", "90%")] {
        let run = train(&["--policy", policy, "--budget", budget]);
        assert_eq!(run["online"], true, "{policy}");
        assert_eq!(run["solver"], policy);
        assert_eq!(run["view"], "graph");
        assert_eq!(run["losses"], store_all["losses"], "{policy} at {budget}: the losses differ");
        assert!(run["schedule_ops"].as_u64().unwrap() > 0);
        // What the policy did each step is counted: it released something, and what it
        // evicted it recomputed.
        let evictions = run["evictions"].as_u64().expect("a policy counts its evictions");
        let offloads = run["offloads"].as_u64().unwrap();
        assert!(evictions + offloads > 0, "{policy} at {budget} released nothing");
        assert!(evictions == 0 || run["recomputes"].as_u64().unwrap() > 0, "{policy}: evicted, never recomputed");
    }
}

#[test]
fn a_policy_is_named_alone_and_known() {
    let base = ["train", "--model", "mlp", "--budget", "90%", "--steps", "1"];
    for (extra, needle) in
        [(&["--policy", "fifo"][..], "--policy"), (&["--policy", "dtr", "--solver", "rotor"][..], "--solver")]
    {
        let args: Vec<&str> = base.iter().chain(extra).copied().collect();
        let run = pebble(&args);
        assert_eq!(run.code, 2, "{args:?}: {}", run.stderr);
        assert!(run.stderr.contains(needle), "{args:?}: {}", run.stderr);
    }
}

/// `--optimizer` takes the planning commands' names too: `adam` (AdamW without weight
/// decay), beside `sgd` and `adamw`; Adam and AdamW plan the same memory, SGD less, and
/// only AdamW's decay moves the second step's loss.
#[test]
fn train_takes_adam_as_plan_does() {
    let with = |optimizer: &str| train(&["--solver", "store-all", "--budget", "100%", "--optimizer", optimizer]);
    let (adam, adamw, sgd) = (with("adam"), with("adamw"), with("sgd"));
    assert_eq!(adam["static_bytes"], adamw["static_bytes"]);
    assert!(sgd["static_bytes"].as_u64() < adam["static_bytes"].as_u64());
    assert_eq!(adam["losses"][0], adamw["losses"][0], "the first loss is before any update");
    assert_ne!(adam["losses"][1], adamw["losses"][1], "weight decay changed nothing");
}

/// A run whose measured peak is over its budget says so on stderr, by how much, and what
/// would have foreseen it; a run within its budget says nothing. Analytic costs declare
/// less temporary memory than burn-flex allocates (docs/benchmarks.md, "Offloading plans
/// on real tensors"), so offload-dp's plan at 80% on them runs about 10% over (in the test
/// build and the release build alike; other plans' excess differs between the two, whose
/// kernels allocate otherwise); on profiled costs it fits.
#[test]
fn a_run_over_its_budget_says_so() {
    let run_with = |costs: &str, budget: &str| {
        let mut args = vec!["train"];
        args.extend_from_slice(&GPT);
        args.extend_from_slice(&["--solver", "offload-dp", "--budget", budget, "--bandwidth", "1GB", "--steps", "1"]);
        args.extend_from_slice(&["--costs", costs, "--json"]);
        ok(&args)
    };
    let analytic = run_with("analytic", "80%");
    let report = analytic.json();
    let (measured, budget) =
        (report["measured_peak_bytes"].as_u64().unwrap(), report["budget_bytes"].as_u64().unwrap());
    assert!(measured > budget, "the case no longer runs over: {measured} within {budget}");
    let over = format!("(+{:.1}%)", 100.0 * (measured as f64 / budget as f64 - 1.0));
    for needle in ["warning: the measured peak", "is over the budget", &over, "`--costs profiled`"] {
        assert!(analytic.stderr.contains(needle), "`{needle}` not in:\n{}", analytic.stderr);
    }
    // Profiled, 80% of the (larger) measured store-all peak is below what offload-dp needs.
    let profiled = run_with("profiled", "90%");
    let report = profiled.json();
    assert!(report["measured_peak_bytes"].as_u64().unwrap() <= report["budget_bytes"].as_u64().unwrap());
    assert!(!profiled.stderr.contains("warning"), "{}", profiled.stderr);
}
