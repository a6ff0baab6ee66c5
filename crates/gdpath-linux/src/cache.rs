//! Dropping a file's pages from the page cache, so that the next read comes from the device
//! (a cold read for a bench or a load).

use crate::SysError;
use nix::fcntl::{posix_fadvise, PosixFadviseAdvice};
use std::os::fd::AsRawFd;
use std::path::Path;

/// Asks the kernel to drop the page-cache pages of the whole file at `path`: its dirty pages
/// are written back first (`fdatasync`), since `posix_fadvise(POSIX_FADV_DONTNEED)` (offset 0,
/// length 0 = to the end) skips them, and a file just written would otherwise stay hot. Pages
/// other processes have mapped may stay, and tmpfs keeps every page (memory is its storage).
/// Advisory: success says the kernel took the advice, not that every page left.
///
/// Errors: a [`SysError`] naming `open` when the file cannot be opened for reading,
/// `fdatasync` when the write-back fails, or `posix_fadvise` when the call fails.
pub fn evict_page_cache(path: &Path) -> Result<(), SysError> {
    let f = std::fs::File::open(path).map_err(|e| SysError::new("open", e))?;
    evict_file_pages(&f)
}

/// [`evict_page_cache`] of a file already open as `f`, opening nothing by a path: for a file
/// written through its descriptor.
///
/// Errors: a [`SysError`] naming `fdatasync` or `posix_fadvise`.
pub fn evict_file_pages(f: &std::fs::File) -> Result<(), SysError> {
    f.sync_data().map_err(|e| SysError::new("fdatasync", e))?;
    posix_fadvise(f.as_raw_fd(), 0, 0, PosixFadviseAdvice::POSIX_FADV_DONTNEED)
        .map_err(|e| SysError::new("posix_fadvise", std::io::Error::from(e)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_just_written_leaves_the_page_cache() {
        // Beside the crate, not in /tmp, which may be tmpfs.
        let dir = tempfile::tempdir_in(gdpath_testkit::repo_root()).unwrap();
        let f = dir.path().join("dirty");
        std::fs::write(&f, vec![3u8; 8 << 20]).unwrap();
        let file = std::fs::File::open(&f).unwrap();
        if crate::fs_magic(&file).unwrap() == 0x0102_1994 {
            eprintln!("SKIP a_file_just_written_leaves_the_page_cache: the checkout is on tmpfs");
            return;
        }
        evict_page_cache(&f).unwrap();
        let resident = crate::resident_bytes(&file, 8 << 20).unwrap();
        assert!(
            resident < 1 << 20,
            "{resident} bytes still resident after the eviction"
        );
    }

    #[test]
    fn evicting_a_file_works_and_a_missing_one_is_an_open_error() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("x");
        std::fs::write(&f, vec![7u8; 1 << 20]).unwrap();
        evict_page_cache(&f).unwrap();
        // The data is still there, read back from the device.
        assert_eq!(std::fs::read(&f).unwrap(), vec![7u8; 1 << 20]);
        let missing = dir.path().join("missing");
        match evict_page_cache(&missing) {
            Err(SysError { op: "open", source }) => {
                assert_eq!(source.kind(), std::io::ErrorKind::NotFound)
            }
            other => panic!("{other:?}"),
        }
    }
}
