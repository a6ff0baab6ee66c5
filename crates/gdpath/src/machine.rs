//! The engine's entry to the machine model: load a machine from any source, or capture a
//! snapshot of the live (or a copied) sysfs tree. Thin on purpose: the model is `gdpath-topo`
//! (re-exported as [`crate::topo`]); this is where live driver facts (NVML) will be attached.

use crate::topo::snapshot::{self, CaptureSummary};
use crate::topo::{sysfs, DirView, Machine, Recording, Source, TopoError};
use std::path::Path;

/// Reads the machine from `source` (see [`crate::topo::load`]).
pub fn load(source: &Source) -> Result<Machine, TopoError> {
    crate::topo::load(source)
}

/// Reads the machine from the live `/sys` (or from `sysfs_root` when given) while recording
/// every file read, and writes the snapshot (tar.gz) to `out`. Returns the machine and what was
/// written.
pub fn capture(
    sysfs_root: Option<&Path>,
    out: &Path,
) -> Result<(Machine, CaptureSummary), TopoError> {
    let (view, label) = match sysfs_root {
        Some(root) => (DirView::new(root), "sysfs-root"),
        None => (DirView::live(), "live"),
    };
    let rec = Recording::new(view);
    let machine = sysfs::read_machine(&rec, label)?;
    let file = std::fs::File::create(out).map_err(TopoError::Write)?;
    let summary = snapshot::capture(
        &rec,
        &machine.source,
        machine.driver.as_ref(),
        std::io::BufWriter::new(file),
    )?;
    Ok((machine, summary))
}
