//! The JSON documents of `gdpath topo --json` (schema `gdpath.topo/1`) and `gdpath doctor --json`
//! (schema [`crate::DOCTOR_SCHEMA`]), built here once for every caller: the CLI prints them and
//! the Python module returns them parsed (`gdpath.topo()`, `gdpath.doctor()`), so both give the
//! same bytes for the same arguments.

use crate::{live, measured, DoctorInput, Mode, Report};
use gdpath::finding::Area;
use gdpath_topo::{Machine, Source, TopoError};
use std::path::PathBuf;

/// Why the doctor could not examine a machine (its exit status 3).
#[derive(Debug, thiserror::Error)]
pub enum DoctorError {
    /// The machine could not be read from its source.
    #[error("reading the machine: {0}")]
    Machine(#[from] TopoError),
    /// A GDS directory to check is not a directory (a mistyped `--path` would otherwise
    /// become `unknown` findings and a misleading verdict).
    #[error("--path {}: not a directory", .0.display())]
    NotADirectory(PathBuf),
    /// No directory was given and the current one cannot be read.
    #[error("current directory: {0}")]
    CurrentDir(#[source] std::io::Error),
}

/// The machine of `source` for `gdpath topo` ([`crate::machine::load_reporting`]: with live
/// driver facts for the live machine) and, when NVLink facts are missing, why.
pub fn topo(source: &Source) -> Result<(Machine, Option<String>), TopoError> {
    crate::machine::load_reporting(source)
}

/// The `gdpath.topo/1` document of `machine`, as `gdpath topo --json` prints it (pretty JSON,
/// no trailing newline).
pub fn topo_json(machine: &Machine) -> String {
    serde_json::to_string_pretty(&machine.report()).expect("a topo report serializes")
}

/// Runs the doctor on the machine of `source` with the GDS directories `paths` (each once, in
/// the order given; the current directory when empty), as `gdpath doctor` does: live facts
/// for the live machine, the process environment and unprobed paths for a replay; `measure`
/// adds the measured probes (live only; a replay lists them as not run). Returns the report
/// and what was examined ("this machine (live)", "snapshot x (replay: ...)").
///
/// Errors: [`DoctorError`].
pub fn doctor(
    source: &Source,
    paths: &[PathBuf],
    measure: bool,
) -> Result<(Report, String), DoctorError> {
    let loaded = crate::load(source)?;
    let paths = if paths.is_empty() {
        vec![std::env::current_dir().map_err(DoctorError::CurrentDir)?]
    } else {
        paths.to_vec()
    };
    if let Some(p) = paths.iter().find(|p| !p.is_dir()) {
        return Err(DoctorError::NotADirectory(p.clone()));
    }
    let paths = distinct(paths);
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
    let mut r = crate::run(&input);
    if measure {
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
    let what = match &loaded.mode {
        Mode::Live => "this machine (live)".to_owned(),
        Mode::Replay { what } => format!("{what} (replay: live-only checks not run)"),
    };
    Ok((r, what))
}

/// Each directory once (`/data` and `/data/`, or a link to it, are one), as first written.
fn distinct(paths: Vec<PathBuf>) -> Vec<PathBuf> {
    let mut seen = Vec::new();
    paths
        .into_iter()
        .filter(|p| {
            let c = std::fs::canonicalize(p).unwrap_or_else(|_| p.clone());
            let new = !seen.contains(&c);
            seen.push(c);
            new
        })
        .collect()
}

/// The `gdpath.doctor/1` document of `report`, as `gdpath doctor --json` prints it (pretty
/// JSON, no trailing newline).
pub fn doctor_json(report: &Report) -> String {
    serde_json::to_string_pretty(report).expect("a doctor report serializes")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_that_is_not_a_directory_is_refused_by_name() {
        let f = tempfile::NamedTempFile::new().unwrap();
        let xml = gdpath_testkit::fixture("nccl-xml/nccl-azure-ndv2-topo.xml");
        let e = doctor(&Source::NcclXml(xml), &[f.path().to_owned()], false).unwrap_err();
        assert!(
            matches!(&e, DoctorError::NotADirectory(p) if p == f.path()),
            "{e}"
        );
        assert!(e.to_string().contains("not a directory"), "{e}");
    }

    #[test]
    fn one_directory_named_twice_is_checked_once() {
        let d = tempfile::tempdir().unwrap();
        let a = d.path().to_owned();
        let b = d.path().join(".");
        assert_eq!(distinct(vec![a.clone(), b, a.clone()]), vec![a]);
    }
}
