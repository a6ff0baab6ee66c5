//! `gdpath bench storage`: file ↔ host memory, and with `--gpu` file ↔ GPU.

use super::{argv, print_findings, print_ratios, print_table, verdict};
use crate::progress;
use anyhow::{Context, Result};
use clap::Args;
use gdpath::topo::text::escape;
use gdpath::units::parse_size_range;
use gdpath::{DirectIo, Op};
use gdpath_bench::{storage, BenchDocument};
use std::path::PathBuf;
use std::process::ExitCode;

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
    /// Print JSON (schema gdpath.bench/1: docs/engine.md) instead of a table.
    #[arg(long)]
    pub(super) json: bool,
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
    /// Slabs of the staged path's buffered reads (with --gpu): the threads' reads gathered into
    /// N pinned slabs of threads × block bytes, one copy to the GPU each: 0 (a buffer pair per
    /// thread) or 2..=16 (default: chosen, 3 with 2 MiB blocks for files in memory, see
    /// `chosen:`; --block alone turns them off).
    #[arg(long, requires = "gpu", value_parser = crate::args::slabs)]
    slabs: Option<usize>,
    #[command(flatten)]
    pub metrics: super::MetricsOut,
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

pub(super) fn run_storage(a: StorageArgs) -> Result<ExitCode> {
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
        .with_context(|| format!("bench storage on {}", escape(&a.file)))?;
    let all_verified = report.rows.iter().all(|r| r.verified);
    if a.json {
        let out = BenchDocument::new("bench storage", argv(), started, report.rows)
            .findings(&report.findings)
            .with("file", &a.file)?;
        outln!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        print_table(&report.rows);
        print_findings(&report.findings);
        print_ratios(&report.rows);
        outln!("GB/s = 1e9 bytes/s; latency per I/O, submission to completion");
    }
    Ok(verdict(all_verified, ""))
}

pub(super) fn run_gds(a: &StorageArgs, gpu: u32, blocks: Vec<u64>) -> Result<ExitCode> {
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
        slabs: a.slabs,
        op: if a.write { Op::Write } else { Op::Read },
        runs: a.runs,
        paths,
        cold: a.cold,
        overwrite: a.overwrite,
    };
    let bars = progress::for_terminal(a.json);
    let started = std::time::SystemTime::now();
    let report = run(&cfg, bars.as_ref())
        .with_context(|| format!("bench storage --gpu {gpu} on {}", escape(&a.file)))?;
    let all_verified = report.rows.iter().all(|r| r.verified);
    if a.json {
        let skipped: Vec<_> = report
            .skipped
            .iter()
            .map(|s| serde_json::json!({"path": s.path.name(), "finding": s.finding, "detail": s.detail}))
            .collect();
        let out = BenchDocument::new("bench storage --gpu", argv(), started, report.rows)
            .unit("qd", "threads")
            .findings(&report.findings)
            .with("file", &a.file)?
            .with("skipped", skipped)?
            .with("chosen", &report.chosen)?
            .with(
                "chosen_text",
                report
                    .chosen
                    .as_ref()
                    .map(gdpath_checkpoint::chooser::Tuning::summary),
            )?;
        outln!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        if let Some(c) = &report.chosen {
            outln!("chosen: {}", escape(&c.summary()));
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
                escape(&s.detail)
            );
        }
        print_findings(&report.findings);
        outln!("GB/s = 1e9 bytes/s; qd = threads, each with 2 requests' buffers");
    }
    Ok(verdict(all_verified, ""))
}
