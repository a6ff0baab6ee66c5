//! Progress bars: drawn on stderr when it is a terminal, nothing otherwise.

use gdpath_bench::{NoProgress, Progress};
use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::sync::Mutex;

/// An indicatif bar per phase.
pub struct Bars {
    bar: Mutex<Option<ProgressBar>>,
}

impl Progress for Bars {
    fn start(&self, label: &str, total: u64) {
        let pb = ProgressBar::new(total);
        pb.set_style(
            ProgressStyle::with_template(
                "{msg:>24} [{bar:40}] {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
        );
        pb.set_message(label.to_owned());
        if let Some(old) = self
            .bar
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .replace(pb)
        {
            old.finish_and_clear();
        }
    }
    fn advance(&self, done: u64) {
        if let Some(pb) = &*self.bar.lock().unwrap_or_else(|p| p.into_inner()) {
            pb.inc(done);
        }
    }
    fn finish(&self) {
        if let Some(pb) = self.bar.lock().unwrap_or_else(|p| p.into_inner()).take() {
            pb.finish_and_clear();
        }
    }
}

/// Bars on a terminal (and not `--json`), silence otherwise.
pub fn for_terminal(quiet: bool) -> Box<dyn Progress> {
    if !quiet && std::io::stderr().is_terminal() {
        Box::new(Bars {
            bar: Mutex::new(None),
        })
    } else {
        Box::new(NoProgress)
    }
}
