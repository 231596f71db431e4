//! Progress bars for long-running work: drawn on a terminal, silent in a pipe.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;

/// How often a caller should tick the bar, in items.
pub const TICK_ITEMS: u64 = 1024;

/// A bar over `total` items named `what`, drawn on stderr only when `enabled` and stderr
/// is a terminal. Shows items per second.
pub fn bar(total: u64, what: &str, enabled: bool) -> ProgressBar {
    let target = target(enabled);
    // A hidden bar is never drawn: its style (a template to parse) would go unused.
    if target.is_hidden() {
        return ProgressBar::with_draw_target(Some(total), target);
    }
    let bar = ProgressBar::with_draw_target(Some(total), target);
    let template = format!("{{spinner}} {what} [{{bar:32}}] {{pos}}/{{len}} events, {{per_sec}}, eta {{eta}}");
    if let Ok(style) = ProgressStyle::with_template(&template) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar
}

/// A spinner named `what`, for work of unknown length, under the same rules as [`bar`].
pub fn spinner(what: &str, enabled: bool) -> ProgressBar {
    let target = target(enabled);
    if target.is_hidden() {
        return ProgressBar::with_draw_target(None, target);
    }
    let bar = ProgressBar::with_draw_target(None, target);
    if let Ok(style) = ProgressStyle::with_template(&format!("{{spinner}} {what}: {{pos}} ({{per_sec}})")) {
        bar.set_style(style);
    }
    bar
}

fn target(enabled: bool) -> ProgressDrawTarget {
    if enabled && std::io::stderr().is_terminal() {
        ProgressDrawTarget::stderr()
    } else {
        ProgressDrawTarget::hidden()
    }
}
