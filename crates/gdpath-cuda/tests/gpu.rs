//! The GPU suite: run on a machine with NVIDIA GPUs with
//! `cargo test -p gdpath-cuda --test gpu -- --ignored --test-threads=1`.
//! Expected machine-specific values come from the probe fixture of the H200 device machine;
//! on another machine those comparisons are skipped (with a message) and the generic checks run.

mod common;

use std::sync::Arc;

use gdpath_cuda::{
    enable_peer_access, gather_facts, pattern, BlockCopier, BlockCopy, BlockListError, BlockMethod,
    BlockRegion, Context, CuFileBuf, CuFileDriver, CuFileHandle, Cuda, CudaError, DeviceBuffer,
    Event, HostRegistration, IpcMemHandle, MemLocation, PinnedHost, PinnedHostBuffer, Stream,
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
        // the remote as a switch at PCI ffffffff:ff:ff.0 (measured 2026-11-30); NV18 between
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

// ---------------------------------------------------------------------------------------------
// Block-list copies (gdpath_cuda::blocks) and CUDA IPC
// ---------------------------------------------------------------------------------------------

/// The block-copy methods this driver offers. A driver of CUDA 12.8 or later must offer the
/// batch; the kernel must load everywhere.
fn block_methods(c: &Cuda, copier: &BlockCopier) -> Vec<BlockMethod> {
    let mut out = Vec::new();
    for m in BlockMethod::ALL {
        match copier.available(m) {
            Ok(()) => out.push(m),
            Err(e) => {
                let driver = c.driver_version().unwrap();
                assert!(
                    m == BlockMethod::DriverBatch && driver < 12080,
                    "{m} unavailable with driver {driver}: {e}"
                );
                eprintln!("SKIPPED method {m}: {e}");
            }
        }
    }
    if let Ok(abi) = copier.batch_abi() {
        eprintln!("cuMemcpyBatchAsync ABI: {abi:?}");
    }
    out
}

/// `n` descriptors of `block` bytes: slot `dst_slots[i]` of the region at `dst` from slot
/// `src_slots[i]` of the region at `src`.
fn slot_list(
    dst: u64,
    dst_slots: &[u32],
    src: u64,
    src_slots: &[u32],
    block: u64,
) -> Vec<BlockCopy> {
    dst_slots
        .iter()
        .zip(src_slots)
        .map(|(&d, &s)| BlockCopy::new(dst + d as u64 * block, src + s as u64 * block, block))
        .collect()
}

/// The list that undoes `list`: each block back from its destination to the place in
/// `back` (at address `back_base`) that its source had in the region at `src_base`.
fn undo_list(list: &[BlockCopy], src_base: u64, back_base: u64) -> Vec<BlockCopy> {
    list.iter()
        .map(|c| BlockCopy::new(back_base + (c.src - src_base), c.dst, c.len))
        .collect()
}

fn host_addr<H: PinnedHost>(h: &H) -> u64 {
    h.host_ptr() as u64
}

/// KV offload and reload: 100,000 × 16 KiB from random GPU slots to random pinned host slots,
/// checked on the CPU, and back into GPU slots that restore the source order, checked on the
/// GPU; with each method.
#[test]
#[ignore = "needs an NVIDIA GPU: run the GPU suite"]
fn block_copies_gpu_to_pinned_host_and_back_100k_x_16k() {
    let c = cuda();
    let g = ctx(&c, 0);
    let s = Stream::new(&g).unwrap();
    let mut copier = BlockCopier::new(&g);
    let (n, block) = (100_000u32, 16u64 << 10);
    let len = n as usize * block as usize;
    let src = DeviceBuffer::new(&g, len).unwrap();
    s.fill_pattern(&src, 0, len, SEED, 0).unwrap();
    let mut host = PinnedHostBuffer::new(&g, len).unwrap();
    let back = DeviceBuffer::new(&g, len).unwrap();
    let list = slot_list(
        host_addr(&host),
        &pattern::shuffled(n, 12),
        src.device_ptr(),
        &pattern::shuffled(n, 11),
        block,
    );
    let undo = undo_list(&list, src.device_ptr(), back.device_ptr());
    for m in block_methods(&c, &copier) {
        host.as_mut_slice().unwrap().fill(0);
        s.memset(&back, 0, len, 0).unwrap();
        let r = copier
            .copy(
                &s,
                &[BlockRegion::host_mut(&mut host)],
                &[BlockRegion::device(&src)],
                &list,
                m,
            )
            .unwrap();
        assert_eq!(
            (r.method, r.descriptors, r.bytes),
            (m, n as usize, len as u64)
        );
        assert!(
            matches!(host.as_slice(), Err(CudaError::BufferBusy)),
            "{m}: host destination readable before synchronize"
        );
        s.synchronize().unwrap();
        let (bad, first) = pattern::check_copies(
            host.as_slice().unwrap(),
            host_addr(&host),
            &list,
            src.device_ptr(),
            SEED,
        );
        assert_eq!((bad, first), (0, None), "{m}: GPU -> host blocks");
        let r = copier
            .copy(
                &s,
                &[BlockRegion::device(&back)],
                &[BlockRegion::host(&host)],
                &undo,
                m,
            )
            .unwrap();
        let v = s.verify_pattern(&back, 0, len, SEED, 0).unwrap();
        assert!(v.is_ok(), "{m}: host -> GPU blocks: {v:?}");
        eprintln!("{m}: 100,000 x 16 KiB GPU -> host -> GPU exact ({r:?})");
    }
}

/// 40,000 × 64 KiB within one GPU, random to random (checked on the CPU), then back into the
/// source order (checked on the GPU), with each method.
#[test]
#[ignore = "needs an NVIDIA GPU: run the GPU suite"]
fn block_copies_within_one_gpu_40k_x_64k() {
    let c = cuda();
    let g = ctx(&c, 0);
    device_round_trip(&c, &g, 40_000, 64 << 10, "within GPU 0");
}

/// `n` blocks of `block` bytes from random slots of a pattern-filled buffer on GPU 0 to random
/// slots of a buffer on `far`'s GPU (checked on the CPU), then back into the source order on
/// GPU 0 (checked on the GPU), with each method and the copier on GPU 0.
fn device_round_trip(c: &Cuda, far: &Context, n: u32, block: u64, what: &str) {
    let g = ctx(c, 0);
    let s = Stream::new(&g).unwrap();
    let mut copier = BlockCopier::new(&g);
    let len = n as usize * block as usize;
    let src = DeviceBuffer::new(&g, len).unwrap();
    let mid = DeviceBuffer::new(far, len).unwrap();
    let back = DeviceBuffer::new(&g, len).unwrap();
    s.fill_pattern(&src, 0, len, SEED, 0).unwrap();
    let list = slot_list(
        mid.device_ptr(),
        &pattern::shuffled(n, 22),
        src.device_ptr(),
        &pattern::shuffled(n, 21),
        block,
    );
    let undo = undo_list(&list, src.device_ptr(), back.device_ptr());
    let mut image = vec![0u8; len];
    for m in block_methods(c, &copier) {
        s.memset(&back, 0, len, 0).unwrap();
        let zero = Stream::new(far).unwrap();
        zero.memset(&mid, 0, len, 0).unwrap();
        zero.synchronize().unwrap();
        let r = copier
            .copy(
                &s,
                &[BlockRegion::device(&mid)],
                &[BlockRegion::device(&src)],
                &list,
                m,
            )
            .unwrap();
        s.synchronize().unwrap();
        zero.read_into_slice(&mut image, &mid, 0).unwrap();
        let (bad, first) =
            pattern::check_copies(&image, mid.device_ptr(), &list, src.device_ptr(), SEED);
        assert_eq!((bad, first), (0, None), "{m} {what}: random -> random");
        copier
            .copy(
                &s,
                &[BlockRegion::device(&back)],
                &[BlockRegion::device(&mid)],
                &undo,
                m,
            )
            .unwrap();
        let v = s.verify_pattern(&back, 0, len, SEED, 0).unwrap();
        assert!(v.is_ok(), "{m} {what}: back to source order: {v:?}");
        eprintln!("{m}: {n} x {block} B {what} and back exact ({r:?})");
    }
}

/// Deterministic numbers for layouts (splitmix64 of a counter).
struct Rng(u64, u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.1 += 1;
        pattern::word(self.0, self.1) % n
    }
}

/// Descriptors of any length (1 byte to 70,000) at any offset, with every relative alignment,
/// some continuing their predecessor on both sides (coalesced), between `dst_len` and
/// `src_len` byte regions at the given addresses. Destinations never overlap.
fn ragged_list(seed: u64, dst: u64, dst_len: u64, src: u64, src_len: u64) -> Vec<BlockCopy> {
    let mut r = Rng(seed, 0);
    let mut out: Vec<BlockCopy> = Vec::new();
    let mut cursor = r.below(64);
    loop {
        let len = match r.below(8) {
            0 => [1u64, 2, 3, 15, 16, 17, 31, 4095, 4096, 4097][r.below(10) as usize],
            1 => 65536,
            _ => 1 + r.below(70_000),
        };
        if cursor + len > dst_len {
            break;
        }
        let prev = out.last().copied();
        let src_off = match prev {
            // Continue the previous descriptor on both sides: merged by coalescing.
            Some(p)
                if r.below(6) == 0
                    && p.dst + p.len == dst + cursor
                    && p.src + p.len - src + len <= src_len =>
            {
                p.src + p.len - src
            }
            _ => r.below(src_len - len + 1),
        };
        out.push(BlockCopy::new(dst + cursor, src + src_off, len));
        cursor += len + if r.below(4) == 0 { 0 } else { r.below(40) };
    }
    out
}

/// What a region of `len` bytes filled with `fill` holds after `list` copied pattern bytes into
/// it from a source region filled with the pattern from position 0.
fn expected_image(len: usize, fill: u8, base: u64, list: &[BlockCopy], src_base: u64) -> Vec<u8> {
    let mut img = vec![fill; len];
    for c in list {
        let at = (c.dst - base) as usize;
        pattern::fill(&mut img[at..at + c.len as usize], SEED, c.src - src_base);
    }
    img
}

/// Unaligned sizes and offsets, device → device, device → host and host → device, each method:
/// the whole destination region is compared byte for byte with the expected image, so bytes
/// outside the descriptors must be untouched too.
#[test]
#[ignore = "needs an NVIDIA GPU: run the GPU suite"]
fn block_copies_with_unaligned_sizes_and_offsets() {
    let c = cuda();
    let g = ctx(&c, 0);
    let s = Stream::new(&g).unwrap();
    let mut copier = BlockCopier::new(&g);
    let len = (48 << 20) + 13;
    let dsrc = DeviceBuffer::new(&g, len).unwrap();
    s.fill_pattern(&dsrc, 0, len, SEED, 0).unwrap();
    let mut hsrc = PinnedHostBuffer::new(&g, len).unwrap();
    pattern::fill(hsrc.as_mut_slice().unwrap(), SEED, 0);
    let ddst = DeviceBuffer::new(&g, len).unwrap();
    let mut hdst = PinnedHostBuffer::new(&g, len).unwrap();
    let mut got = vec![0u8; len];
    // Device regions start 256-byte aligned; these offsets make every relative alignment occur.
    for m in block_methods(&c, &copier) {
        for (k, kind) in ["device -> device", "device -> host", "host -> device"]
            .iter()
            .enumerate()
        {
            let (dst_base, src_base) = match k {
                0 => (ddst.device_ptr(), dsrc.device_ptr()),
                1 => (host_addr(&hdst), dsrc.device_ptr()),
                _ => (ddst.device_ptr(), host_addr(&hsrc)),
            };
            let list = ragged_list(100 + k as u64, dst_base, len as u64, src_base, len as u64);
            let mut merged = Vec::new();
            gdpath_cuda::blocks::coalesce(&list, &mut merged);
            assert!(merged.len() < list.len(), "the list exercises coalescing");
            let expect = expected_image(len, 0xa5, dst_base, &list, src_base);
            let r = match k {
                0 => {
                    s.memset(&ddst, 0, len, 0xa5).unwrap();
                    copier.copy(
                        &s,
                        &[BlockRegion::device(&ddst)],
                        &[BlockRegion::device(&dsrc)],
                        &list,
                        m,
                    )
                }
                1 => {
                    hdst.as_mut_slice().unwrap().fill(0xa5);
                    copier.copy(
                        &s,
                        &[BlockRegion::host_mut(&mut hdst)],
                        &[BlockRegion::device(&dsrc)],
                        &list,
                        m,
                    )
                }
                _ => {
                    s.memset(&ddst, 0, len, 0xa5).unwrap();
                    copier.copy(
                        &s,
                        &[BlockRegion::device(&ddst)],
                        &[BlockRegion::host(&hsrc)],
                        &list,
                        m,
                    )
                }
            }
            .unwrap();
            assert_eq!(r.coalesced, merged.len());
            s.synchronize().unwrap();
            if k == 1 {
                got.copy_from_slice(hdst.as_slice().unwrap());
            } else {
                s.read_into_slice(&mut got, &ddst, 0).unwrap();
            }
            let wrong = got.iter().zip(&expect).position(|(a, b)| a != b);
            assert_eq!(wrong, None, "{m} {kind}: first wrong byte");
            eprintln!(
                "{m} {kind}: {} descriptors ({} after coalescing, {} bytes) exact",
                list.len(),
                r.coalesced,
                r.bytes
            );
        }
    }
}

/// GPU 0 → GPU 1 (skipped with one GPU): random layout there, checked, then back into the
/// source order on GPU 0, each method, with the copier on GPU 0 writing and reading peer memory.
#[test]
#[ignore = "needs an NVIDIA GPU: run the GPU suite"]
fn block_copies_gpu0_to_gpu1() {
    let c = cuda();
    let Some((_, g1)) = two(&c) else { return };
    device_round_trip(&c, &g1, 40_000, 64 << 10, "GPU 0 -> GPU 1");
}

/// Lists the copier must refuse with a typed error, before anything moves.
#[test]
#[ignore = "needs an NVIDIA GPU: run the GPU suite"]
fn block_copy_refuses_bad_lists_before_the_driver() {
    let c = cuda();
    let g = ctx(&c, 0);
    let s = Stream::new(&g).unwrap();
    let mut copier = BlockCopier::new(&g);
    let a = DeviceBuffer::new(&g, 1 << 20).unwrap();
    let b = DeviceBuffer::new(&g, 1 << 20).unwrap();
    let h = PinnedHostBuffer::new(&g, 1 << 20).unwrap();
    s.memset(&b, 0, 1 << 20, 0x3c).unwrap();
    let (pa, pb) = (a.device_ptr(), b.device_ptr());
    let list = |v: &[(u64, u64, u64)]| -> Vec<BlockCopy> {
        v.iter().map(|&(d, s, l)| BlockCopy::new(d, s, l)).collect()
    };
    for m in BlockMethod::ALL {
        let dst = [BlockRegion::device(&b)];
        let srcs = [BlockRegion::device(&a)];
        let refuse = |r: Result<_, CudaError>, want: BlockListError| match r {
            Err(CudaError::BlockList(e)) => assert_eq!(e, want, "{m}"),
            other => panic!("{m}: expected {want:?}, got {other:?}"),
        };
        refuse(copier.copy(&s, &dst, &srcs, &[], m), BlockListError::Empty);
        refuse(
            copier.copy(&s, &dst, &srcs, &list(&[(pb, pa, 16), (pb + 16, pa, 0)]), m),
            BlockListError::ZeroLength { index: 1 },
        );
        refuse(
            copier.copy(&s, &dst, &srcs, &list(&[(pb + (1 << 20) - 8, pa, 16)]), m),
            BlockListError::OutsideRegions {
                index: 0,
                side: gdpath_cuda::blocks::Side::Dst,
                addr: pb + (1 << 20) - 8,
                end: pb + (1 << 20) + 8,
            },
        );
        refuse(
            copier.copy(
                &s,
                &[BlockRegion::host(&h)],
                &srcs,
                &list(&[(host_addr(&h), pa, 16)]),
                m,
            ),
            BlockListError::ReadOnlyDestination { index: 0 },
        );
        refuse(
            copier.copy(
                &s,
                &[BlockRegion::device(&b), BlockRegion::device(&b)],
                &srcs,
                &list(&[(pb, pa, 16)]),
                m,
            ),
            BlockListError::OverlappingRegions {
                side: gdpath_cuda::blocks::Side::Dst,
                a: 0,
                b: 1,
            },
        );
        // SAFETY: refused before any address is used.
        let r = unsafe {
            copier.copy_unchecked(
                &s,
                &list(&[(pb, pa, 1), (u64::MAX - 1, pa, 4)]),
                MemLocation::Device(0),
                MemLocation::Device(0),
                m,
            )
        };
        refuse(
            r,
            BlockListError::Overflow {
                index: 1,
                side: gdpath_cuda::blocks::Side::Dst,
                addr: u64::MAX - 1,
                len: 4,
            },
        );
    }
    let mut back = vec![0u8; 1 << 20];
    s.read_into_slice(&mut back, &b, 0).unwrap();
    assert!(back.iter().all(|&x| x == 0x3c), "nothing was written");
    if let Some((_, g1)) = two(&c) {
        let s1 = Stream::new(&g1).unwrap();
        let e = copier
            .copy(
                &s1,
                &[BlockRegion::device(&b)],
                &[BlockRegion::device(&a)],
                &list(&[(pb, pa, 16)]),
                BlockMethod::Kernel,
            )
            .unwrap_err();
        assert!(matches!(e, CudaError::InvalidArgument(_)), "{e}");
    }
}

const IPC_CHILD: &str = "GDPATH_KV_IPC_CHILD";
const IPC_TEST: &str = "block_copy_ipc_between_two_processes_on_one_gpu";

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap())
        .collect()
}

/// Two processes on one GPU, as vLLM's disaggregated prefill and decode: the parent exports a
/// filled buffer and an empty one; the child (this test binary again, with GDPATH_KV_IPC_CHILD
/// set) opens both from handles sent through a pipe, gathers the filled one's random blocks
/// into its own memory (checked there), and scatters them into the parent's empty buffer in the
/// source order, half with each method; the parent checks that buffer on the GPU.
#[test]
#[ignore = "needs an NVIDIA GPU: run the GPU suite"]
fn block_copy_ipc_between_two_processes_on_one_gpu() {
    if std::env::var_os(IPC_CHILD).is_some() {
        return ipc_child();
    }
    use std::io::Write;
    let c = cuda();
    let g = ctx(&c, 0);
    let s = Stream::new(&g).unwrap();
    let len = 4_000usize * (64 << 10);
    let exported = DeviceBuffer::new(&g, len).unwrap();
    let inbox = DeviceBuffer::new(&g, len).unwrap();
    s.fill_pattern(&exported, 0, len, SEED, 0).unwrap();
    s.memset(&inbox, 0, len, 0).unwrap();
    s.synchronize().unwrap();
    let (he, hi) = (
        IpcMemHandle::export(&exported).unwrap(),
        IpcMemHandle::export(&inbox).unwrap(),
    );
    // This process cannot open its own handles.
    assert!(
        matches!(he.open(&g), Err(CudaError::Driver { .. })),
        "own handle opened"
    );
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            IPC_TEST,
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(IPC_CHILD, "1")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    writeln!(
        child.stdin.take().unwrap(),
        "{} {} {len}",
        hex(&he.to_bytes()),
        hex(&hi.to_bytes())
    )
    .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(180);
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if std::time::Instant::now() > deadline {
            child.kill().unwrap();
            panic!("IPC child still running after 180 s: killed");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let out = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("--- IPC child ---\n{text}--- end of child ---");
    assert!(status.success(), "IPC child failed: {status}");
    assert!(text.contains("IPC child done"), "the child ran its part");
    let v = s.verify_pattern(&inbox, 0, len, SEED, 0).unwrap();
    assert!(
        v.is_ok(),
        "blocks the child wrote into this process's memory: {v:?}"
    );
}

fn ipc_child() {
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    let parts: Vec<&str> = line.split_whitespace().collect();
    let len: usize = parts[2].parse().unwrap();
    let c = cuda();
    let g = ctx(&c, 0);
    let s = Stream::new(&g).unwrap();
    let exported = IpcMemHandle::from_slice(&unhex(parts[0]))
        .unwrap()
        .open(&g)
        .unwrap();
    let inbox = IpcMemHandle::from_slice(&unhex(parts[1]))
        .unwrap()
        .open(&g)
        .unwrap();
    assert!(exported.is_ipc_mapping() && exported.len() >= len && inbox.len() >= len);
    let mut copier = BlockCopier::new(&g);
    let methods = block_methods(&c, &copier);
    let (n, block) = ((len / (64 << 10)) as u32, 64u64 << 10);
    let local = DeviceBuffer::new(&g, len).unwrap();
    s.memset(&local, 0, len, 0).unwrap();
    let gather = slot_list(
        local.device_ptr(),
        &pattern::shuffled(n, 42),
        exported.device_ptr(),
        &pattern::shuffled(n, 41),
        block,
    );
    let scatter = undo_list(&gather, exported.device_ptr(), inbox.device_ptr());
    let half = gather.len() / 2;
    for (k, m) in methods.iter().enumerate() {
        // With two methods, each moves half of the blocks; with one, it moves all.
        let range = match (methods.len(), k) {
            (1, _) => 0..gather.len(),
            (_, 0) => 0..half,
            _ => half..gather.len(),
        };
        let r = copier
            .copy(
                &s,
                &[BlockRegion::device(&local)],
                &[BlockRegion::device(&exported)],
                &gather[range.clone()],
                *m,
            )
            .unwrap();
        eprintln!(
            "child {m}: gathered {} blocks from the parent ({r:?})",
            range.len()
        );
        copier
            .copy(
                &s,
                &[BlockRegion::device(&inbox)],
                &[BlockRegion::device(&local)],
                &scatter[range.clone()],
                *m,
            )
            .unwrap();
    }
    let mut image = vec![0u8; len];
    s.read_into_slice(&mut image, &local, 0).unwrap();
    let (bad, first) = pattern::check_copies(
        &image,
        local.device_ptr(),
        &gather,
        exported.device_ptr(),
        SEED,
    );
    assert_eq!(
        (bad, first),
        (0, None),
        "child: blocks gathered from the parent"
    );
    s.synchronize().unwrap();
    drop((exported, inbox));
    eprintln!(
        "IPC child done: {} blocks each way over IPC mappings",
        gather.len()
    );
}
