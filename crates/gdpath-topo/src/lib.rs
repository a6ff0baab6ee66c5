//! The machine model for gdpath: PCI devices, the PCIe tree, NUMA, NVLink, ACS and IOMMU state,
//! and the pair classes of `nvidia-smi topo -m`. Pure Rust, no FFI, no unsafe; nothing here
//! prints.
//!
//! Sources ([`Source`]): the live `/sys`, a copied sysfs tree, a snapshot written by
//! [`snapshot::capture`], an hwloc 2.x/3.x XML export, or an NCCL topology XML. All of them
//! produce the same [`Machine`], from which come the [`Matrix`], [`Machine::nearest`] and
//! [`Machine::warnings`]. Every file read of a sysfs source goes through a [`view::SysView`],
//! which the doctor (in the engine) shares so that snapshots replay its reads too.

#![forbid(unsafe_code)]

pub mod acs;
pub mod class;
pub mod cpus;
pub mod device;
pub mod facts;
pub mod hwloc;
pub mod iommu;
pub mod link;
pub mod machine;
pub mod names;
pub mod nccl;
pub mod pci;
pub mod smi;
pub mod snapshot;
pub mod sysfs;
pub mod view;

pub use acs::{AcsFlags, AcsState};
pub use class::LinkClass;
pub use device::{Device, DeviceKind};
pub use iommu::{IommuGroup, IommuState};
pub use link::PcieLink;
pub use machine::{
    warning_ids, Machine, Matrix, Nearest, NumaNode, NvLinkBond, Peer, TopoReport, Warning,
    TOPO_SCHEMA,
};
pub use pci::PciAddr;
pub use view::{DirView, Recording, SysView};

use std::path::PathBuf;

/// Where to read a machine from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// The live `/sys` and `/proc`.
    Live,
    /// A copied tree holding `sys/` (and `proc/`), e.g. hwloc's test dumps.
    SysfsRoot(PathBuf),
    /// A tar.gz written by [`snapshot::capture`].
    Snapshot(PathBuf),
    /// An hwloc XML export (`lstopo machine.xml`).
    HwlocXml(PathBuf),
    /// An NCCL topology file (`NCCL_TOPO_DUMP_FILE`, or a cloud provider's `NCCL_TOPO_FILE`).
    NcclXml(PathBuf),
}

/// Errors of the topology readers. Each names the file (and line, for XML) at fault.
#[derive(Debug, thiserror::Error)]
pub enum TopoError {
    /// The directory or snapshot is not a sysfs tree.
    #[error("not a sysfs tree: {what}")]
    NotSysfs { what: String },
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Malformed XML, or XML that is not of the expected kind.
    #[error("{path}:{line}:{column}: {message}")]
    Xml {
        path: PathBuf,
        line: u32,
        column: u32,
        message: String,
    },
    /// The file is not a gdpath snapshot (or is a damaged one).
    #[error("{path} is not a gdpath snapshot: {reason}")]
    NotSnapshot { path: PathBuf, reason: String },
    /// Writing a snapshot failed.
    #[error("cannot write snapshot: {0}")]
    Write(#[source] std::io::Error),
}

/// Reads a machine from `source`. Snapshots bring their driver facts (`driver.json`) with them;
/// for the other sources driver facts are attached by the caller ([`Machine::set_driver`]).
pub fn load(source: &Source) -> Result<Machine, TopoError> {
    match source {
        Source::Live => sysfs::read_machine(&DirView::live(), "live"),
        Source::SysfsRoot(dir) => {
            if !dir.is_dir() {
                return Err(TopoError::NotSysfs {
                    what: format!("{} is not a directory", dir.display()),
                });
            }
            sysfs::read_machine(&DirView::new(dir), "sysfs-root")
        }
        Source::Snapshot(path) => snapshot::Snapshot::open(path)?.machine(),
        Source::HwlocXml(path) => hwloc::read_file(path),
        Source::NcclXml(path) => nccl::read_file(path),
    }
}

/// Reads an XML file as text, with [`TopoError::Io`] naming it.
fn read_to_string(path: &std::path::Path) -> Result<String, TopoError> {
    std::fs::read_to_string(path).map_err(|source| TopoError::Io {
        path: path.to_owned(),
        source,
    })
}

/// Parses XML text, turning roxmltree's error into [`TopoError::Xml`] with file and line.
fn parse_xml<'a>(
    text: &'a str,
    path: &std::path::Path,
) -> Result<roxmltree::Document<'a>, TopoError> {
    let opts = roxmltree::ParsingOptions {
        allow_dtd: true,
        ..Default::default()
    };
    roxmltree::Document::parse_with_options(text, opts).map_err(|e| {
        let pos = e.pos();
        TopoError::Xml {
            path: path.to_owned(),
            line: pos.row,
            column: pos.col,
            message: e.to_string(),
        }
    })
}

/// [`TopoError::Xml`] at a node of a parsed document.
fn xml_error(
    doc: &roxmltree::Document,
    node: roxmltree::Node,
    path: &std::path::Path,
    message: String,
) -> TopoError {
    let pos = doc.text_pos_at(node.range().start);
    TopoError::Xml {
        path: path.to_owned(),
        line: pos.row,
        column: pos.col,
        message,
    }
}
