//! `gdpath.topo()` and `gdpath.doctor()`: the `--json` documents of `gdpath topo` and `gdpath
//! doctor`, from the functions the CLI prints them with (`gdpath_doctor::document`, after the
//! doctor's run `gdpath_doctor::examine`), so the text is the same byte for byte.

use crate::error::raise;
use gdpath_doctor::{document, ExamineError};
use gdpath_topo::Source;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use std::path::PathBuf;

/// The source the replay arguments name (at most one; the live machine when none).
fn source(
    snapshot: Option<PathBuf>,
    sysfs_root: Option<PathBuf>,
    hwloc_xml: Option<PathBuf>,
    nccl_xml: Option<PathBuf>,
    smi_topo: Option<PathBuf>,
) -> PyResult<Source> {
    let given: Vec<Source> = [
        sysfs_root.map(Source::SysfsRoot),
        snapshot.map(Source::Snapshot),
        hwloc_xml.map(Source::HwlocXml),
        nccl_xml.map(Source::NcclXml),
        smi_topo.map(Source::SmiTopo),
    ]
    .into_iter()
    .flatten()
    .collect();
    match given.len() {
        0 => Ok(Source::Live),
        1 => Ok(given.into_iter().next().expect("one")),
        _ => Err(PyValueError::new_err(
            "give at most one of snapshot, sysfs_root, hwloc_xml, nccl_xml, smi_topo",
        )),
    }
}

/// The `gdpath.topo/1` document as `gdpath topo --json` prints it (without its newline).
/// Errors: `gdpath.GdpathError` of kind `topology` when the source cannot be read.
#[pyfunction]
#[pyo3(signature = (*, snapshot=None, sysfs_root=None, hwloc_xml=None, nccl_xml=None, smi_topo=None))]
pub fn topo_json(
    py: Python<'_>,
    snapshot: Option<PathBuf>,
    sysfs_root: Option<PathBuf>,
    hwloc_xml: Option<PathBuf>,
    nccl_xml: Option<PathBuf>,
    smi_topo: Option<PathBuf>,
) -> PyResult<String> {
    let src = source(snapshot, sysfs_root, hwloc_xml, nccl_xml, smi_topo)?;
    let r = py.detach(move || document::topo(&src).map(|(m, _)| document::topo_json(&m)));
    r.map_err(|e| raise(py, "topology", &e.to_string(), None, None))
}

/// The `gdpath.doctor/1` document as `gdpath doctor --json` prints it (without its newline)
/// and the exit status the CLI would give (`gdpath_doctor::exit`: 0 available, 1 degraded,
/// 2 unavailable, 4 no verdict decided). `paths`: the GDS directories (default: the current
/// directory on the live machine, none in a replay); `measure` as `--measure`. Errors: kind
/// `usage` for a path that is not a directory, `topology` for an unreadable source.
#[pyfunction]
#[pyo3(signature = (*, snapshot=None, sysfs_root=None, hwloc_xml=None, nccl_xml=None, smi_topo=None, paths=None, measure=false))]
#[allow(clippy::too_many_arguments)]
pub fn doctor_json(
    py: Python<'_>,
    snapshot: Option<PathBuf>,
    sysfs_root: Option<PathBuf>,
    hwloc_xml: Option<PathBuf>,
    nccl_xml: Option<PathBuf>,
    smi_topo: Option<PathBuf>,
    paths: Option<Vec<PathBuf>>,
    measure: bool,
) -> PyResult<(String, u8)> {
    let src = source(snapshot, sysfs_root, hwloc_xml, nccl_xml, smi_topo)?;
    let paths = paths.unwrap_or_default();
    let r = py.detach(move || {
        gdpath_doctor::examine(&src, &paths, measure)
            .map(|ex| (document::doctor_json(&ex.report), ex.report.exit_code()))
    });
    r.map_err(|e| {
        let kind = match e {
            ExamineError::NotADirectory(_) => "usage",
            _ => "topology",
        };
        raise(py, kind, &e.to_string(), None, None)
    })
}
