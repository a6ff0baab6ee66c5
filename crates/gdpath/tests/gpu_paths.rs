//! GPU suite: every GPU path of the engine, byte-exact. Needs an NVIDIA GPU; run with
//! `scripts/gpu-suite.sh` (which also runs it with one GPU visible). Without a GPU these tests
//! are ignored; run explicitly (`--ignored`) on a machine without one they fail, saying so.
//!
//! Data: the pattern of `gdpath_cuda::pattern` (byte at stream position p is a function of the
//! seed and p), so a copy at any offset is checked byte for byte, on the GPU with the verify
//! kernel or on the host after copy-back.

use gdpath::backend::cuda::{gpu_buffer, is_pinned};
use gdpath::finding::ids;
use gdpath::{
    Agent, AgentConfig, DataPath, Error, GpuConfig, GpuPointer, HostBuffer, Memory, Region,
    TransferRequest,
};
use gdpath_cuda::{pattern, Context, Cuda, DeviceBuffer, Stream};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

fn agent_with(cfg: GpuConfig) -> Agent {
    let agent = Agent::new(AgentConfig {
        gpu: cfg,
        ..AgentConfig::default()
    })
    .expect("agent");
    assert!(
        agent.backends().iter().any(|b| b.name == "cuda"),
        "no cuda backend: this test needs an NVIDIA GPU and driver (run on the GPU machine)"
    );
    agent
}

fn agent() -> Agent {
    agent_with(GpuConfig::default())
}

fn gpu_count() -> u32 {
    Cuda::load()
        .and_then(|c| c.device_count())
        .expect("CUDA driver")
}

/// A host region of `len` bytes holding the pattern (positions 0..len).
fn host_with_pattern(agent: &Agent, len: u64, seed: u64, pinned: bool) -> Region {
    let mut b = HostBuffer::zeroed(len as usize);
    pattern::fill(b.as_mut_slice(), seed, 0);
    let mem = if pinned {
        Memory::pinned(b)
    } else {
        Memory::host(b)
    };
    let r = agent.register(mem).expect("register host");
    assert_eq!(is_pinned(&r), pinned && len > 0);
    r
}

/// Checks `len` bytes of GPU region `r` at `off` against pattern positions `pos..` on the GPU.
fn verify_gpu(r: &Region, off: u64, len: u64, seed: u64, pos: u64) {
    let buf = gpu_buffer(r).expect("GPU region");
    let s = Stream::new(buf.context()).unwrap();
    let v = s
        .verify_pattern(buf, off as usize, len as usize, seed, pos)
        .unwrap();
    assert!(
        v.is_ok(),
        "GPU {} bytes {off}..+{len}: {} mismatches, first at {:?}",
        buf.ordinal(),
        v.mismatches,
        v.first_mismatch
    );
}

fn fill_gpu(r: &Region, off: u64, len: u64, seed: u64, pos: u64) {
    let buf = gpu_buffer(r).expect("GPU region");
    let s = Stream::new(buf.context()).unwrap();
    s.fill_pattern(buf, off as usize, len as usize, seed, pos)
        .unwrap();
    s.synchronize().unwrap();
}

fn verify_host(r: &Region, off: u64, len: u64, seed: u64, pos: u64) {
    let view = r.host_view().unwrap();
    let v = pattern::check(&view[off as usize..(off + len) as usize], seed, pos);
    assert!(
        v.is_ok(),
        "host bytes {off}..+{len}: {} mismatches, first at {:?}",
        v.mismatches,
        v.first_mismatch
    );
}

/// H2D then D2H of `len` bytes with offsets on every side, checking the path taken.
fn round_trip(agent: &Agent, ordinal: u32, len: u64, pinned: bool, offs: (u64, u64, u64)) {
    let (hoff, goff, back_off) = offs;
    let seed = 0x5eed ^ len ^ (hoff << 20);
    let host = host_with_pattern(agent, hoff + len + 5, seed, pinned);
    let gpu = agent
        .register(Memory::Gpu {
            ordinal,
            len: goff + len + 7,
        })
        .unwrap();
    let rep = agent
        .post(TransferRequest::write(
            vec![host.desc(hoff, len)],
            vec![gpu.desc(goff, len)],
        ))
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(rep.bytes, len);
    assert_eq!(rep.pairs[0].path, DataPath::HostToDevice { pinned });
    assert_eq!(
        rep.pairs[0].finding.as_ref().map(|f| f.as_str()),
        (!pinned).then_some(ids::HOST_PAGEABLE)
    );
    verify_gpu(&gpu, goff, len, seed, hoff);

    // Back into a fresh host region of the same kind, at another offset (a Read: target → local).
    let back = {
        let b = HostBuffer::zeroed((back_off + len) as usize);
        agent
            .register(if pinned {
                Memory::pinned(b)
            } else {
                Memory::host(b)
            })
            .unwrap()
    };
    let rep = agent
        .post(TransferRequest::read(
            vec![back.desc(back_off, len)],
            vec![gpu.desc(goff, len)],
        ))
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(rep.pairs[0].path, DataPath::DeviceToHost { pinned });
    verify_host(&back, back_off, len, seed, hoff);
}

#[test]
#[ignore = "needs an NVIDIA GPU: run the GPU suite"]
fn host_gpu_edges_pinned_and_pageable_every_gpu() {
    let agent = agent();
    for ordinal in 0..gpu_count() {
        for pinned in [true, false] {
            for len in [
                1,
                4095,
                4096,
                4097,
                MIB + 3,
                4 * MIB,
                9 * MIB + 1,
                64 * MIB + 1,
            ] {
                round_trip(&agent, ordinal, len, pinned, (0, 0, 0));
                round_trip(&agent, ordinal, len, pinned, (1, 4093, 4099));
            }
        }
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU: run the GPU suite"]
fn host_gpu_one_gib_plus_one() {
    let agent = agent();
    for pinned in [true, false] {
        round_trip(&agent, 0, GIB + 1, pinned, (3, 1, 5));
    }
}

/// Every ordered GPU pair: the P2P path the driver facts call for, and the staged path with P2P
/// forced off, both byte-exact at edge sizes and offsets.
#[test]
#[ignore = "needs an NVIDIA GPU: run the GPU suite"]
fn gpu_pairs_p2p_and_staged() {
    let n = gpu_count();
    if n < 2 {
        eprintln!("SKIPPED gpu_pairs_p2p_and_staged: {n} GPU visible, needs 2");
        return;
    }
    let facts = gdpath_cuda::gather_facts().expect("driver facts");
    let cuda = Cuda::load().unwrap();
    for p2p in [true, false] {
        let agent = agent_with(GpuConfig {
            p2p,
            ..GpuConfig::default()
        });
        for a in 0..n {
            for b in 0..n {
                if a == b {
                    continue;
                }
                let possible = {
                    let (da, db) = (cuda.device(a).unwrap(), cuda.device(b).unwrap());
                    da.can_access_peer(&db).unwrap() && db.can_access_peer(&da).unwrap()
                };
                let (want, finding) = match (p2p, possible) {
                    (true, true) if facts.nvlink_count(a, b) > 0 => (DataPath::P2pNvlink, None),
                    (true, true) => (DataPath::P2pPcie, None),
                    (true, false) => (DataPath::Staged, Some(ids::P2P_UNSUPPORTED)),
                    (false, _) => (DataPath::Staged, Some(ids::P2P_DISABLED)),
                };
                for len in [1, 4095, 4097, 4 * MIB, 4 * MIB + 1, 64 * MIB + 3, GIB + 1] {
                    let (so, dof) = (len % 13, len % 7 + 1);
                    let seed = len ^ u64::from(a) << 40 ^ u64::from(b) << 48;
                    let src = agent
                        .register(Memory::Gpu {
                            ordinal: a,
                            len: so + len,
                        })
                        .unwrap();
                    let dst = agent
                        .register(Memory::Gpu {
                            ordinal: b,
                            len: dof + len + 1,
                        })
                        .unwrap();
                    fill_gpu(&src, so, len, seed, 0);
                    let rep = agent
                        .post(TransferRequest::write(
                            vec![src.desc(so, len)],
                            vec![dst.desc(dof, len)],
                        ))
                        .unwrap()
                        .wait()
                        .unwrap();
                    assert_eq!(rep.pairs[0].path, want, "GPU{a}->GPU{b} p2p={p2p}");
                    assert_eq!(
                        rep.pairs[0].finding.as_ref().map(|f| f.as_str()),
                        finding,
                        "GPU{a}->GPU{b}"
                    );
                    verify_gpu(&dst, dof, len, seed, 0);
                }
            }
        }
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU: run the GPU suite"]
fn device_local_copy_with_offsets() {
    let agent = agent();
    let r = agent
        .register(Memory::Gpu {
            ordinal: 0,
            len: 8 * MIB,
        })
        .unwrap();
    fill_gpu(&r, 0, 3 * MIB + 1, 77, 0);
    let rep = agent
        .post(TransferRequest::write(
            vec![r.desc(0, 3 * MIB + 1)],
            vec![r.desc(4 * MIB + 5, 3 * MIB + 1)],
        ))
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(rep.pairs[0].path, DataPath::DeviceLocal);
    verify_gpu(&r, 4 * MIB + 5, 3 * MIB + 1, 77, 0);
}

/// GPU memory allocated outside gdpath, registered by device pointer + ordinal: copies reach it,
/// and dropping the region does not free it.
#[test]
#[ignore = "needs an NVIDIA GPU: run the GPU suite"]
fn external_device_pointer_is_used_and_not_freed() {
    let agent = agent();
    let ctx = Context::new(&Cuda::load().unwrap(), 0).unwrap();
    let ext = DeviceBuffer::new(&ctx, (2 * MIB) as usize).unwrap();
    // SAFETY: `ext` is 2 MiB of GPU 0 memory and outlives the region (dropped below first).
    let region = agent
        .register(Memory::GpuPointer(unsafe {
            GpuPointer::new(0, ext.device_ptr(), 2 * MIB)
        }))
        .unwrap();
    assert_eq!(region.len().unwrap(), 2 * MIB);
    let host = host_with_pattern(&agent, MIB, 9, false);
    agent
        .post(TransferRequest::write(
            vec![host.desc(0, MIB)],
            vec![region.desc(MIB, MIB)],
        ))
        .unwrap()
        .wait()
        .unwrap();
    drop(region);
    let s = Stream::new(&ctx).unwrap();
    let v = s
        .verify_pattern(&ext, MIB as usize, MIB as usize, 9, 0)
        .unwrap();
    assert!(v.is_ok(), "external memory after region drop: {v:?}");
    // Still allocated and usable: fill and check the whole buffer.
    s.fill_pattern(&ext, 0, (2 * MIB) as usize, 10, 0).unwrap();
    assert!(s
        .verify_pattern(&ext, 0, (2 * MIB) as usize, 10, 0)
        .unwrap()
        .is_ok());
    // Bad pointers are refused at registration.
    // SAFETY: never dereferenced: registration must refuse a null pointer.
    let e = agent
        .register(Memory::GpuPointer(unsafe { GpuPointer::new(0, 0, 16) }))
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::Cuda {
                source: gdpath_cuda::CudaError::InvalidArgument(_),
                ..
            }
        ),
        "{e}"
    );
}

#[test]
#[ignore = "needs an NVIDIA GPU: run the GPU suite"]
fn out_of_bounds_and_bad_memory_are_rejected() {
    let agent = agent();
    let n = gpu_count();
    let gpu = agent
        .register(Memory::Gpu {
            ordinal: 0,
            len: 4096,
        })
        .unwrap();
    let host = host_with_pattern(&agent, 8192, 1, true);
    for (off, len) in [(4095, 2), (0, 4097), (4096, 1), (u64::MAX, 2)] {
        let e = agent
            .post(TransferRequest::write(
                vec![host.desc(0, len.min(8192))],
                vec![gpu.desc(off, len.min(8192))],
            ))
            .unwrap_err();
        assert!(
            matches!(
                e,
                Error::OutOfBounds { .. } | Error::PairLengthMismatch { .. }
            ),
            "{off}+{len}: {e}"
        );
    }
    let e = agent
        .post(TransferRequest::write(
            vec![host.desc(4000, 200)],
            vec![gpu.desc(3990, 200)],
        ))
        .unwrap_err();
    assert!(matches!(e, Error::OutOfBounds { .. }), "{e}");
    // A GPU that does not exist, and an empty allocation.
    let e = agent
        .register(Memory::Gpu {
            ordinal: n + 3,
            len: 4096,
        })
        .unwrap_err();
    assert!(e.to_string().contains("GPU"), "{e}");
    assert!(agent.register(Memory::Gpu { ordinal: 0, len: 0 }).is_err());
}

/// A region cannot be freed under a transfer: deregistering fails with `RegionBusy` while the
/// pair is in flight, and dropping every handle leaves the memory alive until the copy is done.
#[test]
#[ignore = "needs an NVIDIA GPU: run the GPU suite"]
fn freeing_with_a_transfer_in_flight_is_an_error_or_deferred() {
    let agent = agent();
    let len = GIB;
    let host = host_with_pattern(&agent, len, 4, false);
    let gpu = agent.register(Memory::Gpu { ordinal: 0, len }).unwrap();
    let t = agent
        .post(TransferRequest::write(
            vec![host.desc(0, len)],
            vec![gpu.desc(0, len)],
        ))
        .unwrap();
    match agent.deregister(&gpu) {
        Err(Error::RegionBusy { .. }) => {}
        Err(e) => panic!("unexpected error {e}"),
        Ok(()) => assert!(
            t.poll().finished,
            "deregistered while the 1 GiB copy was still running"
        ),
    }
    let (gpu_keep, host_clone) = (gpu.clone(), host.clone());
    drop(gpu);
    drop(host_clone);
    // Taking the host buffer back must fail while the transfer holds the region.
    let host = match host.into_host_buffer() {
        Err((h, Error::RegionBusy { .. })) => h,
        Err((_, e)) => panic!("unexpected error {e}"),
        Ok(_) => panic!("took the host buffer back while a transfer held it"),
    };
    t.wait().unwrap();
    verify_gpu(&gpu_keep, 0, len, 4, 0);
    assert!(host.into_host_buffer().is_ok());
}

/// Several pairs in one request, mixed kinds, on whatever GPUs exist.
#[test]
#[ignore = "needs an NVIDIA GPU: run the GPU suite"]
fn many_pairs_in_one_request() {
    let agent = agent();
    let n = gpu_count();
    let host = host_with_pattern(&agent, 16 * MIB, 21, true);
    let gpus: Vec<Region> = (0..n)
        .map(|o| {
            agent
                .register(Memory::Gpu {
                    ordinal: o,
                    len: 16 * MIB,
                })
                .unwrap()
        })
        .collect();
    let (mut l, mut t) = (Vec::new(), Vec::new());
    for (i, g) in gpus.iter().enumerate() {
        for k in 0..4u64 {
            let off = k * 4 * MIB + i as u64;
            let len = 4 * MIB - 2 * i as u64 - 1;
            l.push(host.desc(off, len));
            t.push(g.desc(off, len));
        }
    }
    let rep = agent
        .post(TransferRequest::write(l.clone(), t.clone()))
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(rep.pairs.len(), 4 * n as usize);
    for (ld, td) in l.iter().zip(&t) {
        verify_gpu(&td.region, td.offset, td.len, 21, ld.offset);
    }
}
