//! `--timeline F.svg` of `pebble plan` and `pebble simulate`: the chart of one schedule
//! (compute ops, device→host and host→device transfers, device memory) and the rule that
//! an existing file is kept unless `--force`.

use std::path::{Path, PathBuf};

mod common;
use common::{ok, pebble};

/// A fresh scratch directory for one test, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(test: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("pebble-timeline-{}-{test}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        Scratch(dir)
    }

    /// Writes `text` to `name` in the directory and returns the path.
    fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.0.join(name);
        std::fs::write(&p, text).expect("write");
        p
    }

    fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// `chain_off` of the simulator's tests: L = 2 whose loss needs 10 units of temporary
/// memory, so that offloading a_1 during it pays.
const CHAIN_OFF: &str = r#"{
  "name": "off",
  "ftime": [1, 2], "btime": [2, 2, 3],
  "x": [1, 4, 1], "xbar": [1, 4, 2],
  "ftmp": [0, 0], "btmp": [0, 0, 10]
}"#;

/// `F0ck [offload a_1] F1all L [prefetch a_1] F0all B1 B0`.
const OFF_SCHEDULE: &str = r#"{"version": 1, "view": "chain", "solver": "by-hand", "ops": [
  {"op": "forward", "stage": 0, "mode": "ck"},
  {"op": "offload", "tensor": {"activation": 1}},
  {"op": "forward", "stage": 1, "mode": "all"},
  {"op": "backward", "stage": 2},
  {"op": "prefetch", "tensor": {"activation": 1}},
  {"op": "forward", "stage": 0, "mode": "all"},
  {"op": "backward", "stage": 1},
  {"op": "backward", "stage": 0}
]}"#;

/// The text of every `<text>` element of an SVG, in document order.
fn texts(svg: &str) -> Vec<String> {
    svg.split("<text")
        .skip(1)
        .filter_map(|t| {
            let body = &t[t.find('>')? + 1..];
            Some(body[..body.find("</text>")?].trim().to_string())
        })
        .collect()
}

fn count(texts: &[String], text: &str) -> usize {
    texts.iter().filter(|t| *t == text).count()
}

#[test]
fn the_chart_of_an_offload_and_a_prefetch() {
    let dir = Scratch::new("offload");
    let chain = dir.write("chain.json", CHAIN_OFF);
    let schedule = dir.write("schedule.json", OFF_SCHEDULE);
    let svg = dir.join("t.svg");
    let run = ok(&[
        "simulate",
        "--chain",
        s(&chain),
        "--schedule",
        s(&schedule),
        "--bandwidth",
        "4",
        "--budget",
        "16",
        "--timeline",
        s(&svg),
    ]);
    assert!(run.stdout.contains(&format!("timeline written to {}", svg.display())), "{}", run.stdout);
    let text = std::fs::read_to_string(&svg).expect("the chart is written");
    assert!(text.starts_with("<svg"), "an SVG");
    let t = texts(&text);
    // The title: solver, model, budget.
    assert_eq!(t[0], "by-hand on chain off, budget 16", "{t:?}");
    // The figures: makespan, stall, link busy times, device and host peaks (β = 4: each
    // transfer of a_1, 4 units, takes 1 of the makespan's 11), and what the schedule moves
    // and recomputes (F0 twice).
    assert_eq!(
        t[1],
        "makespan 11.00 · compute stall 0 (0%) · device→host busy 1.000 (9%) · host→device busy 1.000 (9%) · \
         device peak 16 · host peak 4 · 1 offloads, 1 reloads, 1 recomputations",
    );
    // The three lanes, named once each beside their bars (the legend names the links too).
    for lane in ["compute", "device→host", "host→device"] {
        assert!(t.iter().any(|x| x == lane), "lane {lane} in {t:?}");
    }
    // Every compute op by its notation, the loss as L, the second F0 as a recomputation.
    for op in ["F0ck", "F1all", "L", "F0all", "B1", "B0"] {
        assert_eq!(count(&t, op), 1, "{op} in {t:?}");
    }
    for entry in ["forward", "forward (recomputed)", "backward", "loss", "device memory", "budget"] {
        assert_eq!(count(&t, entry), 1, "legend entry {entry} in {t:?}");
    }
    // a_1 goes out and comes back: one bar on each link.
    assert_eq!(count(&t, "a1"), 2, "{t:?}");
    assert!(text.contains(r##"fill="#2CA02C""##), "a device→host bar");
    assert!(text.contains(r##"fill="#17BECF""##), "a host→device bar");
    // The memory axis below, and the time axis they share.
    assert!(t.iter().any(|x| x == "device memory (units)"), "{t:?}");
    assert!(t.iter().any(|x| x == "time (units)"), "{t:?}");
}

#[test]
fn a_schedule_without_transfers_says_so() {
    let dir = Scratch::new("no-transfers");
    let chain = dir.write("chain.json", CHAIN_OFF);
    let svg = dir.join("t.svg");
    ok(&["plan", "--chain", s(&chain), "--budget", "100%", "--solver", "store-all", "--timeline", s(&svg)]);
    let t = texts(&std::fs::read_to_string(&svg).expect("written"));
    assert_eq!(count(&t, "no transfers"), 2, "{t:?}");
    assert_eq!(count(&t, "forward (recomputed)"), 0, "no recomputation in store-all: {t:?}");
}

#[test]
fn an_existing_file_is_kept_unless_force() {
    let dir = Scratch::new("force");
    let chain = dir.write("chain.json", CHAIN_OFF);
    let schedule = dir.write("schedule.json", OFF_SCHEDULE);
    let mine = dir.write("mine.svg", "my own chart");
    let simulate = ["simulate", "--chain", s(&chain), "--schedule", s(&schedule), "--timeline", s(&mine)];
    let plan = ["plan", "--chain", s(&chain), "--budget", "100%", "--solver", "rotor", "--timeline", s(&mine)];
    for args in [&simulate[..], &plan[..]] {
        let run = pebble(args);
        assert_eq!(run.code, 2, "pebble {args:?}: {}", run.stderr);
        assert_eq!(run.stderr.trim_end().lines().count(), 1, "one line:\n{}", run.stderr);
        for needle in ["error: --timeline", "mine.svg", "exists", "--force"] {
            assert!(run.stderr.contains(needle), "`{needle}` not in {}", run.stderr);
        }
        assert!(run.stdout.is_empty(), "nothing done: {}", run.stdout);
        assert_eq!(std::fs::read_to_string(&mine).expect("kept"), "my own chart");
    }
    // A directory is no file to write either.
    let run = pebble(&["simulate", "--chain", s(&chain), "--schedule", s(&schedule), "--timeline", s(&dir.0)]);
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(run.stderr.contains("is a directory"), "{}", run.stderr);
    // --force overwrites, in both commands.
    for args in [&simulate[..], &plan[..]] {
        let args: Vec<&str> = args.iter().copied().chain(["--force"]).collect();
        ok(&args);
        assert!(std::fs::read_to_string(&mine).expect("written").starts_with("<svg"));
        std::fs::write(&mine, "my own chart").expect("write");
    }
}

#[test]
fn plan_draws_the_timeline_of_its_schedule() {
    let dir = Scratch::new("plan");
    let chain = dir.write("chain.json", CHAIN_OFF);
    let svg = dir.join("plan.svg");
    let schedule = dir.join("plan.json");
    let args = ["plan", "--chain", s(&chain), "--budget", "100%", "--solver", "rotor", "--json"];
    let plan = ok(&[&args[..], &["--timeline", s(&svg), "-o", s(&schedule)]].concat()).json();
    let text = std::fs::read_to_string(&svg).expect("plan --timeline writes the chart");
    let t = texts(&text);
    assert!(t[0].starts_with("rotor on chain off, budget "), "{t:?}");
    // The figures are the plan's own simulation.
    let makespan = plan["predicted_time"].as_f64().expect("time");
    assert!(t[1].starts_with(&format!("makespan {makespan:.2} ")), "{} vs {makespan}", t[1]);
    assert!(t[1].contains(&format!("device peak {}", plan["predicted_peak_bytes"])), "{}", t[1]);
    for lane in ["compute", "device→host", "host→device"] {
        assert!(t.iter().any(|x| x == lane), "lane {lane} in {t:?}");
    }
    assert_eq!(count(&t, "L"), 1, "{t:?}");
    // simulate draws the same chart of the same schedule (the title names its solver).
    let again = dir.join("simulate.svg");
    ok(&["simulate", "--chain", s(&chain), "--schedule", s(&schedule), "--budget", "100%", "--timeline", s(&again)]);
    let u = texts(&std::fs::read_to_string(&again).expect("written"));
    assert_eq!(t[1..], u[1..], "the same figures, bars and axes");
    // Without the flag, no chart.
    let quiet = ok(&args);
    assert!(!quiet.stdout.contains("timeline"), "{}", quiet.stdout);
    // On a model, the summary says where it went.
    let model = dir.join("model.svg");
    let run = ok(&["plan", "--model", "mlp", "--budget", "100%", "--solver", "rotor", "--timeline", s(&model)]);
    assert!(run.stdout.contains(&format!("timeline written to {}", model.display())), "{}", run.stdout);
    let t = texts(&std::fs::read_to_string(&model).expect("written"));
    assert!(t[0].starts_with("rotor on mlp, batch "), "{t:?}");
    assert!(t.iter().any(|x| x == "time (s)"), "{t:?}");
}

#[test]
fn optimizer_steps_on_the_host_get_a_lane_of_their_own() {
    let dir = Scratch::new("cpu-lane");
    let svg = dir.join("t.svg");
    // `plan` of the batch-4 MLP at 100% with `solver`, its timeline to `svg`.
    let plan = |solver: &str, svg: &Path| {
        ok(&["plan", "--model", "mlp", "--batch", "4", "--budget", "100%", "--solver", solver, "--timeline", s(svg)])
    };
    let run = plan("zero-offload", &svg);
    assert!(run.stdout.contains("optimizer steps on the host CPU busy"), "{}", run.stdout);
    let t = texts(&std::fs::read_to_string(&svg).expect("written"));
    assert_eq!(count(&t, "host CPU"), 1, "{t:?}");
    assert_eq!(count(&t, "CPU optimizer step"), 1, "the legend names it: {t:?}");
    assert!(t.iter().any(|x| x.contains("CPU busy")), "the figures line gives its busy time: {t:?}");
    // A schedule without CPU steps keeps three lanes.
    let plain = dir.join("plain.svg");
    plan("store-all", &plain);
    let t = texts(&std::fs::read_to_string(&plain).expect("written"));
    assert_eq!(count(&t, "host CPU"), 0, "{t:?}");
}
