//! `gdpath bench storage`: file ↔ host memory throughput, IOPS and latency through the engine,
//! in the manner of `gdsio` / `fio`, with data verification and an optional plain buffered
//! read-loop baseline.
//!
//! Method, per block size: an agent with chunk = block and the given queue depth; the file is
//! streamed through two host windows (double buffering, so the queue never drains between
//! windows; each window `max(block, min(2 × qd × block, 256 MiB))` bytes), one descriptor per
//! block. Timed runs move data only. Then one untimed verification pass at the same settings:
//! reads hash what the engine read and compare with the file's reference checksum; writes write
//! a position-dependent pattern and compare its checksum with a plain read-back of the file.
//! Like `fio` by default, the timed writes are not followed by `fsync`.
//!
//! Files: nothing but a regular file is opened (a device, FIFO or socket is refused by type
//! first). A read bench's missing (or, with `overwrite`, too short) file is made whole or not
//! at all ([`crate::files::prepare_test_file`]). A write bench on a new (or, with `overwrite`,
//! empty) file writes a temporary in the same directory that takes the file's name when the
//! run completes, so an interrupted run leaves nothing; on an existing file (`overwrite`) it
//! measures overwriting it in place, and the file holds test data afterwards whether the run
//! completes or not. Either way the written file is checked as [`gdpath::file::AtomicFile`]
//! checks a target (symbolic links under the `protected_symlinks` rule, another user's file in
//! a sticky directory refused), opened once, and every block, the read-back and the page-cache
//! drop go through that descriptor ([`gdpath::file::InPlaceFile`],
//! [`gdpath::file::AtomicFileExt::memory`]), never through its path again.

use super::files::{checksum_open, prepare_test_file};
use super::{fill_pattern, BenchRow, Checksum, Progress};
use gdpath::file::{AtomicFile, AtomicFileExt, InPlaceFile, InPlaceFileExt, ReplaceOptions};
use gdpath::units::format_size;
use gdpath::{
    Agent, AgentConfig, DataPath, DirectIo, Error, FileAccess, FileSpec, FindingId, HostBuffer,
    Memory, Op, Region, Result, StorageConfig, Transfer, TransferRequest,
};
use std::collections::VecDeque;
use std::io::Read;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Largest streaming window (bytes); two are allocated.
pub const MAX_WINDOW: u64 = 256 << 20;

/// What to run.
#[derive(Debug, Clone)]
pub struct StorageBenchConfig {
    /// The file benchmarked (created with a test pattern for reads when missing or short).
    pub file: PathBuf,
    /// Bytes per run.
    pub size: u64,
    /// Block sizes (bytes per I/O) to sweep.
    pub blocks: Vec<u64>,
    /// I/Os in flight.
    pub qd: u32,
    /// Whether the runs read the file or write it.
    pub op: Op,
    /// Timed runs per block size (min/median/max are over these).
    pub runs: usize,
    /// Also time a plain buffered `read(2)` loop of the same file (reads only).
    pub compare: bool,
    /// O_DIRECT policy (`Off` benchmarks the buffered path).
    pub direct: DirectIo,
    /// Drop the file's pages from the page cache (`posix_fadvise(DONTNEED)`) before each
    /// buffered run (`direct` [`DirectIo::Off`], or a file system that refuses O_DIRECT) and
    /// each run of the `compare` loop, so buffered reads come from the disk. Only with `direct`
    /// off or `compare` ([`StorageBenchConfig::check`]).
    pub cold: bool,
    /// Allow writing over an existing file (write benchmarks), or replacing an existing file
    /// smaller than `size` with a test pattern (read benchmarks).
    pub overwrite: bool,
    /// `fsync` a file this run creates, and its directory, before it takes the file's name
    /// ([`gdpath::file::ReplaceOptions::fsync`]).
    pub fsync: bool,
}

/// I/Os in flight when not chosen (`gdpath bench storage --qd`).
pub const DEFAULT_QD: u32 = 32;

impl StorageBenchConfig {
    /// Checks the settings without touching the file: a size, block sizes, runs and a queue
    /// depth of at least 1; blocks of at most 1 GiB and at most the size
    /// ([`crate::check_blocks`]); `compare` only for reads; `cold` only with `direct`
    /// [`DirectIo::Off`] or `compare` (an O_DIRECT run does not read through the page cache, so
    /// dropping it would be asked for and silently do nothing). Errors: [`Error::Config`]
    /// naming the setting.
    pub fn check(&self) -> Result<()> {
        if self.size == 0 || self.blocks.is_empty() || self.runs == 0 || self.qd == 0 {
            return Err(Error::Config(
                "size, block sizes, runs and queue depth must be non-zero".into(),
            ));
        }
        if let Some(b) = self.blocks.iter().find(|&&b| b == 0 || b > 1 << 30) {
            return Err(Error::Config(format!(
                "block size {b} bytes is outside 1 B ..= 1 GiB"
            )));
        }
        super::check_blocks(&self.blocks, self.size)?;
        if self.compare && self.op == Op::Write {
            return Err(Error::Config(
                "--compare runs a buffered read loop: use it with --read".into(),
            ));
        }
        if self.cold && self.direct != DirectIo::Off && !self.compare {
            return Err(Error::Config(
                "--cold drops the page cache before buffered runs, and the O_DIRECT run does \
                 not read through it: use it with --buffered or --compare"
                    .into(),
            ));
        }
        Ok(())
    }
}

/// The outcome: one row per (path, block size), and the findings of fallbacks seen.
#[derive(Debug, Clone)]
pub struct StorageBenchReport {
    /// One row per (path, block size), and one per block size of the `compare` loop.
    pub rows: Vec<BenchRow>,
    /// Finding ids attached to the engine's transfers (e.g. `storage.odirect-unsupported`).
    pub findings: Vec<FindingId>,
    /// The file was created (or extended) with a test pattern by this run.
    pub prepared: bool,
}

fn window_for(block: u64, qd: u32) -> u64 {
    let w = (2 * u64::from(qd)).saturating_mul(block).min(MAX_WINDOW);
    (w / block * block).max(block)
}

/// One streamed pass: per-I/O latencies (µs), the elapsed time, the paths the pairs took (in
/// order of first appearance) and the first finding.
struct Pass {
    elapsed: Duration,
    latencies_us: Vec<f64>,
    paths: Vec<DataPath>,
    finding: Option<FindingId>,
}

/// A row's path label: the paths its pairs took, joined with `+` (`posix-direct+posix-buffered`
/// when some pairs fit inside one page-cache block and went through the page cache).
fn paths_label(paths: &[DataPath]) -> String {
    if paths.is_empty() {
        return "none".into();
    }
    paths
        .iter()
        .map(DataPath::name)
        .collect::<Vec<_>>()
        .join("+")
}

/// Streams `size` bytes between `file` and the two windows. `before` runs on a window before it
/// is written out (writes); `after` on a window after it was read in (reads).
#[allow(clippy::too_many_arguments)]
fn stream(
    agent: &Agent,
    file: &Region,
    windows: &[Region; 2],
    size: u64,
    block: u64,
    op: Op,
    progress: &dyn Progress,
    mut before: impl FnMut(&Region, u64, u64) -> Result<()>,
    mut after: impl FnMut(&Region, u64, u64) -> Result<()>,
) -> Result<Pass> {
    let w = windows[0].len()?;
    let nwin = size.div_ceil(w);
    let mut q: VecDeque<(Transfer, usize, u64, u64)> = VecDeque::new();
    let mut pass = Pass {
        elapsed: Duration::ZERO,
        latencies_us: Vec::with_capacity(size.div_ceil(block) as usize),
        paths: Vec::new(),
        finding: None,
    };
    let mut finish = |t: Transfer, b: usize, off: u64, len: u64, pass: &mut Pass| -> Result<()> {
        let r = t.wait().map_err(|e| e.error)?;
        for p in &r.pairs {
            pass.latencies_us.push(p.elapsed.as_secs_f64() * 1e6);
            if !pass.paths.contains(&p.path) {
                pass.paths.push(p.path.clone());
            }
            if pass.finding.is_none() {
                pass.finding = p.finding.clone();
            }
        }
        progress.advance(len);
        after(&windows[b], off, len)
    };
    let t0 = Instant::now();
    for wi in 0..nwin {
        let b = (wi % 2) as usize;
        if q.len() == 2 {
            let (t, pb, po, pl) = q.pop_front().expect("two queued");
            finish(t, pb, po, pl, &mut pass)?;
        }
        let off = wi * w;
        let len = (size - off).min(w);
        before(&windows[b], off, len)?;
        let mut local = Vec::with_capacity(len.div_ceil(block) as usize);
        let mut target = Vec::with_capacity(local.capacity());
        let mut p = 0;
        while p < len {
            let n = (len - p).min(block);
            local.push(windows[b].desc(p, n));
            target.push(file.desc(off + p, n));
            p += n;
        }
        let t = agent.post(TransferRequest::new(op, local, target))?;
        q.push_back((t, b, off, len));
    }
    while let Some((t, b, off, len)) = q.pop_front() {
        finish(t, b, off, len, &mut pass)?;
    }
    pass.elapsed = t0.elapsed();
    Ok(pass)
}

/// Runs the benchmark. Errors: file problems (typed [`Error`]s), a refused `--compare` for
/// writes, an existing file without `overwrite`, engine errors. A checksum mismatch is not an
/// error: the row says `verified: false`.
pub fn run(cfg: &StorageBenchConfig, progress: &dyn Progress) -> Result<StorageBenchReport> {
    cfg.check()?;
    let replace = ReplaceOptions {
        overwrite: cfg.overwrite,
        fsync: cfg.fsync,
    };
    // Refused by type before anything is opened: a device reports a length of 0 and would
    // otherwise be "created" with the test pattern.
    let (reference, prepared, new_file, in_place) = match cfg.op {
        Op::Read => {
            gdpath::file::check_regular(&cfg.file)?;
            let t = prepare_test_file(&cfg.file, cfg.size, 0x5EED, replace, progress)?;
            (Some(t.checksum), t.created, None, None)
        }
        // An existing file, an empty one too, is written only with `overwrite`; it is found as
        // AtomicFile finds a target and opened once, and every block goes through that
        // descriptor, so a name swapped for a link meanwhile redirects nothing.
        Op::Write => match InPlaceFile::open(&cfg.file, cfg.overwrite)? {
            // Written in place: the benchmark measures overwriting this file.
            Some(f) if !f.is_empty() => (None, false, None, Some(f)),
            // An empty file holds nothing to measure over: replaced like a new one.
            Some(_) => {
                let f = AtomicFile::create(&cfg.file, replace.overwrite(true))?;
                (None, true, Some(f), None)
            }
            // A new file is written as a temporary that takes the name at the end: an
            // interrupted run leaves none.
            None => {
                let f = AtomicFile::create(&cfg.file, replace.overwrite(false))?;
                (None, true, Some(f), None)
            }
        },
    };
    // The descriptor every block goes through, for writes; reads open the file by its path.
    let opened = |agent: &Agent| -> Result<Region> {
        let memory = match (&new_file, &in_place) {
            (Some(f), _) => f.memory(cfg.direct)?,
            (None, Some(f)) => f.memory(FileAccess::ReadWrite, cfg.direct)?,
            (None, None) => Memory::File(FileSpec::read(&cfg.file).direct(cfg.direct)),
        };
        agent.register(memory)
    };
    // The written file, for reading it back and dropping its pages: its descriptor.
    let written: Option<&std::fs::File> = match (&new_file, &in_place) {
        (Some(f), _) => Some(f.file()),
        (None, Some(f)) => Some(f.file()),
        (None, None) => None,
    };
    let mut rows = Vec::new();
    let mut findings: Vec<FindingId> = Vec::new();
    for &block in &cfg.blocks {
        let agent = Agent::new(AgentConfig {
            name: "bench".into(),
            storage: StorageConfig {
                chunk: block,
                queue_depth: cfg.qd,
                direct: cfg.direct,
                ..StorageConfig::default()
            },
            ..AgentConfig::default()
        })?;
        let file = opened(&agent)?;
        let w = window_for(block, cfg.qd).min(cfg.size.next_multiple_of(block));
        let windows = [
            agent.register(Memory::host(HostBuffer::zeroed(w as usize)))?,
            agent.register(Memory::host(HostBuffer::zeroed(w as usize)))?,
        ];
        // Touch every page now (write pattern, or zeros for reads) so that page faults of the
        // fresh allocation do not land in the first timed run.
        for (i, r) in windows.iter().enumerate() {
            let mut v = r.host_view()?;
            match cfg.op {
                Op::Write => fill_pattern(&mut v, i as u64 * w, 0xB10C),
                Op::Read => v.fill(0),
            }
        }
        let buffered = file.file().is_some_and(|f| f.direct_fd().is_none());
        let mut run_gbps = Vec::with_capacity(cfg.runs);
        let mut lats = Vec::new();
        let mut paths: Vec<DataPath> = Vec::new();
        let mut finding = None;
        progress.start(
            &format!("{} {} qd {}", cfg.op, format_size(block), cfg.qd),
            cfg.size * (cfg.runs as u64 + 1),
        );
        for _ in 0..cfg.runs {
            if cfg.cold && buffered {
                match written {
                    Some(f) => gdpath::os::evict_file_pages(f, &cfg.file)?,
                    None => gdpath::os::evict_page_cache(&cfg.file)?,
                }
            }
            let ok = |_: &Region, _: u64, _: u64| Ok(());
            let p = stream(
                &agent, &file, &windows, cfg.size, block, cfg.op, progress, ok, ok,
            )?;
            run_gbps.push(gdpath::units::gbps(cfg.size, p.elapsed));
            lats.extend(p.latencies_us);
            for q in p.paths {
                if !paths.contains(&q) {
                    paths.push(q);
                }
            }
            finding = finding.or(p.finding);
        }
        // Untimed verification pass.
        let verified = match cfg.op {
            Op::Read => {
                let mut h = Checksum::new();
                let after = |r: &Region, _: u64, len: u64| -> Result<()> {
                    h.update(&r.host_view()?[..len as usize]);
                    Ok(())
                };
                let none = |_: &Region, _: u64, _: u64| Ok(());
                stream(
                    &agent, &file, &windows, cfg.size, block, cfg.op, progress, none, after,
                )?;
                Some(h.digest()) == reference
            }
            Op::Write => {
                let mut h = Checksum::new();
                let seed = 0xC0FFEE ^ block;
                let before = |r: &Region, off: u64, len: u64| -> Result<()> {
                    let mut v = r.host_view()?;
                    fill_pattern(&mut v[..len as usize], off, seed);
                    h.update(&v[..len as usize]);
                    Ok(())
                };
                let none = |_: &Region, _: u64, _: u64| Ok(());
                stream(
                    &agent, &file, &windows, cfg.size, block, cfg.op, progress, before, none,
                )?;
                let f = written.expect("a write bench has its file open");
                let back = checksum_open(f, &cfg.file, Some(cfg.size), &super::NoProgress)?;
                back == h.digest()
            }
        };
        progress.finish();
        if let Some(f) = &finding {
            if !findings.contains(f) {
                findings.push(f.clone());
            }
        }
        rows.push(BenchRow::from_runs(
            paths_label(&paths),
            cfg.op.to_string(),
            cfg.size,
            block,
            cfg.qd,
            &run_gbps,
            &lats,
            verified,
        ));
        if cfg.compare {
            rows.push(read_loop(cfg, block, reference, progress)?);
        }
    }
    if let Some(f) = new_file {
        f.commit()?;
    }
    Ok(StorageBenchReport {
        rows,
        findings,
        prepared,
    })
}

/// The baseline: a plain buffered `read(2)` loop over the file with a `block`-byte buffer, one
/// read in flight (queue depth 1), as an application without gdpath would do it.
fn read_loop(
    cfg: &StorageBenchConfig,
    block: u64,
    reference: Option<u64>,
    progress: &dyn Progress,
) -> Result<BenchRow> {
    let path = &cfg.file;
    let mut buf = vec![0u8; block as usize];
    let mut run_gbps = Vec::new();
    let mut lats = Vec::new();
    progress.start(
        &format!("read-loop {}", format_size(block)),
        cfg.size * (cfg.runs as u64 + 1),
    );
    // Timed runs (no hashing), then one untimed pass that hashes.
    let mut digest = None;
    for run in 0..=cfg.runs {
        let verify = run == cfg.runs;
        if cfg.cold {
            gdpath::os::evict_page_cache(path)?;
        }
        let mut f = std::fs::File::open(path).map_err(|e| Error::io("open", path, 0, e))?;
        let mut h = Checksum::new();
        let t0 = Instant::now();
        let mut left = cfg.size;
        while left > 0 {
            let n = left.min(block) as usize;
            let t = Instant::now();
            f.read_exact(&mut buf[..n])
                .map_err(|e| Error::io("read", path, cfg.size - left, e))?;
            if verify {
                h.update(&buf[..n]);
            } else {
                lats.push(t.elapsed().as_secs_f64() * 1e6);
            }
            left -= n as u64;
            progress.advance(n as u64);
        }
        if verify {
            digest = Some(h.digest());
        } else {
            run_gbps.push(gdpath::units::gbps(cfg.size, t0.elapsed()));
        }
    }
    progress.finish();
    let ok = digest.is_some() && digest == reference;
    let mut row = BenchRow::from_runs(
        "read-loop",
        "read",
        cfg.size,
        block,
        1,
        &run_gbps,
        &lats,
        ok,
    );
    // Where its bytes came from: without --cold the page cache keeps the file after the first
    // pass (if it fits in memory), while an O_DIRECT row always reads the device.
    row.src = Some(if cfg.cold {
        "file, page cache dropped before each run".into()
    } else {
        "file through the page cache (not dropped: warm after the first pass)".into()
    });
    Ok(row)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_larger_than_the_size_is_refused_before_touching_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        let cfg = StorageBenchConfig {
            file: file.clone(),
            size: 1 << 20,
            blocks: vec![512 << 10, 4 << 20],
            qd: 4,
            op: Op::Read,
            runs: 1,
            compare: false,
            direct: DirectIo::Auto,
            cold: false,
            overwrite: false,
            fsync: true,
        };
        let err = run(&cfg, &crate::NoProgress).unwrap_err();
        assert!(
            matches!(&err, Error::Config(m) if m.contains("4 MiB") && m.contains("1 MiB")),
            "{err}"
        );
        assert!(!file.exists(), "refused before creating the test file");
    }

    #[test]
    fn cold_applies_only_to_buffered_runs_and_the_compare_loop() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        let cfg = StorageBenchConfig {
            file: file.clone(),
            size: 1 << 20,
            blocks: vec![1 << 20],
            qd: 4,
            op: Op::Read,
            runs: 1,
            compare: false,
            direct: DirectIo::Auto,
            cold: true,
            overwrite: false,
            fsync: true,
        };
        let err = run(&cfg, &crate::NoProgress).unwrap_err();
        assert!(
            matches!(&err, Error::Config(m) if m.contains("--cold") && m.contains("--buffered")),
            "{err}"
        );
        assert!(!file.exists(), "refused before creating the test file");
        for ok in [
            StorageBenchConfig {
                direct: DirectIo::Off,
                ..cfg.clone()
            },
            StorageBenchConfig {
                compare: true,
                ..cfg.clone()
            },
        ] {
            ok.check().unwrap();
        }
    }
}
