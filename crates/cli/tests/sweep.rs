//! `pebble sweep --chart`: what its throughput chart draws, against its own JSON.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use common::{ok, pebble};
use serde_json::Value;

/// A fresh scratch directory for one test, removed when dropped.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn scratch(test: &str) -> Scratch {
    let dir = std::env::temp_dir().join(format!("pebble-sweep-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    Scratch(dir)
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// A small ResNet, batch 2: every solver plans it in milliseconds.
const MODEL: [&str; 6] = ["--model", "resnet18", "--batch", "2", "--image", "64"];

/// The sweep's arguments on [`MODEL`] with `extra` after them.
fn sweep_args<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["sweep"];
    args.extend(MODEL);
    args.extend(["--solvers", "sequential,rotor", "--points", "6"]);
    args.extend(extra);
    args
}

/// A column's distinct feasible schedules: `(peak, time)` as the JSON gives them.
fn distinct(column: &Value) -> BTreeSet<(u64, u64)> {
    let points = column["points"].as_array().expect("points");
    let feasible = points.iter().filter(|p| p["feasible"] == true);
    feasible
        .map(|p| {
            let peak = p["predicted_peak_bytes"].as_u64().expect("a peak");
            (peak, p["predicted_time"].as_f64().expect("a time").to_bits())
        })
        .collect()
}

/// The SVG elements of one kind (`<line`, `<polyline`) stroked in `color` 2 pixels wide.
fn stroked<'a>(svg: &'a str, element: &str, color: &str) -> Vec<&'a str> {
    let stroke = format!("stroke=\"{color}\" stroke-width=\"2\"");
    svg.lines().filter(|l| l.starts_with(&format!("{element} ")) && l.contains(&stroke)).collect()
}

/// tab10's first two colors: the chart's first and second columns.
const FIRST: &str = "#1F77B4";
const SECOND: &str = "#FF7F0E";

#[test]
fn the_throughput_chart_draws_each_schedule_at_its_peak_and_sequential_without_a_line() {
    let dir = scratch("throughput");
    let svg_path = dir.0.join("throughput.svg");
    let j = ok(&sweep_args(&["--chart", "throughput", "--svg", s(&svg_path), "--json"])).json();
    assert_eq!(j["batch"], 2);
    // Every feasible point's throughput is the batch over its simulated step time.
    for column in j["solvers"].as_array().expect("solvers") {
        for p in column["points"].as_array().expect("points") {
            match p["predicted_time"].as_f64() {
                Some(time) => {
                    let throughput = p["throughput"].as_f64().expect("a throughput");
                    assert!((throughput - 2.0 / time).abs() <= 1e-9 * throughput, "{p}");
                }
                None => assert!(p.get("throughput").is_none(), "an infeasible point has no throughput: {p}"),
            }
        }
    }
    let (sequential, rotor) = (distinct(&j["solvers"][0]), distinct(&j["solvers"][1]));
    assert!(sequential.len() >= 2 && rotor.len() >= 3, "{sequential:?} {rotor:?}");
    let svg = std::fs::read_to_string(&svg_path).expect("svg written");
    assert!(svg.contains("throughput (images/s)") && svg.contains("simulated peak memory (MiB)"), "the axes");
    assert!(svg.contains("throughput vs peak memory"), "the title");
    // Sequential: a cross (two strokes) per distinct schedule and one in the legend, no line.
    assert_eq!(stroked(&svg, "<line", FIRST).len(), 2 * (sequential.len() + 1));
    assert!(stroked(&svg, "<polyline", FIRST).is_empty(), "sequential's schedules are not joined");
    // Rotor: one line through its distinct schedules, in order of peak.
    let line = stroked(&svg, "<polyline", SECOND)[0];
    let xs: Vec<f64> = line
        .split("points=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("points")
        .split_whitespace()
        .map(|p| p.split(',').next().and_then(|x| x.parse().ok()).expect("x,y"))
        .collect();
    assert_eq!(xs.len(), rotor.len(), "{line}");
    assert!(xs.windows(2).all(|w| w[0] <= w[1]), "in order of peak: {xs:?}");
}

#[test]
fn the_default_chart_is_the_overhead_chart() {
    let dir = scratch("default");
    let (default, overhead) = (dir.0.join("default.svg"), dir.0.join("overhead.svg"));
    ok(&sweep_args(&["--svg", s(&default)]));
    ok(&sweep_args(&["--chart", "overhead", "--svg", s(&overhead)]));
    let text = std::fs::read_to_string(&default).expect("svg written");
    assert_eq!(text, std::fs::read_to_string(&overhead).expect("svg written"));
    assert!(text.contains("time overhead over store-all (%)"), "the overhead chart");
}

#[test]
fn a_bad_chart_is_bad_input() {
    for (extra, needle) in [
        (vec!["--chart", "speed", "--svg", "x.svg"], "--chart"),
        (vec!["--chart", "throughput"], "--svg"),
        (vec!["--chart", "throughput", "--svg", "x.svg", "--devices", "2"], "--devices"),
    ] {
        let run = pebble(&sweep_args(&extra));
        assert_eq!(run.code, 2, "{extra:?}: {}", run.stderr);
        assert!(run.stderr.starts_with("error: ") && run.stderr.contains(needle), "{extra:?}: {}", run.stderr);
    }
}
