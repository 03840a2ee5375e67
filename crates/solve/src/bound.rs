//! Lower bounds: a time that no schedule of some family beats, given without a schedule.
//!
//! A bound is not a [`crate::Solver`]: it returns a time, and nothing for the simulator to
//! check. The CLI takes a bound's name wherever it takes a solver's (`pebble plan
//! --solver offload-bound`, `pebble sweep --solvers rotor,offload-bound`) and reports the
//! time alone, or draws it as a curve beside the solvers'.

use pebble_graph::Chain;
use pebble_machine::Machine;

use crate::SolveError;

/// A lower bound on the time of a family of schedules of a chain.
pub struct Bound {
    /// Its name, as the CLI takes it.
    pub name: &'static str,
    /// One line for `--help`.
    pub description: &'static str,
    /// The bound for a chain, a budget in bytes (static memory included, as solvers get
    /// it) and a machine; [`SolveError::Infeasible`] when no schedule of the family fits.
    pub time: fn(&Chain, u64, &Machine) -> Result<f64, SolveError>,
    /// A solver whose least feasible budget is the family's, for the message of an
    /// infeasible budget.
    pub feasibility: &'static str,
}

/// A bound's entry in the registry: crates that define bounds (`pebble-ilp`'s MILP
/// bounds) submit one with `inventory::submit!`, as solvers do.
pub struct BoundRegistration(pub &'static Bound);

inventory::collect!(BoundRegistration);

/// Offloading without recomputation (Shilova, Prop. 3).
pub const OFFLOAD_BOUND: Bound = Bound {
    name: "offload-bound",
    description:
        "lower bound of offloading without recomputation, max(Σu, Q/β↓ + Q/β↑) (Shilova, Prop. 3); a time, no schedule",
    time: crate::offload::lower_bound,
    // Offloading alone fits wherever each layer fits with its input (3.8)–(3.9), as
    // GREEDY does.
    feasibility: "offload-greedy",
};

inventory::submit!(BoundRegistration(&OFFLOAD_BOUND));

/// Every bound registered in this binary, by name.
pub fn bounds() -> Vec<&'static Bound> {
    let mut all: Vec<&'static Bound> = inventory::iter::<BoundRegistration>.into_iter().map(|r| r.0).collect();
    all.sort_by_key(|b| b.name);
    all
}

/// The bound named `name`, if there is one.
pub fn bound(name: &str) -> Option<&'static Bound> {
    bounds().into_iter().find(|b| b.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offload_bound_is_found_by_name_and_no_solver_shares_it() {
        let b = bound("offload-bound").expect("registered");
        assert_eq!(b.name, "offload-bound");
        assert!(bound("rotor").is_none());
        for b in bounds() {
            assert!(crate::solver(b.name).is_err(), "`{}` is both a bound and a solver", b.name);
            assert!(crate::solver(b.feasibility).is_ok(), "`{}`'s feasibility solver is unknown", b.name);
        }
    }
}
