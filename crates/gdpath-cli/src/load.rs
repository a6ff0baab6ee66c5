//! `gdpath load FILE.safetensors --gpu N`: output of `gdpath_checkpoint` loads, with the
//! storage settings `gdpath_checkpoint::chooser::choose` picks for the file unless flags give them.

use anyhow::Result;
use clap::Args;
use gdpath::topo::text::escape;
use gdpath::units::format_size;
use gdpath::AgentConfig;
use gdpath_checkpoint::chooser::Overrides;
use gdpath_checkpoint::{Checkpoint, Destination, LoadError};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Debug, Args)]
pub struct LoadArgs {
    /// A safetensors checkpoint: one file, the files of a sharded one, or its
    /// `model.safetensors.index.json`.
    #[arg(required = true, value_name = "FILE")]
    files: Vec<PathBuf>,
    /// CUDA ordinal of the GPU to load onto.
    #[arg(long, default_value_t = 0)]
    gpu: u32,
    /// Load into host memory (4 KiB-aligned, pageable) instead of a GPU.
    #[arg(long, conflicts_with = "gpu")]
    host: bool,
    /// Threads per read (default: chosen from the machine and the file; see `chosen:`).
    #[arg(long, value_parser = crate::args::count)]
    threads: Option<usize>,
    /// Bytes per request (default: chosen, 2 MiB from memory onto a GPU, 4 MiB from memory into
    /// host memory, 16 MiB from a local disk).
    #[arg(long, value_parser = crate::args::nonzero_size)]
    chunk: Option<u64>,
    /// Buffered reads onto a GPU gather the threads' requests into N pinned slabs, one copy to
    /// the GPU each: 0 (a buffer pair per thread) or 2..=16 (default: chosen, 3 with 2 MiB
    /// requests for files in memory; --chunk alone turns them off).
    #[arg(long, value_parser = crate::args::slabs, conflicts_with_all = ["host", "direct"])]
    slabs: Option<usize>,
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
    /// process: its buffers made; a file read buffered stays in the page cache, one read with
    /// O_DIRECT, the chooser's choice for a cold file on ext4/xfs/btrfs, does not). One-time
    /// setup (CUDA context, cuFile's driver) is done before the first and timed apart (`start`).
    /// On a GPU each later load starts 1 s after the previous one's memory was freed, untimed
    /// (`LoadSetup::settle_after_free`): copies overlapping the driver's work on a freed
    /// allocation run about 10 % slower.
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
    // The header first: a malformed file is a `checkpoint` error before anything else runs.
    let ck = Checkpoint::open_paths(&a.files)?;
    let cold = || {
        if a.cold {
            ck.files.iter().for_each(|f| drop_cache(f));
        }
    };
    cold();
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
        slabs: a.slabs,
    };
    let mut setup = ck
        .setup(dest, &over, AgentConfig::default())
        .map_err(host_hint)?;
    let tuning = setup.tuning.clone();
    if !a.json {
        outln!("chosen: {}", escape(&tuning.summary()));
    }
    // A step that fails here fails again in the load, which says why.
    let started = setup.warm_up(&ck).ok().flatten();
    if let (Some(t), false) = (started, a.json) {
        outln!(
            "start: {t:.3} s (CUDA context, file path setup such as cuFile's driver; not in the \
             load figures){}",
            setup.context_s().map_or(String::new(), |c| format!(
                "; the driver and context came up in {c:.3} s beside the header and chooser"
            ))
        );
    }
    let onto = match dest {
        Destination::Gpu(g) => format!("GPU {g}"),
        Destination::Host { .. } => "host memory".to_owned(),
    };
    for i in 1..a.repeat {
        if i > 1 {
            setup.settle_after_free();
        }
        cold();
        let c = setup.load(&ck, None)?;
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
    if a.repeat > 1 {
        setup.settle_after_free();
    }
    cold();
    let c = setup.load(&ck, None)?;
    let verified = if a.verify {
        Some(c.verify(&setup.agent)?)
    } else {
        None
    };
    let status = match &verified {
        Some(v) if !v.ok => {
            let (file, at) = v.first_difference.unwrap_or((0, 0));
            errln!(
                "gdpath: data verification FAILED: the loaded bytes differ from {} at file offset {at}",
                escape(&ck.files[file])
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
            "file": ck.files[0],
            "files": ck.files,
            "gpu": (!a.host).then_some(a.gpu),
            "host": a.host,
            "tensors": tensors,
            "tensor_bytes": c.tensor_bytes,
            "read_bytes": c.read_bytes,
            "elapsed_s": c.elapsed.as_secs_f64(),
            "transfer_s": c.transfer.as_secs_f64(),
            "start_s": started,
            "context_s": setup.context_s(),
            "gbps": c.gbps(),
            "path": c.path.as_ref().map(gdpath::DataPath::name),
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
                escape(&t.name),
                format!("{:?}", t.dtype),
                format!("{:?}", t.shape),
                format_size(t.bytes()),
                t.addr
            );
        }
    }
    outln!(
        "{}{}: {} tensors, {} onto {onto} in {:.3} s: {:.2} GB/s (1e9 B/s; transfer alone {:.3} s)",
        escape(&ck.files[0]),
        match ck.files.len() {
            1 => String::new(),
            n => format!(" and {} more files", n - 1),
        },
        c.tensors.len(),
        format_size(c.tensor_bytes),
        c.elapsed.as_secs_f64(),
        c.gbps(),
        c.transfer.as_secs_f64()
    );
    match &c.finding {
        Some(f) => outln!(
            "path: {} (fallback: {f}: {})",
            path_text(&c.path),
            escape(c.detail.as_deref().unwrap_or(""))
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
fn path_text(p: &Option<gdpath::DataPath>) -> String {
    p.as_ref()
        .map_or_else(|| "none (no bytes to read)".to_owned(), ToString::to_string)
}

/// Drops the file from the page cache before a cold load; best effort (a refused eviction
/// leaves that load warm, not failed).
fn drop_cache(path: &std::path::Path) {
    let _ = gdpath::os::evict_page_cache(path);
}

/// The CLI's way to load without a GPU, named where the engine says no CUDA driver loads.
fn host_hint(e: LoadError) -> LoadError {
    let LoadError::Engine { path, error } = e else {
        return e;
    };
    let error = match *error {
        gdpath::Error::Unsupported {
            what,
            backend: "cuda",
        } => gdpath::Error::Unsupported {
            what: format!(
                "{}; --host loads into host memory)",
                what.trim_end_matches(')')
            ),
            backend: "cuda",
        },
        other => other,
    };
    LoadError::Engine {
        path,
        error: Box::new(error),
    }
}
