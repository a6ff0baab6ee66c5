//! `gdpath bench storage --gpu N`: file ↔ GPU memory on the GDS paths side by side, as `gdsio`
//! does (block sizes, threads, GB/s min/median/max over runs, data verified, path per row).
//!
//! Each (path, block, threads) row uses a fresh agent whose [`GdsConfig`] has `chunk = block`
//! and `threads`, and a strict request (`accept`) for the path under test: a path the machine
//! cannot take is reported as skipped with its finding (e.g. `gds.handle-register-failed`)
//! instead of silently measuring the fallback. Data: reads are checked by reading the GPU back
//! through host memory and comparing XXH3 checksums with the file's; writes fill the GPU with
//! [`fill_pattern`] first and check the file afterwards. Each row has one untimed warm-up run.

use super::files::{checksum_open, prepare_test_file};
use super::{fill_pattern, BenchRow, Checksum, NoProgress, Progress};
use gdpath::file::{AtomicFile, AtomicFileExt, InPlaceFile, InPlaceFileExt, ReplaceOptions};
use gdpath::units::{format_size, gbps};
use gdpath::{
    Agent, AgentConfig, DataPath, Error, FileAccess, FileSpec, FindingId, GdsConfig, HostBuffer,
    Memory, Op, Region, Result, TransferRequest,
};
use gdpath_checkpoint::chooser::{Dest, Overrides, Tuning};
use std::path::PathBuf;
use std::time::Instant;

/// A GDS path to benchmark.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GdsPathChoice {
    /// cuFile with nvidia-fs (`gds-native`).
    Gds,
    /// cuFile compatibility mode (`gds-compat`).
    Compat,
    /// gdpath's staged path (`posix-direct`, or `posix-buffered` where O_DIRECT is refused).
    Staged,
}

impl GdsPathChoice {
    /// The paths a strict request accepts for this choice.
    pub fn accepted(self) -> Vec<DataPath> {
        match self {
            GdsPathChoice::Gds => vec![DataPath::GdsNative],
            GdsPathChoice::Compat => vec![DataPath::GdsCompat],
            GdsPathChoice::Staged => vec![DataPath::PosixDirect, DataPath::PosixBuffered],
        }
    }

    /// `gds`, `compat`, `staged`.
    pub fn name(self) -> &'static str {
        match self {
            GdsPathChoice::Gds => "gds",
            GdsPathChoice::Compat => "compat",
            GdsPathChoice::Staged => "staged",
        }
    }
}

/// Settings of a GDS bench.
#[derive(Debug, Clone)]
pub struct GdsBenchConfig {
    /// The file read or written (created with a test pattern for reads when missing).
    pub file: PathBuf,
    /// Bytes per run.
    pub size: u64,
    /// CUDA ordinal of the GPU.
    pub gpu: u32,
    /// Block sizes (bytes per request, `GdsConfig::chunk`); empty: the chooser's
    /// ([`gdpath_checkpoint::chooser::choose`] on the prepared file).
    pub blocks: Vec<u64>,
    /// Thread counts (requests in flight, `GdsConfig::threads`); empty: the chooser's.
    pub threads: Vec<usize>,
    /// Slabs of the staged path's buffered reads (`GdsConfig::slabs`: 0 for a buffer pair per
    /// thread); `None`: the chooser's, or none where `blocks` are given (slabs were measured
    /// with the chooser's block).
    pub slabs: Option<usize>,
    /// Whether the GPU reads the file or writes it.
    pub op: Op,
    /// Timed runs per row.
    pub runs: usize,
    /// The paths to measure, each a set of rows (GDS, cuFile's compatibility mode, staged).
    pub paths: Vec<GdsPathChoice>,
    /// Drop the file from the page cache (`posix_fadvise(DONTNEED)`) before each run.
    pub cold: bool,
    /// Allow writing over an existing file.
    pub overwrite: bool,
}

/// A path the machine could not take.
#[derive(Debug, Clone, PartialEq)]
pub struct Skipped {
    /// The path that was skipped.
    pub path: GdsPathChoice,
    /// The finding that explains why, where one does.
    pub finding: Option<FindingId>,
    /// What stopped it, in words (the engine's error or the finding's text).
    pub detail: String,
}

/// Rows, skipped paths and findings seen.
#[derive(Debug, Clone, Default)]
pub struct GdsBenchReport {
    /// One row per configuration measured (path, block size, thread count).
    pub rows: Vec<BenchRow>,
    /// The paths the machine could not take, and why.
    pub skipped: Vec<Skipped>,
    /// Finding ids the engine attached to the transfers measured.
    pub findings: Vec<FindingId>,
    /// The chooser's settings for the file (before the first run; after the eviction for a
    /// cold bench), with the values the caller gave in place. Its `direct` decides whether the
    /// staged rows use O_DIRECT.
    pub chosen: Option<Tuning>,
}

const SEED: u64 = 0x6764_7061_7468_6764;
const WINDOW: u64 = 64 << 20;

/// Walks GPU bytes `[0, len)` of `gpu` through one host window of at most [`WINDOW`] bytes:
/// for [`Op::Read`] each window is read from the GPU, then given to `each` with its offset; for
/// [`Op::Write`] `each` fills it first, then it is written to the GPU. Errors: registration and
/// transfer failures.
fn through_window(
    agent: &Agent,
    gpu: &Region,
    len: u64,
    op: Op,
    mut each: impl FnMut(&mut [u8], u64),
) -> Result<()> {
    let w = WINDOW.min(len.max(1));
    let host = agent.register(Memory::host(HostBuffer::zeroed(w as usize)))?;
    let mut off = 0;
    while off < len {
        let l = w.min(len - off);
        if op == Op::Write {
            each(&mut host.host_view()?[..l as usize], off);
        }
        let (h, g) = (vec![host.desc(0, l)], vec![gpu.desc(off, l)]);
        let req = match op {
            Op::Read => TransferRequest::read(h, g),
            Op::Write => TransferRequest::write(h, g),
        };
        agent.post(req)?.wait().map_err(|e| e.error)?;
        if op == Op::Read {
            each(&mut host.host_view()?[..l as usize], off);
        }
        off += l;
    }
    Ok(())
}

/// XXH3 of GPU bytes `[0, len)` of `gpu`, read back through a host window.
pub fn gpu_checksum(agent: &Agent, gpu: &Region, len: u64) -> Result<u64> {
    let mut sum = Checksum::new();
    through_window(agent, gpu, len, Op::Read, |v, _| sum.update(v))?;
    Ok(sum.digest())
}

/// Fills GPU bytes `[0, len)` with [`fill_pattern`] (seed `seed`); returns its XXH3.
pub fn gpu_fill_pattern(agent: &Agent, gpu: &Region, len: u64, seed: u64) -> Result<u64> {
    let mut sum = Checksum::new();
    through_window(agent, gpu, len, Op::Write, |v, off| {
        fill_pattern(v, off, seed);
        sum.update(v);
    })?;
    Ok(sum.digest())
}

/// Runs the bench. Errors: file preparation, registration (no GPU: `Error::Unsupported`) and
/// transfer failures; a path the machine cannot take is a [`Skipped`] entry, not an error.
pub fn run(cfg: &GdsBenchConfig, progress: &dyn Progress) -> Result<GdsBenchReport> {
    if !cfg.blocks.is_empty() {
        super::check_blocks(&cfg.blocks, cfg.size)?;
    }
    let mut report = GdsBenchReport::default();
    let (file_sum, new_file, in_place) = match cfg.op {
        Op::Read => {
            gdpath::file::check_regular(&cfg.file)?;
            let replace = ReplaceOptions::default().overwrite(cfg.overwrite);
            let sum = prepare_test_file(&cfg.file, cfg.size, SEED, replace, progress)?.checksum;
            (Some(sum), None, None)
        }
        // An existing file is written in place, only with `overwrite`: found as AtomicFile
        // finds a target and opened once, every block going through that descriptor; a new
        // one is a temporary that takes the name at the end (as the storage bench does).
        Op::Write => match InPlaceFile::open(&cfg.file, cfg.overwrite)? {
            Some(f) => (None, None, Some(f)),
            None => {
                let f = AtomicFile::create(&cfg.file, ReplaceOptions::default())?;
                (None, Some(f), None)
            }
        },
    };
    // The file's path for the chooser's facts and the reads; writes go through the descriptor.
    let target = match (&new_file, &in_place) {
        (Some(f), _) => f.temp_path().to_owned(),
        (None, Some(f)) => f.target().path.clone(),
        (None, None) => cfg.file.clone(),
    };
    let written: Option<&std::fs::File> = match (&new_file, &in_place) {
        (Some(f), _) => Some(f.file()),
        (None, Some(f)) => Some(f.file()),
        (None, None) => None,
    };
    let evict = || match written {
        Some(f) => gdpath::os::evict_file_pages(f, &cfg.file),
        None => gdpath::os::evict_page_cache(&cfg.file),
    };
    if cfg.cold {
        // The chooser sees the file as the timed runs will.
        let _ = evict();
    }
    let chosen = choose(cfg, &target)?;
    let blocks = if cfg.blocks.is_empty() {
        vec![chosen.chunk]
    } else {
        cfg.blocks.clone()
    };
    let thread_counts = if cfg.threads.is_empty() {
        vec![chosen.threads]
    } else {
        cfg.threads.clone()
    };
    let staged_direct = if chosen.direct {
        gdpath::DirectIo::Auto
    } else {
        gdpath::DirectIo::Off
    };
    let slabs = chosen.slabs;
    report.chosen = Some(chosen);
    for &path in &cfg.paths {
        if report.skipped.iter().any(|s| s.path == path) {
            continue;
        }
        for &block in &blocks {
            if report.skipped.iter().any(|s| s.path == path) {
                break;
            }
            for &threads in &thread_counts {
                let agent = Agent::new(AgentConfig {
                    name: "bench-gds".into(),
                    gds: GdsConfig {
                        chunk: block,
                        threads,
                        slabs,
                        ..GdsConfig::default()
                    },
                    ..AgentConfig::default()
                })?;
                let access = match cfg.op {
                    Op::Read => FileAccess::ReadOnly,
                    Op::Write => FileAccess::ReadWrite,
                };
                let direct = if path == GdsPathChoice::Staged {
                    staged_direct
                } else {
                    gdpath::DirectIo::Auto
                };
                let memory = match (&new_file, &in_place) {
                    (Some(f), _) => f.memory(direct)?,
                    (None, Some(f)) => f.memory(access, direct)?,
                    (None, None) => {
                        Memory::File(FileSpec::read(&cfg.file).access(access).direct(direct))
                    }
                };
                let file = agent.register(memory)?;
                let gpu = agent.register(Memory::Gpu {
                    ordinal: cfg.gpu,
                    len: cfg.size,
                })?;
                let want = match cfg.op {
                    Op::Write => Some(gpu_fill_pattern(&agent, &gpu, cfg.size, SEED ^ block)?),
                    Op::Read => None,
                };
                let req = || {
                    TransferRequest::new(
                        cfg.op,
                        vec![gpu.desc(0, cfg.size)],
                        vec![file.desc(0, cfg.size)],
                    )
                    .accept(path.accepted())
                };
                let planned = match agent.plan(&req()) {
                    Ok(p) => p.into_iter().next(),
                    Err(Error::PathNotAccepted {
                        finding, detail, ..
                    }) => {
                        report.skipped.push(Skipped {
                            path,
                            finding,
                            detail,
                        });
                        break;
                    }
                    Err(e) => return Err(e),
                };
                progress.start(
                    &format!("{} {} block {}", path.name(), cfg.op, format_size(block)),
                    cfg.size * cfg.runs as u64,
                );
                // One untimed warm-up run: pinned bounce buffers are allocated and GPU pages
                // mapped on first use, as in any steady-state loader.
                agent.post(req())?.wait().map_err(|e| e.error)?;
                let mut samples = Vec::new();
                let mut row_path = planned.as_ref().map(|p| p.path.clone());
                for _ in 0..cfg.runs {
                    if cfg.cold {
                        // Best effort: a refused eviction leaves this run warm, not failed.
                        let _ = evict();
                    }
                    let t = Instant::now();
                    let r = agent.post(req())?.wait().map_err(|e| e.error)?;
                    samples.push(gbps(cfg.size, t.elapsed()));
                    if let Some(p) = r.pairs.first() {
                        row_path = Some(p.path.clone());
                        if let Some(f) = &p.finding {
                            if !report.findings.contains(f) {
                                report.findings.push(f.clone());
                            }
                        }
                    }
                    progress.advance(cfg.size);
                }
                progress.finish();
                let verified = match cfg.op {
                    Op::Read => Some(gpu_checksum(&agent, &gpu, cfg.size)?) == file_sum,
                    Op::Write => {
                        let f = written.expect("a write bench has its file open");
                        Some(checksum_open(f, &cfg.file, Some(cfg.size), &NoProgress)?) == want
                    }
                };
                let name = row_path.map_or_else(|| path.name().to_owned(), |p| p.name());
                let mut row = BenchRow::from_runs(
                    name,
                    cfg.op.to_string(),
                    cfg.size,
                    block,
                    threads as u32,
                    &samples,
                    &[],
                    verified,
                );
                row.src = Some(match cfg.op {
                    Op::Read => cfg.file.display().to_string(),
                    Op::Write => format!("gpu:{}", cfg.gpu),
                });
                row.dst = Some(match cfg.op {
                    Op::Read => format!("gpu:{}", cfg.gpu),
                    Op::Write => cfg.file.display().to_string(),
                });
                report.rows.push(row);
            }
        }
    }
    if let Some(f) = new_file {
        f.commit()?;
    }
    Ok(report)
}

/// The chooser's settings for the bench's file `target` (a write's size counted as the file's
/// bytes), with a single block size or thread count the caller gave in their place.
fn choose(cfg: &GdsBenchConfig, target: &std::path::Path) -> Result<Tuning> {
    let mut facts = gdpath_checkpoint::chooser::Facts::gather(&[target])?;
    if cfg.op == Op::Write {
        facts.file_bytes = cfg.size;
    }
    let one = |v: &[u64]| (v.len() == 1).then(|| v[0]);
    let over = Overrides {
        chunk: one(&cfg.blocks),
        threads: (cfg.threads.len() == 1).then(|| cfg.threads[0]),
        direct: None,
        cufile: None,
        slabs: cfg.slabs,
    };
    let mut t = gdpath_checkpoint::chooser::with_overrides(
        gdpath_checkpoint::chooser::rule(&facts, Dest::Gpu),
        &over,
    );
    if !cfg.blocks.is_empty() && cfg.slabs.is_none() {
        // A sweep of blocks (one block is an override, which does the same).
        t.slabs = 0;
    }
    Ok(t)
}
