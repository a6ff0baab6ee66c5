//! `gdpath doctor`: readiness of P2P, GDR and GDS with evidence and remedies; `--json` for
//! scripts (schema `gdpath.doctor/1`). The text is `gdpath_doctor::render`'s. Exit status
//! (`gdpath_doctor::exit`): 0 nothing degraded or unavailable, 1 some degraded, 2 some
//! unavailable, 3 the doctor itself failed, 4 no verdict could be decided.

use crate::topo::SourceArgs;
use anyhow::{Context, Result};
use clap::Args;
use gdpath::Area;
use gdpath_doctor::render::{self, TextOptions};
use gdpath_doctor::{self as doctor, live, measured, DoctorInput, Mode, Report};
use std::path::PathBuf;
use std::process::ExitCode;

/// Exit status when the doctor itself fails.
pub(crate) const EXIT_FAILED: u8 = doctor::exit::FAILED;

#[derive(Debug, Args)]
#[command(
    after_help = "Exit status: 0 nothing degraded or unavailable (some verdict decided), \
    1 some finding degraded, 2 some unavailable, 3 the doctor itself failed, 4 no verdict could \
    be decided (every path unknown or not run: a broken --sysfs-root, a source that describes \
    too little), so that `gdpath doctor && launch` does not go ahead on it."
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
    /// List every finding; by default passed (`ok`) and `not-run` checks are only counted.
    #[arg(long)]
    all: bool,
    /// Show every evidence text and remedy; by default one line per finding.
    #[arg(long, short)]
    verbose: bool,
}

/// Runs `gdpath doctor`; its errors become exit status [`EXIT_FAILED`] (in `main`, which
/// prints them as every command's).
pub fn run(args: DoctorArgs) -> Result<ExitCode> {
    let (r, mode) = report(&args)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        let opts = TextOptions {
            verbose: args.verbose,
            all: args.all,
            measure: args.measure,
        };
        print!("{}", render::text(&r, &mode, opts));
    }
    Ok(ExitCode::from(r.exit_code()))
}

/// The report and what was examined.
fn report(args: &DoctorArgs) -> Result<(Report, Mode)> {
    let source = args.source.source();
    let loaded = doctor::load(&source).context("reading the machine")?;
    // The current directory is a directory of the machine this runs on: a default only there.
    let paths = match (&loaded.mode, args.paths.is_empty()) {
        (Mode::Live, true) => vec![std::env::current_dir().context("current directory")?],
        _ => args.paths.clone(),
    };
    for p in &paths {
        // A mistyped --path would otherwise become "unknown" findings and a misleading exit.
        if !p.is_dir() {
            return Err(crate::usage(format!(
                "--path {}: not a directory",
                p.display()
            )));
        }
    }
    // Each directory once (`/data` and `/data/`, or a link to it, are one), as first written.
    let mut seen = Vec::new();
    let paths: Vec<PathBuf> = paths
        .into_iter()
        .filter(|p| {
            let c = std::fs::canonicalize(p).unwrap_or_else(|_| p.clone());
            let new = !seen.contains(&c);
            seen.push(c);
            new
        })
        .collect();
    let input = match &loaded.mode {
        Mode::Live => live::gather(&loaded.machine, loaded.view.as_ref(), &paths),
        Mode::Replay { .. } => {
            let mut i =
                DoctorInput::new(&loaded.machine, loaded.view.as_ref(), loaded.mode.clone());
            i.env = live::environment();
            i.paths = live::unprobed(&paths);
            i
        }
    };
    let mut r = doctor::run(&input);
    if args.measure {
        // Only live: a replay has no GPUs to measure.
        if matches!(loaded.mode, Mode::Live) {
            r.extend(measured::probe_p2p());
            r.extend(measured::probe_gds(&paths));
        } else {
            r.extend(
                [Area::P2p, Area::Gds]
                    .into_iter()
                    .filter_map(measured::not_live),
            );
        }
        r.extend(measured::not_available(Area::Gdr));
    }
    Ok((r, loaded.mode))
}
