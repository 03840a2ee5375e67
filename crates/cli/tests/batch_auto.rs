//! `plan --batch auto`: the batch of most samples per second within a budget in bytes.

mod common;

use common::{ok, pebble};

/// The per-batch rates `--batch auto` reports, and the batch it picked.
fn picked(stderr: &str) -> (usize, Vec<(usize, Option<f64>)>) {
    let line = stderr.lines().find(|l| l.starts_with("--batch auto: ")).expect("the search is reported");
    let rest = &line["--batch auto: ".len()..];
    let batch = rest.split_whitespace().next().unwrap().parse().unwrap();
    let list = rest.split("batch: ").nth(1).unwrap().trim_end_matches(')');
    let rates = list
        .split(", ")
        .map(|item| {
            let (b, r) = item.split_once(": ").unwrap();
            (b.parse().unwrap(), r.strip_suffix("/s").map(|r| r.parse().unwrap()))
        })
        .collect();
    (batch, rates)
}

#[test]
fn the_batch_of_most_samples_per_second_is_planned() {
    let args = ["plan", "--model", "mlp", "--solver", "rotor", "--budget", "46MiB", "--batch", "auto"];
    let run = ok(&args);
    let (batch, rates) = picked(&run.stderr);
    let best = rates.iter().filter_map(|&(b, r)| r.map(|r| (b, r))).max_by(|a, b| a.1.total_cmp(&b.1)).unwrap();
    assert_eq!(batch, best.0);
    assert!(run.stdout.contains(&format!("batch {batch},")), "{}", run.stdout);
    // The search stops at the first batch that does not fit, and it indeed does not.
    let (last, rate) = *rates.last().unwrap();
    assert_eq!(rate, None, "{rates:?}");
    let over =
        pebble(&["plan", "--model", "mlp", "--solver", "rotor", "--budget", "46MiB", "--batch", &last.to_string()]);
    assert_ne!(over.code, 0);
    assert!(over.stderr.contains("infeasible"), "{}", over.stderr);
}

#[test]
fn auto_needs_a_budget_in_bytes_and_plan() {
    let run = pebble(&["plan", "--model", "mlp", "--solver", "rotor", "--budget", "50%", "--batch", "auto"]);
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains("--batch auto") && run.stderr.contains("bytes"), "{}", run.stderr);
    let run = pebble(&["info", "--model", "mlp", "--batch", "auto"]);
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains("only `pebble plan`"), "{}", run.stderr);
    let run = pebble(&["info", "--model", "mlp", "--batch", "many"]);
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains("not a batch size"), "{}", run.stderr);
}

#[test]
fn a_budget_too_small_for_batch_one_says_what_batch_one_needs() {
    let run = pebble(&["plan", "--model", "mlp", "--solver", "rotor", "--budget", "1MiB", "--batch", "auto"]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    let need = run.stderr.split("batch 1 needs at least ").nth(1).map(str::trim);
    let need = need.unwrap_or_else(|| panic!("no least memory in: {}", run.stderr));
    // That memory plans batch 1, as `plan` at batch 1 states its least budget.
    let one = pebble(&["plan", "--model", "mlp", "--batch", "1", "--solver", "rotor", "--budget", "1MiB"]);
    let text = format!("{}{}", one.stdout, one.stderr);
    assert!(text.contains(&format!("the minimum feasible budget is {need} (")), "{need} against: {text}");
}
