//! Writing files safely: the crate [`gdpath_file`] (files created or replaced whole, paths
//! walked under the kernel's `protected_symlinks` rule, non-regular files refused, temporaries
//! removed on signals), re-exported here, and what the engine adds to it: an [`AtomicFile`]'s
//! temporary and an [`InPlaceFile`] registered through their own descriptors
//! ([`AtomicFileExt::memory`], [`InPlaceFileExt::memory`]), never by a path, so that no
//! directory or name swapped meanwhile can redirect the engine's writes. Their errors are
//! [`gdpath_file::Error`], which `?` turns into the engine's [`crate::Error`] of the same
//! variant, text and kind.

pub use gdpath_file::*;

// The engine's error and result by their full paths: a `use` of them here would hide the
// file crate's, which the glob re-exports.
use crate::{DirectIo, FileAccess, FileSpec, Memory, OpenFile};
use std::fs::File;
use std::path::Path;
use std::sync::Arc;

/// What the engine adds to an [`AtomicFile`]: its temporary as engine memory.
pub trait AtomicFileExt {
    /// The temporary as a path for the engine to open: `FileSpec::write(temp).access(ReadWrite)`,
    /// with O_DIRECT policy `direct`. A named temporary's path can be redirected by a directory
    /// renamed after [`AtomicFile::create`]: register [`AtomicFileExt::memory`] instead.
    #[deprecated(
        note = "opens the temporary by its path, which a directory swapped meanwhile redirects: \
                register AtomicFileExt::memory, its descriptor"
    )]
    fn spec(&self, direct: DirectIo) -> FileSpec;

    /// The temporary as the engine registers it: its own descriptor (duplicated), never its
    /// path ([`OpenFile`], named [`AtomicFile::temp_path`] in messages), read-write, with
    /// O_DIRECT policy `direct`. For O_DIRECT the engine opens `/proc/self/fd/N` again with
    /// `O_DIRECT`; where `/proc` is missing, a named temporary is opened again by its name
    /// relative to the directory handle ([`AtomicFile::reopen_direct`]).
    ///
    /// Errors: [`crate::Error::Open`] naming the target when the descriptor cannot be duplicated
    /// (`EMFILE`).
    fn memory(&self, direct: DirectIo) -> crate::Result<Memory>;
}

impl AtomicFileExt for AtomicFile {
    fn spec(&self, direct: DirectIo) -> FileSpec {
        FileSpec::write(self.temp_path())
            .access(FileAccess::ReadWrite)
            .direct(direct)
    }

    fn memory(&self, direct: DirectIo) -> crate::Result<Memory> {
        open_file(
            self.file(),
            self.temp_path(),
            self.target(),
            FileAccess::ReadWrite,
            direct,
            || self.reopen_direct(),
        )
    }
}

/// What the engine adds to an [`InPlaceFile`]: the file as engine memory.
pub trait InPlaceFileExt {
    /// The file as the engine registers it: a duplicate of its descriptor ([`OpenFile`], named
    /// by [`InPlaceFile::target`]), with `access` and O_DIRECT policy `direct` (for O_DIRECT
    /// the engine opens `/proc/self/fd/N` again; without `/proc`, the name relative to the
    /// directory handle, if it is still the same inode: [`InPlaceFile::reopen_direct`]). Call
    /// it once per agent.
    ///
    /// Errors: [`crate::Error::Open`] when the descriptor cannot be duplicated (`EMFILE`).
    fn memory(&self, access: FileAccess, direct: DirectIo) -> crate::Result<Memory>;
}

impl InPlaceFileExt for InPlaceFile {
    fn memory(&self, access: FileAccess, direct: DirectIo) -> crate::Result<Memory> {
        let path = &self.target().path;
        open_file(self.file(), path, path, access, direct, || {
            self.reopen_direct(access.writable())
        })
    }
}

/// `file` (a regular file, open read-write) as the engine registers it, through its
/// descriptor: a duplicate of it, named `shown`, with O_DIRECT policy `direct`, and, unless
/// that is off, the `O_DIRECT` descriptor `direct_fd` gives (where `/proc` is missing).
/// Errors: [`crate::Error::Open`] naming `target` when `dup` fails.
fn open_file(
    file: &File,
    shown: &Path,
    target: &Path,
    access: FileAccess,
    direct: DirectIo,
    direct_fd: impl FnOnce() -> Option<File>,
) -> crate::Result<Memory> {
    let dup = file.try_clone().map_err(|e| crate::Error::Open {
        path: target.to_owned(),
        source: Arc::new(e),
    })?;
    let f = OpenFile::new(dup, shown, access).direct(direct);
    let again = (direct != DirectIo::Off).then(direct_fd).flatten();
    let f = match again {
        Some(d) => f.with_direct_fd(d),
        None => f,
    };
    Ok(Memory::OpenFile(f))
}
