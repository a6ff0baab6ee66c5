//! What a source can describe: its coverage, part of the machine model.
//!
//! Each reader says, per [`Aspect`], whether its source describes it ([`Facet::Described`]),
//! describes it for some devices only ([`Facet::Partial`]), or cannot describe it at all
//! ([`Facet::Unknown`]), always with where it is read from or why not. Whatever a source cannot
//! describe is unknown, never a verdict: an NCCL topology file without `<nvlink>` entries says
//! nothing about NVLink (NCCL learns NVLink from NVML at run time), so its GPU pairs are "PCIe
//! class known, NVLink unknown" ([`crate::PairClass`]), not "PCIe only".

use serde::{Deserialize, Serialize};

/// The things a source may or may not describe. Serialized in kebab case (`"pci-tree"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Aspect {
    /// The PCIe tree: each function's parent bridge and host bridge (PIX/PXB/PHB/NODE).
    PciTree,
    /// Each device's NUMA node and the nodes' CPUs (SYS, NUMA affinity).
    Numa,
    /// NVLink between GPUs, directly or through NVSwitches (NV#).
    Nvlink,
    /// PCIe link speed and width, current and maximum (link limits, degraded links).
    LinkState,
    /// The ACS capability and control of bridges (P2P redirect).
    Acs,
    /// IOMMU units, groups and their domain types.
    Iommu,
    /// RDMA devices on NICs (`mlx5_0`, `efa_0`): whether GPUDirect RDMA has a device to use.
    Rdma,
    /// Kernel drivers and modules (`nvidia`, `nvidia_peermem`, `nvidia_fs`).
    Drivers,
}

impl Aspect {
    /// Every aspect, in the order of [`Coverage`]'s fields.
    pub const ALL: [Aspect; 8] = [
        Aspect::PciTree,
        Aspect::Numa,
        Aspect::Nvlink,
        Aspect::LinkState,
        Aspect::Acs,
        Aspect::Iommu,
        Aspect::Rdma,
        Aspect::Drivers,
    ];

    /// What the aspect is, in words (`"NVLink"`, `"the PCI tree"`).
    pub fn describe(self) -> &'static str {
        match self {
            Aspect::PciTree => "the PCI tree",
            Aspect::Numa => "NUMA placement",
            Aspect::Nvlink => "NVLink",
            Aspect::LinkState => "PCIe link speed and width",
            Aspect::Acs => "ACS",
            Aspect::Iommu => "the IOMMU",
            Aspect::Rdma => "RDMA devices",
            Aspect::Drivers => "kernel drivers and modules",
        }
    }
}

/// How far a source describes one [`Aspect`]. Serialized with a `state` tag:
/// `{"state": "described", "from": "..."}`, `{"state": "partial", "from": "...", "missing":
/// "..."}`, `{"state": "unknown", "reason": "..."}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "lowercase")]
pub enum Facet {
    /// The source describes it; `from` says where (`"/sys/class/iommu"`, `"<nvlink> entries"`).
    Described {
        /// Where the source gives it (a file, an XML element).
        from: String,
    },
    /// The source describes part of it: `from` as above, `missing` what it does not say and why.
    Partial {
        /// Where the source gives what it gives.
        from: String,
        /// What it does not give, and why.
        missing: String,
    },
    /// The source cannot describe it; `reason` says why. Values the model holds for it are
    /// unknown, never a verdict.
    Unknown {
        /// Why the source cannot give it.
        reason: String,
    },
}

impl Facet {
    /// [`Facet::Described`].
    pub fn described(from: impl Into<String>) -> Facet {
        Facet::Described { from: from.into() }
    }

    /// [`Facet::Partial`].
    pub fn partial(from: impl Into<String>, missing: impl Into<String>) -> Facet {
        Facet::Partial {
            from: from.into(),
            missing: missing.into(),
        }
    }

    /// [`Facet::Unknown`].
    pub fn unknown(reason: impl Into<String>) -> Facet {
        Facet::Unknown {
            reason: reason.into(),
        }
    }

    /// True when the source describes the aspect fully.
    pub fn is_described(&self) -> bool {
        matches!(self, Facet::Described { .. })
    }

    /// True when the source cannot describe the aspect at all.
    pub fn is_unknown(&self) -> bool {
        matches!(self, Facet::Unknown { .. })
    }

    /// What is missing and why: the reason of [`Facet::Unknown`], the `missing` of
    /// [`Facet::Partial`]; `None` when described.
    pub fn gap(&self) -> Option<&str> {
        match self {
            Facet::Described { .. } => None,
            Facet::Partial { missing, .. } => Some(missing),
            Facet::Unknown { reason } => Some(reason),
        }
    }
}

/// What a machine's source describes, one [`Facet`] per [`Aspect`]. Serialized as an object
/// keyed by the aspects' kebab-case names.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Coverage {
    /// How the source gives the PCI tree (bridges and who hangs below whom).
    pub pci_tree: Facet,
    /// How the source gives devices' NUMA nodes and CPU sets.
    pub numa: Facet,
    /// How the source gives NVLink connections between GPUs.
    pub nvlink: Facet,
    /// How the source gives PCIe links' trained and capable speed and width.
    pub link_state: Facet,
    /// How the source gives bridges' ACS capability and control.
    pub acs: Facet,
    /// How the source gives the IOMMU's units and groups.
    pub iommu: Facet,
    /// How the source gives RDMA devices (the NICs' InfiniBand/RoCE names).
    pub rdma: Facet,
    /// How the source gives the kernel driver bound to each device.
    pub drivers: Facet,
}

impl Coverage {
    /// Every aspect unknown for the same reason (a machine built by hand, or a source that
    /// says nothing about itself).
    pub fn unknown(reason: &str) -> Coverage {
        let u = || Facet::unknown(reason);
        Coverage {
            pci_tree: u(),
            numa: u(),
            nvlink: u(),
            link_state: u(),
            acs: u(),
            iommu: u(),
            rdma: u(),
            drivers: u(),
        }
    }

    /// The facet of one aspect.
    pub fn get(&self, aspect: Aspect) -> &Facet {
        match aspect {
            Aspect::PciTree => &self.pci_tree,
            Aspect::Numa => &self.numa,
            Aspect::Nvlink => &self.nvlink,
            Aspect::LinkState => &self.link_state,
            Aspect::Acs => &self.acs,
            Aspect::Iommu => &self.iommu,
            Aspect::Rdma => &self.rdma,
            Aspect::Drivers => &self.drivers,
        }
    }

    /// The facet of one aspect, to change it (the engine sets NVLink unknown with the reason the
    /// live driver could not be read).
    pub fn get_mut(&mut self, aspect: Aspect) -> &mut Facet {
        match aspect {
            Aspect::PciTree => &mut self.pci_tree,
            Aspect::Numa => &mut self.numa,
            Aspect::Nvlink => &mut self.nvlink,
            Aspect::LinkState => &mut self.link_state,
            Aspect::Acs => &mut self.acs,
            Aspect::Iommu => &mut self.iommu,
            Aspect::Rdma => &mut self.rdma,
            Aspect::Drivers => &mut self.drivers,
        }
    }

    /// The aspects the source does not fully describe, with what is missing, in [`Aspect::ALL`]
    /// order.
    pub fn gaps(&self) -> Vec<(Aspect, &str)> {
        Aspect::ALL
            .iter()
            .filter_map(|&a| self.get(a).gap().map(|g| (a, g)))
            .collect()
    }
}

/// A facet from how many of `total` items a source describes: all → described, none → unknown
/// with `none_reason`, some → partial with "`n` of `total` `what`" and `some_reason`.
pub(crate) fn by_count(
    described: usize,
    total: usize,
    from: &str,
    what: &str,
    none_reason: &str,
    some_reason: &str,
) -> Facet {
    if total == 0 || described >= total {
        Facet::described(from)
    } else if described == 0 {
        Facet::unknown(none_reason)
    } else {
        Facet::partial(
            from,
            format!("{} of {total} {what} {some_reason}", total - described),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_shape() {
        let mut c = Coverage::unknown("not said");
        c.nvlink = Facet::described("<nvlink> entries");
        c.acs = Facet::partial("config", "2 of 3 bridges unreadable");
        let v = serde_json::to_value(&c).unwrap();
        assert_eq!(v["nvlink"]["state"], "described");
        assert_eq!(v["nvlink"]["from"], "<nvlink> entries");
        assert_eq!(v["pci-tree"]["state"], "unknown");
        assert_eq!(v["acs"]["missing"], "2 of 3 bridges unreadable");
        let back: Coverage = serde_json::from_value(v).unwrap();
        assert_eq!(back, c);
        assert_eq!(c.gaps().len(), 7);
        assert_eq!(c.get(Aspect::Nvlink).gap(), None);
    }

    #[test]
    fn counts() {
        assert!(by_count(3, 3, "f", "x", "n", "s").is_described());
        assert!(by_count(0, 0, "f", "x", "n", "s").is_described());
        assert!(by_count(0, 3, "f", "x", "n", "s").is_unknown());
        assert_eq!(
            by_count(1, 3, "f", "bridges", "n", "have no ACS").gap(),
            Some("2 of 3 bridges have no ACS")
        );
    }
}
