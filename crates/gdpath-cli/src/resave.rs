//! `gdpath resave SRC DST`: loads a checkpoint (`gdpath_checkpoint::load`), saves it again
//! (`gdpath_checkpoint::save`), checks DST against SRC (`gdpath_checkpoint::compare_files`)
//! and prints the save's figures: the save benchmark.

use anyhow::{Context, Result};
use clap::Args;
use gdpath::topo::text::escape;
use gdpath::units::format_size;
use gdpath::{Agent, AgentConfig};
use gdpath_checkpoint::{self as ck, Checkpoint, Destination, SaveOptions};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Debug, Args)]
pub struct ResaveArgs {
    /// The safetensors checkpoint to load.
    src: PathBuf,
    /// The file to save it to (an existing one is replaced only with --overwrite, whole: a
    /// crash or kill leaves the old file or the new one).
    dst: PathBuf,
    /// CUDA ordinal of the GPU to load onto and save from.
    #[arg(long, default_value_t = 0)]
    gpu: u32,
    /// Load into and save from host memory (also what happens, with a note, when there is no
    /// CUDA driver).
    #[arg(long)]
    host: bool,
    /// Replace an existing DST.
    #[arg(long)]
    overwrite: bool,
    /// Do not fsync DST before it takes its name, nor its directory after (scratch data).
    #[arg(long)]
    no_fsync: bool,
    /// Save this many times (each replacing the last; the figures of every run are printed).
    #[arg(long, default_value_t = 1, value_parser = crate::args::count)]
    repeat: usize,
    /// Print JSON.
    #[arg(long)]
    pub(crate) json: bool,
}

pub fn run(a: ResaveArgs) -> Result<ExitCode> {
    // What the save would refuse (it checks again when it creates the file), said before
    // anything is loaded: a device, FIFO or socket, a link another user planted in a sticky
    // directory, or an existing file without --overwrite.
    gdpath::file::check_target(&a.dst, a.overwrite).context("resave")?;
    let agent = Agent::new(AgentConfig::default())?;
    if a.src.extension().is_some_and(|e| e == "json") {
        return Err(crate::usage(format!(
            "{}: resave takes one .safetensors file (and compares DST with it byte for byte); \
             resave a sharded checkpoint's files one by one",
            escape(&a.src)
        )));
    }
    let src = Checkpoint::open(&[&a.src])?;
    let mut note = None;
    let loaded = if a.host {
        src.load(&agent, Destination::Host { pinned: false }, None)?
    } else {
        match src.load(&agent, Destination::Gpu(a.gpu), None) {
            Ok(l) => l,
            Err(e) if e.kind() == "unsupported" => {
                note = Some(format!("no GPU ({e}): saved from host memory"));
                src.load(&agent, Destination::Host { pinned: false }, None)?
            }
            Err(e) => return Err(e.into()),
        }
    };
    let from = match loaded.region.kind() {
        gdpath::MemoryKind::Gpu { ordinal } => format!("GPU {ordinal}"),
        k => k.to_string(),
    };
    let tensors = ck::save::loaded_tensors(&loaded);
    let metadata: std::collections::BTreeMap<_, _> =
        src.headers[0].metadata.iter().cloned().collect();
    let mut reports = Vec::with_capacity(a.repeat);
    for i in 0..a.repeat {
        let opts = SaveOptions {
            overwrite: a.overwrite || i > 0,
            fsync: !a.no_fsync,
            metadata: metadata.clone(),
            ..SaveOptions::default()
        };
        reports.push(ck::save(&agent, &tensors, &a.dst, &opts)?);
    }
    let diff = ck::compare_files(&a.src, &a.dst)?;
    let verified = diff.is_none();
    let last = reports.last().context("at least one save")?;
    if a.json {
        let runs: Vec<_> = reports
            .iter()
            .map(|r| serde_json::json!({ "report": r, "gbps": r.gbps() }))
            .collect();
        let out = serde_json::json!({
            "schema": "gdpath.resave/1",
            "command": "resave",
            "src": a.src,
            "dst": a.dst,
            "from": from,
            "note": note,
            "load_gbps": loaded.gbps(),
            "runs": runs,
            "gbps": last.gbps(),
            "fsync": last.fsync,
            "paths": last.paths.iter().map(gdpath::DataPath::name).collect::<Vec<_>>(),
            "verified": verified,
            "difference": diff,
        });
        outln!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        outln!(
            "{}: {} tensors, {} loaded into {from} in {:.3} s",
            escape(&a.src),
            loaded.tensors.len(),
            format_size(loaded.tensor_bytes),
            loaded.elapsed.as_secs_f64()
        );
        for (i, r) in reports.iter().enumerate() {
            outln!(
                "save {}: {} to {} in {:.3} s: {:.2} GB/s (1e9 B/s; data {:.3} s, fsync and rename \
                 {:.3} s; fsync {})",
                i + 1,
                format_size(r.file_bytes),
                crate::output::written(&a.dst, r.through_link.then_some(r.path.as_path())),
                r.elapsed.as_secs_f64(),
                r.gbps(),
                r.transfer.as_secs_f64(),
                r.commit.as_secs_f64(),
                if r.fsync { "on" } else { "off (--no-fsync)" }
            );
        }
        let paths = if last.paths.is_empty() {
            "none (no tensor bytes)".to_owned()
        } else {
            last.paths
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        };
        match &last.finding {
            Some(f) => outln!(
                "path: {paths} (fallback: {f}: {})",
                escape(last.detail.as_deref().unwrap_or(""))
            ),
            None => outln!("path: {paths}"),
        }
        if let Some(n) = &note {
            outln!("note: {n}");
        }
        match &diff {
            None => outln!("verified: yes (every tensor's bytes equal the source's)"),
            Some(d) => outln!("verified: NO ({d})"),
        }
    }
    Ok(if verified {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(crate::NOT_VERIFIED_STATUS)
    })
}
