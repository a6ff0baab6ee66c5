//! Blocking positional file I/O shared by the storage backends: pread/pwrite loops that retry
//! `EINTR` and short transfers, as plain `io::Result` primitives on slices and as full-length
//! versions on registered memory with typed errors (one call for either direction).

use crate::error::{Error, Result};
use crate::os::mem::HostMem;
use crate::region::FileRegion;
use crate::transfer::Op;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

/// Largest single `pread`/`pwrite` issued (Linux moves at most 0x7ffff000 bytes per call).
const MAX_IO: usize = 1 << 30;

/// Reads `buf` from `off` of `f` until at least `need` bytes (at most `buf.len()`) arrived or
/// the file ends; returns the bytes read. On an error, also the bytes read before it.
pub(crate) fn pread_at_least(
    f: &File,
    buf: &mut [u8],
    off: u64,
    need: usize,
) -> std::result::Result<usize, (usize, io::Error)> {
    let mut got = 0;
    while got < need.min(buf.len()) {
        let want = (buf.len() - got).min(MAX_IO);
        match f.read_at(&mut buf[got..got + want], off + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err((got, e)),
        }
    }
    Ok(got)
}

/// Writes all of `buf` at `off` of `f`. A call that writes nothing is `WriteZero`. On an
/// error, also the bytes written before it.
pub(crate) fn pwrite_all(
    f: &File,
    buf: &[u8],
    off: u64,
) -> std::result::Result<(), (usize, io::Error)> {
    let mut done = 0;
    while done < buf.len() {
        let want = (buf.len() - done).min(MAX_IO);
        match f.write_at(&buf[done..done + want], off + done as u64) {
            Ok(0) => return Err((done, io::Error::from(io::ErrorKind::WriteZero))),
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err((done, e)),
        }
    }
    Ok(())
}

/// Moves exactly `len` bytes between file `offset` of `file`, through its buffered (page-cache)
/// descriptor, and bytes `[mem_off, mem_off + len)` of `mem`: [`Op::Read`] reads the file into
/// `mem`, [`Op::Write`] writes `mem` to the file. Returns `len`. Errors: [`Error::ShortFile`]
/// when a read reaches the end of the file, else [`Error::Io`] naming the failed offset; a range
/// outside `mem` is [`Error::Backend`] of `backend`.
pub(crate) fn buffered_full(
    backend: &'static str,
    op: Op,
    file: &FileRegion,
    mem: &HostMem,
    mem_off: usize,
    len: u64,
    offset: u64,
) -> Result<u64> {
    let f = file.buffered_file();
    let range_err = |e| super::range_err(backend, e);
    match op {
        Op::Read => {
            let r = mem
                .with_mut_slice(mem_off, len as usize, |buf| {
                    pread_at_least(f, buf, offset, buf.len())
                })
                .map_err(range_err)?;
            match r {
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
        Op::Write => mem
            .with_slice(mem_off, len as usize, |buf| pwrite_all(f, buf, offset))
            .map_err(range_err)?
            .map(|()| len)
            .map_err(|(done, e)| Error::io("write", file.path(), offset + done as u64, e)),
    }
}
