//! `gdpath report`: the machine, its data paths, the doctor's findings and bench charts as one
//! self-contained HTML file (`gdpath_report`); here only the arguments and the file.

use crate::source::{report_error, SourceArgs};
use anyhow::{Context, Result};
use clap::Args;
use gdpath::topo::text::escape;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Debug, Args)]
pub struct ReportArgs {
    /// The HTML file to write (an existing one is replaced only with --overwrite, whole:
    /// readers see the old report or the new one, never part of one).
    #[arg(short, long, default_value = "report.html")]
    output: PathBuf,
    /// Replace an existing output file.
    #[arg(long)]
    overwrite: bool,
    /// Bench results to chart and put on the paths: documents of `gdpath bench … --json`.
    #[arg(long = "from", value_name = "FILE", num_args = 1..)]
    from: Vec<PathBuf>,
    /// Measure now: the doctor's probes and quick h2d, d2h, p2p and storage benches (on the
    /// live machine; a storage file is written in the first --path and removed).
    #[arg(long)]
    measure: bool,
    /// A directory to check for GDS; repeatable. Default: the current directory on the live
    /// machine, none in a replay (the directory this command runs in is not on the replayed
    /// machine).
    #[arg(long = "path", value_name = "DIR")]
    paths: Vec<PathBuf>,
    /// NCCL logs (NCCL_DEBUG=INFO) whose chosen paths are shown over the machine, pair by
    /// pair, with the `gdpath nccl` findings; the machine's topology is taken for every host.
    #[arg(long = "nccl-log", value_name = "LOG", num_args = 1..)]
    nccl_logs: Vec<PathBuf>,
    #[command(flatten)]
    source: SourceArgs,
}

/// Runs `gdpath report`.
pub fn run(a: ReportArgs) -> Result<ExitCode> {
    // What the save would refuse, said before the report is made (and --measure runs).
    gdpath::file::check_target(&a.output, a.overwrite)
        .with_context(|| format!("writing the report to {}", escape(&a.output)))?;
    let opts = gdpath_report::Options {
        source: a.source.source(),
        paths: a.paths,
        from: a.from,
        measure: a.measure,
        argv: std::env::args().collect(),
        nccl_logs: a.nccl_logs,
    };
    let html = gdpath_report::report(&opts).map_err(report_error)?;
    let t = gdpath_report::save(&a.output, html.as_bytes(), a.overwrite)
        .with_context(|| format!("writing the report to {}", escape(&a.output)))?;
    outln!(
        "wrote {} ({} KiB)",
        crate::output::written_target(&a.output, &t),
        html.len().div_ceil(1024)
    );
    Ok(ExitCode::SUCCESS)
}
