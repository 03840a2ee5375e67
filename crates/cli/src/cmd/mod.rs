//! One module per subcommand: each turns its parsed flags into output and an exit code.

pub mod bench;
pub mod graph;
pub mod info;
pub mod models;
pub mod plan;
pub mod profile;
pub mod simulate;
pub mod sweep;
pub mod train;

use pebble_machine::Machine;
use pebble_solve::budget::{Budget, BudgetRequest};

/// `predicted / baseline − 1`, or 0 when the baseline takes no time.
pub fn overhead(predicted: f64, baseline: f64) -> f64 {
    if baseline > 0.0 {
        predicted / baseline - 1.0
    } else {
        0.0
    }
}

/// The solver options from the flags on `machine`: `--bandwidth` replaces both host-link
/// directions' bandwidth; long solves draw progress on a terminal.
pub fn solve_options(args: &crate::flags::SolveArgs, machine: &Machine) -> pebble_solve::SolveOptions {
    let defaults = pebble_solve::SolveOptions::default();
    pebble_solve::SolveOptions {
        slots: args.slots.unwrap_or(defaults.slots),
        time_limit: args.time_limit,
        machine: match args.bandwidth {
            Some(b) => machine.with_bandwidth(b),
            None => *machine,
        },
        progress: crate::progress::solver_progress(),
    }
}

/// The budget `--budget` or `--activation-budget` asks for, by the one memory model every
/// command uses ([`pebble_solve::budget`]): bytes in all, the executor's reserve, and the
/// share solvers plan in.
pub fn resolve_budget(
    args: &crate::flags::BudgetArgs,
    store_all_peak: u64,
    static_bytes: u64,
    machine: &Machine,
) -> anyhow::Result<Budget> {
    let request = match (args.budget, args.activation_budget) {
        (Some(b), _) => BudgetRequest::Total(b),
        (None, Some(a)) => BudgetRequest::Activation(a),
        (None, None) => return Err(crate::error::bad("give --budget or --activation-budget")),
    };
    Ok(request.resolve(store_all_peak, static_bytes, &machine.runtime))
}

/// The JSON fields every planning command prints about its budget: the budget in all,
/// the share solvers plan in, the runtime's reserve, what `100%` is (store-all's peak plus
/// its reserve), and the runtime overhead of the profile.
pub fn budget_json(budget: &Budget, machine: &Machine) -> serde_json::Value {
    serde_json::json!({
        "budget_bytes": budget.total_bytes,
        "planned_bytes": budget.planned_bytes,
        "reserve_bytes": budget.reserve_bytes,
        "store_all_budget_bytes": budget.reference_bytes,
        "runtime_overhead": machine.runtime,
    })
}

/// A percentage of `reference`, one decimal.
pub fn percent_of(value: u64, reference: u64) -> String {
    if reference == 0 {
        "-".to_string()
    } else {
        format!("{:.1}%", 100.0 * value as f64 / reference as f64)
    }
}
