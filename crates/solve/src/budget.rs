//! One memory model for every command: what a budget means, resolved once.
//!
//! A user's budget counts everything on the device. The executor keeps part of it for
//! what no schedule names ([`RuntimeOverhead`]: allocator and tensor metadata, its own
//! bookkeeping); solvers plan in the rest. A percentage is of what store-all needs to
//! *run*, its simulated peak plus that reserve, so that `100%` always fits store-all and
//! `plan`, `simulate` and `train` turn the same flags into the same bytes.

use pebble_graph::units::BudgetSpec;
use pebble_machine::RuntimeOverhead;

/// What `--budget` or `--activation-budget` asked for.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum BudgetRequest {
    /// Everything resident (`--budget`); `P%` of store-all's need.
    Total(BudgetSpec),
    /// Everything but parameters, their gradients and optimizer states, which are added
    /// to it (`--activation-budget`); `P%` of store-all's need less that static memory.
    Activation(BudgetSpec),
}

/// A budget in bytes, split between the executor's reserve and what solvers plan in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// Device memory allowed, everything counted: what the user asked for.
    pub total_bytes: u64,
    /// What solvers plan into and the simulator checks: `total_bytes − reserve_bytes`.
    pub planned_bytes: u64,
    /// What the executor keeps for itself.
    pub reserve_bytes: u64,
    /// What `100%` is: store-all's simulated peak plus the reserve it needs.
    pub reference_bytes: u64,
}

impl Budget {
    /// `total` bytes on a runtime with `overhead`; `reference` is what 100% is.
    pub fn of_total(total: u64, reference: u64, overhead: &RuntimeOverhead) -> Budget {
        let reserve = overhead.reserve(total);
        Budget {
            total_bytes: total,
            planned_bytes: total.saturating_sub(reserve),
            reserve_bytes: reserve.min(total),
            reference_bytes: reference,
        }
    }
}

impl BudgetRequest {
    /// Resolves the request against store-all's simulated peak and the static bytes of
    /// the problem, on a runtime with `overhead`.
    pub fn resolve(&self, store_all_peak: u64, static_bytes: u64, overhead: &RuntimeOverhead) -> Budget {
        let reference = overhead.budget_for(store_all_peak);
        let total = match *self {
            BudgetRequest::Total(b) => b.resolve(reference),
            BudgetRequest::Activation(a) => {
                a.resolve(reference.saturating_sub(static_bytes)).saturating_add(static_bytes)
            }
        };
        Budget::of_total(total, reference, overhead)
    }
}

/// The least total budget whose planned share is `planned` bytes (a solver's minimum, as
/// [`crate::min_feasible_budget`] finds it, turned into what the user must ask for).
pub fn total_for(planned: u64, overhead: &RuntimeOverhead) -> u64 {
    overhead.budget_for(planned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hundred_percent_fits_store_all_after_the_reserve() {
        let o = RuntimeOverhead::BURN;
        let b = BudgetRequest::Total(BudgetSpec::Percent(100.0)).resolve(1_000_000_000, 0, &o);
        assert_eq!(b.planned_bytes, 1_000_000_000);
        assert_eq!(b.total_bytes, b.reference_bytes);
        assert_eq!(b.total_bytes, b.planned_bytes + b.reserve_bytes);
        // 1% of the total (not of the planned share) plus 64 KiB: B − 0.01 B − 65 536 = 10⁹.
        assert_eq!(b.total_bytes, 1_010_167_208);
        assert_eq!(b.reserve_bytes, 65_536 + b.total_bytes / 100);
    }

    #[test]
    fn activation_percent_keeps_static_memory_whole() {
        let o = RuntimeOverhead::NONE;
        let b = BudgetRequest::Activation(BudgetSpec::Percent(50.0)).resolve(1000, 400, &o);
        assert_eq!((b.total_bytes, b.planned_bytes, b.reference_bytes), (700, 700, 1000));
        let b = BudgetRequest::Total(BudgetSpec::Bytes(123)).resolve(1000, 400, &o);
        assert_eq!((b.total_bytes, b.planned_bytes), (123, 123));
    }

    #[test]
    fn absolute_budgets_lose_the_reserve() {
        let o = RuntimeOverhead::BURN;
        let b = BudgetRequest::Total(BudgetSpec::Bytes(1 << 30)).resolve(0, 0, &o);
        assert_eq!(b.reserve_bytes, (64 << 10) + (1u64 << 30) / 100);
        assert_eq!(b.planned_bytes, (1 << 30) - b.reserve_bytes);
        assert_eq!(total_for(b.planned_bytes, &o), 1 << 30);
        // A budget below the fixed reserve leaves nothing to plan in.
        let b = BudgetRequest::Total(BudgetSpec::Bytes(1000)).resolve(0, 0, &o);
        assert_eq!((b.planned_bytes, b.reserve_bytes), (0, 1000));
    }
}
