//! `gdpath copy`: argument parsing and output of `gdpath_bench::copy` and
//! `gdpath_bench::gpu_copy`.

use crate::args::refuse_if;
use crate::progress;
use anyhow::{Context, Result};
use clap::Args;
use gdpath::file::ReplaceOptions;
use gdpath::topo::text::escape;
use gdpath::units::format_size;
use gdpath::{Agent, AgentConfig, DirectIo};
use gdpath_bench::copy::{copy_file, CopyOptions};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Debug, Args)]
pub struct CopyArgs {
    /// Source file, or `gpu:N[@offset]` (GPU memory filled with a test pattern; needs --size).
    src: PathBuf,
    /// Destination file (created; an existing one is replaced only with --overwrite, whole:
    /// until the copy is complete the old file stays as it was), or `gpu:N[@offset]`. Without
    /// it the file is read into host memory only.
    dst: Option<PathBuf>,
    /// Bytes to copy: the first SIZE bytes of a file source (default: all of it); needed for a
    /// GPU source.
    #[arg(long, value_parser = crate::args::nonzero_size)]
    size: Option<u64>,
    /// Bytes per window (two are held in host memory), file to file or to memory
    /// [default: 32MiB].
    #[arg(long, value_parser = crate::args::nonzero_size)]
    window: Option<u64>,
    /// Largest single I/O, file to file or to memory [default: 1MiB].
    #[arg(long, value_parser = crate::args::nonzero_size)]
    chunk: Option<u64>,
    /// I/Os in flight, file to file or to memory [default: 32].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    qd: Option<u32>,
    /// Use the buffered (page cache) path instead of O_DIRECT (file to file or to memory).
    #[arg(long)]
    buffered: bool,
    /// Checksum source and destination; a destination that does not match is not kept.
    #[arg(long)]
    verify: bool,
    /// Replace an existing destination file.
    #[arg(long)]
    overwrite: bool,
    /// Do not fsync the destination before it takes its name, nor its directory after.
    #[arg(long)]
    no_fsync: bool,
    /// Print JSON.
    #[arg(long)]
    pub(crate) json: bool,
}

impl CopyArgs {
    fn replace(&self) -> ReplaceOptions {
        ReplaceOptions {
            overwrite: self.overwrite,
            fsync: !self.no_fsync,
        }
    }
}

pub fn run(a: CopyArgs) -> Result<ExitCode> {
    let ep = |p: &PathBuf| {
        p.to_str()
            .and_then(gdpath_bench::gpu_copy::GpuEndpoint::parse)
    };
    let (src_gpu, dst_gpu) = (ep(&a.src), a.dst.as_ref().and_then(ep));
    // A malformed GPU end is the first thing to say, whatever else is missing.
    for e in [&src_gpu, &dst_gpu].into_iter().flatten() {
        if let Err(m) = e {
            return Err(crate::usage(format!("bad GPU: {m}")));
        }
    }
    let ok = |e: Ep| e.and_then(std::result::Result::ok);
    let (src_gpu, dst_gpu) = (ok(src_gpu), ok(dst_gpu));
    if src_gpu.is_some() || dst_gpu.is_some() {
        return run_gpu(&a, src_gpu, dst_gpu);
    }
    if a.dst.is_none() {
        let why = "applies to a destination file: without one the file is read into memory only";
        refuse_if(a.overwrite, "--overwrite", why)?;
        refuse_if(a.no_fsync, "--no-fsync", why)?;
    }
    let mut cfg = AgentConfig::default();
    if let Some(c) = a.chunk {
        cfg.storage.chunk = c;
    }
    if let Some(q) = a.qd {
        cfg.storage.queue_depth = q;
    }
    let opts = CopyOptions {
        window: a.window.unwrap_or(gdpath_bench::copy::DEFAULT_WINDOW),
        direct: if a.buffered {
            DirectIo::Off
        } else {
            DirectIo::Auto
        },
        verify: a.verify,
        size: a.size,
        replace: a.replace(),
    };
    let agent = Agent::new(cfg)?;
    let bars = progress::for_terminal(a.json);
    let r = copy_file(&agent, &a.src, a.dst.as_deref(), &opts, bars.as_ref())
        .with_context(|| format!("copy {}", escape(&a.src)))?;
    if a.json {
        let out = serde_json::json!({
            "schema": "gdpath.copy/1",
            "command": "copy",
            "src": a.src,
            "dst": a.dst,
            "report": r,
        });
        outln!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        let leg = |l: &Option<gdpath_bench::copy::Leg>| match l {
            Some(l) => match &l.finding {
                Some(f) => format!("{} (fallback: {f})", l.path),
                None => l.path.to_string(),
            },
            None => "-".into(),
        };
        outln!(
            "{} -> {}: {} in {:.3} s, {:.3} GB/s (1e9 B/s)",
            escape(&a.src),
            a.dst.as_ref().map_or("host memory".into(), |d| {
                crate::output::written(d, r.dst_file.as_deref())
            }),
            format_size(r.bytes),
            r.elapsed.as_secs_f64(),
            r.gbps
        );
        outln!("  file -> host: {}", leg(&r.read));
        if a.dst.is_some() {
            outln!("  host -> file: {}", leg(&r.write));
        }
        if let Some(n) = &r.note {
            outln!("  note: {n}");
        }
        print_verified(r.verified, a.dst.is_some());
    }
    if r.verified == Some(false) {
        return Ok(ExitCode::from(crate::NOT_VERIFIED_STATUS));
    }
    Ok(ExitCode::SUCCESS)
}

/// The `verified:` line; a destination that did not verify was not kept.
fn print_verified(verified: Option<bool>, to_file: bool) {
    match verified {
        Some(true) => outln!("  verified: yes (xxh3)"),
        Some(false) if to_file => {
            outln!("  verified: NO (the destination was left as it was)")
        }
        Some(false) => outln!("  verified: NO"),
        None => {}
    }
}

/// A command-line end: not a GPU, a GPU, or a malformed `gpu:` end.
type Ep = Option<std::result::Result<gdpath_bench::gpu_copy::GpuEndpoint, String>>;

fn run_gpu(
    a: &CopyArgs,
    src: Option<gdpath_bench::gpu_copy::GpuEndpoint>,
    dst: Option<gdpath_bench::gpu_copy::GpuEndpoint>,
) -> Result<ExitCode> {
    use gdpath_bench::gpu_copy::{file_to_gpu, gpu_to_file};
    let why = "applies to copies between files (a GPU copy is one transfer on the path the \
               planner picks)";
    refuse_if(a.window.is_some(), "--window", why)?;
    refuse_if(a.chunk.is_some(), "--chunk", why)?;
    refuse_if(a.qd.is_some(), "--qd", why)?;
    refuse_if(a.buffered, "--buffered", why)?;
    let into_gpu = "applies to a destination file, and this copy writes GPU memory";
    match (src, dst, &a.dst) {
        (Some(_), Some(_), _) => Err(crate::usage("GPU to GPU copies are `gdpath bench p2p`'s")),
        (Some(_), None, None) => Err(crate::usage(
            "copy from GPU memory needs a destination file",
        )),
        (None, Some(_), _) => {
            refuse_if(a.overwrite, "--overwrite", into_gpu)?;
            refuse_if(a.no_fsync, "--no-fsync", into_gpu)?;
            Ok(())
        }
        (Some(_), None, Some(_)) if a.size.is_none() => {
            Err(crate::usage("--size is needed to copy from GPU memory"))
        }
        _ => Ok(()),
    }?;
    let agent = Agent::new(AgentConfig::default())?;
    let r = match (src, dst, &a.dst) {
        (None, Some(d), _) => file_to_gpu(&agent, &a.src, d, a.size, a.verify)?,
        (Some(s), None, Some(file)) => {
            let size = a.size.context("--size is needed to copy from GPU memory")?;
            gpu_to_file(&agent, s, size, file, a.verify, a.replace())?
        }
        _ => unreachable!("the combinations without one GPU end and a file were refused above"),
    };
    if a.json {
        let out = serde_json::json!({
            "schema": "gdpath.copy/1", "command": "copy", "src": a.src, "dst": a.dst, "report": r,
        });
        outln!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        outln!(
            "{} -> {}: {} in {:.3} s, {:.3} GB/s (1e9 B/s)",
            escape(&a.src),
            a.dst.as_ref().map_or(String::new(), |d| {
                crate::output::written(d, r.dst_file.as_deref())
            }),
            format_size(r.bytes),
            r.elapsed.as_secs_f64(),
            r.gbps
        );
        match &r.finding {
            Some(f) => outln!(
                "  path: {} (fallback: {f}: {})",
                r.path,
                escape(r.detail.as_deref().unwrap_or(""))
            ),
            None => outln!("  path: {}", r.path),
        }
        print_verified(r.verified, a.dst.as_ref().is_some_and(|_| dst.is_none()));
    }
    Ok(if r.verified == Some(false) {
        ExitCode::from(crate::NOT_VERIFIED_STATUS)
    } else {
        ExitCode::SUCCESS
    })
}
