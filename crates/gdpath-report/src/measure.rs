//! `gdpath report --measure`: the quick benches, run through `gdpath-bench` on the live machine,
//! each recorded as the document its `gdpath bench … --json` command would have written, with
//! that command line. What cannot run (no GPU, no driver) is said, with the reason.
//!
//! What runs (a minute or so on an 8-GPU machine; seconds without GPUs):
//! - `bench h2d` and `bench d2h` at 64 KiB, 1 MiB, 16 MiB and 256 MiB, 3 runs;
//! - `bench p2p` at 1 MiB, 16 MiB and 256 MiB, 3 runs (every ordered pair, and staged);
//! - `bench storage` reading a 64 MiB file at 64 KiB, 1 MiB and 8 MiB blocks, 32 in flight,
//!   3 runs, in the first `--path` directory (a file created there under an unpredictable
//!   `.gdpath-report*` name and removed afterwards);
//! - `bench storage --gpu 0` (GDS, compat, staged) on a 256 MiB file there at 1 MiB and 16 MiB
//!   blocks, when a GPU is there.
//!
//! The doctor's own probes (`doctor --measure`) run through [`gdpath_doctor::examine`].

use crate::results::{BenchDoc, Origin};
use gdpath::units::format_size;
use gdpath_bench::gds::{GdsBenchConfig, GdsPathChoice};
use gdpath_bench::gpu::{GpuBenchConfig, GpuBenchKind};
use gdpath_bench::storage::StorageBenchConfig;
use std::path::Path;

/// What was measured, and what could not be, with why.
#[derive(Debug, Default)]
pub struct Measured {
    /// The bench documents measured.
    pub docs: Vec<BenchDoc>,
    /// For each bench not measured, the command and why (`bench p2p: needs two GPUs`).
    pub missing: Vec<String>,
}

fn sizes_arg(sizes: &[u64]) -> String {
    sizes
        .iter()
        .map(|s| format_size(*s).replace(' ', ""))
        .collect::<Vec<_>>()
        .join(",")
}

fn now() -> Option<u64> {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .ok()
        .map(|d| d.as_secs())
}

fn words(w: &[&str]) -> Vec<String> {
    w.iter().map(|s| (*s).to_owned()).collect()
}

/// Runs the quick benches (see the module docs); `dir` holds the storage benches' file.
pub fn measure(dir: &Path) -> Measured {
    let mut out = Measured::default();
    let mut gpu_missing: Option<String> = None;
    for (kind, name, sizes) in [
        (
            GpuBenchKind::H2d,
            "h2d",
            vec![64 << 10, 1 << 20, 16 << 20, 256 << 20],
        ),
        (
            GpuBenchKind::D2h,
            "d2h",
            vec![64 << 10, 1 << 20, 16 << 20, 256 << 20],
        ),
        (GpuBenchKind::P2p, "p2p", vec![1 << 20, 16 << 20, 256 << 20]),
    ] {
        let command = format!("bench {name}");
        if let Some(why) = &gpu_missing {
            out.missing.push(format!("{command}: {why}"));
            continue;
        }
        let cfg = GpuBenchConfig {
            kind,
            sizes: sizes.clone(),
            runs: 3,
            gpus: None,
        };
        let started = now();
        match gdpath_bench::gpu::run(&cfg) {
            Ok(rep) => {
                // Listed under "not measured" alone: an empty card would say it again.
                if rep.rows.is_empty() {
                    let why: Vec<String> = rep
                        .notes
                        .iter()
                        .cloned()
                        .chain(rep.findings.iter().map(|f| format!("finding {f}")))
                        .collect();
                    out.missing
                        .push(format!("{command}: no rows ({})", why.join("; ")));
                    continue;
                }
                out.docs.push(BenchDoc {
                    origin: Origin::Measured,
                    command,
                    argv: Some(words(&[
                        "gdpath",
                        "bench",
                        name,
                        "--sizes",
                        &sizes_arg(&sizes),
                        "--runs",
                        "3",
                        "--json",
                    ])),
                    started_unix_s: started,
                    file: None,
                    rows: rep.rows,
                    findings: rep.findings.iter().map(|f| f.to_string()).collect(),
                    notes: rep.notes,
                });
            }
            Err(e) => {
                let why = e.to_string();
                out.missing.push(format!("{command}: not measured: {why}"));
                gpu_missing = Some(format!("not measured: {why}"));
            }
        }
    }
    match storage(dir) {
        Ok(doc) => out.docs.push(doc),
        Err(e) => out
            .missing
            .push(format!("bench storage: not measured: {e}")),
    }
    match &gpu_missing {
        Some(why) => out.missing.push(format!("bench storage --gpu 0: {why}")),
        None => match gds(dir) {
            Ok(doc) => out.docs.push(doc),
            Err(e) => out
                .missing
                .push(format!("bench storage --gpu 0: not measured: {e}")),
        },
    }
    out
}

/// A scratch file for a storage bench in `dir`, removed when dropped.
fn scratch(dir: &Path) -> gdpath::Result<tempfile::NamedTempFile> {
    tempfile::Builder::new()
        .prefix(".gdpath-report")
        .tempfile_in(dir)
        .map_err(|e| gdpath::Error::io("create", dir, 0, e))
}

fn storage(dir: &Path) -> gdpath::Result<BenchDoc> {
    let file = scratch(dir)?;
    let blocks = vec![64 << 10, 1 << 20, 8 << 20];
    let cfg = StorageBenchConfig {
        file: file.path().to_owned(),
        size: 64 << 20,
        blocks: blocks.clone(),
        qd: 32,
        op: gdpath::Op::Read,
        runs: 3,
        compare: false,
        direct: gdpath::DirectIo::Auto,
        cold: false,
        // The scratch file exists (empty): the bench fills it with its pattern.
        overwrite: true,
        // A scratch file removed after the run: no durability to pay for.
        fsync: false,
    };
    let started = now();
    let rep = gdpath_bench::storage::run(&cfg, &gdpath_bench::NoProgress)?;
    let shown = scratch_name(dir);
    let argv = [
        "gdpath",
        "bench",
        "storage",
        "--file",
        &shown,
        "--size",
        "64MiB",
        "--block",
        &sizes_arg(&blocks),
        "--qd",
        "32",
        "--runs",
        "3",
        "--overwrite",
        "--json",
    ];
    let findings = rep.findings.iter().map(|f| f.to_string()).collect();
    Ok(doc(
        "bench storage",
        &argv,
        started,
        shown.clone(),
        rep.rows,
        findings,
        Vec::new(),
    ))
}

/// How the scratch file in `dir` is shown (its name is random and gone afterwards).
fn scratch_name(dir: &Path) -> String {
    dir.join("<scratch file>").display().to_string()
}

/// A measured document of a storage bench on `file`.
fn doc(
    command: &str,
    argv: &[&str],
    started: Option<u64>,
    file: String,
    rows: Vec<gdpath_bench::BenchRow>,
    findings: Vec<String>,
    notes: Vec<String>,
) -> BenchDoc {
    BenchDoc {
        origin: Origin::Measured,
        command: command.to_owned(),
        argv: Some(words(argv)),
        started_unix_s: started,
        file: Some(file),
        rows,
        findings,
        notes,
    }
}

fn gds(dir: &Path) -> gdpath::Result<BenchDoc> {
    let file = scratch(dir)?;
    let blocks = vec![1 << 20, 16 << 20];
    let threads = gdpath::GdsConfig::default().threads;
    let cfg = GdsBenchConfig {
        file: file.path().to_owned(),
        size: 256 << 20,
        gpu: 0,
        blocks: blocks.clone(),
        threads: vec![threads],
        slabs: None,
        op: gdpath::Op::Read,
        runs: 3,
        paths: vec![
            GdsPathChoice::Gds,
            GdsPathChoice::Compat,
            GdsPathChoice::Staged,
        ],
        cold: true,
        overwrite: true,
    };
    let started = now();
    let rep = gdpath_bench::gds::run(&cfg, &gdpath_bench::NoProgress)?;
    let shown = scratch_name(dir);
    let argv = [
        "gdpath",
        "bench",
        "storage",
        "--gpu",
        "0",
        "--file",
        &shown,
        "--size",
        "256MiB",
        "--block",
        &sizes_arg(&blocks),
        "--cold",
        "--overwrite",
        "--json",
    ];
    let findings = rep.findings.iter().map(|f| f.to_string()).collect();
    let notes = rep
        .skipped
        .iter()
        .map(|s| format!("skipped {}: {}", s.path.name(), s.detail))
        .collect();
    Ok(doc(
        "bench storage --gpu",
        &argv,
        started,
        shown.clone(),
        rep.rows,
        findings,
        notes,
    ))
}
