//! What the bench shows while it runs. On a terminal (standard error is one), a progress bar
//! names the target, the round and the phase and counts what the phase has done; each finished
//! phase leaves one line. Without a terminal, only those lines, one per phase, in the log.

use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Where the bench is: which target and round.
#[derive(Debug, Clone)]
pub struct Progress {
    terminal: bool,
    prefix: String,
}

impl Progress {
    /// For `target` in round `round` (from 1) of `rounds`.
    pub fn new(target: &str, round: usize, rounds: usize) -> Self {
        Self {
            terminal: std::io::stderr().is_terminal(),
            prefix: format!("{target}, round {round}/{rounds}"),
        }
    }

    /// A phase that will count to `total` `unit` (e.g. 8 "entries").
    pub fn phase(&self, name: &str, total: u64, unit: &'static str) -> Phase {
        let label = format!("{}: {name}", self.prefix);
        let bar = self.terminal.then(|| {
            let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
            bar.set_style(
                ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} {msg} ({elapsed})")
                    .unwrap_or_else(|_| ProgressStyle::default_bar())
                    .progress_chars("=> "),
            );
            bar.set_prefix(label.clone());
            bar.set_message(unit);
            bar.enable_steady_tick(Duration::from_millis(200));
            bar
        });
        Phase { label, bar }
    }
}

/// One phase under way.
pub struct Phase {
    label: String,
    bar: Option<ProgressBar>,
}

impl Phase {
    /// `n` more done.
    pub fn inc(&self, n: u64) {
        if let Some(bar) = &self.bar {
            bar.inc(n);
        }
    }

    /// The phase is over: its line, e.g. "1,234 MiB/s".
    pub fn finish(self, summary: &str) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
        tracing::info!("{}: {summary}", self.label);
    }
}
