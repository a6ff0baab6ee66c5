//! `gdpath load FILE.safetensors --gpu N`: output of `gdpath::checkpoint` loads, with the
//! storage settings `gdpath::tune::choose` picks for the file unless flags give them.

use anyhow::Result;
use clap::Args;
use gdpath::checkpoint::{Checkpoint, Destination, GpuPrestart, LoadError, LoadedCheckpoint};
use gdpath::tune::{Dest, Overrides};
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
    /// Load into host memory (4 KiB-aligned, pageable) instead of a GPU.
    #[arg(long, conflicts_with = "gpu")]
    host: bool,
    /// Threads per read (default: chosen from the machine and the file; see `chosen:`).
    #[arg(long, value_parser = crate::args::count)]
    threads: Option<usize>,
    /// Bytes per request (default: chosen, 4 MiB).
    #[arg(long, value_parser = crate::args::nonzero_size)]
    chunk: Option<u64>,
    /// Read with O_DIRECT where the file system allows (default: chosen per file).
    #[arg(long, conflicts_with = "buffered")]
    direct: bool,
    /// Read through the page cache (default: chosen per file).
    #[arg(long)]
    buffered: bool,
    /// After the last load, compare the loaded bytes with the file's (copied back in 64 MiB
    /// windows); exit status 3 when they differ.
    #[arg(long)]
    verify: bool,
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
    // The GPU's driver and context come up while the header is read, the chooser looks at the
    // file and the agent starts its CPU backends.
    let prestart = (!a.host).then(|| GpuPrestart::spawn(a.gpu));
    // The header first: a malformed file is a `checkpoint` error before anything else runs.
    let ck = Checkpoint::open(&[&a.file])?;
    if a.cold {
        drop_cache(&a.file);
    }
    let dest = if a.host {
        Destination::Host { pinned: false }
    } else {
        Destination::Gpu(a.gpu)
    };
    let over = Overrides {
        threads: a.threads,
        chunk: a.chunk,
        direct: match (a.direct, a.buffered) {
            (true, _) => Some(true),
            (_, true) => Some(false),
            _ => None,
        },
        cufile: None,
    };
    let to = if a.host { Dest::Host } else { Dest::Gpu };
    let tuning = gdpath::tune::choose(&[&a.file], to, &over)?;
    let mut cfg = AgentConfig::default();
    tuning.apply(&mut cfg);
    let agent = Agent::new(cfg)?;
    if !a.host && !agent.backends().iter().any(|b| b.name == "cuda") {
        return Err(gdpath::Error::Unsupported {
            what: format!(
                "loading onto GPU {} (no CUDA driver could be loaded here; --host loads into \
                 host memory)",
                a.gpu
            ),
            backend: "cuda",
        }
        .into());
    }
    if !a.json {
        outln!("chosen: {}", tuning.summary());
    }
    let started = if a.host {
        None
    } else {
        start(&agent, &a.file, a.gpu)
    };
    // The agent holds the context now: the prestart's hold can go.
    let context_s = prestart.and_then(GpuPrestart::finish);
    if let (Some(t), false) = (started, a.json) {
        outln!(
            "start: {t:.3} s (CUDA context, file path setup such as cuFile's driver; not in the \
             load figures){}",
            context_s.map_or(String::new(), |c| format!(
                "; the driver and context came up in {c:.3} s beside the header and chooser"
            ))
        );
    }
    let load = || -> Result<LoadedCheckpoint, LoadError> {
        let t0 = std::time::Instant::now();
        let mut c = ck.load(&agent, dest, None)?;
        c.elapsed = t0.elapsed();
        Ok(c)
    };
    let onto = match dest {
        Destination::Gpu(g) => format!("GPU {g}"),
        Destination::Host { .. } => "host memory".to_owned(),
    };
    for i in 1..a.repeat {
        if a.cold {
            drop_cache(&a.file);
        }
        let c = load()?;
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
    let c = load()?;
    let verified = if a.verify {
        Some(c.verify(&agent)?)
    } else {
        None
    };
    let status = match &verified {
        Some(v) if !v.ok => {
            let at = v.first_difference.map_or(0, |(_, at)| at);
            errln!(
                "gdpath: data verification FAILED: the loaded bytes differ from {} at file offset {at}",
                a.file.display()
            );
            ExitCode::from(crate::NOT_VERIFIED_STATUS)
        }
        _ => ExitCode::SUCCESS,
    };
    if a.json {
        let tensors: Vec<_> = c
            .tensors
            .iter()
            .map(|t| {
                let mut e = serde_json::json!({
                    "name": t.name, "dtype": format!("{:?}", t.dtype), "shape": t.shape,
                    "file_range": [t.file_range.start, t.file_range.end],
                    "offset": t.offset,
                });
                let key = if a.host { "host_ptr" } else { "device_ptr" };
                e[key] = format!("{:#x}", t.addr).into();
                e
            })
            .collect();
        let out = serde_json::json!({
            "schema": "gdpath.load/1",
            "command": "load",
            "file": a.file,
            "gpu": (!a.host).then_some(a.gpu),
            "host": a.host,
            "tensors": tensors,
            "tensor_bytes": c.tensor_bytes,
            "read_bytes": c.read_bytes,
            "elapsed_s": c.elapsed.as_secs_f64(),
            "transfer_s": c.transfer.as_secs_f64(),
            "start_s": started,
            "context_s": context_s,
            "gbps": c.gbps(),
            "path": c.path.as_ref().map(gdpath::Path::name),
            "finding": c.finding,
            "detail": c.detail,
            "chosen": tuning,
            "chosen_text": tuning.summary(),
            "cold": a.cold,
            "verified": verified.as_ref().map(|v| v.ok),
            "verify_s": verified.as_ref().map(|v| v.elapsed.as_secs_f64()),
        });
        outln!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(status);
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
        "{}: {} tensors, {} onto {onto} in {:.3} s: {:.2} GB/s (1e9 B/s; transfer alone {:.3} s)",
        a.file.display(),
        c.tensors.len(),
        format_size(c.tensor_bytes),
        c.elapsed.as_secs_f64(),
        c.gbps(),
        c.transfer.as_secs_f64()
    );
    match &c.finding {
        // Buffered was the choice, not a fallback: say so instead of the finding.
        Some(f)
            if f.as_str() == gdpath::finding::ids::STORAGE_ODIRECT_DISABLED && !tuning.direct =>
        {
            outln!("path: {} (buffered, as chosen)", path_text(&c.path))
        }
        Some(f) => outln!(
            "path: {} (fallback: {f}: {})",
            path_text(&c.path),
            c.detail.as_deref().unwrap_or("")
        ),
        None => outln!("path: {}", path_text(&c.path)),
    }
    if let Some(v) = &verified {
        outln!(
            "verified: {} ({} compared with the file in {:.3} s)",
            v.ok,
            format_size(v.bytes),
            v.elapsed.as_secs_f64()
        );
    }
    Ok(status)
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
