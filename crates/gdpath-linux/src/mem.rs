//! Host memory: aligned allocations, the registered host memory a region shares with its
//! in-flight I/O and driver registrations (gdpath's own, or memory someone else owns and the
//! object that keeps it alive), raw copies into and out of it, and the registrations of memory
//! with CUDA and UCX.

use gdpath_cuda::{CudaError, DeviceBuffer, HostMemory, HostRegistration, PinnedHostBuffer};
use gdpath_ucx::{MemHandle, MemType, UcxError};
use std::alloc::{self, Layout};
use std::any::Any;
use std::fmt;
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::Arc;

/// A zero-initialised allocation of `len` bytes aligned to `align` bytes (a power of two): the
/// memory of a [`crate::HostBuffer`] and of the O_DIRECT bounce buffers. From 1 MiB
/// (`MAP_MIN`) an anonymous mapping, whose pages are zeroed when first touched, else the heap.
/// Owns its memory like a `Box<[u8]>`; the address does not change when the value moves.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
    align: usize,
    /// Made by `mmap` (freed by `munmap`) rather than the allocator.
    mapped: bool,
    /// A memfd another process can map ([`AlignedBuf::try_shared`]); it owns the mapping.
    shared: Option<Box<super::shm::SharedBuf>>,
}

/// Allocations of at least this many bytes (with an alignment of at most a page) are anonymous
/// mappings, whose pages the kernel zeroes when first touched: the allocator's zeroed aligned
/// allocation writes every byte first, which took as long as reading a 2 GiB checkpoint from
/// disk into it (docs/benchmarks.md, "Measurements behind the defaults").
const MAP_MIN: usize = 1 << 20;

// SAFETY: AlignedBuf uniquely owns its allocation, like Box<[u8]>.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only hands out &[u8].
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// `len` zeroed bytes aligned to `align`, or `None` when the allocator refuses or the
    /// layout is impossible (`align` not a power of two, `len` rounded up to `align` above
    /// `isize::MAX`). A zero length allocates nothing.
    pub fn try_zeroed(len: usize, align: usize) -> Option<Self> {
        let layout = Layout::from_size_align(len, align).ok()?;
        if len == 0 {
            // An aligned dangling pointer, never dereferenced for a zero length (a slice of
            // length 0 may sit at any non-null aligned address).
            let ptr = NonNull::new(align as *mut u8)?;
            return Some(AlignedBuf {
                ptr,
                len,
                align,
                mapped: false,
                shared: None,
            });
        }
        if len >= MAP_MIN && align <= super::file::page_size() {
            // SAFETY: a new private anonymous mapping at an address the kernel picks (page
            // aligned, so aligned to `align`), owned by the value and unmapped in Drop.
            let raw = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            if raw == libc::MAP_FAILED {
                return None;
            }
            return NonNull::new(raw.cast::<u8>()).map(|ptr| AlignedBuf {
                ptr,
                len,
                align,
                mapped: true,
                shared: None,
            });
        }
        // SAFETY: layout has a non-zero size.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        NonNull::new(raw).map(|ptr| AlignedBuf {
            ptr,
            len,
            align,
            mapped: false,
            shared: None,
        })
    }

    /// `len` (> 0) zeroed, page-aligned bytes that another process of this node can map
    /// (a sealed memfd, [`super::shm`]): writes it makes land here.
    ///
    /// Errors: the system's (`memfd_create`, `mmap`, ...), `EINVAL` for a zero length.
    pub fn try_shared(len: usize) -> std::io::Result<Self> {
        let shared = super::shm::SharedBuf::new(len)?;
        Ok(AlignedBuf {
            ptr: NonNull::new(shared.as_ptr()).expect("mmap returned a non-null address"),
            len: shared.len(),
            align: super::file::page_size(),
            mapped: false,
            shared: Some(Box::new(shared)),
        })
    }

    /// How another process names this memory, for a buffer made by
    /// [`AlignedBuf::try_shared`].
    pub fn shm_id(&self) -> Option<super::shm::ShmId> {
        self.shared.as_ref().map(|s| s.id())
    }

    /// As [`AlignedBuf::try_zeroed`], aborting like `Vec` when the allocator fails.
    ///
    /// Panics: for an impossible layout (see `try_zeroed`), as `Vec::with_capacity` does.
    pub fn zeroed(len: usize, align: usize) -> Self {
        let layout = Layout::from_size_align(len, align).expect("size below isize::MAX");
        Self::try_zeroed(len, align).unwrap_or_else(|| alloc::handle_alloc_error(layout))
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the buffer has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The start address, for alignment checks and for handing to a driver.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr is valid for len bytes (or len is 0 with an aligned dangling pointer);
        // &self allows no writer meanwhile.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The bytes, mutable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and &mut self gives unique access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if self.shared.is_some() {
            // The shared buffer unmaps itself.
        } else if self.mapped {
            // SAFETY: the mapping `try_zeroed` made, of `len` bytes, unmapped once; the value
            // owned it and no reference into it outlives the value.
            unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
        } else if self.len > 0 {
            // SAFETY: allocated in `try_zeroed` with exactly this size and alignment (a layout
            // it checked).
            unsafe {
                alloc::dealloc(
                    self.ptr.as_ptr(),
                    Layout::from_size_align_unchecked(self.len, self.align),
                )
            }
        }
    }
}

impl fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AlignedBuf")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .finish()
    }
}

/// A range that does not lie inside a [`HostMem`], or that would be written in read-only memory
/// (`read_only`). The engine checks every descriptor against its region, and refuses to write
/// read-only regions, before a backend sees them, so this names a bug, not bad input.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "range {off}+{len} {} host memory of {mem_len} bytes",
    if *read_only { "would be written in read-only" } else { "is outside" }
)]
pub struct RangeError {
    /// Start of the range asked for, bytes from the start of the memory.
    pub off: usize,
    /// Length of the range asked for (bytes).
    pub len: usize,
    /// Length of the memory the range was checked against (bytes).
    pub mem_len: usize,
    /// The range lies inside the memory, but a write was asked of read-only memory.
    pub read_only: bool,
}

/// Host memory gdpath does not own: an address, a length in bytes and whether it may be written
/// (a NumPy array, a `bytearray`, a PyTorch tensor's storage, an `mmap`). Made only by the unsafe
/// [`HostPointer::new`], whose caller vouches that the memory outlives gdpath's use of it
/// ([`crate::Agent::register_kept`] ties it to the object that owns it). Unlike a
/// [`crate::HostBuffer`] it has no alignment: O_DIRECT then goes through bounce buffers where
/// the address is not aligned (`docs/engine.md`, posix-direct).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostPointer {
    ptr: NonNull<u8>,
    len: usize,
    writable: bool,
}

// SAFETY: a HostPointer is an address and a length; the caller of `new` vouched for the memory,
// which the engine reaches only as a [`HostMem`] (module invariant 2 of `crate::os`).
unsafe impl Send for HostPointer {}
// SAFETY: as above.
unsafe impl Sync for HostPointer {}

impl HostPointer {
    /// `len` bytes of host memory at `ptr`; `writable: false` makes the region read-only (it is
    /// never written: [`crate::Error::ReadOnlyMemory`]).
    ///
    /// # Safety
    /// `[ptr, ptr + len)` must be host memory, readable (and writable when `writable`), that
    /// stays valid at this address for as long as gdpath holds it: until the region registered
    /// from it and every transfer using that region have been dropped, and any I/O the kernel
    /// has not completed on it (the engine holds the memory for that too; with
    /// [`crate::Agent::register_kept`] the owner given there is dropped exactly when the last of
    /// these goes). While a transfer uses it nothing else may write it (nor read it while the
    /// transfer writes it). A null `ptr` is allowed only for `len == 0`.
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

/// The object that keeps memory someone else owns alive (a Python object, an `Arc` of a
/// framework's allocation; [`crate::Agent::register_kept`]). Its drop may run on any thread.
pub type Keep = Box<dyn Any + Send + Sync>;

/// The bytes behind a [`HostMem`].
enum Bytes {
    /// gdpath's own allocation.
    Owned(AlignedBuf),
    /// Memory someone else owns, and what keeps it alive: dropped with the last handle, after
    /// every registration and I/O that held one.
    Borrowed {
        mem: HostPointer,
        _keep: Option<Keep>,
    },
}

/// The memory of a registered host region, shared (an `Arc`) by the region, the I/O in flight
/// on it ([`crate::os::uring::IoMem`]) and its CUDA registration, so that it lives until the
/// last of them is gone, whatever order they drop in: gdpath's own allocation, or memory
/// someone else owns ([`HostMem::borrowed`]), whose owner is dropped then.
///
/// Its bytes are reached through raw copies, each checked against the length, and each write
/// against the memory being writable (read-only memory is never written): several transfers
/// may run on one region at once, on their own ranges (see the module invariants in
/// [`crate::os`]).
#[derive(Clone)]
pub struct HostMem(Arc<Bytes>);

impl fmt::Debug for HostMem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostMem")
            .field("ptr", &self.as_ptr())
            .field("len", &self.len())
            .field("owned", &self.is_owned())
            .field("writable", &self.writable())
            .finish()
    }
}

impl HostMem {
    /// Shares `buf`.
    pub fn new(buf: AlignedBuf) -> Self {
        HostMem(Arc::new(Bytes::Owned(buf)))
    }

    /// Shares memory someone else owns; `keep`, when given, is dropped with the last handle
    /// (after every registration and I/O that held the memory). Read-only when `mem` is not
    /// writable.
    pub fn borrowed(mem: HostPointer, keep: Option<Keep>) -> Self {
        HostMem(Arc::new(Bytes::Borrowed { mem, _keep: keep }))
    }

    /// The allocation back, when this is the last handle of gdpath's own allocation; else the
    /// handle (memory someone else owns has no allocation to give).
    pub fn try_unwrap(self) -> Result<AlignedBuf, HostMem> {
        if !self.is_owned() {
            return Err(self);
        }
        match Arc::try_unwrap(self.0) {
            Ok(Bytes::Owned(buf)) => Ok(buf),
            Ok(other) => Err(HostMem(Arc::new(other))),
            Err(shared) => Err(HostMem(shared)),
        }
    }

    /// How another process of this node names this memory, when it is gdpath's own shared
    /// allocation ([`AlignedBuf::try_shared`]).
    pub fn shm_id(&self) -> Option<super::shm::ShmId> {
        match &*self.0 {
            Bytes::Owned(b) => b.shm_id(),
            Bytes::Borrowed { .. } => None,
        }
    }

    /// True for gdpath's own allocation, false for memory someone else owns.
    pub fn is_owned(&self) -> bool {
        matches!(*self.0, Bytes::Owned(_))
    }

    /// False for read-only memory (borrowed with `writable: false`), which no copy writes.
    pub fn writable(&self) -> bool {
        match &*self.0 {
            Bytes::Owned(_) => true,
            Bytes::Borrowed { mem, .. } => mem.writable(),
        }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        match &*self.0 {
            Bytes::Owned(b) => b.len(),
            Bytes::Borrowed { mem, .. } => mem.len(),
        }
    }

    /// True when the memory has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The start address (for alignment checks, and for `Region::host_ptr`). Not aligned for
    /// borrowed memory.
    pub fn as_ptr(&self) -> *mut u8 {
        match &*self.0 {
            Bytes::Owned(b) => b.as_ptr(),
            Bytes::Borrowed { mem, .. } => mem.as_ptr(),
        }
    }

    /// The address of byte `off`, when `[off, off + len)` is inside.
    fn at(&self, off: usize, len: usize) -> Result<*mut u8, RangeError> {
        let mem_len = self.len();
        match off.checked_add(len) {
            // SAFETY: off <= the memory's length, so the result is inside it or one past it.
            Some(end) if end <= mem_len => Ok(unsafe { self.as_ptr().add(off) }),
            _ => Err(RangeError {
                off,
                len,
                mem_len,
                read_only: false,
            }),
        }
    }

    /// As [`HostMem::at`], for bytes about to be written: read-only memory refuses.
    fn at_mut(&self, off: usize, len: usize) -> Result<*mut u8, RangeError> {
        if !self.writable() {
            return Err(RangeError {
                off,
                len,
                mem_len: self.len(),
                read_only: true,
            });
        }
        self.at(off, len)
    }

    /// Copies `src` to bytes `[off, off + src.len())`.
    pub fn copy_in(&self, off: usize, src: &[u8]) -> Result<(), RangeError> {
        let dst = self.at_mut(off, src.len())?;
        // SAFETY: the destination is inside the allocation (checked), which `self` keeps alive;
        // `copy` allows `src` to overlap it. Concurrent accesses: module invariant 2.
        unsafe { std::ptr::copy(src.as_ptr(), dst, src.len()) };
        Ok(())
    }

    /// Copies bytes `[off, off + dst.len())` to `dst`.
    pub fn copy_out(&self, off: usize, dst: &mut [u8]) -> Result<(), RangeError> {
        let src = self.at(off, dst.len())?;
        // SAFETY: as in `copy_in`.
        unsafe { std::ptr::copy(src, dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    /// Copies `len` bytes from `src` at `src_off` to `dst` at `dst_off`; the two may be the same
    /// memory and the ranges may overlap (`memmove`).
    pub fn copy(
        src: &HostMem,
        src_off: usize,
        dst: &HostMem,
        dst_off: usize,
        len: usize,
    ) -> Result<(), RangeError> {
        let s = src.at(src_off, len)?;
        let d = dst.at_mut(dst_off, len)?;
        // SAFETY: both ranges are inside their allocations (checked), kept alive by the
        // borrows; `copy` allows overlap. Concurrent accesses: module invariant 2.
        unsafe { std::ptr::copy(s, d, len) };
        Ok(())
    }

    /// Runs `f` on bytes `[off, off + len)` as a slice, for a call that needs one (a `pwrite`, a
    /// driver copy). The slice lives only for the call.
    pub fn with_slice<R>(
        &self,
        off: usize,
        len: usize,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<R, RangeError> {
        let p = self.at(off, len)?;
        // SAFETY: inside the allocation (checked), alive for the call; the range is the calling
        // transfer's own (module invariant 2).
        Ok(f(unsafe { std::slice::from_raw_parts(p, len) }))
    }

    /// Runs `f` on bytes `[off, off + len)` as a mutable slice (a `pread`, a driver copy). The
    /// slice lives only for the call. Read-only memory refuses.
    pub fn with_mut_slice<R>(
        &self,
        off: usize,
        len: usize,
        f: impl FnOnce(&mut [u8]) -> R,
    ) -> Result<R, RangeError> {
        let p = self.at_mut(off, len)?;
        // SAFETY: as in `with_slice`; the range is written by its own transfer only.
        Ok(f(unsafe { std::slice::from_raw_parts_mut(p, len) }))
    }

    /// All bytes, exclusively and writable, for [`crate::HostView`]; `None` for read-only
    /// memory. Sound only while nothing else reaches the bytes: `Region::host_view` calls it
    /// after setting the region's viewed flag, which it sets only while no descriptor pair is in
    /// flight and which keeps new ones from starting until the view is dropped (module
    /// invariant 2).
    pub fn exclusive(&self) -> Option<Exclusive<'_>> {
        if !self.writable() {
            return None;
        }
        let ptr = match &*self.0 {
            Bytes::Owned(b) => b.ptr,
            Bytes::Borrowed { mem, .. } => mem.ptr,
        };
        Some(Exclusive {
            ptr,
            len: self.len(),
            _mem: PhantomData,
        })
    }
}

// SAFETY: gdpath's allocation is on the heap, so its address and length stay fixed while any
// clone of the Arc lives; borrowed memory stays valid at its address while gdpath holds it (the
// contract of `HostPointer::new`), and the registration owns one clone: the memory outlives the
// registration.
unsafe impl HostMemory for HostMem {
    fn as_mut_ptr(&mut self) -> *mut u8 {
        self.as_ptr()
    }
    fn len(&self) -> usize {
        HostMem::len(self)
    }
}

/// Exclusive access to all bytes of a [`HostMem`]; see [`HostMem::exclusive`].
pub struct Exclusive<'a> {
    ptr: NonNull<u8>,
    len: usize,
    _mem: PhantomData<&'a HostMem>,
}

impl Deref for Exclusive<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: the memory outlives 'a (borrowed from its HostMem); exclusive by the contract
        // of `HostMem::exclusive`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for Exclusive<'_> {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above; &mut self makes this the only slice handed out by the view.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
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

/// The device memory behind `p` as a [`DeviceBuffer`] of `ctx` that never frees it.
///
/// Errors: the driver layer's checks (null pointer, empty or overflowing range).
pub fn borrow_device_memory(
    ctx: &gdpath_cuda::Context,
    p: &GpuPointer,
    len: usize,
) -> Result<DeviceBuffer, CudaError> {
    // SAFETY: GpuPointer::new's caller vouched that the range is device memory of this GPU that
    // outlives the region, which owns the DeviceBuffer made here.
    unsafe { DeviceBuffer::from_raw(ctx, p.ptr(), len) }
}

/// Page-locks host memory in place (`cuMemHostRegister`, portable). The registration holds a
/// clone of `mem`, so the memory outlives it. Memory someone else owns that its owner
/// page-locked already (the driver answers `CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED`:
/// PyTorch's pinned tensors, `cudaHostAlloc`) is used as it is and left locked.
///
/// Errors: the driver's (`CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED` for gdpath's own memory,
/// ...); empty memory.
pub fn pin_host_memory(
    ctx: &gdpath_cuda::Context,
    mem: &HostMem,
) -> Result<HostRegistration<HostMem>, CudaError> {
    if mem.is_owned() {
        HostRegistration::new(ctx, mem.clone())
    } else {
        HostRegistration::new_or_locked(ctx, mem.clone())
    }
}

/// Registers a region's host memory with UCX (`ucp_mem_map`).
///
/// Module invariant 1: the handle is the region's backend handle, dropped before the region's
/// memory, and every request using one of its clones holds the region.
pub fn ucx_map_host(ctx: &gdpath_ucx::Context, mem: &HostMem) -> Result<MemHandle, UcxError> {
    // SAFETY: `mem.len()` bytes at `mem.as_ptr()` are host memory that outlives the handle by
    // module invariant 1.
    unsafe { MemHandle::map(ctx, mem.as_ptr(), mem.len(), MemType::Host) }
}

/// Registers a region's GPU memory with UCX (`ucp_mem_map`, type detected as CUDA).
///
/// Module invariant 1, as [`ucx_map_host`].
pub fn ucx_map_device(
    ctx: &gdpath_ucx::Context,
    dev: &DeviceBuffer,
) -> Result<MemHandle, UcxError> {
    // SAFETY: the device buffer is `len` bytes of CUDA memory owned by (or borrowed for) the
    // region, which outlives the handle by module invariant 1.
    unsafe { MemHandle::map(ctx, dev.device_ptr() as *mut u8, dev.len(), MemType::Cuda) }
}

/// Registers a pinned staging buffer with UCX (`ucp_mem_map`).
///
/// The caller keeps the handle and `buf` together and drops the handle first, and gives the pair
/// back for reuse only once no request uses a clone of the handle (the network backend's
/// `Stage`, module invariant 1).
///
/// Errors: [`UcxError`] from the mapping; a pinned buffer busy with a stream (as UCX error
/// `InvalidArgument`, never the case for a buffer just taken from the pool).
pub fn ucx_map_pinned(
    ctx: &gdpath_ucx::Context,
    buf: &mut PinnedHostBuffer,
) -> Result<MemHandle, UcxError> {
    let len = buf.len();
    let ptr = buf
        .as_mut_slice()
        .map_err(|e| UcxError::InvalidArgument(format!("staging buffer: {e}")))?
        .as_mut_ptr();
    // SAFETY: `len` bytes of pinned memory at `ptr`, owned by `buf`, which outlives the handle
    // (the caller's contract above).
    unsafe { MemHandle::map(ctx, ptr, len, MemType::Host) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocations_are_aligned_zeroed_and_sized() {
        // Below and above MAP_MIN (a mapping, from the kernel's zero pages), and a length that
        // is not a multiple of the page.
        for (len, align) in [
            (0usize, 4096usize),
            (1, 4096),
            (4097, 4096),
            (100, 64),
            (MAP_MIN, 4096),
            (3 * MAP_MIN + 5, 4096),
        ] {
            let mut b = AlignedBuf::zeroed(len, align);
            assert_eq!(b.len(), len);
            assert_eq!(b.as_ptr() as usize % align, 0, "len {len}");
            assert!(b.as_slice().iter().all(|&x| x == 0));
            assert_eq!(b.mapped, len >= MAP_MIN, "len {len}");
            if let Some(last) = b.as_mut_slice().last_mut() {
                *last = 7;
                assert_eq!(b.as_slice()[len - 1], 7);
            }
        }
        assert!(AlignedBuf::try_zeroed(usize::MAX, 4096).is_none());
        assert!(
            AlignedBuf::try_zeroed(16, 3).is_none(),
            "alignment not a power of two"
        );
    }

    #[test]
    fn raw_copies_check_their_ranges_and_allow_overlap() {
        let m = HostMem::new(AlignedBuf::zeroed(8, 8));
        m.copy_in(2, b"abcd").unwrap();
        let mut out = [0u8; 8];
        m.copy_out(0, &mut out).unwrap();
        assert_eq!(&out, b"\0\0abcd\0\0");
        // Overlapping move within one memory, like memmove.
        HostMem::copy(&m, 2, &m, 3, 4).unwrap();
        m.copy_out(0, &mut out).unwrap();
        assert_eq!(&out, b"\0\0aabcd\0");
        let e = m.copy_in(6, b"abc").unwrap_err();
        assert_eq!(
            e,
            RangeError {
                off: 6,
                len: 3,
                mem_len: 8,
                read_only: false,
            }
        );
        assert!(
            m.copy_out(usize::MAX, &mut out).is_err(),
            "overflow is refused"
        );
        assert!(HostMem::copy(&m, 0, &m, 5, 4).is_err());
        assert_eq!(m.with_slice(3, 2, |s| s.to_vec()).unwrap(), b"ab");
        m.with_mut_slice(0, 1, |s| s[0] = b'z').unwrap();
        assert_eq!(m.exclusive().unwrap()[0], b'z');
    }

    /// Memory someone else owns: reached in place, its owner dropped with the last handle,
    /// never written when read-only, never given back as an allocation.
    #[test]
    fn borrowed_memory_is_used_in_place_and_its_owner_dropped_last() {
        struct Owner(Arc<std::sync::atomic::AtomicBool>);
        impl Drop for Owner {
            fn drop(&mut self) {
                self.0.store(true, std::sync::atomic::Ordering::SeqCst);
            }
        }
        let dropped = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut backing = vec![1u8, 2, 3, 4];
        // SAFETY: `backing` outlives every handle (all are dropped below, before it).
        let p = unsafe { HostPointer::new(backing.as_mut_ptr(), backing.len(), true) };
        let m = HostMem::borrowed(p, Some(Box::new(Owner(dropped.clone()))));
        assert!(!m.is_owned() && m.writable());
        assert_eq!(m.as_ptr().cast_const(), backing.as_ptr());
        m.copy_in(1, b"xy").unwrap();
        let io = m.clone();
        let m = m
            .try_unwrap()
            .expect_err("borrowed memory has no allocation to give");
        drop(m);
        assert!(
            !dropped.load(std::sync::atomic::Ordering::SeqCst),
            "a handle is left"
        );
        drop(io);
        assert!(dropped.load(std::sync::atomic::Ordering::SeqCst));
        assert_eq!(backing, [1, b'x', b'y', 4]);

        // SAFETY: as above.
        let ro = HostMem::borrowed(
            unsafe { HostPointer::new(backing.as_mut_ptr(), backing.len(), false) },
            None,
        );
        let e = ro.copy_in(0, b"z").unwrap_err();
        assert!(e.read_only && e.to_string().contains("read-only"), "{e}");
        assert!(ro.with_mut_slice(0, 1, |_| ()).unwrap_err().read_only);
        assert!(HostMem::copy(&ro, 0, &ro, 1, 1).unwrap_err().read_only);
        assert!(ro.exclusive().is_none());
        let mut out = [0u8; 2];
        ro.copy_out(2, &mut out).unwrap();
        assert_eq!(&out, b"y\x04");
        drop(ro);
        assert_eq!(
            backing,
            [1, b'x', b'y', 4],
            "read-only memory was not written"
        );
    }

    #[test]
    fn the_allocation_comes_back_only_from_the_last_handle() {
        let m = HostMem::new(AlignedBuf::zeroed(64, 64));
        let other = m.clone();
        let m = m.try_unwrap().unwrap_err();
        drop(other);
        assert_eq!(m.try_unwrap().unwrap().len(), 64);
    }
}
