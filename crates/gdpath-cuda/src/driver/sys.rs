//! Layer 1: the raw CUDA driver API entry points gdpath uses (cuda.h), resolved from
//! `libcuda.so.1`, each with the export name it was found under.
//!
//! Our own table rather than cudarc's `driver::sys` (see docs/gpu.md, "Why not cudarc"): every
//! symbol is resolved up front so that a missing one is a [`CudaError::SymbolMissing`](crate::CudaError::SymbolMissing) naming it,
//! not a panic at first call; `CUresult` is a plain `i32`, so a code newer than the headers we
//! were written against cannot be an invalid Rust enum value; and the table does not fix a CUDA
//! version at build time.
//!
//! Signatures follow `cuda.h` of CUDA 12.x/13.x; every required symbol exists in CUDA 11.4
//! drivers (R470) and later. Where an entry lists several names, the first is the newest ABI and
//! the others older exports of the same signature (`cuEventElapsedTime_v2` of CUDA 12.8, else
//! `cuEventElapsedTime`); each entry records which one the driver had ([`crate::loader::Sym`]),
//! so that an error names the function actually called. The table's fields are visible to the
//! `driver` module only: everything else calls the driver through the checked functions of
//! [`super::call`].

#![allow(non_camel_case_types, non_snake_case)]

use std::ffi::{c_char, c_int, c_uint, c_void};

use crate::error::Library;
use crate::loader::symbol_table;

/// `CUresult`: a status code (`CUDA_SUCCESS` or a `CUDA_ERROR_*`).
pub(crate) type CUresult = c_int;
/// `CUdevice`: a device handle (the driver's ordinal).
pub(crate) type CUdevice = c_int;
/// `CUdeviceptr`: an address in the unified virtual address space.
pub(crate) type CUdeviceptr = u64;
/// `CUcontext`.
pub(crate) type CUcontext = *mut c_void;
/// `CUstream`.
pub(crate) type CUstream = *mut c_void;
/// `CUevent`.
pub(crate) type CUevent = *mut c_void;
/// `CUmodule`.
pub(crate) type CUmodule = *mut c_void;
/// `CUfunction`.
pub(crate) type CUfunction = *mut c_void;

/// `CUDA_SUCCESS`.
pub(crate) const CUDA_SUCCESS: CUresult = 0;
/// `CUDA_ERROR_NO_DEVICE`: `cuInit` found no device (a machine without GPUs, not a failure).
pub(crate) const CUDA_ERROR_NO_DEVICE: CUresult = 100;
/// `CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED`.
pub(crate) const CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED: CUresult = 704;
/// `cuMemHostRegister` on memory that is already page-locked (registered, or allocated pinned
/// by `cuMemHostAlloc` / `cudaHostAlloc`).
pub(crate) const CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED: CUresult = 712;

/// `CU_MEMHOSTALLOC_PORTABLE` / `CU_MEMHOSTREGISTER_PORTABLE`: pinned for every context.
pub(crate) const CU_MEMHOST_PORTABLE: c_uint = 1;
/// `CU_STREAM_NON_BLOCKING`: no implicit synchronization with the legacy default stream.
pub(crate) const CU_STREAM_NON_BLOCKING: c_uint = 1;
/// `CU_EVENT_DEFAULT`: an event that records timing.
pub(crate) const CU_EVENT_DEFAULT: c_uint = 0;
/// `CU_EVENT_DISABLE_TIMING`: an event for ordering only, cheaper to record.
pub(crate) const CU_EVENT_DISABLE_TIMING: c_uint = 2;
/// `CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS`: map memory of another GPU with peer access enabled on
/// first use (`CUipcMem_flags`).
pub(crate) const CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS: c_uint = 1;

// `CUdevice_attribute` values.
pub(crate) const CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: c_int = 16;
pub(crate) const CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: c_int = 75;
pub(crate) const CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: c_int = 76;
pub(crate) const CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED: c_int = 116;
pub(crate) const CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED: c_int = 124;

// `CUdevice_P2PAttribute` values.
pub(crate) const CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK: c_int = 1;
pub(crate) const CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED: c_int = 2;
pub(crate) const CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED: c_int = 3;
pub(crate) const CU_DEVICE_P2P_ATTRIBUTE_CUDA_ARRAY_ACCESS_SUPPORTED: c_int = 4;

/// `CUipcMemHandle`: `struct { char reserved[CU_IPC_HANDLE_SIZE]; }` with `CU_IPC_HANDLE_SIZE`
/// 64; passed to `cuIpcOpenMemHandle_v2` by value.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct CUipcMemHandle {
    pub(crate) reserved: [c_char; 64],
}

/// `CUmemcpySrcAccessOrder::CU_MEMCPY_SRC_ACCESS_ORDER_STREAM` (CUDA 12.8+): the source is read
/// in stream order, as by any other asynchronous copy.
pub(crate) const CU_MEMCPY_SRC_ACCESS_ORDER_STREAM: c_int = 1;
/// `CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE`.
pub(crate) const CU_MEM_LOCATION_TYPE_DEVICE: c_int = 1;
/// `CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST`.
pub(crate) const CU_MEM_LOCATION_TYPE_HOST: c_int = 2;
/// `CUmemcpyFlags::CU_MEMCPY_FLAG_DEFAULT` (CUDA 12.8+).
pub(crate) const CU_MEMCPY_FLAG_DEFAULT: c_uint = 0;
/// `CUmemcpyFlags::CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE` (CUDA 12.8+).
pub(crate) const CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE: c_uint = 1;
/// `CUdriverProcAddress_flags::CU_GET_PROC_ADDRESS_LEGACY_STREAM`: the legacy-default-stream
/// variant (not `_ptsz`); gdpath never passes stream 0, so the two behave the same, and this one
/// is explicit.
pub(crate) const CU_GET_PROC_ADDRESS_LEGACY_STREAM: u64 = 1;
/// `CUdriverProcAddressQueryResult::CU_GET_PROC_ADDRESS_SUCCESS`.
pub(crate) const CU_GET_PROC_ADDRESS_SUCCESS: c_int = 0;

/// `CUmemLocation`: `{ CUmemLocationType type; int id; }`, 8 bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CUmemLocation {
    /// `CU_MEM_LOCATION_TYPE_*`.
    pub(crate) kind: c_int,
    /// The device ordinal, for a device location.
    pub(crate) id: c_int,
}

/// `CUmemcpyAttributes_v1`: `{ CUmemcpySrcAccessOrder srcAccessOrder; CUmemLocation srcLocHint;
/// CUmemLocation dstLocHint; unsigned int flags; }`, 24 bytes, 4-byte aligned (CUDA 12.8+).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CUmemcpyAttributes {
    /// `CU_MEMCPY_SRC_ACCESS_ORDER_*`.
    pub(crate) src_access_order: c_int,
    /// Where the source is.
    pub(crate) src_loc_hint: CUmemLocation,
    /// Where the destination is.
    pub(crate) dst_loc_hint: CUmemLocation,
    /// `CU_MEMCPY_FLAG_*`.
    pub(crate) flags: c_uint,
}

/// `cuMemcpyBatchAsync` of CUDA 12.8 (with `size_t *failIdx`).
pub(crate) type BatchV12080 = unsafe extern "C" fn(
    *mut CUdeviceptr,
    *mut CUdeviceptr,
    *mut usize,
    usize,
    *mut CUmemcpyAttributes,
    *mut usize,
    usize,
    *mut usize,
    CUstream,
) -> CUresult;

/// `cuMemcpyBatchAsync_v2` of CUDA 13.0 (no `failIdx`).
pub(crate) type BatchV13000 = unsafe extern "C" fn(
    *mut CUdeviceptr,
    *mut CUdeviceptr,
    *mut usize,
    usize,
    *mut CUmemcpyAttributes,
    *mut usize,
    usize,
    CUstream,
) -> CUresult;

/// The batched copy as `cuGetProcAddress_v2` resolved it, by the ABI of the version asked for.
#[derive(Clone, Copy)]
pub(crate) enum BatchFn {
    /// The 12.8 ABI, exported as `cuMemcpyBatchAsync`.
    V12080(BatchV12080),
    /// The 13.0 ABI, exported as `cuMemcpyBatchAsync_v2`.
    V13000(BatchV13000),
}

impl BatchFn {
    /// The export name of the entry point, for errors.
    pub(crate) fn name(self) -> &'static str {
        match self {
            BatchFn::V12080(_) => "cuMemcpyBatchAsync",
            BatchFn::V13000(_) => "cuMemcpyBatchAsync_v2",
        }
    }
}

/// Which release first has every required symbol, for [`CudaError::SymbolMissing`](crate::CudaError::SymbolMissing).
const NEEDED: &str = "CUDA 11.4 driver (R470) or newer";

symbol_table! {
    /// The driver's entry points, resolved once; lives in a process-wide `OnceLock`
    /// ([`super::loaded`]), so the library is never unloaded.
    struct DriverApi from Library::CudaDriver, needs NEEDED;
    required {
        cuInit: unsafe extern "C" fn(c_uint) -> CUresult = ["cuInit"];
        cuDriverGetVersion: unsafe extern "C" fn(*mut c_int) -> CUresult = ["cuDriverGetVersion"];
        cuGetErrorName: unsafe extern "C" fn(CUresult, *mut *const c_char) -> CUresult = ["cuGetErrorName"];
        cuGetErrorString: unsafe extern "C" fn(CUresult, *mut *const c_char) -> CUresult = ["cuGetErrorString"];
        cuDeviceGetCount: unsafe extern "C" fn(*mut c_int) -> CUresult = ["cuDeviceGetCount"];
        cuDeviceGet: unsafe extern "C" fn(*mut CUdevice, c_int) -> CUresult = ["cuDeviceGet"];
        cuDeviceGetName: unsafe extern "C" fn(*mut c_char, c_int, CUdevice) -> CUresult = ["cuDeviceGetName"];
        cuDeviceTotalMem: unsafe extern "C" fn(*mut usize, CUdevice) -> CUresult = ["cuDeviceTotalMem_v2"];
        cuDeviceGetAttribute: unsafe extern "C" fn(*mut c_int, c_int, CUdevice) -> CUresult = ["cuDeviceGetAttribute"];
        cuDeviceGetPCIBusId: unsafe extern "C" fn(*mut c_char, c_int, CUdevice) -> CUresult = ["cuDeviceGetPCIBusId"];
        cuDeviceCanAccessPeer: unsafe extern "C" fn(*mut c_int, CUdevice, CUdevice) -> CUresult = ["cuDeviceCanAccessPeer"];
        cuDeviceGetP2PAttribute: unsafe extern "C" fn(*mut c_int, c_int, CUdevice, CUdevice) -> CUresult = ["cuDeviceGetP2PAttribute"];
        cuDevicePrimaryCtxRetain: unsafe extern "C" fn(*mut CUcontext, CUdevice) -> CUresult = ["cuDevicePrimaryCtxRetain"];
        cuDevicePrimaryCtxRelease: unsafe extern "C" fn(CUdevice) -> CUresult = ["cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease"];
        cuCtxSetCurrent: unsafe extern "C" fn(CUcontext) -> CUresult = ["cuCtxSetCurrent"];
        cuCtxGetCurrent: unsafe extern "C" fn(*mut CUcontext) -> CUresult = ["cuCtxGetCurrent"];
        cuCtxSynchronize: unsafe extern "C" fn() -> CUresult = ["cuCtxSynchronize"];
        cuCtxEnablePeerAccess: unsafe extern "C" fn(CUcontext, c_uint) -> CUresult = ["cuCtxEnablePeerAccess"];
        cuMemGetInfo: unsafe extern "C" fn(*mut usize, *mut usize) -> CUresult = ["cuMemGetInfo_v2"];
        cuMemAlloc: unsafe extern "C" fn(*mut CUdeviceptr, usize) -> CUresult = ["cuMemAlloc_v2"];
        cuMemFree: unsafe extern "C" fn(CUdeviceptr) -> CUresult = ["cuMemFree_v2"];
        cuMemHostAlloc: unsafe extern "C" fn(*mut *mut c_void, usize, c_uint) -> CUresult = ["cuMemHostAlloc"];
        cuMemFreeHost: unsafe extern "C" fn(*mut c_void) -> CUresult = ["cuMemFreeHost"];
        cuMemHostRegister: unsafe extern "C" fn(*mut c_void, usize, c_uint) -> CUresult = ["cuMemHostRegister_v2"];
        cuMemHostUnregister: unsafe extern "C" fn(*mut c_void) -> CUresult = ["cuMemHostUnregister"];
        cuMemHostGetDevicePointer: unsafe extern "C" fn(*mut CUdeviceptr, *mut c_void, c_uint) -> CUresult = ["cuMemHostGetDevicePointer_v2"];
        cuMemGetAddressRange: unsafe extern "C" fn(*mut CUdeviceptr, *mut usize, CUdeviceptr) -> CUresult = ["cuMemGetAddressRange_v2"];
        cuStreamCreate: unsafe extern "C" fn(*mut CUstream, c_uint) -> CUresult = ["cuStreamCreate"];
        cuStreamDestroy: unsafe extern "C" fn(CUstream) -> CUresult = ["cuStreamDestroy_v2"];
        cuStreamSynchronize: unsafe extern "C" fn(CUstream) -> CUresult = ["cuStreamSynchronize"];
        cuStreamWaitEvent: unsafe extern "C" fn(CUstream, CUevent, c_uint) -> CUresult = ["cuStreamWaitEvent"];
        cuEventCreate: unsafe extern "C" fn(*mut CUevent, c_uint) -> CUresult = ["cuEventCreate"];
        cuEventDestroy: unsafe extern "C" fn(CUevent) -> CUresult = ["cuEventDestroy_v2"];
        cuEventRecord: unsafe extern "C" fn(CUevent, CUstream) -> CUresult = ["cuEventRecord"];
        cuEventSynchronize: unsafe extern "C" fn(CUevent) -> CUresult = ["cuEventSynchronize"];
        cuEventElapsedTime: unsafe extern "C" fn(*mut f32, CUevent, CUevent) -> CUresult = ["cuEventElapsedTime_v2", "cuEventElapsedTime"];
        cuMemcpyHtoDAsync: unsafe extern "C" fn(CUdeviceptr, *const c_void, usize, CUstream) -> CUresult = ["cuMemcpyHtoDAsync_v2"];
        cuMemcpyDtoHAsync: unsafe extern "C" fn(*mut c_void, CUdeviceptr, usize, CUstream) -> CUresult = ["cuMemcpyDtoHAsync_v2"];
        cuMemcpyDtoDAsync: unsafe extern "C" fn(CUdeviceptr, CUdeviceptr, usize, CUstream) -> CUresult = ["cuMemcpyDtoDAsync_v2"];
        cuMemcpyPeerAsync: unsafe extern "C" fn(CUdeviceptr, CUcontext, CUdeviceptr, CUcontext, usize, CUstream) -> CUresult = ["cuMemcpyPeerAsync"];
        cuMemsetD8Async: unsafe extern "C" fn(CUdeviceptr, u8, usize, CUstream) -> CUresult = ["cuMemsetD8Async"];
        cuModuleLoadData: unsafe extern "C" fn(*mut CUmodule, *const c_void) -> CUresult = ["cuModuleLoadData"];
        cuModuleUnload: unsafe extern "C" fn(CUmodule) -> CUresult = ["cuModuleUnload"];
        cuModuleGetFunction: unsafe extern "C" fn(*mut CUfunction, CUmodule, *const c_char) -> CUresult = ["cuModuleGetFunction"];
        cuLaunchKernel: unsafe extern "C" fn(CUfunction, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, CUstream, *mut *mut c_void, *mut *mut c_void) -> CUresult = ["cuLaunchKernel"];
        cuOccupancyMaxActiveBlocksPerMultiprocessor: unsafe extern "C" fn(*mut c_int, CUfunction, c_int, usize) -> CUresult = ["cuOccupancyMaxActiveBlocksPerMultiprocessor"];
        cuIpcGetMemHandle: unsafe extern "C" fn(*mut CUipcMemHandle, CUdeviceptr) -> CUresult = ["cuIpcGetMemHandle"];
        cuIpcOpenMemHandle: unsafe extern "C" fn(*mut CUdeviceptr, CUipcMemHandle, c_uint) -> CUresult = ["cuIpcOpenMemHandle_v2", "cuIpcOpenMemHandle"];
        cuIpcCloseMemHandle: unsafe extern "C" fn(CUdeviceptr) -> CUresult = ["cuIpcCloseMemHandle"];
    }
    optional {
        /// CUDA 12.0: resolves the versioned batched copy (`crate::blocks`).
        cuGetProcAddress: unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_int) -> CUresult = ["cuGetProcAddress_v2"];
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{align_of, offset_of, size_of};

    /// Layout of cuda.h 12.8/13.0: `CUmemLocation` is two 4-byte fields, and
    /// `CUmemcpyAttributes` is `srcAccessOrder` (an enum, 4 bytes), two locations and a 4-byte
    /// `flags`, with no padding; `CUipcMemHandle` is 64 bytes.
    #[test]
    fn structs_match_cuda_h() {
        assert_eq!(size_of::<CUmemLocation>(), 8);
        assert_eq!(align_of::<CUmemLocation>(), 4);
        assert_eq!(offset_of!(CUmemLocation, id), 4);
        assert_eq!(size_of::<CUmemcpyAttributes>(), 24);
        assert_eq!(align_of::<CUmemcpyAttributes>(), 4);
        assert_eq!(offset_of!(CUmemcpyAttributes, src_access_order), 0);
        assert_eq!(offset_of!(CUmemcpyAttributes, src_loc_hint), 4);
        assert_eq!(offset_of!(CUmemcpyAttributes, dst_loc_hint), 12);
        assert_eq!(offset_of!(CUmemcpyAttributes, flags), 20);
        assert_eq!(size_of::<CUipcMemHandle>(), 64);
    }
}
