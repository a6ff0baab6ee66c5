//! The commands' output: every write to stdout and stderr goes through here, and none panics
//! (`println!` does when stdout is closed or full: "failed printing to stdout", status 101).
//!
//! What a failed write does (documented in the README, "Exit status"):
//! - stdout closed by its reader (`EPIPE`: `gdpath topo | head -1`): the rest of the output is
//!   dropped quietly and the command ends with the status it would have had: the doctor's
//!   verdict (0, 1, 2), a bench's or copy's 3 for data that did not verify, 0 otherwise. The
//!   reader chose to stop reading; the verdict is still what scripts test.
//! - any other failure to write stdout (`ENOSPC` on `> /dev/full`, `EIO`): the output is lost,
//!   so the command fails: `gdpath: error: cannot write to stdout: ...` on stderr and status 1
//!   (the doctor's 3, "the doctor failed").
//! - stderr that cannot be written: ignored (there is nowhere left to say it).

use gdpath::topo::text::escape;
use std::fmt::Arguments;
use std::io::Write;
use std::sync::Mutex;

/// How writing stdout failed, first failure only.
#[derive(Debug)]
pub enum Failure {
    /// The reader went away (`EPIPE`).
    Closed,
    /// Any other error.
    Failed(std::io::Error),
}

static FAILED: Mutex<Option<Failure>> = Mutex::new(None);

fn failed() -> std::sync::MutexGuard<'static, Option<Failure>> {
    FAILED.lock().unwrap_or_else(|p| p.into_inner())
}

/// Writes to stdout; after a first failure nothing more is written.
pub fn stdout(args: Arguments<'_>) {
    let mut f = failed();
    if f.is_some() {
        return;
    }
    if let Err(e) = std::io::stdout().lock().write_fmt(args) {
        *f = Some(classify(e));
    }
}

/// Writes to stderr, ignoring a failure.
pub fn stderr(args: Arguments<'_>) {
    let _ = std::io::stderr().lock().write_fmt(args);
}

fn classify(e: std::io::Error) -> Failure {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        Failure::Closed
    } else {
        Failure::Failed(e)
    }
}

/// How a command names a file it wrote: `given` as typed, followed by the file it links to
/// when `given` was a symbolic link (`real`), so that a write through a link never goes
/// unsaid: `report.html (the file /data/r.html it links to)`.
pub fn written(given: &std::path::Path, real: Option<&std::path::Path>) -> String {
    match real {
        Some(r) => format!("{} (the file {} it links to)", escape(given), escape(r)),
        None => escape(given),
    }
}

/// [`written`] for a [`gdpath::file::Target`] the write returned.
pub fn written_target(given: &std::path::Path, t: &gdpath::file::Target) -> String {
    written(given, t.through_link.then_some(t.path.as_path()))
}

/// Flushes stdout and returns how writing it failed, if it did.
pub fn finish() -> Option<Failure> {
    let mut f = failed();
    if f.is_none() {
        if let Err(e) = std::io::stdout().lock().flush() {
            *f = Some(classify(e));
        }
    }
    f.take()
}

/// `print!` through [`stdout`].
macro_rules! out {
    ($($t:tt)*) => { $crate::output::stdout(format_args!($($t)*)) };
}

/// `println!` through [`stdout`].
macro_rules! outln {
    () => { $crate::output::stdout(format_args!("\n")) };
    ($($t:tt)*) => { $crate::output::stdout(format_args!("{}\n", format_args!($($t)*))) };
}

/// `eprintln!` through [`stderr`].
macro_rules! errln {
    ($($t:tt)*) => { $crate::output::stderr(format_args!("{}\n", format_args!($($t)*))) };
}
