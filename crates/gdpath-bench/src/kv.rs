//! `gdpath bench kv`: KV-cache block transfers through the engine ([`gdpath::blocks`]) beside
//! one contiguous copy of the same bytes between the same regions, in the same run (the ratio
//! of the medians is the figure: what splitting the bytes into blocks costs on this machine),
//! with the data verified and the CPU cost of posting.
//!
//! Method:
//! - two pools of `blocks` slots of `block_size` bytes (one layer, one K/V plane), the source
//!   filled with the position pattern (`gdpath_cuda::pattern`); layout `random`: block `i` goes
//!   from source slot `π₁(i)` to destination slot `π₂(i)`, two fixed permutations (nothing
//!   merges); `runs`: the same for runs of `run_len` consecutive blocks (what a sequence's
//!   blocks look like when allocated together), which merge into `blocks / run_len`
//!   descriptors;
//! - the block transfer is prepared once; each timed run is `post` → `wait`, wall clock, after
//!   one untimed warm-up; GB/s = bytes / time, 1e9 B/s; min / median / max over `runs`;
//! - the contiguous row: one descriptor pair of all the bytes between the same two regions,
//!   `Agent::post` → `wait`, timed the same way (the engine's one-copy path: one
//!   `cuMemcpy*Async`, or `memmove` for host ↔ host);
//! - posting cost per descriptor: (time in `post` + the backend's posting time on its worker
//!   thread, [`gdpath::BatchReport::post_ns`]) / descriptors, median over runs; a transfer
//!   already done when `post` returned (host ↔ host, small lists) was posted inside `post`,
//!   which then counts alone (and includes the copy);
//! - verification: the destination is cleared before the block runs; after them every
//!   destination block must hold its source block's pattern (checked on the host, every core);
//!   the contiguous row's destination must then hold the whole source pattern.
//!
//! Memory: `gpu:N` (device memory), `host` (pinned when the other side is a GPU, pageable for
//! host ↔ host: the CPU tier), `peer` (the largest GPU region a serving agent exports, reached
//! through CUDA IPC when it runs on this node; `gdpath serve --export gpu:0:SIZE`), `peer-host`
//! (the largest host region it exports, `--export host:SIZE`: shared memory that this process
//! maps when it runs on this node, UCX otherwise).

use crate::{BenchRow, Progress};
use gdpath::backend::cuda::gpu_buffer;
use gdpath::net::codec::WireKind;
use gdpath::net::{ConnectOptions, NetConfig, Peer, Token};
use gdpath::units::{format_size, gbps};
use gdpath::{
    Agent, AgentConfig, BlockTransfer, CopyMethod, DataPath, Error, HostBuffer, KvLayout, Memory,
    Region, Result, TransferRequest,
};
use gdpath_cuda::{pattern, BlockCopy, Stream};
use serde::Serialize;
use std::net::SocketAddr;
use std::time::Instant;

const SEED: u64 = 0x6b76_6265_6e63; // "kvbenc"

/// Where one side of the bench lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum KvMem {
    /// GPU memory of this CUDA ordinal.
    Gpu(u32),
    /// Host memory of this process (pinned when the other side is a GPU or a peer's GPU).
    Host,
    /// A serving agent's exported GPU region (destination only).
    Peer,
    /// A serving agent's exported host region (destination only).
    PeerHost,
}

impl KvMem {
    /// Parses `gpu:N`, `host`, `peer` or `peer-host`.
    pub fn parse(s: &str) -> std::result::Result<KvMem, String> {
        match s {
            "host" => Ok(KvMem::Host),
            "peer" => Ok(KvMem::Peer),
            "peer-host" => Ok(KvMem::PeerHost),
            _ => s
                .strip_prefix("gpu:")
                .and_then(|n| n.parse().ok())
                .map(KvMem::Gpu)
                .ok_or_else(|| {
                    format!("bad memory {s:?}: expected gpu:N, host, peer or peer-host")
                }),
        }
    }
}

impl std::fmt::Display for KvMem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KvMem::Gpu(n) => write!(f, "gpu:{n}"),
            KvMem::Host => f.write_str("host"),
            KvMem::Peer => f.write_str("peer"),
            KvMem::PeerHost => f.write_str("peer-host"),
        }
    }
}

/// How blocks are placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum KvPlacement {
    /// Every block to a random slot on both sides.
    Random,
    /// Runs of `run_len` consecutive blocks to random run-aligned places on both sides.
    Runs,
}

/// What to run.
#[derive(Debug, Clone)]
pub struct KvBenchConfig {
    /// Number of blocks moved per transfer (descriptors before merging).
    pub blocks: u64,
    /// Bytes per block (descriptor).
    pub block_size: u64,
    /// How blocks are placed on each side: random slots or runs of consecutive blocks.
    pub placement: KvPlacement,
    /// Blocks per run for [`KvPlacement::Runs`].
    pub run_len: u64,
    /// Where the blocks are read from.
    pub src: KvMem,
    /// Where the blocks are written to.
    pub dst: KvMem,
    /// Timed runs per row (after one warm-up).
    pub runs: usize,
    /// Force a method instead of the backend's choice.
    pub method: Option<CopyMethod>,
    /// The serving agent, for [`KvMem::Peer`].
    pub peer: Option<SocketAddr>,
    /// How to connect to it instead of a plain connect to `peer`
    /// ([`crate::net::Connector`]).
    pub connector: Option<crate::net::Connector>,
    /// Authentication token for [`KvMem::Peer`] and [`KvMem::PeerHost`].
    pub token: Token,
    /// Network settings for the connection to the peer.
    pub net: NetConfig,
}

/// The block row: the common row (`path` is the plan's path, `op` `blocks`) and what the block
/// transfer reported.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KvBenchRow {
    /// The common row; its `path` is the plan's path and its `op` is `blocks`.
    #[serde(flatten)]
    pub row: BenchRow,
    /// The method the backend used (`kernel`, `driver-batch`, `copies`; `pairs` where the
    /// list was expanded into descriptor pairs for a backend without block lists).
    pub method: String,
    /// Descriptors per transfer, and after merging.
    pub descriptors: u64,
    /// Descriptors per transfer after adjacent blocks were merged.
    pub coalesced: u64,
    /// Median GB/s of the blocks / median GB/s of the contiguous copy.
    pub ratio: f64,
    /// Median CPU time of posting, ns per descriptor: `post` plus the backend's posting.
    pub post_ns_per_descriptor: f64,
    /// Median time spent in `PreparedBlocks::post` alone, µs.
    pub post_call_us: f64,
    /// The backend moved the bytes inside `post` (host ↔ host: the CPU copies as it walks the
    /// list), so the posting figures include the copy.
    pub posted_inline: bool,
}

/// The outcome: the block row and the contiguous row of the same bytes.
#[derive(Debug, Clone, Serialize)]
pub struct KvBenchReport {
    /// The row of the block transfer.
    pub blocks: KvBenchRow,
    /// The row of one contiguous copy of the same bytes between the same memories, for comparison.
    pub contiguous: BenchRow,
    /// Notes (the peer used, ...).
    pub notes: Vec<String>,
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    crate::percentile_sorted(v, 50.0)
}

fn cuda_err(what: &str) -> impl Fn(gdpath_cuda::CudaError) -> Error + '_ {
    move |source| Error::Cuda {
        backend: "cuda",
        what: format!("bench kv {what}"),
        source,
    }
}

/// The slot ids of the two sides.
fn placement(cfg: &KvBenchConfig) -> Result<(Vec<u32>, Vec<u32>)> {
    let n = u32::try_from(cfg.blocks)
        .map_err(|_| Error::Config(format!("{} blocks: at most {}", cfg.blocks, u32::MAX)))?;
    match cfg.placement {
        KvPlacement::Random => Ok((pattern::shuffled(n, 1), pattern::shuffled(n, 2))),
        KvPlacement::Runs => {
            let r = cfg.run_len;
            if r == 0 || cfg.blocks % r != 0 {
                return Err(Error::Config(format!(
                    "--run-len {r} must divide --blocks {}",
                    cfg.blocks
                )));
            }
            let runs = (cfg.blocks / r) as u32;
            let (a, b) = (pattern::shuffled(runs, 1), pattern::shuffled(runs, 2));
            let ids = |p: &[u32]| -> Vec<u32> {
                (0..n)
                    .map(|i| p[(i as u64 / r) as usize] * r as u32 + (i as u64 % r) as u32)
                    .collect()
            };
            Ok((ids(&a), ids(&b)))
        }
    }
}

/// One side's region (and, for a peer, the connection keeping it).
struct Side {
    region: Region,
    mem: KvMem,
    _peer: Option<Peer>,
}

fn region(agent: &Agent, mem: KvMem, other: KvMem, len: u64, cfg: &KvBenchConfig) -> Result<Side> {
    let (region, peer) = match mem {
        KvMem::Gpu(ordinal) => (agent.register(Memory::Gpu { ordinal, len })?, None),
        KvMem::Host => {
            let buf = HostBuffer::try_zeroed(usize::try_from(len).unwrap_or(usize::MAX))?;
            let m = if matches!(other, KvMem::Gpu(_) | KvMem::Peer) {
                Memory::pinned(buf)
            } else {
                Memory::host(buf)
            };
            (agent.register(m)?, None)
        }
        KvMem::Peer | KvMem::PeerHost => {
            let addr = cfg.peer.ok_or_else(|| {
                Error::Config(format!(
                    "--dst {mem} needs --peer HOST:PORT of a `gdpath serve`"
                ))
            })?;
            agent.enable_net(cfg.net.clone())?;
            let peer = crate::net::connect(
                agent,
                addr,
                &ConnectOptions {
                    token: cfg.token.clone(),
                    ..ConnectOptions::default()
                },
                cfg.connector.as_ref(),
            )?;
            let gpu = mem == KvMem::Peer;
            let largest = peer
                .regions()
                .into_iter()
                .filter(|r| matches!(r.kind, WireKind::Gpu(_)) == gpu)
                .max_by_key(|r| r.len);
            let r = largest.clone().filter(|r| r.len >= len).ok_or_else(|| {
                let kind = if gpu { "GPU" } else { "host" };
                let offered = match &largest {
                    Some(r) => format!(
                        "its largest {kind} region has {}: at most {} blocks of {}",
                        format_size(r.len),
                        r.len / cfg.block_size,
                        format_size(cfg.block_size)
                    ),
                    None => format!("it exports no {kind} region"),
                };
                Error::Config(format!(
                    "peer {} has no {kind} region of {} ({offered}; start it with `gdpath serve \
                     --export {}:SIZE`)",
                    peer.name(),
                    format_size(len),
                    if gpu { "gpu:0" } else { "host" },
                ))
            })?;
            let region = agent.register(peer.memory_range(r.id, 0, len)?)?;
            (region, Some(peer))
        }
    };
    Ok(Side {
        region,
        mem,
        _peer: peer,
    })
}

/// A stream of the GPU holding `r`.
fn stream_of(r: &Region) -> Result<Stream> {
    let buf = gpu_buffer(r).ok_or_else(|| Error::Config("not GPU memory".into()))?;
    Stream::new(buf.context()).map_err(cuda_err("stream"))
}

/// Fills the source with the pattern from position 0.
fn fill(side: &Side, len: u64) -> Result<()> {
    match side.mem {
        KvMem::Host => {
            pattern::fill(&mut side.region.host_view()?, SEED, 0);
            Ok(())
        }
        KvMem::Gpu(_) => {
            let s = stream_of(&side.region)?;
            let buf = gpu_buffer(&side.region).expect("GPU region");
            s.fill_pattern(buf, 0, len as usize, SEED, 0)
                .and_then(|()| s.synchronize())
                .map_err(cuda_err("fill"))
        }
        KvMem::Peer | KvMem::PeerHost => Err(Error::Config(
            "a peer's region is a destination only".into(),
        )),
    }
}

/// Helpers that move whole regions through the engine (clearing and reading back a peer).
struct Scratch {
    agent: Agent,
    host: Region,
    gpu: Option<Region>,
}

impl Scratch {
    fn copy(&self, from: &Region, to: &Region, len: u64) -> Result<()> {
        // A peer's region is only ever a request's target: out of it is a read into `to`.
        let req = if from.kind().class() == gdpath::MemoryClass::Remote {
            TransferRequest::read(vec![to.desc(0, len)], vec![from.desc(0, len)])
        } else {
            TransferRequest::write(vec![from.desc(0, len)], vec![to.desc(0, len)])
        };
        self.agent.post(req)?.wait().map_err(|e| e.error)?;
        Ok(())
    }

    /// Zeroes `side`'s first `len` bytes.
    fn clear(&self, side: &Side, len: u64) -> Result<()> {
        match side.mem {
            KvMem::Host => {
                side.region.host_view()?.fill(0);
                Ok(())
            }
            KvMem::Gpu(_) => {
                let s = stream_of(&side.region)?;
                s.memset(gpu_buffer(&side.region).expect("GPU"), 0, len as usize, 0)
                    .and_then(|()| s.synchronize())
                    .map_err(cuda_err("clear"))
            }
            KvMem::Peer => {
                let z = self.gpu.as_ref().expect("scratch GPU region for a peer");
                let s = stream_of(z)?;
                s.memset(gpu_buffer(z).expect("GPU"), 0, len as usize, 0)
                    .and_then(|()| s.synchronize())
                    .map_err(cuda_err("clear"))?;
                self.copy(z, &side.region, len)
            }
            KvMem::PeerHost => {
                self.host.host_view()?[..len as usize].fill(0);
                self.copy(&self.host, &side.region, len)
            }
        }
    }

    /// The first `len` bytes of `side`, on the host.
    fn read(&self, side: &Side, len: u64) -> Result<Vec<u8>> {
        match side.mem {
            KvMem::Host => Ok(side.region.host_view()?[..len as usize].to_vec()),
            KvMem::Gpu(_) => {
                self.copy(&side.region, &self.host, len)?;
                Ok(self.host.host_view()?[..len as usize].to_vec())
            }
            KvMem::Peer => {
                let z = self.gpu.as_ref().expect("scratch GPU region for a peer");
                self.copy(&side.region, z, len)?;
                self.copy(z, &self.host, len)?;
                Ok(self.host.host_view()?[..len as usize].to_vec())
            }
            KvMem::PeerHost => {
                self.copy(&side.region, &self.host, len)?;
                Ok(self.host.host_view()?[..len as usize].to_vec())
            }
        }
    }
}

/// Runs the bench. Errors: no GPU where one is named, a peer that cannot be reached or exports
/// no large enough region of the kind asked for, a failed transfer, bad settings ([`Error::Config`]).
pub fn run(cfg: &KvBenchConfig, progress: &dyn Progress) -> Result<KvBenchReport> {
    if cfg.blocks == 0 || cfg.block_size == 0 || cfg.runs == 0 {
        return Err(Error::Config(
            "blocks, block size and runs must be at least 1".into(),
        ));
    }
    if cfg.dst == KvMem::Peer && !matches!(cfg.src, KvMem::Gpu(_)) {
        return Err(Error::Config(
            "--dst peer (a peer's GPU memory) needs --src gpu:N; a peer's host memory is \
             --dst peer-host"
                .into(),
        ));
    }
    if matches!(cfg.src, KvMem::Peer | KvMem::PeerHost) {
        return Err(Error::Config(
            "--src peer / peer-host: a peer's region is a destination only".into(),
        ));
    }
    let len = cfg
        .blocks
        .checked_mul(cfg.block_size)
        .ok_or_else(|| Error::Config("blocks × block size overflows".into()))?;
    // The host memory it will take (each host side, the host scratch copy, the id arrays),
    // refused up front rather than met by the OOM killer while it fills them.
    let host_sides = [cfg.src, cfg.dst]
        .iter()
        .filter(|m| **m == KvMem::Host)
        .count() as u64;
    let ids = cfg.blocks.saturating_mul(2 * 4);
    gdpath::memory::check_host_memory(
        "bench kv",
        len.saturating_mul(host_sides + 1).saturating_add(ids),
    )?;
    let (src_ids, dst_ids) = placement(cfg)?;
    let agent = Agent::new(AgentConfig {
        name: "bench-kv".into(),
        ..AgentConfig::default()
    })?;
    let src = region(&agent, cfg.src, cfg.dst, len, cfg)?;
    let dst = region(&agent, cfg.dst, cfg.src, len, cfg)?;
    let scratch = Scratch {
        agent: agent.clone(),
        host: {
            let bytes = usize::try_from(len).unwrap_or(usize::MAX);
            agent
                .register(Memory::pinned(HostBuffer::try_zeroed(bytes)?))
                .or_else(|_| agent.register(Memory::host(HostBuffer::try_zeroed(bytes)?)))?
        },
        gpu: match (cfg.src, cfg.dst) {
            (KvMem::Gpu(o), KvMem::Peer) => Some(agent.register(Memory::Gpu { ordinal: o, len })?),
            (_, KvMem::Peer) => {
                return Err(Error::Config("--dst peer needs --src gpu:N".into()));
            }
            _ => None,
        },
    };
    let mut notes = Vec::new();
    fill(&src, len)?;
    scratch.clear(&dst, len)?;
    let layout = KvLayout::new(cfg.block_size, cfg.blocks);
    let mut t = BlockTransfer::new(&src.region, layout, &dst.region, layout);
    t.method = cfg.method;
    let prepared = agent.prepare_blocks(t)?;
    if !prepared.is_block_list() {
        notes.push(format!(
            "no backend moves block lists between {} and {}: expanded into descriptor pairs",
            cfg.src, cfg.dst
        ));
    }
    progress.start("kv blocks", cfg.runs as u64 + 1);
    let (mut rates, mut post_ns, mut call_us) = (Vec::new(), Vec::new(), Vec::new());
    let mut last = None;
    let mut posted_inline = false;
    for run in 0..=cfg.runs {
        let t0 = Instant::now();
        let tr = prepared.post(&src_ids, &dst_ids)?;
        let called = t0.elapsed();
        // Done when `post` returned: the backend posted (and copied) inside it.
        let inline = tr.poll().finished;
        posted_inline |= inline && run > 0;
        let rep = tr.wait().map_err(|e| e.error)?;
        let took = t0.elapsed();
        progress.advance(1);
        if run == 0 {
            continue; // warm-up: staging grows, kernels load, mappings open
        }
        rates.push(gbps(len, took));
        call_us.push(called.as_secs_f64() * 1e6);
        let batch = rep.pairs.first().and_then(|p| p.batch);
        match batch {
            Some(b) => {
                let backend = if inline { 0.0 } else { b.post_ns as f64 };
                post_ns.push((called.as_nanos() as f64 + backend) / b.descriptors as f64);
            }
            // Expanded into descriptor pairs: `post` alone is the posting.
            None => post_ns.push(called.as_nanos() as f64 / cfg.blocks as f64),
        }
        last = Some((rep.pairs[0].path.clone(), batch, rep.pairs.len() as u64));
    }
    progress.finish();
    let expected: Vec<BlockCopy> = src_ids
        .iter()
        .zip(&dst_ids)
        .map(|(&s, &d)| {
            BlockCopy::new(
                d as u64 * cfg.block_size,
                s as u64 * cfg.block_size,
                cfg.block_size,
            )
        })
        .collect();
    let got = scratch.read(&dst, len)?;
    let (bad, first) = pattern::check_copies(&got, 0, &expected, 0, SEED);
    if bad > 0 {
        notes.push(format!(
            "{bad} destination blocks differ from their source (first: block {:?})",
            first.map(|i| dst_ids[i])
        ));
    }
    drop(got);
    // The contiguous copy of the same bytes between the same regions.
    scratch.clear(&dst, len)?;
    let one =
        || TransferRequest::write(vec![src.region.desc(0, len)], vec![dst.region.desc(0, len)]);
    let mut contiguous = Vec::new();
    let mut cpath = DataPath::HostCopy;
    for run in 0..=cfg.runs {
        let t0 = Instant::now();
        let rep = agent.post(one())?.wait().map_err(|e| e.error)?;
        let took = t0.elapsed();
        cpath = rep.pairs[0].path.clone();
        if run > 0 {
            contiguous.push(gbps(len, took));
        }
    }
    let got = scratch.read(&dst, len)?;
    let contiguous_ok = pattern::check(&got, SEED, 0).is_ok();
    if !contiguous_ok {
        notes.push("the contiguous copy's destination differs from the source".into());
    }
    let (path, batch, pairs) = last.expect("at least one timed run");
    // A backend without block lists moved one descriptor pair per merged run.
    let (method, descriptors, coalesced) = match batch {
        Some(b) => (b.method.name().to_owned(), b.descriptors, b.coalesced),
        None => ("pairs".to_owned(), cfg.blocks, pairs),
    };
    let (src_name, dst_name) = (cfg.src.to_string(), cfg.dst.to_string());
    let mut row = BenchRow::from_runs(
        path.name(),
        "blocks",
        len,
        cfg.block_size,
        1,
        &rates,
        &[],
        bad == 0,
    );
    row.src = Some(src_name.clone());
    row.dst = Some(dst_name.clone());
    let mut crow = BenchRow::from_runs(
        cpath.name(),
        "contiguous",
        len,
        len,
        1,
        &contiguous,
        &[],
        contiguous_ok,
    );
    crow.src = Some(src_name);
    crow.dst = Some(dst_name);
    let ratio = if crow.gbps_median > 0.0 {
        row.gbps_median / crow.gbps_median
    } else {
        0.0
    };
    Ok(KvBenchReport {
        blocks: KvBenchRow {
            row,
            method,
            descriptors,
            coalesced,
            ratio,
            post_ns_per_descriptor: median(&mut post_ns),
            post_call_us: median(&mut call_us),
            posted_inline,
        },
        contiguous: crow,
        notes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(placement: KvPlacement, blocks: u64, run_len: u64) -> KvBenchConfig {
        KvBenchConfig {
            blocks,
            block_size: 4096,
            placement,
            run_len,
            src: KvMem::Host,
            dst: KvMem::Host,
            runs: 2,
            method: None,
            peer: None,
            connector: None,
            token: Token::none(),
            net: NetConfig::default(),
        }
    }

    #[test]
    fn memory_specs_parse() {
        assert_eq!(KvMem::parse("gpu:1"), Ok(KvMem::Gpu(1)));
        assert_eq!(KvMem::parse("host"), Ok(KvMem::Host));
        assert_eq!(KvMem::parse("peer"), Ok(KvMem::Peer));
        assert!(KvMem::parse("gpu:x").is_err());
    }

    #[test]
    fn placements_are_permutations_and_runs_stay_together() {
        let (s, d) = placement(&cfg(KvPlacement::Random, 1000, 1)).unwrap();
        for ids in [&s, &d] {
            let mut v = ids.clone();
            v.sort_unstable();
            assert_eq!(v, (0..1000).collect::<Vec<u32>>());
        }
        let (s, d) = placement(&cfg(KvPlacement::Runs, 1024, 16)).unwrap();
        for ids in [&s, &d] {
            for w in ids.chunks(16) {
                assert_eq!(w[0] % 16, 0);
                assert!(w.windows(2).all(|p| p[1] == p[0] + 1));
            }
        }
        assert!(placement(&cfg(KvPlacement::Runs, 1000, 16)).is_err());
    }

    /// The whole bench on host memory (the CPU tier): both rows verified, runs merge.
    #[test]
    fn host_to_host_runs_verify() {
        let r = run(&cfg(KvPlacement::Runs, 4096, 16), &crate::NoProgress).unwrap();
        assert!(
            r.blocks.row.verified && r.contiguous.verified,
            "{:?}",
            r.notes
        );
        assert_eq!(r.blocks.descriptors, 4096);
        assert_eq!(r.blocks.coalesced, 256);
        assert_eq!(r.blocks.method, "copies");
        assert_eq!(r.blocks.row.path, "host-copy");
        assert!(r.blocks.ratio > 0.0 && r.blocks.post_ns_per_descriptor > 0.0);
        let r = run(&cfg(KvPlacement::Random, 2000, 1), &crate::NoProgress).unwrap();
        assert!(r.blocks.row.verified, "{:?}", r.notes);
        assert_eq!(r.blocks.coalesced, r.blocks.descriptors - merges(2000));
    }

    /// Neighbours in both permutations that happen to continue each other.
    fn merges(n: u32) -> u64 {
        let (s, d) = (pattern::shuffled(n, 1), pattern::shuffled(n, 2));
        (1..n as usize)
            .filter(|&i| s[i] == s[i - 1] + 1 && d[i] == d[i - 1] + 1)
            .count() as u64
    }
}
