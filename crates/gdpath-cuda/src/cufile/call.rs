//! Layer 2: one wrapper per raw cuFile call, each turning the call's result into
//! `Result<_, CudaError>` with cuFile's code and text. The wrappers whose arguments the library
//! dereferences or keeps (device pointers, registered handles and batches) are `unsafe`; the
//! RAII types of layer 3 ([`super::driver`], [`super::handle`], [`super::batch`]) hold what makes
//! each call sound.

use std::ffi::{c_int, c_uint, c_void};

use super::codes::cufile_error;
use super::sys::{
    Api, BatchApi, CUfileBatchHandle_t, CUfileDescrHandle, CUfileDescr_t, CUfileDrvProps_t,
    CUfileError_t, CUfileHandle_t, CUfileIOEvents_t, CUfileIOParams_t, HANDLE_TYPE_OPAQUE_FD,
};
use crate::error::CudaError;

pub(super) fn check(call: &'static str, e: CUfileError_t) -> Result<(), CudaError> {
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

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// `cuFileDriverOpen`.
pub(super) fn driver_open(api: &Api) -> Result<(), CudaError> {
    // SAFETY: no arguments.
    check("cuFileDriverOpen", unsafe { (api.driver_open)() })
}

/// `cuFileDriverClose_v2`.
///
/// # Safety
/// Balances one successful [`driver_open`]; nothing registered with the driver is used after.
pub(super) unsafe fn driver_close(api: &Api) -> Result<(), CudaError> {
    // SAFETY: the caller's contract.
    check("cuFileDriverClose_v2", unsafe { (api.driver_close)() })
}

/// `cuFileDriverGetProperties`.
pub(super) fn driver_properties(api: &Api) -> Result<CUfileDrvProps_t, CudaError> {
    let mut p = CUfileDrvProps_t::default();
    // SAFETY: out-pointer to a live struct of cufile.h's layout.
    check("cuFileDriverGetProperties", unsafe {
        (api.driver_get_properties)(&mut p)
    })?;
    Ok(p)
}

/// `cuFileGetVersion`, if this libcufile has it.
pub(super) fn version(api: &Api) -> Option<Result<i32, CudaError>> {
    let f = api.get_version?;
    let mut v: c_int = 0;
    // SAFETY: out-pointer to a live int.
    Some(check("cuFileGetVersion", unsafe { f(&mut v) }).map(|()| v))
}

/// `cuFileBufRegister` of `len` bytes of device memory at `ptr`, flags 0.
///
/// # Safety
/// `[ptr, ptr + len)` is a live device allocation that stays allocated until
/// [`buf_deregister`].
pub(super) unsafe fn buf_register(api: &Api, ptr: u64, len: usize) -> Result<(), CudaError> {
    // SAFETY: the caller's contract.
    check("cuFileBufRegister", unsafe {
        (api.buf_register)(ptr as *const c_void, len, 0)
    })
}

/// `cuFileBufDeregister`.
///
/// # Safety
/// `ptr` was registered with [`buf_register`] and its memory is still allocated.
pub(super) unsafe fn buf_deregister(api: &Api, ptr: u64) -> Result<(), CudaError> {
    // SAFETY: the caller's contract.
    check("cuFileBufDeregister", unsafe {
        (api.buf_deregister)(ptr as *const c_void)
    })
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
    check("cuFileHandleRegister", unsafe {
        (api.handle_register)(&mut raw, &mut descr)
    })?;
    Ok(raw)
}

/// `cuFileHandleDeregister`.
///
/// # Safety
/// `h` came from [`handle_register`], is deregistered once, and is not used afterwards.
pub(super) unsafe fn handle_deregister(api: &Api, h: CUfileHandle_t) {
    // SAFETY: the caller's contract.
    unsafe { (api.handle_deregister)(h) }
}

/// `cuFileRead` of `len` bytes at `file_off` into device memory `base + buf_off`, blocking.
///
/// # Safety
/// `h` is a live registered handle; `[base + buf_off, base + buf_off + len)` is live device
/// memory for the call.
pub(super) unsafe fn read(
    api: &Api,
    h: CUfileHandle_t,
    base: u64,
    len: usize,
    file_off: i64,
    buf_off: i64,
) -> Result<usize, CudaError> {
    // SAFETY: the caller's contract.
    let ret = unsafe { (api.read)(h, base as *mut c_void, len, file_off, buf_off) };
    io_result("cuFileRead", ret, errno())
}

/// `cuFileWrite` of `len` bytes from device memory `base + buf_off` at `file_off`, blocking.
///
/// # Safety
/// As [`read`].
pub(super) unsafe fn write(
    api: &Api,
    h: CUfileHandle_t,
    base: u64,
    len: usize,
    file_off: i64,
    buf_off: i64,
) -> Result<usize, CudaError> {
    // SAFETY: the caller's contract.
    let ret = unsafe { (api.write)(h, base as *const c_void, len, file_off, buf_off) };
    io_result("cuFileWrite", ret, errno())
}

/// `cuFileBatchIOSetUp` for `n` entries.
pub(super) fn batch_setup(b: &BatchApi, n: c_uint) -> Result<CUfileBatchHandle_t, CudaError> {
    let mut raw: CUfileBatchHandle_t = std::ptr::null_mut();
    // SAFETY: out-pointer live.
    check("cuFileBatchIOSetUp", unsafe { (b.setup)(&mut raw, n) })?;
    Ok(raw)
}

/// `cuFileBatchIOSubmit` of `params`, flags 0.
///
/// # Safety
/// `raw` is a live batch; every entry's device memory and handle stay live until the entry
/// completes or the batch is destroyed.
pub(super) unsafe fn batch_submit(
    b: &BatchApi,
    raw: CUfileBatchHandle_t,
    params: &mut [CUfileIOParams_t],
) -> Result<(), CudaError> {
    // SAFETY: `params` is live for the call; the rest is the caller's contract.
    check("cuFileBatchIOSubmit", unsafe {
        (b.submit)(raw, params.len() as c_uint, params.as_mut_ptr(), 0)
    })
}

/// `cuFileBatchIOGetStatus`: waits for at least `min` completions or `timeout`; fills `events`
/// and returns how many it filled.
///
/// # Safety
/// `raw` is a live batch.
pub(super) unsafe fn batch_status(
    b: &BatchApi,
    raw: CUfileBatchHandle_t,
    min: usize,
    events: &mut [CUfileIOEvents_t],
    timeout: std::time::Duration,
) -> Result<usize, CudaError> {
    let mut nr = events.len() as c_uint;
    let mut ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `events` has `nr` slots; timespec live; the batch is the caller's contract.
    check("cuFileBatchIOGetStatus", unsafe {
        (b.get_status)(
            raw,
            min.min(events.len()) as c_uint,
            &mut nr,
            events.as_mut_ptr(),
            &mut ts,
        )
    })?;
    Ok((nr as usize).min(events.len()))
}

/// `cuFileBatchIOCancel`: cancels the entries in flight.
///
/// # Safety
/// `raw` is a live batch.
pub(super) unsafe fn batch_cancel(b: &BatchApi, raw: CUfileBatchHandle_t) -> Result<(), CudaError> {
    // SAFETY: the caller's contract.
    check("cuFileBatchIOCancel", unsafe { (b.cancel)(raw) })
}

/// `cuFileBatchIODestroy`.
///
/// # Safety
/// `raw` is a live batch, destroyed once and not used afterwards.
pub(super) unsafe fn batch_destroy(b: &BatchApi, raw: CUfileBatchHandle_t) {
    // SAFETY: the caller's contract.
    unsafe { (b.destroy)(raw) }
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
