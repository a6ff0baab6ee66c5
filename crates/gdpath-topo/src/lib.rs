//! The machine model for gdpath: PCI devices, the PCIe tree, NUMA, NVLink, ACS and IOMMU state,
//! the pair classes of `nvidia-smi topo -m`, and what the source could describe
//! ([`Coverage`]). Pure Rust, no FFI, no unsafe; nothing here prints.
//!
//! Sources ([`Source`]): the live `/sys`, a copied sysfs tree, a snapshot written by
//! [`snapshot::capture`], an hwloc 2.x/3.x XML export, an NCCL topology XML, or the text of
//! `nvidia-smi topo -m`. All of them produce the same [`Machine`], from which come the
//! [`Matrix`], [`Machine::nearest`] and [`Machine::warnings`]. Every file read of a sysfs source
//! goes through a [`view::SysView`], which the doctor (in the engine) shares so that snapshots
//! replay its reads too. Every input is bounded ([`input`]): size, XML depth, device counts;
//! past [`input::MAX_LISTED_PAIR_DEVICES`] the pairs are counted per class
//! ([`Machine::pair_counts`]) rather than listed, so no document grows with the square of the
//! devices.

#![forbid(unsafe_code)]

/// Serde for a type through its text: `Display` to serialize, `FromStr` to deserialize (its
/// error's text becomes serde's), so a document holds the same text the tools print.
macro_rules! serde_via_text {
    ($t:ty) => {
        impl serde::Serialize for $t {
            fn serialize<S: serde::Serializer>(
                &self,
                s: S,
            ) -> std::result::Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }

        impl<'de> serde::Deserialize<'de> for $t {
            fn deserialize<D: serde::Deserializer<'de>>(
                d: D,
            ) -> std::result::Result<Self, D::Error> {
                let s = <String as serde::Deserialize>::deserialize(d)?;
                s.parse::<$t>().map_err(serde::de::Error::custom)
            }
        }
    };
}

pub mod acs;
pub mod class;
pub mod coverage;
pub mod cpus;
pub mod device;
pub mod facts;
pub mod hwloc;
pub mod input;
pub mod iommu;
pub mod link;
pub mod machine;
pub mod names;
pub mod nccl;
pub mod pairs;
pub mod pci;
pub mod report;
pub mod smi;
pub mod snapshot;
pub mod sysfs;
pub use gdpath_text as text;
pub mod view;
pub mod warnings;
mod xml;

pub use acs::{AcsFlags, AcsState};
pub use class::LinkClass;
pub use coverage::{Aspect, Coverage, Facet};
pub use device::{Device, DeviceKind, RdmaEvidence};
pub use iommu::{IommuGroup, IommuState};
pub use link::PcieLink;
pub use machine::{Machine, Matrix, Nearest, NumaNode, NvLinkBond, Peer};
pub use pairs::{bridges_at, NvLinkState, PairClass, PairCounts, PairSummary, Place, TreeKey};
pub use pci::PciAddr;
pub use report::{TopoReport, TOPO_SCHEMA};
pub use view::{DirView, Recording, SysView};
pub use warnings::{warning_ids, Warning};

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
    /// The text `nvidia-smi topo -m` printed ([`smi`]).
    SmiTopo(PathBuf),
}

impl Source {
    /// The name [`Machine::source`] carries for this source: `live`, `sysfs-root`, `snapshot`,
    /// `hwloc-xml`, `nccl-xml`, `smi-topo`.
    pub fn kind(&self) -> &'static str {
        match self {
            Source::Live => "live",
            Source::SysfsRoot(_) => "sysfs-root",
            Source::Snapshot(_) => "snapshot",
            Source::HwlocXml(_) => "hwloc-xml",
            Source::NcclXml(_) => "nccl-xml",
            Source::SmiTopo(_) => "smi-topo",
        }
    }

    /// The file or directory read, `None` for the live machine.
    pub fn path(&self) -> Option<&std::path::Path> {
        match self {
            Source::Live => None,
            Source::SysfsRoot(p)
            | Source::Snapshot(p)
            | Source::HwlocXml(p)
            | Source::NcclXml(p)
            | Source::SmiTopo(p) => Some(p),
        }
    }

    /// The source in words, for headers: `live /sys`, `snapshot FILE`, `NCCL XML FILE`; the
    /// path as it is (a text output escapes it: [`text::escape`]).
    pub fn describe(&self) -> String {
        let what = match self {
            Source::Live => return "live /sys".to_owned(),
            Source::SysfsRoot(_) => "sysfs tree",
            Source::Snapshot(_) => "snapshot",
            Source::HwlocXml(_) => "hwloc XML",
            Source::NcclXml(_) => "NCCL XML",
            Source::SmiTopo(_) => "nvidia-smi topo -m text",
        };
        let path = self.path().map(|p| p.display().to_string());
        format!("{what} {}", path.unwrap_or_default())
    }
}

/// Errors of the topology readers. Each names the file (and line, for XML) at fault.
#[derive(Debug, thiserror::Error)]
pub enum TopoError {
    /// The directory or snapshot is not a sysfs tree.
    #[error("not a sysfs tree: {what}")]
    NotSysfs {
        /// The path given, and what it lacks.
        what: String,
    },
    /// A file could not be read.
    #[error("cannot read {}: {source}", crate::text::escape(.path))]
    Io {
        /// The file at fault, as given.
        path: PathBuf,
        /// The error of the open or read.
        #[source]
        source: std::io::Error,
    },
    /// Malformed XML, or XML that is not of the expected kind.
    #[error("{}:{line}:{column}: {message}", crate::text::escape(.path))]
    Xml {
        /// The file at fault, as given.
        path: PathBuf,
        /// Line of the error, from 1.
        line: u32,
        /// Column of the error, from 1.
        column: u32,
        /// What is wrong.
        message: String,
    },
    /// The text is not the output of `nvidia-smi topo -m`.
    #[error("{}: {source}", crate::text::escape(.path))]
    Smi {
        /// The file at fault, as given.
        path: PathBuf,
        /// What the parser refused.
        #[source]
        source: smi::SmiError,
    },
    /// The file is not a gdpath snapshot (or is a damaged one).
    #[error("{} is not a gdpath snapshot: {reason}", crate::text::escape(.path))]
    NotSnapshot {
        /// The file at fault, as given.
        path: PathBuf,
        /// What is missing or damaged.
        reason: String,
    },
    /// Writing a snapshot failed.
    #[error("cannot write snapshot: {0}")]
    Write(#[source] std::io::Error),
    /// The file is larger than any source of its kind (or never ends: `/dev/zero`).
    #[error(
        "{} is larger than {}, the most gdpath reads from a source of this kind (no \
         machine's topology is that large; is it the right file?)", crate::text::escape(.path), input::size_text(*.limit_bytes)
    )]
    TooLarge {
        /// The file at fault, as given.
        path: PathBuf,
        /// The most bytes read from a source of its kind.
        limit_bytes: u64,
    },
    /// A pipe or FIFO delivered no data for `seconds` seconds.
    #[error("{}: no data for {seconds} s (a pipe or FIFO whose writer does not write)", crate::text::escape(.path))]
    Stalled {
        /// The pipe or FIFO.
        path: PathBuf,
        /// How long the read waited for data, seconds.
        seconds: u64,
    },
    /// XML nested deeper than [`input::MAX_XML_DEPTH`] elements.
    #[error(
        "{}:{line}:{column}: XML nested deeper than {limit} elements (a real machine's PCI \
         tree is fewer than 32 bridges deep)", crate::text::escape(.path)
    )]
    TooDeep {
        /// The file at fault, as given.
        path: PathBuf,
        /// Line of the element past the limit, from 1.
        line: u32,
        /// Column of that element, from 1.
        column: u32,
        /// The deepest nesting accepted, elements.
        limit: usize,
    },
    /// XML with more than [`input::MAX_XML_NODES`] nodes.
    #[error(
        "{}: more than {limit} XML nodes (a large machine's export has tens of thousands)", crate::text::escape(.path)
    )]
    TooManyNodes {
        /// The file at fault, as given.
        path: PathBuf,
        /// The most XML nodes accepted.
        limit: u32,
    },
    /// More devices than [`input::MAX_PCI_FUNCTIONS`] or [`input::MAX_MATRIX_DEVICES`]: checked
    /// before any pairwise work.
    #[error(
        "{source_name}: {count} {what}, more than the {limit} gdpath classifies (the pairwise \
         work grows with the square of the count)"
    )]
    TooManyDevices {
        /// The source (file name, or `live /sys`).
        source_name: String,
        /// `PCI functions`, `GPUs, NICs and NVMe`, or `NICs without a PCI address` (NCCL XML).
        what: &'static str,
        /// How many the source lists.
        count: usize,
        /// The most gdpath classifies.
        limit: usize,
    },
    /// The same PCI bus id twice in one source: two `<pci>` elements of an NCCL file, two
    /// entries of `/sys/bus/pci/devices`, two functions under one host bridge of an hwloc
    /// export. A function has one address; kept twice, the pair matrix and the device list
    /// would not agree on how many devices there are.
    #[error(
        "{source_name}: PCI bus id {pci} appears twice ({first} and {second}); a PCI function \
         has one address (is the file edited, or two files joined?)"
    )]
    DuplicatePci {
        /// The source (file name, or the sysfs directory listed).
        source_name: String,
        /// The PCI address given twice.
        pci: PciAddr,
        /// Where the source gives it first: `line 12`, or a directory entry.
        first: String,
        /// Where the source gives it again, in the same form.
        second: String,
    },
}

/// Reads a machine from `source`. Snapshots bring their driver facts (`driver.json`) with them;
/// for the other sources driver facts are attached by the caller ([`Machine::set_driver`]).
pub fn load(source: &Source) -> Result<Machine, TopoError> {
    match source {
        Source::Live => sysfs::read_machine(&DirView::live(), source.kind()),
        Source::SysfsRoot(dir) => {
            if !dir.is_dir() {
                return Err(TopoError::NotSysfs {
                    what: format!("{} is not a directory", text::escape(dir)),
                });
            }
            sysfs::read_machine(&DirView::new(dir), source.kind())
        }
        Source::Snapshot(path) => snapshot::Snapshot::open(path)?.machine(),
        Source::HwlocXml(path) => hwloc::read_file(path),
        Source::NcclXml(path) => nccl::read_file(path),
        Source::SmiTopo(path) => smi::read_file(path),
    }
}
