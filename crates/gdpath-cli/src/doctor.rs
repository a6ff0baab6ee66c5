//! `gdpath doctor`: readiness of P2P, GDR and GDS with evidence and remedies; `--json` for
//! scripts (schema `gdpath.doctor/1`). Exit status: 0 all paths available, 1 some degraded,
//! 2 some unavailable, 3 the doctor itself failed.

use crate::topo::SourceArgs;
use anyhow::Result;
use clap::Args;
use gdpath::{Area, Finding, Status};
use gdpath_doctor::{self as doctor, Report};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

/// Exit status when the doctor itself fails.
pub(crate) const EXIT_FAILED: u8 = 3;

#[derive(Debug, Args)]
pub struct DoctorArgs {
    #[command(flatten)]
    source: SourceArgs,
    /// A directory to check for GDS (file system, O_DIRECT, block device, cuFile); repeatable.
    /// Default: the current directory.
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
}

/// Runs `gdpath doctor`; its errors become exit status [`EXIT_FAILED`] (in `main`, which
/// prints them as every command's).
pub fn run(args: DoctorArgs) -> Result<ExitCode> {
    let (r, what) = report(&args)?;
    if args.json {
        outln!("{}", doctor::document::doctor_json(&r));
    } else {
        out!("{}", render(&r, &what, &args));
    }
    Ok(ExitCode::from(r.exit_code()))
}

/// The report and a description of what was examined ([`doctor::examine`]).
fn report(args: &DoctorArgs) -> Result<(Report, String)> {
    let ex =
        doctor::examine(&args.source.source(), &args.paths, args.measure).map_err(examine_error)?;
    let what = ex.what();
    Ok((ex.report, what))
}

/// A bad `--path` is a usage error; anything else fails the doctor.
pub(crate) fn examine_error(e: doctor::ExamineError) -> anyhow::Error {
    match e {
        doctor::ExamineError::NotADirectory(_) => crate::usage(e.to_string()),
        e => anyhow::Error::new(e),
    }
}

fn mark(s: Status) -> &'static str {
    match s {
        Status::Ok => "✔ ok         ",
        Status::Degraded => "▲ degraded   ",
        Status::Unavailable => "✘ unavailable",
        Status::Unknown => "? unknown    ",
        Status::NotRun => "- not-run    ",
    }
}

fn title(a: Area) -> &'static str {
    match a {
        Area::P2p => "P2P (GPU ↔ GPU)",
        Area::Gdr => "GDR (GPU ↔ RDMA NIC)",
        Area::Gds | Area::Storage => "GDS (file ↔ GPU)",
        Area::System => "System",
    }
}

/// Prints one group of findings that share id, status and remedy: once, with every subject.
/// Pairs of an 8-GPU machine would otherwise repeat the same line 28 times.
fn group(o: &mut String, fs: &[&Finding]) {
    let f = fs[0];
    let subjects: Vec<&str> = fs.iter().map(|f| f.subject.as_str()).collect();
    let _ = writeln!(
        o,
        "  {} {:<28} {}",
        mark(f.status),
        f.id,
        subjects.join(", ")
    );
    if fs.iter().all(|g| g.evidence == f.evidence) {
        let _ = writeln!(o, "      {}", f.evidence);
    } else {
        for g in fs {
            let _ = writeln!(o, "      {}: {}", g.subject, g.evidence);
        }
    }
    if !f.remedy.is_empty() && !matches!(f.status, Status::Ok | Status::NotRun) {
        let _ = writeln!(o, "      → {}", f.remedy);
    }
}

/// The human output: findings grouped by path, then one verdict line per path.
fn render(r: &Report, what: &str, args: &DoctorArgs) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "gdpath doctor: {what}");
    if r.of(Area::System).any(|f| {
        f.id.as_str() == gdpath::finding::ids::SYSTEM_NO_GPU && f.status == Status::Unavailable
    }) {
        let _ = writeln!(
            o,
            "No GPU: there is no NVIDIA GPU here; checking what can be checked without one."
        );
    }
    for a in [Area::P2p, Area::Gdr, Area::Gds, Area::System] {
        let _ = writeln!(o, "\n{}", title(a));
        let (mut ok, mut not_run) = (0usize, 0usize);
        // Groups in first-seen order, keyed by what a reader acts on: id, status, remedy.
        let mut groups: Vec<Vec<&Finding>> = Vec::new();
        for f in r.of(a) {
            // What `--measure` measured is shown even when it passed or did not take the
            // direct path: the figures are what was asked for.
            let measured = args.measure && f.id.as_str().ends_with(".measured-fallback");
            match f.status {
                Status::Ok if !args.all && !measured => ok += 1,
                Status::NotRun if !args.all && !measured => not_run += 1,
                _ => match groups
                    .iter_mut()
                    .find(|g| g[0].id == f.id && g[0].status == f.status && g[0].remedy == f.remedy)
                {
                    Some(g) => g.push(f),
                    None => groups.push(vec![f]),
                },
            }
        }
        for g in &groups {
            group(&mut o, g);
        }
        if ok + not_run > 0 {
            let _ = writeln!(o, "  ({ok} passed, {not_run} not run: --all lists them)");
        }
    }
    let _ = writeln!(o, "\nVerdict:");
    for v in &r.verdicts {
        let name = match v.path {
            Area::P2p => "P2P",
            Area::Gdr => "GDR",
            Area::Gds | Area::Storage => "GDS",
            Area::System => "system",
        };
        let _ = writeln!(o, "  {} {:<6} {}", mark(v.status), name, v.summary);
    }
    if args.measure {
        let _ = writeln!(
            o,
            "\n--measure: {}",
            if matches!(args.source.source(), gdpath::topo::Source::Live) {
                "P2P was measured against the staged path (64 MiB copies per GPU pair), GDS \
                 against it in each --path (256 MiB reads into GPU 0); GDR has no probe yet and \
                 is listed as not-run."
            } else {
                "a replay has no GPU or file to measure: nothing was measured."
            }
        );
    }
    let code = r.exit_code();
    let _ = writeln!(
        o,
        "\nexit status {code}: {}",
        match code {
            0 if r.verdicts.iter().all(|v| v.status == Status::Ok) => {
                "every checked path available"
            }
            0 => "nothing degraded or unavailable, but some verdicts are unknown (see above)",
            1 => "some path degraded",
            _ => "some path unavailable",
        }
    );
    o
}
