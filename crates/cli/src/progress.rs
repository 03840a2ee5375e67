//! Progress on standard error for long solves, drawn only when that is a terminal, so
//! that pipes, tests and `--json` consumers see nothing. Solvers report through
//! [`pebble_solve::Progress`] and draw nothing themselves; this is the one place bars are
//! drawn.

use std::collections::HashMap;
use std::io::IsTerminal;
use std::sync::{Arc, Mutex};

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

/// A bar over `len` steps labelled `what`; hidden unless standard error is a terminal.
pub fn bar(len: u64, what: &str) -> ProgressBar {
    if !std::io::stderr().is_terminal() || len < 2 {
        return ProgressBar::hidden();
    }
    styled(ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr()), what)
}

/// A spinner labelled `what`, for a search of unknown length (its message says where it
/// is); hidden unless standard error is a terminal.
pub fn spinner(what: &str) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
    if let Ok(style) = ProgressStyle::with_template(&format!("{{spinner}} {what} {{msg}} {{elapsed}}")) {
        bar.set_style(style);
    }
    bar.enable_steady_tick(std::time::Duration::from_millis(120));
    bar
}

fn styled(bar: ProgressBar, what: &str) -> ProgressBar {
    let template = format!("{{spinner}} {what} {{pos}}/{{len}} {{wide_bar}} {{elapsed}}");
    if let Ok(style) = ProgressStyle::with_template(&template) {
        bar.set_style(style);
    }
    bar
}

/// A [`pebble_solve::Progress`] that draws one bar per label a solver reports, or nothing
/// when standard error is not a terminal.
pub fn solver_progress() -> pebble_solve::Progress {
    if !std::io::stderr().is_terminal() {
        return pebble_solve::Progress::none();
    }
    let multi = MultiProgress::with_draw_target(ProgressDrawTarget::stderr());
    let bars: Arc<Mutex<HashMap<String, ProgressBar>>> = Arc::default();
    pebble_solve::Progress::new(move |what, done, total| {
        let Ok(mut bars) = bars.lock() else { return };
        if total < 2 {
            return;
        }
        let bar =
            bars.entry(what.to_string()).or_insert_with(|| styled(multi.add(ProgressBar::new(total as u64)), what));
        bar.set_length(total as u64);
        bar.set_position(done as u64);
        if done >= total {
            bar.finish_and_clear();
        }
    })
}
