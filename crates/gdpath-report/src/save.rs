//! Writing the report (or the drawing) to its file so that no reader ever sees half of it.
//!
//! `-o FILE` replaces an existing file only when asked (`--overwrite`), as every other command
//! of gdpath that writes a file does: `-o notes.txt` typed by mistake must not turn someone's
//! notes into HTML. The file is written through the engine's [`gdpath::file::AtomicFile`] (a
//! temporary in the same directory, synced, given the target's name, the directory synced; a
//! replaced file keeps its owner where the writer may set it, its group and permissions, a link
//! is followed unless the kernel's `protected_symlinks` rule forbids it, a directory or other
//! non-regular target is refused), so a reader, or a crash at any moment, sees the old file or
//! the new one, never a torn one, and a failed run leaves the old report as it was.

use gdpath::file::{AtomicFile, ReplaceOptions, Target};
use std::io::Write as _;
use std::path::Path;

/// Writes `bytes` to `path` crash-safely (see the module docs), replacing an existing file
/// only when `overwrite`, and returns the file written (the real one when `path` is a
/// symbolic link). Errors: the engine's ([`gdpath::Error::Exists`] for an existing file
/// without `overwrite`, [`gdpath::Error::NotAFile`] for a directory or device,
/// [`gdpath::Error::SymlinkRefused`] for a link another user planted in a sticky directory,
/// [`gdpath::Error::NoSpace`], [`gdpath::Error::Io`] naming the file).
pub fn save(path: &Path, bytes: &[u8], overwrite: bool) -> gdpath::Result<Target> {
    let mut f = AtomicFile::create(path, ReplaceOptions::default().overwrite(overwrite))?;
    f.write_all(bytes).map_err(|e| f.write_error(e))?;
    let written = f.as_target();
    f.commit()?;
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn replaces_only_when_asked_atomically_and_keeps_permissions() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("r.html");
        let t = save(&f, b"one", false).unwrap();
        assert!(!t.through_link && !t.exists && t.path == f, "{t:?}");
        assert_eq!(std::fs::read(&f).unwrap(), b"one");
        assert_eq!(
            std::fs::metadata(&f).unwrap().permissions().mode() & 0o777,
            0o644
        );
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        let e = save(&f, b"two", false).unwrap_err();
        assert!(matches!(e, gdpath::Error::Exists { .. }), "{e}");
        assert_eq!(
            std::fs::read(&f).unwrap(),
            b"one",
            "not replaced without overwrite"
        );
        save(&f, b"two", true).unwrap();
        assert_eq!(std::fs::read(&f).unwrap(), b"two");
        assert_eq!(
            std::fs::metadata(&f).unwrap().permissions().mode() & 0o777,
            0o600
        );
        // Only the file: no temporary left behind.
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 1);
        // Through a link, the target is replaced and the link stays.
        let l = d.path().join("link.html");
        std::os::unix::fs::symlink(&f, &l).unwrap();
        let t = save(&l, b"three", true).unwrap();
        assert!(
            t.through_link && t.path == f.canonicalize().unwrap(),
            "{t:?}"
        );
        assert!(std::fs::symlink_metadata(&l)
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(std::fs::read(&f).unwrap(), b"three");
        // A directory is refused.
        let e = save(d.path(), b"x", true).unwrap_err();
        assert!(matches!(e, gdpath::Error::NotAFile { .. }), "{e}");
        // A directory that does not exist: the error names it.
        let e = save(&d.path().join("no/such/r.html"), b"x", false).unwrap_err();
        assert!(e.to_string().contains("no/such"), "{e}");
    }
}
