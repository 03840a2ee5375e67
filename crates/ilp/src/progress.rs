//! A progress bar on standard error for the solves that take minutes (HiRemate's
//! clusters, Rockmate's blocks), drawn only when standard error is a terminal, so pipes,
//! tests and `--json` consumers see nothing.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// A bar over `len` steps labelled `what`; hidden unless standard error is a terminal.
pub(crate) fn bar(len: usize, what: &str) -> ProgressBar {
    if !std::io::stderr().is_terminal() || len < 2 {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(Some(len as u64), ProgressDrawTarget::stderr());
    let template = format!("{{spinner}} {what} {{pos}}/{{len}} {{wide_bar}} {{elapsed}} {{msg}}");
    if let Ok(style) = ProgressStyle::with_template(&template) {
        bar.set_style(style);
    }
    bar
}
