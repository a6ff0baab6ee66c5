//! Block ids: the integer types accepted, and the one-pass check of a post's id lists (range,
//! duplicate destinations, blocks both read and written on one region) that also copies them
//! into pooled buffers the backend reads after `post` has returned.

use super::error::{BlockError, BlockSide};
use std::collections::HashSet;

mod sealed {
    pub trait Sealed {}
}

/// An integer type block ids may be given in: `u32`, `u64`, `usize`, `i32`, `i64` (what NumPy
/// and torch index arrays hold). Sealed.
pub trait BlockIndex: Copy + Send + Sync + 'static + sealed::Sealed {
    /// The id, or `Err(value)` for a negative one.
    fn id(self) -> Result<u64, i64>;
}

macro_rules! unsigned {
    ($($t:ty),*) => {$(
        impl sealed::Sealed for $t {}
        impl BlockIndex for $t {
            #[inline]
            fn id(self) -> Result<u64, i64> {
                Ok(self as u64)
            }
        }
    )*};
}
macro_rules! signed {
    ($($t:ty),*) => {$(
        impl sealed::Sealed for $t {}
        impl BlockIndex for $t {
            #[inline]
            fn id(self) -> Result<u64, i64> {
                if self < 0 { Err(self as i64) } else { Ok(self as u64) }
            }
        }
    )*};
}
unsigned!(u32, u64, usize);
signed!(i32, i64);

/// Most destination blocks whose duplicates are found with a bitmap (2^24 bits, 2 MiB, kept
/// with the buffers); layouts with more blocks sort a copy of the ids instead.
const BITMAP_MAX_BLOCKS: u64 = 1 << 24;

/// The checked ids of one post, and the scratch used to check them. Pooled by the prepared
/// transfer, so that a steady stream of posts allocates nothing.
#[derive(Debug, Default)]
pub(crate) struct IdBuf {
    pub(crate) src: Vec<u32>,
    pub(crate) dst: Vec<u32>,
    /// One bit per destination block, all clear between posts.
    seen: Vec<u64>,
    /// Sorted ids, for layouts above [`BITMAP_MAX_BLOCKS`].
    sorted: Vec<u32>,
}

/// The id lists' shapes a check needs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct IdLimits {
    pub src_blocks: u64,
    pub dst_blocks: u64,
    /// Source and destination are one region (with one layout): no block may be both read
    /// and written.
    pub same_region: bool,
}

impl IdBuf {
    /// Checks `src` and `dst` against `lim` and keeps them (as `u32`, which every layout's ids
    /// fit: [`super::MAX_LAYOUT_BLOCKS`]). One pass over both lists, plus one over the
    /// destinations to clear the bitmap (and one over the sources for one region).
    ///
    /// Errors, the first problem in list order: [`BlockError::Empty`],
    /// [`BlockError::IdCountMismatch`], [`BlockError::NegativeId`],
    /// [`BlockError::IdOutOfRange`], [`BlockError::DuplicateDestination`],
    /// [`BlockError::SourceIsDestination`]. The buffer is left empty then.
    pub(crate) fn fill<I: BlockIndex>(
        &mut self,
        src: &[I],
        dst: &[I],
        lim: IdLimits,
    ) -> Result<(), BlockError> {
        self.src.clear();
        self.dst.clear();
        if src.len() != dst.len() {
            return Err(BlockError::IdCountMismatch {
                src: src.len(),
                dst: dst.len(),
            });
        }
        if src.is_empty() {
            return Err(BlockError::Empty);
        }
        let bitmap = lim.dst_blocks <= BITMAP_MAX_BLOCKS;
        if bitmap {
            let words = lim.dst_blocks.div_ceil(64) as usize;
            if self.seen.len() < words {
                self.seen.resize(words, 0);
            }
        }
        self.src.reserve(src.len());
        self.dst.reserve(dst.len());
        let r = self.fill_checked(src, dst, lim, bitmap);
        if bitmap {
            // Only the bits this post set: O(ids), not O(blocks).
            for &d in &self.dst {
                self.seen[(d / 64) as usize] &= !(1u64 << (d % 64));
            }
        }
        if r.is_err() {
            self.src.clear();
            self.dst.clear();
        }
        r
    }

    fn fill_checked<I: BlockIndex>(
        &mut self,
        src: &[I],
        dst: &[I],
        lim: IdLimits,
        bitmap: bool,
    ) -> Result<(), BlockError> {
        let id = |side, position, v: I, blocks| match v.id() {
            Err(value) => Err(BlockError::NegativeId {
                side,
                position,
                value,
            }),
            Ok(id) if id >= blocks => Err(BlockError::IdOutOfRange {
                side,
                position,
                id,
                blocks,
            }),
            Ok(id) => Ok(id as u32),
        };
        for (position, (&s, &d)) in src.iter().zip(dst).enumerate() {
            let s = id(BlockSide::Src, position, s, lim.src_blocks)?;
            let d = id(BlockSide::Dst, position, d, lim.dst_blocks)?;
            if bitmap {
                let (w, bit) = ((d / 64) as usize, 1u64 << (d % 64));
                if self.seen[w] & bit != 0 {
                    return Err(BlockError::DuplicateDestination {
                        position,
                        id: d as u64,
                    });
                }
                self.seen[w] |= bit;
            }
            self.src.push(s);
            self.dst.push(d);
        }
        if bitmap {
            if lim.same_region {
                for (position, &s) in self.src.iter().enumerate() {
                    if self.seen[(s / 64) as usize] & (1u64 << (s % 64)) != 0 {
                        return Err(BlockError::SourceIsDestination {
                            position,
                            id: s as u64,
                        });
                    }
                }
            }
            return Ok(());
        }
        self.check_sorted(lim.same_region)
    }

    /// Duplicate and shared-block checks by sorting (layouts above the bitmap's limit). The
    /// first offending position is found again with a set only when there is one.
    fn check_sorted(&mut self, same_region: bool) -> Result<(), BlockError> {
        self.sorted.clear();
        self.sorted.extend_from_slice(&self.dst);
        self.sorted.sort_unstable();
        if self.sorted.windows(2).any(|w| w[0] == w[1]) {
            let mut seen = HashSet::with_capacity(self.dst.len());
            let (position, &id) = self
                .dst
                .iter()
                .enumerate()
                .find(|(_, d)| !seen.insert(**d))
                .expect("a duplicate exists");
            return Err(BlockError::DuplicateDestination {
                position,
                id: id as u64,
            });
        }
        if same_region {
            if let Some((position, &id)) = self
                .src
                .iter()
                .enumerate()
                .find(|(_, s)| self.sorted.binary_search(s).is_ok())
            {
                return Err(BlockError::SourceIsDestination {
                    position,
                    id: id as u64,
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lim(src: u64, dst: u64, same: bool) -> IdLimits {
        IdLimits {
            src_blocks: src,
            dst_blocks: dst,
            same_region: same,
        }
    }

    #[test]
    fn ids_are_checked_in_order_and_kept() {
        let mut b = IdBuf::default();
        b.fill(&[3u32, 1, 2], &[0u32, 9, 5], lim(4, 10, false))
            .unwrap();
        assert_eq!(
            (b.src.as_slice(), b.dst.as_slice()),
            (&[3, 1, 2][..], &[0, 9, 5][..])
        );
        assert_eq!(
            b.fill(&[0i64, 4], &[1i64, 2], lim(4, 10, false)),
            Err(BlockError::IdOutOfRange {
                side: BlockSide::Src,
                position: 1,
                id: 4,
                blocks: 4
            })
        );
        assert!(
            b.src.is_empty() && b.dst.is_empty(),
            "nothing kept on error"
        );
        assert_eq!(
            b.fill(&[0i32, 1], &[1i32, -3], lim(4, 10, false)),
            Err(BlockError::NegativeId {
                side: BlockSide::Dst,
                position: 1,
                value: -3
            })
        );
        assert_eq!(
            b.fill::<u32>(&[], &[], lim(4, 10, false)),
            Err(BlockError::Empty)
        );
        assert_eq!(
            b.fill(&[1u64], &[1u64, 2], lim(4, 10, false)),
            Err(BlockError::IdCountMismatch { src: 1, dst: 2 })
        );
    }

    #[test]
    fn duplicates_and_shared_blocks_are_found_both_ways() {
        for dst_blocks in [100, BITMAP_MAX_BLOCKS + 1] {
            let mut b = IdBuf::default();
            assert_eq!(
                b.fill(
                    &[0u32, 1, 2, 3],
                    &[7u32, 8, 7, 8],
                    lim(4, dst_blocks, false)
                ),
                Err(BlockError::DuplicateDestination { position: 2, id: 7 }),
                "{dst_blocks}"
            );
            // The bitmap was cleared: the same destinations pass now.
            b.fill(&[0u32, 1], &[7u32, 8], lim(4, dst_blocks, false))
                .unwrap();
            // One region: block 8 is written (position 1) and read (position 0).
            assert_eq!(
                b.fill(&[8u32, 1], &[2u32, 8], lim(dst_blocks, dst_blocks, true)),
                Err(BlockError::SourceIsDestination { position: 0, id: 8 }),
                "{dst_blocks}"
            );
            // A block copied onto itself counts too.
            assert!(matches!(
                b.fill(&[5u32], &[5u32], lim(dst_blocks, dst_blocks, true)),
                Err(BlockError::SourceIsDestination { id: 5, .. })
            ));
            b.fill(&[8u32, 1], &[2u32, 3], lim(dst_blocks, dst_blocks, true))
                .unwrap();
            // Sources may repeat (one block fanned out to many).
            b.fill(&[1u32, 1, 1], &[4u32, 5, 6], lim(4, dst_blocks, false))
                .unwrap();
        }
    }

    #[test]
    fn a_hundred_thousand_ids_check_without_reallocating() {
        let n = 100_000u32;
        let src: Vec<u32> = (0..n).collect();
        let dst: Vec<u32> = (0..n).map(|i| (i * 7919) % n).collect();
        let mut b = IdBuf::default();
        b.fill(&src, &dst, lim(n as u64, n as u64, false)).unwrap();
        let caps = (b.src.capacity(), b.dst.capacity(), b.seen.capacity());
        let t = std::time::Instant::now();
        b.fill(&src, &dst, lim(n as u64, n as u64, false)).unwrap();
        eprintln!("checked {n} id pairs in {:?}", t.elapsed());
        assert_eq!(
            caps,
            (b.src.capacity(), b.dst.capacity(), b.seen.capacity())
        );
        assert!(b.seen.iter().all(|&w| w == 0));
    }
}
