//! Property test: random descriptor lists read back exactly what was written, through the
//! O_DIRECT path and the buffered path.

mod common;

use common::*;
use gdpath::{FileSpec, Memory, TransferRequest};
use proptest::prelude::*;

const FILE: u64 = 256 << 10;

/// Non-overlapping target ranges: sorted cut points of [0, FILE), shuffled, each mapped to a
/// random local offset in a host buffer of FILE + slack bytes.
fn plan() -> impl Strategy<Value = (Vec<(u64, u64)>, Vec<u64>, u64)> {
    (
        prop::collection::btree_set(1..FILE, 1..24),
        any::<u64>(),
        prop::collection::vec(0..4096u64, 24),
    )
        .prop_map(|(cuts, seed, local_offs)| {
            let mut pts: Vec<u64> = std::iter::once(0).chain(cuts).chain([FILE]).collect();
            pts.dedup();
            let mut ranges: Vec<(u64, u64)> = pts.windows(2).map(|w| (w[0], w[1] - w[0])).collect();
            // Deterministic shuffle from the seed.
            let mut s = seed | 1;
            for i in (1..ranges.len()).rev() {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                ranges.swap(i, (s % (i as u64 + 1)) as usize);
            }
            (ranges, local_offs, seed)
        })
}

fn check(buffered: bool, ranges: Vec<(u64, u64)>, local_offs: Vec<u64>, seed: u64) {
    let dir = disk_dir();
    let a = if buffered { buffered_agent() } else { agent() };
    let data = pattern(FILE as usize, seed);
    // Lay the ranges out in host memory one after another, each at a random extra offset.
    let mut layout = Vec::new();
    let mut pos = 0u64;
    for (i, &(_, len)) in ranges.iter().enumerate() {
        pos += local_offs[i % local_offs.len()];
        layout.push(pos);
        pos += len;
    }
    let mut hostbytes = vec![0u8; pos as usize];
    for (&(off, len), &at) in ranges.iter().zip(&layout) {
        hostbytes[at as usize..(at + len) as usize]
            .copy_from_slice(&data[off as usize..(off + len) as usize]);
    }
    let src = host(&a, &hostbytes);
    let f = a
        .register(Memory::File(FileSpec::write(dir.path().join("p"))))
        .unwrap();
    let local: Vec<_> = ranges
        .iter()
        .zip(&layout)
        .map(|(&(_, l), &at)| src.desc(at, l))
        .collect();
    let target: Vec<_> = ranges.iter().map(|&(o, l)| f.desc(o, l)).collect();
    a.post(TransferRequest::write(local.clone(), target.clone()))
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(std::fs::read(dir.path().join("p")).unwrap(), data);
    let dst = host_zeroed(&a, pos as usize);
    let local: Vec<_> = ranges
        .iter()
        .zip(&layout)
        .map(|(&(_, l), &at)| dst.desc(at, l))
        .collect();
    let r = a
        .post(TransferRequest::read(local, target))
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(r.bytes, FILE);
    assert_eq!(bytes_of(&dst), hostbytes);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn random_descriptor_lists_round_trip_direct((ranges, offs, seed) in plan()) {
        check(false, ranges, offs, seed);
    }

    #[test]
    fn random_descriptor_lists_round_trip_buffered((ranges, offs, seed) in plan()) {
        check(true, ranges, offs, seed);
    }
}
