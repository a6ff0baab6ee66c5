//! Device memory, pinned host memory and registered host memory, as RAII types.
//!
//! Lifetime rule: every asynchronous operation a [`crate::Stream`] enqueues holds a reference
//! (an `Arc`) to each buffer it touches until that stream is synchronized, so dropping a buffer
//! while the GPU still uses it only drops the caller's handle; the memory is freed after the
//! stream's [`crate::Stream::synchronize`] (which `Stream`'s `Drop` also does).
//!
//! Host access rule: the CPU may read a host buffer only while no stream is still writing into it
//! (device-to-host copy in flight), and write it only while no stream holds it at all. The
//! accessors check this and return [`CudaError::BufferBusy`] rather than hand out a slice the DMA
//! engine may be changing.

use std::ffi::c_void;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::context::Context;
use crate::driver::call;
use crate::driver::sys::{
    CUdeviceptr, CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, CU_MEMHOST_PORTABLE,
};
use crate::error::CudaError;

/// Check that `[offset, offset + len)` lies inside a buffer of `buf_len` bytes. Pure: called by
/// every copy, memset and cuFile I/O before the driver sees the range.
///
/// Errors: [`CudaError::InvalidArgument`] naming `what`, the range and the buffer length, for an
/// out-of-bounds range or an `offset + len` that overflows.
pub fn check_range(what: &str, buf_len: usize, offset: usize, len: usize) -> Result<(), CudaError> {
    match offset.checked_add(len) {
        Some(end) if end <= buf_len => Ok(()),
        Some(end) => Err(CudaError::InvalidArgument(format!(
            "{what}: range {offset}..{end} ({len} bytes) exceeds the buffer's {buf_len} bytes"
        ))),
        None => Err(CudaError::InvalidArgument(format!(
            "{what}: offset {offset} + length {len} overflows"
        ))),
    }
}

// ---------------------------------------------------------------------------------------------
// Device memory
// ---------------------------------------------------------------------------------------------

/// Device memory from `cuMemAlloc_v2`, freed with `cuMemFree_v2` when the last reference (this
/// handle or an in-flight stream operation) goes. `Send + Sync`.
pub struct DeviceBuffer {
    pub(crate) inner: Arc<DevMem>,
}

pub(crate) struct DevMem {
    pub(crate) ctx: Context,
    pub(crate) ptr: CUdeviceptr,
    pub(crate) len: usize,
    /// False for memory borrowed with [`DeviceBuffer::from_raw`]: never freed here.
    pub(crate) owned: bool,
    /// True for another process's memory opened from its IPC handle ([`crate::IpcMemHandle`]):
    /// closed with `cuIpcCloseMemHandle`, never freed here.
    pub(crate) ipc: bool,
}

impl Drop for DevMem {
    fn drop(&mut self) {
        if self.ipc {
            // SAFETY: ptr came from cuIpcOpenMemHandle in this context; no stream holds it any
            // more, and this is its last handle.
            unsafe { close_ipc_mapping(&self.ctx, self.ptr) };
            return;
        }
        if !self.owned {
            return;
        }
        let r = self.ctx.bind().and_then(|()| {
            // SAFETY: ptr came from cuMemAlloc in this context; no stream holds it any more.
            unsafe { call::mem_free(self.ctx.api(), self.ptr) }
        });
        if let Err(e) = r {
            crate::error::log_teardown("freeing device memory", Some(self.ctx.ordinal()), &e);
        }
    }
}

/// Close an IPC mapping (`cuIpcCloseMemHandle`); errors are logged (called while dropping).
///
/// # Safety
/// `ptr` came from `cuIpcOpenMemHandle` in `ctx`, is closed once, and nothing uses it after.
pub(crate) unsafe fn close_ipc_mapping(ctx: &Context, ptr: CUdeviceptr) {
    let r = ctx.bind().and_then(|()| {
        // SAFETY: the caller's contract.
        unsafe { call::ipc_close_mem_handle(ctx.api(), ptr) }
    });
    if let Err(e) = r {
        crate::error::log_teardown("closing an IPC memory mapping", Some(ctx.ordinal()), &e);
    }
}

impl std::fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("ordinal", &self.ordinal())
            .field("ptr", &format_args!("{:#x}", self.device_ptr()))
            .field("len", &self.len())
            .finish()
    }
}

impl DeviceBuffer {
    /// Allocate `len` bytes on `ctx`'s device. Contents are undefined until written.
    ///
    /// Errors: `InvalidArgument` for `len == 0`; the driver's `CUDA_ERROR_OUT_OF_MEMORY`.
    pub fn new(ctx: &Context, len: usize) -> Result<DeviceBuffer, CudaError> {
        if len == 0 {
            return Err(CudaError::InvalidArgument(
                "device allocation of 0 bytes".into(),
            ));
        }
        ctx.bind()?;
        let ptr = call::mem_alloc(ctx.api(), len)?;
        Ok(DeviceBuffer::wrap(ctx, ptr, len, true, false))
    }

    /// The handle over `[ptr, ptr + len)` of `ctx`; freed on drop when `owned`, closed as an
    /// IPC mapping when `ipc`.
    pub(crate) fn wrap(ctx: &Context, ptr: u64, len: usize, owned: bool, ipc: bool) -> Self {
        DeviceBuffer {
            inner: Arc::new(DevMem {
                ctx: ctx.clone(),
                ptr,
                len,
                owned,
                ipc,
            }),
        }
    }

    /// Wrap device memory allocated elsewhere (PyTorch, cupy, NCCL, `cudaMalloc`) so streams can
    /// copy to and from it. The wrapper never frees the memory.
    ///
    /// Errors: `InvalidArgument` for `len == 0`, a null pointer, or an address range that
    /// overflows.
    ///
    /// # Safety
    /// `[ptr, ptr + len)` must be device memory usable in `ctx` (allocated on its device, or
    /// mapped into it) that stays allocated for as long as this value, any clone of its context
    /// use, and every stream operation enqueued on it lives (synchronize before freeing).
    pub unsafe fn from_raw(ctx: &Context, ptr: u64, len: usize) -> Result<DeviceBuffer, CudaError> {
        if len == 0 || ptr == 0 {
            return Err(CudaError::InvalidArgument(format!(
                "device memory at {ptr:#x} of {len} bytes: null pointer or empty range"
            )));
        }
        if ptr.checked_add(len as u64).is_none() {
            return Err(CudaError::InvalidArgument(format!(
                "device memory at {ptr:#x} of {len} bytes overflows the address space"
            )));
        }
        Ok(DeviceBuffer::wrap(ctx, ptr, len, false, false))
    }

    /// Whether the memory was allocated by [`DeviceBuffer::new`] (and is freed with the last
    /// reference) rather than borrowed with [`DeviceBuffer::from_raw`].
    pub fn is_owned(&self) -> bool {
        self.inner.owned
    }

    /// Whether this is another process's memory opened from its CUDA IPC handle
    /// ([`crate::IpcMemHandle::open`]); the mapping is closed with the last reference.
    pub fn is_ipc_mapping(&self) -> bool {
        self.inner.ipc
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.inner.len
    }

    /// Always false: zero-length buffers cannot be made.
    pub fn is_empty(&self) -> bool {
        self.inner.len == 0
    }

    /// The device address (`CUdeviceptr`), for cuFile, UCX or NCCL. Valid while `self` lives.
    pub fn device_ptr(&self) -> u64 {
        self.inner.ptr
    }

    /// CUDA ordinal of the device holding the memory.
    pub fn ordinal(&self) -> u32 {
        self.inner.ctx.ordinal()
    }

    /// The device address of byte `off` (unchecked: callers check ranges with [`check_range`]).
    pub(crate) fn at(&self, off: usize) -> CUdeviceptr {
        self.inner.ptr + off as u64
    }

    /// The context the memory was allocated in.
    pub fn context(&self) -> &Context {
        &self.inner.ctx
    }
}

// ---------------------------------------------------------------------------------------------
// Host memory visible to the GPU
// ---------------------------------------------------------------------------------------------

mod sealed {
    use std::sync::atomic::AtomicUsize;
    use std::sync::Arc;

    /// What a stream keeps of a host buffer while an operation on it is in flight.
    pub trait HostKeep: Send + Sync {
        /// Number of in-flight operations writing into the buffer (device-to-host copies).
        fn writers(&self) -> &AtomicUsize;
    }

    /// A host range a stream may DMA from or into: start and what keeps it alive.
    pub struct HostRegion {
        pub(crate) ptr: *mut u8,
        pub(crate) keep: Arc<dyn HostKeep>,
    }

    /// Seals [`super::PinnedHost`]: only this crate's buffers implement it.
    pub trait Sealed {
        fn region(&self) -> HostRegion;
    }
}

pub(crate) use sealed::{HostKeep, HostRegion};

/// Page-locked host memory that copies can use asynchronously: [`PinnedHostBuffer`] and
/// [`HostRegistration`]. Sealed: implemented only by this crate's types.
pub trait PinnedHost: sealed::Sealed {
    /// Length in bytes.
    fn len(&self) -> usize;
    /// Whether the length is zero (never, for this crate's types).
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Start address, for handing to UCX or cuFile.
    fn host_ptr(&self) -> *const u8;
}

/// Host memory the GPU can reach, shared by its buffer and the streams that use it: where it
/// is, how many copies in flight write into it, and how it leaves the GPU's reach (`R`).
struct HostMem<R: Release> {
    ctx: Context,
    ptr: *mut u8,
    len: usize,
    writers: AtomicUsize,
    release: R,
}

/// How host memory stops being page-locked when its last holder goes.
trait Release: Send + Sync {
    /// Free or unregister `ptr` in `ctx`; errors are logged (this runs while dropping).
    fn release(&mut self, ctx: &Context, ptr: *mut u8);
}

// SAFETY: the pointer is to page-locked memory owned through `release`, which is Send + Sync;
// access is guarded as described in the module documentation.
unsafe impl<R: Release> Send for HostMem<R> {}
// SAFETY: as above.
unsafe impl<R: Release> Sync for HostMem<R> {}

impl<R: Release> HostKeep for HostMem<R> {
    fn writers(&self) -> &AtomicUsize {
        &self.writers
    }
}

impl<R: Release> Drop for HostMem<R> {
    fn drop(&mut self) {
        self.release.release(&self.ctx, self.ptr);
    }
}

impl<R: Release + 'static> HostMem<R> {
    fn new(ctx: &Context, ptr: *mut u8, len: usize, release: R) -> Arc<HostMem<R>> {
        Arc::new(HostMem {
            ctx: ctx.clone(),
            ptr,
            len,
            writers: AtomicUsize::new(0),
            release,
        })
    }

    /// The contents, unless a device-to-host copy into them is in flight.
    fn as_slice(&self) -> Result<&[u8], CudaError> {
        if self.writers.load(Ordering::Acquire) != 0 {
            return Err(CudaError::BufferBusy);
        }
        // SAFETY: ptr/len describe memory owned by this value for its life; no DMA writes are
        // in flight (checked above) and none can start while this shared borrow lives, because
        // starting one needs `&mut` of the buffer.
        Ok(unsafe { std::slice::from_raw_parts(self.ptr, self.len) })
    }

    /// The contents to write, unless a stream holds them.
    fn as_mut_slice(this: &mut Arc<HostMem<R>>) -> Result<&mut [u8], CudaError> {
        if Arc::strong_count(this) != 1 {
            return Err(CudaError::BufferBusy);
        }
        // SAFETY: no stream holds the memory (count 1) and the caller holds it mutably.
        Ok(unsafe { std::slice::from_raw_parts_mut(this.ptr, this.len) })
    }

    fn region(this: &Arc<HostMem<R>>) -> HostRegion {
        HostRegion {
            ptr: this.ptr,
            keep: this.clone(),
        }
    }
}

/// The accessors the host buffer types share, over their `inner: Arc<HostMem<_>>`; `$empty`
/// says why a buffer is never empty.
macro_rules! host_buffer {
    ($name:literal, $ty:ty, $empty:literal $(, $g:ident: $bound:path)?) => {
        impl$(<$g: $bound>)? $ty {
            /// Length in bytes.
            pub fn len(&self) -> usize {
                self.inner.len
            }

            #[doc = $empty]
            pub fn is_empty(&self) -> bool {
                self.inner.len == 0
            }

            /// Read the contents. Errors: [`CudaError::BufferBusy`] while a device-to-host copy
            /// into it has not been synchronized.
            pub fn as_slice(&self) -> Result<&[u8], CudaError> {
                self.inner.as_slice()
            }

            /// Write the contents. Errors: [`CudaError::BufferBusy`] while any stream operation
            /// on it has not been synchronized.
            pub fn as_mut_slice(&mut self) -> Result<&mut [u8], CudaError> {
                HostMem::as_mut_slice(&mut self.inner)
            }
        }

        impl$(<$g: $bound>)? sealed::Sealed for $ty {
            fn region(&self) -> HostRegion {
                HostMem::region(&self.inner)
            }
        }

        impl$(<$g: $bound>)? PinnedHost for $ty {
            fn len(&self) -> usize {
                self.inner.len
            }
            fn host_ptr(&self) -> *const u8 {
                self.inner.ptr
            }
        }

        impl$(<$g: $bound>)? std::fmt::Debug for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct($name).field("len", &self.inner.len).finish()
            }
        }
    };
}

/// Pinned host memory from `cuMemHostAlloc` (portable: usable with every GPU's context), freed
/// with `cuMemFreeHost`. Use it for staging and bounce buffers. `Send + Sync`.
pub struct PinnedHostBuffer {
    inner: Arc<HostMem<Allocated>>,
}

/// Memory from `cuMemHostAlloc`, freed with `cuMemFreeHost`.
struct Allocated;

impl Release for Allocated {
    fn release(&mut self, ctx: &Context, ptr: *mut u8) {
        let r = ctx.bind().and_then(|()| {
            // SAFETY: ptr came from cuMemHostAlloc; no stream holds it any more.
            unsafe { call::mem_free_host(ctx.api(), ptr as *mut c_void) }
        });
        if let Err(e) = r {
            crate::error::log_teardown("freeing pinned host memory", None, &e);
        }
    }
}

host_buffer!(
    "PinnedHostBuffer",
    PinnedHostBuffer,
    "Always false: zero-length buffers cannot be made."
);

impl PinnedHostBuffer {
    /// Allocate `len` bytes of pinned host memory, zero-filled.
    ///
    /// Errors: `InvalidArgument` for `len == 0`; the driver's out-of-memory error.
    pub fn new(ctx: &Context, len: usize) -> Result<PinnedHostBuffer, CudaError> {
        if len == 0 {
            return Err(CudaError::InvalidArgument(
                "pinned host allocation of 0 bytes".into(),
            ));
        }
        ctx.bind()?;
        let p = call::mem_host_alloc(ctx.api(), len, CU_MEMHOST_PORTABLE)?;
        // SAFETY: fresh allocation of len bytes that nothing else references yet.
        unsafe { std::ptr::write_bytes(p as *mut u8, 0, len) };
        Ok(PinnedHostBuffer {
            inner: HostMem::new(ctx, p as *mut u8, len, Allocated),
        })
    }
}

/// Host memory that can be page-locked in place with `cuMemHostRegister`.
///
/// # Safety
/// `as_mut_ptr()` and `len()` must describe memory that stays valid, at the same address and of
/// the same length, for as long as the value lives, even when the value itself is moved (a heap
/// buffer or a mapping; not an inline array).
pub unsafe trait HostMemory: Send + Sync + 'static {
    /// Start of the memory.
    fn as_mut_ptr(&mut self) -> *mut u8;
    /// Length in bytes.
    fn len(&self) -> usize;
    /// Whether the length is zero.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

// SAFETY: a Vec's heap buffer does not move when the Vec does; we never grow it.
unsafe impl HostMemory for Vec<u8> {
    fn as_mut_ptr(&mut self) -> *mut u8 {
        Vec::as_mut_ptr(self)
    }
    fn len(&self) -> usize {
        Vec::len(self)
    }
}

// SAFETY: a boxed slice's heap buffer does not move when the box does.
unsafe impl HostMemory for Box<[u8]> {
    fn as_mut_ptr(&mut self) -> *mut u8 {
        <[u8]>::as_mut_ptr(self)
    }
    fn len(&self) -> usize {
        <[u8]>::len(self)
    }
}

/// Memory the caller owns and promises to keep alive; see [`HostRegistration::from_raw`].
pub struct RawHostMemory {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the caller of `HostRegistration::from_raw` vouches for the memory.
unsafe impl Send for RawHostMemory {}
// SAFETY: as above.
unsafe impl Sync for RawHostMemory {}

// SAFETY: the caller of `from_raw` guarantees validity and a fixed address.
unsafe impl HostMemory for RawHostMemory {
    fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr
    }
    fn len(&self) -> usize {
        self.len
    }
}

/// Existing host memory page-locked in place (`cuMemHostRegister_v2`, portable), unregistered
/// (`cuMemHostUnregister`) on drop, before the memory itself is dropped. Owns the memory so that
/// it cannot be freed while registered or while a stream uses it. `Send + Sync`.
pub struct HostRegistration<M: HostMemory = Vec<u8>> {
    inner: Arc<HostMem<Registered<M>>>,
}

/// Memory owned by a registration: unregistered (when this registration locked it) before it is
/// dropped or given back.
struct Registered<M> {
    /// False once unregistered, and for memory its owner had page-locked already.
    locked_here: bool,
    /// The memory, until [`HostRegistration::into_inner`] takes it back.
    mem: Option<M>,
}

impl<M: HostMemory> Registered<M> {
    fn unregister(&mut self, ctx: &Context, ptr: *mut u8) -> Result<(), CudaError> {
        if !self.locked_here {
            return Ok(());
        }
        self.locked_here = false;
        ctx.bind()?;
        // SAFETY: ptr was registered by HostRegistration::new and nothing is in flight on it.
        unsafe { call::mem_host_unregister(ctx.api(), ptr as *mut c_void) }
    }
}

impl<M: HostMemory> Release for Registered<M> {
    fn release(&mut self, ctx: &Context, ptr: *mut u8) {
        if let Err(e) = self.unregister(ctx, ptr) {
            crate::error::log_teardown("unregistering host memory", None, &e);
        }
    }
}

host_buffer!(
    "HostRegistration",
    HostRegistration<M>,
    "Always false: empty memory cannot be registered.",
    M: HostMemory
);

impl<M: HostMemory> HostRegistration<M> {
    /// Page-lock `mem` in place and take ownership of it until [`HostRegistration::into_inner`].
    ///
    /// Errors: `InvalidArgument` for empty memory; the driver's error (e.g.
    /// `CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED`) — `mem` is dropped in that case.
    pub fn new(ctx: &Context, mem: M) -> Result<HostRegistration<M>, CudaError> {
        Self::lock(ctx, mem, false)
    }

    /// As [`HostRegistration::new`], for memory its owner may have page-locked already
    /// (PyTorch's pinned memory, `cudaHostAlloc`, another `cudaHostRegister`): where the driver
    /// maps both ends of the range already (`cuMemHostGetDevicePointer`), or answers the
    /// registration with `CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED`, the memory is used as it
    /// is (copies from it are asynchronous DMA all the same) and left locked on drop.
    ///
    /// Errors: as [`HostRegistration::new`], except `CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED`.
    pub fn new_or_locked(ctx: &Context, mem: M) -> Result<HostRegistration<M>, CudaError> {
        Self::lock(ctx, mem, true)
    }

    /// Page-locks `mem` (`cuMemHostRegister_v2`); with `accept_locked`, memory the driver says
    /// is page-locked already (`CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED`) is taken as it is
    /// and left locked on drop.
    fn lock(
        ctx: &Context,
        mut mem: M,
        accept_locked: bool,
    ) -> Result<HostRegistration<M>, CudaError> {
        let len = mem.len();
        if len == 0 {
            return Err(CudaError::InvalidArgument(
                "registration of 0 bytes of host memory".into(),
            ));
        }
        let ptr = mem.as_mut_ptr();
        ctx.bind()?;
        // The driver answers a registration of memory it allocated page-locked
        // (`cuMemHostAlloc`, PyTorch's pinned allocator) with CUDA_ERROR_INVALID_VALUE, not
        // ALREADY_REGISTERED, so foreign memory is asked first whether both ends are page-locked.
        let api = ctx.api();
        let locked_elsewhere = accept_locked && {
            let mapped =
                |p: *mut u8| call::mem_host_get_device_pointer(api, p as *mut c_void).is_ok();
            mapped(ptr) && mapped(ptr.wrapping_add(len - 1))
        };
        let registered = if locked_elsewhere {
            false
        } else {
            // SAFETY: ptr/len describe live memory owned by `mem` (HostMemory contract), which
            // the registration keeps until it unregisters.
            match unsafe {
                call::mem_host_register(api, ptr as *mut c_void, len, CU_MEMHOST_PORTABLE)
            } {
                Ok(()) => true,
                Err(e)
                    if accept_locked
                        && e.cu_result() == Some(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED) =>
                {
                    false
                }
                Err(e) => return Err(e),
            }
        };
        let release = Registered {
            locked_here: registered,
            mem: Some(mem),
        };
        Ok(HostRegistration {
            inner: HostMem::new(ctx, ptr, len, release),
        })
    }

    /// Unregister and give the memory back.
    ///
    /// Errors: [`CudaError::BufferBusy`] if a stream still holds it (the memory then stays
    /// registered and is unregistered and dropped when that stream is synchronized); the
    /// driver's error from `cuMemHostUnregister`.
    pub fn into_inner(self) -> Result<M, CudaError> {
        match Arc::try_unwrap(self.inner) {
            Ok(mut host) => {
                host.release.unregister(&host.ctx, host.ptr)?;
                Ok(host
                    .release
                    .mem
                    .take()
                    .expect("memory present until into_inner"))
            }
            Err(_still_held) => Err(CudaError::BufferBusy),
        }
    }
}

impl HostRegistration<RawHostMemory> {
    /// Register memory this crate does not own (a framework's tensor, an mmap).
    ///
    /// # Safety
    /// `[ptr, ptr + len)` must be valid host memory that outlives the registration and every
    /// stream operation using it (synchronize before freeing it), and must not be accessed by
    /// the CPU in ways that race with copies in flight.
    pub unsafe fn from_raw(
        ctx: &Context,
        ptr: *mut u8,
        len: usize,
    ) -> Result<HostRegistration<RawHostMemory>, CudaError> {
        HostRegistration::new(ctx, RawHostMemory { ptr, len })
    }
}

pub(crate) use sealed::Sealed;

#[cfg(test)]
mod tests {
    use super::check_range;
    use crate::error::CudaError;

    #[test]
    fn ranges_inside_pass() {
        check_range("copy", 4096, 0, 4096).unwrap();
        check_range("copy", 4096, 4095, 1).unwrap();
        check_range("copy", 4096, 4096, 0).unwrap();
        check_range("copy", (1 << 30) + 1, 1 << 30, 1).unwrap();
    }

    #[test]
    fn ranges_outside_fail_with_the_numbers() {
        let e = check_range("H2D destination", 4096, 4095, 2).unwrap_err();
        let CudaError::InvalidArgument(msg) = &e else {
            panic!("wrong kind {e:?}")
        };
        assert!(msg.contains("H2D destination"), "{msg}");
        assert!(msg.contains("4095..4097"), "{msg}");
        assert!(msg.contains("4096 bytes"), "{msg}");
        assert!(check_range("x", 4096, 4097, 0).is_err());
        assert!(check_range("x", 0, 0, 1).is_err());
    }

    #[test]
    fn overflow_is_an_error_not_a_wrap() {
        let e = check_range("x", usize::MAX, usize::MAX, 2).unwrap_err();
        assert!(e.to_string().contains("overflows"), "{e}");
    }
}
