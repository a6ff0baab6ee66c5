//! `gdpath doctor`: readiness of P2P, GDR and GDS with evidence and remedies; `--json` for
//! scripts (schema `gdpath.doctor/1`). The text is `gdpath_doctor::render`'s. Exit status
//! (`gdpath_doctor::exit`): 0 nothing degraded or unavailable, 1 some degraded, 2 some
//! unavailable, 3 the doctor itself failed, 4 no verdict could be decided.

use crate::source::{examine_error, SourceArgs};
use anyhow::Result;
use clap::Args;
use gdpath_doctor::render::{self, TextOptions};
use gdpath_doctor::{self as doctor, Mode, Report};
use std::path::PathBuf;
use std::process::ExitCode;

/// Exit status when the doctor itself fails.
pub(crate) const EXIT_FAILED: u8 = doctor::exit::FAILED;

#[derive(Debug, Args)]
#[command(
    after_help = "Exit status: 0 nothing degraded or unavailable (some verdict decided), \
    1 some finding degraded, 2 some unavailable, 3 the doctor itself failed, 4 no verdict could \
    be decided (every path unknown or not run: a broken --sysfs-root, a source that describes \
    too little), so that `gdpath doctor && launch` does not go ahead on it. With --need, only \
    the paths named (and system findings) count."
)]
pub struct DoctorArgs {
    #[command(flatten)]
    source: SourceArgs,
    /// A directory to check for GDS (file system, O_DIRECT, block device, cuFile); repeatable.
    /// Default: the current directory on the live machine, none in a replay (the directory
    /// this command runs in is not on the replayed machine).
    #[arg(long = "path", value_name = "DIR")]
    paths: Vec<PathBuf>,
    /// Print JSON (schema gdpath.doctor/1) instead of text.
    #[arg(long)]
    pub(crate) json: bool,
    /// Also measure P2P against its staged fallback per GPU pair, and GDS against its staged
    /// fallback in each --path (default: the current directory; a 256 MiB file is written
    /// there and removed; a few seconds). GDR has no probe yet and is listed as not-run.
    #[arg(long)]
    measure: bool,
    /// List every finding; by default passed (`ok`) and `not-run` checks are only counted
    /// (--json always lists every one).
    #[arg(long)]
    all: bool,
    /// Show every evidence text and remedy; by default one line per finding.
    #[arg(long, short)]
    verbose: bool,
    /// The paths the exit status judges: a comma list of p2p, gdr, gds (default: all; system
    /// findings always count). E.g. `--need gds` on a one-GPU node without an RDMA NIC, where
    /// P2P and GDR are unavailable by nature. Every finding is still reported.
    #[arg(long, value_delimiter = ',', value_parser = parse_area)]
    need: Vec<gdpath::finding::Area>,
}

/// A path name of `--need`.
fn parse_area(s: &str) -> Result<gdpath::finding::Area, String> {
    match s {
        "p2p" => Ok(gdpath::finding::Area::P2p),
        "gdr" => Ok(gdpath::finding::Area::Gdr),
        "gds" => Ok(gdpath::finding::Area::Gds),
        other => Err(format!("{other:?}: expected p2p, gdr or gds")),
    }
}

/// Runs `gdpath doctor`; its errors become exit status [`EXIT_FAILED`] (in `main`, which
/// prints them as every command's).
pub fn run(args: DoctorArgs) -> Result<ExitCode> {
    let (r, mode) = report(&args)?;
    if args.json {
        outln!("{}", doctor::document::doctor_json(&r));
    } else {
        let opts = TextOptions {
            verbose: args.verbose,
            all: args.all,
            measure: args.measure,
            need: args.need.clone(),
        };
        out!("{}", render::text(&r, &mode, opts));
    }
    Ok(ExitCode::from(r.exit_code_for(&args.need)))
}

/// The report and what was examined ([`doctor::examine`]).
fn report(args: &DoctorArgs) -> Result<(Report, Mode)> {
    let ex =
        doctor::examine(&args.source.source(), &args.paths, args.measure).map_err(examine_error)?;
    Ok((ex.report, ex.loaded.mode))
}
