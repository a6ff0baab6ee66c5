//! `gdpath copy`: argument parsing and output of `gdpath_bench::copy` and
//! `gdpath_bench::gpu_copy`.

use crate::progress;
use anyhow::{Context, Result};
use clap::Args;
use gdpath::units::{format_size, parse_size};
use gdpath::{Agent, AgentConfig, DirectIo};
use gdpath_bench::copy::{copy_file, CopyOptions};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Debug, Args)]
pub struct CopyArgs {
    /// Source file, or `gpu:N[@offset]` (GPU memory filled with a test pattern; needs --size).
    src: PathBuf,
    /// Destination file (created or truncated), or `gpu:N[@offset]`. Without it the file is
    /// read into host memory only.
    dst: Option<PathBuf>,
    /// Bytes to copy from a GPU source.
    #[arg(long, value_parser = parse_size)]
    size: Option<u64>,
    /// Bytes per window (two are held in host memory).
    #[arg(long, default_value = "32MiB", value_parser = parse_size)]
    window: u64,
    /// Largest single I/O.
    #[arg(long, default_value = "1MiB", value_parser = parse_size)]
    chunk: u64,
    /// I/Os in flight.
    #[arg(long, default_value_t = 32)]
    qd: u32,
    /// Use the buffered (page cache) path instead of O_DIRECT.
    #[arg(long)]
    buffered: bool,
    /// Checksum source and destination.
    #[arg(long)]
    verify: bool,
    /// Print JSON.
    #[arg(long)]
    pub(crate) json: bool,
}

pub fn run(a: CopyArgs) -> Result<ExitCode> {
    let ep = |p: &PathBuf| {
        p.to_str()
            .and_then(gdpath_bench::gpu_copy::GpuEndpoint::parse)
    };
    let (src_gpu, dst_gpu) = (ep(&a.src), a.dst.as_ref().and_then(ep));
    if src_gpu.is_some() || dst_gpu.is_some() {
        return run_gpu(&a, src_gpu, dst_gpu);
    }
    let mut cfg = AgentConfig::default();
    cfg.storage.chunk = a.chunk;
    cfg.storage.queue_depth = a.qd;
    let agent = Agent::new(cfg)?;
    let opts = CopyOptions {
        window: a.window,
        direct: if a.buffered {
            DirectIo::Off
        } else {
            DirectIo::Auto
        },
        verify: a.verify,
    };
    let bars = progress::for_terminal(a.json);
    let r = copy_file(&agent, &a.src, a.dst.as_deref(), &opts, bars.as_ref())
        .with_context(|| format!("copy {}", a.src.display()))?;
    if a.json {
        let out = serde_json::json!({
            "schema": "gdpath.copy/1",
            "command": "copy",
            "src": a.src,
            "dst": a.dst,
            "report": r,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        let leg = |l: &Option<gdpath_bench::copy::Leg>| match l {
            Some(l) => match &l.finding {
                Some(f) => format!("{} (fallback: {f})", l.path),
                None => l.path.to_string(),
            },
            None => "-".into(),
        };
        println!(
            "{} -> {}: {} in {:.3} s, {:.3} GB/s (1e9 B/s)",
            a.src.display(),
            a.dst
                .as_ref()
                .map_or("host memory".into(), |d| d.display().to_string()),
            format_size(r.bytes),
            r.elapsed.as_secs_f64(),
            r.gbps
        );
        println!("  file -> host: {}", leg(&r.read));
        if a.dst.is_some() {
            println!("  host -> file: {}", leg(&r.write));
        }
        if let Some(v) = r.verified {
            println!("  verified: {}", if v { "yes (xxh3)" } else { "NO" });
        }
    }
    if r.verified == Some(false) {
        return Ok(ExitCode::from(crate::NOT_VERIFIED_STATUS));
    }
    Ok(ExitCode::SUCCESS)
}

type Ep = Option<std::result::Result<gdpath_bench::gpu_copy::GpuEndpoint, String>>;

fn run_gpu(a: &CopyArgs, src: Ep, dst: Ep) -> Result<ExitCode> {
    use gdpath_bench::gpu_copy::{file_to_gpu, gpu_to_file};
    let agent = Agent::new(AgentConfig::default())?;
    let r = match (src, dst, &a.dst) {
        (None, Some(d), _) => {
            file_to_gpu(&agent, &a.src, d.map_err(anyhow::Error::msg)?, a.verify)?
        }
        (Some(s), None, Some(file)) => {
            let size = a.size.context("--size is needed to copy from GPU memory")?;
            gpu_to_file(&agent, s.map_err(anyhow::Error::msg)?, size, file, a.verify)?
        }
        (Some(_), None, None) => {
            return Err(crate::usage(
                "copy from GPU memory needs a destination file",
            ))
        }
        (Some(_), Some(_), _) => {
            return Err(crate::usage("GPU to GPU copies are `gdpath bench p2p`'s"))
        }
        (None, None, _) => unreachable!("run_gpu is called with a GPU end"),
    };
    if a.json {
        let out = serde_json::json!({
            "schema": "gdpath.copy/1", "command": "copy", "src": a.src, "dst": a.dst, "report": r,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        println!(
            "{} -> {}: {} in {:.3} s, {:.3} GB/s (1e9 B/s)",
            a.src.display(),
            a.dst
                .as_ref()
                .map_or(String::new(), |d| d.display().to_string()),
            format_size(r.bytes),
            r.elapsed.as_secs_f64(),
            r.gbps
        );
        match &r.finding {
            Some(f) => println!(
                "  path: {} (fallback: {f}: {})",
                r.path,
                r.detail.as_deref().unwrap_or("")
            ),
            None => println!("  path: {}", r.path),
        }
        if let Some(v) = r.verified {
            println!("  verified: {}", if v { "yes (xxh3)" } else { "NO" });
        }
    }
    Ok(if r.verified == Some(false) {
        ExitCode::from(crate::NOT_VERIFIED_STATUS)
    } else {
        ExitCode::SUCCESS
    })
}
