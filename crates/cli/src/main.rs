//! `pebble`: plans the memory of one DNN training step (rematerialization, offloading).
//!
//! This crate holds only flags, output and exit codes; the planning lives in the
//! library crates. `flags` is what clap parses, `source` gives it meaning (files, zoo
//! models, views, budgets), `cmd` has one module per subcommand, `plot` draws SVGs.
//!
//! Exit codes: 0 on success; 1 when the budget is infeasible, a schedule is invalid or
//! pebble itself fails; 2 on bad input (a malformed file, an unknown name, a bad flag),
//! as for clap's own usage errors.
#![forbid(unsafe_code)]

mod cmd;
mod error;
mod flags;
mod gantt;
mod out;
mod plot;
mod progress;
mod source;

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches};

use crate::flags::{Cli, Command};

// Links the ILP solvers (`checkmate`, …) into the solver registry: they register
// themselves with `inventory`, which only sees crates that are linked.
use pebble_ilp as _;

/// Counts heap bytes, so that `pebble train` measures the true peak of a CPU step.
#[global_allocator]
static ALLOC: pebble_runtime::memory::CountingAlloc = pebble_runtime::memory::CountingAlloc;

fn main() -> ExitCode {
    match run() {
        Ok(code) => code,
        // The reader of standard output went away (`| head`): it has what it wanted.
        Err(err) if error::is_broken_pipe(&err) => ExitCode::SUCCESS,
        Err(err) => {
            if let Some(verdict) = err.downcast_ref::<error::Infeasible>() {
                eprintln!("{verdict}");
            } else {
                eprintln!("error: {err:#}");
            }
            ExitCode::from(error::exit_code(&err))
        }
    }
}

fn run() -> anyhow::Result<ExitCode> {
    let cli = match parse() {
        Ok(cli) => cli,
        Err(e) => {
            // Help and version go to stdout with code 0; usage errors to stderr with 2.
            e.print()?;
            return Ok(ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2)));
        }
    };
    match &cli.command {
        Command::Models(args) => cmd::models::run(args),
        Command::Info(args) => cmd::info::run(args),
        Command::Graph(args) => cmd::graph::run(args),
        Command::Plan(args) => cmd::plan::run(args),
        Command::Simulate(args) => cmd::simulate::run(args),
        Command::Sweep(args) => cmd::sweep::run(args),
        Command::Maxbatch(args) => cmd::maxbatch::run(args),
        Command::Train(args) => cmd::train::run(args),
        Command::Profile(args) => cmd::profile::run(args),
        Command::Bench(args) => cmd::bench::run(args),
        Command::Reproduce(args) => cmd::reproduce::run(args),
        Command::Pipeline(args) => cmd::pipeline::run(args),
    }
}

/// Parses the command line, with the registered solvers listed in `plan --help` and
/// `sweep --help` (the registry is only known at run time).
fn parse() -> Result<Cli, clap::Error> {
    let solvers: String =
        pebble_solve::registry().iter().map(|s| format!("  {:<16} {}\n", s.name(), s.description())).collect();
    let bounds: String =
        pebble_solve::bound::bounds().iter().map(|b| format!("  {:<16} {}\n", b.name, b.description)).collect();
    let after = format!("Solvers:\n{solvers}");
    let with_bounds = format!("{after}\nBounds (a time, no schedule):\n{bounds}");
    let command = Cli::command()
        .mut_subcommand("plan", |c| c.after_help(with_bounds.clone()))
        .mut_subcommand("sweep", |c| c.after_help(with_bounds.clone()))
        .mut_subcommand("train", |c| c.after_help(after.clone()));
    let matches = command.try_get_matches()?;
    Cli::from_arg_matches(&matches)
}
