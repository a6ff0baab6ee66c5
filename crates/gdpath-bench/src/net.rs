//! `gdpath bench net`: put/get bandwidth and latency to a peer agent's exported memory, in the
//! manner of `ib_write_bw`/`ib_read_bw` and `ucx_perftest -t ucp_put_bw`, with data verified.
//!
//! Method, per message size `s` (bytes):
//! - window `w` = min(`qd`, remote region length / `s`): messages in flight; message `i` moves
//!   local bytes `[(i mod w)·s, +s)` to (put) or from (get) the same remote range;
//! - bandwidth: `runs` timed runs of `n` messages (`n` = `bytes_per_run / s`, at least `w`, at
//!   most [`MAX_MESSAGES`]), `b` = `batch` messages per engine transfer (one descriptor pair
//!   each, as a NIXL transfer request carries a descriptor list; `b` = 1: every message its own
//!   transfer), `w / b` transfers in flight (a new one posted as the oldest completes); a
//!   transfer of puts completes when one flush confirmed all its puts; GB/s = n·s / (last
//!   completion − first post), 1e9 B/s;
//! - latency: `lat_iters` messages one at a time, post → `wait` returned (a put completes when
//!   an endpoint flush confirmed it is in the peer's memory, i.e. one round trip; a get when the
//!   data arrived); µs;
//! - with `NetConfig::put_completion` = `Local` (CLI `--completion local`), puts complete when
//!   UCX is done with the local buffer; each bandwidth run then ends with a flush of the peer
//!   (timed), as `ucx_perftest -t ucp_put_bw` does, and put latency is local completion only;
//! - verification: puts: the remote window is read back with gets and compared with what was
//!   written; gets: the remote window is first written with a known pattern by puts, and what
//!   the gets brought is compared with it (XXH3 checksums). GPU memory is filled and read back
//!   through the engine's CUDA backend.

use super::{fill_pattern, BenchRow, Checksum, Progress, Stats};
use gdpath::net::codec::WireKind;
use gdpath::net::{ConnectOptions, NetConfig, Peer, Token};
use gdpath::units::format_size;
use gdpath::{
    Agent, AgentConfig, DataPath, Error, FindingId, HostBuffer, Memory, Op, Region, Result,
    Transfer, TransferReport, TransferRequest,
};
use serde::Serialize;
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Most messages in one timed run.
pub const MAX_MESSAGES: u64 = 200_000;
/// Bound on any one wait in the bench (a dead peer fails sooner in the default error mode).
const WAIT: Duration = Duration::from_secs(120);
/// Most messages in flight (`--qd`): what the peer's receive queue holds
/// ([`gdpath::net::MAX_MESSAGES_IN_FLIGHT`]); past it a peer drops packed writes, and the run would wait
/// for answers that never come.
pub const MAX_QD: u32 = gdpath::net::MAX_MESSAGES_IN_FLIGHT as u32;
/// How long an interrupted run waits for its goodbye to the peer.
const STOP_CLOSE: Duration = Duration::from_millis(300);

/// Where the bench's memory lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum MemSpec {
    /// Host memory of this process.
    Host,
    /// GPU memory of this CUDA ordinal.
    Gpu(u32),
}

impl MemSpec {
    /// Parses `host` or `gpu:N`.
    pub fn parse(s: &str) -> std::result::Result<MemSpec, String> {
        match s {
            "host" => Ok(MemSpec::Host),
            _ => s
                .strip_prefix("gpu:")
                .and_then(|n| n.parse().ok())
                .map(MemSpec::Gpu)
                .ok_or_else(|| format!("bad memory {s:?}: expected host or gpu:N")),
        }
    }

    fn wire(self) -> WireKind {
        match self {
            MemSpec::Host => WireKind::Host,
            MemSpec::Gpu(n) => WireKind::Gpu(n),
        }
    }
}

impl std::fmt::Display for MemSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MemSpec::Host => f.write_str("host"),
            MemSpec::Gpu(n) => write!(f, "gpu:{n}"),
        }
    }
}

/// A connection made for the bench's agent by its caller instead of a plain connect to an
/// address: an agent found by name in a cluster, whose incarnation the caller checks in the
/// handshake (`gdpath bench … --peer-name`). Its errors are the caller's, as engine errors.
#[derive(Clone)]
pub struct Connector(pub Arc<ConnectFn>);

/// What a [`Connector`] runs: connect this agent with these options.
pub type ConnectFn = dyn Fn(&Agent, &ConnectOptions) -> Result<Peer> + Send + Sync;

impl std::fmt::Debug for Connector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Connector")
    }
}

/// Connects `agent` to the peer: through `connector` when given, else to `addr`.
pub(crate) fn connect(
    agent: &Agent,
    addr: SocketAddr,
    opts: &ConnectOptions,
    connector: Option<&Connector>,
) -> Result<Peer> {
    match connector {
        Some(c) => (c.0)(agent, opts),
        None => agent.connect_with(addr, opts),
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct NetBenchConfig {
    /// The serving agent.
    pub peer: SocketAddr,
    /// How to connect to it instead of a plain connect to `peer` (see [`Connector`]).
    pub connector: Option<Connector>,
    /// Authentication token the serving agent expects.
    pub token: Token,
    /// Network settings (devices, transports) of this side's agent.
    pub net: NetConfig,
    /// `Write` = put, `Read` = get.
    pub op: Op,
    /// Local memory.
    pub mem: MemSpec,
    /// The kind of the peer's exported region to use.
    pub remote_mem: MemSpec,
    /// Message sizes, bytes.
    pub sizes: Vec<u64>,
    /// Skip the sizes larger than the peer's region (listed in
    /// [`NetBenchReport::skipped_sizes`]) instead of failing with [`Error::Config`]: for a
    /// default sweep, which the user did not fit to the peer.
    pub fit_sizes: bool,
    /// Messages in flight.
    pub qd: u32,
    /// Messages (descriptor pairs) per transfer in the bandwidth runs, 1..=`qd`.
    pub batch: u32,
    /// Timed bandwidth runs per size.
    pub runs: usize,
    /// Bytes per bandwidth run (messages = this / size, bounded).
    pub bytes_per_run: u64,
    /// Latency samples per size (0: `clamp(64 MiB / size, 5, 1000)`).
    pub lat_iters: usize,
    /// Set from elsewhere (a signal handler) to end the run early: the transfers in flight
    /// are cancelled (what is already on its way completes), [`run`] returns
    /// [`Error::Cancelled`] and the connection closes with a goodbye, as at the end of a run,
    /// within a second.
    pub stop: Option<Arc<AtomicBool>>,
    /// Where in the peer's region this run's window starts, bytes: clients sharing one region
    /// each use their own (the bench writes and verifies its window).
    pub remote_offset: u64,
    /// Bound on connecting (`ConnectOptions::timeout`).
    pub connect_timeout: Duration,
}

/// A row: the common bench row (with `transport`) plus latency min and max, µs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NetBenchRow {
    /// The common row, with `transport` set.
    #[serde(flatten)]
    pub row: BenchRow,
    /// Messages per transfer in the bandwidth runs.
    pub batch: u32,
    /// Fastest single-message latency over the samples, µs.
    pub latency_us_min: f64,
    /// Median single-message latency, µs.
    pub latency_us_median: f64,
    /// Slowest single-message latency, µs.
    pub latency_us_max: f64,
}

/// The outcome.
#[derive(Debug, Clone, Serialize)]
pub struct NetBenchReport {
    /// The peer, `name@address`.
    pub peer: String,
    /// UCX version of this side.
    pub ucx_version: String,
    /// Findings attached to the pairs (e.g. `gdr.ucx-no-cuda` for staged GPU memory).
    pub findings: Vec<FindingId>,
    /// One row per message size measured.
    pub rows: Vec<NetBenchRow>,
    /// Sizes left out because they exceed the peer's region (only with
    /// [`NetBenchConfig::fit_sizes`]), bytes.
    pub skipped_sizes: Vec<u64>,
    /// The peer's region the run used (its largest of the kind asked for): id and length,
    /// bytes.
    pub remote_region: (u64, u64),
}

fn op_name(op: Op) -> &'static str {
    match op {
        Op::Write => "put",
        Op::Read => "get",
    }
}

/// Posts `n` messages of `s` bytes in transfers of up to `b` pairs, `w` messages in flight
/// (`b` ≤ `w`); message `i` uses window slot `i mod w`. With `confirm` (puts completing
/// locally, [`gdpath::net::PutCompletion::Local`]) the run ends with a flush of the peer, so the
/// time covers the bytes reaching its memory, as `ucx_perftest`'s final flush does. Returns the
/// elapsed time. Stops with [`Error::Cancelled`] once `stop` is set, after the transfers in
/// flight finished.
#[allow(clippy::too_many_arguments)]
fn stream(
    agent: &Agent,
    stop: Option<&AtomicBool>,
    confirm: Option<&Peer>,
    op: Op,
    local: &Region,
    remote: &Region,
    s: u64,
    w: u64,
    b: u64,
    n: u64,
) -> Result<Duration> {
    let b = b.clamp(1, w);
    let in_flight = (w / b).max(1) as usize;
    let mut q: VecDeque<Transfer> = VecDeque::with_capacity(in_flight);
    // Transfer `t` carries messages [t·b, min((t+1)·b, n)).
    let post = |t: u64| -> Result<Transfer> {
        let msgs = t * b..((t + 1) * b).min(n);
        let (mut l, mut r) = (Vec::new(), Vec::new());
        for i in msgs {
            let off = (i % w) * s;
            l.push(local.desc(off, s));
            r.push(remote.desc(off, s));
        }
        agent.post(TransferRequest::new(op, l, r))
    };
    let transfers = n.div_ceil(b);
    let start = Instant::now();
    let mut next = 0;
    while next < transfers.min(in_flight as u64) {
        q.push_back(post(next)?);
        next += 1;
    }
    while let Some(t) = q.pop_front() {
        if let Err(e) = wait(t, stop).and_then(|_| check_stop(stop)) {
            for t in q.drain(..) {
                t.cancel();
            }
            return Err(e);
        }
        if next < transfers {
            q.push_back(post(next)?);
            next += 1;
        }
    }
    if let Some(p) = confirm {
        p.flush(WAIT)?;
    }
    Ok(start.elapsed())
}

/// Waits for `t` (at most [`WAIT`]); with a `stop` flag, a stop cancels it within the wait's
/// wake-up (`Transfer::wait_unless`).
fn wait(t: Transfer, stop: Option<&AtomicBool>) -> Result<TransferReport> {
    match stop {
        Some(flag) => t.wait_unless(flag, WAIT),
        None => t.wait_timeout(WAIT),
    }
    .map_err(|e| e.error)
}

/// [`Error::Cancelled`] once `stop` is set ([`NetBenchConfig::stop`]).
fn check_stop(stop: Option<&AtomicBool>) -> Result<()> {
    match stop {
        Some(f) if f.load(Ordering::Relaxed) => Err(Error::Cancelled),
        _ => Ok(()),
    }
}

fn once(agent: &Agent, op: Op, local: &Region, remote: &Region, len: u64) -> Result<()> {
    agent
        .post(TransferRequest::new(
            op,
            vec![local.desc(0, len)],
            vec![remote.desc(0, len)],
        ))?
        .wait_timeout(WAIT)
        .map(|_| ())
        .map_err(|e| e.error)
}

/// Picks the peer's largest exported region of `kind`.
fn pick_region(peer: &Peer, kind: WireKind) -> Result<(u64, u64)> {
    peer.regions()
        .into_iter()
        .filter(|r| r.kind == kind)
        .max_by_key(|r| r.len)
        .map(|r| (r.id, r.len))
        .ok_or_else(|| {
            Error::Config(format!(
                "peer {} exports no {kind} region (start it with `gdpath serve --export {kind}:SIZE`)",
                peer.name()
            ))
        })
}

/// Runs the bench. Errors: connection, no suitable region, a failed transfer, bad settings.
pub fn run(cfg: &NetBenchConfig, progress: &dyn Progress) -> Result<NetBenchReport> {
    if cfg.sizes.is_empty() || cfg.runs == 0 || cfg.qd == 0 {
        return Err(Error::Config("sizes, runs and qd must be non-zero".into()));
    }
    if cfg.qd > MAX_QD {
        return Err(Error::Config(format!(
            "qd {} is above {MAX_QD}, the messages a peer's receive queue holds",
            cfg.qd
        )));
    }
    if let Some(s) = cfg.sizes.iter().find(|&&s| s == 0 || s > 1 << 30) {
        return Err(Error::Config(format!(
            "message size {} is outside 1 B ..= 1 GiB",
            format_size(*s)
        )));
    }
    let agent = Agent::new(AgentConfig {
        name: "bench".into(),
        // This bench measures UCX: GPU memory of a peer on this node stays with UCX's own
        // cuda_ipc rather than the cuda backend's IPC path (`gdpath bench kv --dst peer`).
        gpu: gdpath::GpuConfig {
            ipc: false,
            ..gdpath::GpuConfig::default()
        },
        ..AgentConfig::default()
    })?;
    agent.enable_net(cfg.net.clone())?;
    let peer = connect(
        &agent,
        cfg.peer,
        &ConnectOptions {
            token: cfg.token.clone(),
            timeout: cfg.connect_timeout,
        },
        cfg.connector.as_ref(),
    )?;
    let report = measure(cfg, progress, &agent, &peer);
    if matches!(report, Err(Error::Cancelled)) {
        // Interrupted: the goodbye is bounded, so that the run ends within a second.
        let _ = peer.close(STOP_CLOSE);
    }
    report
}

/// The measuring part of [`run`], on `peer`.
fn measure(
    cfg: &NetBenchConfig,
    progress: &dyn Progress,
    agent: &Agent,
    peer: &Peer,
) -> Result<NetBenchReport> {
    let (rid, full) = pick_region(peer, cfg.remote_mem.wire())?;
    if cfg.remote_offset >= full {
        return Err(Error::Config(format!(
            "remote offset {} is not inside the peer's region of {}",
            format_size(cfg.remote_offset),
            format_size(full)
        )));
    }
    let rlen = full - cfg.remote_offset;
    // Puts completing locally are confirmed by a flush at the end of each run and before
    // verification.
    let stop = cfg.stop.as_deref();
    let confirm = (cfg.op == Op::Write
        && cfg.net.put_completion == gdpath::net::PutCompletion::Local)
        .then_some(peer);
    let remote = agent.register(peer.memory_range(rid, cfg.remote_offset, rlen)?)?;
    let window = |s: u64| u64::from(cfg.qd).min(rlen / s).max(1);
    let (sizes, skipped_sizes): (Vec<u64>, Vec<u64>) = if cfg.fit_sizes {
        cfg.sizes.iter().partition(|&&s| s <= rlen)
    } else {
        (cfg.sizes.clone(), Vec::new())
    };
    let max_s = sizes
        .iter()
        .copied()
        .max()
        .unwrap_or_else(|| *cfg.sizes.iter().min().expect("non-empty"));
    if max_s > rlen {
        return Err(Error::Config(format!(
            "message size {} exceeds the peer's region of {}",
            format_size(max_s),
            format_size(rlen)
        )));
    }
    let local_len = sizes.iter().map(|&s| s * window(s)).max().unwrap_or(0);
    let local = match cfg.mem {
        MemSpec::Host => agent.register(Memory::host(HostBuffer::zeroed(local_len as usize)))?,
        MemSpec::Gpu(ordinal) => agent.register(Memory::Gpu {
            ordinal,
            len: local_len,
        })?,
    };
    let gpu_local = matches!(cfg.mem, MemSpec::Gpu(_));
    // `mirror` holds the pattern (and a GPU's contents read back); `check` what came back.
    let mirror = agent.register(Memory::host(HostBuffer::zeroed(local_len as usize)))?;
    let check = agent.register(Memory::host(HostBuffer::zeroed(local_len as usize)))?;
    // Host ↔ local copies, through the engine (the CUDA backend for GPU memory).
    let to_local = |span: u64| -> Result<()> {
        if gpu_local {
            once(agent, Op::Write, &mirror, &local, span)
        } else {
            let m = mirror.host_view()?;
            local.host_view()?[..span as usize].copy_from_slice(&m[..span as usize]);
            Ok(())
        }
    };
    let ucx_version = agent
        .ucx_facts()
        .map(|f| f.version_string)
        .unwrap_or_default();
    let mut rows = Vec::new();
    let mut findings: Vec<FindingId> = Vec::new();
    for (k, &s) in sizes.iter().enumerate() {
        // Whole transfers in flight: with `b` not dividing the window, `window / b` transfers
        // carry fewer messages, and the window (and the row's qd) is what really was in flight.
        let fits = window(s);
        let b = u64::from(cfg.batch).clamp(1, fits);
        let w = fits / b * b;
        let span = s * w;
        let seed = 0x6770_0000 + k as u64;
        // Reference data in `mirror`: copied to local memory for puts; written to the remote
        // window (one put) for gets, local memory cleared.
        fill_pattern(&mut mirror.host_view()?[..span as usize], 0, seed);
        match cfg.op {
            Op::Write => to_local(span)?,
            Op::Read => {
                once(agent, Op::Write, &mirror, &remote, span)?;
                if !gpu_local {
                    local.host_view()?[..span as usize].fill(0);
                }
            }
        }
        let n = (cfg.bytes_per_run / s).clamp(w, MAX_MESSAGES.max(w));
        progress.start(
            &format!("{} {}", op_name(cfg.op), format_size(s)),
            n * s * cfg.runs as u64,
        );
        // One untimed warm-up pass of the window.
        stream(agent, stop, confirm, cfg.op, &local, &remote, s, w, b, w)?;
        let mut gbps = Vec::with_capacity(cfg.runs);
        for _ in 0..cfg.runs {
            let el = stream(agent, stop, confirm, cfg.op, &local, &remote, s, w, b, n)?;
            gbps.push(gdpath::units::gbps(n * s, el));
            progress.advance(n * s);
        }
        progress.finish();
        let iters = if cfg.lat_iters > 0 {
            cfg.lat_iters
        } else {
            ((64u64 << 20) / s).clamp(5, 1000) as usize
        };
        let mut lat = Vec::with_capacity(iters);
        // The path a pair reports is the one the backend observed when it could (UCX's
        // protocol for GPU memory), else the planned one: prefer an observed path.
        let mut path: Option<DataPath> = None;
        let mut finding = None;
        for _ in 0..iters {
            check_stop(stop)?;
            let t0 = Instant::now();
            let t = agent.post(TransferRequest::new(
                cfg.op,
                vec![local.desc(0, s)],
                vec![remote.desc(0, s)],
            ))?;
            let planned = t.plan()[0].path.clone();
            let rep = wait(t, stop)?;
            lat.push(t0.elapsed().as_secs_f64() * 1e6);
            let got = &rep.pairs[0].path;
            if path.is_none() || (*got != planned && path.as_ref() == Some(&planned)) {
                path = Some(got.clone());
            }
            finding = finding.or_else(|| rep.pairs[0].finding.clone());
        }
        // Verify.
        if let Some(p) = confirm {
            p.flush(WAIT)?;
        }
        check.host_view()?[..span as usize].fill(0);
        match cfg.op {
            // What the peer holds now.
            Op::Write => once(agent, Op::Read, &check, &remote, span)?,
            // What the gets brought.
            Op::Read if gpu_local => once(agent, Op::Read, &check, &local, span)?,
            Op::Read => {
                let l = local.host_view()?;
                check.host_view()?[..span as usize].copy_from_slice(&l[..span as usize]);
            }
        }
        let verified = {
            let (a, b) = (mirror.host_view()?, check.host_view()?);
            Checksum::of(&a[..span as usize]) == Checksum::of(&b[..span as usize])
        };
        let transport = match &path {
            Some(DataPath::Ucx { transport } | DataPath::Gdr { transport }) => {
                transport.to_string()
            }
            _ => peer.transport(),
        };
        let path = path.map(|p| p.name()).unwrap_or_default();
        let st = Stats::from_samples(&lat);
        let mut row = BenchRow::from_runs(
            path,
            op_name(cfg.op),
            n * s,
            s,
            w as u32,
            &gbps,
            &lat,
            verified,
        );
        row.src = Some(match cfg.op {
            Op::Write => format!("{}", cfg.mem),
            Op::Read => format!("remote {}", cfg.remote_mem),
        });
        row.dst = Some(match cfg.op {
            Op::Write => format!("remote {}", cfg.remote_mem),
            Op::Read => format!("{}", cfg.mem),
        });
        row.latency_us = st.map(|s| s.median);
        row.transport = Some(transport);
        if let Some(f) = finding {
            if !findings.contains(&f) {
                findings.push(f);
            }
        }
        rows.push(NetBenchRow {
            row,
            batch: b as u32,
            latency_us_min: st.map_or(0.0, |s| s.min),
            latency_us_median: st.map_or(0.0, |s| s.median),
            latency_us_max: st.map_or(0.0, |s| s.max),
        });
    }
    Ok(NetBenchReport {
        peer: peer.name(),
        ucx_version,
        findings,
        rows,
        skipped_sizes,
        remote_region: (rid, rlen),
    })
}
