//! The `gdpath topo --json` document: the machine with its matrix (or its pairs per class),
//! nearest devices and warnings. Above [`crate::machine`], [`crate::pairs`] and
//! [`crate::warnings`], whose parts it gathers.

use crate::coverage::Coverage;
use crate::device::Device;
use crate::iommu::IommuState;
use crate::machine::{Machine, Matrix, Nearest, NumaNode, NvLinkBond};
use crate::pairs::PairSummary;
use crate::warnings::Warning;
use serde::Serialize;

/// Schema id of `gdpath topo --json`.
pub const TOPO_SCHEMA: &str = "gdpath.topo/1";

/// Everything `gdpath topo --json` prints (schema [`TOPO_SCHEMA`]).
#[derive(Debug, Clone, Serialize)]
pub struct TopoReport<'a> {
    /// The schema of this document, [`TOPO_SCHEMA`].
    pub schema: &'static str,
    /// Where the machine was read from: `live`, `sysfs-root`, `snapshot`, `hwloc-xml`,
    /// `nccl-xml` or `smi-topo` ([`Machine::source`]).
    pub source: &'a str,
    /// For a snapshot, the source it was captured from (`live` or `sysfs-root`); absent
    /// otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub captured_from: Option<&'a str>,
    /// False when the source has no PCI tree (parents and host bridges unknown).
    pub tree_known: bool,
    /// What the source describes and what it cannot ([`Coverage`]).
    pub coverage: &'a Coverage,
    /// Every PCI function, in PCI bus order.
    pub devices: &'a [Device],
    /// NUMA nodes and their CPUs.
    pub numa_nodes: &'a [NumaNode],
    /// IOMMU units and groups.
    pub iommu: &'a IommuState,
    /// NVLink connections between GPUs.
    pub nvlinks: &'a [NvLinkBond],
    /// Every pair, for at most [`crate::input::MAX_LISTED_PAIR_DEVICES`] GPUs, NICs and NVMe;
    /// absent past it, where `pair_classes` counts them instead.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub matrix: Option<Matrix>,
    /// The pairs counted per class, in place of `matrix` past the limit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pair_classes: Option<PairSummary>,
    /// Each GPU's nearest NIC and NVMe controller.
    pub nearest: Vec<Nearest>,
    /// Warnings about the topology (ACS redirect, downtrained links, ...), each with a stable id.
    pub warnings: Vec<Warning>,
    /// What the reader could not place or found inconsistent in the source.
    pub notes: &'a [String],
}

impl Machine {
    /// The `--json` document ([`TOPO_SCHEMA`]).
    pub fn report(&self) -> TopoReport<'_> {
        let summary = self.pair_summary();
        TopoReport {
            schema: TOPO_SCHEMA,
            source: &self.source,
            captured_from: self.captured_from.as_deref(),
            tree_known: self.tree_known,
            coverage: &self.coverage,
            devices: &self.devices,
            numa_nodes: &self.numa_nodes,
            iommu: &self.iommu,
            nvlinks: &self.nvlinks,
            matrix: summary.is_none().then(|| self.matrix()),
            pair_classes: summary,
            nearest: self.nearest(),
            warnings: self.warnings(),
            notes: &self.notes,
        }
    }
}
