//! `gdpath load FILE.safetensors --gpu N`: output of `gdpath::checkpoint::load`.

use anyhow::Result;
use clap::Args;
use gdpath::checkpoint::load;
use gdpath::units::format_size;
use gdpath::{Agent, AgentConfig, FileSpec, Memory, TransferRequest};
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
    #[arg(long, value_parser = crate::args::count)]
    threads: Option<usize>,
    /// Bytes per request (default 4 MiB).
    #[arg(long, value_parser = crate::args::nonzero_size)]
    chunk: Option<u64>,
    /// Print every tensor (name, dtype, shape, bytes, device pointer; --json always lists
    /// them).
    #[arg(long)]
    tensors: bool,
    /// Load this many times with one agent (later loads show the steady state of a serving
    /// process: the page cache warm, the file's blocks cached by the file system). One-time
    /// setup (CUDA context, cuFile's driver) is done before the first and timed apart (`start`).
    #[arg(long, default_value_t = 1, value_parser = crate::args::count)]
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
    let started = start(&agent, &a.file, a.gpu);
    if let (Some(t), false) = (started, a.json) {
        outln!(
            "start: {t:.3} s (CUDA context, file path setup such as cuFile's driver; not in the \
             load figures)"
        );
    }
    for i in 1..a.repeat {
        if a.cold {
            drop_cache(&a.file);
        }
        let c = load(&agent, &a.file, a.gpu)?;
        if !a.json {
            outln!(
                "load {i}: {} in {:.3} s: {:.2} GB/s (1e9 B/s) via {}",
                format_size(c.tensor_bytes),
                c.elapsed.as_secs_f64(),
                c.gbps(),
                path_text(&c.path)
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
                    "device_ptr": format!("{:#x}", t.addr), "offset": t.offset,
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
            "start_s": started,
            "gbps": c.gbps(),
            "path": c.path.as_ref().map(gdpath::Path::name),
            "finding": c.finding,
            "detail": c.detail,
        });
        outln!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(ExitCode::SUCCESS);
    }
    if a.tensors {
        for t in &c.tensors {
            outln!(
                "{:<60} {:>5} {:<18} {:>10} {:#x}",
                t.name,
                format!("{:?}", t.dtype),
                format!("{:?}", t.shape),
                format_size(t.bytes()),
                t.addr
            );
        }
    }
    outln!(
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
        Some(f) => outln!(
            "path: {} (fallback: {f}: {})",
            path_text(&c.path),
            c.detail.as_deref().unwrap_or("")
        ),
        None => outln!("path: {}", path_text(&c.path)),
    }
    Ok(ExitCode::SUCCESS)
}

/// The path a load took, or why it has none (a checkpoint of no tensor bytes reads nothing).
fn path_text(p: &Option<gdpath::Path>) -> String {
    p.as_ref()
        .map_or_else(|| "none (no bytes to read)".to_owned(), ToString::to_string)
}

/// One-time setup a serving process pays once, done before the timed loads: the GPU's CUDA
/// context and the file path's own (cuFile's driver open and file registration attempt, the
/// staged path's pinned bounce buffers), by reading the file's first `threads × chunk` bytes
/// onto the GPU: the staged path deals a pair's chunks round-robin to its threads, so that read
/// makes each thread take its two bounce buffers once, and they stay pooled. On the H200 it
/// took 0.12 s for the context and ≈ 0.6 s for cuFile's driver open, which made a first 1 GiB
/// load from the page cache 1.4 GB/s against 40 for the next; with the context and the driver
/// set up, the 48 pinned buffers (≈ 200 MiB) allocated by the first load still took 0.1–0.17 s
/// of it. `safetensors`/PyTorch timings start with CUDA up too. Seconds taken; `None` when a
/// step failed (the load then reports why).
fn start(agent: &Agent, file: &std::path::Path, gpu: u32) -> Option<f64> {
    let t = std::time::Instant::now();
    let f = agent.register(Memory::File(FileSpec::read(file))).ok()?;
    let gds = &agent.config().gds;
    let len = f.len().ok()?.min((gds.threads as u64).max(1) * gds.chunk);
    if len > 0 {
        let g = agent.register(Memory::Gpu { ordinal: gpu, len }).ok()?;
        agent
            .post(TransferRequest::read(
                vec![g.desc(0, len)],
                vec![f.desc(0, len)],
            ))
            .ok()?
            .wait()
            .ok()?;
    }
    Some(t.elapsed().as_secs_f64())
}

/// Drops the file from the page cache before a cold load; best effort (a refused eviction
/// leaves that load warm, not failed).
fn drop_cache(path: &std::path::Path) {
    let _ = gdpath::os::evict_page_cache(path);
}
