//! Block transfers (KV layouts) on the CPU: host ↔ host through the `host-copy` backend, the
//! bulk checks of 100,000-descriptor layouts and id lists with typed errors and nothing moved,
//! prepared-list reuse, the expansion route to a file, and the posting cost printed (no time
//! assertion: a smoke test).

mod common;

use common::{agent, bytes_of, host, host_zeroed, pattern};
use gdpath::blocks::{BlockError, BlockSide, LayoutDim};
use gdpath::{
    Agent, BlockTransfer, CopyMethod, DataPath, Error, FileSpec, KvLayout, Region, TransferReport,
};
use gdpath_cuda::pattern::shuffled;

/// What `dst` must hold after copying `src_ids[i]` → `dst_ids[i]`: computed from the layout
/// formula of `KvLayout`'s documentation, not from the engine's iteration.
fn expected(
    dst_before: &[u8],
    src: &[u8],
    sl: &KvLayout,
    dl: &KvLayout,
    src_ids: &[u32],
    dst_ids: &[u32],
) -> Vec<u8> {
    let mut out = dst_before.to_vec();
    let bs = sl.block_size as usize;
    for (&s, &d) in src_ids.iter().zip(dst_ids) {
        for l in 0..sl.layers {
            for k in 0..sl.kv {
                let so = (sl.offset
                    + l * sl.layer_stride
                    + k * sl.kv_stride
                    + s as u64 * sl.block_stride) as usize;
                let dof = (dl.offset
                    + l * dl.layer_stride
                    + k * dl.kv_stride
                    + d as u64 * dl.block_stride) as usize;
                out[dof..dof + bs].copy_from_slice(&src[so..so + bs]);
            }
        }
    }
    out
}

fn span(l: &KvLayout) -> usize {
    let mut last = 0;
    for (s, n) in [
        (l.block_stride, l.blocks),
        (l.layer_stride, l.layers),
        (l.kv_stride, l.kv),
    ] {
        if n > 1 {
            last += s * (n - 1);
        }
    }
    (l.offset + last + l.block_size) as usize
}

fn blocks_err(r: Result<impl std::fmt::Debug, Error>) -> BlockError {
    match r {
        Err(Error::Blocks(e)) => e,
        other => panic!("expected a block error, got {other:?}"),
    }
}

fn wait(t: gdpath::Transfer) -> TransferReport {
    t.wait().expect("transfer")
}

/// Source and destination regions sized for the layouts, the source filled with the pattern.
fn regions(a: &Agent, sl: &KvLayout, dl: &KvLayout) -> (Region, Region) {
    (
        host(a, &pattern(span(sl), 1)),
        host_zeroed(a, span(dl) + 17),
    )
}

#[test]
fn random_layouts_between_host_regions_are_byte_exact() {
    let a = agent();
    let (bs, n, layers) = (48u64, 500u64, 3u64);
    // Source: layer-major with K/V planes, at an unaligned offset. Destination: block-major
    // with padding between blocks, a larger pool.
    let sl = KvLayout::new(bs, n)
        .offset(3)
        .kv(2, n * bs)
        .layers(layers, 2 * n * bs + 5);
    let dl = KvLayout::new(bs, 2 * n)
        .offset(11)
        .block_stride(layers * 2 * bs + 7)
        .layers(layers, 2 * bs)
        .kv(2, bs);
    let (src, dst) = regions(&a, &sl, &dl);
    let src_ids: Vec<u32> = shuffled(n as u32, 5)[..400].to_vec();
    let dst_ids: Vec<u32> = shuffled(2 * n as u32, 6)[..400].to_vec();
    let before = bytes_of(&dst);
    let p = a
        .prepare_blocks(BlockTransfer::new(&src, sl, &dst, dl))
        .unwrap();
    assert!(p.is_block_list());
    assert_eq!(p.plan().path, DataPath::HostCopy);
    assert_eq!(p.plan().backend, "host-copy");
    let rep = wait(p.post(&src_ids, &dst_ids).unwrap());
    assert_eq!(rep.bytes, 400 * layers * 2 * bs);
    assert_eq!(rep.pairs.len(), 1);
    let b = rep.pairs[0].batch.expect("batch report");
    assert_eq!(b.method, CopyMethod::Copies);
    assert_eq!(b.descriptors, 400 * layers * 2);
    assert!(b.coalesced <= b.descriptors);
    let want = expected(&before, &bytes_of(&src), &sl, &dl, &src_ids, &dst_ids);
    assert!(
        bytes_of(&dst) == want,
        "destination differs from the expected image"
    );
}

#[test]
fn runs_of_consecutive_blocks_are_merged() {
    let a = agent();
    let l = KvLayout::new(4096, 1000);
    let (src, dst) = regions(&a, &l, &l);
    let p = a
        .prepare_blocks(BlockTransfer::new(&src, l, &dst, l))
        .unwrap();
    // Three runs: 10..20 → 500..510, 30 → 0, 40..42 → 1..3.
    let mut s: Vec<u32> = (10..20).collect();
    let mut d: Vec<u32> = (500..510).collect();
    s.extend([30, 40, 41]);
    d.extend([0, 1, 2]);
    let before = bytes_of(&dst);
    let rep = wait(p.post(&s, &d).unwrap());
    let b = rep.pairs[0].batch.unwrap();
    assert_eq!((b.descriptors, b.coalesced, b.posted), (13, 2 + 1, 2 + 1));
    assert!(bytes_of(&dst) == expected(&before, &bytes_of(&src), &l, &l, &s, &d));
}

#[test]
fn single_byte_blocks_at_unaligned_offsets_100k() {
    let a = agent();
    let n = 100_000u32;
    let sl = KvLayout::new(1, n as u64).offset(1).block_stride(3);
    let dl = KvLayout::new(1, n as u64).offset(5).block_stride(2);
    let (src, dst) = regions(&a, &sl, &dl);
    let (s, d) = (shuffled(n, 11), shuffled(n, 12));
    let before = bytes_of(&dst);
    let rep = wait(
        a.transfer_blocks(BlockTransfer::new(&src, sl, &dst, dl), &s, &d)
            .unwrap(),
    );
    assert_eq!(rep.bytes, n as u64);
    assert!(bytes_of(&dst) == expected(&before, &bytes_of(&src), &sl, &dl, &s, &d));
}

#[test]
fn layout_errors_of_100k_descriptor_layouts_are_typed_and_nothing_moves() {
    let a = agent();
    let n = 100_000u64;
    let l = KvLayout::new(16, n);
    let src = host(&a, &pattern((n * 16) as usize, 2));
    // Room for 99,999 blocks and 15 bytes of the last.
    let short = host_zeroed(&a, (n * 16 - 1) as usize);
    let e = blocks_err(a.prepare_blocks(BlockTransfer::new(&src, l, &short, l)));
    assert!(
        matches!(
            e,
            BlockError::OutOfBounds {
                side: BlockSide::Dst,
                first_bad: 99_999,
                blocks: 100_000,
                ..
            }
        ),
        "{e:?}"
    );
    // The source side too, named as such.
    let e = blocks_err(a.prepare_blocks(BlockTransfer::new(&short, l, &src, l)));
    assert!(matches!(
        e,
        BlockError::OutOfBounds {
            side: BlockSide::Src,
            first_bad: 99_999,
            ..
        }
    ));
    // Overlapping destination slots.
    let dst = host_zeroed(&a, (n * 16) as usize);
    let e = blocks_err(a.prepare_blocks(BlockTransfer::new(
        &src,
        l,
        &dst,
        KvLayout::new(16, n).block_stride(15),
    )));
    assert!(
        matches!(
            e,
            BlockError::Overlap {
                dim: LayoutDim::Blocks,
                ..
            }
        ),
        "{e:?}"
    );
    // Shapes that do not pair.
    let e = blocks_err(a.prepare_blocks(BlockTransfer::new(&src, l, &dst, KvLayout::new(8, n))));
    assert!(matches!(
        e,
        BlockError::Mismatch {
            what: "block size",
            ..
        }
    ));
    // One region with two layouts.
    let e =
        blocks_err(a.prepare_blocks(BlockTransfer::new(&dst, l, &dst, KvLayout::new(16, n / 2))));
    assert!(matches!(e, BlockError::SharedRegionLayouts { .. }));
    assert_eq!(Error::Blocks(e).kind(), "blocks");
    assert!(bytes_of(&dst).iter().all(|&b| b == 0), "nothing moved");
}

#[test]
fn id_errors_of_100k_id_lists_name_the_first_bad_block_and_nothing_moves() {
    let a = agent();
    let n = 100_000u32;
    let l = KvLayout::new(16, n as u64);
    let src = host(&a, &pattern(n as usize * 16, 3));
    let dst = host_zeroed(&a, n as usize * 16);
    let p = a
        .prepare_blocks(BlockTransfer::new(&src, l, &dst, l))
        .unwrap();
    let s: Vec<u32> = (0..n).collect();
    let mut d = shuffled(n, 4);
    // The last destination repeats the first: found at position 99,999.
    let last = d[n as usize - 1];
    d[n as usize - 1] = d[0];
    let e = blocks_err(p.post(&s, &d));
    assert_eq!(
        e,
        BlockError::DuplicateDestination {
            position: 99_999,
            id: d[0] as u64
        }
    );
    d[n as usize - 1] = last;
    // An id past the layout.
    let mut bad = s.clone();
    bad[54_321] = n;
    assert_eq!(
        blocks_err(p.post(&bad, &d)),
        BlockError::IdOutOfRange {
            side: BlockSide::Src,
            position: 54_321,
            id: n as u64,
            blocks: n as u64
        }
    );
    // Negative ids from a signed array.
    let mut neg: Vec<i64> = d.iter().map(|&x| x as i64).collect();
    neg[7] = -1;
    let s64: Vec<i64> = s.iter().map(|&x| x as i64).collect();
    assert_eq!(
        blocks_err(p.post(&s64, &neg)),
        BlockError::NegativeId {
            side: BlockSide::Dst,
            position: 7,
            value: -1
        }
    );
    assert_eq!(blocks_err(p.post::<u32>(&[], &[])), BlockError::Empty);
    assert_eq!(
        blocks_err(p.post(&s[..10], &d[..9])),
        BlockError::IdCountMismatch { src: 10, dst: 9 }
    );
    assert!(bytes_of(&dst).iter().all(|&b| b == 0), "nothing moved");
    // The same prepared transfer still posts good lists after the refusals.
    let rep = wait(p.post(&s, &d).unwrap());
    assert_eq!(rep.bytes, n as u64 * 16);
    assert!(bytes_of(&dst) == expected(&vec![0; n as usize * 16], &bytes_of(&src), &l, &l, &s, &d));
}

#[test]
fn a_prepared_transfer_is_posted_many_times_with_new_ids() {
    let a = agent();
    let l = KvLayout::new(256, 64).kv(2, 64 * 256);
    let (src, dst) = regions(&a, &l, &l);
    let p = a
        .prepare_blocks(BlockTransfer::new(&src, l, &dst, l))
        .unwrap();
    let mut image = bytes_of(&dst);
    let src_bytes = bytes_of(&src);
    for round in 0..20u64 {
        let s: Vec<u32> = shuffled(64, round)[..16].to_vec();
        let d: Vec<u32> = shuffled(64, 100 + round)[..16].to_vec();
        wait(p.post(&s, &d).unwrap());
        image = expected(&image, &src_bytes, &l, &l, &s, &d);
        assert!(bytes_of(&dst) == image, "round {round}");
    }
    // Posts from several threads at once through one prepared transfer (distinct blocks).
    let threads: Vec<_> = (0..4u32)
        .map(|t| {
            let p = p.clone();
            std::thread::spawn(move || {
                for _ in 0..50 {
                    let ids: Vec<u32> = (t * 16..t * 16 + 16).collect();
                    p.post(&ids, &ids).unwrap().wait().unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let all: Vec<u32> = (0..64).collect();
    assert!(bytes_of(&dst) == expected(&image, &src_bytes, &l, &l, &all, &all));
}

#[test]
fn blocks_move_within_one_region_unless_a_block_is_read_and_written() {
    let a = agent();
    let l = KvLayout::new(100, 50);
    let r = host(&a, &pattern(5000, 9));
    let p = a.prepare_blocks(BlockTransfer::new(&r, l, &r, l)).unwrap();
    let before = bytes_of(&r);
    let (s, d) = ([10u32, 11, 12, 40], [0u32, 1, 2, 3]);
    wait(p.post(&s, &d).unwrap());
    assert!(bytes_of(&r) == expected(&before, &before, &l, &l, &s, &d));
    let e = blocks_err(p.post(&[1u32, 5], &[6u32, 1]));
    assert_eq!(e, BlockError::SourceIsDestination { position: 0, id: 1 });
}

#[test]
fn posts_fail_on_deregistered_or_viewed_regions() {
    let a = agent();
    let l = KvLayout::new(8, 8);
    let (src, dst) = regions(&a, &l, &l);
    let p = a
        .prepare_blocks(BlockTransfer::new(&src, l, &dst, l))
        .unwrap();
    {
        let _view = dst.host_view().unwrap();
        assert!(matches!(
            p.post(&[0u32], &[0u32]),
            Err(Error::RegionBusy { .. })
        ));
    }
    a.deregister(&dst).unwrap();
    assert!(matches!(
        p.post(&[0u32], &[0u32]),
        Err(Error::Deregistered { .. })
    ));
    // And preparing with it is refused.
    assert!(matches!(
        a.prepare_blocks(BlockTransfer::new(&src, l, &dst, l)),
        Err(Error::Deregistered { .. })
    ));
}

#[test]
fn host_copy_refuses_gpu_methods_with_a_typed_error() {
    let a = agent();
    let l = KvLayout::new(8, 8);
    let (src, dst) = regions(&a, &l, &l);
    let p = a
        .prepare_blocks(BlockTransfer::new(&src, l, &dst, l).method(CopyMethod::Kernel))
        .unwrap();
    let e = p.post(&[0u32], &[1u32]).unwrap().wait().unwrap_err();
    assert!(
        matches!(
            e.error,
            Error::Backend {
                backend: "host-copy",
                ..
            }
        ),
        "{e}"
    );
    assert!(bytes_of(&dst).iter().all(|&b| b == 0));
}

#[test]
fn blocks_to_a_file_tier_expand_into_descriptor_pairs() {
    let a = agent();
    let dir = common::disk_dir();
    let l = KvLayout::new(4096, 32);
    let src = host(&a, &pattern(32 * 4096, 8));
    let file = a
        .register(gdpath::Memory::File(FileSpec::write(
            dir.path().join("kv.bin"),
        )))
        .unwrap();
    let p = a
        .prepare_blocks(BlockTransfer::new(&src, l, &file, l))
        .unwrap();
    assert!(!p.is_block_list(), "no file backend moves block lists");
    let ids: Vec<u32> = (0..32).collect();
    let rep = wait(p.post(&ids, &shuffled(32, 3)).unwrap());
    assert_eq!(rep.bytes, 32 * 4096);
    let on_disk = std::fs::read(dir.path().join("kv.bin")).unwrap();
    let want = expected(
        &vec![0; 32 * 4096],
        &bytes_of(&src),
        &l,
        &l,
        &ids,
        &shuffled(32, 3),
    );
    assert!(on_disk == want);
}

/// The CPU cost of posting from a layout, per descriptor, for 100,000 descriptors: one-byte
/// blocks, so the copy itself is a small part. Printed, not asserted (a smoke test that the
/// path runs at this size; the 0.2 µs target is measured on the GPU machine by `gdpath bench kv`).
#[test]
fn posting_cost_per_descriptor_for_100k_descriptors() {
    let a = agent();
    let n = 100_000u32;
    let l = KvLayout::new(1, n as u64);
    let (src, dst) = regions(&a, &l, &l);
    let p = a
        .prepare_blocks(BlockTransfer::new(&src, l, &dst, l))
        .unwrap();
    let (s, d) = (shuffled(n, 1), shuffled(n, 2));
    let mut best = f64::MAX;
    for _ in 0..5 {
        let t = std::time::Instant::now();
        let tr = p.post(&s, &d).unwrap();
        let posted = t.elapsed();
        let rep = wait(tr);
        let b = rep.pairs[0].batch.unwrap();
        assert_eq!(b.descriptors, n as u64);
        let ns = posted.as_nanos() as f64 / n as f64;
        best = best.min(ns);
        eprintln!(
            "posting {n} descriptors: post() {:.1} ns/descriptor (ids checked, list walked and \
             copied: host-copy runs on the posting thread), backend {:.1} ns/descriptor",
            ns,
            b.post_ns as f64 / n as f64
        );
    }
    eprintln!("best: {best:.1} ns per descriptor");
}

#[test]
fn a_read_only_destination_is_refused_and_a_read_only_source_is_read() {
    let a = agent();
    let l = KvLayout::new(64, 8);
    let mut ro_bytes = pattern(64 * 8, 9);
    let ro = a
        .register(gdpath::Memory::HostPointer {
            // SAFETY: `ro_bytes` outlives both regions and every transfer on them (dropped
            // below).
            memory: unsafe {
                gdpath::HostPointer::new(ro_bytes.as_mut_ptr(), ro_bytes.len(), false)
            },
            pinned: false,
        })
        .unwrap();
    let src = host(&a, &pattern(64 * 8, 3));
    let e = a
        .prepare_blocks(BlockTransfer::new(&src, l, &ro, l))
        .expect_err("a read-only destination");
    assert!(
        matches!(e, Error::ReadOnlyMemory { region, .. } if region == ro.id()),
        "{e:?}"
    );
    // Read from it: allowed, and it is left as it was.
    let dst = host_zeroed(&a, 64 * 8);
    let ids: Vec<u32> = (0..8).collect();
    let rep = wait(
        a.transfer_blocks(BlockTransfer::new(&ro, l, &dst, l), &ids, &ids)
            .unwrap(),
    );
    assert_eq!(rep.bytes, 64 * 8);
    assert_eq!(bytes_of(&dst), pattern(64 * 8, 9));
    drop((ro, dst, src));
    assert_eq!(ro_bytes, pattern(64 * 8, 9));
}
