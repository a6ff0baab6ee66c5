//! The benches' files: the checksum of a file's bytes, and the test file a read bench reads,
//! made whole or not at all.

use super::{fill_pattern, Checksum, Progress};
use gdpath::file::{check_regular, AtomicFile, ReplaceOptions};
use gdpath::{Error, Result};
use std::io::Write;
use std::path::Path;

/// Bytes per plain read or write of these helpers.
const BUF: usize = 8 << 20;

/// XXH3 ([`Checksum`]) of the first `len` bytes of the file at `path` (all of it when `len` is
/// `None`), read with plain buffered reads; a file that ends before `len` gives the checksum of
/// what it holds, so a comparison with the expected checksum fails. `progress` advances by the
/// bytes read.
///
/// Errors: [`Error::NotAFile`] for a directory, device, FIFO or socket (a FIFO would block);
/// [`Error::Open`]; [`Error::Io`] with op `read`.
pub fn checksum_file(path: &Path, len: Option<u64>, progress: &dyn Progress) -> Result<u64> {
    check_regular(path)?;
    let f = std::fs::File::open(path).map_err(|e| Error::Open {
        path: path.to_owned(),
        source: e.into(),
    })?;
    checksum_open(&f, path, len, progress)
}

/// [`checksum_file`] of a file already open as `f` (named `path` in errors), read from offset 0
/// with positioned reads (`pread`), so its own offset does not matter and no path is opened
/// again. Errors: [`Error::Io`] with op `read`.
pub fn checksum_open(
    f: &std::fs::File,
    path: &Path,
    len: Option<u64>,
    progress: &dyn Progress,
) -> Result<u64> {
    use std::os::unix::fs::FileExt;
    let mut buf = vec![0u8; BUF];
    let mut h = Checksum::new();
    let mut done = 0u64;
    while len.is_none_or(|l| done < l) {
        let want = len.map_or(BUF as u64, |l| (l - done).min(BUF as u64)) as usize;
        let n = match f.read_at(&mut buf[..want], done) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(Error::io("read", path, done, e)),
        };
        h.update(&buf[..n]);
        progress.advance(n as u64);
        done += n as u64;
    }
    Ok(h.digest())
}

/// [`checksum_open`] of the first `len` bytes an [`AtomicFile`] holds before its commit, read
/// through its descriptor (its temporary is never opened by a path). Errors: [`Error::Io`].
pub(crate) fn temporary_checksum(f: &AtomicFile, len: u64) -> Result<u64> {
    checksum_open(f.file(), f.temp_path(), Some(len), &crate::NoProgress)
}

/// A bench's test file, ready to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TestFile {
    /// XXH3 of its first `size` bytes.
    pub checksum: u64,
    /// This call wrote it (with [`fill_pattern`]); `false`: an existing file is read as it is.
    pub created: bool,
}

/// Makes sure the regular file at `path` holds at least `size` bytes and returns the checksum
/// of the first `size`. A file at least that long is used as it is. Otherwise the file is made,
/// `size` bytes of [`fill_pattern`] with `seed`, through an [`AtomicFile`]: the space is
/// reserved first (a file system too small fails before anything is written), and an error or
/// an interrupt leaves no file, or the old one as it was. A shorter existing file is replaced
/// only with `replace.overwrite` (an empty one always: it holds nothing to lose).
///
/// Errors: [`Error::NotAFile`] for a directory, device, FIFO or socket, before anything is
/// opened; [`Error::Config`] for a shorter file without `overwrite`; [`Error::NoSpace`];
/// [`Error::Open`], [`Error::Io`].
pub fn prepare_test_file(
    path: &Path,
    size: u64,
    seed: u64,
    replace: ReplaceOptions,
    progress: &dyn Progress,
) -> Result<TestFile> {
    let existing = check_regular(path)?;
    match &existing {
        Some(md) if md.len() >= size => {
            progress.start("checksum of the existing file", size);
            let h = checksum_file(path, Some(size), progress);
            progress.finish();
            return h.map(|checksum| TestFile {
                checksum,
                created: false,
            });
        }
        Some(md) if md.len() > 0 && !replace.overwrite => {
            return Err(Error::Config(format!(
                "{} has {} bytes, fewer than --size {}: pass a --size of at most its length to \
                 read it as it is, or --overwrite to replace it with a test pattern",
                gdpath::topo::text::escape(path),
                md.len(),
                size
            )))
        }
        _ => {}
    }
    let mut f = AtomicFile::create(path, replace.overwrite(existing.is_some()))?;
    f.reserve(size)?;
    progress.start("writing the test file", size);
    let mut buf = vec![0u8; BUF];
    let mut h = Checksum::new();
    let mut pos = 0u64;
    while pos < size {
        let n = (size - pos).min(BUF as u64) as usize;
        fill_pattern(&mut buf[..n], pos, seed);
        h.update(&buf[..n]);
        f.write_all(&buf[..n]).map_err(|e| f.write_error(e))?;
        progress.advance(n as u64);
        pos += n as u64;
    }
    f.commit()?;
    progress.finish();
    Ok(TestFile {
        checksum: h.digest(),
        created: true,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::NoProgress;

    #[test]
    fn a_short_file_needs_overwrite_and_a_long_one_is_read_as_it_is() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t");
        std::fs::write(&p, b"short").unwrap();
        let e = prepare_test_file(&p, 100, 1, ReplaceOptions::default(), &NoProgress).unwrap_err();
        assert!(matches!(e, Error::Config(_)), "{e}");
        assert_eq!(std::fs::read(&p).unwrap(), b"short");
        let made = prepare_test_file(
            &p,
            100,
            1,
            ReplaceOptions::default().overwrite(true),
            &NoProgress,
        )
        .unwrap();
        assert!(made.created);
        let mut want = vec![0u8; 100];
        fill_pattern(&mut want, 0, 1);
        assert_eq!(std::fs::read(&p).unwrap(), want);
        let again = prepare_test_file(&p, 60, 2, ReplaceOptions::default(), &NoProgress).unwrap();
        assert!(!again.created);
        assert_eq!(again.checksum, Checksum::of(&want[..60]));
        assert_eq!(
            checksum_file(&p, None, &NoProgress).unwrap(),
            Checksum::of(&want)
        );
        assert_eq!(
            checksum_file(&p, Some(1000), &NoProgress).unwrap(),
            Checksum::of(&want),
            "a file shorter than asked: the checksum of what it holds"
        );
    }

    #[test]
    fn a_device_or_fifo_is_refused_and_never_written() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
        for p in [Path::new("/dev/null"), fifo.as_path()] {
            let e = prepare_test_file(
                p,
                1 << 20,
                1,
                ReplaceOptions::default().overwrite(true),
                &NoProgress,
            )
            .unwrap_err();
            assert!(matches!(e, Error::NotAFile { .. }), "{e}");
            let e = checksum_file(p, Some(10), &NoProgress).unwrap_err();
            assert!(matches!(e, Error::NotAFile { .. }), "{e}");
        }
    }
}
