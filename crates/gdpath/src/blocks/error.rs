//! Why a block transfer was refused: typed, naming the side, the position in the id list and
//! the block id, so a caller can fix its input without parsing text. Nothing moved when one of
//! these is returned.

use crate::region::RegionId;
use std::fmt;

/// Which end of a block transfer an error is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BlockSide {
    /// The region and layout blocks are read from.
    Src,
    /// The region and layout blocks are written to.
    Dst,
}

impl fmt::Display for BlockSide {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BlockSide::Src => "source",
            BlockSide::Dst => "destination",
        })
    }
}

/// A layout dimension, in error messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LayoutDim {
    /// Blocks (ids), `block_stride` apart.
    Blocks,
    /// Layers, `layer_stride` apart.
    Layers,
    /// K/V planes, `kv_stride` apart.
    KvPlanes,
}

impl fmt::Display for LayoutDim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LayoutDim::Blocks => "blocks",
            LayoutDim::Layers => "layers",
            LayoutDim::KvPlanes => "K/V planes",
        })
    }
}

/// A block transfer's layouts or ids are wrong. Returned by `Agent::prepare_blocks` (layout
/// errors) and `PreparedBlocks::post` (id errors) before any byte moves.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BlockError {
    /// `block_size` is 0.
    #[error("{side} layout: block size is 0 bytes")]
    ZeroBlockSize {
        /// The layout it is about.
        side: BlockSide,
    },
    /// A count (blocks, layers, K/V planes) is 0.
    #[error("{side} layout: 0 {dim}")]
    ZeroCount {
        /// The layout it is about.
        side: BlockSide,
        /// The dimension whose count is 0.
        dim: LayoutDim,
    },
    /// More blocks than ids can name ([`super::MAX_LAYOUT_BLOCKS`]).
    #[error("{side} layout: {blocks} blocks exceed the limit of {max}")]
    TooManyBlocks {
        /// The layout it is about.
        side: BlockSide,
        /// The layout's block count.
        blocks: u64,
        /// The most blocks a layout may have ([`super::MAX_LAYOUT_BLOCKS`]).
        max: u64,
    },
    /// An offset of the layout does not fit in 64 bits.
    #[error("{side} layout: the offset of its last block overflows 64 bits")]
    Overflow {
        /// The layout it is about.
        side: BlockSide,
    },
    /// Two slots of the destination layout share bytes: `dim`'s stride is shorter than what
    /// one step of it must skip (a block, or all the slots of the finer dimensions), so two
    /// blocks written by one transfer would overlap.
    #[error(
        "{side} layout: {dim} stride {stride} bytes is shorter than the {needed} bytes each \
         step covers, so slots overlap"
    )]
    Overlap {
        /// The layout it is about.
        side: BlockSide,
        /// The dimension whose stride is too short.
        dim: LayoutDim,
        /// Its stride (bytes).
        stride: u64,
        /// The bytes one step of it covers, the least stride that does not overlap.
        needed: u64,
    },
    /// The layout reaches past its region: block `first_bad` (and every later one) ends
    /// beyond `region_len` bytes.
    #[error(
        "{side} layout: block {first_bad} of {blocks} ends past region {region} of \
         {region_len} bytes (the layout needs {needed} bytes)"
    )]
    OutOfBounds {
        /// The layout it is about.
        side: BlockSide,
        /// The region the layout is laid over.
        region: RegionId,
        /// The first block id that ends past the region (0 when none fits).
        first_bad: u64,
        /// The layout's block count.
        blocks: u64,
        /// Bytes the whole layout spans from the region's start, its offset included.
        needed: u64,
        /// The region's length (bytes).
        region_len: u64,
    },
    /// The two layouts disagree on a shape that pairs blocks (block size, layers, K/V planes).
    #[error("layouts differ: source has {what} {src}, destination {dst}")]
    Mismatch {
        /// The shape that differs: "block size" (bytes), "layers" or "K/V planes".
        what: &'static str,
        /// The source layout's value.
        src: u64,
        /// The destination layout's value.
        dst: u64,
    },
    /// Source and destination are the same region with two different layouts (their slots
    /// could overlap in ways the per-id checks do not see).
    #[error("source and destination are region {region} with two different layouts")]
    SharedRegionLayouts {
        /// The region both sides name.
        region: RegionId,
    },
    /// No block ids were given.
    #[error("no block ids were given")]
    Empty,
    /// The id lists differ in length.
    #[error("{src} source ids but {dst} destination ids")]
    IdCountMismatch {
        /// Number of source ids.
        src: usize,
        /// Number of destination ids.
        dst: usize,
    },
    /// More descriptors than one transfer takes ([`super::MAX_DESCRIPTORS`]).
    #[error("{descriptors} descriptors exceed the limit of {max} per transfer")]
    TooManyDescriptors {
        /// Descriptors the transfer would need (ids × layers × K/V planes, before coalescing).
        descriptors: u64,
        /// The most one transfer takes ([`super::MAX_DESCRIPTORS`]).
        max: u64,
    },
    /// A negative id (from a signed NumPy or torch array).
    #[error("{side} id at position {position} is negative ({value})")]
    NegativeId {
        /// The id list it is in.
        side: BlockSide,
        /// Its position in that list (0-based).
        position: usize,
        /// The negative value.
        value: i64,
    },
    /// An id is not a block of its layout.
    #[error("{side} id at position {position} is {id}, outside the layout's {blocks} blocks")]
    IdOutOfRange {
        /// The id list it is in.
        side: BlockSide,
        /// Its position in that list (0-based).
        position: usize,
        /// The id.
        id: u64,
        /// The layout's block count: ids run from 0 to `blocks - 1`.
        blocks: u64,
    },
    /// A destination block appears twice: the two writes would overlap.
    #[error("destination block {id} appears twice (again at position {position})")]
    DuplicateDestination {
        /// Position of its second appearance in the destination ids (0-based).
        position: usize,
        /// The repeated block id.
        id: u64,
    },
    /// Source and destination are one region and a block is both read and written by the
    /// transfer: the order of its copies is not defined.
    #[error(
        "block {id} is read (source position {position}) and written by the same transfer on \
         one region"
    )]
    SourceIsDestination {
        /// Position of the block in the source ids (0-based).
        position: usize,
        /// The block id read and written.
        id: u64,
    },
}
