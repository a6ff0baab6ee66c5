//! Refusing what is not a regular file, by its type, before and after opening it.

use crate::error::{Error, Result};
use nix::fcntl::{fcntl, FcntlArg, OFlag};
use std::fs::{File, Metadata, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::Arc;

/// What a file that is not a regular file is, in the words of [`Error::NotAFile`]'s `what`
/// ("a directory", "a block device", "a character device", "a FIFO", "a socket"); `None` for a
/// regular file. The topology readers' classification, shared so there is one.
pub use gdpath_topo::input::special_kind;

/// Checks what `path` is (`stat`, following symbolic links) without opening it: `Ok(None)` when
/// nothing is there (a dangling symbolic link included), `Ok(Some(metadata))` for a regular
/// file.
///
/// Errors: [`Error::NotAFile`] for a directory, device, FIFO or socket; [`Error::Open`] when
/// `stat` itself fails other than with "not found" (permission, a loop of links, a path
/// component that is not a directory).
pub fn check_regular(path: &Path) -> Result<Option<Metadata>> {
    match std::fs::metadata(path) {
        Ok(md) => match special_kind(&md) {
            None => Ok(Some(md)),
            Some(what) => Err(Error::NotAFile {
                path: path.to_owned(),
                what,
            }),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::Open {
            path: path.to_owned(),
            source: Arc::new(e),
        }),
    }
}

/// Opens `path` with `options` and the extra `open(2)` flags `flags` (such as `O_DIRECT`),
/// refusing anything but a regular file: [`check_regular`] first, so a device or FIFO is never
/// opened, then the open with `O_NONBLOCK | O_NOCTTY` (a FIFO or device swapped in between
/// neither blocks the open nor becomes a controlling terminal) and `fstat` of the descriptor.
/// `O_NONBLOCK` is cleared again before the file is returned (io_uring would otherwise fail
/// reads that must wait with `EAGAIN`).
///
/// Errors: [`Error::NotAFile`]; [`Error::Open`] for a failed open (its source carries the OS
/// error, e.g. `EINVAL` where a file system refuses `O_DIRECT`) or `fcntl`.
pub fn open_regular(path: &Path, mut options: OpenOptions, flags: i32) -> Result<File> {
    let open_err = |e: std::io::Error| Error::Open {
        path: path.to_owned(),
        source: Arc::new(e),
    };
    check_regular(path)?;
    options.custom_flags(flags | libc::O_NONBLOCK | libc::O_NOCTTY);
    let f = options.open(path).map_err(open_err)?;
    let md = f.metadata().map_err(open_err)?;
    if let Some(what) = special_kind(&md) {
        return Err(Error::NotAFile {
            path: path.to_owned(),
            what,
        });
    }
    let fl = fcntl(f.as_raw_fd(), FcntlArg::F_GETFL).map_err(|e| open_err(e.into()))?;
    let fl = OFlag::from_bits_truncate(fl) & !OFlag::O_NONBLOCK;
    fcntl(f.as_raw_fd(), FcntlArg::F_SETFL(fl)).map_err(|e| open_err(e.into()))?;
    Ok(f)
}

/// Reads the whole regular file at `path`, at most `max` bytes: for small inputs (a JSON file of
/// driver facts) that must neither block (a FIFO) nor grow without bound (`/dev/zero`, a huge
/// file).
///
/// Errors: [`Error::NotAFile`], [`Error::Open`]; [`Error::Io`] (op `read`); [`Error::Config`]
/// when the file holds more than `max` bytes (naming both).
pub fn read_bounded(path: &Path, max: u64) -> Result<Vec<u8>> {
    use std::io::Read;
    let mut o = OpenOptions::new();
    o.read(true);
    let f = open_regular(path, o, 0)?;
    let mut data = Vec::new();
    f.take(max.saturating_add(1))
        .read_to_end(&mut data)
        .map_err(|e| Error::io("read", path, 0, e))?;
    if data.len() as u64 > max {
        return Err(Error::Config(format!(
            "{} holds more than {max} bytes, the most read from it",
            gdpath_topo::text::escape(path)
        )));
    }
    Ok(data)
}

/// Whether an I/O error says the file system is full: `ENOSPC`, or `EDQUOT` (the user's or
/// group's quota is).
pub fn is_no_space(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_fifos_sockets_and_directories_are_refused_by_type() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
        let sock = dir.path().join("sock");
        let _listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        for (p, what) in [
            (Path::new("/dev/null"), "a character device"),
            (fifo.as_path(), "a FIFO"),
            (sock.as_path(), "a socket"),
            (dir.path(), "a directory"),
        ] {
            match check_regular(p) {
                Err(Error::NotAFile { what: w, .. }) => assert_eq!(w, what, "{}", p.display()),
                other => panic!("{}: {other:?}", p.display()),
            }
            let mut o = OpenOptions::new();
            o.read(true);
            // The FIFO has no writer: a plain open for reading would block here for ever.
            assert!(matches!(open_regular(p, o, 0), Err(Error::NotAFile { .. })));
        }
        assert!(check_regular(&dir.path().join("missing"))
            .unwrap()
            .is_none());
        let f = dir.path().join("f");
        std::fs::write(&f, b"x").unwrap();
        assert!(check_regular(&f).unwrap().is_some());
        let mut o = OpenOptions::new();
        o.read(true);
        let file = open_regular(&f, o, 0).unwrap();
        let fl = fcntl(file.as_raw_fd(), FcntlArg::F_GETFL).unwrap();
        assert_eq!(fl & libc::O_NONBLOCK, 0, "O_NONBLOCK is cleared");
        assert_eq!(read_bounded(&f, 1).unwrap(), b"x");
        assert!(matches!(read_bounded(&f, 0), Err(Error::Config(_))));
        assert!(matches!(
            read_bounded(&fifo, 10),
            Err(Error::NotAFile { .. })
        ));
    }
}
