//! `gdpath bench p2p|h2d|d2h`: GPU copies.

use super::{argv, verdict};
use anyhow::{Context, Result};
use clap::Args;
use comfy_table::{presets::UTF8_BORDERS_ONLY, Table};
use gdpath::units::{format_size, parse_size_range};
use gdpath_bench::{gpu, BenchDocument};
use std::process::ExitCode;

#[derive(Debug, Args)]
pub struct GpuArgs {
    /// Copy sizes: a size, a power-of-two sweep `4KiB..1GiB`, or a list of either `4KiB,1MiB..8MiB`.
    #[arg(long, default_value = "4KiB..1GiB")]
    sizes: String,
    /// Timed runs per row (min/median/max are over runs).
    #[arg(long, default_value_t = 5, value_parser = crate::args::count)]
    runs: usize,
    /// Only these GPUs (CUDA ordinals, comma-separated).
    #[arg(long, value_delimiter = ',')]
    gpus: Option<Vec<u32>>,
    /// Print JSON rows instead of a table.
    #[arg(long)]
    pub(super) json: bool,
    #[command(flatten)]
    pub metrics: super::MetricsOut,
}

pub(super) fn run_gpu(kind: gpu::GpuBenchKind, a: GpuArgs) -> Result<ExitCode> {
    let cfg = gpu::GpuBenchConfig {
        kind,
        sizes: parse_size_range(&a.sizes).context("--sizes")?,
        runs: a.runs,
        gpus: a.gpus.clone(),
    };
    let name = match kind {
        gpu::GpuBenchKind::P2p => "bench p2p",
        gpu::GpuBenchKind::H2d => "bench h2d",
        gpu::GpuBenchKind::D2h => "bench d2h",
    };
    let started = std::time::SystemTime::now();
    let report = gpu::run(&cfg).with_context(|| name.to_owned())?;
    if a.json {
        let out = BenchDocument::new(name, argv(), started, report.rows.clone())
            .findings(&report.findings)
            .notes(&report.notes);
        outln!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        let mut t = Table::new();
        t.load_preset(UTF8_BORDERS_ONLY);
        t.set_header([
            "path",
            "src",
            "dst",
            "size",
            "GB/s min",
            "GB/s median",
            "GB/s max",
            "latency µs",
            "limit GB/s",
            "% limit",
            "verified",
        ]);
        for r in &report.rows {
            let lim = r.limit_gbps;
            t.add_row([
                r.path.clone(),
                r.src.clone().unwrap_or_default(),
                r.dst.clone().unwrap_or_default(),
                format_size(r.bytes),
                format!("{:.2}", r.gbps_min),
                format!("{:.2}", r.gbps_median),
                format!("{:.2}", r.gbps_max),
                r.latency_us.map(|l| format!("{l:.2}")).unwrap_or_default(),
                lim.map(|l| format!("{l:.1}")).unwrap_or_default(),
                lim.map(|l| format!("{:.0}", 100.0 * r.gbps_median / l))
                    .unwrap_or_default(),
                if r.verified {
                    "yes".into()
                } else {
                    "NO".into()
                },
            ]);
        }
        outln!("{t}");
        for f in &report.findings {
            outln!("finding: {f}");
        }
        for n in &report.notes {
            outln!("note: {n}");
        }
        outln!("GB/s = 1e9 bytes/s; limit = NVLink count x per-link rate, or PCIe gen x width (per direction; x2 for bidir)");
    }
    Ok(verdict(report.rows.iter().all(|r| r.verified), ""))
}
