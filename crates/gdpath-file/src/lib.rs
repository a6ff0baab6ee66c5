//! Writing files safely: nothing that is not a regular file is opened for writing, and a file is
//! created or replaced only whole. The engine (`gdpath::file` re-exports this crate) registers
//! such files through their descriptors; this crate knows nothing of the engine.
//!
//! - [`check_regular`] refuses, by file type (`stat`, following symbolic links), a directory, a
//!   block or character device, a FIFO or a socket with [`Error::NotAFile`] before anything is
//!   opened, so that a device is never written (a block device reports a length of 0, which
//!   once sent `bench storage` down its "create the test file" branch) and a FIFO never blocks
//!   an open. The engine's file regions open through the same check ([`open_regular`]), and
//!   confirm it on the open descriptor (`fstat`), so a path swapped in between is refused too.
//! - [`AtomicFile`] creates or replaces a file through a temporary file in the target's
//!   directory that takes the target's name only when complete (`fsync` of the file, the link
//!   or rename, `fsync` of the directory): a failure, an interrupt or a `SIGKILL` leaves the old
//!   file as it was and no partial one. The temporary is an unnamed inode (`O_TMPFILE`) where
//!   the file system supports it, so a `SIGKILL` leaves no temporary either; elsewhere it is a
//!   named file. It is made, named and removed relative to a handle of the target's directory,
//!   and written only through its descriptor ([`AtomicFile::file`]; the engine registers a
//!   duplicate of it, and [`AtomicFile::reopen_direct`] where it needs `O_DIRECT` without
//!   `/proc`), so no directory renamed meanwhile can redirect the data. An existing target is
//!   replaced only when asked ([`ReplaceOptions::overwrite`]), never when it is another user's
//!   file in a sticky directory ([`Error::ForeignFileRefused`]), and keeps its owner and group
//!   (where the writer may set them), permission bits and extended attributes, not its set-id
//!   bits. Every component of the path, and of every symbolic link's text, is walked here one
//!   at a time, with the kernel's `protected_symlinks` rule applied to each link whatever the
//!   sysctl says: a link another user planted in a sticky world-writable directory is refused
//!   ([`Error::SymlinkRefused`]), as is a magic link of `/proc` ([`Error::MagicLinkRefused`]);
//!   [`check_target`] says which file a write would replace.
//! - [`InPlaceFile`] is an existing file found by the same walk and opened once, for writing
//!   it in place through that descriptor only (`bench storage --write --overwrite`).
//! - [`Temporary`] is a file this process made and removes: when dropped, and from a signal
//!   handler's thread through [`remove_live_temporaries`], so an interrupted command leaves none;
//!   a named temporary a `SIGKILL` leaves behind has a recognisable name ([`TEMP_MARKER`]) and
//!   is removed by the next [`AtomicFile::create`] of the same target
//!   ([`remove_stale_temporaries`]).
//!
//! Errors are this crate's [`Error`], whose variants are the engine's of the same names, text
//! and kind (`gdpath::Error` converts from it).

#![forbid(unsafe_code)]

mod atomic;
mod error;
mod inplace;
mod keep;
mod kind;
mod resolve;
mod temporary;

pub use atomic::{check_target, AtomicFile, ReplaceOptions, Target};
pub use error::{Error, FileError, Result};
pub use inplace::InPlaceFile;
pub use kind::{check_regular, is_no_space, open_regular, read_bounded, special_kind};
pub use temporary::{remove_live_temporaries, remove_stale_temporaries, Temporary, TEMP_MARKER};

/// A pause point for the tests that race a writer against another user (debug builds only;
/// nothing in a release build): where `GDPATH_TEST_HOOK` is set, runs it with `sh -c`, its
/// `$1` being `point` (`created`: an [`AtomicFile`]'s temporary exists; `in-place`: a bench's
/// file to overwrite is open), and waits for it. A test thus swaps a name or a directory at
/// the one moment a path-based open would have been redirected, without a timing race.
#[doc(hidden)]
pub fn test_hook(point: &str) {
    #[cfg(debug_assertions)]
    if let Some(cmd) = std::env::var_os("GDPATH_TEST_HOOK") {
        let st = std::process::Command::new("sh")
            .arg("-c")
            .arg(cmd)
            .arg("gdpath-test-hook")
            .arg(point)
            .status();
        tracing::debug!("test hook at {point}: {st:?}");
    }
    #[cfg(not(debug_assertions))]
    let _ = point;
}
