//! `pebble bench`: Burn's autodiff with `NoCheckpointing` and `BalancedCheckpointing`,
//! pebble's `store-all`, and pebble's `rotor` at the peak `BalancedCheckpointing`
//! reached; one model, one backend, one run.

use std::process::ExitCode;

use super::train::{lift, run_target};
use crate::flags::BenchArgs;
use crate::out;

pub fn run(args: &BenchArgs) -> anyhow::Result<ExitCode> {
    let (device, options) = run_target(&args.model)?;
    let report = pebble_train::bench_on(device, &args.model.model, &options, args.steps as usize, args.model.seed)
        .map_err(lift)?;
    if args.json {
        out::print_json(&serde_json::to_value(&report)?)?;
        return Ok(ExitCode::SUCCESS);
    }
    let mib = |b: Option<u64>| b.map_or("-".to_string(), |b| format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64));
    let header: Vec<String> = ["contender", "step time", "measured peak", "predicted peak", "last loss"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let rows: Vec<Vec<String>> = report
        .contenders
        .iter()
        .map(|c| {
            vec![
                c.name.clone(),
                format!("{:.4} s", c.step_seconds),
                mib(c.measured_peak_bytes),
                mib(c.predicted_peak_bytes),
                c.losses.last().map_or("-".to_string(), |l| format!("{l:.4}")),
            ]
        })
        .collect();
    let mut text = format!("{} on {}, {} steps each\n\n", report.model, report.device, report.steps);
    text.push_str(&out::table(&header, &rows, &[false, true, true, true, true]));
    out::print(&text)?;
    Ok(ExitCode::SUCCESS)
}
