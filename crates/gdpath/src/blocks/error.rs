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
    ZeroBlockSize { side: BlockSide },
    /// A count (blocks, layers, K/V planes) is 0.
    #[error("{side} layout: 0 {dim}")]
    ZeroCount { side: BlockSide, dim: LayoutDim },
    /// More blocks than ids can name ([`super::MAX_LAYOUT_BLOCKS`]).
    #[error("{side} layout: {blocks} blocks exceed the limit of {max}")]
    TooManyBlocks {
        side: BlockSide,
        blocks: u64,
        max: u64,
    },
    /// An offset of the layout does not fit in 64 bits.
    #[error("{side} layout: the offset of its last block overflows 64 bits")]
    Overflow { side: BlockSide },
    /// Two slots of the destination layout share bytes: `dim`'s stride is shorter than what
    /// one step of it must skip (a block, or all the slots of the finer dimensions), so two
    /// blocks written by one transfer would overlap.
    #[error(
        "{side} layout: {dim} stride {stride} bytes is shorter than the {needed} bytes each \
         step covers, so slots overlap"
    )]
    Overlap {
        side: BlockSide,
        dim: LayoutDim,
        stride: u64,
        needed: u64,
    },
    /// The layout reaches past its region: block `first_bad` (and every later one) ends
    /// beyond `region_len` bytes.
    #[error(
        "{side} layout: block {first_bad} of {blocks} ends past region {region} of \
         {region_len} bytes (the layout needs {needed} bytes)"
    )]
    OutOfBounds {
        side: BlockSide,
        region: RegionId,
        first_bad: u64,
        blocks: u64,
        needed: u64,
        region_len: u64,
    },
    /// The two layouts disagree on a shape that pairs blocks (block size, layers, K/V planes).
    #[error("layouts differ: source has {what} {src}, destination {dst}")]
    Mismatch {
        what: &'static str,
        src: u64,
        dst: u64,
    },
    /// Source and destination are the same region with two different layouts (their slots
    /// could overlap in ways the per-id checks do not see).
    #[error("source and destination are region {region} with two different layouts")]
    SharedRegionLayouts { region: RegionId },
    /// No block ids were given.
    #[error("no block ids were given")]
    Empty,
    /// The id lists differ in length.
    #[error("{src} source ids but {dst} destination ids")]
    IdCountMismatch { src: usize, dst: usize },
    /// More descriptors than one transfer takes ([`super::MAX_DESCRIPTORS`]).
    #[error("{descriptors} descriptors exceed the limit of {max} per transfer")]
    TooManyDescriptors { descriptors: u64, max: u64 },
    /// A negative id (from a signed NumPy or torch array).
    #[error("{side} id at position {position} is negative ({value})")]
    NegativeId {
        side: BlockSide,
        position: usize,
        value: i64,
    },
    /// An id is not a block of its layout.
    #[error("{side} id at position {position} is {id}, outside the layout's {blocks} blocks")]
    IdOutOfRange {
        side: BlockSide,
        position: usize,
        id: u64,
        blocks: u64,
    },
    /// A destination block appears twice: the two writes would overlap.
    #[error("destination block {id} appears twice (again at position {position})")]
    DuplicateDestination { position: usize, id: u64 },
    /// Source and destination are one region and a block is both read and written by the
    /// transfer: the order of its copies is not defined.
    #[error(
        "block {id} is read (source position {position}) and written by the same transfer on \
         one region"
    )]
    SourceIsDestination { position: usize, id: u64 },
}
