//! The JSON documents of `gdpath topo --json` (schema `gdpath.topo/1`) and `gdpath doctor --json`
//! (schema [`crate::DOCTOR_SCHEMA`]), built here once for every caller: the CLI prints them and
//! the Python module returns them parsed (`gdpath.topo()`, `gdpath.doctor()`), so both give the
//! same bytes for the same arguments. The doctor's run itself is [`crate::examine`].

use crate::Report;
use gdpath_topo::{Machine, Source, TopoError};

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

/// The `gdpath.doctor/1` document of `report` (an [`crate::Examination`]'s), as `gdpath doctor
/// --json` prints it (pretty JSON, no trailing newline).
pub fn doctor_json(report: &Report) -> String {
    serde_json::to_string_pretty(report).expect("a doctor report serializes")
}
