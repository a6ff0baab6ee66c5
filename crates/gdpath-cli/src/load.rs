//! `gdpath load FILE.safetensors --gpu N`: output of `gdpath::checkpoint::load`.

use anyhow::Result;
use clap::Args;
use gdpath::bench::format_size;
use gdpath::checkpoint::load;
use gdpath::{Agent, AgentConfig};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Debug, Args)]
pub struct LoadArgs {
    /// A safetensors checkpoint.
    file: PathBuf,
    /// CUDA ordinal of the GPU to load onto.
    #[arg(long, default_value_t = 0)]
    gpu: u32,
    /// Threads of the staged path (default: from the machine).
    #[arg(long)]
    threads: Option<usize>,
    /// Bytes per request (default 4 MiB).
    #[arg(long, value_parser = gdpath::bench::parse_size)]
    chunk: Option<u64>,
    /// Print every tensor (name, dtype, shape, bytes, device pointer).
    #[arg(long)]
    tensors: bool,
    /// Load this many times with one agent (the first includes CUDA context creation and
    /// cuFile driver open; later ones are the steady state a serving process sees).
    #[arg(long, default_value_t = 1)]
    repeat: usize,
    /// Drop the file from the page cache (posix_fadvise DONTNEED) before each load.
    #[arg(long)]
    cold: bool,
    /// Print JSON.
    #[arg(long)]
    pub(crate) json: bool,
}

pub fn run(a: LoadArgs) -> Result<ExitCode> {
    let mut cfg = AgentConfig::default();
    if let Some(t) = a.threads {
        cfg.gds.threads = t;
    }
    if let Some(c) = a.chunk {
        cfg.gds.chunk = c;
    }
    let agent = Agent::new(cfg)?;
    for i in 1..a.repeat.max(1) {
        if a.cold {
            drop_cache(&a.file);
        }
        let c = load(&agent, &a.file, a.gpu)?;
        if !a.json {
            println!(
                "load {i}: {} in {:.3} s: {:.2} GB/s (1e9 B/s) via {}",
                format_size(c.tensor_bytes),
                c.elapsed.as_secs_f64(),
                c.gbps(),
                c.path
            );
        }
    }
    if a.cold {
        drop_cache(&a.file);
    }
    let c = load(&agent, &a.file, a.gpu)?;
    if a.json {
        let tensors: Vec<_> = c
            .tensors
            .iter()
            .map(|t| {
                serde_json::json!({
                    "name": t.name, "dtype": format!("{:?}", t.dtype), "shape": t.shape,
                    "file_range": [t.file_range.start, t.file_range.end],
                    "device_ptr": format!("{:#x}", t.device_ptr), "offset": t.offset,
                })
            })
            .collect();
        let out = serde_json::json!({
            "schema": "gdpath.load/1",
            "command": "load",
            "file": a.file,
            "gpu": a.gpu,
            "tensors": tensors,
            "tensor_bytes": c.tensor_bytes,
            "read_bytes": c.read_bytes,
            "elapsed_s": c.elapsed.as_secs_f64(),
            "transfer_s": c.transfer.as_secs_f64(),
            "gbps": c.gbps(),
            "path": c.path.name(),
            "finding": c.finding,
            "detail": c.detail,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(ExitCode::SUCCESS);
    }
    if a.tensors {
        for t in &c.tensors {
            println!(
                "{:<60} {:>5} {:<18} {:>10} {:#x}",
                t.name,
                format!("{:?}", t.dtype),
                format!("{:?}", t.shape),
                format_size(t.bytes()),
                t.device_ptr
            );
        }
    }
    println!(
        "{}: {} tensors, {} onto GPU {} in {:.3} s: {:.2} GB/s (1e9 B/s; transfer alone {:.3} s)",
        a.file.display(),
        c.tensors.len(),
        format_size(c.tensor_bytes),
        a.gpu,
        c.elapsed.as_secs_f64(),
        c.gbps(),
        c.transfer.as_secs_f64()
    );
    match &c.finding {
        Some(f) => println!(
            "path: {} (fallback: {f}: {})",
            c.path,
            c.detail.as_deref().unwrap_or("")
        ),
        None => println!("path: {}", c.path),
    }
    Ok(ExitCode::SUCCESS)
}

fn drop_cache(path: &std::path::Path) {
    if let Ok(f) = std::fs::File::open(path) {
        use std::os::fd::AsRawFd;
        // SAFETY: advisory call on an open descriptor.
        unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    }
}
