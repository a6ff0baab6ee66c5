//! The engine's metrics: counters, gauges and histograms of what the data paths did, kept in
//! atomics and read as a [`Snapshot`] (the `gdpath-metrics` crate turns one into the Prometheus
//! text format; docs/metrics.md names every metric).
//!
//! The engine updates them where the events happen: a pair's completion (bytes and pairs by
//! op, path, peer and outcome; fallbacks by finding id; the pair's duration), a post (its cost
//! per descriptor; transfers in flight), a registration (registered bytes by kind and device),
//! a connection to a peer agent opening or closing, an error returned by the agent's API.
//!
//! Nothing here takes a lock on the posting path: every cell is an atomic preallocated for a
//! fixed label set. Labels that come from outside (peers' agent names, UCX transport names,
//! finding ids, error kinds) go through a bounded table ([`Names`]): the first
//! [`MAX_PEERS`] / [`MAX_TRANSPORTS`] / … distinct values get a label of their own, later ones
//! share the label `other`, so that no input makes the exposition grow without bound. Taking
//! a new value into a table takes its lock once; a value already in it is found by a scan.
//!
//! The metrics are the process's (every agent adds to the same cells): that is what one scrape
//! of a process reports. `GDPATH_METRICS=0` in the environment at the first update turns every
//! update off (for measuring their cost, `bench/metrics-overhead.sh`).

use crate::error::Error;
use crate::finding::FindingId;
use crate::memory_kind::MemoryKind;
// Named as on main, where the enum is `DataPath`: a merge changes only this line.
use crate::path::DataPath;
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicU8, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

/// Distinct peer agents counted under their own name; later ones are `other`.
pub const MAX_PEERS: usize = 32;
/// Distinct UCX transport names per path family (`ucx:…`, `gdr:…`); later ones are
/// `ucx:other` / `gdr:other`.
pub const MAX_TRANSPORTS: usize = 8;
/// Distinct finding ids counted under their own id; later ones are `other`.
pub const MAX_FINDINGS: usize = 32;
/// Distinct error kinds ([`Error::kind`]); the engine has fewer, so `other` never appears.
pub const MAX_ERROR_KINDS: usize = 64;
/// GPU ordinals with a `device` label of their own (0 to 15); higher ones are `other`.
pub const MAX_GPUS: usize = 16;
/// Longest label value taken from outside (a peer's name), in bytes: longer ones are cut.
pub const MAX_LABEL_BYTES: usize = 64;

/// The label for values past a table's bound.
pub const OTHER: &str = "other";
/// The peer label of pairs that stay on this node (no peer agent).
pub const LOCAL_PEER: &str = "local";

/// The paths with a fixed name, in [`DataPath::name`] order of the enum.
const FIXED_PATHS: [&str; 13] = [
    "p2p-nvlink",
    "p2p-pcie",
    "device-local",
    "h2d-pinned",
    "h2d-pageable",
    "d2h-pinned",
    "d2h-pageable",
    "staged",
    "gds-native",
    "gds-compat",
    "posix-direct",
    "posix-buffered",
    "host-copy",
];
/// DataPath cells: the fixed paths, then `ucx:` transports and `ucx:other`, then `gdr:` ones.
const PATHS: usize = FIXED_PATHS.len() + 2 * (MAX_TRANSPORTS + 1);
/// Peer cells: `local`, the named peers, `other`.
const PEERS: usize = MAX_PEERS + 2;
const OPS: usize = 2;
const OUTCOMES: usize = 2;
const OUTCOME_NAMES: [&str; OUTCOMES] = ["ok", "error"];

/// Upper bounds of the pair-duration histogram's buckets, seconds: 1 µs × 4ⁿ up to about 17 s
/// (a host copy of one block to a multi-gigabyte file read).
pub const DURATION_BUCKETS: [f64; 13] = [
    1e-6, 4e-6, 1.6e-5, 6.4e-5, 2.56e-4, 1.024e-3, 4.096e-3, 1.6384e-2, 6.5536e-2, 0.262_144,
    1.048_576, 4.194_304, 16.777_216,
];
/// Upper bounds of the posting-cost histogram's buckets, seconds per descriptor: 10 ns to
/// 100 µs (a block list posts in tens of nanoseconds a descriptor; a network put in µs).
pub const POST_COST_BUCKETS: [f64; 9] = [1e-8, 3e-8, 1e-7, 3e-7, 1e-6, 3e-6, 1e-5, 3e-5, 1e-4];

/// A table of at most `N` label values, filled in first-seen order; index `N` is `other`.
pub struct Names<const N: usize> {
    slots: [OnceLock<Box<str>>; N],
    add: Mutex<()>,
    /// Times `index` took the lock, so tests can see the lock-free path hit.
    #[cfg(test)]
    locked: std::sync::atomic::AtomicUsize,
}

impl<const N: usize> Default for Names<N> {
    fn default() -> Self {
        Names {
            slots: std::array::from_fn(|_| OnceLock::new()),
            add: Mutex::new(()),
            #[cfg(test)]
            locked: std::sync::atomic::AtomicUsize::new(0),
        }
    }
}

impl<const N: usize> Names<N> {
    /// The index of `value` (cleaned by [`label_value`]), adding it when there is room; `N`
    /// (the `other` bucket) when the table is full. Only a value whose cleaned form has no
    /// slot yet takes the table's lock.
    pub fn index(&self, value: &str) -> usize {
        let mut buf = [0u8; MAX_CLEAN_BYTES];
        let clean = clean_into(value, &mut buf);
        if let Some(i) = self.find(clean) {
            return i;
        }
        let _g = self.add.lock().unwrap_or_else(|p| p.into_inner());
        #[cfg(test)]
        self.locked.fetch_add(1, Ordering::Relaxed);
        for (i, s) in self.slots.iter().enumerate() {
            match s.get() {
                Some(v) if **v == *clean => return i,
                Some(_) => {}
                None => {
                    let _ = s.set(clean.into());
                    return i;
                }
            }
        }
        N
    }

    /// The index of the cleaned value `clean` when the table has it, without a lock. Slots
    /// fill in order under the lock, so the first empty one ends the scan.
    fn find(&self, clean: &str) -> Option<usize> {
        for (i, s) in self.slots.iter().enumerate() {
            match s.get() {
                Some(v) if **v == *clean => return Some(i),
                Some(_) => {}
                None => return None,
            }
        }
        None
    }

    /// The label of index `i`: its value, or `other` for `N`; `None` for an empty slot.
    pub fn name(&self, i: usize) -> Option<&str> {
        if i == N {
            return Some(OTHER);
        }
        self.slots.get(i)?.get().map(|b| &**b)
    }

    /// How many values have a slot.
    pub fn len(&self) -> usize {
        self.slots.iter().take_while(|s| s.get().is_some()).count()
    }

    /// True when no value has a slot yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Label values with a meaning of their own in the exposition: the overflow bucket and the
/// peer label of node-local pairs. An outside value equal to one gets a `_` in front, so no
/// peer can pass for either.
pub const RESERVED_LABELS: [&str; 2] = [OTHER, LOCAL_PEER];

/// Longest label value [`label_value`] makes, bytes: the cut plus a reserved word's `_`.
const MAX_CLEAN_BYTES: usize = MAX_LABEL_BYTES + 1;

/// `value` as a label value: printable ASCII and spaces other than `"` and `\` kept, anything
/// else `_`, cut to [`MAX_LABEL_BYTES`] characters (a peer's name is untrusted input that ends
/// up on dashboards), and a [`RESERVED_LABELS`] word prefixed with `_`.
pub fn label_value(value: &str) -> String {
    let mut buf = [0u8; MAX_CLEAN_BYTES];
    clean_into(value, &mut buf).to_owned()
}

/// [`label_value`] written into `buf`, without allocating: the posting path cleans every
/// peer name before looking it up, so that names that need cleaning hit the lock-free path.
fn clean_into<'b>(value: &str, buf: &'b mut [u8; MAX_CLEAN_BYTES]) -> &'b str {
    // buf[0] is kept for the `_` in front of a reserved word.
    let mut n = 1;
    for c in value.chars().take(MAX_LABEL_BYTES) {
        buf[n] = if (c.is_ascii_graphic() || c == ' ') && c != '"' && c != '\\' {
            c as u8
        } else {
            b'_'
        };
        n += 1;
    }
    let reserved = RESERVED_LABELS.iter().any(|r| r.as_bytes() == &buf[1..n]);
    let start = if reserved {
        buf[0] = b'_';
        0
    } else {
        1
    };
    // Every byte written is ASCII, so this never fails.
    std::str::from_utf8(&buf[start..n]).unwrap_or_default()
}

/// A histogram of fixed buckets: per-bucket counts (the last is +Inf), the sum in ns.
struct Histogram<const B: usize> {
    buckets: [AtomicU64; B],
    sum_ns: AtomicU64,
}

impl<const B: usize> Default for Histogram<B> {
    fn default() -> Self {
        Histogram {
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            sum_ns: AtomicU64::new(0),
        }
    }
}

impl<const B: usize> Histogram<B> {
    /// Counts `secs` (given as `ns` too, for the sum) in the first bucket whose bound holds it.
    fn observe(&self, bounds: &[f64], ns: u64) {
        // A division, correctly rounded, gives a bound's own value for its nanoseconds
        // (1000 ns is exactly the `1e-6` bound; `* 1e-9` would land above it).
        let secs = ns as f64 / 1e9;
        let i = bounds.iter().position(|&b| secs <= b).unwrap_or(B - 1);
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }

    fn value(&self, bounds: &[f64]) -> Option<Value> {
        let counts: Vec<u64> = self
            .buckets
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .collect();
        let count: u64 = counts.iter().sum();
        if count == 0 {
            return None;
        }
        let buckets = bounds
            .iter()
            .copied()
            .chain([f64::INFINITY])
            .zip(counts)
            .collect();
        Some(Value::Histogram {
            sum: self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9,
            count,
            buckets,
        })
    }
}

/// Bytes and pairs of one (op, path, peer, outcome).
#[derive(Default)]
struct Cell {
    bytes: AtomicU64,
    pairs: AtomicU64,
}

/// Every cell of the engine's metrics.
struct Metrics {
    peers: Names<MAX_PEERS>,
    ucx: Names<MAX_TRANSPORTS>,
    gdr: Names<MAX_TRANSPORTS>,
    findings: Names<MAX_FINDINGS>,
    error_kinds: Names<MAX_ERROR_KINDS>,
    /// [op][path][peer][outcome], flattened ([`cell_index`]).
    cells: Box<[Cell]>,
    /// [finding][path]: bytes and pairs that took a fallback (or degraded) path.
    fallbacks: Box<[Cell]>,
    /// [path]: duration of each completed pair.
    durations: Box<[Histogram<{ DURATION_BUCKETS.len() + 1 }>]>,
    /// Whole transfers, from post to the last pair's completion.
    transfer_duration: Histogram<{ DURATION_BUCKETS.len() + 1 }>,
    /// [op]: posting cost per descriptor.
    post_cost: [Histogram<{ POST_COST_BUCKETS.len() + 1 }>; OPS],
    /// [host-pageable, host-pinned, gpu 0..MAX_GPUS, gpu other]: registered bytes.
    registered: [AtomicI64; MAX_GPUS + 3],
    in_flight: AtomicI64,
    peers_connected: AtomicI64,
    errors: [AtomicU64; MAX_ERROR_KINDS + 1],
}

impl Metrics {
    fn new() -> Metrics {
        Metrics {
            peers: Names::default(),
            ucx: Names::default(),
            gdr: Names::default(),
            findings: Names::default(),
            error_kinds: Names::default(),
            cells: (0..OPS * PATHS * PEERS * OUTCOMES)
                .map(|_| Cell::default())
                .collect(),
            fallbacks: (0..(MAX_FINDINGS + 1) * PATHS)
                .map(|_| Cell::default())
                .collect(),
            durations: (0..PATHS).map(|_| Histogram::default()).collect(),
            transfer_duration: Histogram::default(),
            post_cost: std::array::from_fn(|_| Histogram::default()),
            registered: std::array::from_fn(|_| AtomicI64::new(0)),
            in_flight: AtomicI64::new(0),
            peers_connected: AtomicI64::new(0),
            errors: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }

    /// The cell index of a path.
    fn path_index(&self, path: &DataPath) -> usize {
        let fixed = FIXED_PATHS.len();
        match path {
            DataPath::P2pNvlink => 0,
            DataPath::P2pPcie => 1,
            DataPath::DeviceLocal => 2,
            DataPath::HostToDevice { pinned: true } => 3,
            DataPath::HostToDevice { pinned: false } => 4,
            DataPath::DeviceToHost { pinned: true } => 5,
            DataPath::DeviceToHost { pinned: false } => 6,
            DataPath::Staged => 7,
            DataPath::GdsNative => 8,
            DataPath::GdsCompat => 9,
            DataPath::PosixDirect => 10,
            DataPath::PosixBuffered => 11,
            DataPath::HostCopy => 12,
            DataPath::Ucx { transport } => fixed + self.ucx.index(transport),
            DataPath::Gdr { transport } => fixed + MAX_TRANSPORTS + 1 + self.gdr.index(transport),
        }
    }

    /// The label of path cell `i`, `None` for a transport slot not yet used.
    fn path_name(&self, i: usize) -> Option<String> {
        let fixed = FIXED_PATHS.len();
        if i < fixed {
            return Some(FIXED_PATHS[i].to_owned());
        }
        let j = i - fixed;
        if j <= MAX_TRANSPORTS {
            self.ucx.name(j).map(|t| format!("ucx:{t}"))
        } else {
            self.gdr
                .name(j - MAX_TRANSPORTS - 1)
                .map(|t| format!("gdr:{t}"))
        }
    }

    fn peer_index(&self, peer: Option<&str>) -> usize {
        match peer {
            None => 0,
            Some(name) => 1 + self.peers.index(name),
        }
    }

    fn peer_name(&self, i: usize) -> Option<&str> {
        if i == 0 {
            Some(LOCAL_PEER)
        } else {
            self.peers.name(i - 1)
        }
    }
}

fn cell_index(op: usize, path: usize, peer: usize, outcome: usize) -> usize {
    ((op * PATHS + path) * PEERS + peer) * OUTCOMES + outcome
}

/// The op cell: `write` for [`crate::Op::Write`], else [`crate::Op::Read`] (a bool, so that
/// this module sits below the transfer core that calls it).
fn op_index(write: bool) -> usize {
    usize::from(write)
}
const OP_NAMES: [&str; OPS] = ["read", "write"];

/// The metrics, made at the first update; `None` when `GDPATH_METRICS=0`.
fn metrics() -> Option<&'static Metrics> {
    static M: OnceLock<Option<Metrics>> = OnceLock::new();
    // Checked first without the `OnceLock` for the off switch's sake: one relaxed load.
    static OFF: AtomicU8 = AtomicU8::new(2);
    match OFF.load(Ordering::Relaxed) {
        1 => return None,
        0 => return M.get().and_then(Option::as_ref),
        _ => {}
    }
    let m = M.get_or_init(|| {
        let off = std::env::var_os("GDPATH_METRICS").is_some_and(|v| v == "0");
        (!off).then(Metrics::new)
    });
    OFF.store(u8::from(m.is_none()), Ordering::Relaxed);
    m.as_ref()
}

/// True unless `GDPATH_METRICS=0` turned the metrics off for this process.
pub fn enabled() -> bool {
    metrics().is_some()
}

/// A completed descriptor pair of a read or a `write`: `len` bytes on `path` (moved when `ok`, not moved when not),
/// in `elapsed`; `peer` is the peer agent's name for pairs on remote memory; `finding` is why
/// the preferred path was not taken.
pub(crate) fn pair_done(
    write: bool,
    path: &DataPath,
    peer: Option<&str>,
    finding: Option<&FindingId>,
    ok: bool,
    len: u64,
    elapsed: Duration,
) {
    let Some(m) = metrics() else { return };
    let p = m.path_index(path);
    let c = &m.cells[cell_index(op_index(write), p, m.peer_index(peer), usize::from(!ok))];
    c.bytes.fetch_add(len, Ordering::Relaxed);
    c.pairs.fetch_add(1, Ordering::Relaxed);
    if let Some(f) = finding {
        let c = &m.fallbacks[m.findings.index(f.as_str()) * PATHS + p];
        c.bytes.fetch_add(len, Ordering::Relaxed);
        c.pairs.fetch_add(1, Ordering::Relaxed);
    }
    if ok {
        m.durations[p].observe(&DURATION_BUCKETS, duration_ns(elapsed));
    }
}

/// A post (a read or a `write`) of `descriptors` pairs that cost `cost` of the posting thread's time.
pub(crate) fn posted(write: bool, descriptors: usize, cost: Duration) {
    let Some(m) = metrics() else { return };
    if descriptors > 0 {
        let per = duration_ns(cost) / descriptors as u64;
        m.post_cost[op_index(write)].observe(&POST_COST_BUCKETS, per);
    }
}

/// A transfer of at least one pair started (`+1`) or ended, its last pair done (`-1`, with
/// its duration from post).
pub(crate) fn transfer_started() {
    if let Some(m) = metrics() {
        m.in_flight.fetch_add(1, Ordering::Relaxed);
    }
}

/// See [`transfer_started`].
pub(crate) fn transfer_ended(elapsed: Duration) {
    if let Some(m) = metrics() {
        m.in_flight.fetch_sub(1, Ordering::Relaxed);
        m.transfer_duration
            .observe(&DURATION_BUCKETS, duration_ns(elapsed));
    }
}

/// An error the agent's API returned (a post, a registration, a connection) or a pair failed
/// with. Returns `e` so that it wraps an error where it is made.
pub(crate) fn error(e: Error) -> Error {
    if let Some(m) = metrics() {
        m.errors[m.error_kinds.index(e.kind())].fetch_add(1, Ordering::Relaxed);
    }
    e
}

/// Counts a registration of `bytes` of `kind` while alive: made when the memory is registered,
/// dropped with it. Files and peers' memory are not counted (no memory of this process).
pub(crate) struct Registered {
    cell: usize,
    bytes: i64,
}

impl Registered {
    pub(crate) fn new(kind: &MemoryKind, bytes: u64) -> Option<Registered> {
        let m = metrics()?;
        let cell = match kind {
            MemoryKind::Host { pinned: false } => 0,
            MemoryKind::Host { pinned: true } => 1,
            MemoryKind::Gpu { ordinal } => 2 + (*ordinal as usize).min(MAX_GPUS),
            MemoryKind::File | MemoryKind::Remote { .. } => return None,
        };
        let bytes = i64::try_from(bytes).unwrap_or(i64::MAX);
        m.registered[cell].fetch_add(bytes, Ordering::Relaxed);
        Some(Registered { cell, bytes })
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        if let Some(m) = metrics() {
            m.registered[self.cell].fetch_sub(self.bytes, Ordering::Relaxed);
        }
    }
}

/// Counts a connection to a peer agent while it is open.
pub(crate) struct PeerOpen(bool);

impl PeerOpen {
    pub(crate) fn new() -> PeerOpen {
        let m = metrics();
        if let Some(m) = m {
            m.peers_connected.fetch_add(1, Ordering::Relaxed);
        }
        PeerOpen(m.is_some())
    }
}

impl Drop for PeerOpen {
    fn drop(&mut self) {
        if let (true, Some(m)) = (self.0, metrics()) {
            m.peers_connected.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

fn duration_ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// The type of a metric family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up (the exposition adds `_total` to the name).
    Counter,
    /// Goes up and down.
    Gauge,
    /// Observations in fixed buckets, with their count and sum.
    Histogram,
}

/// One series' value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// A counter's value.
    Counter(u64),
    /// A gauge's value.
    Gauge(i64),
    /// A histogram: the sum of the observations (seconds), their count and the count per
    /// bucket (not cumulative), each with its upper bound (seconds; the last is +Inf).
    Histogram {
        /// The sum of the observations, seconds.
        sum: f64,
        /// How many observations.
        count: u64,
        /// Per bucket: its upper bound (seconds) and its observations (not cumulative).
        buckets: Vec<(f64, u64)>,
    },
}

/// One series: its labels and value.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Label names and values, in the family's label order.
    pub labels: Vec<(&'static str, String)>,
    /// The value.
    pub value: Value,
}

/// A metric family: name (without `_total` for counters), help text, type, series.
#[derive(Debug, Clone, PartialEq)]
pub struct Family {
    /// The name, e.g. `gdpath_bytes` (exposed as `gdpath_bytes_total`).
    pub name: &'static str,
    /// One line of help.
    pub help: &'static str,
    /// Counter, gauge or histogram.
    pub kind: Kind,
    /// The series with something to say (counters and histograms that are still zero, and
    /// label values not yet seen, are left out); gauges are always present.
    pub samples: Vec<Sample>,
}

/// Every metric family as it stands now (empty when `GDPATH_METRICS=0`). Reads each cell once,
/// without a lock; updates made meanwhile may or may not be in it.
pub fn snapshot() -> Vec<Family> {
    let Some(m) = metrics() else {
        return Vec::new();
    };
    let mut bytes = Vec::new();
    let mut pairs = Vec::new();
    for (op, op_name) in OP_NAMES.iter().enumerate() {
        for p in 0..PATHS {
            for peer in 0..PEERS {
                for (out, outcome) in OUTCOME_NAMES.iter().enumerate() {
                    let c = &m.cells[cell_index(op, p, peer, out)];
                    let n = c.pairs.load(Ordering::Relaxed);
                    if n == 0 {
                        continue;
                    }
                    let (Some(path), Some(peer)) = (m.path_name(p), m.peer_name(peer)) else {
                        continue;
                    };
                    let labels = vec![
                        ("op", (*op_name).to_owned()),
                        ("path", path),
                        ("peer", peer.to_owned()),
                        ("outcome", (*outcome).to_owned()),
                    ];
                    bytes.push(Sample {
                        labels: labels.clone(),
                        value: Value::Counter(c.bytes.load(Ordering::Relaxed)),
                    });
                    pairs.push(Sample {
                        labels,
                        value: Value::Counter(n),
                    });
                }
            }
        }
    }
    let mut fb_bytes = Vec::new();
    let mut fb_pairs = Vec::new();
    for f in 0..=MAX_FINDINGS {
        for p in 0..PATHS {
            let c = &m.fallbacks[f * PATHS + p];
            let n = c.pairs.load(Ordering::Relaxed);
            let (Some(finding), Some(path)) = (m.findings.name(f), m.path_name(p)) else {
                continue;
            };
            if n == 0 {
                continue;
            }
            let labels = vec![("finding", finding.to_owned()), ("path", path)];
            fb_bytes.push(Sample {
                labels: labels.clone(),
                value: Value::Counter(c.bytes.load(Ordering::Relaxed)),
            });
            fb_pairs.push(Sample {
                labels,
                value: Value::Counter(n),
            });
        }
    }
    let durations = (0..PATHS)
        .filter_map(|p| {
            let value = m.durations[p].value(&DURATION_BUCKETS)?;
            Some(Sample {
                labels: vec![("path", m.path_name(p)?)],
                value,
            })
        })
        .collect();
    let post_cost = (0..OPS)
        .filter_map(|op| {
            Some(Sample {
                labels: vec![("op", OP_NAMES[op].to_owned())],
                value: m.post_cost[op].value(&POST_COST_BUCKETS)?,
            })
        })
        .collect();
    let registered = (0..m.registered.len())
        .map(|i| {
            let (kind, device) = match i {
                0 => ("host-pageable", "host".to_owned()),
                1 => ("host-pinned", "host".to_owned()),
                i if i - 2 < MAX_GPUS => ("gpu", (i - 2).to_string()),
                _ => ("gpu", OTHER.to_owned()),
            };
            Sample {
                labels: vec![("kind", kind.to_owned()), ("device", device)],
                value: Value::Gauge(m.registered[i].load(Ordering::Relaxed)),
            }
        })
        .filter(|s| s.value != Value::Gauge(0) || s.labels[1].1 == "host")
        .collect();
    let errors = (0..=MAX_ERROR_KINDS)
        .filter_map(|i| {
            let n = m.errors[i].load(Ordering::Relaxed);
            (n > 0).then_some(())?;
            Some(Sample {
                labels: vec![("kind", m.error_kinds.name(i)?.to_owned())],
                value: Value::Counter(n),
            })
        })
        .collect();
    let gauge = |v: &AtomicI64| {
        vec![Sample {
            labels: Vec::new(),
            value: Value::Gauge(v.load(Ordering::Relaxed)),
        }]
    };
    let transfer_duration = m
        .transfer_duration
        .value(&DURATION_BUCKETS)
        .map(|value| Sample {
            labels: Vec::new(),
            value,
        })
        .into_iter()
        .collect();
    use Kind::{Counter, Gauge, Histogram};
    let family = |name, help, kind, samples| Family {
        name,
        help,
        kind,
        samples,
    };
    vec![
        family("gdpath_bytes", "Bytes of completed descriptor pairs (moved when outcome=ok, not moved when outcome=error), by operation, path, peer agent and outcome.", Counter, bytes),
        family("gdpath_pairs", "Descriptor pairs completed, by operation, path, peer agent and outcome.", Counter, pairs),
        family("gdpath_fallback_bytes", "Bytes of pairs that did not take the preferred path, by the finding id that says why and the path taken.", Counter, fb_bytes),
        family("gdpath_fallback_pairs", "Descriptor pairs that did not take the preferred path, by finding id and path taken.", Counter, fb_pairs),
        family("gdpath_pair_duration_seconds", "Duration of each successful descriptor pair, from its first I/O to its completion, by path.", Histogram, durations),
        family("gdpath_transfer_duration_seconds", "Duration of each transfer, from its post to its last pair's completion.", Histogram, transfer_duration),
        family("gdpath_post_cost_per_descriptor_seconds", "Time the posting thread spent in a post, divided by its descriptor pairs.", Histogram, post_cost),
        family("gdpath_registered_bytes", "Memory registered with the engine now, by kind and device (host, or the GPU's CUDA ordinal).", Gauge, registered),
        family("gdpath_transfers_in_flight", "Transfers posted whose last pair has not completed.", Gauge, gauge(&m.in_flight)),
        family("gdpath_peers_connected", "Authenticated connections to peer agents open now (either side).", Gauge, gauge(&m.peers_connected)),
        family("gdpath_errors", "Errors returned by the engine's API (post, register, connect) and pairs failed, by error kind.", Counter, errors),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thousand_peers_make_at_most_max_peers_labels_and_other() {
        let m = Metrics::new();
        for i in 0..1000 {
            let name = format!("peer-{i}");
            let idx = m.peer_index(Some(&name));
            assert!(idx < PEERS, "{idx}");
            if i < MAX_PEERS {
                assert_eq!(m.peer_name(idx), Some(name.as_str()));
            } else {
                assert_eq!(m.peer_name(idx), Some(OTHER));
            }
        }
        assert_eq!(m.peers.len(), MAX_PEERS);
        // A name seen before keeps its slot after the table filled.
        assert_eq!(m.peer_name(m.peer_index(Some("peer-3"))), Some("peer-3"));
        assert_eq!(m.peer_name(m.peer_index(None)), Some(LOCAL_PEER));
        // Transports too: the 9th distinct UCX transport is ucx:other.
        for i in 0..20 {
            let p = DataPath::Ucx {
                transport: format!("t{i}").into(),
            };
            let idx = m.path_index(&p);
            let want = if i < MAX_TRANSPORTS {
                format!("ucx:t{i}")
            } else {
                "ucx:other".to_owned()
            };
            assert_eq!(m.path_name(idx), Some(want));
        }
    }

    #[test]
    fn untrusted_names_become_safe_label_values() {
        let v = label_value("evil\"}\nname\\x é");
        assert_eq!(v, "evil_}_name_x _");
        assert_eq!(label_value(&"a".repeat(1000)).len(), MAX_LABEL_BYTES);
    }

    #[test]
    fn names_that_need_cleaning_take_the_lock_once() {
        let t: Names<4> = Names::default();
        let long = "n".repeat(200);
        for name in ["ctl\u{1}name\n", long.as_str(), "plain", "b\u{202e}idi"] {
            let first = t.index(name);
            let locked = t.locked.load(Ordering::Relaxed);
            for _ in 0..100 {
                assert_eq!(t.index(name), first, "{name:?}");
            }
            assert_eq!(
                t.locked.load(Ordering::Relaxed),
                locked,
                "{name:?} took the lock again"
            );
        }
        assert_eq!(t.locked.load(Ordering::Relaxed), 4);
        // Two raw names that clean alike share a slot, and neither takes the lock again.
        assert_eq!(t.index("ctl\u{2}name\r"), t.index("ctl\u{1}name\n"));
        assert_eq!(t.locked.load(Ordering::Relaxed), 4);
    }

    #[test]
    fn a_peer_named_other_or_local_is_not_the_bucket() {
        let m = Metrics::new();
        let other = m.peer_index(Some(OTHER));
        let local = m.peer_index(Some(LOCAL_PEER));
        assert_eq!(m.peer_name(other), Some("_other"));
        assert_eq!(m.peer_name(local), Some("_local"));
        assert_ne!(local, m.peer_index(None));
        for i in 0..MAX_PEERS {
            m.peer_index(Some(&format!("p{i}")));
        }
        let overflow = m.peer_index(Some("one-too-many"));
        assert_eq!(m.peer_name(overflow), Some(OTHER));
        assert_ne!(other, overflow);
        assert_eq!(label_value("other "), "other ");
    }

    #[test]
    fn every_path_has_its_own_cell_named_as_path_name() {
        let m = Metrics::new();
        for name in FIXED_PATHS
            .iter()
            .copied()
            .chain(["ucx:tcp", "gdr:rc_mlx5"])
        {
            let p: DataPath = name.parse().unwrap();
            assert_eq!(m.path_name(m.path_index(&p)).as_deref(), Some(name));
        }
    }

    #[test]
    fn histogram_buckets_hold_their_bound() {
        let h: Histogram<{ DURATION_BUCKETS.len() + 1 }> = Histogram::default();
        h.observe(&DURATION_BUCKETS, 1_000); // exactly 1 µs: the first bucket
        h.observe(&DURATION_BUCKETS, 100_000_000_000); // 100 s: +Inf
        let Some(Value::Histogram { count, buckets, .. }) = h.value(&DURATION_BUCKETS) else {
            panic!("no value");
        };
        assert_eq!(count, 2);
        assert_eq!(buckets[0], (1e-6, 1));
        assert_eq!(*buckets.last().unwrap(), (f64::INFINITY, 1));
    }
}
