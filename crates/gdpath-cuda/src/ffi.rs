//! The CUDA driver API entry points gdpath uses, resolved once from `libcuda.so.1`.
//!
//! Our own table rather than cudarc's `driver::sys` (see docs/gpu.md, "Why not cudarc"): every
//! symbol is resolved up front so that a missing one is a [`CudaError::SymbolMissing`] naming it,
//! not a panic at first call; `CUresult` is a plain `i32`, so a code newer than the headers we
//! were written against cannot be an invalid Rust enum value; and the table does not fix a CUDA
//! version at build time.
//!
//! Signatures follow `cuda.h` of CUDA 12.x/13.x; every symbol here exists in CUDA 11.4 drivers
//! (R470) and later, `cuEventElapsedTime_v2` (12.8) excepted, for which the older
//! `cuEventElapsedTime` of identical signature is taken.

#![allow(non_camel_case_types, non_snake_case)]

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::sync::OnceLock;

use crate::error::{CudaError, Library};
use crate::loader::{self, SearchEnv};

pub type CUresult = c_int;
pub type CUdevice = c_int;
pub type CUdeviceptr = u64;
pub type CUcontext = *mut c_void;
pub type CUstream = *mut c_void;
pub type CUevent = *mut c_void;
pub type CUmodule = *mut c_void;
pub type CUfunction = *mut c_void;

pub const CUDA_SUCCESS: CUresult = 0;
/// The driver has shut down: the process is exiting (`cuda.h`).
pub const CUDA_ERROR_DEINITIALIZED: CUresult = 4;
pub const CUDA_ERROR_NO_DEVICE: CUresult = 100;
pub const CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED: CUresult = 704;
/// `cuMemHostRegister` on memory that is already page-locked (registered, or allocated pinned
/// by `cuMemHostAlloc` / `cudaHostAlloc`).
pub const CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED: CUresult = 712;

/// `CU_MEMHOSTALLOC_PORTABLE` / `CU_MEMHOSTREGISTER_PORTABLE`: pinned for every context.
pub const CU_MEMHOST_PORTABLE: c_uint = 1;
pub const CU_STREAM_NON_BLOCKING: c_uint = 1;
pub const CU_EVENT_DEFAULT: c_uint = 0;
pub const CU_EVENT_DISABLE_TIMING: c_uint = 2;

// CUdevice_attribute values (cuda.h).
pub const CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: c_int = 16;
pub const CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: c_int = 41;
pub const CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: c_int = 75;
pub const CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: c_int = 76;
pub const CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED: c_int = 116;
pub const CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED: c_int = 124;

// CUdevice_P2PAttribute values (cuda.h).
pub const CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK: c_int = 1;
pub const CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED: c_int = 2;
pub const CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED: c_int = 3;
pub const CU_DEVICE_P2P_ATTRIBUTE_CUDA_ARRAY_ACCESS_SUPPORTED: c_int = 4;

macro_rules! driver_api {
    ($( $field:ident : fn($($arg:ty),*) = [$($sym:literal),+]; )*) => {
        /// Resolved driver entry points. Lives in a process-wide `OnceLock`, so the library is
        /// never unloaded and the pointers stay valid.
        pub(crate) struct DriverApi {
            _lib: libloading::Library,
            /// What was loaded (name or path), for reports.
            pub loaded_from: String,
            $( pub $field: unsafe extern "C" fn($($arg),*) -> CUresult, )*
        }

        impl DriverApi {
            fn resolve(lib: libloading::Library, loaded_from: String) -> Result<Self, CudaError> {
                $(
                    // SAFETY: the signature is the one in cuda.h for this symbol.
                    let $field = unsafe {
                        loader::symbol::<unsafe extern "C" fn($($arg),*) -> CUresult>(
                            &lib, Library::CudaDriver, &[$($sym),+], "CUDA 11.4 driver (R470) or newer")?
                    };
                )*
                Ok(DriverApi { _lib: lib, loaded_from, $($field,)* })
            }
        }
    };
}

driver_api! {
    cuInit: fn(c_uint) = ["cuInit"];
    cuDriverGetVersion: fn(*mut c_int) = ["cuDriverGetVersion"];
    cuGetErrorName: fn(CUresult, *mut *const c_char) = ["cuGetErrorName"];
    cuGetErrorString: fn(CUresult, *mut *const c_char) = ["cuGetErrorString"];
    cuDeviceGetCount: fn(*mut c_int) = ["cuDeviceGetCount"];
    cuDeviceGet: fn(*mut CUdevice, c_int) = ["cuDeviceGet"];
    cuDeviceGetName: fn(*mut c_char, c_int, CUdevice) = ["cuDeviceGetName"];
    cuDeviceTotalMem: fn(*mut usize, CUdevice) = ["cuDeviceTotalMem_v2"];
    cuDeviceGetAttribute: fn(*mut c_int, c_int, CUdevice) = ["cuDeviceGetAttribute"];
    cuDeviceGetPCIBusId: fn(*mut c_char, c_int, CUdevice) = ["cuDeviceGetPCIBusId"];
    cuDeviceCanAccessPeer: fn(*mut c_int, CUdevice, CUdevice) = ["cuDeviceCanAccessPeer"];
    cuDeviceGetP2PAttribute: fn(*mut c_int, c_int, CUdevice, CUdevice) = ["cuDeviceGetP2PAttribute"];
    cuDevicePrimaryCtxRetain: fn(*mut CUcontext, CUdevice) = ["cuDevicePrimaryCtxRetain"];
    cuDevicePrimaryCtxRelease: fn(CUdevice) = ["cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease"];
    cuCtxSetCurrent: fn(CUcontext) = ["cuCtxSetCurrent"];
    cuCtxGetCurrent: fn(*mut CUcontext) = ["cuCtxGetCurrent"];
    cuCtxSynchronize: fn() = ["cuCtxSynchronize"];
    cuCtxEnablePeerAccess: fn(CUcontext, c_uint) = ["cuCtxEnablePeerAccess"];
    cuMemGetInfo: fn(*mut usize, *mut usize) = ["cuMemGetInfo_v2"];
    cuMemAlloc: fn(*mut CUdeviceptr, usize) = ["cuMemAlloc_v2"];
    cuMemFree: fn(CUdeviceptr) = ["cuMemFree_v2"];
    cuMemHostAlloc: fn(*mut *mut c_void, usize, c_uint) = ["cuMemHostAlloc"];
    cuMemFreeHost: fn(*mut c_void) = ["cuMemFreeHost"];
    cuMemHostRegister: fn(*mut c_void, usize, c_uint) = ["cuMemHostRegister_v2"];
    cuMemHostUnregister: fn(*mut c_void) = ["cuMemHostUnregister"];
    cuStreamCreate: fn(*mut CUstream, c_uint) = ["cuStreamCreate"];
    cuStreamDestroy: fn(CUstream) = ["cuStreamDestroy_v2"];
    cuStreamSynchronize: fn(CUstream) = ["cuStreamSynchronize"];
    cuEventCreate: fn(*mut CUevent, c_uint) = ["cuEventCreate"];
    cuEventDestroy: fn(CUevent) = ["cuEventDestroy_v2"];
    cuEventRecord: fn(CUevent, CUstream) = ["cuEventRecord"];
    cuEventSynchronize: fn(CUevent) = ["cuEventSynchronize"];
    cuStreamWaitEvent: fn(CUstream, CUevent, c_uint) = ["cuStreamWaitEvent"];
    cuEventElapsedTime: fn(*mut f32, CUevent, CUevent) = ["cuEventElapsedTime_v2", "cuEventElapsedTime"];
    cuMemcpyHtoDAsync: fn(CUdeviceptr, *const c_void, usize, CUstream) = ["cuMemcpyHtoDAsync_v2"];
    cuMemcpyDtoHAsync: fn(*mut c_void, CUdeviceptr, usize, CUstream) = ["cuMemcpyDtoHAsync_v2"];
    cuMemcpyDtoDAsync: fn(CUdeviceptr, CUdeviceptr, usize, CUstream) = ["cuMemcpyDtoDAsync_v2"];
    cuMemcpyPeerAsync: fn(CUdeviceptr, CUcontext, CUdeviceptr, CUcontext, usize, CUstream) = ["cuMemcpyPeerAsync"];
    cuMemsetD8Async: fn(CUdeviceptr, u8, usize, CUstream) = ["cuMemsetD8Async"];
    cuModuleLoadData: fn(*mut CUmodule, *const c_void) = ["cuModuleLoadData"];
    cuModuleUnload: fn(CUmodule) = ["cuModuleUnload"];
    cuModuleGetFunction: fn(*mut CUfunction, CUmodule, *const c_char) = ["cuModuleGetFunction"];
    cuLaunchKernel: fn(CUfunction, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, CUstream, *mut *mut c_void, *mut *mut c_void) = ["cuLaunchKernel"];
    // Block-list copies and CUDA IPC (crate::blocks, crate::ipc); all in CUDA 11.4 drivers.
    cuMemHostGetDevicePointer: fn(*mut CUdeviceptr, *mut c_void, c_uint) = ["cuMemHostGetDevicePointer_v2"];
    cuMemGetAddressRange: fn(*mut CUdeviceptr, *mut usize, CUdeviceptr) = ["cuMemGetAddressRange_v2"];
    cuOccupancyMaxActiveBlocksPerMultiprocessor: fn(*mut c_int, CUfunction, c_int, usize) = ["cuOccupancyMaxActiveBlocksPerMultiprocessor"];
    cuIpcGetMemHandle: fn(*mut CUipcMemHandle, CUdeviceptr) = ["cuIpcGetMemHandle"];
    cuIpcOpenMemHandle: fn(*mut CUdeviceptr, CUipcMemHandle, c_uint) = ["cuIpcOpenMemHandle_v2", "cuIpcOpenMemHandle"];
    cuIpcCloseMemHandle: fn(CUdeviceptr) = ["cuIpcCloseMemHandle"];
}

/// The outcome of loading the driver and calling `cuInit(0)`, cached for the process.
pub(crate) struct Loaded {
    pub api: DriverApi,
    /// `cuInit`'s result: `CUDA_ERROR_NO_DEVICE` is not a load failure (zero devices).
    pub init: CUresult,
}

static DRIVER: OnceLock<Result<Loaded, CudaError>> = OnceLock::new();

/// Load `libcuda`, resolve every symbol, call `cuInit(0)`. Cached: later calls return the same.
pub(crate) fn driver() -> Result<&'static Loaded, CudaError> {
    DRIVER
        .get_or_init(|| {
            let env = SearchEnv::from_process(Library::CudaDriver);
            let (lib, from) = loader::open(Library::CudaDriver, &env)?;
            let api = DriverApi::resolve(lib, from.display())?;
            // SAFETY: cuInit takes flags 0 and may be called any number of times.
            let init = unsafe { (api.cuInit)(0) };
            Ok(Loaded { api, init })
        })
        .as_ref()
        .map_err(Clone::clone)
}

impl DriverApi {
    /// Turn a `CUresult` into `Ok` or a [`CudaError::Driver`] with CUDA's name and text.
    pub(crate) fn check(&self, call: &'static str, r: CUresult) -> Result<(), CudaError> {
        if r == CUDA_SUCCESS {
            return Ok(());
        }
        Err(CudaError::Driver {
            call,
            code: r,
            name: self
                .error_text(self.cuGetErrorName, r)
                .unwrap_or_else(|| format!("CUresult {r}")),
            message: self
                .error_text(self.cuGetErrorString, r)
                .unwrap_or_else(|| "unknown error".to_string()),
        })
    }

    fn error_text(
        &self,
        f: unsafe extern "C" fn(CUresult, *mut *const c_char) -> CUresult,
        r: CUresult,
    ) -> Option<String> {
        let mut p: *const c_char = std::ptr::null();
        // SAFETY: the driver writes a pointer to a static string or returns an error.
        let ok = unsafe { f(r, &mut p) } == CUDA_SUCCESS && !p.is_null();
        // SAFETY: non-null result is a NUL-terminated static string owned by the driver.
        ok.then(|| {
            unsafe { std::ffi::CStr::from_ptr(p) }
                .to_string_lossy()
                .into_owned()
        })
    }
}

/// Read a NUL-terminated string the driver wrote into `buf`.
pub(crate) fn c_buf_to_string(buf: &[c_char]) -> String {
    let bytes: Vec<u8> = buf
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// `CUipcMemHandle`: `struct { char reserved[CU_IPC_HANDLE_SIZE]; }` with `CU_IPC_HANDLE_SIZE`
/// 64 (cuda.h); passed to `cuIpcOpenMemHandle_v2` by value.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CUipcMemHandle {
    pub reserved: [c_char; 64],
}

/// `CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS`: map memory of another GPU with peer access enabled on
/// first use (cuda.h, `CUipcMem_flags`).
pub const CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS: c_uint = 1;

impl DriverApi {
    /// Look up `name` in the loaded driver for an entry point that older drivers lack (the
    /// table above requires every one of its symbols). `None` when the driver does not export it.
    ///
    /// # Safety
    /// `F` must be the exact C signature of the symbol.
    pub(crate) unsafe fn optional_symbol<F: Copy>(&self, name: &str) -> Option<F> {
        self._lib.get::<F>(name.as_bytes()).ok().map(|s| *s)
    }
}
