//! Why a file could not be written or read, in the words the engine reports it with.

use gdpath_text::escape;
use std::path::PathBuf;
use std::sync::Arc;

/// An error of this crate. Each variant is the engine's `gdpath::Error` variant of the same
/// name and fields, whose text is this one's, and converts into it (`gdpath::Error:
/// From<Error>`, kind included), so that a failure reads the same wherever it is reported. Not
/// `#[non_exhaustive]`: that conversion names every variant, so that a new one needs its own.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// An I/O call failed. `op` is the call (`read`, `write`, `fsync`, `rename`, ...).
    #[error("{op} {} at offset {offset}: {source}", escape(.path))]
    Io {
        /// The system call that failed (`read`, `write`, `fstat`, ...).
        op: &'static str,
        /// The file it was made on.
        path: PathBuf,
        /// Where in the file the call was made (bytes; 0 where the call takes none).
        offset: u64,
        /// The OS error, shared so that the error stays `Clone`.
        #[source]
        source: Arc<std::io::Error>,
    },
    /// The file could not be opened (or examined: `stat`, `openat(O_PATH)`).
    #[error("cannot open {}: {source}", escape(.path))]
    Open {
        /// The file that could not be opened.
        path: PathBuf,
        /// The OS error (`ENOENT`, `EACCES`, ...).
        #[source]
        source: Arc<std::io::Error>,
    },
    /// No file could be created in the directory (a file written whole is made there first):
    /// permission, a read-only file system, a missing directory.
    #[error("cannot create a file in {}: {source}", escape(.dir))]
    CreateIn {
        /// The directory no file could be created in.
        dir: PathBuf,
        /// The OS error (`EACCES`, `EROFS`, `ENOENT`, ...).
        #[source]
        source: Arc<std::io::Error>,
    },
    /// The path names something that is not a regular file (`what`: "a directory", ...).
    #[error("{} is {what}, not a regular file", escape(.path))]
    NotAFile {
        /// The path named.
        path: PathBuf,
        /// What it is instead ("a directory", "a socket", ...).
        what: &'static str,
    },
    /// A write was asked to follow a symbolic link that the kernel's `fs.protected_symlinks`
    /// rule (Documentation/admin-guide/sysctl/fs.rst) forbids following, whatever the sysctl
    /// says: `link` sits in the sticky (`S_ISVTX`), world-writable directory `dir` and its
    /// owner, uid `owner`, is neither the writer (its effective uid) nor the directory's
    /// owner — a link anyone could have planted there to make this process write another
    /// user's file. Nothing was written.
    #[error(
        "{}: a symbolic link owned by uid {owner} in the sticky world-writable directory \
         {}, neither the writer's nor the directory owner's; the kernel's protected_symlinks \
         rule does not follow it: remove the link or write elsewhere",
        escape(.link),
        escape(.dir)
    )]
    SymlinkRefused {
        /// The symbolic link not followed.
        link: PathBuf,
        /// The link's owner (a uid).
        owner: u32,
        /// The sticky, world-writable directory holding the link.
        dir: PathBuf,
    },
    /// A write with `overwrite` would replace (or write into) `path`, a regular file owned by
    /// uid `owner` in the sticky directory `dir`, which is world- or group-writable, and the
    /// owner is neither the writer (its effective uid) nor the directory's owner: the kernel's
    /// `fs.protected_regular=2` rule for `O_CREAT` opens (Documentation/admin-guide/sysctl/fs.rst),
    /// applied whatever the sysctl says. Such a file is anyone's plant: a replacement keeps
    /// the replaced file's owner and mode, so its planter would own what is written. Nothing
    /// was written.
    #[error(
        "{}: a file owned by uid {owner} in the sticky, world- or group-writable directory {}, \
         neither the writer's nor the directory owner's; the kernel's protected_regular rule \
         does not let another user write it (its owner would own what is written): remove it \
         or write elsewhere",
        escape(.path),
        escape(.dir)
    )]
    ForeignFileRefused {
        /// The file not written.
        path: PathBuf,
        /// The file's owner (a uid).
        owner: u32,
        /// The sticky, world- or group-writable directory holding the file.
        dir: PathBuf,
    },
    /// The path written goes through `link`, a magic link of `/proc` (`/proc/PID/fd/N`,
    /// `/proc/PID/cwd`, `/proc/PID/root`, ...: `/dev/stdout` is one, through
    /// `/proc/self/fd/1`): it leads to an open descriptor or a process's directory, not to a
    /// name, and a file written whole by a rename cannot go into a descriptor. Refused (the
    /// kernel's `RESOLVE_NO_MAGICLINKS`); nothing was written.
    #[error(
        "{}: the path goes through {}, a magic link of /proc (to an open descriptor or a \
         process's directory); gdpath replaces files whole and cannot write into a \
         descriptor: write to a file",
        escape(.path),
        escape(.link)
    )]
    MagicLinkRefused {
        /// The path asked to be written.
        path: PathBuf,
        /// The `/proc` magic link on the way to it.
        link: PathBuf,
    },
    /// The file system holding `path` is full (`ENOSPC`, or `EDQUOT`: a quota is): `needed`
    /// bytes were to be written (when known in advance), `written` bytes were when it filled
    /// up. Written through [`crate::AtomicFile`], `path` is the target, which is as it was.
    #[error("no space left for {}: {}", escape(.path), no_space_detail(*needed, *written))]
    NoSpace {
        /// The file being written (the target, for a file written whole).
        path: PathBuf,
        /// Bytes the write was to put there, when known in advance.
        needed: Option<u64>,
        /// Bytes written when the file system filled up.
        written: u64,
        /// The OS error (`ENOSPC` or `EDQUOT`).
        #[source]
        source: Arc<std::io::Error>,
    },
    /// The file exists and replacing it was not asked for
    /// ([`crate::ReplaceOptions::overwrite`], the commands' `--overwrite`).
    /// The message names no option: the CLI adds "--overwrite", Python `overwrite=True`.
    #[error("{} exists", escape(.path))]
    Exists {
        /// The existing file.
        path: PathBuf,
    },
    /// An invalid value: a file holding more than a bounded read takes, a reservation larger
    /// than a file can hold.
    #[error("invalid configuration: {0}")]
    Config(String),
}

fn no_space_detail(needed: Option<u64>, written: u64) -> String {
    use gdpath_text::format_size;
    match needed {
        Some(n) => format!(
            "{n} bytes ({}) needed, {written} bytes written",
            format_size(n)
        ),
        None => format!("{written} bytes ({}) written", format_size(written)),
    }
}

impl Error {
    /// An [`Error::Io`] from an OS error.
    pub fn io(op: &'static str, path: &std::path::Path, offset: u64, e: std::io::Error) -> Self {
        Error::Io {
            op,
            path: path.to_owned(),
            offset,
            source: Arc::new(e),
        }
    }
}

/// A caller's error type that can carry this crate's [`Error`] (the engine's `gdpath::Error`
/// does), so that [`crate::AtomicFile::explain`] rewrites an error that names its temporary
/// whichever type it comes in.
pub trait FileError: From<Error> + Sized {
    /// This error as this crate's [`Error`] when it is one of its variants; `Err(self)`, as it
    /// was, when it is another.
    fn into_file_error(self) -> std::result::Result<Error, Self>;
}

impl FileError for Error {
    fn into_file_error(self) -> std::result::Result<Error, Self> {
        Ok(self)
    }
}

/// This crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    /// The file errors' paths, a hostile link name among them, reach a terminal escaped.
    #[test]
    fn file_errors_escape_the_paths_they_name() {
        let hostile = PathBuf::from("S/ev\x1b[31mRED\nfake: ok\r");
        for e in [
            Error::SymlinkRefused {
                link: hostile.clone(),
                owner: 65534,
                dir: hostile.clone(),
            },
            Error::ForeignFileRefused {
                path: hostile.clone(),
                owner: 65534,
                dir: hostile.clone(),
            },
            Error::MagicLinkRefused {
                path: hostile.clone(),
                link: hostile.clone(),
            },
        ] {
            let msg = e.to_string();
            assert!(!msg.contains(['\x1b', '\n', '\r']), "{msg:?}");
            assert_eq!(
                msg.matches("S/ev\\u{1b}[31mRED\\nfake: ok\\r").count(),
                2,
                "{msg}"
            );
        }
    }
}
