//! One examination of a machine, as `gdpath doctor` makes it and `gdpath report` draws it: load
//! the machine from its source, gather the live facts (or mark them not-run in a replay), run
//! every check and, with `measure`, the measured probes of [`crate::measured`].

use crate::{live, measured, DoctorInput, Loaded, Mode, Report};
use gdpath::finding::Area;
use gdpath_topo::{Source, TopoError};
use std::path::PathBuf;

/// Why an examination could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ExamineError {
    /// The machine could not be read from its source.
    #[error("reading the machine: {0}")]
    Machine(#[from] TopoError),
    /// A `--path` is not a directory (a mistyped path would otherwise turn into `unknown`
    /// findings and a misleading exit status).
    #[error("--path {}: not a directory", .0.display())]
    NotADirectory(PathBuf),
    /// No `--path` was given and the current directory (the default) cannot be read.
    #[error("current directory: {0}")]
    CurrentDir(#[source] std::io::Error),
}

/// A machine, the directories checked for GDS, and the doctor's report on them.
pub struct Examination {
    /// The machine and the view its files are read through.
    pub loaded: Loaded,
    /// The directories checked for GDS, each once, in the order first given.
    pub paths: Vec<PathBuf>,
    /// The doctor's report on the machine and those directories.
    pub report: Report,
}

impl Examination {
    /// What was examined, for a heading: `this machine (live)`, or the replayed source with a
    /// note that live-only checks were not run.
    pub fn what(&self) -> String {
        match &self.loaded.mode {
            Mode::Live => "this machine (live)".to_owned(),
            Mode::Replay { what } => format!("{what} (replay: live-only checks not run)"),
        }
    }

    /// The data paths between GPUs, NICs and NVMe and how each fares ([`crate::routes`]).
    pub fn routes(&self) -> Vec<crate::routes::Route<'_>> {
        crate::routes::routes(
            &self.loaded.machine,
            self.loaded.view.as_ref(),
            &self.paths,
            &self.report,
        )
    }
}

/// Examines the machine of `source`. `paths` are the directories checked for GDS (the current
/// directory when empty, on the live machine only); each is checked once (`/data` and `/data/`, or a link to it, are one).
/// With `measure` the probes of [`crate::measured`] run too on the live machine (P2P per GPU
/// pair, GDS in each path; GDR has none and is listed not-run); a replay lists them not-run.
/// Errors: [`ExamineError`].
pub fn examine(
    source: &Source,
    paths: &[PathBuf],
    measure: bool,
) -> Result<Examination, ExamineError> {
    let loaded = crate::load(source)?;
    let paths = gds_paths(paths, matches!(loaded.mode, Mode::Live))?;
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
    let mut report = crate::run(&input);
    if measure {
        // Only live: a replay has no GPUs to measure.
        if matches!(loaded.mode, Mode::Live) {
            report.extend(measured::probe_p2p());
            report.extend(measured::probe_gds(&paths));
        } else {
            report.extend(
                [Area::P2p, Area::Gds]
                    .into_iter()
                    .filter_map(measured::not_live),
            );
        }
        report.extend(measured::not_available(Area::Gdr));
    }
    drop(input);
    Ok(Examination {
        loaded,
        paths,
        report,
    })
}

/// The status of each data path on this machine ([`Report::path_statuses`]), as an agent that
/// serves publishes them (`gdpath serve --cluster`, a Python agent with `cluster=`): the live
/// machine examined without measured probes and without touching files or cuFile
/// ([`live::gather_quiet`]): GDS is judged per directory, which the record has none of, so its
/// verdict is the one the doctor gives with no directory. Errors: [`ExamineError`].
pub fn path_statuses_here() -> Result<std::collections::BTreeMap<String, String>, ExamineError> {
    let loaded = crate::load(&Source::Live)?;
    let input = live::gather_quiet(&loaded.machine, loaded.view.as_ref());
    let statuses = crate::run(&input).path_statuses();
    Ok(statuses)
}

/// The GDS directories: `paths`, or on the live machine the current directory when none is
/// given (it is a directory of the machine this runs on, not of a replayed one); each must be a
/// directory, and each is kept once, as first written.
fn gds_paths(paths: &[PathBuf], live: bool) -> Result<Vec<PathBuf>, ExamineError> {
    let paths = if paths.is_empty() && live {
        vec![std::env::current_dir().map_err(ExamineError::CurrentDir)?]
    } else {
        paths.to_vec()
    };
    if let Some(bad) = paths.iter().find(|p| !p.is_dir()) {
        return Err(ExamineError::NotADirectory(bad.clone()));
    }
    let mut seen: Vec<PathBuf> = Vec::new();
    Ok(paths
        .into_iter()
        .filter(|p| {
            let c = std::fs::canonicalize(p).unwrap_or_else(|_| p.clone());
            let new = !seen.contains(&c);
            seen.push(c);
            new
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_that_is_not_a_directory_is_refused_by_name() {
        let f = tempfile::NamedTempFile::new().unwrap();
        let xml = gdpath_testkit::fixture("nccl-xml/nccl-azure-ndv2-topo.xml");
        let e = examine(&Source::NcclXml(xml), &[f.path().to_owned()], false)
            .err()
            .expect("a file is not a directory");
        assert!(
            matches!(&e, ExamineError::NotADirectory(p) if p == f.path()),
            "{e}"
        );
        assert!(e.to_string().contains("not a directory"), "{e}");
    }

    #[test]
    fn one_directory_named_twice_is_checked_once() {
        let d = tempfile::tempdir().unwrap();
        let a = d.path().to_owned();
        let b = d.path().join(".");
        assert_eq!(
            gds_paths(&[a.clone(), b, a.clone()], true).unwrap(),
            vec![a]
        );
        // A replay checks no directory of this machine unless told.
        assert!(gds_paths(&[], false).unwrap().is_empty());
    }
}
