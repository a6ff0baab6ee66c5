//! The refusals of the block-list copier ([`crate::blocks`]) that [`super::CudaError`]
//! carries: why a list was refused, and why a method cannot run. Plain data, below the copier,
//! so that the crate's error type knows nothing above it; [`crate::blocks`] re-exports them.

use std::fmt;

/// Which end of a copy an error is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Side {
    /// The destination (`dst`).
    Dst,
    /// The source (`src`).
    Src,
}

impl fmt::Display for Side {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Side::Dst => "destination",
            Side::Src => "source",
        })
    }
}

/// How a block list is moved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BlockMethod {
    /// `cuMemcpyBatchAsync`: the driver's batched copy on copy engines (CUDA 12.8+).
    DriverBatch,
    /// One launch of the gather/scatter copy kernel (shipped PTX).
    Kernel,
}

impl BlockMethod {
    /// Both methods, in a fixed order.
    pub const ALL: [BlockMethod; 2] = [BlockMethod::DriverBatch, BlockMethod::Kernel];

    /// The method's name in reports: `driver-batch` or `kernel`.
    pub fn name(self) -> &'static str {
        match self {
            BlockMethod::DriverBatch => "driver-batch",
            BlockMethod::Kernel => "kernel",
        }
    }
}

impl fmt::Display for BlockMethod {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a block list was refused. Nothing was enqueued when one of these is returned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BlockListError {
    /// The list has no descriptors.
    #[error("the list has no descriptors")]
    Empty,
    /// More than [`crate::blocks::MAX_BLOCKS_PER_CALL`] descriptors.
    #[error("{count} descriptors exceed the limit of {max} per call")]
    TooMany {
        /// Descriptors given.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// A descriptor of length 0 (almost always a layout bug upstream, so it is not skipped).
    #[error("descriptor {index} has length 0")]
    ZeroLength {
        /// The descriptor's index in the list.
        index: usize,
    },
    /// `addr + len` does not fit in 64 bits.
    #[error("descriptor {index}: {side} {addr:#x} + {len} bytes overflows the address space")]
    Overflow {
        /// The descriptor's index in the list.
        index: usize,
        /// The end that overflows.
        side: Side,
        /// Its start address.
        addr: u64,
        /// The descriptor's length in bytes.
        len: u64,
    },
    /// The destination range overlaps the source range of the same descriptor.
    #[error(
        "descriptor {index}: destination {dst:#x} and source {src:#x} overlap over {len} bytes"
    )]
    SelfOverlap {
        /// The descriptor's index in the list.
        index: usize,
        /// Its destination address.
        dst: u64,
        /// Its source address.
        src: u64,
        /// Its length in bytes.
        len: u64,
    },
    /// The range lies in none of the regions given for its side (or straddles two).
    #[error("descriptor {index}: {side} {addr:#x}..{end:#x} is inside no {side} region")]
    OutsideRegions {
        /// The descriptor's index in the list.
        index: usize,
        /// The end that lies outside.
        side: Side,
        /// Start of the range.
        addr: u64,
        /// End of the range (exclusive).
        end: u64,
    },
    /// No region was given for a side.
    #[error("no {side} region was given")]
    NoRegions {
        /// The side without regions.
        side: Side,
    },
    /// Two regions of one side overlap (the same buffer twice, or two views of one allocation).
    #[error("{side} regions {a} and {b} overlap")]
    OverlappingRegions {
        /// The side of the two regions.
        side: Side,
        /// Index of the first region in its slice.
        a: usize,
        /// Index of the second region in its slice.
        b: usize,
    },
    /// A destination region is host memory borrowed for reading ([`crate::blocks::BlockRegion::host`]).
    #[error("destination region {index} is read-only host memory (use BlockRegion::host_mut)")]
    ReadOnlyDestination {
        /// The region's index in the destination slice.
        index: usize,
    },
    /// The kernel method needs host memory at the same address on host and device; the driver
    /// maps this region elsewhere (a device without `CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM`).
    #[error(
        "host region at {host:#x} is mapped at device address {device:#x}; the kernel method \
         needs them equal (use the driver-batch method)"
    )]
    HostMappedElsewhere {
        /// The region's host address.
        host: u64,
        /// The device address the driver maps it at.
        device: u64,
    },
}

/// Why a [`BlockMethod`] cannot run here.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unavailable {
    /// The driver is older than CUDA 12.8, which introduced `cuMemcpyBatchAsync`.
    #[error(
        "the driver supports CUDA {}.{}; cuMemcpyBatchAsync needs 12.8 (driver R570) or newer",
        driver / 1000,
        driver % 1000 / 10
    )]
    DriverTooOld {
        /// The driver's CUDA version, 1000 times major plus 10 times minor.
        driver: u32,
    },
    /// `cuDriverGetVersion` failed.
    #[error("cuDriverGetVersion failed (CUresult {result})")]
    DriverVersionUnknown {
        /// The `CUresult` of `cuDriverGetVersion`.
        result: i32,
    },
    /// No `cuGetProcAddress_v2` (CUDA 12.0) to resolve the versioned entry point with.
    #[error("the driver exports no cuGetProcAddress_v2 (CUDA 12.0)")]
    NoProcAddress,
    /// `cuGetProcAddress_v2` found no `cuMemcpyBatchAsync` for the version asked.
    #[error(
        "cuGetProcAddress_v2(\"cuMemcpyBatchAsync\", {requested}) found no entry point \
         (query status {status}, CUresult {result})"
    )]
    NotExported {
        /// The `cudaVersion` asked for.
        requested: i32,
        /// The `CUdriverProcAddressQueryResult`.
        status: i32,
        /// The `CUresult` of the query.
        result: i32,
    },
    /// The copy kernel's PTX did not load (no PTX JIT, or a driver older than PTX ISA 7.0).
    #[error("the copy kernel did not load: {message}")]
    KernelLoad {
        /// The load error's text.
        message: String,
    },
}
