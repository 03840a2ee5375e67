//! What `pebble reproduce delta`'s two modules share ([`super::delta`] and
//! [`super::delta_allocator`]): the paper's figures, and the `pebble maxbatch` and `pebble
//! plan` commands each figure records, parsed and run by the commands' own code.

use anyhow::anyhow;
use clap::Parser;
use pebble_solve::{PlanError, SolveError};

use crate::cmd::plan::Setup;
use crate::flags::{Cli, Command, PlanArgs};
use crate::source::{find_solver, Source};

/// The paper's max-batch table (A100 80 GB): `(model, its name, baseline, DTR, DELTA)`.
pub(super) const PAPER_MAX: [(&str, &str, usize, usize, usize); 2] =
    [("resnet50", "ResNet-50", 891, 1072, 1814), ("resnet101", "ResNet-101", 594, 761, 1336)];

/// The paper's memory on ResNet-50: `(batch, baseline GB, DELTA GB)`, 63.3% and 60.6% saved.
pub(super) const PAPER_MEMORY: [(usize, f64, f64); 2] = [(128, 11.2, 4.11), (256, 21.3, 8.4)];

/// `pebble WORDS`, parsed as the command line would be.
fn parse(words: &str) -> anyhow::Result<Command> {
    let cli = Cli::try_parse_from(std::iter::once("pebble").chain(words.split_whitespace()))
        .map_err(|e| anyhow!("`pebble {words}`: {e}"))?;
    Ok(cli.command)
}

fn plan_args(words: &str) -> anyhow::Result<PlanArgs> {
    match parse(words)? {
        Command::Plan(args) => Ok(args),
        _ => Err(anyhow!("`pebble {words}` is not `plan`")),
    }
}

/// `pebble maxbatch`'s answer: the largest batch and how it fits, `None` if none fits.
pub(super) fn max_fit(
    words: &str,
    progress: &indicatif::ProgressBar,
) -> anyhow::Result<Option<(usize, crate::cmd::maxbatch::Fit)>> {
    let Command::Maxbatch(args) = parse(words)? else { return Err(anyhow!("`pebble {words}` is not `maxbatch`")) };
    let (name, policy) = crate::source::solver_or_policy(&args.solver, &args.policy)?;
    let solver = find_solver(name, if policy { "--policy" } else { "--solver" })?;
    crate::cmd::maxbatch::largest_fit(&args, solver, progress)
}

/// One `pebble plan` command, loaded: the solver, its view of the model and the setup.
pub(super) struct Planned {
    solver: &'static dyn pebble_solve::Solver,
    machine: pebble_machine::Machine,
    subject: crate::source::Subject,
    pub(super) setup: Setup,
}

impl Planned {
    pub(super) fn load(words: &str) -> anyhow::Result<Planned> {
        let args = plan_args(words)?;
        let solver = find_solver(&args.solver, "--solver")?;
        let (source, machine) = Source::load(&args.source, &args.opts)?;
        let subject = source.view_for(solver)?;
        let setup = Setup::new((&args.solve, &args.budget), &source, &machine, &subject)?;
        Ok(Planned { solver, machine, subject, setup })
    }

    /// The least budget (everything resident, the runtime's reserve included) the solver
    /// fits, as `pebble plan` reports it when the budget is too small.
    pub(super) fn least_budget(&self) -> anyhow::Result<Option<u64>> {
        let least = pebble_solve::min_feasible_budget(self.solver, self.subject.problem(), &self.setup.options)?;
        Ok(least.map(|planned| pebble_solve::budget::total_for(planned, &self.machine.runtime)))
    }

    /// The simulated step time within the budget, `None` if the solver finds nothing
    /// there (no search for a smaller budget: a MILP's would take hours).
    pub(super) fn step(&self) -> anyhow::Result<Option<f64>> {
        Ok(self.plan()?.map(|p| p.report.makespan))
    }

    /// The plan within the budget, `None` if the solver finds nothing there.
    pub(super) fn plan(&self) -> anyhow::Result<Option<pebble_solve::Plan>> {
        let (problem, budget) = (self.subject.problem(), self.setup.resolved.planned_bytes);
        match pebble_solve::plan(self.solver, problem, budget, &self.setup.options) {
            Ok(plan) => Ok(Some(plan)),
            Err(PlanError::Solve(SolveError::Infeasible { .. })) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }
}
