//! IOMMU state: units, groups and their default domain type.

use crate::view::SysView;
use serde::{Deserialize, Serialize};

/// An IOMMU group and its default DMA domain type.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IommuGroup {
    /// The group's number (the directory name under `/sys/kernel/iommu_groups`).
    pub id: u32,
    /// `/sys/kernel/iommu_groups/N/type`: `DMA` (translated), `DMA-FQ` (translated, flush
    /// queue), `identity` (pass-through), `blocked`, `unmanaged`; `None` when unreadable.
    pub domain_type: Option<String>,
}

/// What the kernel says about the IOMMU. `readable: false` means unknown (the source has no
/// `/sys/class/iommu`, e.g. an old dump or hwloc/NCCL XML) — not "no IOMMU".
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IommuState {
    /// Whether `/sys/class/iommu` could be listed.
    pub readable: bool,
    /// IOMMU units (`/sys/class/iommu/*`: `dmar0`, `ivhd0`, ...).
    pub units: Vec<String>,
    /// Groups (`/sys/kernel/iommu_groups/*`), by number.
    pub groups: Vec<IommuGroup>,
}

impl IommuState {
    /// Reads `/sys/class/iommu` and `/sys/kernel/iommu_groups/*/type` through `view`.
    pub fn read(view: &dyn SysView) -> IommuState {
        let Ok(units) = view.read_dir("/sys/class/iommu") else {
            return IommuState::default();
        };
        let mut groups: Vec<IommuGroup> = view
            .read_dir("/sys/kernel/iommu_groups")
            .unwrap_or_default()
            .iter()
            .filter_map(|g| g.parse::<u32>().ok())
            .map(|id| IommuGroup {
                id,
                domain_type: view
                    .read_text(&format!("/sys/kernel/iommu_groups/{id}/type"))
                    .filter(|t| !t.is_empty()),
            })
            .collect();
        groups.sort_by_key(|g| g.id);
        IommuState {
            readable: true,
            units,
            groups,
        }
    }

    /// `Some(true)` when an IOMMU is active (units or groups exist), `Some(false)` when the
    /// kernel shows none, `None` when unknown.
    pub fn enabled(&self) -> Option<bool> {
        self.readable
            .then_some(!self.units.is_empty() || !self.groups.is_empty())
    }

    /// The default domain type of a group, when known.
    pub fn group_type(&self, id: u32) -> Option<&str> {
        self.groups
            .iter()
            .find(|g| g.id == id)
            .and_then(|g| g.domain_type.as_deref())
    }
}
