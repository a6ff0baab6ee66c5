//! Descriptor lists without the GPU: the descriptor type, the checks every list passes before
//! anything is enqueued, and coalescing. Pure functions, O(N) (O(N log R) against R regions).

use crate::error::blocks::{BlockListError, Side};

/// One copy of a block list: `len` bytes from address `src` to address `dst`.
///
/// Addresses are what the copy engines and kernels of the stream's context use: device
/// pointers of that context, device pointers of a peer GPU, IPC mappings, and pinned host
/// memory by its host pointer (unified addressing: the same value on host and device). Laid out
/// as the kernel reads it (`repr(C)`, three little-endian u64, 24 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct BlockCopy {
    /// Destination address.
    pub dst: u64,
    /// Source address.
    pub src: u64,
    /// Bytes to copy; at least 1.
    pub len: u64,
}

impl BlockCopy {
    /// A descriptor.
    pub const fn new(dst: u64, src: u64, len: u64) -> BlockCopy {
        BlockCopy { dst, src, len }
    }
}

/// Most descriptors one call takes: 2^24, which bounds the kernel's pinned and device staging
/// (24 bytes a descriptor); a larger list is split by the caller.
pub const MAX_BLOCKS_PER_CALL: usize = 1 << 24;

/// The checks that need no regions: count, zero lengths, address overflow, self-overlap.
///
/// Errors: the first problem found, in list order, as a [`BlockListError`].
pub fn check_list(blocks: &[BlockCopy]) -> Result<(), BlockListError> {
    check_count(blocks)?;
    for (index, b) in blocks.iter().enumerate() {
        check_one(index, b)?;
    }
    Ok(())
}

/// The count checks: not empty, at most [`MAX_BLOCKS_PER_CALL`].
pub(crate) fn check_count(blocks: &[BlockCopy]) -> Result<(), BlockListError> {
    if blocks.is_empty() {
        return Err(BlockListError::Empty);
    }
    if blocks.len() > MAX_BLOCKS_PER_CALL {
        return Err(BlockListError::TooMany {
            count: blocks.len(),
            max: MAX_BLOCKS_PER_CALL,
        });
    }
    Ok(())
}

fn check_one(index: usize, b: &BlockCopy) -> Result<(u64, u64), BlockListError> {
    if b.len == 0 {
        return Err(BlockListError::ZeroLength { index });
    }
    let end = |side, addr: u64| {
        addr.checked_add(b.len).ok_or(BlockListError::Overflow {
            index,
            side,
            addr,
            len: b.len,
        })
    };
    let (dst_end, src_end) = (end(Side::Dst, b.dst)?, end(Side::Src, b.src)?);
    if b.dst < src_end && b.src < dst_end {
        return Err(BlockListError::SelfOverlap {
            index,
            dst: b.dst,
            src: b.src,
            len: b.len,
        });
    }
    Ok((dst_end, src_end))
}

/// The address ranges of one side's regions, sorted for lookup.
#[derive(Debug, Default)]
pub(crate) struct RegionIndex {
    /// (start, end, caller's index), sorted by start, disjoint.
    spans: Vec<(u64, u64, usize)>,
}

impl RegionIndex {
    /// Index `(addr, len)` ranges of `side`.
    ///
    /// Errors: [`BlockListError::NoRegions`], [`BlockListError::OverlappingRegions`].
    pub(crate) fn new(
        side: Side,
        ranges: impl Iterator<Item = (u64, u64)>,
    ) -> Result<RegionIndex, BlockListError> {
        let mut spans: Vec<(u64, u64, usize)> = ranges
            .enumerate()
            .map(|(i, (a, l))| (a, a.saturating_add(l), i))
            .collect();
        if spans.is_empty() {
            return Err(BlockListError::NoRegions { side });
        }
        spans.sort_unstable();
        for w in spans.windows(2) {
            if w[1].0 < w[0].1 {
                return Err(BlockListError::OverlappingRegions {
                    side,
                    a: w[0].2.min(w[1].2),
                    b: w[0].2.max(w[1].2),
                });
            }
        }
        Ok(RegionIndex { spans })
    }

    /// The caller's index of the region holding `[addr, end)`, if one does.
    #[cfg(test)]
    pub(crate) fn find(&self, addr: u64, end: u64) -> Option<usize> {
        self.span(addr, end).map(|s| s.2)
    }

    /// The span (start, end, caller's index) holding `[addr, end)`, if one does.
    fn span(&self, addr: u64, end: u64) -> Option<(u64, u64, usize)> {
        let i = self.spans.partition_point(|s| s.0 <= addr);
        let s = *self.spans.get(i.checked_sub(1)?)?;
        (end <= s.1).then_some(s)
    }
}

/// A run of descriptors being merged by [`plan`]: the merged descriptor and the spans of the
/// regions holding its two ends.
struct Run {
    copy: BlockCopy,
    dst: (u64, u64, usize),
    src: (u64, u64, usize),
}

/// The length of `prev` extended by `next`, when `next` continues `prev` on both sides.
fn continued(prev: &BlockCopy, next: &BlockCopy) -> Option<u64> {
    (prev.dst.checked_add(prev.len)? == next.dst && prev.src.checked_add(prev.len)? == next.src)
        .then(|| prev.len.checked_add(next.len))
        .flatten()
}

/// What [`plan`] saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Planned {
    /// Descriptors emitted (after coalescing).
    pub runs: usize,
    /// Bytes of the list.
    pub bytes: u64,
    /// Longest emitted descriptor.
    pub max_len: u64,
}

/// Check every descriptor of `blocks` (as [`check_list`]; and, given `regions` (destination,
/// source), that each range lies inside a region of its side) and coalesce, in one pass:
/// `emit(copy, dst_region, src_region)` receives each merged descriptor in order, with the
/// caller's indices of its regions (0 without regions). A run is merged only while it stays
/// inside the regions of its first descriptor (a copy must not span two allocations).
///
/// Errors: the first problem in list order; the descriptors emitted before it are then to be
/// discarded.
pub(crate) fn plan(
    blocks: &[BlockCopy],
    regions: Option<(&RegionIndex, &RegionIndex)>,
    mut emit: impl FnMut(BlockCopy, usize, usize),
) -> Result<Planned, BlockListError> {
    check_count(blocks)?;
    const ANYWHERE: (u64, u64, usize) = (0, u64::MAX, 0);
    let mut seen = Planned::default();
    let mut flush = |r: Run, seen: &mut Planned| {
        seen.runs += 1;
        seen.max_len = seen.max_len.max(r.copy.len);
        emit(r.copy, r.dst.2, r.src.2);
    };
    let mut run: Option<Run> = None;
    // Region spans of the previous descriptor: most lists stay in one region per side, so the
    // binary search is skipped while they do.
    let (mut last_dst, mut last_src) = ((1, 0, 0), (1, 0, 0));
    for (index, b) in blocks.iter().enumerate() {
        let (dst_end, src_end) = check_one(index, b)?;
        let find = |idx: &RegionIndex, last: (u64, u64, usize), side, addr, end| {
            if last.0 <= addr && end <= last.1 {
                Ok(last)
            } else {
                idx.span(addr, end).ok_or(BlockListError::OutsideRegions {
                    index,
                    side,
                    addr,
                    end,
                })
            }
        };
        (last_dst, last_src) = match regions {
            Some((d, s)) => (
                find(d, last_dst, Side::Dst, b.dst, dst_end)?,
                find(s, last_src, Side::Src, b.src, src_end)?,
            ),
            None => (ANYWHERE, ANYWHERE),
        };
        seen.bytes += b.len;
        if let Some(r) = &mut run {
            if let Some(len) = continued(&r.copy, b) {
                if dst_end <= r.dst.1 && src_end <= r.src.1 {
                    r.copy.len = len;
                    continue;
                }
            }
        }
        if let Some(r) = run.take() {
            flush(r, &mut seen);
        }
        run = Some(Run {
            copy: *b,
            dst: last_dst,
            src: last_src,
        });
    }
    if let Some(r) = run {
        flush(r, &mut seen);
    }
    Ok(seen)
}

/// [`plan`] into `out`, which has room for every descriptor of `blocks` (coalescing only
/// shrinks a list). One thread: splitting the pass over threads did not pay for starting them
/// (docs/gpu.md, "Block-list copies").
///
/// Errors: as [`plan`]'s.
pub(crate) fn plan_into(
    blocks: &[BlockCopy],
    regions: Option<(&RegionIndex, &RegionIndex)>,
    out: &mut [BlockCopy],
) -> Result<Planned, BlockListError> {
    let mut k = 0;
    plan(blocks, regions, |c, _, _| {
        out[k] = c;
        k += 1;
    })
}

/// Merge runs of descriptors that continue each other on both sides (`dst` and `src` each
/// start where the previous one ended) into single descriptors, in one pass, keeping order.
/// `out` is cleared first. A merge whose length would overflow u64 is not made.
///
/// Coalescing never changes which bytes go where; it only lowers the count the driver or the
/// kernel sees, which is what its cost per descriptor is paid for.
pub fn coalesce(blocks: &[BlockCopy], out: &mut Vec<BlockCopy>) {
    out.clear();
    let Some((first, rest)) = blocks.split_first() else {
        return;
    };
    let mut cur = *first;
    for b in rest {
        match continued(&cur, b) {
            Some(len) => cur.len = len,
            None => {
                out.push(cur);
                cur = *b;
            }
        }
    }
    out.push(cur);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(dst: u64, src: u64, len: u64) -> BlockCopy {
        BlockCopy::new(dst, src, len)
    }

    #[test]
    fn coalescing_merges_runs_contiguous_on_both_sides_only() {
        let list = [
            b(1000, 5000, 10),
            b(1010, 5010, 10), // continues both: merged
            b(1020, 5030, 10), // dst continues, src jumps: new
            b(1030, 5040, 5),  // continues: merged
            b(2000, 5045, 5),  // src continues, dst jumps: new
            b(2005, 5050, 1),  // merged
            b(0, 0, 7),        // new
        ];
        let mut out = Vec::new();
        coalesce(&list, &mut out);
        assert_eq!(
            out,
            [
                b(1000, 5000, 20),
                b(1020, 5030, 15),
                b(2000, 5045, 6),
                b(0, 0, 7)
            ]
        );
        assert_eq!(
            out.iter().map(|d| d.len).sum::<u64>(),
            list.iter().map(|d| d.len).sum::<u64>()
        );
        coalesce(&[], &mut out);
        assert!(out.is_empty());
        coalesce(&list[..1], &mut out);
        assert_eq!(out, [list[0]]);
    }

    #[test]
    fn coalescing_a_long_run_is_one_descriptor_and_linear() {
        let n = 100_000u64;
        let list: Vec<BlockCopy> = (0..n)
            .map(|i| b((1 << 40) + i * 4096, (1 << 20) + i * 4096, 4096))
            .collect();
        let mut out = Vec::new();
        let t = std::time::Instant::now();
        coalesce(&list, &mut out);
        let took = t.elapsed();
        assert_eq!(out, [b(1 << 40, 1 << 20, n * 4096)]);
        // Reversed order: nothing continues its predecessor.
        let rev: Vec<BlockCopy> = list.iter().rev().copied().collect();
        coalesce(&rev, &mut out);
        assert_eq!(out, rev);
        eprintln!("coalesced {n} descriptors in {took:?}");
    }

    #[test]
    fn coalescing_never_wraps_or_crosses_a_boundary() {
        let list = [b(u64::MAX - 20, 0, 10), b(u64::MAX - 10, 10, 10)];
        let mut out = Vec::new();
        coalesce(&list, &mut out);
        assert_eq!(out, [b(u64::MAX - 20, 0, 20)]);
        // A length that would overflow u64 is not merged.
        let huge = [b(0, 1 << 63, 1 << 63), b(1 << 63, 0, 1 << 63)];
        coalesce(&huge, &mut out);
        assert_eq!(out.len(), 2);
    }

    #[test]
    fn list_checks_name_the_descriptor() {
        assert_eq!(check_list(&[]), Err(BlockListError::Empty));
        assert_eq!(
            check_list(&[b(0, 100, 1), b(5, 200, 0)]),
            Err(BlockListError::ZeroLength { index: 1 })
        );
        assert_eq!(
            check_list(&[b(u64::MAX, 0, 1)]),
            Err(BlockListError::Overflow {
                index: 0,
                side: Side::Dst,
                addr: u64::MAX,
                len: 1
            })
        );
        assert_eq!(
            check_list(&[b(0, 16, 16), b(0, u64::MAX - 1, 2)]),
            Err(BlockListError::Overflow {
                index: 1,
                side: Side::Src,
                addr: u64::MAX - 1,
                len: 2
            })
        );
        assert_eq!(
            check_list(&[b(100, 90, 11)]),
            Err(BlockListError::SelfOverlap {
                index: 0,
                dst: 100,
                src: 90,
                len: 11
            })
        );
        // Touching is not overlapping.
        check_list(&[b(100, 90, 10), b(90, 100, 10)]).unwrap();
        let e = check_list(&vec![b(0, 1 << 40, 1); MAX_BLOCKS_PER_CALL + 1]).unwrap_err();
        assert_eq!(
            e,
            BlockListError::TooMany {
                count: MAX_BLOCKS_PER_CALL + 1,
                max: MAX_BLOCKS_PER_CALL
            }
        );
        assert!(e.to_string().contains("16777217"), "{e}");
    }

    #[test]
    fn regions_find_ranges_and_refuse_overlap() {
        let idx = RegionIndex::new(
            Side::Dst,
            [(1000u64, 100u64), (0, 10), (500, 500)].into_iter(),
        )
        .unwrap();
        assert_eq!(idx.find(0, 10), Some(1));
        assert_eq!(idx.find(5, 11), None, "runs past region 1");
        assert_eq!(idx.find(500, 1000), Some(2));
        assert_eq!(idx.find(999, 1001), None, "straddles regions 2 and 0");
        assert_eq!(idx.find(1000, 1100), Some(0));
        assert_eq!(idx.find(1100, 1101), None);
        assert_eq!(idx.find(20, 30), None, "in a gap");
        assert_eq!(
            RegionIndex::new(Side::Src, std::iter::empty()).unwrap_err(),
            BlockListError::NoRegions { side: Side::Src }
        );
        assert_eq!(
            RegionIndex::new(Side::Src, [(0u64, 10u64), (50, 10), (9, 2)].into_iter()).unwrap_err(),
            BlockListError::OverlappingRegions {
                side: Side::Src,
                a: 0,
                b: 2
            }
        );
    }

    #[test]
    fn planning_checks_against_regions_and_coalesces() {
        let dst = RegionIndex::new(Side::Dst, [(1 << 30, 1 << 20)].into_iter()).unwrap();
        let src = RegionIndex::new(
            Side::Src,
            [(0x7000_0000, 4096), (0x10_0000, 65536)].into_iter(),
        )
        .unwrap();
        let (mut out, mut regions) = (Vec::new(), Vec::new());
        let seen = plan_into_vec(
            &[
                b(1 << 30, 0x7000_0000, 4096),
                b((1 << 30) + 4096, 0x10_0001, 3),
                b((1 << 30) + 4099, 0x10_0004, 5), // continues the previous one: merged
            ],
            &dst,
            &src,
            &mut out,
            &mut regions,
        )
        .unwrap();
        assert_eq!(
            seen,
            Planned {
                runs: 2,
                bytes: 4104,
                max_len: 4096
            }
        );
        assert_eq!(
            out,
            [
                b(1 << 30, 0x7000_0000, 4096),
                b((1 << 30) + 4096, 0x10_0001, 8)
            ]
        );
        assert_eq!(regions, [(0, 0), (0, 1)]);
        let e = plan_into_vec(
            &[
                b(1 << 30, 0x7000_0000, 1),
                b((1 << 30) + (1 << 20) - 1, 0x10_0000, 2),
            ],
            &dst,
            &src,
            &mut out,
            &mut regions,
        )
        .unwrap_err();
        assert_eq!(
            e,
            BlockListError::OutsideRegions {
                index: 1,
                side: Side::Dst,
                addr: (1 << 30) + (1 << 20) - 1,
                end: (1 << 30) + (1 << 20) + 1
            }
        );
        assert!(e.to_string().contains("descriptor 1: destination"), "{e}");
        let e = plan_into_vec(
            &[b(1 << 30, 0x7000_0fff, 2)],
            &dst,
            &src,
            &mut out,
            &mut regions,
        )
        .unwrap_err();
        assert!(matches!(
            e,
            BlockListError::OutsideRegions {
                side: Side::Src,
                ..
            }
        ));
        for (list, want) in [
            (vec![], BlockListError::Empty),
            (
                vec![b(1 << 30, 0x7000_0000, 0)],
                BlockListError::ZeroLength { index: 0 },
            ),
        ] {
            assert_eq!(
                plan_into_vec(&list, &dst, &src, &mut out, &mut regions),
                Err(want)
            );
        }
    }

    #[test]
    fn planning_never_merges_across_adjacent_regions() {
        // Two source regions back to back (two allocations that happen to be adjacent): a run
        // continuing from one into the other stays two copies.
        let dst = RegionIndex::new(Side::Dst, [(0u64, 1000u64)].into_iter()).unwrap();
        let src =
            RegionIndex::new(Side::Src, [(5000u64, 100u64), (5100, 100)].into_iter()).unwrap();
        let (mut out, mut regions) = (Vec::new(), Vec::new());
        plan_into_vec(
            &[
                b(0, 5000, 50),
                b(50, 5050, 50),
                b(100, 5100, 50),
                b(150, 5150, 50),
            ],
            &dst,
            &src,
            &mut out,
            &mut regions,
        )
        .unwrap();
        assert_eq!(out, [b(0, 5000, 100), b(100, 5100, 100)]);
        assert_eq!(regions, [(0, 0), (0, 1)]);
        // coalesce (no regions) merges all four.
        let mut all = Vec::new();
        coalesce(
            &[
                b(0, 5000, 50),
                b(50, 5050, 50),
                b(100, 5100, 50),
                b(150, 5150, 50),
            ],
            &mut all,
        );
        assert_eq!(all, [b(0, 5000, 200)]);
    }

    #[test]
    fn planning_100k_descriptors_is_cheap() {
        let n = 100_000u32;
        let block = 16384u64;
        let (d, s) = (
            crate::pattern::shuffled(n, 1),
            crate::pattern::shuffled(n, 2),
        );
        let (dst, src) = (1u64 << 40, 1u64 << 36);
        let list: Vec<BlockCopy> = (0..n as usize)
            .map(|i| b(dst + d[i] as u64 * block, src + s[i] as u64 * block, block))
            .collect();
        let di = RegionIndex::new(Side::Dst, [(dst, n as u64 * block)].into_iter()).unwrap();
        let si = RegionIndex::new(Side::Src, [(src, n as u64 * block)].into_iter()).unwrap();
        let (mut out, mut regions) = (Vec::new(), Vec::new());
        let mut total = 0;
        // The first run grows the output vectors; later ones reuse them, as a copier does.
        for run in 0..3 {
            let t = std::time::Instant::now();
            total = plan_into_vec(&list, &di, &si, &mut out, &mut regions)
                .unwrap()
                .bytes;
            eprintln!("run {run}: planned {n} descriptors in {:?}", t.elapsed());
        }
        assert_eq!(total, n as u64 * block);
        assert_eq!(out.len() + count_merges(&list), list.len());
    }

    /// [`plan`] into vectors.
    fn plan_into_vec(
        list: &[BlockCopy],
        dst: &RegionIndex,
        src: &RegionIndex,
        out: &mut Vec<BlockCopy>,
        regions: &mut Vec<(usize, usize)>,
    ) -> Result<Planned, BlockListError> {
        out.clear();
        regions.clear();
        plan(list, Some((dst, src)), |c, d, s| {
            out.push(c);
            regions.push((d, s));
        })
    }

    #[test]
    fn planning_without_regions_is_checking_and_coalescing() {
        let list = [
            b(0, 100, 10),
            b(10, 110, 10),
            b(u64::MAX - 5, 0, 5),
            b(7, 300, 1),
        ];
        let mut out = Vec::new();
        let seen = plan(&list, None, |c, d, s| {
            assert_eq!((d, s), (0, 0));
            out.push(c);
        })
        .unwrap();
        let mut merged = Vec::new();
        coalesce(&list, &mut merged);
        assert_eq!(out, merged);
        assert_eq!(
            seen,
            Planned {
                runs: 3,
                bytes: 26,
                max_len: 20
            }
        );
        assert_eq!(
            plan(&[b(0, 1, 2)], None, |_, _, _| ()),
            Err(BlockListError::SelfOverlap {
                index: 0,
                dst: 0,
                src: 1,
                len: 2
            })
        );
    }

    #[test]
    fn planning_into_a_slice_is_planning() {
        // Runs of 5 that continue each other on both sides, in two source regions back to
        // back: one run continues across the regions' boundary and is not merged there.
        let block = 4096u64;
        let (dst, src) = (1u64 << 40, 1u64 << 30);
        let half = 1_202u64 * block;
        let list: Vec<BlockCopy> = (0..2_000u64)
            .map(|i| b(dst + i * block, src + (i + i / 5) * block, block))
            .collect();
        let di = RegionIndex::new(Side::Dst, [(dst, 2_000 * block)].into_iter()).unwrap();
        let si =
            RegionIndex::new(Side::Src, [(src, half), (src + half, half)].into_iter()).unwrap();
        let (mut serial, mut regions) = (Vec::new(), Vec::new());
        let want = plan_into_vec(&list, &di, &si, &mut serial, &mut regions).unwrap();
        assert_eq!(want.runs, 401, "one run split at the region boundary");
        let mut out = vec![BlockCopy::default(); list.len()];
        let got = plan_into(&list, Some((&di, &si)), &mut out).unwrap();
        assert_eq!(got, want);
        assert_eq!(&out[..got.runs], &serial[..]);
        // Without regions: the same as coalesce (the boundary run merges too).
        let got = plan_into(&list, None, &mut out).unwrap();
        let mut merged = Vec::new();
        coalesce(&list, &mut merged);
        assert_eq!(&out[..got.runs], &merged[..]);
        assert_eq!(merged.len(), 400);
    }

    /// Pairs of neighbours in `list` that continue each other (what coalescing removes).
    fn count_merges(list: &[BlockCopy]) -> usize {
        list.windows(2)
            .filter(|w| continued(&w[0], &w[1]).is_some())
            .count()
    }

    #[test]
    fn descriptor_layout_is_what_the_kernel_reads() {
        assert_eq!(std::mem::size_of::<BlockCopy>(), 24);
        assert_eq!(std::mem::align_of::<BlockCopy>(), 8);
        let d = b(1, 2, 3);
        // SAFETY: BlockCopy is repr(C) plain data of 24 bytes.
        let bytes: [u8; 24] = unsafe { std::mem::transmute(d) };
        assert_eq!(&bytes[0..8], &1u64.to_le_bytes());
        assert_eq!(&bytes[8..16], &2u64.to_le_bytes());
        assert_eq!(&bytes[16..24], &3u64.to_le_bytes());
    }
}
