//! Blocking positional file I/O shared by the storage backends: full-length pread/pwrite loops
//! with typed errors.

use crate::error::{Error, Result};
use crate::region::FileRegion;
use std::os::fd::RawFd;

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
    let mut done = 0u64;
    while done < len {
        let want = (len - done).min(1 << 30) as usize;
        // SAFETY: the caller guarantees mem..mem+len is writable; done < len.
        let n = unsafe {
            libc::pread(
                fd,
                mem.add(done as usize).cast(),
                want,
                (offset + done) as libc::off_t,
            )
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(Error::io("read", file.path(), offset + done, e));
        }
        if n == 0 {
            return Err(Error::ShortFile {
                path: file.path().to_owned(),
                offset,
                wanted: len,
                available: done,
            });
        }
        done += n as u64;
    }
    Ok(done)
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
    let mut done = 0u64;
    while done < len {
        let want = (len - done).min(1 << 30) as usize;
        // SAFETY: the caller guarantees mem..mem+len is readable; done < len.
        let n = unsafe {
            libc::pwrite(
                fd,
                mem.add(done as usize).cast(),
                want,
                (offset + done) as libc::off_t,
            )
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(Error::io("write", file.path(), offset + done, e));
        }
        if n == 0 {
            return Err(Error::io(
                "write",
                file.path(),
                offset + done,
                std::io::Error::from(std::io::ErrorKind::WriteZero),
            ));
        }
        done += n as u64;
    }
    Ok(done)
}
