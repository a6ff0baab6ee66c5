//! The engine's entry to the machine model: load a machine from any source, or capture a
//! snapshot of the live (or a copied) sysfs tree. The model is `gdpath-topo` (re-exported as
//! [`crate::topo`]); this is where live driver facts (CUDA + NVML, `gdpath_cuda::gather_facts`)
//! are attached, so that NVLink (`NV#`) appears in the matrix and a capture stores them.

use crate::topo::snapshot::{self, CaptureSummary};
use crate::topo::{sysfs, DirView, Machine, Recording, Source, TopoError};
use std::path::Path;

/// Reads the machine from `source` (see [`crate::topo::load`]). For the live machine the
/// driver's facts are read too and attached ([`attach_live_driver`]); when they cannot be
/// read, the machine carries a note saying NVLink facts are unavailable and why — not an error.
/// Snapshots bring the facts recorded at capture.
pub fn load(source: &Source) -> Result<Machine, TopoError> {
    let mut m = crate::topo::load(source)?;
    if matches!(source, Source::Live) {
        attach_live_driver(&mut m);
    }
    Ok(m)
}

/// The live driver facts (CUDA + NVML). Errors: neither library could be used (the CUDA
/// loader's error, naming `libcuda.so.1` and what installs it).
pub fn live_driver_facts() -> Result<crate::topo::facts::DriverFacts, gdpath_cuda::CudaError> {
    gdpath_cuda::gather_facts()
}

/// Reads the driver facts (`gdpath_cuda::gather_facts`) and attaches them
/// ([`Machine::set_driver`]: NVLink counts become `NV#`). Without a driver, adds a note
/// `NVLink facts unavailable: <why>` instead and returns false.
pub fn attach_live_driver(m: &mut Machine) -> bool {
    match gdpath_cuda::gather_facts() {
        Ok(f) => {
            for g in &f.gaps {
                tracing::debug!(what = %g.what, reason = %g.reason, "driver fact missing");
            }
            m.set_driver(f);
            true
        }
        Err(e) => {
            m.notes.push(format!("NVLink facts unavailable: {e}"));
            false
        }
    }
}

/// Reads the machine from the live `/sys` (or from `sysfs_root` when given) while recording
/// every file read, and writes the snapshot (tar.gz) to `out`. For the live machine the driver
/// facts are read and stored in the snapshot (`driver.json`), so a replay shows the same NVLink
/// matrix; without a driver the snapshot has none and the machine carries the note saying why.
/// Returns the machine and what was written.
pub fn capture(
    sysfs_root: Option<&Path>,
    out: &Path,
) -> Result<(Machine, CaptureSummary), TopoError> {
    let (view, label) = match sysfs_root {
        Some(root) => (DirView::new(root), "sysfs-root"),
        None => (DirView::live(), "live"),
    };
    let rec = Recording::new(view);
    let mut machine = sysfs::read_machine(&rec, label)?;
    if sysfs_root.is_none() {
        attach_live_driver(&mut machine);
    }
    let file = std::fs::File::create(out).map_err(TopoError::Write)?;
    let summary = snapshot::capture(
        &rec,
        &machine.source,
        machine.driver.as_ref(),
        std::io::BufWriter::new(file),
    )?;
    Ok((machine, summary))
}
