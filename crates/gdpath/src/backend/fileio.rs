//! Blocking positional file I/O shared by the storage backends: pread/pwrite loops that retry
//! `EINTR` and short transfers, as plain `io::Result` primitives on slices and as full-length
//! versions on registered memory with typed errors.

use crate::error::{Error, Result};
use crate::region::FileRegion;
use std::io;
use std::os::fd::RawFd;

/// Largest single `pread`/`pwrite` issued (Linux moves at most 0x7ffff000 bytes per call).
const MAX_IO: usize = 1 << 30;

/// Reads `buf` from `off` of `fd` until at least `need` bytes (at most `buf.len()`) arrived or
/// the file ends; returns the bytes read. On an error, also the bytes read before it.
pub(crate) fn pread_at_least(
    fd: RawFd,
    buf: &mut [u8],
    off: u64,
    need: usize,
) -> std::result::Result<usize, (usize, io::Error)> {
    let mut got = 0;
    while got < need.min(buf.len()) {
        let want = (buf.len() - got).min(MAX_IO);
        // SAFETY: buf[got..got + want] is valid for writes.
        let r = unsafe {
            libc::pread(
                fd,
                buf[got..].as_mut_ptr().cast(),
                want,
                (off + got as u64) as libc::off_t,
            )
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err((got, e));
        }
        if r == 0 {
            break;
        }
        got += r as usize;
    }
    Ok(got)
}

/// Writes all of `buf` at `off` of `fd`. A call that writes nothing is `WriteZero`. On an
/// error, also the bytes written before it.
pub(crate) fn pwrite_all(
    fd: RawFd,
    buf: &[u8],
    off: u64,
) -> std::result::Result<(), (usize, io::Error)> {
    let mut done = 0;
    while done < buf.len() {
        let want = (buf.len() - done).min(MAX_IO);
        // SAFETY: buf[done..done + want] is valid for reads.
        let r = unsafe {
            libc::pwrite(
                fd,
                buf[done..].as_ptr().cast(),
                want,
                (off + done as u64) as libc::off_t,
            )
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err((done, e));
        }
        if r == 0 {
            return Err((done, io::Error::from(io::ErrorKind::WriteZero)));
        }
        done += r as usize;
    }
    Ok(())
}

/// Reads exactly `len` bytes at `offset` of `fd` into `mem`. EOF first is
/// [`Error::ShortFile`] with the bytes that were there.
///
/// # Safety
/// `mem` must be valid for writes of `len` bytes, and nothing else may access it meanwhile.
pub(crate) unsafe fn pread_full(
    file: &FileRegion,
    fd: RawFd,
    mem: *mut u8,
    len: u64,
    offset: u64,
) -> Result<u64> {
    // SAFETY: the caller guarantees mem..mem+len is writable and not aliased.
    let buf = unsafe { std::slice::from_raw_parts_mut(mem, len as usize) };
    match pread_at_least(fd, buf, offset, buf.len()) {
        Ok(got) if got as u64 == len => Ok(len),
        Ok(got) => Err(Error::ShortFile {
            path: file.path().to_owned(),
            offset,
            wanted: len,
            available: got as u64,
        }),
        Err((got, e)) => Err(Error::io("read", file.path(), offset + got as u64, e)),
    }
}

/// Writes exactly `len` bytes from `mem` at `offset` of `fd`.
///
/// # Safety
/// `mem` must be valid for reads of `len` bytes.
pub(crate) unsafe fn pwrite_full(
    file: &FileRegion,
    fd: RawFd,
    mem: *const u8,
    len: u64,
    offset: u64,
) -> Result<u64> {
    // SAFETY: the caller guarantees mem..mem+len is readable.
    let buf = unsafe { std::slice::from_raw_parts(mem, len as usize) };
    pwrite_all(fd, buf, offset)
        .map(|()| len)
        .map_err(|(done, e)| Error::io("write", file.path(), offset + done as u64, e))
}
