//! Writing files safely: nothing that is not a regular file is opened for writing, and a file is
//! created or replaced only whole.
//!
//! - [`check_regular`] refuses, by file type (`stat`, following symbolic links), a directory, a
//!   block or character device, a FIFO or a socket with [`Error::NotAFile`](crate::Error::NotAFile)
//!   before anything is opened, so that a device is never written (a block device reports a
//!   length of 0, which once sent `bench storage` down its "create the test file" branch) and a
//!   FIFO never blocks an open. The engine's file regions
//!   ([`FileSpec`](crate::FileSpec)) open through the same check, and confirm it on the open
//!   descriptor (`fstat`), so a path swapped in between is refused too.
//! - [`AtomicFile`] creates or replaces a file through a temporary file in the target's
//!   directory that takes the target's name only when complete (`fsync` of the file, the link
//!   or rename, `fsync` of the directory): a failure, an interrupt or a `SIGKILL` leaves the old
//!   file as it was and no partial one. The temporary is an unnamed inode (`O_TMPFILE`) where
//!   the file system supports it, so a `SIGKILL` leaves no temporary either; elsewhere it is a
//!   named file. An existing target is replaced only when asked ([`ReplaceOptions::overwrite`]),
//!   and keeps its owner and group (where the writer may set them), permission bits and extended
//!   attributes, not its set-id bits. A symbolic link as target is followed one link at a time
//!   with the kernel's `protected_symlinks` rule applied whatever the sysctl says: a link another
//!   user planted in a sticky world-writable directory is refused
//!   ([`Error::SymlinkRefused`](crate::Error::SymlinkRefused)); [`check_target`] says which file a
//!   write would replace.
//! - [`Temporary`] is a file this process made and removes: when dropped, and from a signal
//!   handler's thread through [`remove_live_temporaries`], so an interrupted command leaves none;
//!   a named temporary a `SIGKILL` leaves behind has a recognisable name ([`TEMP_MARKER`]) and
//!   is removed by the next [`AtomicFile::create`] of the same target
//!   ([`remove_stale_temporaries`]).

mod atomic;
mod keep;
mod kind;
mod resolve;
mod temporary;

pub use atomic::{check_target, AtomicFile, ReplaceOptions, Target};
pub use kind::{check_regular, is_no_space, open_regular, read_bounded, special_kind};
pub use temporary::{remove_live_temporaries, remove_stale_temporaries, Temporary, TEMP_MARKER};
