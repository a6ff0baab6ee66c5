//! Layer 2: one wrapper per raw cuFile call, each turning the call's result into
//! `Result<_, CudaError>` with cuFile's code and text and the export name that was called (taken
//! from the same [`Sym`] as the function, so it cannot name another). The wrappers whose
//! arguments the library dereferences or keeps (device pointers, registered handles) are
//! `unsafe`; the RAII types of layer 3 ([`super::driver`], [`super::handle`]) hold what makes each
//! call sound.

use std::ffi::{c_int, c_void};

use super::codes::cufile_error;
use super::sys::{
    Api, CUfileDescrHandle, CUfileDescr_t, CUfileDrvProps_t, CUfileError_t, CUfileHandle_t,
    HANDLE_TYPE_OPAQUE_FD,
};
use crate::error::CudaError;
use crate::loader::Sym;

/// Calls `sym` through `call` and checks its `CUfileError_t`, naming `sym`'s export.
fn check<F: Copy>(sym: Sym<F>, call: impl FnOnce(F) -> CUfileError_t) -> Result<(), CudaError> {
    let e = call(sym.f);
    if e.err == 0 {
        Ok(())
    } else {
        Err(cufile_error(sym.name, e.err, e.cu_err))
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

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// `cuFileDriverOpen`.
pub(super) fn driver_open(api: &Api) -> Result<(), CudaError> {
    // SAFETY: no arguments.
    check(api.driver_open, |f| unsafe { f() })
}

/// `cuFileDriverClose_v2` (or the older export).
///
/// # Safety
/// Balances one successful [`driver_open`]; nothing registered with the driver is used after.
pub(super) unsafe fn driver_close(api: &Api) -> Result<(), CudaError> {
    // SAFETY: the caller's contract.
    check(api.driver_close, |f| unsafe { f() })
}

/// `cuFileDriverGetProperties`.
pub(super) fn driver_properties(api: &Api) -> Result<CUfileDrvProps_t, CudaError> {
    let mut p = CUfileDrvProps_t::default();
    // SAFETY: out-pointer to a live struct of cufile.h's layout.
    check(api.driver_get_properties, |f| unsafe { f(&mut p) })?;
    Ok(p)
}

/// `cuFileGetVersion`, if this libcufile has it.
pub(super) fn version(api: &Api) -> Option<Result<i32, CudaError>> {
    let sym = api.get_version?;
    let mut v: c_int = 0;
    // SAFETY: out-pointer to a live int.
    Some(check(sym, |f| unsafe { f(&mut v) }).map(|()| v))
}

/// `cuFileBufRegister` of `len` bytes of device memory at `ptr`, flags 0.
///
/// # Safety
/// `[ptr, ptr + len)` is a live device allocation that stays allocated until
/// [`buf_deregister`].
pub(super) unsafe fn buf_register(api: &Api, ptr: u64, len: usize) -> Result<(), CudaError> {
    // SAFETY: the caller's contract.
    check(api.buf_register, |f| unsafe {
        f(ptr as *const c_void, len, 0)
    })
}

/// `cuFileBufDeregister`.
///
/// # Safety
/// `ptr` was registered with [`buf_register`] and its memory is still allocated.
pub(super) unsafe fn buf_deregister(api: &Api, ptr: u64) -> Result<(), CudaError> {
    // SAFETY: the caller's contract.
    check(api.buf_deregister, |f| unsafe { f(ptr as *const c_void) })
}

/// `cuFileHandleRegister` of the open descriptor `fd`.
///
/// # Safety
/// `fd` stays open until [`handle_deregister`] of the returned handle.
pub(super) unsafe fn handle_register(api: &Api, fd: c_int) -> Result<CUfileHandle_t, CudaError> {
    let mut descr = CUfileDescr_t {
        type_: HANDLE_TYPE_OPAQUE_FD,
        handle: CUfileDescrHandle {
            handle: std::ptr::null_mut(),
        },
        fs_ops: std::ptr::null(),
    };
    descr.handle.fd = fd;
    let mut raw: CUfileHandle_t = std::ptr::null_mut();
    // SAFETY: descriptor of an open fd (the caller's contract); out-pointer live.
    check(api.handle_register, |f| unsafe { f(&mut raw, &mut descr) })?;
    Ok(raw)
}

/// `cuFileHandleDeregister`.
///
/// # Safety
/// `h` came from [`handle_register`], is deregistered once, and is not used afterwards.
pub(super) unsafe fn handle_deregister(api: &Api, h: CUfileHandle_t) {
    // SAFETY: the caller's contract.
    unsafe { (api.handle_deregister.f)(h) }
}

/// `cuFileRead` (`write` false) or `cuFileWrite` of `len` bytes between the file at `file_off`
/// and device memory `base + buf_off`, blocking: the bytes moved.
///
/// # Safety
/// `h` is a live registered handle; `[base + buf_off, base + buf_off + len)` is live device
/// memory for the call.
pub(super) unsafe fn io(
    api: &Api,
    write: bool,
    h: CUfileHandle_t,
    base: u64,
    len: usize,
    (file_off, buf_off): (i64, i64),
) -> Result<usize, CudaError> {
    let (name, ret) = if write {
        let sym = api.write;
        // SAFETY: the caller's contract.
        (sym.name, unsafe {
            (sym.f)(h, base as *const c_void, len, file_off, buf_off)
        })
    } else {
        let sym = api.read;
        // SAFETY: the caller's contract.
        (sym.name, unsafe {
            (sym.f)(h, base as *mut c_void, len, file_off, buf_off)
        })
    };
    io_result(name, ret, errno())
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
