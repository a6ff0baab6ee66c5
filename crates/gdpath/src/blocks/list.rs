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
    /// Coalescing never changes which bytes go where; vLLM's connectors do it by hand
    /// (34,000 → 422 descriptors per transfer, issue 25).
    pub fn for_each_run(&self, mut f: impl FnMut(u64, u64, u64)) -> u64 {
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
        if layers * planes > 1 && block_major(self.src) && block_major(self.dst) {
            for (&s, &d) in self.src_ids.iter().zip(self.dst_ids) {
                for l in 0..layers {
                    for k in 0..planes {
                        push(self.src.at(l, k, s as u64), self.dst.at(l, k, d as u64));
                    }
                }
            }
        } else {
            for l in 0..layers {
                for k in 0..planes {
                    for (&s, &d) in self.src_ids.iter().zip(self.dst_ids) {
                        push(self.src.at(l, k, s as u64), self.dst.at(l, k, d as u64));
                    }
                }
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
}
