//! Host memory that another process of this node can map: gdpath's own allocation backed by a
//! sealed memfd ([`SharedBuf`], exported as pid, fd number, device and inode), and the
//! importer's mapping of it ([`map_peer`]) through `/proc/PID/fd/N`.
//!
//! The importer's open of `/proc/PID/fd/N` is allowed by the kernel only where it may read the
//! exporter's memory anyway (the ptrace read-access check: the same user, or privileges), the
//! same rule UCX's shared-memory transport relies on. What the peer sent is checked before
//! anything is mapped: the opened file must be the memfd the exporter named (device and inode,
//! so a reused pid or fd number is refused), sealed against shrinking (a file cut short under a
//! mapping would make every access past its new end a `SIGBUS`), and long enough for the range.
//! The mapping keeps the pages alive, so an exporter that frees its buffer (or exits) leaves the
//! importer's mapping valid: nothing is written to freed memory.

use super::mem::{HostMem, HostPointer};
use rustix::fs::{self as rfs, MemfdFlags, Mode, OFlags, SealFlags};
use std::os::fd::{AsRawFd, OwnedFd};
use std::ptr::NonNull;

/// What names a [`SharedBuf`] to another process: its pid, the memfd's descriptor number there,
/// and the file's device and inode numbers (checked by the importer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShmId {
    pub pid: u32,
    pub fd: u32,
    pub dev: u64,
    pub ino: u64,
}

/// A sealed memfd of a fixed length, mapped shared: the memory of a shared
/// [`crate::HostBuffer`]. Zero-filled (a new file's pages read as zeros).
pub(crate) struct SharedBuf {
    fd: OwnedFd,
    id: ShmId,
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: SharedBuf uniquely owns its mapping, like Box<[u8]>.
unsafe impl Send for SharedBuf {}
// SAFETY: shared access only hands out the address; writes go through HostMem's raw copies.
unsafe impl Sync for SharedBuf {}

impl SharedBuf {
    /// `len` (> 0) zeroed bytes in a new memfd named `gdpath-shared`, sealed against growing and
    /// shrinking, mapped read-write and shared.
    ///
    /// Errors: the system's (`memfd_create`, `ftruncate`, `fcntl`, `mmap`), e.g. `ENOMEM`.
    pub(crate) fn new(len: usize) -> std::io::Result<SharedBuf> {
        if len == 0 {
            return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
        }
        let fd = rfs::memfd_create(
            c"gdpath-shared",
            MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
        )?;
        rfs::ftruncate(&fd, len as u64)?;
        rfs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)?;
        let st = rfs::fstat(&fd)?;
        let ptr = map(&fd, 0, len)?;
        Ok(SharedBuf {
            id: ShmId {
                pid: std::process::id(),
                fd: fd.as_raw_fd() as u32,
                dev: st.st_dev,
                ino: st.st_ino,
            },
            fd,
            ptr,
            len,
        })
    }

    /// How another process names this memory.
    pub(crate) fn id(&self) -> ShmId {
        debug_assert_eq!(self.id.fd, self.fd.as_raw_fd() as u32);
        self.id
    }

    pub(crate) fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

impl Drop for SharedBuf {
    fn drop(&mut self) {
        // SAFETY: the mapping `new` made, of `len` bytes, unmapped once by its owner.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// `len` bytes of `fd` from `off` (page aligned), mapped read-write and shared.
fn map(fd: &OwnedFd, off: u64, len: usize) -> std::io::Result<NonNull<u8>> {
    let off =
        libc::off_t::try_from(off).map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: a new shared mapping at an address the kernel picks; the caller owns it and
    // unmaps it once.
    let raw = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            off,
        )
    };
    if raw == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    NonNull::new(raw.cast()).ok_or_else(|| std::io::Error::from_raw_os_error(libc::EFAULT))
}

/// An importer's mapping of a peer's shared buffer, unmapped when the last [`HostMem`] made
/// from it goes.
struct PeerMapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is owned by this value; bytes are reached through HostMem's raw copies.
unsafe impl Send for PeerMapping {}
// SAFETY: as above.
unsafe impl Sync for PeerMapping {}

impl Drop for PeerMapping {
    fn drop(&mut self) {
        // SAFETY: made by `map` in `map_peer` with this length, unmapped once.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// Maps `len` bytes from `offset` of the shared buffer `id` names, as host memory of this
/// process that writes land in the exporter's pages.
///
/// Errors (as text, for the backend's refusal): the descriptor cannot be opened (another
/// user's process, a pid that is gone), the file is not the one named (device or inode
/// differ), not sealed against shrinking, shorter than `offset + len`, or the mapping fails.
pub(crate) fn map_peer(id: ShmId, offset: u64, len: u64) -> Result<HostMem, String> {
    let path = format!("/proc/{}/fd/{}", id.pid, id.fd);
    let fd = rfs::open(&path, OFlags::RDWR | OFlags::CLOEXEC, Mode::empty())
        .map_err(|e| format!("cannot open {path}: {e}"))?;
    let st = rfs::fstat(&fd).map_err(|e| format!("fstat of {path}: {e}"))?;
    if (st.st_dev, st.st_ino) != (id.dev, id.ino) {
        return Err(format!(
            "{path} is not the shared buffer the peer named (device {} inode {}, expected {} {})",
            st.st_dev, st.st_ino, id.dev, id.ino
        ));
    }
    let seals = rfs::fcntl_get_seals(&fd).map_err(|e| format!("seals of {path}: {e}"))?;
    if !seals.contains(SealFlags::SHRINK) {
        return Err(format!("{path} is not sealed against shrinking"));
    }
    let end = offset
        .checked_add(len)
        .filter(|&e| e <= st.st_size as u64)
        .ok_or_else(|| {
            format!(
                "{path} holds {} bytes, the range ends at {offset}+{len}",
                st.st_size
            )
        })?;
    let page = super::file::page_size() as u64;
    let start = offset / page * page;
    let map_len = usize::try_from(end - start).map_err(|_| "range too long".to_owned())?;
    if map_len == 0 {
        return Err("an empty range".into());
    }
    let ptr = map(&fd, start, map_len).map_err(|e| format!("mmap of {path}: {e}"))?;
    let mapping = PeerMapping { ptr, len: map_len };
    // SAFETY: `[ptr + (offset - start), + len)` lies inside the mapping just made, readable and
    // writable, and the mapping lives as long as the HostMem (it is the keep object, dropped
    // with the last handle). Other processes write the same pages: that is the point, and the
    // exporter's own transfers on them follow the same rule as any concurrent DMA (the bytes
    // of overlapping transfers are unspecified).
    let mem = unsafe {
        HostPointer::new(
            ptr.as_ptr().add((offset - start) as usize),
            len as usize,
            true,
        )
    };
    Ok(HostMem::borrowed(mem, Some(Box::new(mapping))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shared_buffer_maps_again_through_proc() {
        let b = SharedBuf::new(3 * 4096 + 100).unwrap();
        // SAFETY: the buffer's own mapping, written once before anything else reads it.
        unsafe { std::ptr::write_bytes(b.as_ptr().add(4096 + 7), 0xab, 10) };
        let m = map_peer(b.id(), 4096 + 7, 10).unwrap();
        let mut out = [0u8; 10];
        m.copy_out(0, &mut out).unwrap();
        assert_eq!(out, [0xab; 10]);
        m.copy_in(0, &[1, 2, 3]).unwrap();
        // SAFETY: the same pages, through the exporter's mapping.
        let back = unsafe { std::slice::from_raw_parts(b.as_ptr().add(4096 + 7), 3) };
        assert_eq!(back, [1, 2, 3]);
    }

    #[test]
    fn wrong_inode_short_file_and_unsealed_files_are_refused() {
        let b = SharedBuf::new(8192).unwrap();
        let id = b.id();
        let e = map_peer(
            ShmId {
                ino: id.ino + 1,
                ..id
            },
            0,
            10,
        )
        .unwrap_err();
        assert!(e.contains("not the shared buffer"), "{e}");
        let e = map_peer(id, 8000, 200).unwrap_err();
        assert!(e.contains("holds 8192 bytes"), "{e}");
        let e = map_peer(
            ShmId {
                pid: u32::MAX,
                ..id
            },
            0,
            10,
        )
        .unwrap_err();
        assert!(e.contains("cannot open"), "{e}");
        // A memfd without seals: a peer could shrink it under the mapping.
        let raw = rfs::memfd_create(c"unsealed", MemfdFlags::CLOEXEC).unwrap();
        rfs::ftruncate(&raw, 8192).unwrap();
        let st = rfs::fstat(&raw).unwrap();
        let unsealed = ShmId {
            pid: std::process::id(),
            fd: raw.as_raw_fd() as u32,
            dev: st.st_dev,
            ino: st.st_ino,
        };
        let e = map_peer(unsealed, 0, 10).unwrap_err();
        assert!(e.contains("not sealed"), "{e}");
    }

    #[test]
    fn a_mapping_outlives_the_exporters_buffer() {
        let b = SharedBuf::new(4096).unwrap();
        let m = map_peer(b.id(), 0, 4096).unwrap();
        drop(b);
        m.copy_in(4000, &[9; 96]).unwrap();
        let mut out = [0u8; 96];
        m.copy_out(4000, &mut out).unwrap();
        assert_eq!(out, [9; 96]);
    }
}
