//! Layer 2: one checked function per driver entry point. Each calls the entry through its
//! [`Sym`] and turns the `CUresult` into `Result<_, CudaError>`: a failure is a
//! [`CudaError::Driver`] with the export name that was called (taken from the same [`Sym`], so it
//! cannot name another function) and CUDA's own error name and text.
//!
//! A function is `unsafe` where the driver dereferences or keeps what it is given (host
//! pointers, stream, event, module and function handles, kernel arguments) or where a wrong
//! call frees what others still use; its `# Safety` says what the caller guarantees. Queries of
//! values the driver validates itself (ordinals, device pointers it looks up) are safe. Calls
//! that act on "the current context" need one bound ([`ctx_set_current`]); without one the
//! driver answers `CUDA_ERROR_INVALID_CONTEXT`.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};

use super::sys::{
    BatchFn, BatchV12080, BatchV13000, CUcontext, CUdevice, CUdeviceptr, CUevent, CUfunction,
    CUipcMemHandle, CUmemcpyAttributes, CUmodule, CUresult, CUstream, DriverApi,
    CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED, CUDA_SUCCESS, CU_GET_PROC_ADDRESS_LEGACY_STREAM,
    CU_GET_PROC_ADDRESS_SUCCESS,
};
use crate::error::CudaError;
use crate::loader::Sym;

/// Calls `sym` through `call` and checks the result, naming `sym`'s export.
fn check<F: Copy>(
    api: &DriverApi,
    sym: Sym<F>,
    call: impl FnOnce(F) -> CUresult,
) -> Result<(), CudaError> {
    result(api, sym.name, call(sym.f))
}

/// Calls `sym` through `call` with a pointer to `value` for the entry point to write, and
/// returns what it wrote, naming `sym`'s export on failure.
fn out<T, F: Copy>(
    api: &DriverApi,
    sym: Sym<F>,
    mut value: T,
    call: impl FnOnce(F, &mut T) -> CUresult,
) -> Result<T, CudaError> {
    check(api, sym, |f| call(f, &mut value))?;
    Ok(value)
}

/// `Ok` for `CUDA_SUCCESS`, else a [`CudaError::Driver`] naming `call`, with CUDA's name and
/// text of the code (`cuGetErrorName`, `cuGetErrorString`).
fn result(api: &DriverApi, call: &'static str, r: CUresult) -> Result<(), CudaError> {
    if r == CUDA_SUCCESS {
        return Ok(());
    }
    Err(CudaError::Driver {
        call,
        code: r,
        name: error_text(api.cuGetErrorName, r).unwrap_or_else(|| format!("CUresult {r}")),
        message: error_text(api.cuGetErrorString, r).unwrap_or_else(|| "unknown error".to_string()),
    })
}

/// `cuGetErrorName` or `cuGetErrorString` of `r`, when the driver knows the code.
fn error_text(
    sym: Sym<unsafe extern "C" fn(CUresult, *mut *const c_char) -> CUresult>,
    r: CUresult,
) -> Option<String> {
    let mut p: *const c_char = std::ptr::null();
    // SAFETY: the driver writes a pointer to a static string or returns an error.
    let ok = unsafe { (sym.f)(r, &mut p) } == CUDA_SUCCESS && !p.is_null();
    ok.then(|| {
        // SAFETY: a non-null result is a NUL-terminated static string owned by the driver.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    })
}

/// Read a NUL-terminated string the driver wrote into `buf`.
fn c_buf_to_string(buf: &[c_char]) -> String {
    let bytes: Vec<u8> = buf
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

// ---------------------------------------------------------------------------------------------
// Driver, devices
// ---------------------------------------------------------------------------------------------

/// `cuInit(0)`; may be called any number of times.
pub(crate) fn init(api: &DriverApi) -> Result<(), CudaError> {
    // SAFETY: flags 0 are the only defined value.
    check(api, api.cuInit, |f| unsafe { f(0) })
}

/// `cuDriverGetVersion`: the CUDA version the driver supports, 1000 times major plus 10 times
/// minor.
pub(crate) fn driver_get_version(api: &DriverApi) -> Result<c_int, CudaError> {
    // SAFETY: out-pointer to a live int.
    out(api, api.cuDriverGetVersion, 0, |f, v| unsafe { f(v) })
}

/// `cuDeviceGetCount`.
pub(crate) fn device_get_count(api: &DriverApi) -> Result<c_int, CudaError> {
    // SAFETY: out-pointer to a live int.
    out(api, api.cuDeviceGetCount, 0, |f, n| unsafe { f(n) })
}

/// `cuDeviceGet`: the handle of device `ordinal` (the driver checks the ordinal).
pub(crate) fn device_get(api: &DriverApi, ordinal: c_int) -> Result<CUdevice, CudaError> {
    // SAFETY: out-pointer to a live int.
    out(api, api.cuDeviceGet, 0, |f, dev| unsafe { f(dev, ordinal) })
}

/// `cuDeviceGetName`.
pub(crate) fn device_get_name(api: &DriverApi, dev: CUdevice) -> Result<String, CudaError> {
    let mut buf = [0 as c_char; 256];
    // SAFETY: a buffer of the stated length.
    check(api, api.cuDeviceGetName, |f| unsafe {
        f(buf.as_mut_ptr(), buf.len() as c_int, dev)
    })?;
    Ok(c_buf_to_string(&buf))
}

/// `cuDeviceTotalMem_v2`: device memory in bytes.
pub(crate) fn device_total_mem(api: &DriverApi, dev: CUdevice) -> Result<usize, CudaError> {
    // SAFETY: out-pointer to a live usize.
    out(api, api.cuDeviceTotalMem, 0, |f, n| unsafe { f(n, dev) })
}

/// `cuDeviceGetAttribute`; an attribute the driver does not know is an error, not UB.
pub(crate) fn device_get_attribute(
    api: &DriverApi,
    attr: c_int,
    dev: CUdevice,
) -> Result<c_int, CudaError> {
    // SAFETY: out-pointer to a live int.
    out(api, api.cuDeviceGetAttribute, 0, |f, v| unsafe {
        f(v, attr, dev)
    })
}

/// `cuDeviceGetPCIBusId`, as the driver prints it (`0000:00:06.0`).
pub(crate) fn device_get_pci_bus_id(api: &DriverApi, dev: CUdevice) -> Result<String, CudaError> {
    let mut buf = [0 as c_char; 64];
    // SAFETY: a buffer of the stated length.
    check(api, api.cuDeviceGetPCIBusId, |f| unsafe {
        f(buf.as_mut_ptr(), buf.len() as c_int, dev)
    })?;
    Ok(c_buf_to_string(&buf))
}

/// `cuDeviceCanAccessPeer(dev, peer)`.
pub(crate) fn device_can_access_peer(
    api: &DriverApi,
    dev: CUdevice,
    peer: CUdevice,
) -> Result<bool, CudaError> {
    // SAFETY: out-pointer to a live int.
    out(api, api.cuDeviceCanAccessPeer, 0, |f, v| unsafe {
        f(v, dev, peer)
    })
    .map(|v| v != 0)
}

/// `cuDeviceGetP2PAttribute(attr, dev, peer)`.
pub(crate) fn device_get_p2p_attribute(
    api: &DriverApi,
    attr: c_int,
    dev: CUdevice,
    peer: CUdevice,
) -> Result<c_int, CudaError> {
    // SAFETY: out-pointer to a live int.
    out(api, api.cuDeviceGetP2PAttribute, 0, |f, v| unsafe {
        f(v, attr, dev, peer)
    })
}

// ---------------------------------------------------------------------------------------------
// Contexts
// ---------------------------------------------------------------------------------------------

/// `cuDevicePrimaryCtxRetain`: the device's primary context, retained once more.
pub(crate) fn device_primary_ctx_retain(
    api: &DriverApi,
    dev: CUdevice,
) -> Result<CUcontext, CudaError> {
    // SAFETY: out-pointer to a live handle.
    out(
        api,
        api.cuDevicePrimaryCtxRetain,
        std::ptr::null_mut(),
        |f, ctx| unsafe { f(ctx, dev) },
    )
}

/// `cuDevicePrimaryCtxRelease_v2` (or the older export).
///
/// # Safety
/// Balances one successful [`device_primary_ctx_retain`] of `dev`; nothing of this retain is
/// used afterwards (the context may be destroyed).
pub(crate) unsafe fn device_primary_ctx_release(
    api: &DriverApi,
    dev: CUdevice,
) -> Result<(), CudaError> {
    // SAFETY: the caller's contract.
    check(api, api.cuDevicePrimaryCtxRelease, |f| unsafe { f(dev) })
}

/// `cuCtxSetCurrent`: bind `ctx` to the calling thread.
///
/// # Safety
/// `ctx` is a live (retained) context, or null to unbind.
pub(crate) unsafe fn ctx_set_current(api: &DriverApi, ctx: CUcontext) -> Result<(), CudaError> {
    // SAFETY: the caller's contract.
    check(api, api.cuCtxSetCurrent, |f| unsafe { f(ctx) })
}

/// `cuCtxGetCurrent`: the context bound to the calling thread (null for none).
pub(crate) fn ctx_get_current(api: &DriverApi) -> Result<CUcontext, CudaError> {
    // SAFETY: out-pointer to a live handle.
    out(
        api,
        api.cuCtxGetCurrent,
        std::ptr::null_mut(),
        |f, ctx| unsafe { f(ctx) },
    )
}

/// `cuCtxSynchronize`: wait for all work of the current context.
pub(crate) fn ctx_synchronize(api: &DriverApi) -> Result<(), CudaError> {
    // SAFETY: no arguments.
    check(api, api.cuCtxSynchronize, |f| unsafe { f() })
}

/// `cuCtxEnablePeerAccess(peer, 0)` from the current context: `Ok(true)` when this call enabled
/// it, `Ok(false)` when it was enabled already (`CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED`).
///
/// # Safety
/// `peer` is a live (retained) context.
pub(crate) unsafe fn ctx_enable_peer_access(
    api: &DriverApi,
    peer: CUcontext,
) -> Result<bool, CudaError> {
    let sym = api.cuCtxEnablePeerAccess;
    // SAFETY: the caller's contract; flags must be 0.
    match unsafe { (sym.f)(peer, 0) } {
        CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => Ok(false),
        r => result(api, sym.name, r).map(|()| true),
    }
}

// ---------------------------------------------------------------------------------------------
// Memory
// ---------------------------------------------------------------------------------------------

/// `cuMemGetInfo_v2`: (free, total) bytes of the current context's device.
pub(crate) fn mem_get_info(api: &DriverApi) -> Result<(usize, usize), CudaError> {
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: out-pointers to live values.
    check(api, api.cuMemGetInfo, |f| unsafe {
        f(&mut free, &mut total)
    })?;
    Ok((free, total))
}

/// `cuMemAlloc_v2`: `len` bytes of device memory in the current context.
pub(crate) fn mem_alloc(api: &DriverApi, len: usize) -> Result<CUdeviceptr, CudaError> {
    // SAFETY: out-pointer to a live value.
    out(api, api.cuMemAlloc, 0, |f, ptr| unsafe { f(ptr, len) })
}

/// `cuMemFree_v2`.
///
/// # Safety
/// `ptr` came from [`mem_alloc`], is freed once, and no work that uses it is in flight.
pub(crate) unsafe fn mem_free(api: &DriverApi, ptr: CUdeviceptr) -> Result<(), CudaError> {
    // SAFETY: the caller's contract.
    check(api, api.cuMemFree, |f| unsafe { f(ptr) })
}

/// `cuMemHostAlloc`: `len` bytes of pinned host memory with `flags` (`CU_MEMHOST_*`).
pub(crate) fn mem_host_alloc(
    api: &DriverApi,
    len: usize,
    flags: c_uint,
) -> Result<*mut c_void, CudaError> {
    // SAFETY: out-pointer to a live pointer.
    out(
        api,
        api.cuMemHostAlloc,
        std::ptr::null_mut(),
        |f, p| unsafe { f(p, len, flags) },
    )
}

/// `cuMemFreeHost`.
///
/// # Safety
/// `p` came from [`mem_host_alloc`], is freed once, and no work that uses it is in flight.
pub(crate) unsafe fn mem_free_host(api: &DriverApi, p: *mut c_void) -> Result<(), CudaError> {
    // SAFETY: the caller's contract.
    check(api, api.cuMemFreeHost, |f| unsafe { f(p) })
}

/// `cuMemHostRegister_v2`: page-lock `[p, p + len)` with `flags` (`CU_MEMHOST_*`).
///
/// # Safety
/// `[p, p + len)` is live host memory that stays allocated, at the same address, until
/// [`mem_host_unregister`].
pub(crate) unsafe fn mem_host_register(
    api: &DriverApi,
    p: *mut c_void,
    len: usize,
    flags: c_uint,
) -> Result<(), CudaError> {
    // SAFETY: the caller's contract.
    check(api, api.cuMemHostRegister, |f| unsafe { f(p, len, flags) })
}

/// `cuMemHostUnregister`.
///
/// # Safety
/// `p` was registered with [`mem_host_register`] and no work that uses it is in flight.
pub(crate) unsafe fn mem_host_unregister(api: &DriverApi, p: *mut c_void) -> Result<(), CudaError> {
    // SAFETY: the caller's contract.
    check(api, api.cuMemHostUnregister, |f| unsafe { f(p) })
}

/// `cuMemHostGetDevicePointer_v2(p, 0)`: the device address of page-locked host memory at `p`.
/// A query of the address only: the driver looks it up and reads nothing through it.
pub(crate) fn mem_host_get_device_pointer(
    api: &DriverApi,
    p: *mut c_void,
) -> Result<CUdeviceptr, CudaError> {
    // SAFETY: out-pointer to a live value; `p` is only looked up.
    out(api, api.cuMemHostGetDevicePointer, 0, |f, dptr| unsafe {
        f(dptr, p, 0)
    })
}

/// `cuMemGetAddressRange_v2`: (base, size) of the allocation holding `ptr`, which the driver
/// validates.
pub(crate) fn mem_get_address_range(
    api: &DriverApi,
    ptr: CUdeviceptr,
) -> Result<(CUdeviceptr, usize), CudaError> {
    let (mut base, mut size) = (0, 0usize);
    // SAFETY: out-pointers to live values.
    check(api, api.cuMemGetAddressRange, |f| unsafe {
        f(&mut base, &mut size, ptr)
    })?;
    Ok((base, size))
}

// ---------------------------------------------------------------------------------------------
// Streams and events
// ---------------------------------------------------------------------------------------------

/// `cuStreamCreate` in the current context with `flags` (`CU_STREAM_*`).
pub(crate) fn stream_create(api: &DriverApi, flags: c_uint) -> Result<CUstream, CudaError> {
    // SAFETY: out-pointer to a live handle.
    out(
        api,
        api.cuStreamCreate,
        std::ptr::null_mut(),
        |f, s| unsafe { f(s, flags) },
    )
}

/// `cuStreamDestroy_v2`.
///
/// # Safety
/// `s` came from [`stream_create`], is destroyed once and not used afterwards.
pub(crate) unsafe fn stream_destroy(api: &DriverApi, s: CUstream) -> Result<(), CudaError> {
    // SAFETY: the caller's contract.
    check(api, api.cuStreamDestroy, |f| unsafe { f(s) })
}

/// `cuStreamSynchronize`.
///
/// # Safety
/// `s` is a live stream.
pub(crate) unsafe fn stream_synchronize(api: &DriverApi, s: CUstream) -> Result<(), CudaError> {
    // SAFETY: the caller's contract.
    check(api, api.cuStreamSynchronize, |f| unsafe { f(s) })
}

/// `cuStreamWaitEvent(s, e, 0)`: work enqueued on `s` later waits for `e`'s last record.
///
/// # Safety
/// `s` and `e` are live.
pub(crate) unsafe fn stream_wait_event(
    api: &DriverApi,
    s: CUstream,
    e: CUevent,
) -> Result<(), CudaError> {
    // SAFETY: the caller's contract; flags 0 is the only defined value.
    check(api, api.cuStreamWaitEvent, |f| unsafe { f(s, e, 0) })
}

/// `cuEventCreate` in the current context with `flags` (`CU_EVENT_*`).
pub(crate) fn event_create(api: &DriverApi, flags: c_uint) -> Result<CUevent, CudaError> {
    // SAFETY: out-pointer to a live handle.
    out(
        api,
        api.cuEventCreate,
        std::ptr::null_mut(),
        |f, e| unsafe { f(e, flags) },
    )
}

/// `cuEventDestroy_v2`.
///
/// # Safety
/// `e` came from [`event_create`], is destroyed once and not used afterwards.
pub(crate) unsafe fn event_destroy(api: &DriverApi, e: CUevent) -> Result<(), CudaError> {
    // SAFETY: the caller's contract.
    check(api, api.cuEventDestroy, |f| unsafe { f(e) })
}

/// `cuEventRecord(e, s)`.
///
/// # Safety
/// `e` and `s` are live, of the same context.
pub(crate) unsafe fn event_record(
    api: &DriverApi,
    e: CUevent,
    s: CUstream,
) -> Result<(), CudaError> {
    // SAFETY: the caller's contract.
    check(api, api.cuEventRecord, |f| unsafe { f(e, s) })
}

/// `cuEventSynchronize`: wait for the work before `e`'s last record.
///
/// # Safety
/// `e` is live.
pub(crate) unsafe fn event_synchronize(api: &DriverApi, e: CUevent) -> Result<(), CudaError> {
    // SAFETY: the caller's contract.
    check(api, api.cuEventSynchronize, |f| unsafe { f(e) })
}

/// `cuEventElapsedTime_v2` (`cuEventElapsedTime` on drivers before CUDA 12.8): milliseconds
/// between `start` and `end`.
///
/// # Safety
/// Both events are live.
pub(crate) unsafe fn event_elapsed_time(
    api: &DriverApi,
    start: CUevent,
    end: CUevent,
) -> Result<f32, CudaError> {
    // SAFETY: the caller's contract; out-pointer to a live value.
    out(api, api.cuEventElapsedTime, 0f32, |f, ms| unsafe {
        f(ms, start, end)
    })
}

// ---------------------------------------------------------------------------------------------
// Copies
// ---------------------------------------------------------------------------------------------

/// `cuMemcpyHtoDAsync_v2`: `len` bytes from host `src` to device `dst` on `s`.
///
/// # Safety
/// `[dst, dst + len)` is device memory and `[src, src + len)` host memory, both valid until the
/// copy is done (the stream is synchronized past it); `s` is live.
pub(crate) unsafe fn memcpy_htod_async(
    api: &DriverApi,
    dst: CUdeviceptr,
    src: *const c_void,
    len: usize,
    s: CUstream,
) -> Result<(), CudaError> {
    // SAFETY: the caller's contract.
    check(api, api.cuMemcpyHtoDAsync, |f| unsafe {
        f(dst, src, len, s)
    })
}

/// `cuMemcpyDtoHAsync_v2`: `len` bytes from device `src` to host `dst` on `s`.
///
/// # Safety
/// As [`memcpy_htod_async`], and nothing reads or writes `[dst, dst + len)` on the CPU until
/// the copy is done.
pub(crate) unsafe fn memcpy_dtoh_async(
    api: &DriverApi,
    dst: *mut c_void,
    src: CUdeviceptr,
    len: usize,
    s: CUstream,
) -> Result<(), CudaError> {
    // SAFETY: the caller's contract.
    check(api, api.cuMemcpyDtoHAsync, |f| unsafe {
        f(dst, src, len, s)
    })
}

/// `cuMemcpyDtoDAsync_v2`: `len` bytes from device `src` to device `dst` on `s`.
///
/// # Safety
/// Both ranges are device memory of the stream's context, valid until the copy is done; `s` is
/// live.
pub(crate) unsafe fn memcpy_dtod_async(
    api: &DriverApi,
    dst: CUdeviceptr,
    src: CUdeviceptr,
    len: usize,
    s: CUstream,
) -> Result<(), CudaError> {
    // SAFETY: the caller's contract.
    check(api, api.cuMemcpyDtoDAsync, |f| unsafe {
        f(dst, src, len, s)
    })
}

/// `cuMemcpyPeerAsync`: `len` bytes from `src` of context `src_ctx` to `dst` of `dst_ctx` on
/// `s`.
///
/// # Safety
/// Both ranges are device memory of their (live) contexts, valid until the copy is done; `s`
/// is live.
pub(crate) unsafe fn memcpy_peer_async(
    api: &DriverApi,
    (dst, dst_ctx): (CUdeviceptr, CUcontext),
    (src, src_ctx): (CUdeviceptr, CUcontext),
    len: usize,
    s: CUstream,
) -> Result<(), CudaError> {
    // SAFETY: the caller's contract.
    check(api, api.cuMemcpyPeerAsync, |f| unsafe {
        f(dst, dst_ctx, src, src_ctx, len, s)
    })
}

/// `cuMemsetD8Async`: `len` bytes at `dst` set to `value` on `s`.
///
/// # Safety
/// `[dst, dst + len)` is device memory valid until the memset is done; `s` is live.
pub(crate) unsafe fn memset_d8_async(
    api: &DriverApi,
    dst: CUdeviceptr,
    value: u8,
    len: usize,
    s: CUstream,
) -> Result<(), CudaError> {
    // SAFETY: the caller's contract.
    check(api, api.cuMemsetD8Async, |f| unsafe {
        f(dst, value, len, s)
    })
}

/// The host arrays of one batched copy: copy `i` moves `sizes[i]` bytes from `srcs[i]` to
/// `dsts[i]`; `attrs[k]` applies to the copies from `attr_idxs[k]` up to the next entry's.
pub(crate) struct BatchCopies<'a> {
    /// Destination addresses.
    pub(crate) dsts: &'a mut [CUdeviceptr],
    /// Source addresses.
    pub(crate) srcs: &'a mut [CUdeviceptr],
    /// Bytes of each copy.
    pub(crate) sizes: &'a mut [usize],
    /// Attribute entries.
    pub(crate) attrs: &'a mut [CUmemcpyAttributes],
    /// The first copy each attribute entry applies to.
    pub(crate) attr_idxs: &'a mut [usize],
}

/// `cuGetProcAddress_v2("cuMemcpyBatchAsync", version)`, typed as the ABI of `version`: the
/// 13.0 ABI (`cuMemcpyBatchAsync_v2`) for 13000 and above, the 12.8 ABI (with `failIdx`) below.
/// `None` where the driver has no `cuGetProcAddress_v2` (before CUDA 12.0).
///
/// Errors: `(query status, CUresult)` when the driver returns no entry point.
pub(crate) fn memcpy_batch_async_entry(
    api: &DriverApi,
    version: c_int,
) -> Option<Result<BatchFn, (c_int, CUresult)>> {
    let sym = api.cuGetProcAddress?;
    let mut pfn: *mut c_void = std::ptr::null_mut();
    let mut status: c_int = -1;
    // SAFETY: a NUL-terminated name and live out-pointers.
    let r = unsafe {
        (sym.f)(
            c"cuMemcpyBatchAsync".as_ptr(),
            &mut pfn,
            version,
            CU_GET_PROC_ADDRESS_LEGACY_STREAM,
            &mut status,
        )
    };
    if r != CUDA_SUCCESS || status != CU_GET_PROC_ADDRESS_SUCCESS || pfn.is_null() {
        return Some(Err((status, r)));
    }
    // SAFETY: cuGetProcAddress returns the variant whose ABI is that of `version`, whose
    // signature is the one named here (docs/gpu.md, the block-list ABI).
    Some(Ok(unsafe {
        if version >= 13000 {
            BatchFn::V13000(std::mem::transmute::<*mut c_void, BatchV13000>(pfn))
        } else {
            BatchFn::V12080(std::mem::transmute::<*mut c_void, BatchV12080>(pfn))
        }
    }))
}

/// `cuMemcpyBatchAsync` (or `_v2`) of `copies` on `s`. On failure with the 12.8 ABI, which
/// reports the failing copy, the message names its addresses and length.
///
/// # Safety
/// Every copy's ranges are memory the stream's context can access, valid until the batch is
/// done; the arrays have matching lengths (`attrs` as `attr_idxs`); `s` is live.
pub(crate) unsafe fn memcpy_batch_async(
    api: &DriverApi,
    f: BatchFn,
    copies: BatchCopies<'_>,
    s: CUstream,
) -> Result<(), CudaError> {
    let count = copies.dsts.len();
    let mut fail_idx = usize::MAX;
    // SAFETY: the caller's contract; the arrays are live for the call, which only reads them.
    let r = unsafe {
        match f {
            BatchFn::V13000(g) => g(
                copies.dsts.as_mut_ptr(),
                copies.srcs.as_mut_ptr(),
                copies.sizes.as_mut_ptr(),
                count,
                copies.attrs.as_mut_ptr(),
                copies.attr_idxs.as_mut_ptr(),
                copies.attrs.len(),
                s,
            ),
            BatchFn::V12080(g) => g(
                copies.dsts.as_mut_ptr(),
                copies.srcs.as_mut_ptr(),
                copies.sizes.as_mut_ptr(),
                count,
                copies.attrs.as_mut_ptr(),
                copies.attr_idxs.as_mut_ptr(),
                copies.attrs.len(),
                &mut fail_idx,
                s,
            ),
        }
    };
    result(api, f.name(), r).map_err(|e| match e {
        CudaError::Driver {
            call,
            code,
            name,
            message,
        } if fail_idx < count => CudaError::Driver {
            call,
            code,
            name,
            message: format!(
                "{message} (copy {fail_idx} of {count}: {:#x} -> {:#x}, {} bytes)",
                copies.srcs[fail_idx], copies.dsts[fail_idx], copies.sizes[fail_idx]
            ),
        },
        e => e,
    })
}

// ---------------------------------------------------------------------------------------------
// Modules and kernels
// ---------------------------------------------------------------------------------------------

/// `cuModuleLoadData` of PTX text in the current context (the driver JIT-compiles it).
pub(crate) fn module_load_data(api: &DriverApi, ptx: &CStr) -> Result<CUmodule, CudaError> {
    // SAFETY: NUL-terminated text, read during the call only; out-pointer to a live handle.
    out(
        api,
        api.cuModuleLoadData,
        std::ptr::null_mut(),
        |f, m| unsafe { f(m, ptx.as_ptr() as *const c_void) },
    )
}

/// `cuModuleUnload`.
///
/// # Safety
/// `m` came from [`module_load_data`] in the current context, is unloaded once, and none of its
/// functions runs or is used afterwards.
pub(crate) unsafe fn module_unload(api: &DriverApi, m: CUmodule) -> Result<(), CudaError> {
    // SAFETY: the caller's contract.
    check(api, api.cuModuleUnload, |f| unsafe { f(m) })
}

/// `cuModuleGetFunction`: the entry point `name` of `m`.
///
/// # Safety
/// `m` is a loaded module.
pub(crate) unsafe fn module_get_function(
    api: &DriverApi,
    m: CUmodule,
    name: &CStr,
) -> Result<CUfunction, CudaError> {
    // SAFETY: the caller's contract; NUL-terminated name; out-pointer to a live handle.
    out(
        api,
        api.cuModuleGetFunction,
        std::ptr::null_mut(),
        |f, func| unsafe { f(func, m, name.as_ptr()) },
    )
}

/// `cuLaunchKernel` of `func` on `s`: `grid` CTAs of `block` threads (one-dimensional), no
/// dynamic shared memory, `args` pointing at the kernel's parameters in order.
///
/// # Safety
/// `func` is a function of a module loaded in the stream's context; `args` has one pointer per
/// kernel parameter, each to a live value of the parameter's type (the driver copies them
/// before returning); every address the kernel uses stays valid until it has run; `s` is live.
pub(crate) unsafe fn launch_kernel(
    api: &DriverApi,
    func: CUfunction,
    (grid, block): (c_uint, c_uint),
    s: CUstream,
    args: &mut [*mut c_void],
) -> Result<(), CudaError> {
    // SAFETY: the caller's contract.
    check(api, api.cuLaunchKernel, |f| unsafe {
        f(
            func,
            grid,
            1,
            1,
            block,
            1,
            1,
            0,
            s,
            args.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    })
}

/// `cuOccupancyMaxActiveBlocksPerMultiprocessor`: CTAs of `threads` threads of `func` (no
/// dynamic shared memory) that fit on one SM at once.
///
/// # Safety
/// `func` is a function of a loaded module.
pub(crate) unsafe fn occupancy_max_active_blocks_per_multiprocessor(
    api: &DriverApi,
    func: CUfunction,
    threads: c_int,
) -> Result<c_int, CudaError> {
    // SAFETY: the caller's contract; out-pointer to a live int.
    out(
        api,
        api.cuOccupancyMaxActiveBlocksPerMultiprocessor,
        0,
        |f, n| unsafe { f(n, func, threads, 0) },
    )
}

// ---------------------------------------------------------------------------------------------
// IPC
// ---------------------------------------------------------------------------------------------

/// `cuIpcGetMemHandle`: the handle of the allocation starting at `ptr` (the driver validates
/// it).
pub(crate) fn ipc_get_mem_handle(
    api: &DriverApi,
    ptr: CUdeviceptr,
) -> Result<CUipcMemHandle, CudaError> {
    let h = CUipcMemHandle {
        reserved: [0 as c_char; 64],
    };
    // SAFETY: out-pointer to a live handle.
    out(api, api.cuIpcGetMemHandle, h, |f, h| unsafe { f(h, ptr) })
}

/// `cuIpcOpenMemHandle_v2` (or the older export) of `h` with `flags` (`CU_IPC_MEM_*`) in the
/// current context: the base address of the mapping (the driver validates the handle).
pub(crate) fn ipc_open_mem_handle(
    api: &DriverApi,
    h: CUipcMemHandle,
    flags: c_uint,
) -> Result<CUdeviceptr, CudaError> {
    // SAFETY: the handle is passed by value as cuda.h says; out-pointer to a live value.
    out(api, api.cuIpcOpenMemHandle, 0, |f, ptr| unsafe {
        f(ptr, h, flags)
    })
}

/// `cuIpcCloseMemHandle`.
///
/// # Safety
/// `ptr` came from [`ipc_open_mem_handle`] in the current context, is closed once, and no work
/// that uses it is in flight.
pub(crate) unsafe fn ipc_close_mem_handle(
    api: &DriverApi,
    ptr: CUdeviceptr,
) -> Result<(), CudaError> {
    // SAFETY: the caller's contract.
    check(api, api.cuIpcCloseMemHandle, |f| unsafe { f(ptr) })
}
