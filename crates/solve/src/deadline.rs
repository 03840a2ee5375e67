//! The wall-clock deadline of the solve running on this thread, which every MILP's time
//! limit is clamped to.
//!
//! A solver is a pure function and cannot be stopped, and a MILP solver runs many MILPs
//! (HiRemate one per cluster and grid point), each under `SolveOptions::time_limit`. `auto`
//! shares one time limit among its solvers: it runs each within [`within`], and
//! `pebble-ilp`'s `Milp::solve` gives HiGHS no more than what is [`left`], so that a
//! solver that started in time ends about when its share does. Solver threads inherit the
//! deadline of the thread that spawns them ([`current`], then [`within`] on the new thread).

use std::cell::Cell;
use std::time::Instant;

thread_local! {
    static DEADLINE: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// The deadline on this thread, if any.
pub fn current() -> Option<Instant> {
    DEADLINE.with(Cell::get)
}

/// Runs `f` with a deadline of `deadline` (or the current one, if earlier; `None` keeps
/// the current one), and restores the current one afterwards, even if `f` panics.
pub fn within<R>(deadline: Option<Instant>, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<Instant>);
    impl Drop for Restore {
        fn drop(&mut self) {
            DEADLINE.with(|d| d.set(self.0));
        }
    }
    let outer = current();
    let _restore = Restore(outer);
    let inner = match (outer, deadline) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    DEADLINE.with(|d| d.set(inner));
    f()
}

/// A time limit in seconds clamped to what is left before the deadline (zero once it has
/// passed); `limit` itself where there is no deadline.
pub fn left(limit: Option<f64>) -> Option<f64> {
    let Some(deadline) = current() else { return limit };
    let secs = deadline.saturating_duration_since(Instant::now()).as_secs_f64();
    Some(limit.map_or(secs, |l| l.min(secs)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_earlier_deadline_holds_inside_and_the_outer_one_after() {
        assert_eq!(left(Some(5.0)), Some(5.0));
        let soon = Instant::now() + Duration::from_secs(2);
        within(Some(soon), || {
            let l = left(Some(5.0)).unwrap();
            assert!(l <= 2.0 && l > 1.0, "{l}");
            // A later deadline inside does not extend it.
            within(Some(soon + Duration::from_secs(60)), || assert!(left(None).unwrap() <= 2.0));
            // Spent: nothing is left.
            within(Some(Instant::now()), || assert_eq!(left(Some(5.0)), Some(0.0)));
            assert!(left(None).unwrap() > 1.0);
        });
        assert_eq!(left(Some(5.0)), Some(5.0));
        let caught = std::panic::catch_unwind(|| within(Some(soon), || panic!("a solver bug")));
        assert!(caught.is_err());
        assert_eq!(current(), None);
    }
}
