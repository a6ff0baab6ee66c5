//! The GPU suite: run on a machine with NVIDIA GPUs with
//! `cargo test -p gdpath-cuda --test gpu -- --ignored --test-threads=1`.
//! Expected machine-specific values come from the probe fixture of the H200 device machine;
//! on another machine those comparisons are skipped (with a message) and the generic checks run.

#[path = "gpu/blocks.rs"]
mod blocks;
mod common;

use std::sync::Arc;

use gdpath_cuda::{
    enable_peer_access, gather_facts, pattern, Context, CuFileBuf, CuFileDriver, CuFileHandle,
    Cuda, CudaError, DeviceBuffer, Event, HostRegistration, PinnedHostBuffer, Stream,
};
use gdpath_topo::facts::P2pCap;

const SEED: u64 = 0x6764_7061_7468; // "gdpath"

fn cuda() -> Cuda {
    let c = Cuda::load().expect("the GPU suite needs libcuda.so.1");
    assert!(
        c.device_count().unwrap() >= 1,
        "the GPU suite needs at least one GPU"
    );
    c
}

fn ctx(c: &Cuda, ordinal: u32) -> Context {
    Context::new(c, ordinal).unwrap()
}

/// Two contexts, or None (after saying so) on a one-GPU machine.
fn two(c: &Cuda) -> Option<(Context, Context)> {
    if c.device_count().unwrap() < 2 {
        eprintln!("SKIPPED: fewer than 2 GPUs, peer part not run");
        return None;
    }
    Some((ctx(c, 0), ctx(c, 1)))
}

const SIZES: [usize; 5] = [1, 4095, 4097, 64 << 20, (1 << 30) + 1];

/// Pinned buffer of `off + n + 5` bytes, pattern positions 0..n at `off`.
fn pinned_pattern(c: &Context, off: usize, n: usize) -> PinnedHostBuffer {
    let mut h = PinnedHostBuffer::new(c, off + n + 5).unwrap();
    pattern::fill(&mut h.as_mut_slice().unwrap()[off..off + n], SEED, 0);
    h
}

#[test]
#[ignore = "needs an NVIDIA GPU: run the GPU suite"]
fn context_on_each_gpu() {
    let c = cuda();
    eprintln!(
        "driver {} from {}",
        c.driver_version().unwrap(),
        c.loaded_from()
    );
    for d in c.devices().unwrap() {
        let x = Context::new(&c, d.ordinal()).unwrap();
        let (free, total) = x.memory_info().unwrap();
        assert!(total > 0 && free <= total);
        assert_eq!(total, d.total_memory().unwrap());
        let pci = d.pci_bus_id().unwrap();
        assert_eq!(pci, pci.to_lowercase());
        eprintln!(
            "GPU {}: {} {} cc {:?} {} B",
            d.ordinal(),
            d.name().unwrap(),
            pci,
            d.compute_capability().unwrap(),
            total
        );
    }
    let n = c.device_count().unwrap();
    assert!(matches!(
        Context::new(&c, n),
        Err(CudaError::NoSuchDevice { .. })
    ));
}

#[test]
#[ignore = "needs an NVIDIA GPU: run the GPU suite"]
fn alloc_and_free_return_memory() {
    let c = cuda();
    let x = ctx(&c, 0);
    assert!(matches!(
        DeviceBuffer::new(&x, 0),
        Err(CudaError::InvalidArgument(_))
    ));
    let (free0, _) = x.memory_info().unwrap();
    {
        let bufs: Vec<DeviceBuffer> = (0..16)
            .map(|_| DeviceBuffer::new(&x, 256 << 20).unwrap())
            .collect();
        let (free1, _) = x.memory_info().unwrap();
        assert!(
            free0 - free1 >= 16 * (256 << 20),
            "4 GiB allocated: {free0} -> {free1}"
        );
        assert!(bufs
            .iter()
            .all(|b| b.len() == 256 << 20 && b.ordinal() == 0));
    }
    let (free2, _) = x.memory_info().unwrap();
    assert!(
        free2 + (64 << 20) >= free0,
        "memory came back: {free0} -> {free2}"
    );
}

/// H2D, D2D, D2H (and peer where there are two GPUs) at every size, with odd offsets, each step
/// checked byte for byte: on the GPU by the pattern kernel, and on the CPU after D2H.
#[test]
#[ignore = "needs an NVIDIA GPU: run the GPU suite"]
fn copies_are_byte_exact_at_all_sizes_with_offsets() {
    let c = cuda();
    let g0 = ctx(&c, 0);
    let peer = two(&c);
    if let Some((a, b)) = &peer {
        enable_peer_access(a, b).unwrap();
        enable_peer_access(b, a).unwrap();
    }
    let s0 = Stream::new(&g0).unwrap();
    for n in SIZES {
        let (ho, da, db) = (3usize, 5usize, 7usize);
        let src = pinned_pattern(&g0, ho, n);
        let a = DeviceBuffer::new(&g0, da + n + 1).unwrap();
        let b = DeviceBuffer::new(&g0, db + n + 2).unwrap();
        s0.copy_h2d(&a, da, &src, ho, n).unwrap();
        s0.synchronize().unwrap();
        assert!(
            s0.verify_pattern(&a, da, n, SEED, 0).unwrap().is_ok(),
            "H2D {n}"
        );
        s0.copy_d2d(&b, db, &a, da, n).unwrap();
        assert!(
            s0.verify_pattern(&b, db, n, SEED, 0).unwrap().is_ok(),
            "D2D {n}"
        );
        let mut dst = PinnedHostBuffer::new(&g0, n + 11).unwrap();
        s0.copy_d2h(&mut dst, 11, &b, db, n).unwrap();
        s0.synchronize().unwrap();
        let v = pattern::check(&dst.as_slice().unwrap()[11..], SEED, 0);
        assert!(v.is_ok(), "D2H {n}: {v:?}");
        assert_eq!(s0.compare(&a, da, &b, db, n).unwrap().mismatches, 0);
        if let Some((_, g1)) = &peer {
            let s1 = Stream::new(g1).unwrap();
            let p = DeviceBuffer::new(g1, n + 9).unwrap();
            s0.copy_peer(&p, 9, &a, da, n).unwrap();
            s0.synchronize().unwrap();
            assert!(
                s1.verify_pattern(&p, 9, n, SEED, 0).unwrap().is_ok(),
                "peer 0->1 {n}"
            );
            let back = DeviceBuffer::new(&g0, n).unwrap();
            s1.copy_peer(&back, 0, &p, 9, n).unwrap();
            s1.synchronize().unwrap();
            assert_eq!(
                s0.compare(&back, 0, &a, da, n).unwrap().mismatches,
                0,
                "peer 1->0 {n}"
            );
        }
        eprintln!(
            "size {n}: H2D, D2D, D2H{} exact",
            if peer.is_some() {
                ", peer both ways"
            } else {
                ""
            }
        );
    }
}

/// The checks above can fail: a flipped byte is found, at the right index, by both the kernel
/// and the host path, and the fill kernel writes the same bytes as the CPU.
#[test]
#[ignore = "needs an NVIDIA GPU: run the GPU suite"]
fn verification_detects_a_corrupted_byte() {
    let c = cuda();
    let g = ctx(&c, 0);
    let s = Stream::new(&g).unwrap();
    let n = (8 << 20) + 3;
    let buf = DeviceBuffer::new(&g, n).unwrap();
    s.fill_pattern(&buf, 0, n, SEED, 1000).unwrap();
    let mut host = vec![0u8; n];
    s.read_into_slice(&mut host, &buf, 0).unwrap();
    assert!(
        pattern::check(&host, SEED, 1000).is_ok(),
        "GPU fill == CPU pattern"
    );
    assert!(s.verify_pattern(&buf, 0, n, SEED, 1000).unwrap().is_ok());
    let bad_at = 5_000_001;
    s.memset(&buf, bad_at, 1, host[bad_at] ^ 0x5a).unwrap();
    let v = s.verify_pattern(&buf, 0, n, SEED, 1000).unwrap();
    assert_eq!((v.mismatches, v.first_mismatch), (1, Some(bad_at as u64)));
    let mut staging = PinnedHostBuffer::new(&g, 1 << 20).unwrap();
    let h = s
        .verify_pattern_on_host(&buf, 0, n, SEED, 1000, &mut staging)
        .unwrap();
    assert_eq!(h, v, "host path agrees with the kernel");
    let other = DeviceBuffer::new(&g, n).unwrap();
    s.fill_pattern(&other, 0, n, SEED, 1000).unwrap();
    let cmp = s.compare(&buf, 0, &other, 0, n).unwrap();
    assert_eq!(
        (cmp.mismatches, cmp.first_mismatch),
        (1, Some(bad_at as u64))
    );
}

#[test]
#[ignore = "needs an NVIDIA GPU: run the GPU suite"]
fn out_of_bounds_copies_are_rejected_before_the_driver() {
    let c = cuda();
    let g = ctx(&c, 0);
    let s = Stream::new(&g).unwrap();
    let d = DeviceBuffer::new(&g, 4096).unwrap();
    let d2 = DeviceBuffer::new(&g, 4096).unwrap();
    let mut h = PinnedHostBuffer::new(&g, 4096).unwrap();
    s.memset(&d, 0, 4096, 0xab).unwrap();
    let oob = |r: Result<(), CudaError>| {
        assert!(matches!(r, Err(CudaError::InvalidArgument(_))), "{r:?}")
    };
    oob(s.copy_h2d(&d, 1, &h, 0, 4096));
    oob(s.copy_h2d(&d, 0, &h, 4095, 2));
    oob(s.copy_d2h(&mut h, 4000, &d, 0, 97));
    oob(s.copy_d2d(&d2, 0, &d, usize::MAX, 2));
    oob(s.copy_peer(&d2, 4096, &d, 0, 1));
    oob(s.memset(&d, 4096, 1, 0));
    oob(s.write_from_slice(&d, 1, &[0u8; 4096]));
    oob(s.read_into_slice(&mut [0u8; 10], &d, 4090));
    // Nothing was written: the buffer still holds the memset value.
    let mut back = vec![0u8; 4096];
    s.read_into_slice(&mut back, &d, 0).unwrap();
    assert!(back.iter().all(|&b| b == 0xab));
}

#[test]
#[ignore = "needs an NVIDIA GPU: run the GPU suite"]
fn pinned_and_registered_host_memory() {
    let c = cuda();
    let g = ctx(&c, 0);
    let s = Stream::new(&g).unwrap();
    let n = (16 << 20) + 1;
    let mut v = vec![0u8; n];
    pattern::fill(&mut v, SEED, 77);
    let src = HostRegistration::new(&g, v).unwrap();
    let dst = HostRegistration::new(&g, vec![0u8; n]).unwrap();
    let mut dst = dst;
    let d = DeviceBuffer::new(&g, n).unwrap();
    s.copy_h2d(&d, 0, &src, 0, n).unwrap();
    s.copy_d2h(&mut dst, 0, &d, 0, n).unwrap();
    // In flight: the CPU may not look yet, and the memory cannot be taken back.
    assert!(matches!(dst.as_slice(), Err(CudaError::BufferBusy)));
    assert!(matches!(dst.as_mut_slice(), Err(CudaError::BufferBusy)));
    s.synchronize().unwrap();
    assert!(pattern::check(dst.as_slice().unwrap(), SEED, 77).is_ok());
    let back = dst.into_inner().unwrap();
    assert_eq!(back.len(), n);
    assert!(pattern::check(&back, SEED, 77).is_ok());
    // The same memory can be registered again once unregistered.
    let again = HostRegistration::new(&g, back).unwrap();
    assert_eq!(again.len(), n);
    // Pinned buffer.
    let mut p = PinnedHostBuffer::new(&g, n).unwrap();
    assert!(
        p.as_slice().unwrap().iter().all(|&b| b == 0),
        "pinned memory starts zeroed"
    );
    s.copy_d2h(&mut p, 0, &d, 0, n).unwrap();
    s.synchronize().unwrap();
    assert!(pattern::check(p.as_slice().unwrap(), SEED, 77).is_ok());
}

/// Dropping every handle while copies are in flight is safe: the stream holds the memory.
#[test]
#[ignore = "needs an NVIDIA GPU: run the GPU suite"]
fn buffers_outlive_in_flight_copies() {
    let c = cuda();
    let g = ctx(&c, 0);
    let s = Stream::new(&g).unwrap();
    let n = 512 << 20;
    let (free0, _) = g.memory_info().unwrap();
    {
        let a = DeviceBuffer::new(&g, n).unwrap();
        let b = DeviceBuffer::new(&g, n).unwrap();
        s.fill_pattern(&a, 0, n, SEED, 0).unwrap();
        for _ in 0..8 {
            s.copy_d2d(&b, 0, &a, 0, n).unwrap();
        }
        drop(a);
        let v = s.verify_pattern(&b, 0, n, SEED, 0).unwrap();
        assert!(v.is_ok(), "{v:?}");
    }
    s.synchronize().unwrap();
    let (free1, _) = g.memory_info().unwrap();
    assert!(
        free1 + (64 << 20) >= free0,
        "freed after synchronize: {free0} -> {free1}"
    );
}

#[test]
#[ignore = "needs an NVIDIA GPU: run the GPU suite"]
fn events_time_a_copy() {
    let c = cuda();
    let g = ctx(&c, 0);
    let s = Stream::new(&g).unwrap();
    let n = 256 << 20;
    let h = PinnedHostBuffer::new(&g, n).unwrap();
    let d = DeviceBuffer::new(&g, n).unwrap();
    let (t0, t1) = (Event::new(&g, true).unwrap(), Event::new(&g, true).unwrap());
    s.copy_h2d(&d, 0, &h, 0, n).unwrap(); // warm-up
    t0.record(&s).unwrap();
    s.copy_h2d(&d, 0, &h, 0, n).unwrap();
    t1.record(&s).unwrap();
    t1.synchronize().unwrap();
    let ms = t0.elapsed_ms(&t1).unwrap();
    let gbps = n as f64 / (ms as f64 / 1e3) / 1e9;
    eprintln!("H2D 256 MiB pinned: {ms:.3} ms = {gbps:.1} GB/s");
    // PCIe Gen5 x16 carries at most ~63 GB/s of data; anything above is a timing bug.
    assert!(ms > 0.0 && gbps > 1.0 && gbps < 70.0, "{gbps} GB/s");
    let nt = Event::new(&g, false).unwrap();
    assert!(matches!(
        t0.elapsed_ms(&nt),
        Err(CudaError::InvalidArgument(_))
    ));
}

/// gather_facts against the probe of the H200 machine (skipped, with a message, elsewhere).
#[test]
#[ignore = "needs an NVIDIA GPU: run the GPU suite"]
fn gather_facts_matches_the_probe() {
    let f = gather_facts().unwrap();
    println!("{}", serde_json::to_string_pretty(&f).unwrap());
    assert!(!f.gpus.is_empty());
    for g in &f.gpus {
        assert_eq!(g.pci, g.pci.to_lowercase());
        assert!(g.memory_bytes > 0 && g.gdr_supported.is_some() && g.dma_buf_supported.is_some());
    }
    let p = common::probe();
    let pcis: Vec<&str> = f.gpus.iter().map(|g| g.pci.as_str()).collect();
    if pcis != ["0000:00:06.0", "0000:00:07.0"] {
        eprintln!("SKIPPED probe comparison: GPUs {pcis:?} are not the probe machine's");
        return;
    }
    assert!(f.gaps.is_empty(), "gaps: {:?}", f.gaps);
    assert_eq!(f.driver_version.as_deref(), Some(p.driver_version.as_str()));
    assert_eq!(
        f.cuda_driver_version,
        Some(13000),
        "probe: CUDA {}",
        p.cuda_version
    );
    for (i, g) in f.gpus.iter().enumerate() {
        assert_eq!(g.name, "NVIDIA H200");
        assert_eq!(g.bar1_total_bytes, Some(p.bar1_total_mib[i] << 20));
        assert_eq!(g.bar1_total_bytes, Some(256 << 30));
        let pcie = g.pcie.unwrap();
        assert_eq!((pcie.max_gen, pcie.cur_gen), p.pcie_gen[i]);
        assert_eq!((pcie.cur_width, pcie.max_width), (16, 16));
        assert_eq!(g.nvlinks.len(), 18, "NV18");
        // HGX H200: every link goes to an NVSwitch, which this VM does not see, so NVML gives
        // the remote as a switch at PCI ffffffff:ff:ff.0 (docs/gpu.md); NV18 between
        // the two GPUs is 18 links each to the same switch fabric.
        for (l, (pl, gbps)) in g.nvlinks.iter().zip(&p.nvlinks[i]) {
            assert_eq!(l.link, *pl);
            assert!(
                l.remote_is_switch,
                "link {} remote {}",
                l.link, l.remote_pci
            );
            assert!(
                !pcis.contains(&l.remote_pci.as_str()),
                "remote is not a GPU"
            );
            assert_eq!(l.gbps, Some(*gbps), "link {} rate", l.link);
            assert_eq!(l.version.as_deref(), Some("4.0"));
        }
    }
    assert_eq!(f.nvlink_count(0, 1), 18);
    for (a, b) in [(0, 1), (1, 0)] {
        let pair = f.pair(a, b).unwrap();
        let nv = pair.nvml.unwrap();
        assert_eq!(
            [nv.read, nv.write, nv.nvlink, nv.atomics, nv.pci],
            [P2pCap::Ok, P2pCap::Ok, P2pCap::Ok, P2pCap::Ok, P2pCap::Ns]
        );
        let cu = pair.cuda.unwrap();
        assert!(cu.access_supported && cu.native_atomics);
    }
}

fn direct_file(path: &std::path::Path, n: usize) -> std::io::Result<Arc<std::fs::File>> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut data = vec![0u8; n];
    pattern::fill(&mut data, SEED, 0);
    std::fs::write(path, &data)?;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)?;
    Ok(Arc::new(f))
}

/// cuFile: the driver opens, properties are read, and handle registration on tmpfs and on the
/// root filesystem either works (then a read and a write round-trip are verified) or fails
/// with cuFile's own code and text.
#[test]
#[ignore = "needs an NVIDIA GPU: run the GPU suite"]
fn cufile_driver_properties_and_handle_registration() {
    let c = cuda();
    let g = ctx(&c, 0);
    let drv = match CuFileDriver::open(&g) {
        Ok(d) => d,
        Err(e @ CudaError::LibraryMissing { .. }) => {
            eprintln!("SKIPPED: {e}");
            return;
        }
        Err(e) => panic!("cuFileDriverOpen: {e}"),
    };
    eprintln!(
        "libcufile from {}, version {:?}",
        drv.loaded_from(),
        drv.version()
    );
    let p = drv.properties().unwrap();
    eprintln!(
        "cuFile properties: {p:?}; storage {:?}, poll {}, compat {}, batch {}, nvfs loaded {}",
        p.supported_storage(),
        p.poll_mode(),
        p.compat_mode_allowed(),
        p.batch_io_supported(),
        p.nvfs_loaded()
    );
    assert!(p.max_direct_io_size_kb > 0);
    let n = 1 << 20;
    let d = DeviceBuffer::new(&g, n + 4096).unwrap();
    let reg = CuFileBuf::register(&drv, &d);
    eprintln!("cuFileBufRegister: {:?}", reg.as_ref().map(|_| "ok"));
    let s = Stream::new(&g).unwrap();
    for dir in ["/dev/shm", "/var/tmp"] {
        let path = std::path::Path::new(dir).join(format!("gdpath-cufile-{}", std::process::id()));
        let f = match direct_file(&path, n) {
            Ok(f) => f,
            Err(e) => {
                eprintln!("SKIPPED {dir}: cannot open with O_DIRECT: {e}");
                continue;
            }
        };
        match CuFileHandle::register(&drv, f) {
            Ok(h) => {
                let got = h.read(&d, 4096, 0, n).unwrap();
                assert_eq!(got, n);
                assert!(
                    s.verify_pattern(&d, 4096, n, SEED, 0).unwrap().is_ok(),
                    "cuFileRead data"
                );
                s.fill_pattern(&d, 0, n, SEED ^ 1, 0).unwrap();
                s.synchronize().unwrap();
                assert_eq!(h.write(&d, 0, 0, n).unwrap(), n);
                let back = std::fs::read(&path).unwrap();
                assert!(
                    pattern::check(&back, SEED ^ 1, 0).is_ok(),
                    "cuFileWrite data"
                );
                eprintln!("{dir}: cuFile handle registered; read and write verified");
            }
            Err(e) => {
                let CudaError::CuFile {
                    code,
                    name,
                    message,
                    ..
                } = &e
                else {
                    panic!("{dir}: expected a cuFile error, got {e:?}")
                };
                assert!(*code >= 5001 && name.starts_with("CU_FILE_") && !message.is_empty());
                eprintln!("{dir}: cuFileHandleRegister refused: {e}");
            }
        }
        let _ = std::fs::remove_file(&path);
    }
    drop(reg);
}

/// Everything on GPU 0 alone (CUDA_VISIBLE_DEVICES=0 machines, one-GPU nodes).
#[test]
#[ignore = "needs an NVIDIA GPU: run the GPU suite"]
fn one_gpu_path() {
    let c = cuda();
    let g = ctx(&c, 0);
    let s = Stream::new(&g).unwrap();
    let n = (64 << 20) + 1;
    let h = pinned_pattern(&g, 0, n);
    let a = DeviceBuffer::new(&g, n).unwrap();
    let b = DeviceBuffer::new(&g, n).unwrap();
    s.copy_h2d(&a, 0, &h, 0, n).unwrap();
    // A "peer" copy within one GPU is a device-local copy.
    s.copy_peer(&b, 0, &a, 0, n).unwrap();
    assert!(s.verify_pattern(&b, 0, n, SEED, 0).unwrap().is_ok());
    let mut out = vec![0u8; n];
    s.read_into_slice(&mut out, &b, 0).unwrap();
    assert!(pattern::check(&out, SEED, 0).is_ok());
    assert!(matches!(
        enable_peer_access(&g, &g),
        Err(CudaError::InvalidArgument(_))
    ));
    if c.device_count().unwrap() > 1 {
        let g1 = ctx(&c, 1);
        // copy_d2d refuses to cross GPUs; the caller must say copy_peer.
        let far = DeviceBuffer::new(&g1, n).unwrap();
        assert!(matches!(
            s.copy_d2d(&far, 0, &a, 0, n),
            Err(CudaError::InvalidArgument(_))
        ));
    }
}

/// A slab filled in parts from several threads and sent with one copy is byte-exact; the rules
/// hold: overlapping parts and parts outside the slab are refused, no part is handed out while a
/// copy may run (until `wait_copied`), no copy starts while a part is out.
#[test]
#[ignore = "needs an NVIDIA GPU: run the GPU suite"]
fn slab_parts_then_one_copy() {
    use gdpath_cuda::PinnedSlab;
    let c = cuda();
    let g = ctx(&c, 0);
    let (parts, part) = (8usize, (1usize << 20) + 7);
    let len = parts * part;
    let slab = PinnedSlab::new(&g, PinnedHostBuffer::new(&g, len).unwrap())
        .map_err(|(e, _)| e)
        .unwrap();
    let dev = DeviceBuffer::new(&g, len).unwrap();
    let st = Stream::new(&g).unwrap();
    let st2 = Stream::new(&g).unwrap();
    let st3 = Stream::new(&g).unwrap();
    let mut want = vec![0u8; len];
    pattern::fill(&mut want, SEED, 0);
    for round in 0..2u8 {
        std::thread::scope(|s| {
            for i in 0..parts {
                let (slab, want) = (&slab, &want);
                s.spawn(move || {
                    let r = i * part..(i + 1) * part;
                    let mut p = slab.part(r.clone()).unwrap();
                    p.copy_from_slice(&want[r]);
                    p[0] ^= round; // round 1 differs in each part's first byte
                });
            }
        });
        {
            let p = slab.part(0..16).unwrap();
            assert!(matches!(
                slab.part(8..24),
                Err(CudaError::InvalidArgument(_))
            ));
            assert!(matches!(
                slab.part(len - 1..len + 1),
                Err(CudaError::InvalidArgument(_))
            ));
            assert!(matches!(
                slab.copy_h2d(&st, &dev, 0, 0, len),
                Err(CudaError::BufferBusy)
            ));
            drop(p);
        }
        // The second (small) copy, on another stream, is ordered after the first (large) one:
        // one wait covers both, which a read on a third stream then sees.
        let small = 4096;
        slab.copy_h2d(&st, &dev, 0, 0, len - small).unwrap();
        slab.copy_h2d(&st2, &dev, len - small, len - small, small)
            .unwrap();
        assert!(matches!(slab.part(0..1), Err(CudaError::BufferBusy)));
        slab.wait_copied().unwrap();
        let mut back = vec![0u8; len];
        st3.read_into_slice(&mut back, &dev, 0).unwrap();
        let mut expect = want.clone();
        for i in 0..parts {
            expect[i * part] ^= round;
        }
        assert!(back == expect, "round {round}: the GPU copy differs");
        slab.part(0..1).unwrap();
    }
    st.synchronize().unwrap();
    st2.synchronize().unwrap();
    let mut buf = slab.into_inner();
    buf.as_mut_slice().unwrap();
}
