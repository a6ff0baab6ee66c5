//! Layer 3: device buffers registered with cuFile, and registered files with their blocking
//! reads and writes.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::sync::Arc;

use super::call;
use super::driver::CuFileDriver;
use super::sys::CUfileHandle_t;
use crate::error::CudaError;
use crate::memory::{check_range, DevMem, DeviceBuffer};

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
        // SAFETY: a live device allocation of exactly this length, kept allocated by the
        // `Arc<DevMem>` this value holds until `drop` deregisters it.
        unsafe { call::buf_register(driver.inner.api, buf.device_ptr(), buf.len()) }?;
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
        if let Err(e) = unsafe { call::buf_deregister(self.driver.inner.api, self.mem.ptr) } {
            tracing::warn!(error = %e, "deregistering cuFile buffer");
        }
    }
}

/// A file registered with cuFile (`cuFileHandleRegister`), deregistered on drop. The file should
/// be opened with `O_DIRECT` (cuFile's GDS path requires it; compatibility mode does not). Holds
/// the file (`Arc<File>`) so the descriptor stays open while registered. `Send + Sync`.
pub struct CuFileHandle {
    driver: CuFileDriver,
    file: Arc<File>,
    pub(super) raw: CUfileHandle_t,
}

// SAFETY: a cuFile handle may be used from any thread (cuFile is thread-safe per its docs).
unsafe impl Send for CuFileHandle {}
// SAFETY: as above.
unsafe impl Sync for CuFileHandle {}

impl Drop for CuFileHandle {
    fn drop(&mut self) {
        // SAFETY: registered in `register`, deregistered once here; the fd is still open (we
        // hold the file).
        unsafe { call::handle_deregister(self.driver.inner.api, self.raw) };
    }
}

impl CuFileHandle {
    /// Register `file`.
    ///
    /// Errors: [`CudaError::CuFile`], e.g. `CU_FILE_HANDLE_NOT_REGISTERED` ("file descriptor is
    /// not registered") where cuFile cannot map the file's block device (the device machine's
    /// virtio disk and tmpfs), or `CU_FILE_DIO_NOT_SET` without `O_DIRECT`.
    pub fn register(driver: &CuFileDriver, file: Arc<File>) -> Result<CuFileHandle, CudaError> {
        // SAFETY: the descriptor stays open while this value holds the file.
        let raw = unsafe { call::handle_register(driver.inner.api, file.as_raw_fd()) }?;
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
        self.io(false, buf, buf_off, file_off, len)
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
        self.io(true, buf, buf_off, file_off, len)
    }

    fn io(
        &self,
        write: bool,
        buf: &DeviceBuffer,
        buf_off: usize,
        file_off: u64,
        len: usize,
    ) -> Result<usize, CudaError> {
        let what = if write {
            "cuFileWrite source"
        } else {
            "cuFileRead destination"
        };
        check_range(what, buf.len(), buf_off, len)?;
        let file_off = i64::try_from(file_off)
            .map_err(|_| CudaError::InvalidArgument(format!("file offset {file_off} too large")))?;
        buf.context().bind()?;
        let (api, ptr) = (self.driver.inner.api, buf.device_ptr());
        // SAFETY: range checked; buffer alive for the call (borrowed); handle registered.
        unsafe { call::io(api, write, self.raw, ptr, len, (file_off, buf_off as i64)) }
    }
}
