//! A posted block list as a backend sees it: two checked layouts and the checked ids, turned
//! into (source offset, destination offset, length) runs one at a time, adjacent descriptors
//! merged, with no descriptor stored.

use super::layout::KvLayout;

/// One post's blocks: descriptor `(i, l, k)` copies `block_size` bytes from the source
/// layout's slot of block `src_ids[i]` in layer `l`, plane `k` to the destination layout's slot
/// of `dst_ids[i]` in the same layer and plane. Every offset is inside its region (checked at
/// prepare and post).
#[derive(Debug, Clone, Copy)]
pub struct BlockList<'a> {
    pub(crate) src: &'a KvLayout,
    pub(crate) dst: &'a KvLayout,
    pub(crate) src_ids: &'a [u32],
    pub(crate) dst_ids: &'a [u32],
}

/// Whether the finer dimensions of `l` lie inside one block's stride (`[blocks][layers][kv]`
/// order in memory).
fn block_major(l: &KvLayout) -> bool {
    (l.layers == 1 || l.layer_stride < l.block_stride)
        && (l.kv == 1 || l.kv_stride < l.block_stride)
}

impl BlockList<'_> {
    /// Block ids (pairs) posted.
    pub fn ids(&self) -> usize {
        self.src_ids.len()
    }

    /// Descriptors before merging: ids × layers × K/V planes.
    pub fn descriptors(&self) -> u64 {
        self.src_ids.len() as u64 * self.src.descriptors_per_block()
    }

    /// Bytes the list moves.
    pub fn bytes(&self) -> u64 {
        self.descriptors() * self.src.block_size
    }

    /// Bytes of one descriptor.
    pub fn block_size(&self) -> u64 {
        self.src.block_size
    }

    /// Calls `f(src_offset, dst_offset, len)` (bytes into the two regions) for every run of
    /// descriptors that continue each other on both sides, in order; returns the number of
    /// runs. The order visits the ids innermost (layer by layer, plane by plane) unless both
    /// layouts keep a block's layers and planes inside its stride, in which case each id's
    /// layers and planes are innermost: the order in which neighbours in memory follow each
    /// other, so that runs of consecutive ids (or whole blocks) merge.
    ///
    /// Coalescing never changes which bytes go where; vLLM's connectors do it by hand, because
    /// real layouts merge into far fewer descriptors (docs/gpu.md, "Block-list copies").
    pub fn for_each_run(&self, f: impl FnMut(u64, u64, u64)) -> u64 {
        self.for_each_run_in(0..self.descriptors(), f)
    }

    /// [`BlockList::for_each_run`] over descriptors `range` of that order only (runs merge
    /// within it), so that a backend can post the head of a list while it expands the rest.
    pub fn for_each_run_in(
        &self,
        range: std::ops::Range<u64>,
        mut f: impl FnMut(u64, u64, u64),
    ) -> u64 {
        let size = self.src.block_size;
        let mut runs = 0u64;
        let mut cur: Option<(u64, u64, u64)> = None;
        let mut push = |s: u64, d: u64| {
            if let Some((cs, cd, cl)) = &mut cur {
                if *cs + *cl == s && *cd + *cl == d {
                    *cl += size;
                    return;
                }
                f(*cs, *cd, *cl);
                runs += 1;
            }
            cur = Some((s, d, size));
        };
        let (layers, planes) = (self.src.layers, self.src.kv);
        let per = layers * planes;
        let n = self.src_ids.len() as u64;
        let (start, end) = (range.start, range.end.min(n * per));
        let pair = |b: u64| {
            (
                self.src_ids[b as usize] as u64,
                self.dst_ids[b as usize] as u64,
            )
        };
        if per == 1 {
            for b in start..end {
                let (s, d) = pair(b);
                push(self.src.at(0, 0, s), self.dst.at(0, 0, d));
            }
        } else if block_major(self.src) && block_major(self.dst) {
            // Descriptor i is block i / per, layer and plane from i % per.
            for i in start..end {
                let ((s, d), r) = (pair(i / per), i % per);
                let (l, k) = (r / planes, r % planes);
                push(self.src.at(l, k, s), self.dst.at(l, k, d));
            }
        } else {
            // Descriptor i is block i % n of layer and plane i / n.
            for i in start..end {
                let ((s, d), lk) = (pair(i % n), i / n);
                let (l, k) = (lk / planes, lk % planes);
                push(self.src.at(l, k, s), self.dst.at(l, k, d));
            }
        }
        if let Some((s, d, l)) = cur {
            f(s, d, l);
            runs += 1;
        }
        runs
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runs(list: &BlockList<'_>) -> Vec<(u64, u64, u64)> {
        let mut v = Vec::new();
        let n = list.for_each_run(|s, d, l| v.push((s, d, l)));
        assert_eq!(n as usize, v.len());
        assert_eq!(v.iter().map(|r| r.2).sum::<u64>(), list.bytes());
        v
    }

    #[test]
    fn consecutive_ids_merge_and_jumps_do_not() {
        let (src, dst) = (KvLayout::new(10, 100), KvLayout::new(10, 100).offset(5));
        let list = BlockList {
            src: &src,
            dst: &dst,
            src_ids: &[0, 1, 2, 7, 8, 3],
            dst_ids: &[4, 5, 6, 9, 10, 0],
        };
        assert_eq!(list.descriptors(), 6);
        assert_eq!(runs(&list), [(0, 45, 30), (70, 95, 20), (30, 5, 10)]);
    }

    #[test]
    fn layer_major_caches_merge_ids_within_a_layer() {
        // [layers][2][blocks][bs] on both sides: ids innermost.
        let l = KvLayout::new(8, 4).kv(2, 32).layers(2, 64);
        let list = BlockList {
            src: &l,
            dst: &l.offset(1000),
            src_ids: &[0, 1],
            dst_ids: &[2, 3],
        };
        assert_eq!(list.descriptors(), 8);
        assert_eq!(
            runs(&list),
            [
                (0, 1016, 16),
                (32, 1048, 16),
                (64, 1080, 16),
                (96, 1112, 16)
            ]
        );
    }

    #[test]
    fn block_major_tiers_merge_whole_blocks() {
        // [blocks][layers][2][bs] on both sides: a block's 4 descriptors are one run, and
        // consecutive ids continue it.
        let l = KvLayout::new(8, 10).block_stride(32).layers(2, 16).kv(2, 8);
        let list = BlockList {
            src: &l,
            dst: &l,
            src_ids: &[0, 1, 5],
            dst_ids: &[3, 4, 9],
        };
        assert_eq!(runs(&list), [(0, 96, 64), (160, 288, 32)]);
    }

    #[test]
    fn mixed_orders_pair_each_layer_and_plane() {
        // GPU layer-major → host block-major: every descriptor lands in its own slot.
        let (bs, n) = (4u64, 3u64);
        let gpu = KvLayout::new(bs, n).kv(2, n * bs).layers(2, 2 * n * bs);
        let host = KvLayout::new(bs, n)
            .block_stride(4 * bs)
            .layers(2, 2 * bs)
            .kv(2, bs);
        let list = BlockList {
            src: &gpu,
            dst: &host,
            src_ids: &[2],
            dst_ids: &[1],
        };
        let got = runs(&list);
        let mut want = Vec::new();
        for l in 0..2 {
            for k in 0..2 {
                want.push((gpu.at(l, k, 2), host.at(l, k, 1), bs));
            }
        }
        // Host slots of block 1 are back to back, GPU ones are not: no merging.
        assert_eq!(got, want);
    }

    /// The descriptors one at a time: every (src, dst) of the whole list, unmerged.
    fn singles(list: &BlockList<'_>) -> Vec<(u64, u64)> {
        let mut v = Vec::new();
        let size = list.block_size();
        list.for_each_run(|s, d, l| {
            for o in (0..l).step_by(size as usize) {
                v.push((s + o, d + o));
            }
        });
        v
    }

    #[test]
    fn ranges_of_a_list_cover_it_in_the_same_order() {
        let ids: Vec<u32> = vec![3, 4, 5, 0, 9, 1, 2, 8, 7, 6];
        let rev: Vec<u32> = ids.iter().rev().copied().collect();
        let layer_major = KvLayout::new(8, 10).kv(2, 80).layers(3, 160);
        let block_major = KvLayout::new(8, 10).block_stride(48).layers(3, 16).kv(2, 8);
        for (src, dst) in [
            (KvLayout::new(8, 10), KvLayout::new(8, 10).offset(4)),
            (layer_major, layer_major.offset(1000)),
            (block_major, block_major),
            (layer_major, block_major),
        ] {
            let list = BlockList {
                src: &src,
                dst: &dst,
                src_ids: &ids,
                dst_ids: &rev,
            };
            let whole = singles(&list);
            let n = list.descriptors();
            for cut in [0, 1, 7, n / 2, n - 1, n] {
                let mut parts = Vec::new();
                for r in [0..cut, cut..n] {
                    list.for_each_run_in(r, |s, d, l| {
                        for o in (0..l).step_by(8) {
                            parts.push((s + o, d + o));
                        }
                    });
                }
                assert_eq!(parts, whole, "cut at {cut} of {n}");
            }
            // Past the end is empty, not a panic.
            assert_eq!(list.for_each_run_in(n..n + 5, |_, _, _| panic!("a run")), 0);
        }
    }
}
