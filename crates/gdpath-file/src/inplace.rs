//! An existing file written in place (a benchmark measuring overwrites): found as
//! [`super::AtomicFile`] finds a target, opened once, and used through that descriptor only.

use super::atomic::{checked, direct_by_name, Target};
use crate::error::{Error, Result};
use rustix::fs::{openat, Mode, OFlags};
use std::ffi::OsString;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::sync::Arc;

/// An existing regular file open for reading and writing, to be written in place. The path is
/// checked as [`super::AtomicFile::create`] checks a target with `overwrite` (every symbolic
/// link under the `protected_symlinks` rule, magic links of `/proc` refused, another user's
/// file in a sticky directory refused), and the file is opened once, from the inode the check
/// found: `/proc/self/fd/N` of its `O_PATH` descriptor opened again for writing (no name is
/// looked up), or, where `/proc` is not mounted, its name opened relative to its directory's
/// handle (`O_NOFOLLOW`) and kept only if it is the same inode. Every later use goes through
/// that descriptor ([`InPlaceFile::file`], which the engine registers), so a name swapped for a
/// link meanwhile changes nothing that is written.
#[derive(Debug)]
pub struct InPlaceFile {
    file: File,
    dir: File,
    name: OsString,
    target: Target,
    len: u64,
}

impl InPlaceFile {
    /// Opens the regular file at `path` to write it in place; `Ok(None)` when nothing is there.
    ///
    /// Errors: [`Error::Exists`] when it exists and `overwrite` is false (nothing is opened for
    /// writing); those of [`super::check_target`] ([`Error::NotAFile`],
    /// [`Error::SymlinkRefused`], [`Error::MagicLinkRefused`], [`Error::ForeignFileRefused`],
    /// [`Error::CreateIn`], [`Error::Open`]); [`Error::Open`] naming the file when it cannot be
    /// opened for writing (permission, a read-only file system) or its name meanwhile names
    /// another file (without `/proc`).
    pub fn open(path: &Path, overwrite: bool) -> Result<Option<InPlaceFile>> {
        let r = checked(path, overwrite)?;
        let Some((entry, md)) = r.existing else {
            return Ok(None);
        };
        let open_err = |e: std::io::Error| Error::Open {
            path: r.path.clone(),
            source: Arc::new(e),
        };
        let again = format!("/proc/self/fd/{}", entry.as_raw_fd());
        let file = match std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC | libc::O_NOCTTY)
            .open(&again)
        {
            Ok(f) => f,
            Err(e)
                if e.raw_os_error() == Some(libc::ENOENT) && !Path::new("/proc/self").exists() =>
            {
                let f = openat(
                    &r.dir,
                    &r.name,
                    OFlags::RDWR
                        | OFlags::NOFOLLOW
                        | OFlags::NONBLOCK
                        | OFlags::NOCTTY
                        | OFlags::CLOEXEC,
                    Mode::empty(),
                )
                .map(File::from)
                .map_err(|e| open_err(e.into()))?;
                let now = f.metadata().map_err(open_err)?;
                if (now.dev(), now.ino()) != (md.dev(), md.ino()) {
                    return Err(open_err(std::io::Error::other(
                        "its name meanwhile names another file",
                    )));
                }
                // A regular file never blocks: the flag only kept the open from blocking.
                rustix::fs::fcntl_setfl(
                    &f,
                    rustix::fs::fcntl_getfl(&f).map_err(|e| open_err(e.into()))? - OFlags::NONBLOCK,
                )
                .map_err(|e| open_err(e.into()))?;
                f
            }
            Err(e) => return Err(open_err(e)),
        };
        super::test_hook("in-place");
        Ok(Some(InPlaceFile {
            file,
            dir: r.dir,
            name: r.name,
            target: Target {
                path: r.path,
                through_link: r.linked,
                exists: true,
            },
            len: md.len(),
        }))
    }

    /// The file opened: its real path when a link was followed, as [`super::check_target`]
    /// says.
    pub fn target(&self) -> &Target {
        &self.target
    }

    /// Its length in bytes when it was opened.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether it was empty when it was opened.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The descriptor, open for reading and writing.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// The file opened again with `O_DIRECT` (read-write when `writable`), for the engine's
    /// direct I/O where `/proc` is not mounted (elsewhere the engine opens `/proc/self/fd/N`
    /// of [`InPlaceFile::file`]): its name opened relative to its directory's handle and kept
    /// only if it is still the same inode. `None` with `/proc`, where the file system refuses
    /// `O_DIRECT`, or where the name now names another file.
    pub fn reopen_direct(&self, writable: bool) -> Option<File> {
        direct_by_name(
            &self.file,
            &self.dir,
            &self.name,
            writable,
            &self.target.path,
        )
    }
}
