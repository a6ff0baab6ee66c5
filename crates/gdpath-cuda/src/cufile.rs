//! GPUDirect Storage through cuFile (`libcufile.so.0`), loaded at run time by gdpath itself.
//!
//! Why not cudarc's `cufile` module: its library search never tries `libcufile.so.0` (the SONAME
//! the toolkit and the `nvidia-cufile` wheel ship), it cannot be pointed at a path, its error
//! enum is fixed at build time (the CUDA 12.8 enum ends at 5039 while libcufile 1.15 returns
//! codes up to 5050, which would be an invalid enum value), and a missing symbol panics. The
//! API is small, so this module declares the calls it needs with raw integer codes.
//!
//! All types here are RAII: [`CuFileDriver`] (`cuFileDriverOpen` / `cuFileDriverClose_v2`),
//! [`CuFileBuf`] (`cuFileBufRegister` / `cuFileBufDeregister`), [`CuFileHandle`]
//! (`cuFileHandleRegister` / `cuFileHandleDeregister`), [`CuFileBatch`] (`cuFileBatchIOSetUp` /
//! `cuFileBatchIODestroy`). Each holds what it depends on (`Arc`s), so drop order cannot break it.

#![allow(non_camel_case_types)]

use std::ffi::{c_int, c_uint, c_void};
use std::fs::File;
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex, OnceLock, Weak};

use crate::error::{CudaError, Library};
use crate::loader::{self, SearchEnv};
use crate::memory::{check_range, DevMem, DeviceBuffer};

// ---------------------------------------------------------------------------------------------
// FFI (cufile.h, libcufile 1.x)
// ---------------------------------------------------------------------------------------------

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct CUfileError_t {
    err: c_int,
    cu_err: c_int,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct CUfileDrvPropsNvfs {
    major_version: c_uint,
    minor_version: c_uint,
    poll_thresh_size: usize,
    max_direct_io_size: usize,
    dstatusflags: c_uint,
    dcontrolflags: c_uint,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct CUfileDrvProps_t {
    nvfs: CUfileDrvPropsNvfs,
    fflags: c_uint,
    max_device_cache_size: c_uint,
    per_buffer_cache_size: c_uint,
    max_device_pinned_mem_size: c_uint,
    max_batch_io_size: c_uint,
    max_batch_io_timeout_msecs: c_uint,
}

/// `CU_FILE_HANDLE_TYPE_OPAQUE_FD`.
const HANDLE_TYPE_OPAQUE_FD: c_int = 1;

#[repr(C)]
struct CUfileDescr_t {
    type_: c_int,
    /// The C union { int fd; void *handle; }: pointer-sized, fd in the low bytes.
    handle: CUfileDescrHandle,
    fs_ops: *const c_void,
}

#[repr(C)]
union CUfileDescrHandle {
    fd: c_int,
    handle: *mut c_void,
}

type CUfileHandle_t = *mut c_void;
type CUfileBatchHandle_t = *mut c_void;

#[repr(C)]
#[derive(Clone, Copy)]
struct CUfileIOParamsBatch {
    dev_ptr_base: *mut c_void,
    file_offset: i64,
    dev_ptr_offset: i64,
    size: usize,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct CUfileIOParams_t {
    /// `CUFILE_BATCH` = 1.
    mode: c_int,
    u: CUfileIOParamsBatch,
    fh: CUfileHandle_t,
    /// `CUFILE_READ` = 0, `CUFILE_WRITE` = 1.
    opcode: c_int,
    cookie: *mut c_void,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct CUfileIOEvents_t {
    cookie: *mut c_void,
    status: c_int,
    ret: usize,
}

struct Api {
    _lib: libloading::Library,
    loaded_from: String,
    driver_open: unsafe extern "C" fn() -> CUfileError_t,
    driver_close: unsafe extern "C" fn() -> CUfileError_t,
    driver_get_properties: unsafe extern "C" fn(*mut CUfileDrvProps_t) -> CUfileError_t,
    handle_register: unsafe extern "C" fn(*mut CUfileHandle_t, *mut CUfileDescr_t) -> CUfileError_t,
    handle_deregister: unsafe extern "C" fn(CUfileHandle_t),
    buf_register: unsafe extern "C" fn(*const c_void, usize, c_int) -> CUfileError_t,
    buf_deregister: unsafe extern "C" fn(*const c_void) -> CUfileError_t,
    read: unsafe extern "C" fn(CUfileHandle_t, *mut c_void, usize, i64, i64) -> isize,
    write: unsafe extern "C" fn(CUfileHandle_t, *const c_void, usize, i64, i64) -> isize,
    get_version: Option<unsafe extern "C" fn(*mut c_int) -> CUfileError_t>,
    batch: Option<BatchApi>,
}

#[derive(Clone, Copy)]
struct BatchApi {
    setup: unsafe extern "C" fn(*mut CUfileBatchHandle_t, c_uint) -> CUfileError_t,
    submit: unsafe extern "C" fn(
        CUfileBatchHandle_t,
        c_uint,
        *mut CUfileIOParams_t,
        c_uint,
    ) -> CUfileError_t,
    get_status: unsafe extern "C" fn(
        CUfileBatchHandle_t,
        c_uint,
        *mut c_uint,
        *mut CUfileIOEvents_t,
        *mut libc::timespec,
    ) -> CUfileError_t,
    cancel: unsafe extern "C" fn(CUfileBatchHandle_t) -> CUfileError_t,
    destroy: unsafe extern "C" fn(CUfileBatchHandle_t),
}

const NEEDED: &str = "libcufile 1.0 (CUDA 11.4) or newer";

impl Api {
    fn load() -> Result<Api, CudaError> {
        let env = SearchEnv::from_process(Library::CuFile);
        let (lib, from) = loader::open(Library::CuFile, &env)?;
        let l = Library::CuFile;
        // SAFETY (all below): each type is the cufile.h signature of the symbol.
        unsafe {
            let batch = (|| -> Result<BatchApi, CudaError> {
                Ok(BatchApi {
                    setup: loader::symbol(&lib, l, &["cuFileBatchIOSetUp"], NEEDED)?,
                    submit: loader::symbol(&lib, l, &["cuFileBatchIOSubmit"], NEEDED)?,
                    get_status: loader::symbol(&lib, l, &["cuFileBatchIOGetStatus"], NEEDED)?,
                    cancel: loader::symbol(&lib, l, &["cuFileBatchIOCancel"], NEEDED)?,
                    destroy: loader::symbol(&lib, l, &["cuFileBatchIODestroy"], NEEDED)?,
                })
            })()
            .ok();
            Ok(Api {
                loaded_from: from.display(),
                driver_open: loader::symbol(&lib, l, &["cuFileDriverOpen"], NEEDED)?,
                driver_close: loader::symbol(
                    &lib,
                    l,
                    &["cuFileDriverClose_v2", "cuFileDriverClose"],
                    NEEDED,
                )?,
                driver_get_properties: loader::symbol(
                    &lib,
                    l,
                    &["cuFileDriverGetProperties"],
                    NEEDED,
                )?,
                handle_register: loader::symbol(&lib, l, &["cuFileHandleRegister"], NEEDED)?,
                handle_deregister: loader::symbol(&lib, l, &["cuFileHandleDeregister"], NEEDED)?,
                buf_register: loader::symbol(&lib, l, &["cuFileBufRegister"], NEEDED)?,
                buf_deregister: loader::symbol(&lib, l, &["cuFileBufDeregister"], NEEDED)?,
                read: loader::symbol(&lib, l, &["cuFileRead"], NEEDED)?,
                write: loader::symbol(&lib, l, &["cuFileWrite"], NEEDED)?,
                get_version: loader::symbol(&lib, l, &["cuFileGetVersion"], NEEDED).ok(),
                batch,
                _lib: lib,
            })
        }
    }
}

static API: OnceLock<Result<Api, CudaError>> = OnceLock::new();

fn api() -> Result<&'static Api, CudaError> {
    API.get_or_init(Api::load).as_ref().map_err(Clone::clone)
}

/// Load libcufile (without opening the driver) and say where it came from.
///
/// Errors: [`CudaError::LibraryMissing`] naming `libcufile.so.0` and what installs it;
/// [`CudaError::SymbolMissing`] for a libcufile without the calls above.
pub fn library() -> Result<&'static str, CudaError> {
    api().map(|a| a.loaded_from.as_str())
}

// ---------------------------------------------------------------------------------------------
// Error codes
// ---------------------------------------------------------------------------------------------

/// `CUfileOpError` codes with their names and cuFile's short description of each (the strings
/// cufile.h's `cufileop_status_error` gives, so that messages match NVIDIA's tools and logs).
const CODES: &[(i32, &str, &str)] = &[
    (0, "CU_FILE_SUCCESS", "cufile success"),
    (
        5001,
        "CU_FILE_DRIVER_NOT_INITIALIZED",
        "nvidia-fs driver is not loaded",
    ),
    (5002, "CU_FILE_DRIVER_INVALID_PROPS", "invalid property"),
    (
        5003,
        "CU_FILE_DRIVER_UNSUPPORTED_LIMIT",
        "property range error",
    ),
    (
        5004,
        "CU_FILE_DRIVER_VERSION_MISMATCH",
        "nvidia-fs driver version mismatch",
    ),
    (
        5005,
        "CU_FILE_DRIVER_VERSION_READ_ERROR",
        "nvidia-fs driver version read error",
    ),
    (
        5006,
        "CU_FILE_DRIVER_CLOSING",
        "driver shutdown in progress",
    ),
    (
        5007,
        "CU_FILE_PLATFORM_NOT_SUPPORTED",
        "GPUDirect Storage not supported on current platform",
    ),
    (
        5008,
        "CU_FILE_IO_NOT_SUPPORTED",
        "GPUDirect Storage not supported on current file",
    ),
    (
        5009,
        "CU_FILE_DEVICE_NOT_SUPPORTED",
        "GPUDirect Storage not supported on current GPU",
    ),
    (
        5010,
        "CU_FILE_NVFS_DRIVER_ERROR",
        "nvidia-fs driver ioctl error",
    ),
    (5011, "CU_FILE_CUDA_DRIVER_ERROR", "CUDA Driver API error"),
    (
        5012,
        "CU_FILE_CUDA_POINTER_INVALID",
        "invalid device pointer",
    ),
    (
        5013,
        "CU_FILE_CUDA_MEMORY_TYPE_INVALID",
        "invalid pointer memory type",
    ),
    (
        5014,
        "CU_FILE_CUDA_POINTER_RANGE_ERROR",
        "pointer range exceeds allocated address range",
    ),
    (
        5015,
        "CU_FILE_CUDA_CONTEXT_MISMATCH",
        "cuda context mismatch",
    ),
    (
        5016,
        "CU_FILE_INVALID_MAPPING_SIZE",
        "access beyond maximum pinned size",
    ),
    (
        5017,
        "CU_FILE_INVALID_MAPPING_RANGE",
        "access beyond mapped size",
    ),
    (5018, "CU_FILE_INVALID_FILE_TYPE", "unsupported file type"),
    (
        5019,
        "CU_FILE_INVALID_FILE_OPEN_FLAG",
        "unsupported file open flags",
    ),
    (5020, "CU_FILE_DIO_NOT_SET", "fd direct IO not set"),
    (5022, "CU_FILE_INVALID_VALUE", "invalid arguments"),
    (
        5023,
        "CU_FILE_MEMORY_ALREADY_REGISTERED",
        "device pointer already registered",
    ),
    (
        5024,
        "CU_FILE_MEMORY_NOT_REGISTERED",
        "device pointer lookup failure",
    ),
    (
        5025,
        "CU_FILE_PERMISSION_DENIED",
        "driver or file access error",
    ),
    (
        5026,
        "CU_FILE_DRIVER_ALREADY_OPEN",
        "driver is already open",
    ),
    (
        5027,
        "CU_FILE_HANDLE_NOT_REGISTERED",
        "file descriptor is not registered",
    ),
    (
        5028,
        "CU_FILE_HANDLE_ALREADY_REGISTERED",
        "file descriptor is already registered",
    ),
    (5029, "CU_FILE_DEVICE_NOT_FOUND", "GPU device not found"),
    (5030, "CU_FILE_INTERNAL_ERROR", "internal error"),
    (
        5031,
        "CU_FILE_GETNEWFD_FAILED",
        "failed to obtain new file descriptor",
    ),
    (
        5033,
        "CU_FILE_NVFS_SETUP_ERROR",
        "NVFS driver initialization error",
    ),
    (
        5034,
        "CU_FILE_IO_DISABLED",
        "GPUDirect Storage disabled by config on current file",
    ),
    (
        5035,
        "CU_FILE_BATCH_SUBMIT_FAILED",
        "failed to submit batch operation",
    ),
    (
        5036,
        "CU_FILE_GPU_MEMORY_PINNING_FAILED",
        "failed to allocate pinned GPU memory",
    ),
    (5037, "CU_FILE_BATCH_FULL", "queue full for batch operation"),
    (
        5038,
        "CU_FILE_ASYNC_NOT_SUPPORTED",
        "cuFile stream operation not supported",
    ),
    (
        5039,
        "CU_FILE_INTERNAL_BATCH_SETUP_ERROR",
        "batch setup failed",
    ),
    (
        5040,
        "CU_FILE_INTERNAL_BATCH_SUBMIT_ERROR",
        "batch submit failed",
    ),
    (
        5041,
        "CU_FILE_INTERNAL_BATCH_GETSTATUS_ERROR",
        "batch get status failed",
    ),
    (
        5042,
        "CU_FILE_INTERNAL_BATCH_CANCEL_ERROR",
        "batch cancel failed",
    ),
    (5043, "CU_FILE_NOMEM_ERROR", "out of memory"),
    (5044, "CU_FILE_IO_ERROR", "IO error"),
    (
        5045,
        "CU_FILE_INTERNAL_BUF_REGISTER_ERROR",
        "internal buffer registration error",
    ),
    (5046, "CU_FILE_HASH_OPR_ERROR", "hash operation error"),
    (
        5047,
        "CU_FILE_INVALID_CONTEXT_ERROR",
        "invalid CUDA context",
    ),
    (
        5048,
        "CU_FILE_NVFS_INTERNAL_DRIVER_ERROR",
        "nvidia-fs internal driver error",
    ),
    (
        5049,
        "CU_FILE_BATCH_NOCOMPAT_ERROR",
        "batch I/O not supported in compatibility mode",
    ),
];

/// Name and cuFile's text for a `CUfileOpError` code; unknown codes (from a newer libcufile)
/// get a generic name rather than being misread.
pub fn error_text(code: i32) -> (&'static str, &'static str) {
    CODES
        .iter()
        .find(|(c, _, _)| *c == code)
        .map(|(_, n, t)| (*n, *t))
        .unwrap_or((
            "CU_FILE_UNKNOWN_ERROR",
            "error code unknown to gdpath (newer libcufile?)",
        ))
}

/// Build the typed error for a cuFile call's result code.
pub fn cufile_error(call: &'static str, code: i32, cu_result: i32) -> CudaError {
    let (name, message) = error_text(code);
    CudaError::CuFile {
        call,
        code,
        name,
        message,
        cu_result,
    }
}

fn check(call: &'static str, e: CUfileError_t) -> Result<(), CudaError> {
    if e.err == 0 {
        Ok(())
    } else {
        Err(cufile_error(call, e.err, e.cu_err))
    }
}

/// Interpret `cuFileRead`/`cuFileWrite`'s return: bytes moved, `-1` with `errno`, or the
/// negated `CU_FILE_*` code.
pub fn io_result(call: &'static str, ret: isize, errno: i32) -> Result<usize, CudaError> {
    if ret >= 0 {
        return Ok(ret as usize);
    }
    if ret == -1 {
        return Err(CudaError::CuFileIo {
            call,
            errno,
            message: std::io::Error::from_raw_os_error(errno).to_string(),
        });
    }
    Err(cufile_error(call, (-ret) as i32, 0))
}

// ---------------------------------------------------------------------------------------------
// Driver
// ---------------------------------------------------------------------------------------------

/// An open cuFile driver (`cuFileDriverOpen`); closed (`cuFileDriverClose_v2`) when the last
/// handle, buffer, batch and clone are gone. One per process: [`CuFileDriver::open`] returns the
/// live one if there is one. `Send + Sync`.
#[derive(Clone)]
pub struct CuFileDriver {
    inner: Arc<DriverInner>,
}

struct DriverInner {
    api: &'static Api,
}

impl Drop for DriverInner {
    fn drop(&mut self) {
        // SAFETY: balances the successful open.
        if let Err(e) = check("cuFileDriverClose_v2", unsafe { (self.api.driver_close)() }) {
            tracing::warn!(error = %e, "closing cuFile driver");
        }
    }
}

static LIVE: Mutex<Weak<DriverInner>> = Mutex::new(Weak::new());

/// cuFile driver properties (`cuFileDriverGetProperties`). Sizes are as cufile.h states them:
/// `*_kb` fields are KiB.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CuFileProperties {
    /// nvidia-fs kernel module version, (0, 0) when the module is not loaded.
    pub nvfs_major: u32,
    pub nvfs_minor: u32,
    /// I/O at or below this size is completed by polling when poll mode is on (KiB).
    pub poll_thresh_size_kb: u64,
    /// Largest single direct I/O cuFile issues (KiB).
    pub max_direct_io_size_kb: u64,
    /// Bit set of `CUfileDriverStatusFlags`: which storage kinds the driver supports.
    pub dstatusflags: u32,
    /// Bit set of `CUfileDriverControlFlags`: bit 0 poll mode, bit 1 compatibility mode allowed.
    pub dcontrolflags: u32,
    /// Bit set of `CUfileFeatureFlags`: bit 0 dynamic routing, 1 batch I/O, 2 streams,
    /// 3 parallel I/O.
    pub fflags: u32,
    /// Bounce-buffer cache per GPU (KiB).
    pub max_device_cache_size_kb: u32,
    /// Size of one bounce buffer (KiB).
    pub per_buffer_cache_size_kb: u32,
    /// Largest GPU memory cuFile pins per GPU (KiB).
    pub max_device_pinned_mem_size_kb: u32,
    /// Most entries in one batch.
    pub max_batch_io_size: u32,
    pub max_batch_io_timeout_msecs: u32,
}

/// `CUfileDriverStatusFlags` bit positions and names (cufile.h, CUDA 13.0).
const STATUS_FLAGS: &[(u32, &str)] = &[
    (0, "lustre"),
    (1, "wekafs"),
    (2, "nfs"),
    (3, "gpfs"),
    (4, "nvme"),
    (5, "nvmeof"),
    (6, "scsi"),
    (7, "scaleflux-csd"),
    (8, "nvmesh"),
    (9, "beegfs"),
    (11, "nvme-p2p"),
    (12, "scatefs"),
    (13, "virtiofs"),
];

impl CuFileProperties {
    /// Storage kinds the driver reports support for (names of the set `dstatusflags` bits).
    pub fn supported_storage(&self) -> Vec<&'static str> {
        STATUS_FLAGS
            .iter()
            .filter(|(bit, _)| self.dstatusflags & (1 << bit) != 0)
            .map(|(_, n)| *n)
            .collect()
    }
    /// `CU_FILE_USE_POLL_MODE`.
    pub fn poll_mode(&self) -> bool {
        self.dcontrolflags & 1 != 0
    }
    /// `CU_FILE_ALLOW_COMPAT_MODE`: cuFile falls back to POSIX I/O through bounce buffers when
    /// GDS proper is impossible.
    pub fn compat_mode_allowed(&self) -> bool {
        self.dcontrolflags & 2 != 0
    }
    /// `CU_FILE_BATCH_IO_SUPPORTED`.
    pub fn batch_io_supported(&self) -> bool {
        self.fflags & 2 != 0
    }
    /// Whether the nvidia-fs kernel module answered (version not 0.0).
    pub fn nvfs_loaded(&self) -> bool {
        self.nvfs_major != 0 || self.nvfs_minor != 0
    }
}

impl CuFileDriver {
    /// Load libcufile (see [`crate::loader`]) and open the driver, or return the already open
    /// one. Needs a CUDA context current on this thread for some libcufile versions: pass the
    /// context you will do I/O with.
    ///
    /// Errors: [`CudaError::LibraryMissing`] naming `libcufile.so.0`; [`CudaError::CuFile`] with
    /// cuFile's code and text.
    pub fn open(ctx: &crate::Context) -> Result<CuFileDriver, CudaError> {
        let api = api()?;
        let mut live = LIVE.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(inner) = live.upgrade() {
            return Ok(CuFileDriver { inner });
        }
        ctx.bind()?;
        // SAFETY: no arguments.
        check("cuFileDriverOpen", unsafe { (api.driver_open)() })?;
        let inner = Arc::new(DriverInner { api });
        *live = Arc::downgrade(&inner);
        Ok(CuFileDriver { inner })
    }

    /// Where libcufile was loaded from.
    pub fn loaded_from(&self) -> &str {
        &self.inner.api.loaded_from
    }

    /// `cuFileGetVersion` (e.g. 1150 for libcufile 1.15), if this libcufile has it.
    pub fn version(&self) -> Option<i32> {
        let f = self.inner.api.get_version?;
        let mut v: c_int = 0;
        // SAFETY: out-pointer to a live int.
        check("cuFileGetVersion", unsafe { f(&mut v) }).ok()?;
        Some(v)
    }

    /// `cuFileDriverGetProperties`.
    pub fn properties(&self) -> Result<CuFileProperties, CudaError> {
        let mut p = CUfileDrvProps_t::default();
        // SAFETY: out-pointer to a live struct of cufile.h's layout.
        check("cuFileDriverGetProperties", unsafe {
            (self.inner.api.driver_get_properties)(&mut p)
        })?;
        Ok(CuFileProperties {
            nvfs_major: p.nvfs.major_version,
            nvfs_minor: p.nvfs.minor_version,
            poll_thresh_size_kb: p.nvfs.poll_thresh_size as u64,
            max_direct_io_size_kb: p.nvfs.max_direct_io_size as u64,
            dstatusflags: p.nvfs.dstatusflags,
            dcontrolflags: p.nvfs.dcontrolflags,
            fflags: p.fflags,
            max_device_cache_size_kb: p.max_device_cache_size,
            per_buffer_cache_size_kb: p.per_buffer_cache_size,
            max_device_pinned_mem_size_kb: p.max_device_pinned_mem_size,
            max_batch_io_size: p.max_batch_io_size,
            max_batch_io_timeout_msecs: p.max_batch_io_timeout_msecs,
        })
    }

    /// Whether this libcufile has the batch API.
    pub fn has_batch_api(&self) -> bool {
        self.inner.api.batch.is_some()
    }
}

// ---------------------------------------------------------------------------------------------
// Buffer registration
// ---------------------------------------------------------------------------------------------

/// A device buffer registered with cuFile (`cuFileBufRegister`), so that I/O into it needs no
/// bounce buffer setup per call; deregistered on drop, before the memory can be freed.
pub struct CuFileBuf {
    driver: CuFileDriver,
    mem: Arc<DevMem>,
}

impl CuFileBuf {
    /// Register all of `buf`.
    pub fn register(driver: &CuFileDriver, buf: &DeviceBuffer) -> Result<CuFileBuf, CudaError> {
        buf.context().bind()?;
        // SAFETY: a live device allocation of exactly this length; flags 0.
        check("cuFileBufRegister", unsafe {
            (driver.inner.api.buf_register)(buf.device_ptr() as *const c_void, buf.len(), 0)
        })?;
        Ok(CuFileBuf {
            driver: driver.clone(),
            mem: buf.inner.clone(),
        })
    }
}

impl Drop for CuFileBuf {
    fn drop(&mut self) {
        let _ = self.mem.ctx.bind();
        // SAFETY: registered in `register`; memory still alive (we hold it).
        let r = unsafe { (self.driver.inner.api.buf_deregister)(self.mem.ptr as *const c_void) };
        if let Err(e) = check("cuFileBufDeregister", r) {
            tracing::warn!(error = %e, "deregistering cuFile buffer");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// File handles and I/O
// ---------------------------------------------------------------------------------------------

/// A file registered with cuFile (`cuFileHandleRegister`), deregistered on drop. The file should
/// be opened with `O_DIRECT` (cuFile's GDS path requires it; compatibility mode does not). Holds
/// the file (`Arc<File>`) so the descriptor stays open while registered. `Send + Sync`.
pub struct CuFileHandle {
    driver: CuFileDriver,
    file: Arc<File>,
    raw: CUfileHandle_t,
}

// SAFETY: a cuFile handle may be used from any thread (cuFile is thread-safe per its docs).
unsafe impl Send for CuFileHandle {}
// SAFETY: as above.
unsafe impl Sync for CuFileHandle {}

impl Drop for CuFileHandle {
    fn drop(&mut self) {
        // SAFETY: registered in `register`; the fd is still open (we hold the file).
        unsafe { (self.driver.inner.api.handle_deregister)(self.raw) };
    }
}

impl CuFileHandle {
    /// Register `file`.
    ///
    /// Errors: [`CudaError::CuFile`], e.g. `CU_FILE_HANDLE_NOT_REGISTERED` ("file descriptor is
    /// not registered") where cuFile cannot map the file's block device (the device machine's
    /// virtio disk and tmpfs), or `CU_FILE_DIO_NOT_SET` without `O_DIRECT`.
    pub fn register(driver: &CuFileDriver, file: Arc<File>) -> Result<CuFileHandle, CudaError> {
        let mut descr = CUfileDescr_t {
            type_: HANDLE_TYPE_OPAQUE_FD,
            handle: CUfileDescrHandle {
                handle: std::ptr::null_mut(),
            },
            fs_ops: std::ptr::null(),
        };
        descr.handle.fd = file.as_raw_fd();
        let mut raw: CUfileHandle_t = std::ptr::null_mut();
        // SAFETY: descriptor of an open fd; out-pointer live.
        check("cuFileHandleRegister", unsafe {
            (driver.inner.api.handle_register)(&mut raw, &mut descr)
        })?;
        Ok(CuFileHandle {
            driver: driver.clone(),
            file,
            raw,
        })
    }

    /// The registered file.
    pub fn file(&self) -> &Arc<File> {
        &self.file
    }

    /// Read `len` bytes at `file_off` into `buf[buf_off..]` (`cuFileRead`), blocking. Returns the
    /// bytes read (fewer at end of file).
    pub fn read(
        &self,
        buf: &DeviceBuffer,
        buf_off: usize,
        file_off: u64,
        len: usize,
    ) -> Result<usize, CudaError> {
        check_range("cuFileRead destination", buf.len(), buf_off, len)?;
        let file_off = i64::try_from(file_off)
            .map_err(|_| CudaError::InvalidArgument(format!("file offset {file_off} too large")))?;
        buf.context().bind()?;
        // SAFETY: range checked; buffer alive for the call (borrowed).
        let ret = unsafe {
            (self.driver.inner.api.read)(
                self.raw,
                buf.device_ptr() as *mut c_void,
                len,
                file_off,
                buf_off as i64,
            )
        };
        io_result("cuFileRead", ret, errno())
    }

    /// Write `len` bytes from `buf[buf_off..]` at `file_off` (`cuFileWrite`), blocking. Returns
    /// the bytes written.
    pub fn write(
        &self,
        buf: &DeviceBuffer,
        buf_off: usize,
        file_off: u64,
        len: usize,
    ) -> Result<usize, CudaError> {
        check_range("cuFileWrite source", buf.len(), buf_off, len)?;
        let file_off = i64::try_from(file_off)
            .map_err(|_| CudaError::InvalidArgument(format!("file offset {file_off} too large")))?;
        buf.context().bind()?;
        // SAFETY: range checked; buffer alive for the call.
        let ret = unsafe {
            (self.driver.inner.api.write)(
                self.raw,
                buf.device_ptr() as *const c_void,
                len,
                file_off,
                buf_off as i64,
            )
        };
        io_result("cuFileWrite", ret, errno())
    }
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

// ---------------------------------------------------------------------------------------------
// Batch API
// ---------------------------------------------------------------------------------------------

/// Direction of one batch entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchOp {
    Read,
    Write,
}

/// One entry of a batch: `len` bytes between `handle` at `file_off` and `buf[buf_off..]`.
pub struct BatchIo<'a> {
    pub op: BatchOp,
    pub handle: &'a CuFileHandle,
    pub buf: &'a DeviceBuffer,
    pub buf_off: usize,
    pub file_off: u64,
    pub len: usize,
}

/// Completion of one batch entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchCompletion {
    /// Index of the entry in the `submit` call's slice.
    pub index: usize,
    /// `CUfileStatus_t`: 16 complete, 64 failed, 8 canceled, 32 timeout.
    pub status: i32,
    /// Bytes moved (for a completed entry).
    pub bytes: usize,
}

impl BatchCompletion {
    /// `CUFILE_COMPLETE`.
    pub fn is_complete(&self) -> bool {
        self.status == 16
    }
}

/// A cuFile batch (`cuFileBatchIOSetUp`), destroyed (after cancelling what is in flight) on
/// drop. Keeps the buffers and handles of submitted entries alive until then.
pub struct CuFileBatch {
    driver: CuFileDriver,
    api: BatchApi,
    raw: CUfileBatchHandle_t,
    capacity: usize,
    in_flight: usize,
    keep: Vec<(Arc<DevMem>, CUfileHandle_t)>,
}

impl CuFileBatch {
    /// Set up a batch of at most `capacity` entries in flight.
    ///
    /// Errors: `SymbolMissing` if this libcufile has no batch API; cuFile's error.
    pub fn new(driver: &CuFileDriver, capacity: usize) -> Result<CuFileBatch, CudaError> {
        let api = driver.inner.api.batch.ok_or(CudaError::SymbolMissing {
            library: Library::CuFile,
            symbol: "cuFileBatchIOSetUp",
            needed: "libcufile 1.2 (CUDA 11.6) or newer",
        })?;
        let n = c_uint::try_from(capacity)
            .map_err(|_| CudaError::InvalidArgument(format!("batch of {capacity} entries")))?;
        let mut raw: CUfileBatchHandle_t = std::ptr::null_mut();
        // SAFETY: out-pointer live.
        check("cuFileBatchIOSetUp", unsafe { (api.setup)(&mut raw, n) })?;
        Ok(CuFileBatch {
            driver: driver.clone(),
            api,
            raw,
            capacity,
            in_flight: 0,
            keep: Vec::new(),
        })
    }

    /// Submit entries; their index in `ios` comes back in [`BatchCompletion::index`] (counted
    /// from the first entry ever submitted to this batch).
    pub fn submit(&mut self, ios: &[BatchIo<'_>]) -> Result<(), CudaError> {
        if self.in_flight + ios.len() > self.capacity {
            return Err(CudaError::InvalidArgument(format!(
                "{} entries in flight + {} new exceed the batch's {}",
                self.in_flight,
                ios.len(),
                self.capacity
            )));
        }
        let base = self.keep.len();
        let mut params = Vec::with_capacity(ios.len());
        for (i, io) in ios.iter().enumerate() {
            check_range("cuFile batch buffer", io.buf.len(), io.buf_off, io.len)?;
            params.push(CUfileIOParams_t {
                mode: 1,
                u: CUfileIOParamsBatch {
                    dev_ptr_base: io.buf.device_ptr() as *mut c_void,
                    file_offset: i64::try_from(io.file_off).map_err(|_| {
                        CudaError::InvalidArgument(format!("file offset {} too large", io.file_off))
                    })?,
                    dev_ptr_offset: io.buf_off as i64,
                    size: io.len,
                },
                fh: io.handle.raw,
                opcode: match io.op {
                    BatchOp::Read => 0,
                    BatchOp::Write => 1,
                },
                cookie: (base + i) as *mut c_void,
            });
        }
        if let Some(first) = ios.first() {
            first.buf.context().bind()?;
        }
        // SAFETY: params built above from live buffers and handles, which `keep` holds below.
        check("cuFileBatchIOSubmit", unsafe {
            (self.api.submit)(self.raw, params.len() as c_uint, params.as_mut_ptr(), 0)
        })?;
        for io in ios {
            self.keep.push((io.buf.inner.clone(), io.handle.raw));
        }
        self.in_flight += ios.len();
        Ok(())
    }

    /// Wait for at least `min` completions (or `timeout`), return those that completed.
    pub fn wait(
        &mut self,
        min: usize,
        timeout: std::time::Duration,
    ) -> Result<Vec<BatchCompletion>, CudaError> {
        let max = self.in_flight.max(1);
        let mut events = vec![
            CUfileIOEvents_t {
                cookie: std::ptr::null_mut(),
                status: 0,
                ret: 0,
            };
            max
        ];
        let mut nr = max as c_uint;
        let mut ts = libc::timespec {
            tv_sec: timeout.as_secs() as libc::time_t,
            tv_nsec: timeout.subsec_nanos() as libc::c_long,
        };
        // SAFETY: events has `nr` slots; timespec live.
        check("cuFileBatchIOGetStatus", unsafe {
            (self.api.get_status)(
                self.raw,
                min.min(max) as c_uint,
                &mut nr,
                events.as_mut_ptr(),
                &mut ts,
            )
        })?;
        let done: Vec<BatchCompletion> = events[..(nr as usize).min(max)]
            .iter()
            .map(|e| BatchCompletion {
                index: e.cookie as usize,
                status: e.status,
                bytes: e.ret,
            })
            .collect();
        self.in_flight = self.in_flight.saturating_sub(done.len());
        Ok(done)
    }
}

impl Drop for CuFileBatch {
    fn drop(&mut self) {
        if self.in_flight > 0 {
            // SAFETY: our batch.
            let _ = unsafe { (self.api.cancel)(self.raw) };
        }
        // SAFETY: our batch; nothing uses it afterwards. Buffers in `keep` are dropped after.
        unsafe { (self.api.destroy)(self.raw) };
        let _ = &self.driver;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_text_names_the_code() {
        assert_eq!(
            error_text(5027),
            (
                "CU_FILE_HANDLE_NOT_REGISTERED",
                "file descriptor is not registered"
            )
        );
        assert_eq!(error_text(5020).0, "CU_FILE_DIO_NOT_SET");
        assert_eq!(error_text(9999).0, "CU_FILE_UNKNOWN_ERROR");
        let e = cufile_error("cuFileHandleRegister", 5027, 0);
        let s = e.to_string();
        assert!(s.contains("cuFileHandleRegister"), "{s}");
        assert!(s.contains("file descriptor is not registered"), "{s}");
        assert!(s.contains("5027"), "{s}");
        assert_eq!(e.cufile_code(), Some(5027));
    }

    #[test]
    fn codes_are_unique_and_sorted() {
        for w in CODES.windows(2) {
            assert!(w[0].0 < w[1].0, "{:?} then {:?}", w[0], w[1]);
        }
    }

    #[test]
    fn io_results() {
        assert_eq!(io_result("cuFileRead", 4096, 0).unwrap(), 4096);
        match io_result("cuFileRead", -1, libc::EINVAL) {
            Err(CudaError::CuFileIo { errno, .. }) => assert_eq!(errno, libc::EINVAL),
            other => panic!("{other:?}"),
        }
        match io_result("cuFileRead", -5024, 0) {
            Err(CudaError::CuFile { name, .. }) => {
                assert_eq!(name, "CU_FILE_MEMORY_NOT_REGISTERED")
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn property_flags_decode() {
        let p = CuFileProperties {
            nvfs_major: 0,
            nvfs_minor: 0,
            poll_thresh_size_kb: 4,
            max_direct_io_size_kb: 16384,
            dstatusflags: (1 << 4) | (1 << 2),
            dcontrolflags: 0b10,
            fflags: 0b0110,
            max_device_cache_size_kb: 131072,
            per_buffer_cache_size_kb: 1024,
            max_device_pinned_mem_size_kb: 33554432,
            max_batch_io_size: 128,
            max_batch_io_timeout_msecs: 5,
        };
        assert_eq!(p.supported_storage(), vec!["nfs", "nvme"]);
        assert!(!p.poll_mode());
        assert!(p.compat_mode_allowed());
        assert!(p.batch_io_supported());
        assert!(!p.nvfs_loaded());
    }

    #[test]
    fn ffi_layouts_match_cufile_h() {
        // x86_64 / aarch64 LP64 sizes of the C structs.
        assert_eq!(std::mem::size_of::<CUfileError_t>(), 8);
        assert_eq!(std::mem::size_of::<CUfileDrvPropsNvfs>(), 32);
        assert_eq!(std::mem::size_of::<CUfileDrvProps_t>(), 56);
        assert_eq!(std::mem::size_of::<CUfileDescr_t>(), 24);
        assert_eq!(std::mem::size_of::<CUfileIOParams_t>(), 64);
        assert_eq!(std::mem::size_of::<CUfileIOEvents_t>(), 24);
    }
}
