//! `gdpath bench ...`: argument parsing and output of the benchmarks of `gdpath_bench`.

use crate::progress;
use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use comfy_table::{presets::UTF8_BORDERS_ONLY, Table};
use gdpath::net::{NetConfig, PutCompletion};
use gdpath::units::{format_size, parse_size, parse_size_range};
use gdpath::{DirectIo, Op};
use gdpath_bench::net::{self, MemSpec};
use gdpath_bench::{gpu, kv, storage, BenchRow, BENCH_SCHEMA};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// File <-> host memory through the engine (O_DIRECT + io_uring, or buffered), like gdsio.
    Storage(StorageArgs),
    /// Every GPU pair: P2P uni- and bidirectional, staged with P2P off, small-copy latency.
    P2p(GpuArgs),
    /// Every GPU: host -> GPU with pinned and pageable memory (gdpath's staging and the driver's).
    H2d(GpuArgs),
    /// Every GPU: GPU -> host, as h2d.
    D2h(GpuArgs),
    /// Put/get to a peer agent's memory over UCX, like ib_write_bw / ucx_perftest.
    Net(NetBenchArgs),
    /// KV-cache blocks: one block transfer of N scattered blocks beside one contiguous copy of
    /// the same bytes (the ratio is the figure), data verified, posting cost per descriptor.
    Kv(KvArgs),
}

#[derive(Debug, Args)]
pub struct KvArgs {
    /// Blocks per transfer (descriptors, one layer, one K/V plane).
    #[arg(long, default_value_t = 100_000)]
    blocks: u64,
    /// Bytes per block.
    #[arg(long, default_value = "16KiB", value_parser = parse_size)]
    block_size: u64,
    /// Placement: random (every block to a random slot on both sides) or runs (runs of
    /// --run-len consecutive blocks, which merge).
    #[arg(long, default_value = "random", value_parser = ["random", "runs"])]
    layout: String,
    /// Blocks per run with --layout runs.
    #[arg(long, default_value_t = 16)]
    run_len: u64,
    /// Source memory: gpu:N or host.
    #[arg(long, default_value = "gpu:0", value_parser = kv::KvMem::parse)]
    src: kv::KvMem,
    /// Destination memory: gpu:N, host, or peer (a `gdpath serve --export gpu:0:SIZE`, see
    /// --peer; through CUDA IPC on this node).
    #[arg(long, default_value = "host", value_parser = kv::KvMem::parse)]
    dst: kv::KvMem,
    /// Timed runs per row, after one warm-up.
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// auto (the backend chooses), kernel, driver-batch or copies.
    #[arg(long, default_value = "auto")]
    method: String,
    /// The serving agent for --dst peer, HOST:PORT.
    #[arg(long)]
    peer: Option<String>,
    #[command(flatten)]
    net: crate::serve::NetOpts,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
pub struct NetBenchArgs {
    /// The serving agent (`gdpath serve`), HOST:PORT: an IP address or a name (an IPv4
    /// address of the name when it has several).
    #[arg(long)]
    peer: String,
    /// put (write to the peer) or get (read from it).
    #[arg(long, default_value = "put", value_parser = ["put", "get"])]
    op: String,
    /// Local memory: host or gpu:N.
    #[arg(long, default_value = "host", value_parser = MemSpec::parse)]
    mem: MemSpec,
    /// The peer's exported memory to use: host or gpu:N.
    #[arg(long, default_value = "host", value_parser = MemSpec::parse)]
    remote_mem: MemSpec,
    /// Message sizes: a size, a power-of-two sweep `8B..1GiB`, or a list of either `4KiB,1MiB..8MiB` [default:
    /// 8B..1GiB, without the sizes larger than the peer's region]
    #[arg(long)]
    size: Option<String>,
    /// Messages in flight, 1..=4096 (what the peer's receive queue holds).
    #[arg(long, default_value_t = 16)]
    qd: u32,
    /// Where in the peer's region this run's window starts (e.g. 64MiB): clients benchmarking
    /// one region at once each need their own, or they overwrite each other's data.
    #[arg(long, default_value = "0", value_parser = parse_size)]
    remote_offset: u64,
    /// Messages per transfer (descriptor pairs of one request, completed by one flush), 1..=qd.
    /// 1: every message is its own transfer.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    batch: u32,
    /// Timed bandwidth runs per size.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Bytes per bandwidth run (messages = this / size, at least qd and at most 200000).
    #[arg(long, default_value = "256MiB", value_parser = parse_size)]
    bytes_per_run: u64,
    /// Latency samples per size; 0: 64 MiB / size, 5..=1000.
    #[arg(long, default_value_t = 0)]
    lat_iters: usize,
    /// When a put counts as done: `remote` (confirmed in the peer's memory by a flush, one
    /// round trip per transfer) or `local` (the local buffer is free; each bandwidth run ends
    /// with one flush, like ucx_perftest) [default: remote]. Puts only: gets always complete
    /// when their data arrived.
    #[arg(long, value_enum)]
    completion: Option<Completion>,
    /// Send every put as a UCX put, also where host writes over tcp would go as packed writes
    /// (the engine's own messages, acknowledged by the peer; docs/network.md). Puts only.
    #[arg(long)]
    no_pack: bool,
    #[command(flatten)]
    net: crate::serve::NetOpts,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

/// `bench net --completion`: when a put counts as done.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Completion {
    /// Confirmed in the peer's memory by a flush.
    Remote,
    /// The local buffer is free.
    Local,
}

impl From<Completion> for PutCompletion {
    fn from(c: Completion) -> Self {
        match c {
            Completion::Remote => PutCompletion::Remote,
            Completion::Local => PutCompletion::Local,
        }
    }
}

#[derive(Debug, Args)]
pub struct GpuArgs {
    /// Copy sizes: a size, a power-of-two sweep `4KiB..1GiB`, or a list of either `4KiB,1MiB..8MiB`.
    #[arg(long, default_value = "4KiB..1GiB")]
    sizes: String,
    /// Timed runs per row (min/median/max are over runs).
    #[arg(long, default_value_t = 5, value_parser = crate::args::count)]
    runs: usize,
    /// Only these GPUs (CUDA ordinals, comma-separated).
    #[arg(long, value_delimiter = ',')]
    gpus: Option<Vec<u32>>,
    /// Print JSON rows instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
pub struct StorageArgs {
    /// The file to read (created with a test pattern if missing) or write (needs --overwrite if
    /// it exists). A device, FIFO or socket is refused: the bench writes only regular files.
    #[arg(long)]
    file: PathBuf,
    /// Bytes per run (KiB/MiB/GiB binary, kB/MB/GB decimal).
    #[arg(long, default_value = "1GiB", value_parser = crate::args::nonzero_size)]
    size: u64,
    /// Block size (bytes per I/O): a size, a power-of-two sweep `1MiB..64MiB`, or a list of
    /// either [default: 1MiB; with --gpu: chosen from the machine and the file, see `chosen:`].
    #[arg(long)]
    block: Option<String>,
    /// I/Os in flight [default: 32] (without --gpu; the GDS paths use --threads).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    qd: Option<u32>,
    /// Timed runs per block size (min/median/max are over runs).
    #[arg(long, default_value_t = 3, value_parser = crate::args::count)]
    runs: usize,
    /// Benchmark reads (default).
    #[arg(long, conflicts_with = "write")]
    read: bool,
    /// Benchmark writes.
    #[arg(long)]
    write: bool,
    /// Also time a plain buffered read(2) loop of the same file and print the ratio (reads,
    /// without --gpu).
    #[arg(long)]
    compare: bool,
    /// Use the buffered (page cache) path instead of O_DIRECT (without --gpu).
    #[arg(long)]
    buffered: bool,
    /// Drop the file from the page cache before each buffered run: with --buffered, and for
    /// --compare's read loop (the O_DIRECT run does not read through the page cache).
    #[arg(long)]
    cold: bool,
    /// Allow overwriting an existing file (writes), or replacing one shorter than --size with
    /// a test pattern (reads).
    #[arg(long)]
    overwrite: bool,
    /// Do not fsync a test file this run creates before it takes its name (without --gpu).
    #[arg(long)]
    no_fsync: bool,
    /// Print JSON (schema below) instead of a table.
    #[arg(long)]
    json: bool,
    /// File <-> GPU memory of this GPU instead of host memory (the GDS paths).
    #[arg(long)]
    gpu: Option<u32>,
    /// GDS paths to run side by side (with --gpu): gds, compat, staged or all [default: all].
    #[arg(long)]
    path: Option<String>,
    /// Threads (requests in flight) of the GDS paths, a list `a,b` (with --gpu; default:
    /// chosen from the machine and the file, see `chosen:`).
    #[arg(long)]
    threads: Option<String>,
}

impl StorageArgs {
    /// Refuses the options that do not apply to the mode chosen (host memory, or `--gpu`).
    fn check_mode(&self) -> Result<()> {
        use crate::args::refuse_if;
        if self.gpu.is_some() {
            let why = "applies to the host-memory bench (without --gpu)";
            refuse_if(self.qd.is_some(), "--qd", "applies to the host-memory bench (without --gpu); the GDS paths' requests in flight are --threads")?;
            refuse_if(self.compare, "--compare", why)?;
            refuse_if(self.buffered, "--buffered", "applies to the host-memory bench (without --gpu); the GDS bench's paths are --path")?;
            refuse_if(self.no_fsync, "--no-fsync", "applies to the host-memory bench (without --gpu): the GDS bench syncs its test file, whose cold runs read it from the drive")?;
        } else {
            let why = "applies to the GDS bench (with --gpu)";
            refuse_if(self.path.is_some(), "--path", why)?;
            refuse_if(self.threads.is_some(), "--threads", why)?;
        }
        refuse_if(
            self.compare && self.write,
            "--compare",
            "runs a buffered read loop: use it with --read",
        )
    }
}

impl BenchCommand {
    /// `--json` was given.
    pub fn json(&self) -> bool {
        match self {
            BenchCommand::Storage(a) => a.json,
            BenchCommand::Net(a) => a.json,
            BenchCommand::Kv(a) => a.json,
            BenchCommand::P2p(a) | BenchCommand::H2d(a) | BenchCommand::D2h(a) => a.json,
        }
    }
}

pub fn run(cmd: BenchCommand) -> Result<ExitCode> {
    match cmd {
        BenchCommand::Storage(a) => run_storage(a),
        BenchCommand::Net(a) => run_net(a),
        BenchCommand::Kv(a) => run_kv(a),
        BenchCommand::P2p(a) => run_gpu(gpu::GpuBenchKind::P2p, a),
        BenchCommand::H2d(a) => run_gpu(gpu::GpuBenchKind::H2d, a),
        BenchCommand::D2h(a) => run_gpu(gpu::GpuBenchKind::D2h, a),
    }
}

fn run_gpu(kind: gpu::GpuBenchKind, a: GpuArgs) -> Result<ExitCode> {
    let cfg = gpu::GpuBenchConfig {
        kind,
        sizes: parse_size_range(&a.sizes).context("--sizes")?,
        runs: a.runs,
        gpus: a.gpus.clone(),
    };
    let name = match kind {
        gpu::GpuBenchKind::P2p => "bench p2p",
        gpu::GpuBenchKind::H2d => "bench h2d",
        gpu::GpuBenchKind::D2h => "bench d2h",
    };
    let started = std::time::SystemTime::now();
    let report = gpu::run(&cfg).with_context(|| name.to_owned())?;
    if a.json {
        let out = serde_json::json!({
            "schema": BENCH_SCHEMA,
            "argv": argv(),
            "command": name,
            "started_unix_s": started.duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0),
            "units": {"gbps": "1e9 bytes/s", "latency": "us", "bytes": "bytes"},
            "findings": report.findings,
            "notes": report.notes,
            "rows": report.rows,
        });
        outln!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        let mut t = Table::new();
        t.load_preset(UTF8_BORDERS_ONLY);
        t.set_header([
            "path",
            "src",
            "dst",
            "size",
            "GB/s min",
            "GB/s median",
            "GB/s max",
            "latency µs",
            "limit GB/s",
            "% limit",
            "verified",
        ]);
        for r in &report.rows {
            let lim = r.limit_gbps;
            t.add_row([
                r.path.clone(),
                r.src.clone().unwrap_or_default(),
                r.dst.clone().unwrap_or_default(),
                format_size(r.bytes),
                format!("{:.2}", r.gbps_min),
                format!("{:.2}", r.gbps_median),
                format!("{:.2}", r.gbps_max),
                r.latency_us.map(|l| format!("{l:.2}")).unwrap_or_default(),
                lim.map(|l| format!("{l:.1}")).unwrap_or_default(),
                lim.map(|l| format!("{:.0}", 100.0 * r.gbps_median / l))
                    .unwrap_or_default(),
                if r.verified {
                    "yes".into()
                } else {
                    "NO".into()
                },
            ]);
        }
        outln!("{t}");
        for f in &report.findings {
            outln!("finding: {f}");
        }
        for n in &report.notes {
            outln!("note: {n}");
        }
        outln!("GB/s = 1e9 bytes/s; limit = NVLink count x per-link rate, or PCIe gen x width (per direction; x2 for bidir)");
    }
    Ok(verdict(report.rows.iter().all(|r| r.verified), ""))
}

fn run_kv(a: KvArgs) -> Result<ExitCode> {
    let method = match a.method.as_str() {
        "auto" => None,
        m => Some(gdpath::CopyMethod::parse(m).ok_or_else(|| {
            crate::usage(format!(
                "--method {m}: expected auto, kernel, driver-batch or copies"
            ))
        })?),
    };
    let peer = match &a.peer {
        Some(p) => Some(crate::serve::resolve("--peer", p)?),
        None => None,
    };
    let cfg = kv::KvBenchConfig {
        blocks: a.blocks,
        block_size: a.block_size,
        placement: if a.layout == "runs" {
            kv::KvPlacement::Runs
        } else {
            kv::KvPlacement::Random
        },
        run_len: a.run_len,
        src: a.src,
        dst: a.dst,
        runs: a.runs,
        method,
        peer,
        token: a.net.token()?,
        net: a.net.config(),
    };
    let bars = progress::for_terminal(a.json);
    let started = std::time::SystemTime::now();
    let r = kv::run(&cfg, bars.as_ref()).context("bench kv")?;
    let ok = r.blocks.row.verified && r.contiguous.verified;
    if a.json {
        let out = serde_json::json!({
            "schema": BENCH_SCHEMA,
            "command": "bench kv",
            "layout": a.layout,
            "started_unix_s": started.duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0),
            "units": {"gbps": "1e9 bytes/s", "bytes": "bytes", "post_ns_per_descriptor": "ns", "post_call_us": "us"},
            "notes": r.notes,
            "rows": [serde_json::to_value(&r.blocks)?, serde_json::to_value(&r.contiguous)?],
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        let mut t = Table::new();
        t.load_preset(UTF8_BORDERS_ONLY);
        t.set_header([
            "op",
            "path",
            "method",
            "src",
            "dst",
            "bytes",
            "block",
            "descriptors",
            "merged",
            "GB/s min",
            "GB/s median",
            "GB/s max",
            "verified",
        ]);
        let b = &r.blocks;
        let row = |x: &BenchRow, m: &str, n: String, c: String| {
            [
                x.op.clone(),
                x.path.clone(),
                m.to_owned(),
                x.src.clone().unwrap_or_default(),
                x.dst.clone().unwrap_or_default(),
                format_size(x.bytes),
                format_size(x.block),
                n,
                c,
                format!("{:.2}", x.gbps_min),
                format!("{:.2}", x.gbps_median),
                format!("{:.2}", x.gbps_max),
                if x.verified {
                    "yes".into()
                } else {
                    "NO".into()
                },
            ]
        };
        t.add_row(row(
            &b.row,
            &b.method,
            b.descriptors.to_string(),
            b.coalesced.to_string(),
        ));
        t.add_row(row(&r.contiguous, "copies", "1".into(), "1".into()));
        println!("{t}");
        println!(
            "blocks / contiguous = {:.3}x (median GB/s); posting {:.1} ns per descriptor \
             (post() {:.1} us)",
            b.ratio, b.post_ns_per_descriptor, b.post_call_us
        );
        for n in &r.notes {
            println!("note: {n}");
        }
        println!("GB/s = 1e9 bytes/s, post to completion; the contiguous row moves the same bytes between the same regions");
    }
    Ok(verdict(ok, ""))
}

fn run_storage(a: StorageArgs) -> Result<ExitCode> {
    a.check_mode()?;
    let blocks = match &a.block {
        Some(b) => parse_size_range(b).context("--block")?,
        // The GDS bench asks the chooser; the host-memory bench keeps gdsio's 1 MiB.
        None if a.gpu.is_some() => Vec::new(),
        None => vec![gdpath::config::DEFAULT_CHUNK],
    };
    // Checked here too, before the GPU bench's file is made, as a usage error.
    if !blocks.is_empty() {
        gdpath_bench::check_blocks(&blocks, a.size)
            .map_err(|e| crate::usage(format!("--block, --size: {e}")))?;
    }
    if let Some(gpu) = a.gpu {
        return run_gds(&a, gpu, blocks);
    }
    let cfg = storage::StorageBenchConfig {
        file: a.file.clone(),
        size: a.size,
        blocks,
        qd: a.qd.unwrap_or(storage::DEFAULT_QD),
        op: if a.write { Op::Write } else { Op::Read },
        runs: a.runs,
        compare: a.compare,
        direct: if a.buffered {
            DirectIo::Off
        } else {
            DirectIo::Auto
        },
        cold: a.cold,
        overwrite: a.overwrite,
        fsync: !a.no_fsync,
    };
    cfg.check()
        .map_err(|e| crate::usage(format!("bench storage: {e}")))?;
    let bars = progress::for_terminal(a.json);
    let started = std::time::SystemTime::now();
    let report = storage::run(&cfg, bars.as_ref())
        .with_context(|| format!("bench storage on {}", a.file.display()))?;
    let all_verified = report.rows.iter().all(|r| r.verified);
    if a.json {
        let out = serde_json::json!({
            "schema": BENCH_SCHEMA,
            "argv": argv(),
            "command": "bench storage",
            "file": a.file,
            "started_unix_s": started.duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0),
            "units": {"gbps": "1e9 bytes/s", "latency": "us", "bytes": "bytes"},
            "findings": report.findings,
            "rows": report.rows,
        });
        outln!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        print_table(&report.rows);
        for f in &report.findings {
            outln!("finding: {f} (run `gdpath doctor` for evidence and remedy)");
        }
        print_ratios(&report.rows);
        outln!("GB/s = 1e9 bytes/s; latency per I/O, submission to completion");
    }
    Ok(verdict(all_verified, ""))
}

/// The command line that made a document (`argv`, program name first): `gdpath report` shows
/// it beside every figure it takes from the document.
fn argv() -> Vec<String> {
    std::env::args().collect()
}

/// A bench's exit status: success when every row verified, else
/// [`crate::NOT_VERIFIED_STATUS`] after saying so (with `hint` on what may have caused it).
fn verdict(all_verified: bool, hint: &str) -> ExitCode {
    if all_verified {
        return ExitCode::SUCCESS;
    }
    errln!("gdpath: data verification FAILED for at least one row{hint}");
    ExitCode::from(crate::NOT_VERIFIED_STATUS)
}

/// GB/s with four significant digits down to 0.0001, scientific below (8-byte messages).
fn fmt_gbps(v: f64) -> String {
    if v >= 1.0 {
        format!("{v:.3}")
    } else if v >= 1e-4 {
        format!("{v:.4}")
    } else {
        format!("{v:.2e}")
    }
}

/// `bench net`'s sweep when `--size` is not given (sizes above the peer's region are skipped).
const DEFAULT_NET_SIZES: &str = "8B..1GiB";

impl NetBenchArgs {
    /// Refuses the options that do not apply to the operation chosen: `--completion` and
    /// `--no-pack` say how puts are sent and confirmed, which a get run has none of.
    fn check_op(&self) -> Result<()> {
        use crate::args::refuse_if;
        if self.op == "get" {
            let why = "applies to puts (--op put): a get completes when its data arrived";
            refuse_if(self.completion.is_some(), "--completion", why)?;
            refuse_if(
                self.no_pack,
                "--no-pack",
                "applies to puts (--op put): only writes are sent as packed writes",
            )?;
        }
        Ok(())
    }
}

fn run_net(a: NetBenchArgs) -> Result<ExitCode> {
    a.check_op()?;
    if a.qd == 0 || a.qd > net::MAX_QD {
        return Err(crate::usage(format!(
            "--qd {} is outside 1..={}: the peer's receive queue holds at most {} messages",
            a.qd,
            net::MAX_QD,
            net::MAX_QD
        )));
    }
    if a.batch > a.qd {
        return Err(crate::usage(format!(
            "--batch {} exceeds --qd {}: a transfer's messages are all in flight at once",
            a.batch, a.qd
        )));
    }
    let peer = crate::serve::resolve("--peer", &a.peer)?;
    let cfg = net::NetBenchConfig {
        peer,
        token: a.net.token()?,
        net: NetConfig {
            put_completion: a.completion.unwrap_or(Completion::Remote).into(),
            pack_writes: !a.no_pack,
            ..a.net.config()
        },
        op: if a.op == "get" { Op::Read } else { Op::Write },
        mem: a.mem,
        remote_mem: a.remote_mem,
        sizes: parse_size_range(a.size.as_deref().unwrap_or(DEFAULT_NET_SIZES))
            .context("--size")?,
        fit_sizes: a.size.is_none(),
        qd: a.qd,
        batch: a.batch,
        runs: a.runs,
        bytes_per_run: a.bytes_per_run,
        lat_iters: a.lat_iters,
        stop: Some(crate::interrupt::flag()),
        remote_offset: a.remote_offset,
        connect_timeout: a.net.connect_timeout(),
    };
    let bars = progress::for_terminal(a.json);
    let started = std::time::SystemTime::now();
    let report = match net::run(&cfg, bars.as_ref()) {
        // A signal: the run stopped and the connection closed with a goodbye.
        Err(gdpath::Error::Cancelled) => {
            let message = "bench net interrupted: the transfers in flight were cancelled";
            errln!("gdpath: {message}");
            if a.json {
                crate::print_error_json(message, "cancelled");
            }
            return Ok(ExitCode::from(130));
        }
        r => r.with_context(|| format!("bench net with {}", crate::serve::named(&a.peer, peer)))?,
    };
    let all_verified = report.rows.iter().all(|r| r.row.verified);
    if a.json {
        let out = serde_json::json!({
            "schema": BENCH_SCHEMA,
            "argv": argv(),
            "command": "bench net",
            "skipped_sizes": report.skipped_sizes,
            "remote_region": {"id": report.remote_region.0, "bytes": report.remote_region.1},
            "peer": report.peer,
            "ucx_version": report.ucx_version,
            "findings": report.findings,
            "started_unix_s": started.duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0),
            "units": {"gbps": "1e9 bytes/s", "latency": "us", "bytes": "bytes"},
            "rows": report.rows,
        });
        outln!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        outln!(
            "peer {} (UCX {}), its region {} of {}",
            report.peer,
            report.ucx_version,
            report.remote_region.0,
            format_size(report.remote_region.1)
        );
        if let (Some(lo), Some(hi)) = (report.skipped_sizes.first(), report.skipped_sizes.last()) {
            outln!(
                "note: sizes {}..{} skipped: larger than the peer's region (choose sizes with \
                 --size)",
                format_size(*lo),
                format_size(*hi)
            );
        }
        let mut t = Table::new();
        t.load_preset(UTF8_BORDERS_ONLY);
        t.set_header([
            "op",
            "size",
            "qd",
            "batch",
            "GB/s min",
            "GB/s median",
            "GB/s max",
            "lat µs min",
            "lat µs median",
            "lat µs max",
            "transport",
            "verified",
        ]);
        for r in &report.rows {
            t.add_row([
                r.row.op.clone(),
                format_size(r.row.block),
                r.row.qd.to_string(),
                r.batch.to_string(),
                fmt_gbps(r.row.gbps_min),
                fmt_gbps(r.row.gbps_median),
                fmt_gbps(r.row.gbps_max),
                format!("{:.1}", r.latency_us_min),
                format!("{:.1}", r.latency_us_median),
                format!("{:.1}", r.latency_us_max),
                r.row.transport.clone().unwrap_or_default(),
                if r.row.verified {
                    "yes".into()
                } else {
                    "NO".into()
                },
            ]);
        }
        outln!("{t}");
        for f in &report.findings {
            outln!("finding: {f} (run `gdpath doctor` for evidence and remedy)");
        }
        for r in &report.rows {
            if r.row.qd < a.qd || r.batch < a.batch {
                outln!(
                    "note: {} messages ran with qd {} and batch {} (asked: {} and {}): the \
                     peer's region holds only that many messages of that size, and a window \
                     holds whole transfers",
                    format_size(r.row.block),
                    r.row.qd,
                    r.batch,
                    a.qd,
                    a.batch
                );
            }
        }
        outln!(
            "GB/s = 1e9 bytes/s over messages in flight; latency = one message at a time, post to \
             completion ({})",
            if a.op == "get" {
                "a get completes when its data is in local memory"
            } else if a.completion == Some(Completion::Local) {
                "--completion local: a put completes when its buffer is free; each bandwidth run \
                 ends with a flush confirming all of them"
            } else {
                "a put completes when it is in the peer's memory"
            }
        );
    }
    Ok(verdict(
        all_verified,
        " (was another client writing the same region of the peer?)",
    ))
}

fn print_table(rows: &[BenchRow]) {
    let mut t = Table::new();
    t.load_preset(UTF8_BORDERS_ONLY);
    t.set_header([
        "path",
        "op",
        "size",
        "block",
        "qd",
        "GB/s min",
        "GB/s median",
        "GB/s max",
        "IOPS",
        "p50 µs",
        "p99 µs",
        "verified",
    ]);
    for r in rows {
        t.add_row([
            r.path.clone(),
            r.op.clone(),
            format_size(r.bytes),
            format_size(r.block),
            r.qd.to_string(),
            format!("{:.3}", r.gbps_min),
            format!("{:.3}", r.gbps_median),
            format!("{:.3}", r.gbps_max),
            format!("{:.0}", r.iops),
            lat(r.latency_us_p50),
            lat(r.latency_us_p99),
            if r.verified {
                "yes".into()
            } else {
                "NO".into()
            },
        ]);
    }
    outln!("{t}");
}

fn print_ratios(rows: &[BenchRow]) {
    if let Some(src) = rows
        .iter()
        .find(|r| r.path == "read-loop")
        .and_then(|r| r.src.as_deref())
    {
        outln!("read-loop: buffered read(2), one in flight; {src}");
    }
    for r in rows.iter().filter(|r| r.path == "read-loop") {
        if let Some(e) = rows
            .iter()
            .find(|e| e.block == r.block && e.path != "read-loop")
        {
            if r.gbps_median > 0.0 {
                outln!(
                    "block {}: {} / read-loop = {:.2}x (median GB/s)",
                    format_size(r.block),
                    e.path,
                    e.gbps_median / r.gbps_median
                );
            }
        }
    }
}

fn run_gds(a: &StorageArgs, gpu: u32, blocks: Vec<u64>) -> Result<ExitCode> {
    use gdpath_bench::gds::{run, GdsBenchConfig, GdsPathChoice};
    let paths = match a.path.as_deref().unwrap_or("all") {
        "all" => vec![
            GdsPathChoice::Gds,
            GdsPathChoice::Compat,
            GdsPathChoice::Staged,
        ],
        "gds" => vec![GdsPathChoice::Gds],
        "compat" => vec![GdsPathChoice::Compat],
        "staged" => vec![GdsPathChoice::Staged],
        other => {
            return Err(crate::usage(format!(
                "--path {other}: expected gds, compat, staged or all"
            )))
        }
    };
    let threads = match &a.threads {
        Some(t) => t
            .split(',')
            .map(|x| match x.trim().parse::<usize>() {
                Ok(0) => Err(crate::usage("--threads: a thread count must be at least 1")),
                Ok(n) => Ok(n),
                Err(e) => Err(crate::usage(format!("--threads {x}: {e}"))),
            })
            .collect::<Result<Vec<_>>>()?,
        None => Vec::new(),
    };
    let cfg = GdsBenchConfig {
        file: a.file.clone(),
        size: a.size,
        gpu,
        blocks,
        threads,
        op: if a.write { Op::Write } else { Op::Read },
        runs: a.runs,
        paths,
        cold: a.cold,
        overwrite: a.overwrite,
    };
    let bars = progress::for_terminal(a.json);
    let started = std::time::SystemTime::now();
    let report = run(&cfg, bars.as_ref())
        .with_context(|| format!("bench storage --gpu {gpu} on {}", a.file.display()))?;
    let all_verified = report.rows.iter().all(|r| r.verified);
    if a.json {
        let skipped: Vec<_> = report
            .skipped
            .iter()
            .map(|s| serde_json::json!({"path": s.path.name(), "finding": s.finding, "detail": s.detail}))
            .collect();
        let out = serde_json::json!({
            "schema": BENCH_SCHEMA,
            "argv": argv(),
            "command": "bench storage --gpu",
            "file": a.file,
            "started_unix_s": started.duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0),
            "units": {"gbps": "1e9 bytes/s", "bytes": "bytes", "qd": "threads"},
            "findings": report.findings,
            "skipped": skipped,
            "chosen": report.chosen,
            "chosen_text": report.chosen.as_ref().map(gdpath::tune::Tuning::summary),
            "rows": report.rows,
        });
        outln!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        if let Some(c) = &report.chosen {
            outln!("chosen: {}", c.summary());
        }
        print_table(&report.rows);
        for s in &report.skipped {
            outln!(
                "skipped {}: {}{}",
                s.path.name(),
                s.finding
                    .as_ref()
                    .map(|f| format!("[{f}] "))
                    .unwrap_or_default(),
                s.detail
            );
        }
        for f in &report.findings {
            outln!("finding: {f} (run `gdpath doctor` for evidence and remedy)");
        }
        outln!("GB/s = 1e9 bytes/s; qd = threads, each with 2 requests' buffers");
    }
    Ok(verdict(all_verified, ""))
}

/// A latency cell: `-` where the bench does not measure per-I/O latency (the GPU rows).
fn lat(us: f64) -> String {
    if us > 0.0 {
        format!("{us:.1}")
    } else {
        "-".into()
    }
}
