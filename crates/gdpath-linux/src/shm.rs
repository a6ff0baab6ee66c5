//! Host memory that another process of this node can map: gdpath's own allocation backed by a
//! sealed memfd ([`SharedBuf`], exported as pid, fd number, device, inode and a random name),
//! and the importer's mapping of it ([`map_peer`]) through `/proc/PID/fd/N`.
//!
//! What the peer sent is untrusted, so the importer checks before it writes anything: the
//! descriptor's link must read `/memfd:gdpath-shared-<name>` with the random name the exporter
//! sent (so a peer cannot point it at another process's memory or file: it would have to know
//! that buffer's name; the kernel lets the importer read the link only where it may read the
//! process's memory anyway, the ptrace read-access check), the file is opened `O_PATH` first
//! (no side effect of opening, no wait) and must be a regular file of tmpfs (shmem) with the
//! device and inode named (a reused pid or descriptor number is refused) before it is reopened
//! read-write; it must be sealed against shrinking (a file cut short under a mapping would make
//! every access past its new end a `SIGBUS`), hold the range, and have its pages allocated (the
//! exporter allocates them, so an importer that page-locks the mapping allocates nothing). The
//! mapping keeps the pages alive, so an exporter that frees its buffer (or exits) leaves the
//! importer's mapping valid: nothing is written to freed memory.

use super::mem::{HostMem, HostPointer};
use rustix::fs::{self as rfs, MemfdFlags, Mode, OFlags, SealFlags};
use std::os::fd::{AsRawFd, OwnedFd};
use std::ptr::NonNull;

/// Prefix of a shared buffer's memfd name; its random name (hex) follows.
const NAME_PREFIX: &str = "gdpath-shared-";

/// What names a [`SharedBuf`] to another process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShmId {
    /// The exporting process (in the exporter's pid namespace).
    pub pid: u32,
    /// The memfd's descriptor number in that process.
    pub fd: u32,
    /// Device number of the memfd (`fstat`'s `st_dev`): with `ino`, what the importer checks
    /// the descriptor it opened against, so a reused descriptor number is not taken for it.
    pub dev: u64,
    /// Inode number of the memfd (`fstat`'s `st_ino`).
    pub ino: u64,
    /// The random part of the memfd's name (`gdpath-shared-<32 hex digits>`).
    pub name: [u8; 16],
}

fn hex(name: &[u8; 16]) -> String {
    name.iter().map(|b| format!("{b:02x}")).collect()
}

/// A sealed memfd of a fixed length, mapped shared, its pages allocated: the memory of a
/// shared [`crate::HostBuffer`]. Zero-filled (a new file's pages read as zeros). Processes that
/// import it write the same pages.
pub(crate) struct SharedBuf {
    fd: OwnedFd,
    id: ShmId,
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: this value owns its mapping (unmapped once, in Drop); other processes may write the
// pages, as DMA may, which no reference handed out assumes otherwise (`HostBuffer::try_shared`
// says so).
unsafe impl Send for SharedBuf {}
// SAFETY: as above; shared access hands out the address only.
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
        let mut name = [0u8; 16];
        getrandom::fill(&mut name).map_err(|e| std::io::Error::other(format!("getrandom: {e}")))?;
        let cname =
            std::ffi::CString::new(format!("{NAME_PREFIX}{}", hex(&name))).expect("hex has no NUL");
        let fd = rfs::memfd_create(&cname, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)?;
        // Allocated here, so that the exporter's memory holds the pages (an importer that
        // page-locks its mapping then allocates nothing) and a full tmpfs fails now.
        rfs::fallocate(&fd, rfs::FallocateFlags::empty(), 0, len as u64)?;
        rfs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)?;
        let st = rfs::fstat(&fd)?;
        let ptr = map(&fd, 0, len)?;
        Ok(SharedBuf {
            id: ShmId {
                pid: std::process::id(),
                fd: fd.as_raw_fd() as u32,
                dev: st.st_dev,
                ino: st.st_ino,
                name,
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

/// `statfs(2)` magic of tmpfs, which memfds live on (`linux/magic.h`).
const TMPFS_MAGIC: u64 = 0x0102_1994;

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
/// Errors (as text, for the backend's refusal): this process's own buffer (another agent of
/// this process shares memory without gdpath's help), the descriptor's link cannot be read or
/// is not the named buffer (another user's process, a pid that is gone or of another pid
/// namespace, a wrong name), the file is not a regular tmpfs file with the device and inode
/// named, not sealed against shrinking, shorter than `offset + len` or with pages missing, or
/// the mapping fails.
pub fn map_peer(id: ShmId, offset: u64, len: u64) -> Result<HostMem, String> {
    if id.pid == std::process::id() {
        return Err("the shared buffer is this process's own".into());
    }
    map_checked(id, offset, len)
}

/// [`map_peer`] without the own-process refusal (the checks and the mapping).
fn map_checked(id: ShmId, offset: u64, len: u64) -> Result<HostMem, String> {
    let path = format!("/proc/{}/fd/{}", id.pid, id.fd);
    let want = format!("/memfd:{NAME_PREFIX}{} (deleted)", hex(&id.name));
    let link = rfs::readlink(&path, Vec::new()).map_err(|e| format!("cannot read {path}: {e}"))?;
    if link.as_bytes() != want.as_bytes() {
        return Err(format!("{path} is not the shared buffer the peer named"));
    }
    // O_PATH: no open side effect and no wait, whatever the descriptor turned into meanwhile;
    // checked, then reopened through this process's own descriptor (the same file).
    let pathfd = rfs::open(&path, OFlags::PATH | OFlags::CLOEXEC, Mode::empty())
        .map_err(|e| format!("cannot open {path}: {e}"))?;
    let st = rfs::fstat(&pathfd).map_err(|e| format!("fstat of {path}: {e}"))?;
    if (st.st_dev, st.st_ino) != (id.dev, id.ino)
        || st.st_mode & libc::S_IFMT != libc::S_IFREG
        || rfs::fstatfs(&pathfd)
            .map(|f| f.f_type as u64 & 0xffff_ffff)
            .ok()
            != Some(TMPFS_MAGIC)
    {
        return Err(format!(
            "{path} is not the shared buffer the peer named (device {} inode {}, expected {} {})",
            st.st_dev, st.st_ino, id.dev, id.ino
        ));
    }
    let fd = rfs::open(
        format!("/proc/self/fd/{}", pathfd.as_raw_fd()),
        OFlags::RDWR | OFlags::NOCTTY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| format!("cannot reopen {path}: {e}"))?;
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
    if (st.st_blocks as u64).saturating_mul(512) < end {
        return Err(format!(
            "{path} has {} of its {end} bytes allocated (the exporter allocates them)",
            st.st_blocks as u64 * 512
        ));
    }
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
        let m = map_checked(b.id(), 4096 + 7, 10).unwrap();
        let mut out = [0u8; 10];
        m.copy_out(0, &mut out).unwrap();
        assert_eq!(out, [0xab; 10]);
        m.copy_in(0, &[1, 2, 3]).unwrap();
        // SAFETY: the same pages, through the exporter's mapping.
        let back = unsafe { std::slice::from_raw_parts(b.as_ptr().add(4096 + 7), 3) };
        assert_eq!(back, [1, 2, 3]);
        // The exporter's own process is refused.
        let e = map_peer(b.id(), 0, 10).unwrap_err();
        assert!(e.contains("own"), "{e}");
    }

    /// A memfd named like a shared buffer, `len` bytes, sealed or not, allocated or not.
    fn lookalike(len: u64, seal: bool, allocate: bool) -> (OwnedFd, ShmId) {
        let name = [0x11u8; 16];
        let cname = std::ffi::CString::new(format!("{NAME_PREFIX}{}", hex(&name))).unwrap();
        let fd =
            rfs::memfd_create(&cname, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING).unwrap();
        if allocate {
            rfs::fallocate(&fd, rfs::FallocateFlags::empty(), 0, len).unwrap();
        } else {
            rfs::ftruncate(&fd, len).unwrap();
        }
        if seal {
            rfs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW).unwrap();
        }
        let st = rfs::fstat(&fd).unwrap();
        let id = ShmId {
            pid: std::process::id(),
            fd: fd.as_raw_fd() as u32,
            dev: st.st_dev,
            ino: st.st_ino,
            name,
        };
        (fd, id)
    }

    #[test]
    fn wrong_names_inodes_files_seals_lengths_and_holes_are_refused() {
        let b = SharedBuf::new(8192).unwrap();
        let id = b.id();
        let e = map_checked(
            ShmId {
                name: [0; 16],
                ..id
            },
            0,
            10,
        )
        .unwrap_err();
        assert!(e.contains("not the shared buffer"), "{e}");
        let e = map_checked(
            ShmId {
                ino: id.ino + 1,
                ..id
            },
            0,
            10,
        )
        .unwrap_err();
        assert!(e.contains("not the shared buffer"), "{e}");
        let e = map_checked(id, 8000, 200).unwrap_err();
        assert!(e.contains("holds 8192 bytes"), "{e}");
        let e = map_checked(
            ShmId {
                pid: u32::MAX,
                ..id
            },
            0,
            10,
        )
        .unwrap_err();
        assert!(e.contains("cannot read"), "{e}");
        // Another file of this process (stdin, a pipe or /dev/null) under a peer's claim.
        let e = map_checked(ShmId { fd: 0, ..id }, 0, 10).unwrap_err();
        assert!(
            e.contains("not the shared buffer") || e.contains("cannot read"),
            "{e}"
        );
        // Named right but not sealed: a peer could shrink it under the mapping.
        let (_f, unsealed) = lookalike(8192, false, true);
        let e = map_checked(unsealed, 0, 10).unwrap_err();
        assert!(e.contains("not sealed"), "{e}");
        // Sealed but its pages not allocated: page-locking it would allocate them here.
        let (_g, sparse) = lookalike(1 << 30, true, false);
        let e = map_checked(sparse, 0, 1 << 30).unwrap_err();
        assert!(e.contains("allocated"), "{e}");
    }

    #[test]
    fn a_mapping_outlives_the_exporters_buffer() {
        let b = SharedBuf::new(4096).unwrap();
        let m = map_checked(b.id(), 0, 4096).unwrap();
        drop(b);
        m.copy_in(4000, &[9; 96]).unwrap();
        let mut out = [0u8; 96];
        m.copy_out(4000, &mut out).unwrap();
        assert_eq!(out, [9; 96]);
    }
}
