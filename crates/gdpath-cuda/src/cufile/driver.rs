//! Layer 3: the open cuFile driver, one per process, and its properties.

use std::sync::{Arc, Mutex, Weak};

use super::call;
use super::sys::{self, Api};
use crate::context::Context;
use crate::error::CudaError;

/// An open cuFile driver (`cuFileDriverOpen`); closed (`cuFileDriverClose_v2`) when the last
/// handle, buffer, batch and clone are gone. One per process: [`CuFileDriver::open`] returns the
/// live one if there is one. `Send + Sync`.
#[derive(Clone)]
pub struct CuFileDriver {
    pub(super) inner: Arc<DriverInner>,
}

pub(super) struct DriverInner {
    pub(super) api: &'static Api,
}

impl Drop for DriverInner {
    fn drop(&mut self) {
        // SAFETY: balances the successful open that made this value; every buffer, handle and
        // batch holds a clone, so none is left.
        if let Err(e) = unsafe { call::driver_close(self.api) } {
            tracing::warn!(error = %e, "closing cuFile driver");
        }
    }
}

static LIVE: Mutex<Weak<DriverInner>> = Mutex::new(Weak::new());

/// cuFile driver properties (`cuFileDriverGetProperties`). Sizes are as cufile.h states them:
/// `*_kb` fields are KiB.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CuFileProperties {
    /// nvidia-fs kernel module major version, 0 when the module is not loaded.
    pub nvfs_major: u32,
    /// nvidia-fs kernel module minor version, 0 when the module is not loaded.
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
    /// Longest a batch waits for its completions (ms).
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
    pub fn open(ctx: &Context) -> Result<CuFileDriver, CudaError> {
        let api = sys::api()?;
        let mut live = LIVE.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(inner) = live.upgrade() {
            return Ok(CuFileDriver { inner });
        }
        ctx.bind()?;
        call::driver_open(api)?;
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
        call::version(self.inner.api)?.ok()
    }

    /// `cuFileDriverGetProperties`.
    pub fn properties(&self) -> Result<CuFileProperties, CudaError> {
        let p = call::driver_properties(self.inner.api)?;
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
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
