//! Writing the report (or the drawing) to its file so that no reader ever sees half of it.
//!
//! `-o FILE` replaces an existing report, as `-o` does for compilers and downloaders: a report
//! is output, regenerated at will, and asking for `--overwrite` each time would only teach
//! people to type it. What makes that safe is how it is replaced: the document is written to
//! a temporary file in the same directory, flushed to disk, given the old file's permissions
//! (a new file gets `rw-r--r--`), and renamed over the target, which is atomic on a POSIX file
//! system; the directory is then synced so the rename survives a crash. A reader, or a crash at
//! any moment, sees the old file or the new one, never a torn one, and a failed run leaves the
//! old report as it was. A target that is a directory or another kind of non-regular file is
//! refused; a symbolic link is followed, and the file it points to is replaced.

use std::io::Write as _;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// Why the file could not be written.
#[derive(Debug, thiserror::Error)]
pub enum SaveError {
    #[error("{}: not a regular file ({what}): refusing to replace it", path.display())]
    NotAFile { path: PathBuf, what: &'static str },
    #[error("cannot {op} {}: {source}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

fn io<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> SaveError + 'a {
    move |source| SaveError::Io {
        op,
        path: path.to_owned(),
        source,
    }
}

/// Writes `bytes` to `path` crash-safely (see the module docs). Errors: [`SaveError`].
pub fn save(path: &Path, bytes: &[u8]) -> Result<(), SaveError> {
    let mut target = path.to_owned();
    let mut mode = 0o644;
    match std::fs::symlink_metadata(&target) {
        Ok(md) if md.file_type().is_symlink() => {
            target = std::fs::canonicalize(&target).map_err(io("follow the link", path))?;
            let md = std::fs::metadata(&target).map_err(io("read", &target))?;
            if !md.is_file() {
                return Err(SaveError::NotAFile {
                    path: target,
                    what: "the link points to something else",
                });
            }
            mode = md.permissions().mode() & 0o7777;
        }
        Ok(md) if md.is_dir() => {
            return Err(SaveError::NotAFile {
                path: target,
                what: "a directory",
            })
        }
        Ok(md) if !md.is_file() => {
            return Err(SaveError::NotAFile {
                path: target,
                what: "a device, socket or pipe",
            })
        }
        Ok(md) => mode = md.permissions().mode() & 0o7777,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io("read", path)(e)),
    }
    let dir = match target.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
        _ => PathBuf::from("."),
    };
    let name = target
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut tmp = tempfile::Builder::new()
        .prefix(&format!(".{name}."))
        .suffix(".tmp")
        .tempfile_in(&dir)
        .map_err(io("create a temporary file in", &dir))?;
    tmp.write_all(bytes).map_err(io("write", tmp.path()))?;
    tmp.as_file()
        .set_permissions(std::fs::Permissions::from_mode(mode))
        .map_err(io("set the permissions of", tmp.path()))?;
    tmp.as_file().sync_all().map_err(io("flush", tmp.path()))?;
    tmp.persist(&target)
        .map_err(|e| io("rename the temporary file to", &target)(e.error))?;
    // The rename is durable once the directory is: best effort (some file systems refuse
    // fsync on a directory; the file itself is complete either way).
    if let Ok(d) = std::fs::File::open(&dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_atomically_and_keeps_permissions() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("r.html");
        save(&f, b"one").unwrap();
        assert_eq!(std::fs::read(&f).unwrap(), b"one");
        assert_eq!(
            std::fs::metadata(&f).unwrap().permissions().mode() & 0o777,
            0o644
        );
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        save(&f, b"two").unwrap();
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
        save(&l, b"three").unwrap();
        assert!(std::fs::symlink_metadata(&l)
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(std::fs::read(&f).unwrap(), b"three");
        // A directory is refused.
        let e = save(d.path(), b"x").unwrap_err();
        assert!(matches!(e, SaveError::NotAFile { .. }), "{e}");
        // A directory that does not exist: the error names it.
        let e = save(&d.path().join("no/such/r.html"), b"x").unwrap_err();
        assert!(e.to_string().contains("no/such"), "{e}");
    }
}
