//! Memory that can be registered with an [`crate::Agent`]: host buffers, files, GPU memory and
//! remote regions.

pub use crate::memory_kind::{MemoryClass, MemoryKind};
use crate::os::mem::AlignedBuf;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::os::fd::OwnedFd;
use std::path::PathBuf;

/// Alignment of every [`HostBuffer`] (bytes): one 4 KiB page, which satisfies O_DIRECT's memory
/// alignment on every Linux file system (`statx` `stx_dio_mem_align` is at most the page size).
pub const HOST_ALIGN: usize = 4096;

/// Whether a file region may be written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum FileAccess {
    /// Open an existing file for reading only; writes fail with [`crate::Error::ReadOnly`].
    #[default]
    ReadOnly,
    /// Open an existing file for reading and writing.
    ReadWrite,
    /// Create the file if missing (mode 0644) and open it for reading and writing. Existing
    /// contents are kept unless `truncate`.
    Create {
        /// Empty an existing file at registration (`O_TRUNC`).
        truncate: bool,
    },
}

impl FileAccess {
    /// True when the region may be written.
    pub fn writable(self) -> bool {
        !matches!(self, FileAccess::ReadOnly)
    }
}

/// Whether a file region uses O_DIRECT.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DirectIo {
    /// Try O_DIRECT; where the file system refuses it, use the buffered path and report
    /// `storage.odirect-unsupported` on each transfer.
    #[default]
    Auto,
    /// Never use O_DIRECT (page cache only); transfers report `storage.odirect-disabled`.
    Off,
    /// Fail registration when the file system refuses O_DIRECT.
    Required,
}

/// A file to register.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileSpec {
    /// The file's path.
    pub path: PathBuf,
    /// Whether it is opened for writing, and created.
    pub access: FileAccess,
    /// Whether it is opened with `O_DIRECT`.
    pub direct: DirectIo,
}

impl FileSpec {
    /// An existing file, read-only, O_DIRECT where allowed.
    pub fn read(path: impl Into<PathBuf>) -> Self {
        FileSpec {
            path: path.into(),
            access: FileAccess::ReadOnly,
            direct: DirectIo::Auto,
        }
    }

    /// A file opened for reading and writing, created if missing (kept if present).
    pub fn write(path: impl Into<PathBuf>) -> Self {
        FileSpec {
            path: path.into(),
            access: FileAccess::Create { truncate: false },
            direct: DirectIo::Auto,
        }
    }

    /// The same spec with another O_DIRECT policy.
    pub fn direct(mut self, direct: DirectIo) -> Self {
        self.direct = direct;
        self
    }

    /// The same spec with another access mode.
    pub fn access(mut self, access: FileAccess) -> Self {
        self.access = access;
        self
    }
}

/// A file already open, registered through its descriptor: the engine never opens it by a
/// path, so a name or a directory swapped after it was opened cannot redirect the I/O (what
/// [`crate::file::AtomicFileExt::memory`] and [`crate::file::InPlaceFileExt::memory`] hand the
/// engine). `path` only names the file in messages and reports.
///
/// The descriptor must be a regular file, open for reading (and for writing when `access` is
/// writable), without `O_APPEND` (positioned writes would append); the registration clears the
/// `O_DIRECT` and `O_NONBLOCK` flags of its open file description. O_DIRECT needs an open file
/// description of its own: the one given with [`OpenFile::with_direct_fd`] (opened with
/// `O_DIRECT` on the same inode), else the engine opens `/proc/self/fd/N` of the descriptor
/// again with `O_DIRECT`, which reaches the same inode by no name; where `/proc` is not
/// mounted the file is used through the page cache, as on a file system that refuses
/// O_DIRECT.
#[derive(Debug)]
pub struct OpenFile {
    pub(crate) file: std::fs::File,
    pub(crate) direct_file: Option<std::fs::File>,
    pub(crate) path: PathBuf,
    pub(crate) access: FileAccess,
    pub(crate) direct: DirectIo,
}

impl OpenFile {
    /// The file open as `fd`, named `path` in messages, used as `access` says
    /// ([`FileAccess::Create`] is [`FileAccess::ReadWrite`] here, its `truncate` truncating the
    /// file at registration), O_DIRECT where allowed ([`DirectIo::Auto`]).
    pub fn new(fd: impl Into<OwnedFd>, path: impl Into<PathBuf>, access: FileAccess) -> Self {
        OpenFile {
            file: std::fs::File::from(fd.into()),
            direct_file: None,
            path: path.into(),
            access,
            direct: DirectIo::Auto,
        }
    }

    /// The same file with another O_DIRECT policy.
    pub fn direct(mut self, direct: DirectIo) -> Self {
        self.direct = direct;
        self
    }

    /// The same file with `fd`, a descriptor of the same inode opened with `O_DIRECT` (an open
    /// file description of its own), for O_DIRECT I/O; the registration checks that it is the
    /// same inode ([`crate::Error::Open`] otherwise).
    pub fn with_direct_fd(mut self, fd: impl Into<OwnedFd>) -> Self {
        self.direct_file = Some(std::fs::File::from(fd.into()));
        self
    }

    /// The path that names the file in messages.
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }

    /// Another value for the same open file: both descriptors duplicated (`dup`, the same
    /// open file descriptions), to register it with another agent. Errors: `dup`'s (`EMFILE`).
    pub fn try_clone(&self) -> std::io::Result<Self> {
        Ok(OpenFile {
            file: self.file.try_clone()?,
            direct_file: match &self.direct_file {
                Some(f) => Some(f.try_clone()?),
                None => None,
            },
            path: self.path.clone(),
            access: self.access,
            direct: self.direct,
        })
    }
}

/// A remote region as advertised by a peer agent (network backend): its address in
/// the peer's memory, its length in bytes and the packed remote key (rkey).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteMemory {
    /// The name of the peer agent that registered the region.
    pub agent: String,
    /// The region's start address in the peer's memory (a virtual address there).
    pub addr: u64,
    /// The region's length (bytes).
    pub len: u64,
    /// The UCX remote key the peer packed for the region (`ucp_rkey_pack`), opaque here.
    pub rkey: Vec<u8>,
}

pub use crate::os::mem::{GpuPointer, HostPointer};

/// Memory handed to [`crate::Agent::register`].
#[derive(Debug)]
#[non_exhaustive]
pub enum Memory {
    /// Host memory owned by the region from now on ([`crate::Region::into_host_buffer`] gives it
    /// back). `pinned: true` asks for page-locked memory, which needs the CUDA backend.
    Host {
        /// The memory, owned by the region until it is taken back.
        buffer: HostBuffer,
        /// Page-lock it at registration (needs the CUDA backend).
        pinned: bool,
    },
    /// A file, opened by its path.
    File(FileSpec),
    /// A file already open, used through its descriptor ([`OpenFile`]).
    OpenFile(OpenFile),
    /// `len` bytes of memory on GPU `ordinal`, allocated by the CUDA backend (`cuMemAlloc`) and
    /// freed with the region. Needs the CUDA backend.
    Gpu {
        /// The GPU's CUDA ordinal.
        ordinal: u32,
        /// Bytes to allocate.
        len: u64,
    },
    /// GPU memory allocated by someone else (PyTorch, cupy, `cudaMalloc`), given by device
    /// pointer and ordinal; never freed by gdpath. Needs the CUDA backend.
    GpuPointer(GpuPointer),
    /// Host memory allocated by someone else, never freed by gdpath. `pinned: true` asks for
    /// page-locked memory (needs the CUDA backend): the backend page-locks it at registration,
    /// or, when its owner already did (PyTorch's pinned memory, `cudaHostAlloc`), uses it as it
    /// is and leaves it locked.
    HostPointer {
        /// The memory: its address, length and whether it may be written.
        memory: HostPointer,
        /// Page-lock it at registration, or use it as it is when already page-locked (needs
        /// the CUDA backend).
        pinned: bool,
    },
    /// A peer's region (needs the UCX backend).
    Remote(RemoteMemory),
}

impl Memory {
    /// Pageable host memory.
    pub fn host(buffer: HostBuffer) -> Self {
        Memory::Host {
            buffer,
            pinned: false,
        }
    }

    /// Host memory to page-lock (`cuMemHostRegister`) at registration, so GPU copies use it
    /// directly (pinned paths). Needs the CUDA backend.
    pub fn pinned(buffer: HostBuffer) -> Self {
        Memory::Host {
            buffer,
            pinned: true,
        }
    }

    /// A file.
    pub fn file(spec: FileSpec) -> Self {
        Memory::File(spec)
    }

    /// A file already open ([`OpenFile`]).
    pub fn open_file(file: OpenFile) -> Self {
        Memory::OpenFile(file)
    }

    /// False for memory registered read-only ([`HostPointer::new`] with `writable: false`,
    /// [`GpuPointer::read_only`]); files are read-only through their [`FileAccess`] instead.
    pub fn writable(&self) -> bool {
        match self {
            Memory::HostPointer { memory, .. } => memory.writable(),
            Memory::GpuPointer(p) => p.writable(),
            _ => true,
        }
    }

    /// The kind the registered region will have.
    pub fn kind(&self) -> MemoryKind {
        match self {
            Memory::Host { pinned, .. } | Memory::HostPointer { pinned, .. } => {
                MemoryKind::Host { pinned: *pinned }
            }
            Memory::File(_) | Memory::OpenFile(_) => MemoryKind::File,
            Memory::Gpu { ordinal, .. } => MemoryKind::Gpu { ordinal: *ordinal },
            Memory::GpuPointer(p) => MemoryKind::Gpu {
                ordinal: p.ordinal(),
            },
            Memory::Remote(r) => MemoryKind::Remote {
                agent: r.agent.clone(),
            },
        }
    }
}

/// A zero-initialised host allocation aligned to [`HOST_ALIGN`] (4 KiB), so O_DIRECT can read
/// into it and write from it without a bounce buffer.
pub struct HostBuffer {
    buf: AlignedBuf,
}

/// Host memory available for new allocations, bytes: `MemAvailable` of `/proc/meminfo`, within
/// what the process's cgroup (v2) still allows; `None` when neither can be read.
pub fn host_memory_available() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok().and_then(|t| {
        t.lines()
            .find_map(|l| l.strip_prefix("MemAvailable:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map(|kb| kb * 1024)
    });
    let read = |f: &str| {
        std::fs::read_to_string(format!("/sys/fs/cgroup/{f}"))
            .ok()
            .and_then(|t| t.trim().parse::<u64>().ok())
    };
    // cgroup v2 at the mount point (a container's own cgroup); "max" does not parse: no limit.
    let cgroup =
        read("memory.max").map(|max| max.saturating_sub(read("memory.current").unwrap_or(0)));
    match (meminfo, cgroup) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Refuses `bytes` of host memory that `what` would allocate when they are more than
/// [`host_memory_available`], before anything is allocated: the kernel grants a large
/// allocation lazily and meets it with the OOM killer when it is filled. Unknown availability
/// passes.
///
/// Errors: [`crate::Error::Config`] naming `what` and both sizes (bytes and GiB).
pub fn check_host_memory(what: &str, bytes: u64) -> crate::Result<()> {
    match host_memory_available() {
        Some(avail) if bytes > avail => Err(crate::Error::Config(format!(
            "{what} needs {bytes} bytes ({:.1} GiB) of host memory, and {avail} bytes ({:.1} GiB) \
             are available here",
            bytes as f64 / (1u64 << 30) as f64,
            avail as f64 / (1u64 << 30) as f64
        ))),
        _ => Ok(()),
    }
}

/// The error for a host allocation of `len` bytes that the system refused.
pub(crate) fn host_alloc_error(len: usize) -> crate::Error {
    crate::Error::Config(format!(
        "cannot allocate {len} bytes ({:.1} GiB) of host memory",
        len as f64 / (1u64 << 30) as f64
    ))
}

impl HostBuffer {
    /// Allocates `len` zeroed bytes. Aborts like `Vec` when the allocator fails.
    pub fn zeroed(len: usize) -> Self {
        HostBuffer {
            buf: AlignedBuf::zeroed(len, HOST_ALIGN),
        }
    }

    /// As [`HostBuffer::zeroed`], but an allocation the system refuses (or a length above
    /// `isize::MAX`) is an error naming the size instead of an abort: for sizes a user typed.
    ///
    /// Errors: [`crate::Error::Config`] with the size in bytes and GiB.
    pub fn try_zeroed(len: usize) -> crate::Result<Self> {
        AlignedBuf::try_zeroed(len, HOST_ALIGN)
            .map(|buf| HostBuffer { buf })
            .ok_or_else(|| host_alloc_error(len))
    }

    /// `len` (> 0) zeroed bytes that another process of this node can map: a sealed memfd of
    /// tmpfs with a random name, its pages allocated now (charged to this process). Exported to
    /// a peer on the same node ([`crate::Agent::export`]), the peer's `cuda` and `host-copy`
    /// backends write and read it directly (GPU kernels, copy engines, `memcpy`) instead of
    /// going through UCX; peers elsewhere use UCX as for any host memory (`docs/network.md`,
    /// "Host memory of another process"). As with memory a NIC writes, the bytes behind
    /// [`HostBuffer::as_slice`] change when an importer writes them. Use: register it
    /// (`agent.register(Memory::host(buf))`), then `agent.export(&region)` on a serving agent;
    /// an importer's report then names `host-copy` or the pinned host ↔ GPU paths for its pairs
    /// (`TransferRequest::accept` refuses anything else).
    ///
    /// Errors: [`crate::Error::Config`] naming the size when the system refuses the memory (a
    /// zero length, a seccomp filter without `memfd_create`, a full `/dev/shm`): a caller
    /// may then fall back to [`HostBuffer::try_zeroed`], as `gdpath serve` does.
    pub fn try_shared(len: usize) -> crate::Result<Self> {
        AlignedBuf::try_shared(len)
            .map(|buf| HostBuffer { buf })
            .map_err(|e| {
                crate::Error::Config(format!(
                    "cannot allocate {len} bytes ({:.1} GiB) of shared host memory: {e}",
                    len as f64 / (1u64 << 30) as f64
                ))
            })
    }

    /// An aligned copy of `bytes`.
    pub fn from_slice(bytes: &[u8]) -> Self {
        let mut b = Self::zeroed(bytes.len());
        b.as_mut_slice().copy_from_slice(bytes);
        b
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// True when the buffer has no bytes.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        self.buf.as_slice()
    }

    /// The bytes, mutable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        self.buf.as_mut_slice()
    }

    /// The start address (for backends).
    pub fn as_ptr(&self) -> *mut u8 {
        self.buf.as_ptr()
    }

    /// The allocation, for a region to share.
    pub(crate) fn into_aligned(self) -> AlignedBuf {
        self.buf
    }

    /// A buffer around an allocation of [`HOST_ALIGN`] (a region's, given back).
    pub(crate) fn from_aligned(buf: AlignedBuf) -> Self {
        HostBuffer { buf }
    }
}

impl fmt::Debug for HostBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostBuffer")
            .field("ptr", &self.buf.as_ptr())
            .field("len", &self.buf.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn an_impossible_host_allocation_is_an_error_not_an_abort() {
        let e = super::HostBuffer::try_zeroed(usize::MAX)
            .unwrap_err()
            .to_string();
        assert!(e.contains("cannot allocate"), "{e}");
        assert_eq!(super::HostBuffer::try_zeroed(4096).unwrap().len(), 4096);
    }

    use super::*;

    #[test]
    fn host_buffer_is_aligned_zeroed_and_sized() {
        for len in [0usize, 1, 4095, 4096, 4097, 1 << 20] {
            let b = HostBuffer::zeroed(len);
            assert_eq!(b.len(), len);
            assert_eq!(b.as_ptr() as usize % HOST_ALIGN, 0, "len {len}");
            assert!(b.as_slice().iter().all(|&x| x == 0));
        }
        let b = HostBuffer::from_slice(b"abc");
        assert_eq!(b.as_slice(), b"abc");
    }

    #[test]
    fn kind_classes() {
        assert_eq!(MemoryKind::Gpu { ordinal: 3 }.class(), MemoryClass::Gpu);
        assert_eq!(
            MemoryKind::Host { pinned: true }.to_string(),
            "host (pinned)"
        );
    }
}
