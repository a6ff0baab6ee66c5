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

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::sync::OnceLock;

use super::{BatchAbi, MemLocation, Unavailable};
use crate::error::CudaError;
use crate::ffi::{CUdeviceptr, CUresult, CUstream, DriverApi};

/// `CUmemcpySrcAccessOrder` (cuda.h 12.8+).
pub(crate) const CU_MEMCPY_SRC_ACCESS_ORDER_STREAM: c_int = 1;
/// `CUmemLocationType` (cuda.h).
pub(crate) const CU_MEM_LOCATION_TYPE_DEVICE: c_int = 1;
pub(crate) const CU_MEM_LOCATION_TYPE_HOST: c_int = 2;
/// `CUmemcpyFlags` (cuda.h 12.8+).
pub(crate) const CU_MEMCPY_FLAG_DEFAULT: c_uint = 0;
pub(crate) const CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE: c_uint = 1;
/// `CUdriverProcAddress_flags`: resolve the legacy-default-stream variant (not `_ptsz`); gdpath
/// never passes stream 0, so the two behave the same, and this one is explicit.
const CU_GET_PROC_ADDRESS_LEGACY_STREAM: u64 = 1;
/// `CUdriverProcAddressQueryResult::CU_GET_PROC_ADDRESS_SUCCESS`.
const CU_GET_PROC_ADDRESS_SUCCESS: c_int = 0;

/// `CUmemLocation`: `{ CUmemLocationType type; int id; }`, 8 bytes (cuda.h).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CUmemLocation {
    pub kind: c_int,
    pub id: c_int,
}

/// `CUmemcpyAttributes_v1`: `{ CUmemcpySrcAccessOrder srcAccessOrder; CUmemLocation srcLocHint;
/// CUmemLocation dstLocHint; unsigned int flags; }`, 24 bytes, 4-byte aligned (cuda.h 12.8+).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CUmemcpyAttributes {
    pub src_access_order: c_int,
    pub src_loc_hint: CUmemLocation,
    pub dst_loc_hint: CUmemLocation,
    pub flags: c_uint,
}

impl CUmemLocation {
    pub(crate) fn of(loc: MemLocation) -> CUmemLocation {
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
}

impl CUmemcpyAttributes {
    pub(crate) fn new(dst: MemLocation, src: MemLocation, flags: c_uint) -> CUmemcpyAttributes {
        CUmemcpyAttributes {
            src_access_order: CU_MEMCPY_SRC_ACCESS_ORDER_STREAM,
            src_loc_hint: CUmemLocation::of(src),
            dst_loc_hint: CUmemLocation::of(dst),
            flags,
        }
    }
}

type GetProcAddressV2 =
    unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_int) -> CUresult;

/// The 12.8 signature (with `failIdx`).
type BatchV12080 = unsafe extern "C" fn(
    *mut CUdeviceptr,
    *mut CUdeviceptr,
    *mut usize,
    usize,
    *mut CUmemcpyAttributes,
    *mut usize,
    usize,
    *mut usize,
    CUstream,
) -> CUresult;

/// The 13.0 signature (no `failIdx`).
type BatchV13000 = unsafe extern "C" fn(
    *mut CUdeviceptr,
    *mut CUdeviceptr,
    *mut usize,
    usize,
    *mut CUmemcpyAttributes,
    *mut usize,
    usize,
    CUstream,
) -> CUresult;

#[derive(Clone, Copy)]
pub(crate) enum BatchFn {
    V12080(BatchV12080),
    V13000(BatchV13000),
}

impl BatchFn {
    pub(crate) fn abi(self) -> BatchAbi {
        match self {
            BatchFn::V12080(_) => BatchAbi::Cuda12_8,
            BatchFn::V13000(_) => BatchAbi::Cuda13_0,
        }
    }
}

/// Which `cudaVersion` to ask `cuGetProcAddress` for, from the driver's CUDA version
/// (`cuDriverGetVersion`, 1000 × major + 10 × minor). Pure, so the rule is tested on the CPU.
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
    let mut driver: c_int = 0;
    // SAFETY: out-pointer to a live int.
    let r = unsafe { (api.cuDriverGetVersion)(&mut driver) };
    if r != crate::ffi::CUDA_SUCCESS {
        return Err(Unavailable::DriverVersionUnknown { result: r });
    }
    let (version, abi) = requested_version(driver.max(0) as u32)?;
    // SAFETY: the CUDA 12.0+ signature of cuGetProcAddress_v2 (cuda.h).
    let get: GetProcAddressV2 =
        unsafe { api.optional_symbol("cuGetProcAddress_v2") }.ok_or(Unavailable::NoProcAddress)?;
    let mut pfn: *mut c_void = std::ptr::null_mut();
    let mut status: c_int = -1;
    // SAFETY: NUL-terminated name, live out-pointers.
    let r = unsafe {
        get(
            c"cuMemcpyBatchAsync".as_ptr(),
            &mut pfn,
            version,
            CU_GET_PROC_ADDRESS_LEGACY_STREAM,
            &mut status,
        )
    };
    if r != crate::ffi::CUDA_SUCCESS || status != CU_GET_PROC_ADDRESS_SUCCESS || pfn.is_null() {
        return Err(Unavailable::NotExported {
            requested: version,
            status,
            result: r,
        });
    }
    tracing::debug!(requested = version, ?abi, "resolved cuMemcpyBatchAsync");
    // SAFETY: cuGetProcAddress returned the variant of the ABI of `version`, whose signature is
    // the one named here (see the module documentation).
    Ok(unsafe {
        match abi {
            BatchAbi::Cuda13_0 => {
                BatchFn::V13000(std::mem::transmute::<*mut c_void, BatchV13000>(pfn))
            }
            BatchAbi::Cuda12_8 => {
                BatchFn::V12080(std::mem::transmute::<*mut c_void, BatchV12080>(pfn))
            }
        }
    })
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
    pub(crate) fn post(
        &mut self,
        api: &DriverApi,
        f: BatchFn,
        stream: CUstream,
    ) -> Result<(), CudaError> {
        let count = self.dsts.len();
        let mut fail_idx = usize::MAX;
        // SAFETY: the arrays have `count` (attrs: `attr_idxs.len()`) live elements; the driver
        // reads them during the call; the stream is the caller's, its context current.
        let r = unsafe {
            match f {
                BatchFn::V13000(g) => g(
                    self.dsts.as_mut_ptr(),
                    self.srcs.as_mut_ptr(),
                    self.sizes.as_mut_ptr(),
                    count,
                    self.attrs.as_mut_ptr(),
                    self.attr_idxs.as_mut_ptr(),
                    self.attrs.len(),
                    stream,
                ),
                BatchFn::V12080(g) => g(
                    self.dsts.as_mut_ptr(),
                    self.srcs.as_mut_ptr(),
                    self.sizes.as_mut_ptr(),
                    count,
                    self.attrs.as_mut_ptr(),
                    self.attr_idxs.as_mut_ptr(),
                    self.attrs.len(),
                    &mut fail_idx,
                    stream,
                ),
            }
        };
        api.check("cuMemcpyBatchAsync", r).map_err(|e| match e {
            CudaError::Driver {
                call,
                code,
                name,
                message,
            } if fail_idx < count => CudaError::Driver {
                call,
                code,
                name,
                message: format!(
                    "{message} (copy {fail_idx} of {count}: {:#x} -> {:#x}, {} bytes)",
                    self.srcs[fail_idx], self.dsts[fail_idx], self.sizes[fail_idx]
                ),
            },
            e => e,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{align_of, offset_of, size_of};

    /// Layout of cuda.h 12.8/13.0: `CUmemLocation` is two 4-byte fields, and
    /// `CUmemcpyAttributes` is `srcAccessOrder` (an enum, 4 bytes), two locations and a 4-byte
    /// `flags`, with no padding.
    #[test]
    fn attribute_structs_match_cuda_h() {
        assert_eq!(size_of::<CUmemLocation>(), 8);
        assert_eq!(align_of::<CUmemLocation>(), 4);
        assert_eq!(offset_of!(CUmemLocation, id), 4);
        assert_eq!(size_of::<CUmemcpyAttributes>(), 24);
        assert_eq!(align_of::<CUmemcpyAttributes>(), 4);
        assert_eq!(offset_of!(CUmemcpyAttributes, src_access_order), 0);
        assert_eq!(offset_of!(CUmemcpyAttributes, src_loc_hint), 4);
        assert_eq!(offset_of!(CUmemcpyAttributes, dst_loc_hint), 12);
        assert_eq!(offset_of!(CUmemcpyAttributes, flags), 20);
        let a = CUmemcpyAttributes::new(MemLocation::Host, MemLocation::Device(3), 0);
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
        let d2h = CUmemcpyAttributes::new(MemLocation::Host, MemLocation::Device(0), 0);
        let d2d = CUmemcpyAttributes::new(MemLocation::Device(0), MemLocation::Device(0), 0);
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
