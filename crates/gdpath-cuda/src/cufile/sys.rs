//! Layer 1: the raw cuFile symbols (cufile.h, libcufile 1.x), declared with raw integer codes and
//! resolved at run time from `libcufile.so.0`.

#![allow(non_camel_case_types)]

use std::ffi::{c_int, c_uint, c_void};
use std::sync::OnceLock;

use crate::error::{CudaError, Library};
use crate::loader::{self, symbol_table, SearchEnv};

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
/// Which release first has every required symbol, for [`CudaError::SymbolMissing`].
const NEEDED: &str = "libcufile 1.0 (CUDA 11.4) or newer";

symbol_table! {
    /// libcufile's entry points, resolved once; lives in a process-wide `OnceLock` ([`api`]),
    /// so the library is never unloaded.
    struct Api from Library::CuFile, needs NEEDED;
    required {
        driver_open: unsafe extern "C" fn() -> CUfileError_t = ["cuFileDriverOpen"];
        driver_close: unsafe extern "C" fn() -> CUfileError_t = ["cuFileDriverClose_v2", "cuFileDriverClose"];
        driver_get_properties: unsafe extern "C" fn(*mut CUfileDrvProps_t) -> CUfileError_t = ["cuFileDriverGetProperties"];
        handle_register: unsafe extern "C" fn(*mut CUfileHandle_t, *mut CUfileDescr_t) -> CUfileError_t = ["cuFileHandleRegister"];
        handle_deregister: unsafe extern "C" fn(CUfileHandle_t) = ["cuFileHandleDeregister"];
        buf_register: unsafe extern "C" fn(*const c_void, usize, c_int) -> CUfileError_t = ["cuFileBufRegister"];
        buf_deregister: unsafe extern "C" fn(*const c_void) -> CUfileError_t = ["cuFileBufDeregister"];
        read: unsafe extern "C" fn(CUfileHandle_t, *mut c_void, usize, i64, i64) -> isize = ["cuFileRead"];
        write: unsafe extern "C" fn(CUfileHandle_t, *const c_void, usize, i64, i64) -> isize = ["cuFileWrite"];
    }
    optional {
        /// Older libcufile releases lack it.
        get_version: unsafe extern "C" fn(*mut c_int) -> CUfileError_t = ["cuFileGetVersion"];
    }
}

impl Api {
    fn load() -> Result<Api, CudaError> {
        let env = SearchEnv::from_process(Library::CuFile);
        let (lib, from) = loader::open(Library::CuFile, &env)?;
        Api::resolve(lib, from.display())
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
    }
}
