//! `pebble reproduce EXPERIMENT`: a seed's headline result, in simulation, with one
//! command: `ch4` (Shilova's thesis, Ch. 4), `weights` (Beaumont et al. 2022, Table 1) and
//! `offmate` (Zhao's thesis, Ch. 4).

mod ch4;
mod offmate;
mod weights;

use std::process::ExitCode;

use crate::flags::{Experiment, ReproduceArgs};

pub fn run(args: &ReproduceArgs) -> anyhow::Result<ExitCode> {
    match args.experiment {
        Experiment::Ch4 => ch4::ch4(args),
        Experiment::Weights => weights::table1(args),
        Experiment::Offmate => offmate::offmate(args),
    }
}
