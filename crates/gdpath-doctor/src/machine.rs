//! The engine's entry to the machine model: load a machine from any source, or capture a
//! snapshot of the live (or a copied) sysfs tree. The model is `gdpath-topo` (re-exported as
//! [`gdpath_topo`]); this is where live driver facts (CUDA + NVML, `gdpath_cuda::gather_facts`)
//! are attached, so that NVLink (`NV#`) appears in the matrix and a capture stores them.

use gdpath_topo::snapshot::{self, CaptureSummary};
use gdpath_topo::{sysfs, DirView, Facet, Machine, Recording, Source, TopoError};
use std::path::Path;

/// Reads the machine from `source` (see [`gdpath_topo::load`]). For the live machine the
/// driver's facts are read too and attached ([`attach_live_driver`]); snapshots bring the facts
/// recorded at capture. A missing driver is not an error: see [`load_reporting`] for why.
pub fn load(source: &Source) -> Result<Machine, TopoError> {
    load_reporting(source).map(|(m, _)| m)
}

/// As [`load`], and why NVLink facts are unavailable when they are: the driver loader's error
/// for the live machine, "the snapshot has no driver facts" for a snapshot captured without a
/// driver. `None` when facts are attached, or for sources that carry their own links (XML).
pub fn load_reporting(source: &Source) -> Result<(Machine, Option<String>), TopoError> {
    let mut m = gdpath_topo::load(source)?;
    let why = match source {
        Source::Live => attach_live_driver(&mut m).err(),
        Source::Snapshot(_) if m.driver.is_none() => Some(
            "the snapshot has no driver facts (it was captured without an NVIDIA driver)".into(),
        ),
        _ => None,
    };
    Ok((m, why))
}

/// The live driver facts (CUDA + NVML). Errors: neither library could be used (the CUDA
/// loader's error, naming `libcuda.so.1` and what installs it).
pub fn live_driver_facts() -> Result<gdpath_topo::facts::DriverFacts, gdpath_cuda::CudaError> {
    gdpath_cuda::gather_facts()
}

/// Reads the driver facts (`gdpath_cuda::gather_facts`) and attaches them
/// ([`Machine::set_driver`]: NVLink counts become `NV#`). Errors: the reason they could not be
/// read; the machine then keeps no driver facts and its NVLink coverage is unknown with that
/// reason ([`Coverage::nvlink`](gdpath_topo::Coverage)), so the doctor says why NVLink is
/// unknown instead of judging the GPU pairs by their PCIe path.
pub fn attach_live_driver(m: &mut Machine) -> Result<(), String> {
    let f = match live_driver_facts() {
        Ok(f) => f,
        Err(e) => {
            let why = e.to_string();
            m.coverage.nvlink = Facet::unknown(format!(
                "NVLink comes from the NVIDIA driver, and its facts could not be read: {why}"
            ));
            return Err(why);
        }
    };
    for g in &f.gaps {
        tracing::debug!(what = %g.what, reason = %g.reason, "driver fact missing");
    }
    m.set_driver(f);
    Ok(())
}

/// Why [`capture`] failed: reading the machine, or writing the snapshot file.
#[derive(Debug)]
pub enum CaptureError {
    /// The sysfs tree could not be read.
    Read(TopoError),
    /// The snapshot file could not be written ([`gdpath::Error::NotAFile`],
    /// [`gdpath::Error::Exists`], [`gdpath::Error::NoSpace`], ...); any file that was there is
    /// as it was.
    Output(gdpath::Error),
}

impl std::fmt::Display for CaptureError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CaptureError::Read(e) => write!(f, "reading the machine: {e}"),
            CaptureError::Output(e) => write!(f, "writing the snapshot: {e}"),
        }
    }
}

impl std::error::Error for CaptureError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            CaptureError::Read(e) => Some(e),
            CaptureError::Output(e) => Some(e),
        }
    }
}

/// Reads the machine from the live `/sys` (or from `sysfs_root` when given) while recording
/// every file read, and writes the snapshot (tar.gz) to `out`, whole or not at all
/// ([`gdpath::file::AtomicFile`]: an existing `out` is replaced only with `replace.overwrite`,
/// a device, FIFO or socket is refused before the machine is read, and a failure leaves no
/// partial snapshot). For the live machine the driver facts are read and stored in the
/// snapshot (`driver.json`), so a replay shows the same NVLink matrix; without a driver the
/// snapshot has none. Returns the machine, what was written, for the live machine without
/// a driver why no facts were stored, and the file written (the real one when `out` is a
/// symbolic link; a link another user planted in a sticky directory is refused,
/// [`gdpath::Error::SymlinkRefused`]).
pub fn capture(
    sysfs_root: Option<&Path>,
    out: &Path,
    replace: gdpath::file::ReplaceOptions,
) -> Result<Captured, CaptureError> {
    let mut file = gdpath::file::AtomicFile::create(out, replace)
        .map_err(|e| CaptureError::Output(e.into()))?;
    let (view, label) = match sysfs_root {
        Some(root) => (DirView::new(root), "sysfs-root"),
        None => (DirView::live(), "live"),
    };
    let rec = Recording::new(view);
    let mut machine = sysfs::read_machine(&rec, label).map_err(CaptureError::Read)?;
    let why = match sysfs_root {
        None => attach_live_driver(&mut machine).err(),
        Some(_) => None,
    };
    // The doctor reads /proc and more /sys files through the same recording, so that
    // `gdpath doctor --snapshot` replays its file-based checks too.
    crate::read_files(&machine, &rec);
    let written = snapshot::capture(
        &rec,
        &machine.source,
        machine.driver.as_ref(),
        std::io::BufWriter::new(&mut file),
    );
    let summary = match written {
        Ok(s) => s,
        Err(TopoError::Write(e)) => return Err(CaptureError::Output(file.write_error(e).into())),
        Err(e) => return Err(CaptureError::Read(e)),
    };
    let written = file.as_target();
    file.commit().map_err(|e| CaptureError::Output(e.into()))?;
    Ok(Captured {
        machine,
        summary,
        no_facts: why,
        file: written,
    })
}

/// What [`capture`] read and wrote.
#[derive(Debug)]
pub struct Captured {
    /// The machine read.
    pub machine: Machine,
    /// What the snapshot holds.
    pub summary: CaptureSummary,
    /// For the live machine without a driver: why no driver facts were stored.
    pub no_facts: Option<String>,
    /// The file written (`path` the real one, `through_link` when the output was a link).
    pub file: gdpath::file::Target,
}
