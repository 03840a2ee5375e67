//! `pebble reproduce EXPERIMENT`: a seed's headline result, in simulation, with one
//! command: `ch4` (Shilova's thesis, Ch. 4), `weights` (Beaumont et al. 2022, Table 1) and
//! `offmate` (Zhao's thesis, Ch. 4), `ch7` (Shilova's thesis, Ch. 7), `hiremate` (Zhao's
//! thesis, Ch. 3, against Rockmate) and `delta` (the DELTA paper's tables, against the
//! static planners).

mod ch4;
mod ch7;
mod delta;
mod delta_allocator;
mod delta_commands;
mod hiremate;
mod offmate;
mod weights;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use crate::flags::{Experiment, ReproduceArgs};
use crate::source::{check_new_file, write_new_file};

pub fn run(args: &ReproduceArgs) -> anyhow::Result<ExitCode> {
    check_flags(args)?;
    match args.experiment {
        Experiment::Ch4 => ch4::ch4(args),
        Experiment::Weights => weights::table1(args),
        Experiment::Offmate => offmate::offmate(args),
        Experiment::Ch7 => ch7::ch7(args),
        Experiment::Hiremate => hiremate::hiremate(args),
        Experiment::Delta => delta::delta(args),
    }
}

/// Refuses the flags the experiment does not read, instead of ignoring them: `--models`,
/// `--batch` and `--image` are Ch. 4's (the other experiments run fixed grids), `--ilp`
/// is `ch7`'s and `delta`'s. A value other than the flag's default is taken as given
/// (`reproduce weights --batch 0` ran the whole grid and said nothing).
fn check_flags(args: &ReproduceArgs) -> anyhow::Result<()> {
    use clap::Parser;
    let defaults = match crate::flags::Cli::try_parse_from(["pebble", "reproduce", "ch4"]) {
        Ok(crate::flags::Cli { command: crate::flags::Command::Reproduce(d) }) => d,
        _ => unreachable!("`pebble reproduce ch4` parses"),
    };
    let name = format!("{:?}", args.experiment).to_lowercase();
    if args.experiment != Experiment::Ch4 {
        for (flag, given) in [
            ("--models", args.models != defaults.models),
            ("--batch", args.batch != defaults.batch),
            ("--image", args.image != defaults.image),
        ] {
            if given {
                return Err(crate::error::bad(format!(
                    "{flag}: `reproduce {name}` runs a fixed grid; --models, --batch and --image are ch4's"
                )));
            }
        }
    }
    if args.ilp && !matches!(args.experiment, Experiment::Ch7 | Experiment::Delta) {
        return Err(crate::error::bad(format!(
            "--ilp: `reproduce {name}` solves no ILP it could re-solve (ch7 and delta do)"
        )));
    }
    Ok(())
}

/// The experiment's output files in `--out-dir`, checked before any work: none exists,
/// unless `--force`.
fn output_paths(args: &ReproduceArgs, files: &[&str]) -> anyhow::Result<Vec<PathBuf>> {
    let paths: Vec<PathBuf> = files.iter().map(|f| args.out_dir.join(f)).collect();
    for path in &paths {
        check_new_file(path, "--out-dir", args.force)?;
    }
    Ok(paths)
}

/// Writes an experiment's JSON report to `paths[0]` and its SVG charts to the other paths,
/// in `--out-dir` (created if missing), and says so.
fn write_outputs(
    args: &ReproduceArgs,
    paths: &[PathBuf],
    report: &serde_json::Value,
    svgs: &[&str],
    started: Instant,
) -> anyhow::Result<ExitCode> {
    let mut text = serde_json::to_string_pretty(report)?;
    text.push('\n');
    std::fs::create_dir_all(&args.out_dir)
        .map_err(|e| crate::error::bad(format!("--out-dir `{}`: {e}", args.out_dir.display())))?;
    write_new_file(&paths[0], "--out-dir", &text, args.force)?;
    for (path, svg) in paths[1..].iter().zip(svgs) {
        write_new_file(path, "--out-dir", svg, args.force)?;
    }
    let names: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
    eprintln!("wrote {} ({:.0} s)", names.join(", "), started.elapsed().as_secs_f64());
    Ok(ExitCode::SUCCESS)
}
