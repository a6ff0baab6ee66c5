//! gdpath-bench: the bench harness of `gdpath bench`, the per-path benches and the verified
//! one-shot copies of `gdpath copy`, on top of the engine (`gdpath`).
//!
//! Here: statistics over samples ([`Stats`]), the versioned JSON document every bench prints
//! ([`BenchDocument`], schema [`BENCH_SCHEMA`]) and its row ([`BenchRow`]), data verification (a position-dependent
//! [`fill_pattern`] and a streaming [`Checksum`]), a progress sink the CLI draws ([`Progress`]),
//! and the benches: [`storage`] (file ↔ host), [`gds`] (file ↔ GPU), [`gpu`] (host ↔ GPU,
//! GPU ↔ GPU), [`kv`] (KV-cache block lists against one contiguous copy) and [`net`] (agent ↔
//! agent over UCX). [`copy`] (file → host → file) and
//! [`gpu_copy`] (file ↔ GPU) are one-shot copies rather than benches; they live here because
//! they verify with the same checksums and fill patterns and report through the same progress
//! sink as the benches.
//!
//! Units: bytes; bandwidth in GB/s = 1e9 B/s ([`gdpath::units::gbps`]); latency in µs. Sizes
//! are parsed and printed by [`gdpath::units`].
//!
//! Layering: this crate uses the engine's public API only; the doctor (`gdpath-doctor`) runs
//! some of these benches as its measured probes, never the other way round.

#![deny(unsafe_code)]

pub mod copy;
pub mod doc;
pub mod files;
pub mod gds;
pub mod gpu;
pub mod gpu_copy;
pub mod kv;
pub mod net;
pub mod storage;

pub use doc::BenchDocument;
use gdpath::units::format_size;
use serde::{Deserialize, Serialize};

/// Schema name of the bench commands' JSON (`schema` field; rows are [`BenchRow`]s), in the
/// `gdpath.<what>/<version>` form every gdpath JSON document uses (`gdpath.topo/1`,
/// `gdpath.doctor/1`); the version is bumped on incompatible changes.
pub const BENCH_SCHEMA: &str = "gdpath.bench/1";

/// Summary statistics of a sample set.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    /// Number of samples (NaNs dropped).
    pub n: usize,
    /// Smallest sample.
    pub min: f64,
    /// Median sample (the 50th percentile).
    pub median: f64,
    /// Largest sample.
    pub max: f64,
    /// Arithmetic mean.
    pub mean: f64,
    /// 50th percentile, linear interpolation (equal to `median`).
    pub p50: f64,
    /// 90th percentile, linear interpolation.
    pub p90: f64,
    /// 99th percentile, linear interpolation.
    pub p99: f64,
}

impl Stats {
    /// Statistics of `samples` (NaNs are dropped); `None` when no sample remains.
    /// Percentiles interpolate linearly between closest ranks (as numpy's default), so the
    /// median of an even count is the mean of the two middle samples.
    pub fn from_samples(samples: &[f64]) -> Option<Stats> {
        let mut v: Vec<f64> = samples.iter().copied().filter(|x| !x.is_nan()).collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        let mean = v.iter().sum::<f64>() / v.len() as f64;
        Some(Stats {
            n: v.len(),
            min: v[0],
            median: percentile_sorted(&v, 50.0),
            max: v[v.len() - 1],
            mean,
            p50: percentile_sorted(&v, 50.0),
            p90: percentile_sorted(&v, 90.0),
            p99: percentile_sorted(&v, 99.0),
        })
    }
}

/// The `p`-th percentile (0–100) of sorted, non-empty samples, linear interpolation.
pub fn percentile_sorted(sorted: &[f64], p: f64) -> f64 {
    let n = sorted.len();
    if n == 1 {
        return sorted[0];
    }
    let rank = (p.clamp(0.0, 100.0) / 100.0) * (n - 1) as f64;
    let lo = rank.floor() as usize;
    let hi = rank.ceil() as usize;
    sorted[lo] + (sorted[hi] - sorted[lo]) * (rank - lo as f64)
}

/// The JSON fields every [`BenchRow`] carries, whichever bench made it (`gdpath.bench/1`):
/// what a consumer of `--json` may rely on. Network rows add `transport` and the latency
/// min/max of [`NetBenchRow`](net::NetBenchRow).
pub const ROW_FIELDS: [&str; 12] = [
    "path",
    "op",
    "bytes",
    "block",
    "qd",
    "gbps_min",
    "gbps_median",
    "gbps_max",
    "iops",
    "latency_us_p50",
    "latency_us_p99",
    "verified",
];

/// One benchmark result row, shared by the storage, GPU and network benches (`--json` prints
/// one per line). Optional fields are omitted when `None`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchRow {
    /// The path name ([`gdpath::DataPath::name`]), or a baseline's name (`read-loop`, `fio`).
    pub path: String,
    /// `read`, `write`, `copy`, `put`, `get`, ...
    pub op: String,
    /// Bytes moved per run.
    pub bytes: u64,
    /// Bytes per I/O (per descriptor).
    pub block: u64,
    /// I/Os in flight.
    pub qd: u32,
    /// Slowest timed run, GB/s (1e9 B/s).
    pub gbps_min: f64,
    /// Median of the timed runs, GB/s (1e9 B/s).
    pub gbps_median: f64,
    /// Fastest timed run, GB/s (1e9 B/s).
    pub gbps_max: f64,
    /// I/Os per second (median run).
    pub iops: f64,
    /// Median (50th percentile) of the per-I/O latency over all runs, µs (submission to
    /// completion).
    pub latency_us_p50: f64,
    /// 99th percentile of the per-I/O latency over all runs, µs.
    pub latency_us_p99: f64,
    /// Data read back matched what was written (checksum).
    pub verified: bool,
    /// Where the bytes came from: a file, `gpu:N`, `host` or a description of the source's state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub src: Option<String>,
    /// Where the bytes went, in the same forms as `src`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dst: Option<String>,
    /// Single-message latency (µs) for latency benches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_us: Option<f64>,
    /// Physical limit of the link crossed, GB/s, with its source in the bench's docs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit_gbps: Option<f64>,
    /// Network transport (`tcp`, `rc_mlx5`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transport: Option<String>,
}

impl BenchRow {
    /// A row from per-run throughputs (GB/s), per-I/O latencies (µs) and the median-run IOPS.
    #[allow(clippy::too_many_arguments)]
    pub fn from_runs(
        path: impl Into<String>,
        op: impl Into<String>,
        bytes: u64,
        block: u64,
        qd: u32,
        run_gbps: &[f64],
        latencies_us: &[f64],
        verified: bool,
    ) -> BenchRow {
        let g = Stats::from_samples(run_gbps);
        let l = Stats::from_samples(latencies_us);
        let median = g.map_or(0.0, |s| s.median);
        BenchRow {
            path: path.into(),
            op: op.into(),
            bytes,
            block,
            qd,
            gbps_min: g.map_or(0.0, |s| s.min),
            gbps_median: median,
            gbps_max: g.map_or(0.0, |s| s.max),
            iops: if block > 0 {
                median * 1e9 / block as f64
            } else {
                0.0
            },
            latency_us_p50: l.map_or(0.0, |s| s.p50),
            latency_us_p99: l.map_or(0.0, |s| s.p99),
            verified,
            src: None,
            dst: None,
            latency_us: None,
            limit_gbps: None,
            transport: None,
        }
    }
}

/// Refuses block sizes larger than the bytes a run moves (`size`): such a block would be cut to
/// `size`, so no I/O of the block its row reports would be made. Shared by the storage and GDS
/// benches. Errors: [`gdpath::Error::Config`] naming every such block and the size.
pub fn check_blocks(blocks: &[u64], size: u64) -> gdpath::Result<()> {
    let too_big: Vec<String> = blocks
        .iter()
        .filter(|&&b| b > size)
        .map(|&b| format_size(b))
        .collect();
    if too_big.is_empty() {
        return Ok(());
    }
    Err(gdpath::Error::Config(format!(
        "block {} exceeds the size {} of a run: no I/O of that size would be made; choose \
         blocks of at most the size, or a larger size",
        too_big.join(", "),
        format_size(size)
    )))
}

/// A streaming checksum (XXH3-64) for verifying data: what was written against what was read
/// back. Not cryptographic; detects corruption and misplaced blocks when fed in file order.
#[derive(Clone)]
pub struct Checksum(xxhash_rust::xxh3::Xxh3);

impl Default for Checksum {
    fn default() -> Self {
        Checksum(xxhash_rust::xxh3::Xxh3::new())
    }
}

impl Checksum {
    /// A fresh checksum.
    pub fn new() -> Self {
        Self::default()
    }
    /// Feeds bytes (in order).
    pub fn update(&mut self, bytes: &[u8]) {
        self.0.update(bytes)
    }
    /// The 64-bit digest of everything fed so far.
    pub fn digest(&self) -> u64 {
        self.0.digest()
    }
    /// The digest of one slice.
    pub fn of(bytes: &[u8]) -> u64 {
        xxhash_rust::xxh3::xxh3_64(bytes)
    }
}

/// Fills `buf` with a deterministic pattern of the absolute position `pos` (bytes) of its first
/// byte in the stream: each aligned 8-byte word holds a mix of its position and `seed`, so a
/// block written or read at the wrong offset changes the checksum.
pub fn fill_pattern(buf: &mut [u8], pos: u64, seed: u64) {
    let word = |w: u64| (w.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ seed).to_le_bytes();
    // Bytes before the first 8-byte boundary, then whole words, then the rest.
    let head = (((8 - pos % 8) % 8) as usize).min(buf.len());
    let (h, rest) = buf.split_at_mut(head);
    for (i, b) in h.iter_mut().enumerate() {
        let p = pos + i as u64;
        *b = word(p / 8)[(p % 8) as usize];
    }
    let p0 = pos + head as u64;
    let rest_len = rest.len();
    let mut words = rest.chunks_exact_mut(8);
    for (i, c) in (&mut words).enumerate() {
        c.copy_from_slice(&word(p0 / 8 + i as u64));
    }
    let tail = words.into_remainder();
    let pt = p0 + (rest_len - tail.len()) as u64;
    for (i, b) in tail.iter_mut().enumerate() {
        let p = pt + i as u64;
        *b = word(p / 8)[(p % 8) as usize];
    }
}

/// Progress of long work, reported by the library and drawn by the CLI (a bar on a terminal,
/// nothing when piped). The library never prints.
pub trait Progress: Send + Sync {
    /// A new phase begins, `total` units (bytes) long.
    fn start(&self, label: &str, total: u64);
    /// `done` more units were done.
    fn advance(&self, done: u64);
    /// The phase ended.
    fn finish(&self);
}

/// A [`Progress`] that does nothing.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoProgress;

impl Progress for NoProgress {
    fn start(&self, _: &str, _: u64) {}
    fn advance(&self, _: u64) {}
    fn finish(&self) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_percentiles() {
        let s = Stats::from_samples(&[4.0, 1.0, 3.0, 2.0]).unwrap();
        assert_eq!((s.min, s.max, s.median, s.mean), (1.0, 4.0, 2.5, 2.5));
        let v: Vec<f64> = (1..=101).map(f64::from).collect();
        let s = Stats::from_samples(&v).unwrap();
        assert_eq!(s.p50, 51.0);
        assert_eq!(s.p99, 100.0);
        assert!((s.p90 - 91.0).abs() < 1e-9);
        assert!(Stats::from_samples(&[f64::NAN]).is_none());
        assert_eq!(Stats::from_samples(&[7.0]).unwrap().p99, 7.0);
    }

    #[test]
    fn row_skips_absent_optionals_and_computes_iops() {
        let r = BenchRow::from_runs(
            "posix-direct",
            "read",
            1 << 30,
            1 << 20,
            32,
            &[1.0, 2.0, 3.0],
            &[10.0, 20.0],
            true,
        );
        assert_eq!(r.gbps_median, 2.0);
        assert!((r.iops - 2e9 / (1 << 20) as f64).abs() < 1e-6);
        let j = serde_json::to_value(&r).unwrap();
        for k in ROW_FIELDS {
            assert!(j.get(k).is_some(), "missing {k}");
        }
        for k in ["src", "dst", "latency_us", "limit_gbps", "transport"] {
            assert!(j.get(k).is_none(), "{k} should be skipped");
        }
        let back: BenchRow = serde_json::from_value(j).unwrap();
        assert_eq!(back, r);
    }

    #[test]
    fn pattern_depends_on_position() {
        let mut a = vec![0u8; 4096];
        let mut b = vec![0u8; 4096];
        fill_pattern(&mut a, 0, 1);
        fill_pattern(&mut b, 4096, 1);
        assert_ne!(Checksum::of(&a), Checksum::of(&b));
        // Split fills equal one fill.
        let mut c = vec![0u8; 4096];
        fill_pattern(&mut c[..13], 0, 1);
        fill_pattern(&mut c[13..], 13, 1);
        assert_eq!(a, c);
        let mut h = Checksum::new();
        h.update(&a[..100]);
        h.update(&a[100..]);
        assert_eq!(h.digest(), Checksum::of(&a));
    }
}
