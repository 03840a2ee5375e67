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

/// `predicted / baseline − 1`, or 0 when the baseline takes no time.
pub fn overhead(predicted: f64, baseline: f64) -> f64 {
    if baseline > 0.0 {
        predicted / baseline - 1.0
    } else {
        0.0
    }
}

/// The solver options from the flags, with the source's default bandwidth.
pub fn solve_options(args: &crate::flags::SolveArgs, source: &crate::source::Source) -> pebble_solve::SolveOptions {
    let defaults = pebble_solve::SolveOptions::default();
    pebble_solve::SolveOptions {
        slots: args.slots.unwrap_or(defaults.slots),
        time_limit: args.time_limit,
        bandwidth: args.bandwidth.unwrap_or_else(|| source.default_bandwidth()),
    }
}

/// A percentage of `reference`, one decimal.
pub fn percent_of(value: u64, reference: u64) -> String {
    if reference == 0 {
        "-".to_string()
    } else {
        format!("{:.1}%", 100.0 * value as f64 / reference as f64)
    }
}
