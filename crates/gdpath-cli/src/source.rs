//! The topology source every command that reads the machine takes (`--sysfs-root`,
//! `--snapshot`, `--hwloc-xml`, `--nccl-xml`, `--smi-topo`), and the errors of reading it as
//! `main` reports them: below `topo`, `doctor` and `report`, which share them.

use clap::Args;
use gdpath::topo::Source;
use std::path::PathBuf;

/// Where to read the machine from (at most one; the live `/sys` when none is given).
#[derive(Debug, Clone, Default, Args)]
#[group(multiple = false)]
pub struct SourceArgs {
    /// Read a copied sysfs tree: DIR holds `sys/` (and `proc/`).
    #[arg(long, value_name = "DIR")]
    pub sysfs_root: Option<PathBuf>,
    /// Replay a snapshot written by `gdpath topo capture`.
    #[arg(long, value_name = "FILE")]
    pub snapshot: Option<PathBuf>,
    /// Read an hwloc XML export (`lstopo machine.xml`).
    #[arg(long, value_name = "FILE")]
    pub hwloc_xml: Option<PathBuf>,
    /// Read an NCCL topology file (`NCCL_TOPO_DUMP_FILE` output or a provider's topology).
    #[arg(long, value_name = "FILE")]
    pub nccl_xml: Option<PathBuf>,
    /// Read the text `nvidia-smi topo -m` printed (any version; the matrix is all it says).
    #[arg(long, value_name = "FILE")]
    pub smi_topo: Option<PathBuf>,
}

impl SourceArgs {
    /// The source these flags name.
    pub fn source(&self) -> Source {
        if let Some(p) = &self.sysfs_root {
            Source::SysfsRoot(p.clone())
        } else if let Some(p) = &self.snapshot {
            Source::Snapshot(p.clone())
        } else if let Some(p) = &self.hwloc_xml {
            Source::HwlocXml(p.clone())
        } else if let Some(p) = &self.nccl_xml {
            Source::NcclXml(p.clone())
        } else if let Some(p) = &self.smi_topo {
            Source::SmiTopo(p.clone())
        } else {
            Source::Live
        }
    }
}

/// A bad `--path` is a usage error; anything else fails the doctor.
pub(crate) fn examine_error(e: gdpath_doctor::ExamineError) -> anyhow::Error {
    match e {
        gdpath_doctor::ExamineError::NotADirectory(_) => crate::usage(e.to_string()),
        e => anyhow::Error::new(e),
    }
}

/// A bad `--path` is a usage error, like the doctor's.
pub(crate) fn report_error(e: gdpath_report::ReportError) -> anyhow::Error {
    match e {
        gdpath_report::ReportError::Examine(e) => examine_error(e),
        e => anyhow::Error::new(e),
    }
}
