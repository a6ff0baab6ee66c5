//! The GPU suite's block-list copies (`gdpath_cuda::blocks`) and CUDA IPC: byte-exact
//! results for KV-cache shapes with each method, unaligned lists, another process on the same
//! GPU, and a peer GPU where there is one. Part of the `gpu` test binary (see `../gpu.rs`).

use super::{ctx, cuda, two, SEED};
use gdpath_cuda::{
    pattern, BlockCopier, BlockCopy, BlockListError, BlockMethod, BlockRegion, Context, Cuda,
    CudaError, DeviceBuffer, IpcMemHandle, MemLocation, PinnedHost, PinnedHostBuffer, Stream,
};

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
/// The test as the harness names it (its module path within the `gpu` binary).
const IPC_TEST: &str = "blocks::block_copy_ipc_between_two_processes_on_one_gpu";

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
