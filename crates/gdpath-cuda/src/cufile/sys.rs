//! Layer 1: the raw cuFile symbols (cufile.h, libcufile 1.x), declared with raw integer codes and
//! resolved at run time from `libcufile.so.0`.

#![allow(non_camel_case_types)]

use std::ffi::{c_int, c_uint, c_void};
use std::sync::OnceLock;

use crate::error::{CudaError, Library};
use crate::loader::{self, SearchEnv};

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct CUfileError_t {
    pub(super) err: c_int,
    pub(super) cu_err: c_int,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct CUfileDrvPropsNvfs {
    pub(super) major_version: c_uint,
    pub(super) minor_version: c_uint,
    pub(super) poll_thresh_size: usize,
    pub(super) max_direct_io_size: usize,
    pub(super) dstatusflags: c_uint,
    pub(super) dcontrolflags: c_uint,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct CUfileDrvProps_t {
    pub(super) nvfs: CUfileDrvPropsNvfs,
    pub(super) fflags: c_uint,
    pub(super) max_device_cache_size: c_uint,
    pub(super) per_buffer_cache_size: c_uint,
    pub(super) max_device_pinned_mem_size: c_uint,
    pub(super) max_batch_io_size: c_uint,
    pub(super) max_batch_io_timeout_msecs: c_uint,
}

/// `CU_FILE_HANDLE_TYPE_OPAQUE_FD`.
pub(super) const HANDLE_TYPE_OPAQUE_FD: c_int = 1;

#[repr(C)]
pub(super) struct CUfileDescr_t {
    pub(super) type_: c_int,
    /// The C union { int fd; void *handle; }: pointer-sized, fd in the low bytes.
    pub(super) handle: CUfileDescrHandle,
    pub(super) fs_ops: *const c_void,
}

#[repr(C)]
pub(super) union CUfileDescrHandle {
    pub(super) fd: c_int,
    pub(super) handle: *mut c_void,
}

pub(super) type CUfileHandle_t = *mut c_void;
pub(super) type CUfileBatchHandle_t = *mut c_void;

#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct CUfileIOParamsBatch {
    pub(super) dev_ptr_base: *mut c_void,
    pub(super) file_offset: i64,
    pub(super) dev_ptr_offset: i64,
    pub(super) size: usize,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct CUfileIOParams_t {
    /// `CUFILE_BATCH` = 1.
    pub(super) mode: c_int,
    pub(super) u: CUfileIOParamsBatch,
    pub(super) fh: CUfileHandle_t,
    /// `CUFILE_READ` = 0, `CUFILE_WRITE` = 1.
    pub(super) opcode: c_int,
    pub(super) cookie: *mut c_void,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct CUfileIOEvents_t {
    pub(super) cookie: *mut c_void,
    pub(super) status: c_int,
    pub(super) ret: usize,
}

pub(super) struct Api {
    _lib: libloading::Library,
    pub(super) loaded_from: String,
    pub(super) driver_open: unsafe extern "C" fn() -> CUfileError_t,
    pub(super) driver_close: unsafe extern "C" fn() -> CUfileError_t,
    pub(super) driver_get_properties: unsafe extern "C" fn(*mut CUfileDrvProps_t) -> CUfileError_t,
    pub(super) handle_register:
        unsafe extern "C" fn(*mut CUfileHandle_t, *mut CUfileDescr_t) -> CUfileError_t,
    pub(super) handle_deregister: unsafe extern "C" fn(CUfileHandle_t),
    pub(super) buf_register: unsafe extern "C" fn(*const c_void, usize, c_int) -> CUfileError_t,
    pub(super) buf_deregister: unsafe extern "C" fn(*const c_void) -> CUfileError_t,
    pub(super) read: unsafe extern "C" fn(CUfileHandle_t, *mut c_void, usize, i64, i64) -> isize,
    pub(super) write: unsafe extern "C" fn(CUfileHandle_t, *const c_void, usize, i64, i64) -> isize,
    pub(super) get_version: Option<unsafe extern "C" fn(*mut c_int) -> CUfileError_t>,
    pub(super) batch: Option<BatchApi>,
}

#[derive(Clone, Copy)]
pub(super) struct BatchApi {
    pub(super) setup: unsafe extern "C" fn(*mut CUfileBatchHandle_t, c_uint) -> CUfileError_t,
    pub(super) submit: unsafe extern "C" fn(
        CUfileBatchHandle_t,
        c_uint,
        *mut CUfileIOParams_t,
        c_uint,
    ) -> CUfileError_t,
    pub(super) get_status: unsafe extern "C" fn(
        CUfileBatchHandle_t,
        c_uint,
        *mut c_uint,
        *mut CUfileIOEvents_t,
        *mut libc::timespec,
    ) -> CUfileError_t,
    pub(super) cancel: unsafe extern "C" fn(CUfileBatchHandle_t) -> CUfileError_t,
    pub(super) destroy: unsafe extern "C" fn(CUfileBatchHandle_t),
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

pub(super) fn api() -> Result<&'static Api, CudaError> {
    API.get_or_init(Api::load).as_ref().map_err(Clone::clone)
}

/// Load libcufile (without opening the driver) and say where it came from.
///
/// Errors: [`CudaError::LibraryMissing`] naming `libcufile.so.0` and what installs it;
/// [`CudaError::SymbolMissing`] for a libcufile without the calls above.
pub fn library() -> Result<&'static str, CudaError> {
    api().map(|a| a.loaded_from.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

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
