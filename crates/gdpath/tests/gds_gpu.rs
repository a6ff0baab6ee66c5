//! GPU suite for the file ↔ GPU paths: every path both directions, byte-exact, sizes around the
//! 4 KiB alignment, offsets into files and GPU regions, short files, tmpfs and ext4. Checkpoints
//! loaded onto and saved from a GPU are the `gdpath-checkpoint` crate's `gpu_checkpoint` suite.
//!
//! Run with `cargo test -p gdpath --test gds_gpu -- --ignored` on a machine with a GPU.
//! `GDPATH_GDS_DIRS` (colon-separated) overrides the directories tested (default `/dev/shm`
//! and `/var/tmp`).

use gdpath::{
    Agent, AgentConfig, DataPath, DirectIo, Error, FileAccess, FileSpec, GdsConfig, Memory,
    TransferRequest,
};
use gdpath_testkit::gpu::{gds_agent as agent, gpu_bytes, gpu_put};

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut v = vec![0u8; len];
    gdpath_cuda::pattern::fill(&mut v, seed, 0);
    v
}

/// The staged paths (O_DIRECT and buffered) and, when cuFile takes the file, the cuFile ones:
/// reads and writes with sizes and offsets around 4 KiB and chunk boundaries, byte-exact.
#[test]
#[ignore = "needs an NVIDIA GPU: run the GPU suite"]
fn every_path_both_directions_byte_exact() {
    let chunk = 64 << 10;
    let a = agent(chunk, 4);
    let sizes = [
        1u64,
        511,
        4095,
        4096,
        4097,
        chunk - 1,
        chunk,
        chunk + 1,
        3 * chunk + 4097,
        1 << 20,
    ];
    let offs = [0u64, 1, 4095, 4096, 12_345];
    let mut seen: Vec<(DataPath, Option<String>)> = Vec::new();
    for dir in gdpath_testkit::gds_dirs() {
        let td = tempfile::tempdir_in(&dir).unwrap();
        for direct in [DirectIo::Auto, DirectIo::Off] {
            let fpath = td.path().join(format!("data-{direct:?}"));
            let file_len = (1u64 << 20) + 3 * 4096 + 77;
            let src = pattern(file_len as usize, 7);
            std::fs::write(&fpath, &src).unwrap();
            let f = a
                .register(Memory::File(
                    FileSpec::read(&fpath)
                        .access(FileAccess::ReadWrite)
                        .direct(direct),
                ))
                .unwrap();
            let g = a
                .register(Memory::Gpu {
                    ordinal: 0,
                    len: 2 << 20,
                })
                .unwrap();
            for &len in &sizes {
                for &fo in &offs {
                    if fo + len > file_len {
                        continue;
                    }
                    let go = (fo * 7 + 3) % 8192;
                    // File -> GPU.
                    gpu_put(&a, &g, go, &vec![0xAA; len as usize]);
                    let r = a
                        .post(TransferRequest::read(
                            vec![g.desc(go, len)],
                            vec![f.desc(fo, len)],
                        ))
                        .unwrap()
                        .wait()
                        .unwrap();
                    let p = &r.pairs[0];
                    seen.push((p.path.clone(), p.finding.as_ref().map(|x| x.to_string())));
                    assert_eq!(
                        gpu_bytes(&a, &g, go, len),
                        &src[fo as usize..(fo + len) as usize],
                        "{} read len {len} file off {fo} gpu off {go} via {}",
                        fpath.display(),
                        p.path
                    );
                    if direct == DirectIo::Off {
                        // Buffered, and a fallback says why (the first refusal: cuFile's where
                        // it refused the file, else O_DIRECT being off).
                        assert_eq!(p.path, DataPath::PosixBuffered);
                        assert!(p.finding.is_some());
                    }
                    // GPU -> file (new bytes), then check the file and that neighbours are intact.
                    let new = pattern(len as usize, len ^ fo);
                    gpu_put(&a, &g, go, &new);
                    a.post(TransferRequest::write(
                        vec![g.desc(go, len)],
                        vec![f.desc(fo, len)],
                    ))
                    .unwrap()
                    .wait()
                    .unwrap();
                    let now = std::fs::read(&fpath).unwrap();
                    assert_eq!(
                        &now[fo as usize..(fo + len) as usize],
                        &new[..],
                        "write len {len} off {fo}"
                    );
                    assert_eq!(
                        &now[..fo as usize],
                        &src[..fo as usize],
                        "bytes before the write"
                    );
                    assert_eq!(
                        &now[(fo + len) as usize..],
                        &src[(fo + len) as usize..],
                        "bytes after the write"
                    );
                    std::fs::write(&fpath, &src).unwrap();
                }
            }
        }
    }
    // Which paths ran, and why (cuFile refused on the device machine: the finding says so).
    let mut kinds: Vec<_> = seen.iter().map(|(p, f)| format!("{p} {f:?}")).collect();
    kinds.sort();
    kinds.dedup();
    eprintln!("paths taken: {kinds:?}");
    assert!(seen.iter().any(|(p, _)| *p == DataPath::PosixBuffered));
    assert!(seen
        .iter()
        .any(|(p, _)| matches!(p, DataPath::PosixDirect | DataPath::GdsNative)));
}

/// Buffered reads into GPU memory through slabs (`GdsConfig::slabs`): sizes of one chunk, one
/// group, a group and a byte, many groups with a short last one; unaligned file and GPU offsets;
/// two and three slabs; two pairs at once (two dispatchers). Byte-exact, and the GPU bytes just
/// outside each read keep their sentinel.
#[test]
#[ignore = "needs an NVIDIA GPU: run the GPU suite"]
fn slab_reads_byte_exact() {
    let chunk = 64u64 << 10;
    let offs = [0u64, 1, 4096, 12_345];
    // One thread too: a group is then one chunk.
    for (threads, slabs) in [(3usize, 2usize), (3, 3), (1, 2)] {
        let group = chunk * threads as u64;
        let sizes = [
            1u64,
            chunk,
            group,
            group + 1,
            7 * group + 4097,
            (4 << 20) + 12_345,
        ];
        let a = Agent::new(AgentConfig {
            gds: GdsConfig {
                chunk,
                threads,
                slabs,
                ..GdsConfig::default()
            },
            ..AgentConfig::default()
        })
        .unwrap();
        for dir in gdpath_testkit::gds_dirs() {
            let td = tempfile::tempdir_in(&dir).unwrap();
            let fpath = td.path().join("slabs");
            let file_len = (5u64 << 20) + 77;
            let src = pattern(file_len as usize, 11);
            std::fs::write(&fpath, &src).unwrap();
            let f = a
                .register(Memory::File(FileSpec::read(&fpath).direct(DirectIo::Off)))
                .unwrap();
            let glen = 12u64 << 20;
            let g = a
                .register(Memory::Gpu {
                    ordinal: 0,
                    len: glen,
                })
                .unwrap();
            for &len in &sizes {
                for &fo in &offs {
                    if fo + len > file_len {
                        continue;
                    }
                    let go = 4096 + (fo * 7 + 3) % 8192;
                    // Two pairs: the range and, after it on the GPU, the same file range again.
                    let go2 = go + len + 4096;
                    gpu_put(&a, &g, 0, &vec![0xAA; glen as usize]);
                    let r = a
                        .post(TransferRequest::read(
                            vec![g.desc(go, len), g.desc(go2, len)],
                            vec![f.desc(fo, len), f.desc(fo, len)],
                        ))
                        .unwrap()
                        .wait()
                        .unwrap();
                    assert_eq!(r.pairs[0].path, DataPath::PosixBuffered);
                    let want = &src[fo as usize..(fo + len) as usize];
                    for at in [go, go2] {
                        let got = gpu_bytes(&a, &g, at - 1, len + 2);
                        let what = format!(
                            "{threads} threads, {slabs} slabs, len {len}, file off {fo}, gpu off {at}"
                        );
                        assert_eq!(&got[1..=len as usize], want, "{what}");
                        assert_eq!(
                            (got[0], got[len as usize + 1]),
                            (0xAA, 0xAA),
                            "{what}: a byte outside the read changed"
                        );
                    }
                }
            }
        }
    }
}

/// A slab read cancelled while it runs, or whose file is truncated under it, ends promptly:
/// cancelled (or complete, when it won the race), or a short-file error (or complete); the
/// agent's next slab read is byte-exact (no slab left busy or leaked).
#[test]
#[ignore = "needs an NVIDIA GPU: run the GPU suite"]
fn slab_reads_cancelled_or_cut_short_leave_the_agent_usable() {
    let a = Agent::new(AgentConfig {
        gds: GdsConfig {
            chunk: 1 << 20,
            threads: 4,
            slabs: 3,
            ..GdsConfig::default()
        },
        ..AgentConfig::default()
    })
    .unwrap();
    let len = 1u64 << 30;
    let free = rustix::fs::statvfs("/dev/shm").map(|v| v.f_bavail * v.f_frsize);
    if !free.is_ok_and(|f| f >= 2 * len) {
        eprintln!("SKIPPED: /dev/shm has less than 2 GiB free ({free:?}): no 1 GiB file to read");
        return;
    }
    let td = tempfile::tempdir_in("/dev/shm").unwrap();
    let p = td.path().join("big");
    let src = pattern(len as usize, 5);
    std::fs::write(&p, &src).unwrap();
    let f = a
        .register(Memory::File(FileSpec::read(&p).direct(DirectIo::Off)))
        .unwrap();
    let g = a.register(Memory::Gpu { ordinal: 0, len }).unwrap();
    let read = || {
        a.post(TransferRequest::read(
            vec![g.desc(0, len)],
            vec![f.desc(0, len)],
        ))
        .unwrap()
    };
    let (mut cancelled, mut short) = (0, 0);
    for _ in 0..3 {
        let t = read();
        std::thread::sleep(std::time::Duration::from_millis(3));
        t.cancel();
        let t0 = std::time::Instant::now();
        match t.wait() {
            Ok(r) => assert_eq!(r.bytes, len),
            Err(e) => {
                assert!(matches!(e.error, Error::Cancelled), "{}", e.error);
                cancelled += 1;
            }
        }
        assert!(
            t0.elapsed().as_secs() < 10,
            "the cancelled read took {:?}",
            t0.elapsed()
        );
    }
    for _ in 0..2 {
        let t = read();
        std::thread::sleep(std::time::Duration::from_millis(3));
        std::fs::OpenOptions::new()
            .write(true)
            .open(&p)
            .unwrap()
            .set_len(len / 2)
            .unwrap();
        let t0 = std::time::Instant::now();
        match t.wait() {
            Ok(r) => assert_eq!(r.bytes, len),
            Err(e) => {
                assert!(matches!(e.error, Error::ShortFile { .. }), "{}", e.error);
                short += 1;
            }
        }
        assert!(
            t0.elapsed().as_secs() < 10,
            "the cut read took {:?}",
            t0.elapsed()
        );
        std::fs::write(&p, &src).unwrap();
    }
    eprintln!("{cancelled} of 3 reads cancelled, {short} of 2 cut short before they finished");
    // 1 GiB takes ≥ 18 ms at the H2D limit, six times the 3 ms before the cancel or the cut.
    assert!(
        cancelled > 0 && short > 0,
        "no read was stopped while it ran: {cancelled} cancelled, {short} cut short"
    );
    gpu_put(&a, &g, 0, &vec![0xAA; 1 << 20]);
    read().wait().unwrap();
    for off in [0u64, len / 2, len - (1 << 20)] {
        assert_eq!(
            gpu_bytes(&a, &g, off, 1 << 20),
            &src[off as usize..(off + (1 << 20)) as usize],
            "offset {off}"
        );
    }
}

/// Strict requests for each GDS path: taken where possible, else a typed refusal naming the
/// finding (cuFile's reason in the detail).
#[test]
#[ignore = "needs an NVIDIA GPU: run the GPU suite"]
fn strict_paths_say_why() {
    let a = agent(1 << 20, 4);
    let td = tempfile::tempdir_in("/var/tmp").unwrap();
    let p = td.path().join("f");
    let src = pattern(3 << 20, 3);
    std::fs::write(&p, &src).unwrap();
    let f = a.register(Memory::File(FileSpec::read(&p))).unwrap();
    let g = a
        .register(Memory::Gpu {
            ordinal: 0,
            len: 3 << 20,
        })
        .unwrap();
    for path in [
        DataPath::GdsNative,
        DataPath::GdsCompat,
        DataPath::PosixDirect,
    ] {
        let req = TransferRequest::read(vec![g.desc(0, 3 << 20)], vec![f.desc(0, 3 << 20)])
            .accept([path.clone()]);
        match a.post(req) {
            Ok(t) => {
                let r = t.wait().unwrap();
                assert_eq!(r.pairs[0].path, path);
                assert_eq!(gpu_bytes(&a, &g, 0, 3 << 20), src);
                eprintln!("{path}: taken");
            }
            Err(Error::PathNotAccepted {
                finding, detail, ..
            }) => {
                let finding = finding.expect("a refusal names its finding");
                eprintln!("{path}: refused [{finding}] {detail}");
                assert!(
                    path != DataPath::PosixDirect,
                    "O_DIRECT on /var/tmp must work"
                );
                assert!(
                    [
                        "gds.handle-register-failed",
                        "gds.cufile-missing",
                        "gds.nvidia-fs-missing"
                    ]
                    .contains(&finding.as_str()),
                    "{finding}"
                );
                if finding.as_str() == "gds.handle-register-failed" {
                    assert!(detail.contains("cuFileHandleRegister"), "{detail}");
                }
            }
            Err(e) => panic!("{path}: {e}"),
        }
    }
}

/// A read past the end of the file fails before any byte moves.
#[test]
#[ignore = "needs an NVIDIA GPU: run the GPU suite"]
fn short_files_are_errors() {
    let a = agent(64 << 10, 2);
    let td = tempfile::tempdir_in("/dev/shm").unwrap();
    let p = td.path().join("short");
    std::fs::write(&p, pattern(10_000, 1)).unwrap();
    let f = a.register(Memory::File(FileSpec::read(&p))).unwrap();
    let g = a
        .register(Memory::Gpu {
            ordinal: 0,
            len: 20_000,
        })
        .unwrap();
    let e = a
        .post(TransferRequest::read(
            vec![g.desc(0, 10_001)],
            vec![f.desc(0, 10_001)],
        ))
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::ShortFile {
                available: 10_000,
                ..
            }
        ),
        "{e}"
    );
}
