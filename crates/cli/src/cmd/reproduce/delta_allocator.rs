//! `pebble reproduce delta`'s figures under PyTorch's caching allocator (issue 48): what
//! the paper measured and the other figures leave out, the segments the allocator reserves
//! beside the bytes the planners count (`--allocator caching`).
//!
//! * **The largest batch in 80 GB** when the plan's segments must fit too (`pebble
//!   maxbatch --allocator caching`: the planner is given all of the memory, then 90% … 50%
//!   of it, until its segments fit), with each planner's allocated and reserved peaks
//!   there: the paper's "MC" is `torch.cuda.max_memory_allocated`.
//! * **The memory at one budget shared by DTR and DELTA**, as the paper measured it: at
//!   batch 128 and 256, the least budget both plan in, and each one's allocated and
//!   reserved peaks there, against store-all's (the paper's baseline).

use serde_json::{json, Value};

use super::delta_commands::{max_fit, Planned, PAPER_MAX, PAPER_MEMORY};
use crate::plot::{bars, BarSeries};

/// The planners of these figures: the fast ones (the MILPs' bisections take hours).
const PLANNERS: [(&str, bool); 7] = [
    ("store-all", false),
    ("rotor", false),
    ("pofo", false),
    ("dtr", true),
    ("delta", true),
    ("lru", true),
    ("largest", true),
];

/// The allocator's figures of one fit, as the JSON keeps them.
fn peaks(allocator: Option<pebble_sim::allocator::AllocatorStats>) -> Value {
    match allocator {
        Some(a) => json!({
            "peak_allocated_bytes": a.peak_allocated,
            "peak_reserved_bytes": a.peak_reserved,
            "fragmentation_at_peak": a.fragmentation_at_peak,
        }),
        None => json!({ "peak_allocated_bytes": null, "peak_reserved_bytes": null, "fragmentation_at_peak": null }),
    }
}

/// The largest batch of each planner when its segments fit `memory`, on each model.
pub(super) fn max_batch(
    models: &[&str],
    setup: &str,
    memory: &str,
    progress: &indicatif::ProgressBar,
) -> anyhow::Result<Vec<Value>> {
    let mut rows = Vec::new();
    for &model in models {
        let paper = PAPER_MAX.iter().find(|p| p.0 == model);
        let mut row = json!({
            "model": model,
            "paper": paper.map(|p| json!({ "store_all": p.2, "dtr": p.3, "delta": p.4,
                                           "dtr_mc_gb": if p.0 == "resnet50" { 32.87 } else { 28.65 },
                                           "delta_mc_gb": if p.0 == "resnet50" { 62.6 } else { 45.05 } })),
        });
        for (name, policy) in PLANNERS {
            let flag = if policy { "--policy" } else { "--solver" };
            let command =
                format!("maxbatch --model {model} {setup} --memory {memory} {flag} {name} --allocator caching");
            let found = max_fit(&command, progress)?;
            let mut cell = peaks(found.and_then(|f| f.1.allocator));
            cell["max_batch"] = json!(found.map(|f| f.0));
            cell["planner_share"] = json!(found.map(|f| f.1.share));
            cell["step_seconds"] = json!(found.map(|f| f.1.step));
            cell["command"] = json!(format!("pebble {command} --json"));
            eprintln!("{model} under the caching allocator: {name}: largest batch {}", cell["max_batch"]);
            row[name] = cell;
        }
        rows.push(row);
    }
    Ok(rows)
}

/// At batch 128 and 256 on ResNet-50: the least budget both DTR and DELTA plan in (without
/// the allocator, as their budgets count bytes), and each one's peaks there under the
/// caching allocator, beside store-all's, on the whole 80 GB.
pub(super) fn one_budget(setup: &str, memory_bytes: u64) -> anyhow::Result<Vec<Value>> {
    let mut rows = Vec::new();
    for (batch, paper_base, paper_delta) in PAPER_MEMORY {
        let words = |name: &str, budget: &str| {
            format!(
                "plan --model resnet50 --batch {batch} {setup} --solver {name} --budget {budget} --allocator caching"
            )
        };
        let mut least = 0u64;
        for name in ["dtr", "delta"] {
            let mut planned = Planned::load(&words(name, "100MB"))?;
            planned.setup.options.allocator = None;
            let b =
                planned.least_budget()?.ok_or_else(|| anyhow::anyhow!("`{name}` fits no budget at batch {batch}"))?;
            least = least.max(b);
        }
        let mut row = json!({
            "batch": batch,
            "budget_bytes": least,
            "paper": { "store_all_gb": paper_base, "dtr_gb": if batch == 128 { Some(10.5) } else { None }, "delta_gb": paper_delta },
        });
        for name in ["store-all", "dtr", "delta"] {
            // Store-all needs more than the shared budget: the whole memory, as the baseline.
            let budget = if name == "store-all" { memory_bytes } else { least };
            let command = words(name, &budget.to_string());
            let mut planned = Planned::load(&command)?;
            if let Some(a) = &mut planned.setup.options.allocator {
                a.capacity = Some(memory_bytes);
            }
            let mut cell = peaks(planned.plan()?.and_then(|p| p.report.allocator));
            cell["command"] = json!(format!("pebble {command} --json"));
            row[name] = cell;
        }
        eprintln!("resnet50 at batch {batch}, one budget of {least} bytes: {row}");
        rows.push(row);
    }
    Ok(rows)
}

/// The growth chart under the caching allocator, beside the paper's.
pub(super) fn chart(rows: &[Value], model_names: &[String]) -> anyhow::Result<String> {
    let growth =
        |row: &Value, name: &str| Some(row[name]["max_batch"].as_f64()? / row["store-all"]["max_batch"].as_f64()?);
    let mut series: Vec<BarSeries> = PLANNERS[1..]
        .iter()
        .enumerate()
        .map(|(color, &(name, _))| BarSeries {
            name: name.to_string(),
            color,
            values: rows.iter().map(|r| growth(r, name)).collect(),
        })
        .collect();
    for (color, (name, key)) in [(8, ("paper: DTR", "dtr")), (9, ("paper: DELTA", "delta"))] {
        let values = rows.iter().map(|r| Some(r["paper"][key].as_f64()? / r["paper"]["store_all"].as_f64()?)).collect();
        series.push(BarSeries { name: name.into(), color, values });
    }
    bars(
        "Largest batch in 80 GB under PyTorch's caching allocator, a100, 64 GB/s",
        "largest batch ÷ store-all's (both under the allocator)",
        model_names,
        &series,
        |v| format!("{v:.2}×"),
    )
}

/// The two tables, as text.
pub(super) fn table(max_rows: &[Value], budget_rows: &[Value]) -> String {
    let gb = |v: &Value| v.as_f64().map_or("-".to_string(), |b| format!("{:.1} GB", b / 1e9));
    let mut out = String::from("under the caching allocator, largest batch in 80 GB (allocated / reserved there):\n");
    for r in max_rows {
        out.push_str(&format!("  {}:", r["model"].as_str().unwrap_or("?")));
        for (name, _) in PLANNERS {
            let c = &r[name];
            out.push_str(&format!(
                " {name} {} ({} / {})",
                c["max_batch"],
                gb(&c["peak_allocated_bytes"]),
                gb(&c["peak_reserved_bytes"])
            ));
        }
        out.push('\n');
    }
    out.push_str("under the caching allocator, one budget for DTR and DELTA on ResNet-50 (allocated / reserved):\n");
    for r in budget_rows {
        out.push_str(&format!("  batch {} at {}:", r["batch"], gb(&r["budget_bytes"])));
        for name in ["store-all", "dtr", "delta"] {
            let c = &r[name];
            out.push_str(&format!(" {name} {} / {}", gb(&c["peak_allocated_bytes"]), gb(&c["peak_reserved_bytes"])));
        }
        out.push('\n');
    }
    out
}
