//! NCCL's own log, read and explained: `gdpath nccl`.
//!
//! [`read_logs`] reads `NCCL_DEBUG=INFO` output (NCCL 2.4 to 2.32; one file per rank or all
//! ranks interleaved; any prefix before NCCL's own; truncated, partial or binary text), bounded
//! by [`Limits`]; [`Job`] is what the lines say (version, ranks, hosts, networks, every
//! connection's transport, GDR decisions, environment overrides, P2P refusals); [`explain()`]
//! turns it into a per-pair table and findings with stable ids (`nccl.*`), each with its log
//! lines as evidence and its reason marked stated (by the log), derived (from the topology
//! given) or unknown. The formats and the rules are in docs/nccl.md.
//!
//! Pure Rust, no I/O beyond reading the log files it is given.

#![forbid(unsafe_code)]

pub mod explain;
pub mod parse;

pub use explain::{
    explain, Basis, Evidence, Explanation, NcclFinding, NicPath, PairRow, Topology, NCCL_SCHEMA,
};

use parse::{Direction, Transport};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::io::Read;
use std::path::{Path, PathBuf};

/// Bounds on what is read: a log larger than these is read up to them, and the explanation
/// says so (finding `nccl.log-truncated`). Reading and parsing are linear in the bytes read.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Bytes read from each file (default 256 MiB).
    pub max_bytes_per_file: u64,
    /// Lines read over all files (default 4 × 10⁶).
    pub max_lines: u64,
    /// Bytes of one line kept (default 4096); the rest of a longer line is skipped.
    pub max_line_bytes: usize,
    /// Distinct connections kept, each a (source rank, destination rank, direction, `via`)
    /// with its line count, channels and at most [`SAMPLE_LINES`] sample lines (default 65536);
    /// lines of further ones are counted, not stored.
    pub max_connections: usize,
    /// Distinct ranks kept (default 65536).
    pub max_ranks: usize,
    /// Files read (default 4096).
    pub max_files: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_bytes_per_file: 256 << 20,
            max_lines: 4_000_000,
            max_line_bytes: 4096,
            max_connections: 65536,
            max_ranks: 65536,
            max_files: 4096,
        }
    }
}

/// Why a log could not be read at all.
#[derive(Debug, thiserror::Error)]
pub enum NcclError {
    /// The file could not be opened or read.
    #[error("reading {path}: {source}", path = gdpath_topo::text::escape(.path))]
    Read {
        /// The file named.
        path: PathBuf,
        /// The operating system's reason.
        #[source]
        source: std::io::Error,
    },
    /// More files than [`Limits::max_files`].
    #[error("{given} log files given; at most {max} are read")]
    TooManyFiles {
        /// Files given.
        given: usize,
        /// The limit, [`Limits::max_files`].
        max: usize,
    },
    /// Not a regular file (a directory, FIFO or device would block or mean nothing); `what`:
    /// "a directory", "a FIFO", "a character device"…
    #[error("{path} is {what}, not a regular file", path = gdpath_topo::text::escape(.path))]
    NotAFile {
        /// The path given.
        path: PathBuf,
        /// What it is instead.
        what: &'static str,
    },
}

/// Sample lines kept per connection ([`Connection::samples`]); the rest are counted.
pub const SAMPLE_LINES: usize = 8;

/// Bytes of a kept line's text ([`LineRef::text`]): a sample, not the log.
pub const SAMPLE_BYTES: usize = 512;

/// Lines kept of each kind that is not a connection (GDR decisions, P2P refusals, `NIC
/// distance` lines, rank conflicts); later ones are counted in [`Job::other_dropped`].
pub const MAX_OTHER_LINES: usize = 1024;

/// A line of a log: which file, which line (1-based) and at most [`SAMPLE_BYTES`] of its text
/// (as read, unescaped; escape it before showing it on a terminal).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LineRef {
    /// Index of the file in [`Job::files`].
    pub file: usize,
    /// Line number in it, 1-based.
    pub line: u64,
    /// The line's text as read (unescaped), cut to [`SAMPLE_BYTES`] at a character boundary.
    pub text: String,
    /// Whether `text` was cut (the line is longer); absent from JSON when false.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub cut: bool,
}

impl LineRef {
    /// A reference to line `line` of file `file`, keeping at most [`SAMPLE_BYTES`] of `text`.
    pub fn new(file: usize, line: u64, text: &str) -> LineRef {
        let kept = cut(text);
        LineRef {
            file,
            line,
            text: kept.to_owned(),
            cut: kept.len() < text.len(),
        }
    }
}

/// The first [`SAMPLE_BYTES`] of `text`, cut at a character boundary.
fn cut(text: &str) -> &str {
    let mut end = text.len().min(SAMPLE_BYTES);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// What is known of one rank.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct RankInfo {
    /// Host name as NCCL printed it.
    pub host: Option<String>,
    /// Process id.
    pub pid: Option<u64>,
    /// CUDA device ordinal (`cudaDev`).
    pub cuda_dev: Option<u32>,
    /// NVML device index (`nvmlDev`, 2.7 on).
    pub nvml_dev: Option<u32>,
    /// PCI address (`0000:c7:00.0`) from a `busId` or a pre-2.12 `[busid]` tag.
    pub pci: Option<String>,
}

/// One connection as the log names it: a (source rank, destination rank, direction, `via`)
/// and every line naming it, kept as a count, the channels and at most [`SAMPLE_LINES`]
/// sample lines, so that what is kept grows with the distinct connections, not the log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Connection {
    /// Sending rank.
    pub src: u32,
    /// Receiving rank.
    pub dst: u32,
    /// `[send]` or `[receive]` on NET lines; `None` on P2P and SHM lines.
    pub dir: Option<Direction>,
    /// The text after `via`, trimmed (at most [`SAMPLE_BYTES`] of it).
    pub via: String,
    /// The transport that text names.
    pub transport: Transport,
    /// Lines naming it.
    pub lines: u64,
    /// Channels (or rings, in 2.4) named, ascending; at most [`MAX_CHANNELS`] of them.
    pub channels: Vec<u32>,
    /// The first lines naming it, at most [`SAMPLE_LINES`], in log order (`lines` counts all).
    pub samples: Vec<LineRef>,
}

/// The most channels listed per connection or pair: NCCL opens at most 64 (`MAXCHANNELS`), so
/// a log naming more is not NCCL's, and keeping them all would let a hostile log grow the list
/// (and its sorted inserts) with its lines.
pub const MAX_CHANNELS: usize = 64;

/// Adds `ch` to the ascending `list` unless it is there or the list holds [`MAX_CHANNELS`].
pub(crate) fn add_channel(list: &mut Vec<u32>, ch: u32) {
    if list.len() < MAX_CHANNELS {
        if let Err(i) = list.binary_search(&ch) {
            list.insert(i, ch);
        }
    }
}

impl Connection {
    /// The rank that wrote the lines, whose GPU and network device they name: the receiver of
    /// a `[receive]` line, else the sender (NCCL logs P2P and SHM connections on the sending
    /// side).
    pub fn logger(&self) -> u32 {
        if self.dir == Some(Direction::Receive) {
            self.dst
        } else {
            self.src
        }
    }

    /// The first line naming it (`None` only for a connection built without samples).
    pub fn first(&self) -> Option<&LineRef> {
        self.samples.first()
    }
}

/// A GDR decision line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GdrDecision {
    /// The line.
    pub at: LineRef,
    /// `Enabled` (true) or `Disabled` (false).
    pub enabled: bool,
    /// The network plugin's name, where the line has a `NET/<net> :` prefix (2.8 on).
    pub net: Option<String>,
    /// NCCL's HCA number, if printed.
    pub hca: Option<u32>,
    /// The HCA's RDMA device name (`mlx5_0`), if printed (2.8 on).
    pub hca_name: Option<String>,
    /// The GPU's bus id as NCCL printed it (`ca000`), if printed (2.4–2.7).
    pub gpu: Option<String>,
    /// The parenthesised reason NCCL gave (`no module`, `distance 7 > 4`), if any.
    pub reason: Option<String>,
}

/// Where a line is, without its text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct LineNo {
    /// Index of the file in [`Job::files`].
    pub file: usize,
    /// Line number in it, 1-based.
    pub line: u64,
}

/// A rank the log gives two different GPUs: the first value is kept in [`Job::ranks`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RankConflict {
    /// The rank.
    pub rank: u32,
    /// What differs: `nvml_dev` or `pci`.
    pub what: &'static str,
    /// The value kept (first seen).
    pub kept: String,
    /// The other value, not kept.
    pub other: String,
    /// The line that gave the kept value, where known.
    pub first: Option<LineNo>,
    /// The line that gave the other value.
    pub at: LineRef,
}

/// What the log lines say about the job.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Job {
    /// The files read, in the order given.
    pub files: Vec<String>,
    /// NCCL's version (`NCCL version 2.x.y`), first seen.
    pub version: Option<String>,
    /// Ranks in the communicator (`nranks`), first seen.
    pub nranks: Option<u32>,
    /// What is known of each rank, by rank.
    pub ranks: BTreeMap<u32, RankInfo>,
    /// Host names seen in line prefixes.
    pub hosts: BTreeSet<String>,
    /// `Using network X` and the networks of NET connections.
    pub networks: BTreeSet<String>,
    /// Connections in the order first seen, up to [`Limits::max_connections`].
    pub connections: Vec<Connection>,
    /// GDR decision lines.
    pub gdr: Vec<GdrDecision>,
    /// `NCCL_*` set by the environment (or `nccl.conf`), first value and line each.
    pub env: BTreeMap<String, (String, LineRef)>,
    /// Pairs of CUDA devices NCCL's P2P check refused, with the line.
    pub p2p_refused: Vec<(u32, u32, LineRef)>,
    /// NCCL's IB devices by number (`NET/IB : Using [0]mlx5_0:1/RoCE …`): the RDMA device name
    /// that `via NET/IB/<N>` means (a fused device's first member), with the line.
    pub ib_devices: BTreeMap<u32, (String, LineRef)>,
    /// `NIC distance :` lines of 2.4–2.5.
    pub nic_distance: Vec<LineRef>,
    /// NCCL WARN lines (the first 100).
    pub warnings: Vec<LineRef>,
    /// Lines read, over all files.
    pub lines_read: u64,
    /// Bytes read, over all files.
    pub bytes_read: u64,
    /// Lines with bytes that are not UTF-8 (read lossily) or control characters.
    pub binary_lines: u64,
    /// Connection lines of connections beyond [`Limits::max_connections`] (counted only).
    pub connections_dropped: u64,
    /// Ranks the log gives two different GPUs (NVML index or bus id), the first kept; at most
    /// [`MAX_OTHER_LINES`].
    pub conflicts: Vec<RankConflict>,
    /// GDR decisions, P2P refusals, `NIC distance` lines and rank conflicts beyond
    /// [`MAX_OTHER_LINES`] each (counted only).
    pub other_dropped: u64,
    /// Which limit stopped the reading, if one did.
    pub truncated: Vec<String>,
}

/// Reads every log file with `limits` and parses it into one [`Job`].
pub fn read_logs(paths: &[PathBuf], limits: Limits) -> Result<Job, NcclError> {
    if paths.len() > limits.max_files {
        return Err(NcclError::TooManyFiles {
            given: paths.len(),
            max: limits.max_files,
        });
    }
    let mut p = Parser::new(limits);
    for path in paths {
        // The engine's open: a FIFO, device or directory is refused before any open, and one
        // swapped in after the check neither blocks the open nor is read.
        let f = gdpath::file::open_regular(path, std::fs::OpenOptions::new().read(true).clone(), 0)
            .map_err(|e| match e {
                gdpath::file::Error::NotAFile { what, .. } => NcclError::NotAFile {
                    path: path.clone(),
                    what,
                },
                gdpath::file::Error::Open { source, .. } => NcclError::Read {
                    path: path.clone(),
                    source: std::io::Error::new(source.kind(), source.to_string()),
                },
                other => NcclError::Read {
                    path: path.clone(),
                    source: std::io::Error::other(other.to_string()),
                },
            })?;
        let meta = f.metadata().map_err(|source| NcclError::Read {
            path: path.clone(),
            source,
        })?;
        p.read(
            &path_name(path),
            f.take(limits.max_bytes_per_file),
            meta.len(),
        )
        .map_err(|source| NcclError::Read {
            path: path.clone(),
            source,
        })?;
    }
    Ok(p.finish())
}

/// Parses logs held in memory (`(name, bytes)`), with the same bounds as [`read_logs`].
pub fn parse_logs(logs: &[(&str, &[u8])], limits: Limits) -> Job {
    let mut p = Parser::new(limits);
    for (name, bytes) in logs {
        let take = (bytes.len() as u64).min(limits.max_bytes_per_file) as usize;
        // Reading from memory cannot fail.
        let _ = p.read(name, &bytes[..take], bytes.len() as u64);
    }
    p.finish()
}

fn path_name(p: &Path) -> String {
    p.display().to_string()
}

struct Parser {
    limits: Limits,
    job: Job,
    /// Index in `job.connections` of each (src, dst, dir, via).
    seen: HashMap<(u32, u32, Option<Direction>, String), usize>,
    /// The line that first gave each rank's NVML index and bus id.
    gpu_from: HashMap<(u32, &'static str), LineNo>,
    /// The (rank, what, other value) of the conflicts kept, so that a repeat is not kept twice.
    conflicts_seen: HashSet<(u32, &'static str, String)>,
}

impl Parser {
    fn new(limits: Limits) -> Self {
        Parser {
            limits,
            job: Job::default(),
            seen: HashMap::new(),
            gpu_from: HashMap::new(),
            conflicts_seen: HashSet::new(),
        }
    }

    /// Reads lines of at most `max_line_bytes` from `r`; the rest of a longer line is read and
    /// dropped, so memory stays bounded whatever the input.
    fn read(&mut self, name: &str, r: impl Read, size: u64) -> std::io::Result<()> {
        let file = self.job.files.len();
        self.job.files.push(name.to_owned());
        let mut r = std::io::BufReader::with_capacity(64 << 10, r);
        let mut buf: Vec<u8> = Vec::with_capacity(self.limits.max_line_bytes);
        let mut line_no = 0u64;
        let mut read_here = 0u64;
        loop {
            if self.job.lines_read >= self.limits.max_lines {
                self.note_truncated(format!(
                    "stopped after {} lines (at most {} are read)",
                    self.job.lines_read, self.limits.max_lines
                ));
                return Ok(());
            }
            buf.clear();
            let (n, ended) = read_line_capped(&mut r, &mut buf, self.limits.max_line_bytes)?;
            if n == 0 {
                break;
            }
            read_here += n;
            self.job.bytes_read += n;
            line_no += 1;
            self.job.lines_read += 1;
            let _ = ended;
            self.line(file, line_no, &buf);
        }
        if size > read_here && read_here >= self.limits.max_bytes_per_file {
            self.note_truncated(format!(
                "{}: read the first {} of {} bytes",
                name, read_here, size
            ));
        }
        Ok(())
    }

    fn note_truncated(&mut self, why: String) {
        if !self.job.truncated.contains(&why) {
            self.job.truncated.push(why);
        }
    }

    fn line(&mut self, file: usize, line: u64, bytes: &[u8]) {
        let text = String::from_utf8_lossy(bytes);
        let text = text.trim_end_matches(['\n', '\r']);
        if std::str::from_utf8(bytes).is_err() || text.chars().any(|c| c.is_control() && c != '\t')
        {
            self.job.binary_lines += 1;
        }
        let at = || LineRef::new(file, line, text);
        let no = LineNo { file, line };
        if self.job.version.is_none() {
            if let Some(v) = parse::version(text) {
                self.job.version = Some(v);
                return;
            }
        }
        let s = parse::split(text);
        let msg = s.message;
        if s.warn {
            if self.job.warnings.len() < 100 {
                self.job.warnings.push(at());
            }
            return;
        }
        if let Some(host) = &s.prefix.host {
            if self.job.hosts.len() < self.limits.max_ranks && !self.job.hosts.contains(host) {
                self.job.hosts.insert(host.clone());
            }
        }
        if let Some(c) = parse::connection(msg) {
            self.connection(c, &s.prefix, no, at);
        } else if let Some(g) = parse::gdr(msg) {
            let d = GdrDecision {
                at: at(),
                enabled: g.enabled,
                net: g.net,
                hca: g.hca,
                hca_name: g.hca_name,
                gpu: g.gpu,
                reason: g.reason,
            };
            keep(&mut self.job.gdr, d, &mut self.job.other_dropped);
        } else if let Some((k, v)) = parse::env(msg) {
            if !self.job.env.contains_key(&k) && self.job.env.len() < 256 {
                self.job.env.insert(k, (v, at()));
            }
        } else if let Some((a, b)) = parse::p2p_refused(msg) {
            keep(
                &mut self.job.p2p_refused,
                (a, b, at()),
                &mut self.job.other_dropped,
            );
        } else if let Some(c) = parse::comm(msg) {
            if let Some(rank) = c.rank {
                self.job.nranks = self.job.nranks.or(c.nranks);
                let pci = c.bus_id.as_deref().and_then(parse::bus_id_to_pci);
                self.gpu(rank, "nvml_dev", c.nvml_dev.map(|d| d.to_string()), no, &at);
                self.gpu(rank, "pci", pci, no, &at);
                if let Some(info) = self.rank(rank) {
                    info.cuda_dev = info.cuda_dev.or(c.cuda_dev);
                    if info.host.is_none() {
                        info.host = s.prefix.host.clone();
                        info.pid = s.prefix.pid;
                    }
                }
            }
        } else if let Some(devs) = parse::ib_devices(msg) {
            for (n, name) in devs {
                if self.job.ib_devices.len() < 64 {
                    self.job.ib_devices.entry(n).or_insert_with(|| (name, at()));
                }
            }
        } else if let Some(n) = parse::network(msg) {
            if self.job.networks.len() < 16 {
                self.job.networks.insert(n);
            }
        } else if msg.contains("NIC distance :") {
            keep(
                &mut self.job.nic_distance,
                at(),
                &mut self.job.other_dropped,
            );
        }
    }

    fn rank(&mut self, rank: u32) -> Option<&mut RankInfo> {
        if !self.job.ranks.contains_key(&rank) && self.job.ranks.len() >= self.limits.max_ranks {
            self.note_truncated(format!("more than {} ranks", self.limits.max_ranks));
            return None;
        }
        Some(self.job.ranks.entry(rank).or_default())
    }

    fn connection(
        &mut self,
        c: parse::Connection,
        prefix: &parse::Prefix,
        no: LineNo,
        at: impl Fn() -> LineRef,
    ) {
        // The rank that wrote the line: the receiver of a `[receive]` line, else the sender
        // (NCCL logs P2P and SHM connections on the sending side).
        let logger = if c.dir == Some(Direction::Receive) {
            c.dst.rank
        } else {
            c.src.rank
        };
        // Before 2.12 the tag is a bus id (hex, more than two digits); after, a device index.
        for p in [&c.src, &c.dst] {
            if let Some(t) = &p.tag {
                if t.len() > 2 {
                    self.gpu(p.rank, "pci", parse::bus_id_to_pci(t), no, &at);
                } else {
                    let nvml = t.parse::<u32>().ok().map(|d| d.to_string());
                    self.gpu(p.rank, "nvml_dev", nvml, no, &at);
                }
            }
            let is_logger = p.rank == logger;
            if let Some(info) = self.rank(p.rank) {
                if is_logger && info.host.is_none() {
                    info.host = prefix.host.clone();
                    info.pid = prefix.pid;
                    info.cuda_dev = info.cuda_dev.or(prefix.cuda_dev);
                }
            }
        }
        // A `via` longer than a sample is no NCCL transport; cut, it still names one connection.
        let via = cut(&c.via).to_owned();
        let key = (c.src.rank, c.dst.rank, c.dir, via);
        if let Some(&i) = self.seen.get(&key) {
            let Some(kept) = self.job.connections.get_mut(i) else {
                return;
            };
            kept.lines += 1;
            add_channel(&mut kept.channels, c.channel);
            if kept.samples.len() < SAMPLE_LINES {
                kept.samples.push(at());
            }
            return;
        }
        if self.job.connections.len() >= self.limits.max_connections {
            self.job.connections_dropped += 1;
            self.note_truncated(format!(
                "more than {} distinct connections (the lines of the rest counted, not kept)",
                self.limits.max_connections
            ));
            return;
        }
        let transport = parse::transport(&key.3);
        if let Transport::Net { net, .. } = &transport {
            if self.job.networks.len() < 16 {
                self.job.networks.insert(net.clone());
            }
        }
        self.seen.insert(key.clone(), self.job.connections.len());
        self.job.connections.push(Connection {
            src: key.0,
            dst: key.1,
            dir: key.2,
            via: key.3,
            transport,
            lines: 1,
            channels: vec![c.channel],
            samples: vec![at()],
        });
    }

    /// Records rank `rank`'s GPU as `what` (`nvml_dev` or `pci`) gives it on line `no`: the
    /// first value is kept, and a different later one is a conflict (the log is inconsistent).
    fn gpu(
        &mut self,
        rank: u32,
        what: &'static str,
        value: Option<String>,
        no: LineNo,
        at: &impl Fn() -> LineRef,
    ) {
        let Some(value) = value else {
            return;
        };
        let Some(info) = self.rank(rank) else {
            return;
        };
        let kept = match what {
            "pci" => info.pci.clone(),
            _ => info.nvml_dev.map(|d| d.to_string()),
        };
        let Some(kept) = kept else {
            match what {
                "pci" => info.pci = Some(value),
                _ => info.nvml_dev = value.parse().ok(),
            }
            self.gpu_from.insert((rank, what), no);
            return;
        };
        if kept == value || self.conflicts_seen.contains(&(rank, what, value.clone())) {
            return;
        }
        if self.conflicts_seen.len() < MAX_OTHER_LINES {
            self.conflicts_seen.insert((rank, what, value.clone()));
        }
        let conflict = RankConflict {
            rank,
            what,
            kept,
            other: value,
            first: self.gpu_from.get(&(rank, what)).copied(),
            at: at(),
        };
        keep(
            &mut self.job.conflicts,
            conflict,
            &mut self.job.other_dropped,
        );
    }

    fn finish(mut self) -> Job {
        if self.job.other_dropped > 0 {
            self.note_truncated(format!(
                "{} GDR, P2P refusal, NIC distance or rank conflict line(s) past the first {} of their kind counted, not kept",
                self.job.other_dropped, MAX_OTHER_LINES
            ));
        }
        self.job
    }
}

/// Pushes `item` onto `v` unless it holds [`MAX_OTHER_LINES`] already; then counts it.
fn keep<T>(v: &mut Vec<T>, item: T, dropped: &mut u64) {
    if v.len() < MAX_OTHER_LINES {
        v.push(item);
    } else {
        *dropped += 1;
    }
}

/// Reads one line into `buf`, keeping at most `cap` bytes of it and discarding the rest up to
/// the newline. Returns (bytes consumed, whether a newline ended it).
fn read_line_capped(
    r: &mut impl std::io::BufRead,
    buf: &mut Vec<u8>,
    cap: usize,
) -> std::io::Result<(u64, bool)> {
    let mut consumed = 0u64;
    loop {
        let chunk = match r.fill_buf() {
            Ok(c) => c,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if chunk.is_empty() {
            return Ok((consumed, false));
        }
        let (take, done) = match chunk.iter().position(|&b| b == b'\n') {
            Some(i) => (i + 1, true),
            None => (chunk.len(), false),
        };
        let room = cap.saturating_sub(buf.len());
        buf.extend_from_slice(&chunk[..take.min(room)]);
        r.consume(take);
        consumed += take as u64;
        if done {
            return Ok((consumed, true));
        }
    }
}
