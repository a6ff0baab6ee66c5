//! Where the blocks of a KV cache lie in a region, and the checks a layout passes once, when a
//! block transfer is prepared.

use super::error::{BlockError, BlockSide, LayoutDim};
use super::MAX_LAYOUT_BLOCKS;
use crate::region::RegionId;
use serde::{Deserialize, Serialize};

/// The shape of a KV cache in a registered region: `blocks` block slots per layer and K/V
/// plane, each `block_size` bytes. The slot of block `id` in layer `l` and plane `k` starts at
///
/// `offset + l × layer_stride + k × kv_stride + id × block_stride` (bytes into the region).
///
/// One block id of a transfer is `layers × kv` descriptors of `block_size` bytes. vLLM's GPU
/// cache `[layers][2][blocks][block bytes]` is `KvLayout::new(bs, n).kv(2, n × bs)
/// .layers(L, 2 × n × bs)`; a CPU tier `[blocks][layers][2][bs]` is `KvLayout::new(bs, n)
/// .block_stride(L × 2 × bs).layers(L, 2 × bs).kv(2, bs)`. Strides of dimensions whose count is
/// 1 are not used.
///
/// A destination layout's slots must be disjoint. The rule checked (the one PyTorch uses to
/// call a strided tensor free of internal overlap): sorted by stride, every dimension's stride
/// is at least the bytes that one of its steps covers (the block, then all slots of the finer
/// dimensions). Layouts that interleave dimensions in other ways are refused with
/// [`BlockError::Overlap`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct KvLayout {
    /// Byte offset of block 0 of layer 0, plane 0 in the region.
    pub offset: u64,
    /// Bytes of one block in one layer and plane: one descriptor. At least 1.
    pub block_size: u64,
    /// Bytes from a block's slot to the next id's.
    pub block_stride: u64,
    /// Block slots per layer and plane (ids `0..blocks`), at most [`MAX_LAYOUT_BLOCKS`].
    pub blocks: u64,
    /// Layers (1 for a flat pool of blocks).
    pub layers: u64,
    /// Bytes from a layer to the next.
    pub layer_stride: u64,
    /// K/V planes: 1 (K and V in one block) or more (2: separate K and V).
    pub kv: u64,
    /// Bytes from the K plane to the V plane.
    pub kv_stride: u64,
}

impl KvLayout {
    /// `blocks` slots of `block_size` bytes back to back from offset 0, one layer, one plane.
    pub fn new(block_size: u64, blocks: u64) -> KvLayout {
        KvLayout {
            offset: 0,
            block_size,
            block_stride: block_size,
            blocks,
            layers: 1,
            layer_stride: 0,
            kv: 1,
            kv_stride: 0,
        }
    }

    /// The same layout starting `offset` bytes into the region.
    pub fn offset(mut self, offset: u64) -> KvLayout {
        self.offset = offset;
        self
    }

    /// The same layout with block slots `stride` bytes apart.
    pub fn block_stride(mut self, stride: u64) -> KvLayout {
        self.block_stride = stride;
        self
    }

    /// The same layout with `layers` layers `stride` bytes apart.
    pub fn layers(mut self, layers: u64, stride: u64) -> KvLayout {
        self.layers = layers;
        self.layer_stride = stride;
        self
    }

    /// The same layout with `planes` K/V planes `stride` bytes apart.
    pub fn kv(mut self, planes: u64, stride: u64) -> KvLayout {
        self.kv = planes;
        self.kv_stride = stride;
        self
    }

    /// Descriptors per block id: `layers × kv` (saturating).
    pub fn descriptors_per_block(&self) -> u64 {
        self.layers.saturating_mul(self.kv)
    }

    /// Byte offset of block `id`'s slot in layer `layer`, plane `plane`. Only for a checked
    /// layout and arguments inside it (no overflow then).
    #[inline]
    pub(crate) fn at(&self, layer: u64, plane: u64, id: u64) -> u64 {
        self.offset + layer * self.layer_stride + plane * self.kv_stride + id * self.block_stride
    }

    /// The dimensions with more than one step: (dimension, stride, count).
    fn dims(&self) -> impl Iterator<Item = (LayoutDim, u64, u64)> {
        [
            (LayoutDim::Blocks, self.block_stride, self.blocks),
            (LayoutDim::Layers, self.layer_stride, self.layers),
            (LayoutDim::KvPlanes, self.kv_stride, self.kv),
        ]
        .into_iter()
        .filter(|d| d.2 > 1)
    }

    /// Checks the counts, overflow and (with `disjoint`) the overlap rule; returns the bytes
    /// from `offset` to the end of the last slot.
    ///
    /// Errors: [`BlockError::ZeroBlockSize`], [`BlockError::ZeroCount`],
    /// [`BlockError::TooManyBlocks`], [`BlockError::Overflow`], [`BlockError::Overlap`].
    pub(crate) fn check(&self, side: BlockSide, disjoint: bool) -> Result<u64, BlockError> {
        if self.block_size == 0 {
            return Err(BlockError::ZeroBlockSize { side });
        }
        for (dim, n) in [
            (LayoutDim::Blocks, self.blocks),
            (LayoutDim::Layers, self.layers),
            (LayoutDim::KvPlanes, self.kv),
        ] {
            if n == 0 {
                return Err(BlockError::ZeroCount { side, dim });
            }
        }
        if self.blocks > MAX_LAYOUT_BLOCKS {
            return Err(BlockError::TooManyBlocks {
                side,
                blocks: self.blocks,
                max: MAX_LAYOUT_BLOCKS,
            });
        }
        let overflow = BlockError::Overflow { side };
        // Largest offset of a slot start past `offset`, and so the span.
        let mut last = 0u64;
        for (_, stride, n) in self.dims() {
            let step = stride.checked_mul(n - 1).ok_or(overflow.clone())?;
            last = last.checked_add(step).ok_or(overflow.clone())?;
        }
        let span = last.checked_add(self.block_size).ok_or(overflow.clone())?;
        self.offset.checked_add(span).ok_or(overflow)?;
        if disjoint {
            let mut dims: Vec<(LayoutDim, u64, u64)> = self.dims().collect();
            dims.sort_by_key(|d| d.1);
            let mut covered = self.block_size;
            for (dim, stride, n) in dims {
                if stride < covered {
                    return Err(BlockError::Overlap {
                        side,
                        dim,
                        stride,
                        needed: covered,
                    });
                }
                // No overflow: bounded by `span` above.
                covered += stride * (n - 1);
            }
        }
        Ok(span)
    }

    /// Checks that the layout (of span `span`, from [`KvLayout::check`]) fits in `region_len`
    /// bytes of region `region`.
    ///
    /// Errors: [`BlockError::OutOfBounds`] naming the first block id that does not fit.
    pub(crate) fn check_bounds(
        &self,
        side: BlockSide,
        region: RegionId,
        span: u64,
        region_len: u64,
    ) -> Result<(), BlockError> {
        let needed = self.offset + span;
        if needed <= region_len {
            return Ok(());
        }
        // Block `b` ends at `base + b × block_stride`, where `base` is block 0's furthest end.
        let stride = if self.blocks > 1 {
            self.block_stride
        } else {
            0
        };
        let base = needed - stride * (self.blocks - 1);
        let first_bad = if base > region_len || stride == 0 {
            0
        } else {
            (region_len - base) / stride + 1
        };
        Err(BlockError::OutOfBounds {
            side,
            region,
            first_bad,
            blocks: self.blocks,
            needed,
            region_len,
        })
    }
}

/// Checks that `src` and `dst` pair blocks one to one: the same block size, layers and planes.
///
/// Errors: [`BlockError::Mismatch`] naming the first shape that differs.
pub(crate) fn check_pairing(src: &KvLayout, dst: &KvLayout) -> Result<(), BlockError> {
    for (what, a, b) in [
        ("block size", src.block_size, dst.block_size),
        ("layers", src.layers, dst.layers),
        ("K/V planes", src.kv, dst.kv),
    ] {
        if a != b {
            return Err(BlockError::Mismatch {
                what,
                src: a,
                dst: b,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: BlockSide = BlockSide::Dst;

    #[test]
    fn a_contiguous_pool_spans_its_blocks() {
        let l = KvLayout::new(4096, 100);
        assert_eq!(l.check(D, true), Ok(409_600));
        assert_eq!(l.at(0, 0, 99), 99 * 4096);
        l.check_bounds(D, RegionId(1), 409_600, 409_600).unwrap();
    }

    #[test]
    fn vllm_shapes_are_disjoint_and_index_as_documented() {
        let (bs, n, layers) = (16 << 10, 1000u64, 32u64);
        let gpu = KvLayout::new(bs, n)
            .kv(2, n * bs)
            .layers(layers, 2 * n * bs);
        let span = gpu.check(D, true).unwrap();
        assert_eq!(span, layers * 2 * n * bs);
        assert_eq!(gpu.at(3, 1, 7), 3 * 2 * n * bs + n * bs + 7 * bs);
        let cpu = KvLayout::new(bs, n)
            .block_stride(layers * 2 * bs)
            .layers(layers, 2 * bs)
            .kv(2, bs);
        assert_eq!(cpu.check(D, true).unwrap(), span);
        assert_eq!(cpu.at(3, 1, 7), 7 * layers * 2 * bs + 3 * 2 * bs + bs);
        check_pairing(&gpu, &cpu).unwrap();
    }

    #[test]
    fn overlapping_destination_slots_are_refused_and_named() {
        // Stride shorter than the block.
        let l = KvLayout::new(4096, 10).block_stride(4095);
        assert_eq!(
            l.check(D, true),
            Err(BlockError::Overlap {
                side: D,
                dim: LayoutDim::Blocks,
                stride: 4095,
                needed: 4096
            })
        );
        // A source may overlap itself (a block read twice is harmless).
        assert!(l.check(BlockSide::Src, false).is_ok());
        // Layers closer than one layer's blocks.
        let l = KvLayout::new(100, 10).layers(2, 900);
        assert!(matches!(
            l.check(D, true),
            Err(BlockError::Overlap {
                dim: LayoutDim::Layers,
                needed: 1000,
                ..
            })
        ));
        // Stride 0 with several blocks: every id is one slot.
        assert!(matches!(
            KvLayout::new(1, 2).block_stride(0).check(D, true),
            Err(BlockError::Overlap { stride: 0, .. })
        ));
        // Interleaved K and V (block stride 2 × size, K/V stride = size): disjoint.
        KvLayout::new(64, 10)
            .block_stride(128)
            .kv(2, 64)
            .check(D, true)
            .unwrap();
        // A count of 1 makes its stride irrelevant.
        KvLayout::new(64, 1).block_stride(0).check(D, true).unwrap();
    }

    #[test]
    fn counts_and_overflow_are_checked() {
        assert_eq!(
            KvLayout::new(0, 1).check(D, true),
            Err(BlockError::ZeroBlockSize { side: D })
        );
        assert_eq!(
            KvLayout::new(1, 0).check(D, true),
            Err(BlockError::ZeroCount {
                side: D,
                dim: LayoutDim::Blocks
            })
        );
        assert_eq!(
            KvLayout::new(1, 1).layers(0, 0).check(D, true),
            Err(BlockError::ZeroCount {
                side: D,
                dim: LayoutDim::Layers
            })
        );
        assert!(matches!(
            KvLayout::new(1, MAX_LAYOUT_BLOCKS + 1).check(D, true),
            Err(BlockError::TooManyBlocks { .. })
        ));
        assert_eq!(
            KvLayout::new(1 << 40, 1 << 30).check(D, true),
            Err(BlockError::Overflow { side: D })
        );
        assert_eq!(
            KvLayout::new(16, 1).offset(u64::MAX - 8).check(D, true),
            Err(BlockError::Overflow { side: D })
        );
    }

    #[test]
    fn bounds_name_the_first_block_that_does_not_fit() {
        let l = KvLayout::new(4096, 100).offset(100);
        let span = l.check(D, true).unwrap();
        // Room for 50 whole blocks after the offset, and a part of the 51st.
        let e = l
            .check_bounds(D, RegionId(7), span, 100 + 50 * 4096 + 10)
            .unwrap_err();
        assert_eq!(
            e,
            BlockError::OutOfBounds {
                side: D,
                region: RegionId(7),
                first_bad: 50,
                blocks: 100,
                needed: 100 + 100 * 4096,
                region_len: 100 + 50 * 4096 + 10
            }
        );
        assert!(e.to_string().contains("block 50 of 100"), "{e}");
        // Even block 0 does not fit.
        assert!(matches!(
            l.check_bounds(D, RegionId(7), span, 50),
            Err(BlockError::OutOfBounds { first_bad: 0, .. })
        ));
        // With layers, a block ends in the last layer: block 3 ends at 80 + 30 + 10 = 120.
        let l = KvLayout::new(10, 4).layers(3, 40);
        let span = l.check(D, true).unwrap();
        assert_eq!(span, 120);
        assert!(matches!(
            l.check_bounds(D, RegionId(7), span, 119),
            Err(BlockError::OutOfBounds { first_bad: 3, .. })
        ));
    }

    #[test]
    fn pairing_needs_the_same_shape() {
        let a = KvLayout::new(64, 10);
        assert_eq!(
            check_pairing(&a, &KvLayout::new(32, 10)),
            Err(BlockError::Mismatch {
                what: "block size",
                src: 64,
                dst: 32
            })
        );
        assert!(matches!(
            check_pairing(&a, &a.kv(2, 640)),
            Err(BlockError::Mismatch {
                what: "K/V planes",
                ..
            })
        ));
        // Different block counts and strides pair (a GPU cache and a larger host tier).
        check_pairing(&a, &KvLayout::new(64, 1000).block_stride(128)).unwrap();
    }
}
