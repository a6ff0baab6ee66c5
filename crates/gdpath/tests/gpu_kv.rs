//! GPU suite: block transfers (KV layouts, `gdpath::blocks`) through the `cuda` backend, byte
//! for byte: random layouts GPU ↔ pinned host (100,000 × 16 KiB) and within one GPU (40,000 ×
//! 64 KiB) with every method the backend can choose, layered layouts, single-byte blocks at odd
//! offsets, the pairs of one request batched into one list, GPU0 → GPU1 (skipped with the
//! reason on one GPU), and another process's GPU memory reached through CUDA IPC handed over by
//! the agent protocol on loopback (skipped with the reason when UCX has no CUDA support, which
//! exporting GPU memory needs). Needs an NVIDIA GPU: ignored otherwise; run with
//! `scripts/gpu-suite.sh`.
//!
//! Data: `gdpath_cuda::pattern` (byte at position p is a function of the seed and p); a
//! destination block `d` that received source block `s` holds the pattern of positions
//! `s × size ..`, checked on the host with `pattern::check_copies` (every core).

use gdpath::backend::cuda::gpu_buffer;
use gdpath::net::codec::WireKind;
use gdpath::net::Token;
use gdpath::{
    Agent, AgentConfig, BlockTransfer, CopyMethod, DataPath, HostBuffer, KvLayout, Memory, Region,
    TransferReport, TransferRequest,
};
use gdpath_cuda::{pattern, BlockCopy, Cuda, Stream};
use std::io::{BufRead, BufReader, Write};
use std::time::{Duration, Instant};

const SEED: u64 = 0x6770_755f_6b76; // "gpu_kv"

fn agent() -> Agent {
    let a = Agent::new(AgentConfig::default()).expect("agent");
    assert!(
        a.backends().iter().any(|b| b.name == "cuda"),
        "no cuda backend: this test needs an NVIDIA GPU and driver (run on the GPU machine)"
    );
    a
}

fn gpu_count() -> u32 {
    Cuda::load()
        .and_then(|c| c.device_count())
        .expect("CUDA driver")
}

fn gpu(a: &Agent, ordinal: u32, len: u64) -> Region {
    a.register(Memory::Gpu { ordinal, len })
        .expect("GPU memory")
}

fn pinned(a: &Agent, len: u64) -> Region {
    a.register(Memory::pinned(HostBuffer::zeroed(len as usize)))
        .expect("pinned host memory")
}

/// Fills GPU region `r` with the pattern (positions from 0), or zeroes it.
fn fill_gpu(r: &Region, len: u64, pattern_or_zero: bool) {
    let buf = gpu_buffer(r).expect("GPU region");
    let s = Stream::new(buf.context()).unwrap();
    if pattern_or_zero {
        s.fill_pattern(buf, 0, len as usize, SEED, 0).unwrap();
    } else {
        s.memset(buf, 0, len as usize, 0).unwrap();
    }
    s.synchronize().unwrap();
}

fn wait(t: gdpath::Transfer) -> TransferReport {
    t.wait_timeout(Duration::from_secs(120)).expect("transfer")
}

/// The bytes of `r` (GPU or host), on the host, through one contiguous engine copy.
fn read(a: &Agent, r: &Region, len: u64) -> Vec<u8> {
    if r.host_ptr().is_some() {
        return r.host_view().unwrap()[..len as usize].to_vec();
    }
    let h = pinned(a, len);
    wait(
        a.post(TransferRequest::write(
            vec![r.desc(0, len)],
            vec![h.desc(0, len)],
        ))
        .unwrap(),
    );
    let v = h.host_view().unwrap().to_vec();
    v
}

/// The expected copies of `ids` for a one-layer layout of `bs`-byte blocks.
fn copies(src: &[u32], dst: &[u32], bs: u64) -> Vec<BlockCopy> {
    src.iter()
        .zip(dst)
        .map(|(&s, &d)| BlockCopy::new(d as u64 * bs, s as u64 * bs, bs))
        .collect()
}

fn check(bytes: &[u8], expected: &[BlockCopy], what: &str) {
    let (bad, first) = pattern::check_copies(bytes, 0, expected, 0, SEED);
    assert_eq!(
        bad, 0,
        "{what}: {bad} blocks differ, first at list position {first:?}"
    );
}

/// Random blocks from `src` to `dst` (regions of `n × bs` bytes, the source holding the
/// pattern) with `method` (None: the backend's choice); checks the destination and returns
/// the method reported.
#[allow(clippy::too_many_arguments)]
fn random_blocks(
    a: &Agent,
    src: &Region,
    dst: &Region,
    n: u32,
    bs: u64,
    method: Option<CopyMethod>,
    clear: &dyn Fn(),
    what: &str,
) -> CopyMethod {
    clear();
    let l = KvLayout::new(bs, n as u64);
    let mut t = BlockTransfer::new(src, l, dst, l);
    t.method = method;
    let p = a.prepare_blocks(t).unwrap();
    assert!(p.is_block_list(), "{what}: a block list");
    assert_eq!(p.plan().backend, "cuda", "{what}");
    let (s, d) = (pattern::shuffled(n, 1), pattern::shuffled(n, 2));
    let t0 = Instant::now();
    let rep = wait(p.post(&s, &d).unwrap());
    let took = t0.elapsed();
    let b = rep.pairs[0].batch.expect("batch report");
    if let Some(m) = method {
        assert_eq!(b.method, m, "{what}: forced method");
    }
    assert_eq!(
        (b.descriptors, rep.bytes),
        (n as u64, n as u64 * bs),
        "{what}"
    );
    eprintln!(
        "{what}: {} on {}, {n} x {bs} B in {took:?} ({:.1} GB/s), posting {:.0} ns/descriptor",
        b.method,
        rep.pairs[0].path,
        rep.bytes as f64 / took.as_secs_f64() / 1e9,
        b.post_ns as f64 / n as f64
    );
    check(&read(a, dst, n as u64 * bs), &copies(&s, &d, bs), what);
    b.method
}

/// Every method, then the backend's choice (checked to be `auto`).
#[allow(clippy::too_many_arguments)]
fn every_method(
    a: &Agent,
    src: &Region,
    dst: &Region,
    n: u32,
    bs: u64,
    auto: CopyMethod,
    clear: &dyn Fn(),
    what: &str,
) {
    for m in CopyMethod::ALL {
        random_blocks(a, src, dst, n, bs, Some(m), clear, &format!("{what}, {m}"));
    }
    let chosen = random_blocks(a, src, dst, n, bs, None, clear, &format!("{what}, auto"));
    assert_eq!(chosen, auto, "{what}: the backend's choice");
}

#[test]
#[ignore = "needs an NVIDIA GPU: run the GPU suite"]
fn blocks_gpu_to_pinned_host_and_back_100k_x_16k_every_method() {
    let a = agent();
    let (n, bs) = (100_000u32, 16u64 << 10);
    let len = n as u64 * bs;
    let g = gpu(&a, 0, len);
    fill_gpu(&g, len, true);
    let h = pinned(&a, len);
    let clear_h = || h.host_view().unwrap().fill(0);
    every_method(
        &a,
        &g,
        &h,
        n,
        bs,
        CopyMethod::Kernel,
        &clear_h,
        "GPU -> pinned host",
    );
    // Back: the pattern into the host buffer, then host -> a second GPU region.
    pattern::fill(&mut h.host_view().unwrap(), SEED, 0);
    let g2 = gpu(&a, 0, len);
    let clear_g = || fill_gpu(&g2, len, false);
    every_method(
        &a,
        &h,
        &g2,
        n,
        bs,
        CopyMethod::Kernel,
        &clear_g,
        "pinned host -> GPU",
    );
}

/// 40,000 × 64 KiB random blocks from GPU 0 to GPU `to`, every method.
fn device_blocks(to: u32) {
    let a = agent();
    let (n, bs) = (40_000u32, 64u64 << 10);
    let len = n as u64 * bs;
    let (s, d) = (gpu(&a, 0, len), gpu(&a, to, len));
    fill_gpu(&s, len, true);
    let clear = || fill_gpu(&d, len, false);
    let what = format!("GPU 0 -> GPU {to}");
    every_method(&a, &s, &d, n, bs, CopyMethod::Kernel, &clear, &what);
}

#[test]
#[ignore = "needs an NVIDIA GPU: run the GPU suite"]
fn blocks_within_one_gpu_40k_x_64k_every_method() {
    device_blocks(0);
}

#[test]
#[ignore = "needs an NVIDIA GPU: run the GPU suite"]
fn blocks_gpu0_to_gpu1_40k_x_64k_every_method() {
    if gpu_count() < 2 {
        eprintln!("SKIP blocks_gpu0_to_gpu1: one GPU visible (this needs two)");
        return;
    }
    device_blocks(1);
}

#[test]
#[ignore = "needs an NVIDIA GPU: run the GPU suite"]
fn layered_gpu_cache_to_a_block_major_host_tier_and_back() {
    let a = agent();
    let (bs, n, layers) = (4096u64, 2048u64, 4u64);
    // GPU: [layers][2][blocks][bs]; host: [blocks][layers][2][bs], twice the blocks, at an
    // unaligned offset.
    let gl = KvLayout::new(bs, n)
        .kv(2, n * bs)
        .layers(layers, 2 * n * bs);
    let hl = KvLayout::new(bs, 2 * n)
        .offset(3)
        .block_stride(layers * 2 * bs)
        .layers(layers, 2 * bs)
        .kv(2, bs);
    let glen = layers * 2 * n * bs;
    let hlen = 3 + 2 * n * layers * 2 * bs;
    let g = gpu(&a, 0, glen);
    fill_gpu(&g, glen, true);
    let h = pinned(&a, hlen);
    let s: Vec<u32> = pattern::shuffled(n as u32, 3)[..1500].to_vec();
    let d: Vec<u32> = pattern::shuffled(2 * n as u32, 4)[..1500].to_vec();
    let rep = wait(
        a.transfer_blocks(BlockTransfer::new(&g, gl, &h, hl), &s, &d)
            .unwrap(),
    );
    let b = rep.pairs[0].batch.unwrap();
    assert_eq!(b.descriptors, 1500 * layers * 2);
    let at = |l: &KvLayout, layer: u64, k: u64, id: u64| {
        l.offset + layer * l.layer_stride + k * l.kv_stride + id * l.block_stride
    };
    let mut expected = Vec::new();
    for (&si, &di) in s.iter().zip(&d) {
        for layer in 0..layers {
            for k in 0..2 {
                expected.push(BlockCopy::new(
                    at(&hl, layer, k, di as u64),
                    at(&gl, layer, k, si as u64),
                    bs,
                ));
            }
        }
    }
    check(
        &h.host_view().unwrap(),
        &expected,
        "layered GPU -> host tier",
    );
    // Reload into a cleared GPU cache: the same slots come back.
    let g2 = gpu(&a, 0, glen);
    fill_gpu(&g2, glen, false);
    wait(
        a.transfer_blocks(BlockTransfer::new(&h, hl, &g2, gl), &d, &s)
            .unwrap(),
    );
    let back: Vec<BlockCopy> = expected
        .iter()
        .map(|c| BlockCopy::new(c.src, c.src, c.len))
        .collect();
    check(&read(&a, &g2, glen), &back, "host tier -> layered GPU");
}

#[test]
#[ignore = "needs an NVIDIA GPU: run the GPU suite"]
fn single_byte_blocks_at_odd_offsets_on_the_gpu() {
    let a = agent();
    let n = 50_000u32;
    let sl = KvLayout::new(1, n as u64).offset(1).block_stride(3);
    let dl = KvLayout::new(1, n as u64).offset(7).block_stride(5);
    let (slen, dlen) = (1 + 3 * n as u64, 7 + 5 * n as u64);
    let g = gpu(&a, 0, slen);
    fill_gpu(&g, slen, true);
    let h = pinned(&a, dlen);
    let (s, d) = (pattern::shuffled(n, 5), pattern::shuffled(n, 6));
    for m in [CopyMethod::Kernel, CopyMethod::DriverBatch] {
        h.host_view().unwrap().fill(0);
        let t = BlockTransfer::new(&g, sl, &h, dl).method(m);
        wait(a.transfer_blocks(t, &s, &d).unwrap());
        let expected: Vec<BlockCopy> = s
            .iter()
            .zip(&d)
            .map(|(&si, &di)| BlockCopy::new(7 + 5 * di as u64, 1 + 3 * si as u64, 1))
            .collect();
        check(
            &h.host_view().unwrap(),
            &expected,
            &format!("1-byte blocks, {m}"),
        );
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU: run the GPU suite"]
fn pairs_of_one_request_are_batched_and_report_the_method() {
    let a = agent();
    let len = 64u64 << 20;
    let g = gpu(&a, 0, len);
    fill_gpu(&g, len, true);
    let h = pinned(&a, len);
    // (pairs, bytes each, expected method): one pair alone (no batch report), many small
    // pairs (the kernel), a few large ones (the driver batch where the driver has it).
    let batch_ok = Cuda::load().unwrap().driver_version().unwrap() >= 12080;
    let cases: [(u64, u64, Option<CopyMethod>); 3] = [
        (1, 4 << 20, None),
        (2000, 4096, Some(CopyMethod::Kernel)),
        (
            8,
            4 << 20,
            Some(if batch_ok {
                CopyMethod::DriverBatch
            } else {
                CopyMethod::Kernel
            }),
        ),
    ];
    for (pairs, each, want) in cases {
        h.host_view().unwrap().fill(0);
        // Pair i: GPU bytes of slot i to host slot (pairs - 1 - i): no two pairs continue each
        // other, so nothing merges.
        let local: Vec<_> = (0..pairs).map(|i| g.desc(i * each, each)).collect();
        let target: Vec<_> = (0..pairs)
            .map(|i| h.desc((pairs - 1 - i) * each, each))
            .collect();
        let rep = wait(a.post(TransferRequest::write(local, target)).unwrap());
        assert_eq!(rep.pairs[0].path, DataPath::DeviceToHost { pinned: true });
        assert_eq!(
            rep.pairs[0].batch.map(|b| b.method),
            want,
            "{pairs} x {each}"
        );
        if let Some(b) = rep.pairs[0].batch {
            assert_eq!((b.descriptors, b.coalesced), (pairs, pairs));
            assert!(rep.pairs.iter().all(|p| p.batch == Some(b)));
        }
        let expected: Vec<BlockCopy> = (0..pairs)
            .map(|i| BlockCopy::new((pairs - 1 - i) * each, i * each, each))
            .collect();
        check(
            &h.host_view().unwrap(),
            &expected,
            &format!("{pairs} pairs"),
        );
    }
}

/// Set in the child: `LEN gpu` or `LEN host` (the memory it exports).
const IPC_CHILD: &str = "GDPATH_KV_AGENT_CHILD";
/// The tests' libtest names (an integration test at the crate root is named by its function),
/// which the child is re-run with under `--exact`; a child that matched no test ends at once
/// and the parent fails with "the child ended".
const IPC_TEST: &str = "blocks_to_and_from_another_process_gpu_memory_through_the_agent_protocol";
const SHM_TEST: &str = "blocks_to_and_from_another_process_host_memory_through_shared_memory";
/// Prefix of every message the child writes on stdout. It is searched for anywhere in a line:
/// libtest (single-threaded, `--nocapture`) writes `test NAME ... ` without a newline before
/// the test runs, so the child's first message shares that line.
const IPC_MARK: &str = "GDPATH-IPC ";
/// Longest wait for any one answer of the child, including its start (CUDA context, 2.6 GB of
/// GPU memory, UCX) and one check of its memory.
const IPC_STEP: Duration = Duration::from_secs(60);

/// The child process, killed (and reaped) on drop unless it has exited: a failing parent never
/// leaves it holding GPU memory.
struct ChildGuard(std::process::Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            eprintln!("parent: killing the child (pid {})", self.0.id());
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// The child's messages (the text after [`IPC_MARK`]), read by a thread so that every wait for
/// one has a deadline.
struct ChildLines(std::sync::mpsc::Receiver<String>);

impl ChildLines {
    fn start(out: std::process::ChildStdout) -> ChildLines {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                match line.find(IPC_MARK) {
                    Some(at) => {
                        if tx
                            .send(line[at + IPC_MARK.len()..].trim().to_owned())
                            .is_err()
                        {
                            break;
                        }
                    }
                    // libtest's own lines ("running 1 test", ...), shown for diagnosis.
                    None => eprintln!("child stdout: {line}"),
                }
            }
        });
        ChildLines(rx)
    }

    /// The next message, or a panic naming `step` when none comes within [`IPC_STEP`] or the
    /// child's stdout closed.
    fn next(&self, step: &str) -> String {
        match self.0.recv_timeout(IPC_STEP) {
            Ok(m) => m,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                panic!("no answer from the child within {IPC_STEP:?} while {step}")
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                panic!("the child ended (stdout closed) while {step}")
            }
        }
    }
}

/// Two processes on one GPU (vLLM's disaggregated prefill and decode): the child (this binary
/// again) serves an agent on loopback exporting a GPU region filled with the pattern; the
/// parent connects, gets the region's CUDA IPC handle in the metadata, reloads random blocks
/// from it (checked here), then writes random blocks of its own pattern into it with every
/// method (checked by the child in its own memory). Skipped, with the reason, when the child
/// cannot export GPU memory (a UCX without CUDA). Every wait is bounded ([`IPC_STEP`] per
/// answer of the child, 120 s per transfer) and each step is announced on stderr, so a stall
/// names its step; the child is killed when the parent fails.
#[test]
#[ignore = "needs an NVIDIA GPU and a CUDA-enabled UCX: run the GPU suite"]
fn blocks_to_and_from_another_process_gpu_memory_through_the_agent_protocol() {
    match std::env::var(IPC_CHILD) {
        Ok(v) => agent_child(&v),
        Err(_) => two_processes(IPC_TEST, false, 40_000, 64 << 10),
    }
}

/// KV offload to (and reload from) host memory of another process on the node (a CPU KV tier
/// served by its own process): as the test above, with the child exporting shared host memory
/// (`HostBuffer::try_shared`) that this process maps and page-locks, 100,000 × 16 KiB, every
/// method; the `cuda` backend moves the blocks straight into the child's pages.
#[test]
#[ignore = "needs an NVIDIA GPU: run the GPU suite"]
fn blocks_to_and_from_another_process_host_memory_through_shared_memory() {
    match std::env::var(IPC_CHILD) {
        Ok(v) => agent_child(&v),
        Err(_) => two_processes(SHM_TEST, true, 100_000, 16 << 10),
    }
}

/// The parent's side of the two-process tests: `n` blocks of `bs` bytes from and to the
/// child's exported region (host memory when `host`, else GPU memory).
fn two_processes(test: &str, host: bool, n: u32, bs: u64) {
    let len = n as u64 * bs;
    eprintln!("parent: starting the child");
    let mut child = ChildGuard(
        std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                test,
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(
                IPC_CHILD,
                format!("{len} {}", if host { "host" } else { "gpu" }),
            )
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut to_child = child.0.stdin.take().unwrap();
    let from_child = ChildLines::start(child.0.stdout.take().unwrap());
    let mut say = |msg: &str| {
        writeln!(to_child, "{msg}")
            .and_then(|()| to_child.flush())
            .unwrap_or_else(|e| panic!("cannot send {msg:?} to the child: {e}"));
    };
    eprintln!("parent: waiting for the child's port");
    let first = from_child.next("waiting for the child's port");
    if let Some(why) = first.strip_prefix("SKIP ") {
        eprintln!("SKIP {test}: the serving process cannot export its memory: {why}");
        return;
    }
    let port: u16 = first
        .strip_prefix("PORT ")
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("the child's first message is not PORT or SKIP: {first:?}"));
    let a = agent();
    eprintln!("parent: connecting to 127.0.0.1:{port}");
    let peer = a
        .connect(std::net::SocketAddr::from(([127, 0, 0, 1], port)))
        .unwrap();
    let info = peer
        .regions()
        .into_iter()
        .find(|r| matches!(r.kind, WireKind::Gpu(_)) != host)
        .expect("the child's region");
    let remote = a.register(peer.memory(info.id).unwrap()).unwrap();
    let l = KvLayout::new(bs, n as u64);
    // Reload: the child's blocks into this process's GPU memory.
    let mine = gpu(&a, 0, len);
    fill_gpu(&mine, len, false);
    eprintln!(
        "parent: preparing the reload (remote region {} as source)",
        info.id
    );
    let p = a
        .prepare_blocks(BlockTransfer::new(&remote, l, &mine, l))
        .unwrap();
    eprintln!("parent: reload planned: {:?}", p.plan());
    assert!(p.is_block_list(), "moved by the cuda backend, not UCX");
    assert_eq!(p.plan().backend, "cuda");
    let reload_path = if host {
        DataPath::HostToDevice { pinned: true }
    } else {
        DataPath::DeviceLocal
    };
    assert_eq!(p.plan().path, reload_path, "both processes on GPU 0");
    let (s, d) = (pattern::shuffled(n, 7), pattern::shuffled(n, 8));
    eprintln!("parent: posting the reload");
    let t0 = Instant::now();
    let t = p.post(&s, &d).unwrap();
    eprintln!("parent: waiting for the reload");
    let rep = wait(t);
    eprintln!(
        "reload from the other process: {} {:.1} GB/s",
        rep.pairs[0].batch.unwrap().method,
        len as f64 / t0.elapsed().as_secs_f64() / 1e9
    );
    eprintln!("parent: checking the reload");
    check(
        &read(&a, &mine, len),
        &copies(&s, &d, bs),
        "remote -> local",
    );
    // Offload: this process's pattern into the child's memory, every method; the child checks
    // (and clears its memory after each check).
    fill_gpu(&mine, len, true);
    eprintln!("parent: asking the child to clear its memory");
    say("CLEAR");
    assert_eq!(from_child.next("waiting for the child to clear"), "CLEARED");
    for m in CopyMethod::ALL {
        eprintln!("parent: preparing the offload, {m}");
        let p = a
            .prepare_blocks(BlockTransfer::new(&mine, l, &remote, l).method(m))
            .unwrap();
        eprintln!("parent: posting and waiting for the offload, {m}");
        let t0 = Instant::now();
        let rep = wait(p.post(&s, &d).unwrap());
        assert_eq!(rep.pairs[0].batch.unwrap().method, m);
        if host {
            assert_eq!(rep.pairs[0].path, DataPath::DeviceToHost { pinned: true });
        }
        eprintln!(
            "offload to the other process, {m}: {:.1} GB/s",
            len as f64 / t0.elapsed().as_secs_f64() / 1e9
        );
        say(&format!("CHECK {n} {bs}"));
        let step = format!("waiting for the child's check after {m}");
        assert_eq!(from_child.next(&step), "OK", "the child's check after {m}");
    }
    // The mapping closes with the region, before the child frees its memory.
    drop(p);
    drop(remote);
    drop(peer);
    eprintln!("parent: telling the child to exit");
    say("BYE");
    let deadline = Instant::now() + IPC_STEP;
    loop {
        match child.0.try_wait().unwrap() {
            Some(st) => {
                assert!(st.success(), "the child failed: {st}");
                break;
            }
            None => assert!(Instant::now() < deadline, "the child did not exit"),
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The serving side of the two-process tests (`spec`: `LEN gpu|host`): exports a region with
/// the pattern, announces its port (messages on stdout after [`IPC_MARK`], progress on stderr),
/// then checks its memory when asked (and clears it for the next round before answering).
/// Stdin closing (the parent gone) ends it.
fn agent_child(spec: &str) {
    let tell = |msg: &str| {
        // A newline first: libtest's "test NAME ... " is still open on this line.
        println!("\n{IPC_MARK}{msg}");
        let _ = std::io::stdout().flush();
    };
    let (len, host) = match spec.split_once(' ') {
        Some((l, kind)) => (l.parse::<u64>().unwrap(), kind == "host"),
        None => panic!("bad {IPC_CHILD}: {spec:?}"),
    };
    eprintln!("child: starting an agent, {len} bytes of {spec}");
    let a = agent();
    let r = if host {
        let buf = HostBuffer::try_shared(len as usize).expect("shared host memory");
        a.register(Memory::host(buf)).unwrap()
    } else {
        gpu(&a, 0, len)
    };
    let clear = |pattern_or_zero: bool| {
        if host {
            let mut v = r.host_view().unwrap();
            if pattern_or_zero {
                pattern::fill(&mut v, SEED, 0);
            } else {
                v.fill(0);
            }
        } else {
            fill_gpu(&r, len, pattern_or_zero);
        }
    };
    clear(true);
    eprintln!("child: serving on 127.0.0.1");
    let server = match a.serve(
        std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
        Token::none(),
    ) {
        Ok(s) => s,
        Err(e) => {
            tell(&format!("SKIP cannot serve over UCX: {e}"));
            return;
        }
    };
    eprintln!("child: exporting region {}", r.id());
    if let Err(e) = a.export(&r) {
        tell(&format!("SKIP {e}"));
        return;
    }
    eprintln!("child: serving on port {}", server.local_addr().port());
    tell(&format!("PORT {}", server.local_addr().port()));
    let mut line = String::new();
    let stdin = std::io::stdin();
    loop {
        line.clear();
        if stdin.lock().read_line(&mut line).unwrap_or(0) == 0 || line.starts_with("BYE") {
            eprintln!("child: asked to exit (or the parent is gone)");
            break;
        }
        if line.starts_with("CLEAR") {
            eprintln!("child: clearing");
            clear(false);
            tell("CLEARED");
            continue;
        }
        let v: Vec<u64> = line
            .split_whitespace()
            .skip(1)
            .map(|x| x.parse().unwrap())
            .collect();
        let (n, bs) = (v[0] as u32, v[1]);
        eprintln!("child: checking {n} blocks of {bs} bytes");
        let (s, d) = (pattern::shuffled(n, 7), pattern::shuffled(n, 8));
        let got = read(&a, &r, len);
        let (bad, _) = pattern::check_copies(&got, 0, &copies(&s, &d, bs), 0, SEED);
        // Cleared before answering: the parent's next round starts writing at the answer
        // (zeroing 1.6 GB of host memory takes long enough to overwrite some of it).
        clear(false);
        tell(&if bad == 0 {
            "OK".to_owned()
        } else {
            format!("BAD {bad}")
        });
    }
    server.stop(Duration::from_secs(5));
    eprintln!("child: stopped");
}
