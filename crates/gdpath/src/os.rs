//! The engine's operating-system layer: [`gdpath_linux`] (aligned and registered host memory,
//! io_uring, page-cache residency, statx/statfs, shared memory, mallopt, dlopen probes), its
//! `unsafe` kept in that crate so that this one forbids it. Re-exported here whole, with the
//! calls the engine's users make given the engine's error type.

pub use gdpath_linux::*;

/// Drops the page-cache pages of the file at `path` ([`gdpath_linux::evict_page_cache`]: dirty
/// pages written back first; advisory, tmpfs keeps every page).
///
/// Errors: [`crate::Error::Io`] at offset 0 with the failed call as its op (`open`,
/// `fdatasync` or `posix_fadvise`).
pub fn evict_page_cache(path: &std::path::Path) -> crate::Result<()> {
    gdpath_linux::evict_page_cache(path).map_err(|e| crate::Error::io(e.op, path, 0, e.source))
}

/// [`evict_page_cache`] of a file already open as `f` (named `path` in errors), opening nothing
/// by a path: for a file written through its descriptor.
///
/// Errors: [`crate::Error::Io`] at offset 0 with `fdatasync` or `posix_fadvise` as its op.
pub fn evict_file_pages(f: &std::fs::File, path: &std::path::Path) -> crate::Result<()> {
    gdpath_linux::evict_file_pages(f).map_err(|e| crate::Error::io(e.op, path, 0, e.source))
}
