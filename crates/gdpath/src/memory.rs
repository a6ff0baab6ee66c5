//! Memory that can be registered with an [`crate::Agent`]: host buffers, files, GPU memory and
//! remote regions.

use serde::{Deserialize, Serialize};
use std::alloc::{self, Layout};
use std::fmt;
use std::path::PathBuf;
use std::ptr::NonNull;

/// Alignment of every [`HostBuffer`] (bytes): one 4 KiB page, which satisfies O_DIRECT's memory
/// alignment on every Linux file system (`statx` `stx_dio_mem_align` is at most the page size).
pub const HOST_ALIGN: usize = 4096;

/// The kind of a registered region, with its parameters. Names follow `DESIGN.md`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum MemoryKind {
    /// Host memory. `pinned` is true for page-locked memory registered with CUDA (a later
    /// backend); gdpath's own [`HostBuffer`]s are pageable.
    Host { pinned: bool },
    /// A file, read and written through the storage backends.
    File,
    /// Memory of the GPU with this CUDA ordinal.
    Gpu { ordinal: u32 },
    /// A region registered by the remote agent with this name (network backend).
    Remote { agent: String },
}

impl MemoryKind {
    /// The kind without its parameters, as backends declare it in [`crate::backend::Capability`].
    pub fn class(&self) -> MemoryClass {
        match self {
            MemoryKind::Host { .. } => MemoryClass::Host,
            MemoryKind::File => MemoryClass::File,
            MemoryKind::Gpu { .. } => MemoryClass::Gpu,
            MemoryKind::Remote { .. } => MemoryClass::Remote,
        }
    }
}

impl fmt::Display for MemoryKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MemoryKind::Host { pinned: true } => f.write_str("host (pinned)"),
            MemoryKind::Host { pinned: false } => f.write_str("host (pageable)"),
            MemoryKind::File => f.write_str("file"),
            MemoryKind::Gpu { ordinal } => write!(f, "GPU {ordinal}"),
            MemoryKind::Remote { agent } => write!(f, "remote ({agent})"),
        }
    }
}

/// A memory kind without parameters: what a backend's capability is declared over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MemoryClass {
    Host,
    File,
    Gpu,
    Remote,
}

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
    Create { truncate: bool },
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
    pub path: PathBuf,
    pub access: FileAccess,
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

/// A remote region as advertised by a peer agent (network backend, later issue): its address in
/// the peer's memory, its length in bytes and the packed remote key (rkey).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteMemory {
    pub agent: String,
    pub addr: u64,
    pub len: u64,
    pub rkey: Vec<u8>,
}

/// GPU memory gdpath does not own: a device pointer (`CUdeviceptr`), its length in bytes and the
/// CUDA ordinal of the GPU holding it. Made only by the unsafe [`GpuPointer::new`], whose caller
/// vouches that the memory outlives the region ([`crate::Agent::register_kept`] ties it to the
/// object that owns it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuPointer {
    ordinal: u32,
    ptr: u64,
    len: u64,
    writable: bool,
}

impl GpuPointer {
    /// `len` bytes of device memory at `ptr` on GPU `ordinal`, writable.
    ///
    /// # Safety
    /// `[ptr, ptr + len)` must be device memory allocated on GPU `ordinal` (or mapped into its
    /// primary context) that stays allocated until the region registered from it, and every
    /// transfer using that region, has been dropped.
    pub unsafe fn new(ordinal: u32, ptr: u64, len: u64) -> Self {
        GpuPointer {
            ordinal,
            ptr,
            len,
            writable: true,
        }
    }

    /// The same memory, read-only: the region is never written (see
    /// [`crate::Error::ReadOnlyMemory`]). For memory its owner declares read-only (a
    /// `__cuda_array_interface__` with `readonly`, a DLPack tensor flagged read-only).
    pub fn read_only(mut self) -> Self {
        self.writable = false;
        self
    }

    /// Whether the region may be written.
    pub fn writable(&self) -> bool {
        self.writable
    }

    /// CUDA ordinal of the GPU.
    pub fn ordinal(&self) -> u32 {
        self.ordinal
    }

    /// The device address.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// Length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// True for an empty range.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Host memory gdpath does not own: an address, a length in bytes and whether it may be written
/// (a NumPy array, a `bytearray`, a PyTorch tensor's storage, an `mmap`). Made only by the unsafe
/// [`HostPointer::new`], whose caller vouches that the memory outlives the region
/// ([`crate::Agent::register_kept`] ties it to the object that owns it). Unlike a [`HostBuffer`]
/// it has no alignment: O_DIRECT then goes through bounce buffers where the address is not
/// aligned (`docs/engine.md`, posix-direct).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostPointer {
    ptr: NonNull<u8>,
    len: usize,
    writable: bool,
}

// SAFETY: a HostPointer is an address and a length; the caller of `new` vouched for the memory,
// and the engine accesses it only as registered memory (in use or viewed, never both).
unsafe impl Send for HostPointer {}
// SAFETY: as above.
unsafe impl Sync for HostPointer {}

impl HostPointer {
    /// `len` bytes of host memory at `ptr`; `writable: false` makes the region read-only (it is
    /// never written: [`crate::Error::ReadOnlyMemory`]).
    ///
    /// # Safety
    /// `[ptr, ptr + len)` must be host memory, readable (and writable when `writable`), that
    /// stays valid at this address until the region registered from it, and every transfer
    /// using that region, has been dropped; while a transfer uses it nothing else may write it
    /// (nor read it while the transfer writes it). A null `ptr` is allowed only for `len == 0`.
    pub unsafe fn new(ptr: *mut u8, len: usize, writable: bool) -> Self {
        // An empty range is never dereferenced; a dangling aligned pointer stands in for null.
        let ptr = NonNull::new(ptr).unwrap_or(NonNull::dangling());
        HostPointer { ptr, len, writable }
    }

    /// The start address.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for an empty range.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether the region may be written.
    pub fn writable(&self) -> bool {
        self.writable
    }
}

/// Memory handed to [`crate::Agent::register`].
#[derive(Debug)]
#[non_exhaustive]
pub enum Memory {
    /// Host memory owned by the region from now on ([`crate::Region::into_host_buffer`] gives it
    /// back). `pinned: true` asks for page-locked memory, which needs the CUDA backend.
    Host { buffer: HostBuffer, pinned: bool },
    /// A file.
    File(FileSpec),
    /// `len` bytes of memory on GPU `ordinal`, allocated by the CUDA backend (`cuMemAlloc`) and
    /// freed with the region. Needs the CUDA backend.
    Gpu { ordinal: u32, len: u64 },
    /// GPU memory allocated by someone else (PyTorch, cupy, `cudaMalloc`), given by device
    /// pointer and ordinal; never freed by gdpath. Needs the CUDA backend.
    GpuPointer(GpuPointer),
    /// Host memory allocated by someone else, never freed by gdpath. `pinned: true` asks for
    /// page-locked memory (needs the CUDA backend): the backend page-locks it at registration,
    /// or, when its owner already did (PyTorch's pinned memory, `cudaHostAlloc`), uses it as it
    /// is and leaves it locked.
    HostPointer { memory: HostPointer, pinned: bool },
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
            Memory::File(_) => MemoryKind::File,
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
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: HostBuffer uniquely owns its allocation, like Vec<u8>.
unsafe impl Send for HostBuffer {}
// SAFETY: shared access only hands out &[u8].
unsafe impl Sync for HostBuffer {}

impl HostBuffer {
    /// Allocates `len` zeroed bytes. Aborts like `Vec` when the allocator fails.
    pub fn zeroed(len: usize) -> Self {
        if len == 0 {
            // A dangling but aligned pointer: never dereferenced for a zero length.
            let ptr = NonNull::new(HOST_ALIGN as *mut u8).expect("non-null constant");
            return HostBuffer { ptr, len };
        }
        let layout = Self::layout(len);
        // SAFETY: layout has a non-zero size.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).unwrap_or_else(|| alloc::handle_alloc_error(layout));
        HostBuffer { ptr, len }
    }

    /// As [`HostBuffer::zeroed`], but an allocation the system refuses (or a length above
    /// `isize::MAX`) is an error naming the size instead of an abort: for sizes a user typed.
    ///
    /// Errors: [`crate::Error::Config`] with the size in bytes and GiB.
    pub fn try_zeroed(len: usize) -> crate::Result<Self> {
        if len == 0 {
            return Ok(Self::zeroed(0));
        }
        let refuse = || {
            crate::Error::Config(format!(
                "cannot allocate {len} bytes ({:.1} GiB) of host memory",
                len as f64 / (1u64 << 30) as f64
            ))
        };
        let layout = Layout::from_size_align(len, HOST_ALIGN).map_err(|_| refuse())?;
        // SAFETY: layout has a non-zero size.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).ok_or_else(refuse)?;
        Ok(HostBuffer { ptr, len })
    }

    /// An aligned copy of `bytes`.
    pub fn from_slice(bytes: &[u8]) -> Self {
        let mut b = Self::zeroed(bytes.len());
        b.as_mut_slice().copy_from_slice(bytes);
        b
    }

    fn layout(len: usize) -> Layout {
        Layout::from_size_align(len, HOST_ALIGN).expect("size below isize::MAX")
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the buffer has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr is valid for len bytes (or len is 0 with an aligned dangling pointer).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The bytes, mutable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and &mut self gives unique access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// The start address (for backends).
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

impl Drop for HostBuffer {
    fn drop(&mut self) {
        if self.len > 0 {
            // SAFETY: allocated in `zeroed` with this layout.
            unsafe { alloc::dealloc(self.ptr.as_ptr(), Self::layout(self.len)) }
        }
    }
}

impl fmt::Debug for HostBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostBuffer")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
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
