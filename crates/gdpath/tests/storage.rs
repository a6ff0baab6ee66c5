//! The storage path on real files: O_DIRECT + io_uring, its buffered fallback, alignment edges,
//! typed errors, strict mode, deadlines, cancellation and concurrency.

mod common;

use common::*;
use gdpath::finding::ids;
use gdpath::{
    DataPath, DirectIo, Error, FileAccess, FileSpec, HostBuffer, Memory, Op, TransferRequest,
};
use std::time::{Duration, Instant};

const SIZES: [u64; 7] = [0, 1, 511, 4095, 4096, 4097, (1 << 20) + 3];
const OFFSETS: [u64; 5] = [0, 1, 4095, 4096, 8193];

/// Writes `len` bytes at `off` from host memory into a fresh file, reads them back into a buffer
/// at a memory offset, and checks bytes, path and finding.
fn roundtrip(
    agent: &gdpath::Agent,
    dir: &std::path::Path,
    len: u64,
    off: u64,
    mem_off: u64,
) -> DataPath {
    let data = pattern(len as usize, len ^ off);
    let src = host(agent, &data);
    let path = dir.join(format!("rt-{len}-{off}-{mem_off}"));
    let file = agent
        .register(Memory::File(FileSpec::write(&path)))
        .unwrap();
    let w = agent
        .post(TransferRequest::write(
            vec![src.desc(0, len)],
            vec![file.desc(off, len)],
        ))
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(w.bytes, len);
    let on_disk = std::fs::read(&path).unwrap();
    if len == 0 {
        // A zero-length write does not extend the file, as pwrite(2) of 0 bytes.
        assert!(on_disk.is_empty());
        return w.pairs[0].path.clone();
    }
    assert_eq!(
        on_disk.len() as u64,
        off + len,
        "file size after write at {off}"
    );
    assert_eq!(
        &on_disk[off as usize..],
        &data[..],
        "file bytes len {len} off {off}"
    );
    assert!(
        on_disk[..off as usize].iter().all(|&b| b == 0),
        "hole before {off}"
    );

    let dst = host_zeroed(agent, (len + mem_off) as usize);
    let r = agent
        .post(TransferRequest::read(
            vec![dst.desc(mem_off, len)],
            vec![file.desc(off, len)],
        ))
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(r.bytes, len);
    assert_eq!(
        &bytes_of(&dst)[mem_off as usize..],
        &data[..],
        "read back len {len} off {off} mem_off {mem_off}"
    );
    assert_eq!(r.pairs.len(), 1);
    assert_eq!(r.pairs[0].path, w.pairs[0].path);
    r.pairs[0].path.clone()
}

/// The page-cache block the engine cuts at for files in `dir` (`FileRegion::cache_block`).
fn cache_block(a: &gdpath::Agent, dir: &std::path::Path) -> u64 {
    let probe = a
        .register(Memory::File(FileSpec::write(dir.join("block-probe"))))
        .unwrap();
    probe.file().unwrap().cache_block()
}

/// True when `[off, off + len)` holds a whole page-cache block of `block` bytes: only such a
/// pair has a part the O_DIRECT backend moves directly (it cuts heads and tails at the block).
fn has_whole_block(off: u64, len: u64, block: u64) -> bool {
    let end = off + len;
    off.next_multiple_of(block) + block <= end
}

/// The O_DIRECT backend's path for a pair: `posix-direct` when some part goes direct, else
/// `posix-buffered` (every byte through the page cache), which is what it plans and reports.
fn direct_backend_path(off: u64, len: u64, block: u64) -> DataPath {
    if len == 0 || has_whole_block(off, len, block) {
        DataPath::PosixDirect
    } else {
        DataPath::PosixBuffered
    }
}

#[test]
fn alignment_edges_on_disk_use_posix_direct() {
    let dir = disk_dir();
    let a = agent();
    let block = cache_block(&a, dir.path());
    for len in SIZES {
        for off in OFFSETS {
            for mem_off in [0, 1] {
                let p = roundtrip(&a, dir.path(), len, off, mem_off);
                assert_eq!(
                    p,
                    direct_backend_path(off, len, block),
                    "len {len} off {off}"
                );
            }
        }
    }
}

/// A run of pairs on the same two regions is planned once only where every candidate
/// backend's answer ignores offsets and lengths (`Backend::plan_per_region`): pairs of one
/// request on one file, one aligned and one not, still get their own paths; pairs between two
/// host regions share the plan, each with its own index.
#[test]
fn pairs_on_the_same_regions_keep_their_own_plans() {
    let dir = disk_dir();
    let a = agent();
    let block = cache_block(&a, dir.path());
    let data = pattern(4 * block as usize, 11);
    let f = readable_file(&a, dir.path(), "same-regions", &data);
    let dst = host_zeroed(&a, 4 * block as usize);
    // Pair 0 holds whole blocks; pair 1 (a few bytes inside the third block) holds none; pair
    // 2 is aligned again.
    let (l, t): (Vec<_>, Vec<_>) = [(0, 2 * block), (2 * block + 1, 10), (3 * block, block)]
        .into_iter()
        .map(|(off, len)| (dst.desc(off, len), f.desc(off, len)))
        .unzip();
    let want: Vec<DataPath> = [(0, 2 * block), (2 * block + 1, 10), (3 * block, block)]
        .into_iter()
        .map(|(off, len)| direct_backend_path(off, len, block))
        .collect();
    let plan = a
        .plan(&TransferRequest::read(l.clone(), t.clone()))
        .unwrap();
    let got: Vec<DataPath> = plan.iter().map(|p| p.path.clone()).collect();
    assert_eq!(got, want);
    assert_ne!(
        got[0], got[1],
        "the request must mix paths on the same regions"
    );
    let r = a.post(TransferRequest::read(l, t)).unwrap().wait().unwrap();
    let got: Vec<DataPath> = r.pairs.iter().map(|p| p.path.clone()).collect();
    assert_eq!(got, want);
    let back = bytes_of(&dst);
    for (off, len) in [(0, 2 * block), (2 * block + 1, 10), (3 * block, block)] {
        let (o, n) = (off as usize, len as usize);
        assert_eq!(&back[o..o + n], &data[o..o + n], "pair at {off}");
    }

    // Host ↔ host: one plan per run of pairs on the same regions (here A, A, B, A, …: runs
    // broken by another region), every pair its own index and result.
    let src = host(&a, &data[..64]);
    let out = host_zeroed(&a, 64);
    let other = host_zeroed(&a, 64);
    let (l, t): (Vec<_>, Vec<_>) = (0..8)
        .map(|k| {
            let dst = if k % 3 == 2 { &other } else { &out };
            (dst.desc(k * 8, 8), src.desc(k * 8, 8))
        })
        .unzip();
    let plan = a
        .plan(&TransferRequest::read(l.clone(), t.clone()))
        .unwrap();
    assert_eq!(
        plan.iter().map(|p| p.index).collect::<Vec<_>>(),
        (0..8).collect::<Vec<_>>()
    );
    assert!(plan.iter().all(|p| p.path == DataPath::HostCopy));
    let r = a.post(TransferRequest::read(l, t)).unwrap().wait().unwrap();
    assert_eq!(
        r.pairs.iter().map(|p| p.index).collect::<Vec<_>>(),
        (0..8).collect::<Vec<_>>()
    );
    let (o, b) = (bytes_of(&out), bytes_of(&other));
    for k in 0..8usize {
        let (got, zero) = if k % 3 == 2 { (&b, &o) } else { (&o, &b) };
        assert_eq!(&got[k * 8..k * 8 + 8], &data[k * 8..k * 8 + 8], "pair {k}");
        assert!(zero[k * 8..k * 8 + 8].iter().all(|&x| x == 0), "pair {k}");
    }

    // Strict mode over a run: the first pair is the one refused.
    let (l, t): (Vec<_>, Vec<_>) = (0..4)
        .map(|k| (out.desc(k * 8, 8), src.desc(k * 8, 8)))
        .unzip();
    match a.post(TransferRequest::read(l, t).accept([DataPath::PosixDirect])) {
        Err(Error::PathNotAccepted { index, planned, .. }) => {
            assert_eq!(index, 0);
            assert_eq!(planned, Some(DataPath::HostCopy));
        }
        other => panic!("expected PathNotAccepted, got {other:?}"),
    }
}

/// A post that fails a check on a later pair has taken the earlier pairs' regions in use while
/// checking them: it must give them back, so the regions can be viewed and deregistered.
#[test]
fn a_failed_post_leaves_no_region_in_use() {
    let a = agent();
    let src = host(&a, &pattern(4096, 5));
    let dst = host_zeroed(&a, 4096);
    let small = host_zeroed(&a, 16);
    let err = a
        .post(TransferRequest::write(
            vec![src.desc(0, 4096), src.desc(0, 32)],
            vec![dst.desc(0, 4096), small.desc(0, 32)],
        ))
        .unwrap_err();
    assert!(matches!(err, Error::OutOfBounds { index: 1, .. }), "{err}");
    for r in [&src, &dst, &small] {
        assert_eq!(r.in_flight(), 0);
    }
    // A viewed region refuses a post; the pair checked before it is released too.
    let view = dst.host_view().unwrap();
    let err = a
        .post(TransferRequest::write(
            vec![src.desc(0, 16), src.desc(16, 16)],
            vec![small.desc(0, 16), dst.desc(0, 16)],
        ))
        .unwrap_err();
    assert!(matches!(err, Error::RegionBusy { .. }), "{err}");
    drop(view);
    for r in [&src, &dst, &small] {
        assert_eq!(r.in_flight(), 0);
    }
    a.deregister(&small).unwrap();
    assert!(dst.host_view().is_ok());
}

#[test]
fn alignment_edges_on_tmpfs() {
    let Some(dir) = shm_dir() else { return };
    let a = agent();
    // /dev/shm accepts O_DIRECT on recent kernels; either way the data must round-trip and the
    // path must say which one was used.
    let probe = a
        .register(Memory::File(FileSpec::write(dir.path().join("probe"))))
        .unwrap();
    let block = probe.file().unwrap().cache_block();
    let expect = if probe.file().unwrap().direct_fd().is_some() {
        DataPath::PosixDirect
    } else {
        eprintln!("note: /dev/shm refuses O_DIRECT on this kernel");
        DataPath::PosixBuffered
    };
    for len in SIZES {
        for off in [0, 1, 4096] {
            let want = match expect {
                DataPath::PosixDirect => direct_backend_path(off, len, block),
                _ => DataPath::PosixBuffered,
            };
            assert_eq!(
                roundtrip(&a, dir.path(), len, off, 1),
                want,
                "len {len} off {off}"
            );
        }
    }
}

#[test]
fn forced_buffered_fallback_reports_finding() {
    let dir = disk_dir();
    let a = buffered_agent();
    for len in [0, 1, 4097, (1 << 20) + 3] {
        assert_eq!(
            roundtrip(&a, dir.path(), len, 4095, 0),
            DataPath::PosixBuffered
        );
    }
    let data = pattern(10_000, 7);
    let f = readable_file(&a, dir.path(), "b", &data);
    let dst = host_zeroed(&a, 10_000);
    let r = move_whole(&a, Op::Read, &dst, &f, 10_000);
    assert_eq!(r.pairs[0].path, DataPath::PosixBuffered);
    assert_eq!(
        r.pairs[0].finding.as_ref().unwrap().as_str(),
        ids::STORAGE_ODIRECT_DISABLED
    );
    assert_eq!(bytes_of(&dst), data);
    // The per-file knob does the same on an agent that allows O_DIRECT.
    let a = agent();
    let f = a
        .register(Memory::File(
            FileSpec::read(dir.path().join("b")).direct(DirectIo::Off),
        ))
        .unwrap();
    let plan = a
        .plan(&TransferRequest::read(
            vec![host_zeroed(&a, 10).desc(0, 10)],
            vec![f.desc(0, 10)],
        ))
        .unwrap();
    assert_eq!(plan[0].path, DataPath::PosixBuffered);
    assert_eq!(
        plan[0].finding.as_ref().unwrap().as_str(),
        ids::STORAGE_ODIRECT_DISABLED
    );
}

/// `TransferRequest::preferred_only`: a fallback (O_DIRECT switched off) fails at post with
/// what would have happened; the preferred path passes.
#[test]
fn preferred_only_refuses_a_fallback_before_moving() {
    let dir = disk_dir();
    let data = pattern(10_000, 5);
    let a = buffered_agent();
    let f = readable_file(&a, dir.path(), "p", &data);
    let dst = host_zeroed(&a, 10_000);
    let req = || TransferRequest::read(vec![dst.desc(0, 8192)], vec![f.desc(0, 8192)]);
    match a.post(req().preferred_only()) {
        Err(e @ Error::PathNotAccepted { .. }) => {
            let Error::PathNotAccepted {
                index,
                ref accepted,
                ref planned,
                ref finding,
                ..
            } = e
            else {
                unreachable!()
            };
            assert_eq!(index, 0);
            assert!(accepted.is_empty());
            assert_eq!(planned, &Some(DataPath::PosixBuffered));
            assert_eq!(
                finding.as_ref().map(|f| f.as_str()),
                Some(ids::STORAGE_ODIRECT_DISABLED)
            );
            assert!(e.to_string().contains("the preferred path"), "{e}");
        }
        other => panic!("{other:?}"),
    }
    assert!(bytes_of(&dst).iter().all(|&b| b == 0), "nothing moved");
    assert_eq!(dst.in_flight(), 0);
    // Without the restriction it falls back; with O_DIRECT usable the preferred path passes.
    a.post(req()).unwrap().wait().unwrap();
    let a = agent();
    let f = a
        .register(Memory::File(FileSpec::read(dir.path().join("p"))))
        .unwrap();
    if f.file().unwrap().direct_status() == gdpath::DirectStatus::Enabled {
        let dst = host_zeroed(&a, 8192);
        let r = a
            .post(
                TransferRequest::read(vec![dst.desc(0, 8192)], vec![f.desc(0, 8192)])
                    .preferred_only(),
            )
            .unwrap()
            .wait()
            .unwrap();
        assert_eq!(r.pairs[0].path, DataPath::PosixDirect);
        assert_eq!(bytes_of(&dst), &data[..8192]);
    } else {
        eprintln!("SKIP (part): O_DIRECT is refused where the test files are");
    }
}

#[test]
fn refusing_file_system_falls_back_and_strict_mode_fails_first() {
    let Some(fs) = Ramfs::mount() else {
        eprintln!("SKIP: no O_DIRECT-refusing file system available here (ramfs mount refused); the fallback is covered by forced_buffered_fallback_reports_finding");
        return;
    };
    let a = agent();
    let data = pattern(100_000, 3);
    let p = file_in(fs.dir.path(), "f", &data);
    let f = a.register(Memory::File(FileSpec::read(&p))).unwrap();
    assert_eq!(
        f.file().unwrap().direct_status(),
        gdpath::DirectStatus::Refused
    );
    let dst = host_zeroed(&a, 100_000);
    let r = move_whole(&a, Op::Read, &dst, &f, 100_000);
    assert_eq!(r.pairs[0].path, DataPath::PosixBuffered);
    assert_eq!(
        r.pairs[0].finding.as_ref().unwrap().as_str(),
        ids::STORAGE_ODIRECT_UNSUPPORTED
    );
    assert_eq!(bytes_of(&dst), data);

    // Strict mode: only O_DIRECT accepted → fails at post, and nothing is written.
    let w = a
        .register(Memory::File(FileSpec::write(fs.dir.path().join("strict"))))
        .unwrap();
    let src = host(&a, &data);
    let err = a
        .post(
            TransferRequest::write(vec![src.desc(0, 1000)], vec![w.desc(0, 1000)])
                .accept([DataPath::PosixDirect]),
        )
        .unwrap_err();
    match err {
        Error::PathNotAccepted {
            index,
            planned,
            finding,
            ..
        } => {
            assert_eq!(index, 0);
            assert_eq!(planned, Some(DataPath::PosixBuffered));
            assert_eq!(finding.unwrap().as_str(), ids::STORAGE_ODIRECT_UNSUPPORTED);
        }
        e => panic!("expected PathNotAccepted, got {e}"),
    }
    assert_eq!(
        std::fs::metadata(fs.dir.path().join("strict"))
            .unwrap()
            .len(),
        0
    );
    // Required O_DIRECT refuses registration with a typed error.
    let e = a
        .register(Memory::File(FileSpec::read(&p).direct(DirectIo::Required)))
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::Unsupported {
                backend: "posix-direct",
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn strict_mode_accepts_the_direct_path_and_rejects_others_before_moving() {
    let dir = disk_dir();
    let a = agent();
    let data = pattern(8192, 1);
    let f = a
        .register(Memory::File(FileSpec::write(dir.path().join("s"))))
        .unwrap();
    let src = host(&a, &data);
    a.post(
        TransferRequest::write(vec![src.desc(0, 8192)], vec![f.desc(0, 8192)])
            .accept([DataPath::PosixDirect]),
    )
    .unwrap()
    .wait()
    .unwrap();
    // Only GDS accepted: impossible for host memory; nothing moves.
    let before = std::fs::read(dir.path().join("s")).unwrap();
    let src2 = host(&a, &[0xFF; 8192]);
    let e = a
        .post(
            TransferRequest::write(vec![src2.desc(0, 8192)], vec![f.desc(0, 8192)])
                .accept([DataPath::GdsNative]),
        )
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::PathNotAccepted {
                planned: Some(DataPath::PosixDirect),
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(std::fs::read(dir.path().join("s")).unwrap(), before);
}

/// Fills `buf` with 1 MiB blocks of a position pattern, each stamped with its block index
/// (cheap in debug builds: memcpy per block), so a misplaced or torn block is detected.
fn stamp_blocks(buf: &mut [u8], template: &[u8]) {
    for (i, c) in buf.chunks_mut(template.len()).enumerate() {
        c.copy_from_slice(&template[..c.len()]);
        let stamp = (i as u64).to_le_bytes();
        let n = c.len().min(8);
        c[..n].copy_from_slice(&stamp[..n]);
    }
}

#[test]
fn file_of_one_gib_plus_one_round_trips() {
    let dir = disk_dir();
    let a = agent();
    let len = (1u64 << 30) + 1;
    let template = pattern(1 << 20, 42);
    let mut buf = HostBuffer::zeroed(len as usize);
    stamp_blocks(buf.as_mut_slice(), &template);
    let r = a.register(Memory::host(buf)).unwrap();
    let f = a
        .register(Memory::File(FileSpec::write(dir.path().join("big"))))
        .unwrap();
    move_whole(&a, Op::Write, &r, &f, len);
    assert_eq!(f.len().unwrap(), len);
    r.host_view().unwrap().fill(0);
    let rep = move_whole(&a, Op::Read, &r, &f, len);
    assert_eq!(rep.pairs[0].path, DataPath::PosixDirect);
    assert_eq!(rep.bytes, len);
    let mut want = vec![0u8; 1 << 20];
    let got = r.host_view().unwrap();
    for (i, c) in got.chunks(1 << 20).enumerate() {
        stamp_blocks(&mut want[..c.len()], &template);
        let stamp = (i as u64).to_le_bytes();
        let n = c.len().min(8);
        want[..n].copy_from_slice(&stamp[..n]);
        assert!(c == &want[..c.len()], "block {i} differs");
    }
}

#[test]
fn short_file_reports_available_bytes_before_moving() {
    let dir = disk_dir();
    let a = agent();
    let f = readable_file(&a, dir.path(), "s", &[1u8; 5000]);
    let dst = host(&a, &[9u8; 8192]);
    let e = a
        .post(TransferRequest::read(
            vec![dst.desc(0, 4096)],
            vec![f.desc(4000, 4096)],
        ))
        .unwrap_err();
    match e {
        Error::ShortFile {
            offset,
            wanted,
            available,
            ..
        } => assert_eq!((offset, wanted, available), (4000, 4096, 1000)),
        e => panic!("expected ShortFile, got {e}"),
    }
    assert!(
        bytes_of(&dst).iter().all(|&b| b == 9),
        "nothing was written"
    );
}

#[test]
fn read_only_and_directory_and_missing_files_are_typed_errors() {
    let dir = disk_dir();
    let a = agent();
    let f = readable_file(&a, dir.path(), "ro", &[0u8; 100]);
    let src = host(&a, &[1u8; 100]);
    let e = a
        .post(TransferRequest::write(
            vec![src.desc(0, 100)],
            vec![f.desc(0, 100)],
        ))
        .unwrap_err();
    assert!(matches!(e, Error::ReadOnly { .. }), "{e}");
    let e = a
        .register(Memory::File(FileSpec::read(dir.path())))
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::NotAFile {
                what: "a directory",
                ..
            }
        ),
        "{e}"
    );
    let e = a
        .register(Memory::File(FileSpec::read(dir.path().join("missing"))))
        .unwrap_err();
    assert!(matches!(e, Error::Open { .. }), "{e}");
    let e = a
        .register(Memory::File(
            FileSpec::read(dir.path().join("missing")).access(FileAccess::ReadWrite),
        ))
        .unwrap_err();
    assert!(
        e.to_string().contains("missing"),
        "error names the file: {e}"
    );
}

#[test]
fn descriptor_errors_are_typed_and_nothing_moves() {
    let a = agent();
    let src = host(&a, &[1u8; 100]);
    let dst = host(&a, &[0u8; 100]);
    let e = a
        .post(TransferRequest::write(
            vec![src.desc(50, 51)],
            vec![dst.desc(0, 51)],
        ))
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::OutOfBounds {
                index: 0,
                region_len: 100,
                ..
            }
        ),
        "{e}"
    );
    let e = a
        .post(TransferRequest::write(
            vec![src.desc(0, 1)],
            vec![dst.desc(u64::MAX, 1)],
        ))
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::OutOfBounds {
                side: gdpath::Side::Target,
                ..
            }
        ),
        "{e}"
    );
    let e = a
        .post(TransferRequest::write(
            vec![src.desc(0, 1), src.desc(1, 1)],
            vec![dst.desc(0, 1)],
        ))
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::ListLengthMismatch {
                local: 2,
                target: 1
            }
        ),
        "{e}"
    );
    let e = a
        .post(TransferRequest::write(
            vec![src.desc(0, 2)],
            vec![dst.desc(0, 3)],
        ))
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::PairLengthMismatch {
                index: 0,
                local: 2,
                target: 3
            }
        ),
        "{e}"
    );
    assert!(bytes_of(&dst).iter().all(|&b| b == 0));
    // A region of another agent.
    let other = agent();
    let foreign = host(&other, &[0u8; 10]);
    let e = a
        .post(TransferRequest::write(
            vec![src.desc(0, 10)],
            vec![foreign.desc(0, 10)],
        ))
        .unwrap_err();
    assert!(matches!(e, Error::ForeignRegion { .. }), "{e}");
    // Deregistered.
    a.deregister(&dst).unwrap();
    let e = a
        .post(TransferRequest::write(
            vec![src.desc(0, 10)],
            vec![dst.desc(0, 10)],
        ))
        .unwrap_err();
    assert!(matches!(e, Error::Deregistered { .. }), "{e}");
    // A host view out makes the region busy.
    let v = src.host_view().unwrap();
    let dst2 = host(&a, &[0u8; 10]);
    let e = a
        .post(TransferRequest::write(
            vec![src.desc(0, 10)],
            vec![dst2.desc(0, 10)],
        ))
        .unwrap_err();
    assert!(matches!(e, Error::RegionBusy { .. }), "{e}");
    drop(v);
    // Host ↔ host works and is reported as such.
    let r = move_whole(&a, Op::Write, &src, &dst2, 10);
    assert_eq!(r.pairs[0].path, DataPath::HostCopy);
    assert_eq!(bytes_of(&dst2), vec![1u8; 10]);
}

#[test]
fn gpu_remote_and_pinned_memory_need_their_backends() {
    let a = agent();
    let e = a
        .register(Memory::Gpu {
            ordinal: 0,
            len: 4096,
        })
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::Unsupported {
                backend: "cuda",
                ..
            }
        ),
        "{e}"
    );
    let e = a
        .register(Memory::Remote(gdpath::RemoteMemory {
            agent: "peer".into(),
            addr: 0,
            len: 10,
            rkey: vec![],
        }))
        .unwrap_err();
    assert!(
        matches!(e, Error::Unsupported { backend: "ucx", .. }),
        "{e}"
    );
    let e = a
        .register(Memory::Host {
            buffer: HostBuffer::zeroed(10),
            pinned: true,
        })
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::Unsupported {
                backend: "cuda",
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn memory_cannot_be_taken_back_while_a_transfer_uses_it() {
    let dir = disk_dir();
    let a = agent_with(|s| {
        s.queue_depth = 1;
        s.chunk = 4096;
    });
    let len = 16u64 << 20;
    let f = a
        .register(Memory::File(FileSpec::write(dir.path().join("m"))))
        .unwrap();
    let src = host_zeroed(&a, len as usize);
    let descs: Vec<_> = (0..len / 4096).map(|i| src.desc(i * 4096, 4096)).collect();
    let tds: Vec<_> = (0..len / 4096).map(|i| f.desc(i * 4096, 4096)).collect();
    let t = a.post(TransferRequest::write(descs, tds)).unwrap();
    match a.deregister(&src) {
        Err(Error::RegionBusy { .. }) => {}
        Ok(()) => eprintln!(
            "note: the 4096-descriptor write finished before deregister; busy check not exercised"
        ),
        Err(e) => panic!("expected RegionBusy, got {e}"),
    }
    // A descriptor still holds the region: its memory cannot be taken back.
    let held = src.desc(0, 1);
    let (src, e) = src.into_host_buffer().unwrap_err();
    assert!(matches!(e, Error::RegionBusy { .. }), "{e}");
    t.wait().unwrap();
    drop(held);
    // Only the test's own handle remains now.
    assert_eq!(src.in_flight(), 0);
    assert_eq!(src.into_host_buffer().unwrap().len(), len as usize);
}

#[test]
fn deadline_in_the_past_times_out_with_completed_list() {
    let dir = disk_dir();
    let a = agent();
    let f = readable_file(&a, dir.path(), "d", &[3u8; 65536]);
    let dst = host_zeroed(&a, 65536);
    let descs: Vec<_> = (0..16).map(|i| dst.desc(i * 4096, 4096)).collect();
    let tds: Vec<_> = (0..16).map(|i| f.desc(i * 4096, 4096)).collect();
    let t = a
        .post(TransferRequest::read(descs, tds).deadline(Instant::now()))
        .unwrap();
    let e = t.wait().unwrap_err();
    assert!(matches!(e.error, Error::DeadlineExceeded), "{e}");
    assert_eq!(e.outcomes.len(), 16);
    assert!(
        e.completed().is_empty(),
        "no I/O starts after the deadline: {:?}",
        e.completed()
    );
}

#[test]
fn cancel_stops_unstarted_work_and_wait_timeout_bounds_waiting() {
    let dir = disk_dir();
    let a = agent_with(|s| {
        s.queue_depth = 1;
        s.chunk = 4096;
    });
    let n = 8192u64;
    let f = a
        .register(Memory::File(FileSpec::write(dir.path().join("c"))))
        .unwrap();
    let src = host_zeroed(&a, (n * 4096) as usize);
    let mk = || {
        TransferRequest::write(
            (0..n).map(|i| src.desc(i * 4096, 4096)).collect(),
            (0..n).map(|i| f.desc(i * 4096, 4096)).collect(),
        )
    };
    let t = a.post(mk()).unwrap();
    t.cancel();
    let e = t.wait().unwrap_err();
    assert!(matches!(e.error, Error::Cancelled), "{e}");
    assert!(e.completed().len() < n as usize);
    // A zero timeout returns at once with a typed timeout and the pairs done so far.
    let t0 = Instant::now();
    let e = a
        .post(mk())
        .unwrap()
        .wait_timeout(Duration::ZERO)
        .unwrap_err();
    assert!(matches!(e.error, Error::DeadlineExceeded), "{e}");
    assert!(
        t0.elapsed() < Duration::from_secs(30),
        "wait_timeout returned"
    );
    // The cancelled work drains: the region's in-flight count returns to zero.
    let until = Instant::now() + Duration::from_secs(60);
    while src.in_flight() > 0 && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(src.in_flight(), 0);
}

#[test]
fn concurrent_transfers_from_several_threads() {
    let dir = disk_dir();
    let a = agent_with(|s| s.queue_depth = 8);
    let p = dir.path().join("shared");
    let f = a.register(Memory::File(FileSpec::write(&p))).unwrap();
    let per = 300_001u64; // unaligned on purpose
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let (a, f) = (a.clone(), f.clone());
            s.spawn(move || {
                for round in 0..3u64 {
                    let data = pattern(per as usize, t * 10 + round);
                    let src = host(&a, &data);
                    let off = t * per;
                    a.post(TransferRequest::write(
                        vec![src.desc(0, per)],
                        vec![f.desc(off, per)],
                    ))
                    .unwrap()
                    .wait()
                    .unwrap();
                    let dst = host_zeroed(&a, per as usize + 1);
                    a.post(TransferRequest::read(
                        vec![dst.desc(1, per)],
                        vec![f.desc(off, per)],
                    ))
                    .unwrap()
                    .wait()
                    .unwrap();
                    assert_eq!(&bytes_of(&dst)[1..], &data[..], "thread {t} round {round}");
                }
            });
        }
    });
    assert_eq!(std::fs::metadata(&p).unwrap().len(), 4 * per);
}

#[test]
fn tiny_bounce_budget_still_moves_unaligned_memory_correctly() {
    let dir = disk_dir();
    // One 64 KiB bounce buffer for everything, 16 requests wanting one.
    let a = agent_with(|s| {
        s.chunk = 64 << 10;
        s.bounce_budget = 64 << 10;
        s.queue_depth = 16;
    });
    let len = (4u64 << 20) + 100;
    let data = pattern(len as usize, 11);
    let src = host(&a, &[&[0u8][..], &data[..]].concat());
    let f = a
        .register(Memory::File(FileSpec::write(dir.path().join("bb"))))
        .unwrap();
    a.post(TransferRequest::write(
        vec![src.desc(1, len)],
        vec![f.desc(0, len)],
    ))
    .unwrap()
    .wait()
    .unwrap();
    assert_eq!(std::fs::read(dir.path().join("bb")).unwrap(), data);
    let dst = host_zeroed(&a, len as usize + 3);
    let r = a
        .post(TransferRequest::read(
            vec![dst.desc(3, len)],
            vec![f.desc(0, len)],
        ))
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(r.pairs[0].path, DataPath::PosixDirect);
    assert_eq!(&bytes_of(&dst)[3..], &data[..]);
}

/// Many threads rewrite and read back small unaligned slices packed next to each other, so
/// every 4 KiB file-system block is shared by two or three transfers at once: one transfer's
/// unaligned head or tail meets its neighbour's aligned middle inside one block. Each round's
/// bytes must read back exactly, and the file must end as the last round of every thread.
#[test]
fn concurrent_unaligned_slices_sharing_blocks_stay_intact() {
    const THREADS: u64 = 8;
    let dir = disk_dir();
    let a = agent_with(|s| s.queue_depth = 32);
    let p = dir.path().join("packed");
    let f = a.register(Memory::File(FileSpec::write(&p))).unwrap();
    let (align, block) = {
        let fr = f.file().expect("a file region");
        (fr.align().offset, fr.cache_block())
    };
    // SAFETY: sysconf has no memory effects.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64;
    assert!(
        block.is_power_of_two() && block >= page && block % align == 0,
        "cache block {block} vs page {page} and O_DIRECT alignment {align}"
    );
    if align >= block {
        eprintln!(
            "note: O_DIRECT alignment {align} B equals the page-cache block here, so heads and \
             tails never shared a block with O_DIRECT sectors; the test still checks the data"
        );
    }
    // Lengths between ~1.5 and ~3.5 KiB, none a multiple of 512: heads, 512-byte sectors and
    // tails of neighbouring slices fall into the same 4 KiB blocks.
    let lens: Vec<u64> = (0..THREADS).map(|t| 1_537 + 331 * t).collect();
    let offs: Vec<u64> = lens
        .iter()
        .scan(0u64, |o, &l| {
            let at = *o;
            *o += l;
            Some(at)
        })
        .collect();
    let total: u64 = lens.iter().sum();
    // Bounded in time, not in rounds: the test stops starting rounds after a few seconds.
    let stop = Instant::now() + Duration::from_secs(8);
    let last_seed: Vec<u64> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..THREADS)
            .map(|t| {
                let (a, f) = (a.clone(), f.clone());
                let (off, len) = (offs[t as usize], lens[t as usize]);
                s.spawn(move || {
                    let mut seed = 0;
                    for round in 0..2_000u64 {
                        if round > 0 && Instant::now() >= stop {
                            break;
                        }
                        seed = (t << 32) | round;
                        let data = pattern(len as usize, seed);
                        let src = host(&a, &data);
                        a.post(TransferRequest::write(
                            vec![src.desc(0, len)],
                            vec![f.desc(off, len)],
                        ))
                        .unwrap()
                        .wait()
                        .unwrap();
                        // Memory offset 0 (direct into the region) and 1 (bounce buffers).
                        let m = round % 2;
                        let dst = host_zeroed(&a, (len + m) as usize);
                        a.post(TransferRequest::read(
                            vec![dst.desc(m, len)],
                            vec![f.desc(off, len)],
                        ))
                        .unwrap()
                        .wait()
                        .unwrap();
                        let got = bytes_of(&dst);
                        if got[m as usize..] != data[..] {
                            let bad = (0..len as usize)
                                .find(|&i| got[m as usize + i] != data[i])
                                .unwrap_or(0);
                            panic!(
                                "thread {t} round {round}: slice at file offset {off} differs \
                                 first at file offset {}",
                                off + bad as u64
                            );
                        }
                    }
                    seed
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let on_disk = std::fs::read(&p).unwrap();
    assert_eq!(on_disk.len() as u64, total);
    for t in 0..THREADS as usize {
        let want = pattern(lens[t] as usize, last_seed[t]);
        let got = &on_disk[offs[t] as usize..(offs[t] + lens[t]) as usize];
        assert!(got == &want[..], "thread {t}: final file bytes differ");
    }
}

/// A pair that holds no whole page-cache block is planned (and reported) as `posix-buffered`:
/// strict mode asking for `posix-direct` refuses it before any byte moves, and accepts a pair
/// that does hold one.
#[test]
fn strict_posix_direct_refuses_a_pair_without_a_whole_block() {
    let dir = disk_dir();
    let a = agent();
    let block = cache_block(&a, dir.path());
    let f = a
        .register(Memory::File(FileSpec::write(dir.path().join("strict"))))
        .unwrap();
    let src = a
        .register(Memory::host(HostBuffer::from_slice(&pattern(
            2 * block as usize,
            7,
        ))))
        .unwrap();
    let small = TransferRequest::write(vec![src.desc(0, 100)], vec![f.desc(1, 100)])
        .accept([DataPath::PosixDirect]);
    match a.post(small) {
        Err(Error::PathNotAccepted { planned, .. }) => {
            assert_eq!(planned, Some(DataPath::PosixBuffered))
        }
        other => panic!("expected PathNotAccepted, got {other:?}"),
    }
    let whole = TransferRequest::write(vec![src.desc(0, 2 * block)], vec![f.desc(0, 2 * block)])
        .accept([DataPath::PosixDirect]);
    let r = a.post(whole).unwrap().wait().unwrap();
    assert_eq!(r.pairs[0].path, DataPath::PosixDirect);
}

/// A file registered by its descriptor (`Memory::OpenFile`) is read and written through it,
/// O_DIRECT included (the engine opens `/proc/self/fd/N` again), and never by its path: the
/// name removed after the open changes nothing. A descriptor that cannot serve the access asked
/// (read-only for a writable region, `O_APPEND`) or is no regular file is refused at
/// registration.
#[test]
fn an_open_file_is_used_through_its_descriptor() {
    use gdpath::OpenFile;
    let dir = disk_dir();
    let p = dir.path().join("fd");
    std::fs::write(&p, vec![0u8; 1 << 20]).unwrap();
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&p)
        .unwrap();
    std::fs::remove_file(&p).unwrap();
    let a = agent();
    let data: Vec<u8> = (0..1u32 << 20).map(|i| (i % 253) as u8).collect();
    let src = a
        .register(Memory::host(HostBuffer::from_slice(&data)))
        .unwrap();
    let back = a
        .register(Memory::host(HostBuffer::zeroed(1 << 20)))
        .unwrap();
    let file = a
        .register(Memory::OpenFile(OpenFile::new(
            f.try_clone().unwrap(),
            &p,
            FileAccess::ReadWrite,
        )))
        .unwrap();
    let r = file.file().unwrap();
    assert!(r.direct_fd().is_some(), "O_DIRECT through /proc/self/fd");
    move_whole(&a, Op::Write, &src, &file, 1 << 20);
    move_whole(&a, Op::Read, &back, &file, 1 << 20);
    assert!(back.host_view().unwrap()[..] == data[..]);
    assert!(!p.exists(), "no path was opened again");

    let ro = std::fs::File::open("/proc/self/exe").unwrap();
    let e = a
        .register(Memory::OpenFile(OpenFile::new(
            ro,
            "exe",
            FileAccess::ReadWrite,
        )))
        .unwrap_err();
    assert!(e.to_string().contains("not open for writing"), "{e}");
    let q = dir.path().join("append");
    std::fs::write(&q, b"x").unwrap();
    let app = std::fs::OpenOptions::new()
        .read(true)
        .append(true)
        .open(&q)
        .unwrap();
    let e = a
        .register(Memory::OpenFile(OpenFile::new(
            app,
            &q,
            FileAccess::ReadWrite,
        )))
        .unwrap_err();
    assert!(e.to_string().contains("O_APPEND"), "{e}");
    let d = std::fs::File::open(dir.path()).unwrap();
    let e = a
        .register(Memory::OpenFile(OpenFile::new(
            d,
            dir.path(),
            FileAccess::ReadOnly,
        )))
        .unwrap_err();
    assert!(matches!(e, Error::NotAFile { .. }), "{e}");
}

/// Writes `data` through the engine into `memory` (a file region), from offset 0.
fn engine_write(memory: Memory, data: &[u8]) {
    let a = agent();
    let src = host(&a, data);
    let f = a.register(memory).unwrap();
    let n = data.len() as u64;
    a.post(TransferRequest::write(
        vec![src.desc(0, n)],
        vec![f.desc(0, n)],
    ))
    .unwrap()
    .wait()
    .unwrap();
}

/// An `AtomicFile`'s temporary registered with the engine (`AtomicFileExt::memory`) takes the
/// engine's writes, and only the commit publishes them.
#[test]
fn the_engine_writes_into_the_temporary_and_the_commit_publishes_it() {
    use gdpath::file::{AtomicFile, AtomicFileExt, ReplaceOptions};
    let dir = disk_dir();
    let t = dir.path().join("t");
    let mut a = AtomicFile::create(&t, ReplaceOptions::default()).unwrap();
    a.reserve(1 << 20).unwrap();
    let data = pattern(1 << 20, 251);
    engine_write(a.memory(DirectIo::Auto).unwrap(), &data);
    assert!(!t.exists());
    a.commit().unwrap();
    assert!(std::fs::read(&t).unwrap() == data);
}

/// Reproduction 2 of the hostile tester's report: a named temporary is written through its
/// descriptor (`AtomicFileExt::memory`), so its directory renamed and replaced by one holding
/// a link named as the temporary cannot redirect the engine's writes (main's `spec()` opened
/// the temporary's path and wrote the link's target); the commit gives the name in the
/// directory it was checked in.
#[test]
fn a_named_temporary_is_written_through_its_descriptor_whatever_its_directory_becomes() {
    use gdpath::file::{AtomicFile, AtomicFileExt, ReplaceOptions};
    for direct in [DirectIo::Off, DirectIo::Auto] {
        let dir = disk_dir();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, b"keep").unwrap();
        let e = dir.path().join("e");
        std::fs::create_dir(&e).unwrap();
        let a = AtomicFile::create_named(e.join("out"), ReplaceOptions::default()).unwrap();
        assert!(!a.is_unnamed());
        let temp = a.temp_path().file_name().unwrap().to_owned();
        std::fs::rename(&e, dir.path().join("e.old")).unwrap();
        std::fs::create_dir(&e).unwrap();
        std::os::unix::fs::symlink(&victim, e.join(&temp)).unwrap();
        let data = pattern(1 << 16, 7);
        engine_write(a.memory(direct).unwrap(), &data);
        assert!(
            std::fs::read(&victim).unwrap() == b"keep",
            "{direct:?}: the link's target was written"
        );
        a.commit().unwrap();
        assert!(std::fs::read(dir.path().join("e.old/out")).unwrap() == data);
        assert!(gdpath_testkit::temporaries(&dir.path().join("e.old")).is_empty());
    }
}

/// Reproduction 1's engine half: a file written in place (`InPlaceFileExt::memory`) is opened
/// once; its name swapped for a link afterwards redirects nothing.
#[test]
fn a_file_written_in_place_is_the_one_opened_whatever_its_name_becomes() {
    use gdpath::file::{InPlaceFile, InPlaceFileExt};
    let dir = disk_dir();
    let victim = dir.path().join("victim");
    std::fs::write(&victim, b"keep").unwrap();
    let f = dir.path().join("bench.dat");
    std::fs::write(&f, vec![0u8; 1 << 16]).unwrap();
    let opened = InPlaceFile::open(&f, true).unwrap().unwrap();
    assert_eq!(opened.len(), 1 << 16);
    std::fs::rename(&f, dir.path().join("bench.old")).unwrap();
    std::os::unix::fs::symlink(&victim, &f).unwrap();
    let data = vec![7u8; 1 << 16];
    for direct in [DirectIo::Off, DirectIo::Auto] {
        engine_write(opened.memory(FileAccess::ReadWrite, direct).unwrap(), &data);
    }
    assert!(
        std::fs::read(&victim).unwrap() == b"keep",
        "the link's target was written"
    );
    assert!(std::fs::read(dir.path().join("bench.old")).unwrap() == data);
    let e = InPlaceFile::open(&victim, false).unwrap_err();
    assert!(matches!(e, gdpath::file::Error::Exists { .. }), "{e}");
    assert!(InPlaceFile::open(&dir.path().join("none"), true)
        .unwrap()
        .is_none());
}
