//! Layer 3: cuFile batches (`cuFileBatchIO*`): several reads and writes submitted at once.

use std::ffi::{c_uint, c_void};
use std::sync::Arc;

use super::call;
use super::driver::CuFileDriver;
use super::handle::CuFileHandle;
use super::sys::{
    BatchApi, CUfileBatchHandle_t, CUfileHandle_t, CUfileIOEvents_t, CUfileIOParamsBatch,
    CUfileIOParams_t,
};
use crate::error::{CudaError, Library};
use crate::memory::{check_range, DevMem, DeviceBuffer};

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
        let raw = call::batch_setup(&api, n)?;
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
        // SAFETY: our live batch; params built above from live buffers and handles, which
        // `keep` holds below.
        unsafe { call::batch_submit(&self.api, self.raw, &mut params) }?;
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
        // SAFETY: our live batch.
        let nr = unsafe { call::batch_status(&self.api, self.raw, min, &mut events, timeout) }?;
        let done: Vec<BatchCompletion> = events[..nr]
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
            // SAFETY: our live batch.
            let _ = unsafe { call::batch_cancel(&self.api, self.raw) };
        }
        // SAFETY: our batch, destroyed once; nothing uses it afterwards. Buffers in `keep` are
        // dropped after.
        unsafe { call::batch_destroy(&self.api, self.raw) };
        let _ = &self.driver;
    }
}
