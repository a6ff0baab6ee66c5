//! The driver's batched copy, `cuMemcpyBatchAsync` (CUDA 12.8 and later), resolved optionally.
//!
//! ABI: CUDA 12.8 declared
//! `cuMemcpyBatchAsync(dsts, srcs, sizes, count, attrs, attrIdxs, numAttrs, size_t *failIdx,
//! hStream)`; CUDA 13.0 removed `failIdx` (`cuMemcpyBatchAsync_v2` in the 13.0 `cuda.h`). A 13.x
//! driver exports both. Looking either up by its export name would tie the call to a header
//! version, so the entry point is resolved with `cuGetProcAddress_v2("cuMemcpyBatchAsync",
//! cudaVersion)`, which returns the newest variant whose ABI is no newer than `cudaVersion`.
//! The version asked for therefore fixes the signature gdpath calls, and it is chosen from the
//! driver's own version: 13000 (the 13.0 ABI) on a driver of CUDA 13.0 or later, 12080 (the 12.8
//! ABI, with `failIdx`) on 12.8 and 12.9 drivers. Asking a 12.9 driver for 13000 would return the
//! 12.8 variant, and calling it with the 13.0 signature would pass the stream as `failIdx`;
//! deriving the request from the driver version rules that out. Drivers before 12.8 leave the
//! method [`Unavailable`], never a load failure.
//!
//! Attributes: every copy gets a `CUmemcpyAttributes` with `srcAccessOrder =
//! CU_MEMCPY_SRC_ACCESS_ORDER_STREAM` (the source is read in stream order, as for any other
//! async copy; the caller's buffers need not outlive the call in any other way) and location
//! hints naming each side's device or the host. One attribute entry covers each run of copies
//! with the same pair of locations (`attrIdxs` gives the first copy of each run), so the usual
//! list (one source region, one destination region) passes a single attribute.

use std::ffi::{c_int, c_uint};
use std::sync::OnceLock;

use crate::driver::call::{self, BatchCopies};
use crate::driver::sys::{
    BatchFn, CUdeviceptr, CUmemLocation, CUmemcpyAttributes, CUstream, DriverApi,
    CU_MEMCPY_SRC_ACCESS_ORDER_STREAM, CU_MEM_LOCATION_TYPE_DEVICE, CU_MEM_LOCATION_TYPE_HOST,
};
use crate::error::blocks::Unavailable;
use crate::error::CudaError;

/// Where memory is, for the driver's location hints and for reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MemLocation {
    /// Device memory of the GPU with this CUDA ordinal (for an IPC mapping: the importing
    /// context's GPU).
    Device(u32),
    /// Pinned host memory.
    Host,
}

/// Which `cuMemcpyBatchAsync` signature was resolved (see `batch.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BatchAbi {
    /// CUDA 12.8's, with `size_t *failIdx`; on 12.8 and 12.9 drivers.
    Cuda12_8,
    /// CUDA 13.0's, without `failIdx`; on 13.0 and later drivers.
    Cuda13_0,
}

/// The driver's location hint for `loc`.
fn location(loc: MemLocation) -> CUmemLocation {
    match loc {
        MemLocation::Device(ordinal) => CUmemLocation {
            kind: CU_MEM_LOCATION_TYPE_DEVICE,
            id: ordinal as c_int,
        },
        MemLocation::Host => CUmemLocation {
            kind: CU_MEM_LOCATION_TYPE_HOST,
            id: 0,
        },
    }
}

/// The attributes of a copy from `src` to `dst` with `flags` (`CU_MEMCPY_FLAG_*`).
pub(crate) fn attributes(dst: MemLocation, src: MemLocation, flags: c_uint) -> CUmemcpyAttributes {
    CUmemcpyAttributes {
        src_access_order: CU_MEMCPY_SRC_ACCESS_ORDER_STREAM,
        src_loc_hint: location(src),
        dst_loc_hint: location(dst),
        flags,
    }
}

/// The ABI a resolved entry point has.
pub(crate) fn abi(f: BatchFn) -> BatchAbi {
    match f {
        BatchFn::V12080(_) => BatchAbi::Cuda12_8,
        BatchFn::V13000(_) => BatchAbi::Cuda13_0,
    }
}

/// Which `cudaVersion` to ask `cuGetProcAddress` for, from the driver's CUDA version
/// (`cuDriverGetVersion`, 1000 times major plus 10 times minor). Pure, so the rule is tested on
/// the CPU.
pub(crate) fn requested_version(driver: u32) -> Result<(c_int, BatchAbi), Unavailable> {
    match driver {
        v if v >= 13000 => Ok((13000, BatchAbi::Cuda13_0)),
        v if v >= 12080 => Ok((12080, BatchAbi::Cuda12_8)),
        v => Err(Unavailable::DriverTooOld { driver: v }),
    }
}

static BATCH: OnceLock<Result<BatchFn, Unavailable>> = OnceLock::new();

/// Resolve `cuMemcpyBatchAsync` once per process.
pub(crate) fn resolve(api: &DriverApi) -> Result<BatchFn, Unavailable> {
    BATCH.get_or_init(|| resolve_uncached(api)).clone()
}

fn resolve_uncached(api: &DriverApi) -> Result<BatchFn, Unavailable> {
    let driver = call::driver_get_version(api).map_err(|e| Unavailable::DriverVersionUnknown {
        result: e.cu_result().unwrap_or(-1),
    })?;
    let (version, abi) = requested_version(driver.max(0) as u32)?;
    let f = call::memcpy_batch_async_entry(api, version)
        .ok_or(Unavailable::NoProcAddress)?
        .map_err(|(status, result)| Unavailable::NotExported {
            requested: version,
            status,
            result,
        })?;
    tracing::debug!(requested = version, ?abi, "resolved cuMemcpyBatchAsync");
    Ok(f)
}

/// The host arrays of one `cuMemcpyBatchAsync` call, kept between calls to avoid allocating.
#[derive(Default)]
pub(crate) struct BatchArrays {
    pub dsts: Vec<CUdeviceptr>,
    pub srcs: Vec<CUdeviceptr>,
    pub sizes: Vec<usize>,
    pub attrs: Vec<CUmemcpyAttributes>,
    pub attr_idxs: Vec<usize>,
}

impl BatchArrays {
    pub(crate) fn clear(&mut self) {
        self.dsts.clear();
        self.srcs.clear();
        self.sizes.clear();
        self.attrs.clear();
        self.attr_idxs.clear();
    }

    /// Append a copy; a new attribute entry starts when `attr` differs from the last one.
    pub(crate) fn push(&mut self, dst: u64, src: u64, len: u64, attr: CUmemcpyAttributes) {
        if self.attrs.last() != Some(&attr) {
            self.attr_idxs.push(self.dsts.len());
            self.attrs.push(attr);
        }
        self.dsts.push(dst);
        self.srcs.push(src);
        // Lengths come from validated ranges of the 64-bit address space; usize is 64-bit on
        // every platform the CUDA driver supports.
        self.sizes.push(len as usize);
    }

    /// Enqueue the batch on `stream`.
    ///
    /// Errors: [`CudaError::Driver`] for `cuMemcpyBatchAsync`, with the failing copy's
    /// addresses in the message when the 12.8 ABI reports its index.
    ///
    /// # Safety
    /// Every copy's ranges are memory the stream's context can access, valid until the stream
    /// has passed the batch; `stream` is live, its context current.
    pub(crate) unsafe fn post(
        &mut self,
        api: &DriverApi,
        f: BatchFn,
        stream: CUstream,
    ) -> Result<(), CudaError> {
        let copies = BatchCopies {
            dsts: &mut self.dsts,
            srcs: &mut self.srcs,
            sizes: &mut self.sizes,
            attrs: &mut self.attrs,
            attr_idxs: &mut self.attr_idxs,
        };
        // SAFETY: the caller's contract; `push` keeps the arrays' lengths matched.
        unsafe { call::memcpy_batch_async(api, f, copies, stream) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_name_both_locations() {
        let a = attributes(MemLocation::Host, MemLocation::Device(3), 0);
        assert_eq!(a.src_access_order, CU_MEMCPY_SRC_ACCESS_ORDER_STREAM);
        assert_eq!(a.src_loc_hint, CUmemLocation { kind: 1, id: 3 });
        assert_eq!(a.dst_loc_hint, CUmemLocation { kind: 2, id: 0 });
    }

    #[test]
    fn the_requested_version_fixes_the_abi() {
        assert_eq!(requested_version(13000), Ok((13000, BatchAbi::Cuda13_0)));
        assert_eq!(requested_version(13020), Ok((13000, BatchAbi::Cuda13_0)));
        assert_eq!(requested_version(14000), Ok((13000, BatchAbi::Cuda13_0)));
        assert_eq!(requested_version(12090), Ok((12080, BatchAbi::Cuda12_8)));
        assert_eq!(requested_version(12080), Ok((12080, BatchAbi::Cuda12_8)));
        let e = requested_version(12060).unwrap_err();
        assert_eq!(e, Unavailable::DriverTooOld { driver: 12060 });
        assert!(e.to_string().contains("12.6"), "{e}");
    }

    #[test]
    fn attribute_runs_follow_location_changes() {
        let d2h = attributes(MemLocation::Host, MemLocation::Device(0), 0);
        let d2d = attributes(MemLocation::Device(0), MemLocation::Device(0), 0);
        let mut a = BatchArrays::default();
        a.push(1, 2, 3, d2h);
        a.push(4, 5, 6, d2h);
        a.push(7, 8, 9, d2d);
        a.push(10, 11, 12, d2h);
        assert_eq!(a.attr_idxs, [0, 2, 3]);
        assert_eq!(a.attrs, [d2h, d2d, d2h]);
        assert_eq!(a.sizes, [3, 6, 9, 12]);
        a.clear();
        assert!(a.dsts.is_empty() && a.attrs.is_empty() && a.attr_idxs.is_empty());
    }
}
