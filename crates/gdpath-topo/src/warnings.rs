//! Topology warnings with stable ids: what looks wrong in a machine, and what its source cannot
//! tell.

use crate::class::LinkClass;
use crate::device::{Device, DeviceKind};
use crate::machine::Machine;
use crate::pairs::{bridges_at, Place};
use crate::pci::PciAddr;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};

/// A topology warning with a stable id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Warning {
    /// Stable id, one of [`warning_ids`].
    pub id: String,
    /// What was found, in words, naming the devices.
    pub message: String,
}

/// The stable ids of [`Machine::warnings`].
pub mod warning_ids {
    /// The source does not describe NVLink ([`crate::Coverage::nvlink`]): GPU pairs show their
    /// PCIe class, and pairs joined by NVLink or NVSwitch are not shown as NV#. Once per machine.
    pub const NVLINK_UNKNOWN: &str = "topo.nvlink-unknown";
    /// A link trained below its maximum speed or width.
    pub const LINK_DEGRADED: &str = "topo.link-degraded";
    /// A GPU whose nearest NIC is only reachable through NODE or SYS.
    pub const NIC_FAR: &str = "topo.nic-far";
    /// ACS P2P redirect (RR or CR) enabled on a bridge on a GPU↔GPU or GPU↔NIC path.
    pub const ACS_REDIRECT: &str = "topo.acs-redirect";
    /// A GPU, NIC or NVMe with no NUMA node in the source on a machine with several nodes.
    pub const NUMA_UNKNOWN: &str = "topo.numa-unknown";
    /// The source has no PCI tree: PIX/PXB/PHB/NODE cannot be told apart.
    pub const TREE_UNKNOWN: &str = "topo.tree-unknown";
}

/// Most pairs a `topo.acs-redirect` warning names; the rest are counted.
const ACS_PAIRS_NAMED: usize = 16;

fn warn(out: &mut Vec<Warning>, id: &str, message: String) {
    out.push(Warning {
        id: id.to_owned(),
        message,
    });
}

impl Machine {
    /// Warnings with stable ids ([`warning_ids`]), in a fixed order: what the source cannot
    /// tell first (no PCI tree, no NVLink), then degraded links, far NICs, ACS redirect and
    /// unknown NUMA nodes.
    pub fn warnings(&self) -> Vec<Warning> {
        let mut out = Vec::new();
        if !self.tree_known && !self.devices.is_empty() && self.stated_pcie.is_none() {
            warn(
                &mut out,
                warning_ids::TREE_UNKNOWN,
                "the source has no PCI tree (no /sys/devices/pci* paths): PIX, PXB, PHB and \
                 NODE cannot be told apart, so pairs read N/A unless their NUMA nodes differ \
                 (SYS)"
                    .to_owned(),
            );
        }
        if self.gpus().nth(1).is_some() {
            if let Some(reason) = self.coverage.nvlink.gap() {
                warn(
                    &mut out,
                    warning_ids::NVLINK_UNKNOWN,
                    format!(
                        "this source ({}) does not describe NVLink ({reason}): GPU pairs show \
                         their PCIe class, and GPUs joined by NVLink or NVSwitch would be NV#",
                        self.source
                    ),
                );
            }
        }
        for d in self.link_checked_devices() {
            if d.link.is_degraded() {
                warn(&mut out, warning_ids::LINK_DEGRADED, degraded_message(d));
            }
        }
        let by_id: HashMap<&str, &Device> =
            self.devices.iter().map(|d| (d.id.as_str(), d)).collect();
        for n in self.nearest() {
            if let Some(p) = n.nic.as_ref().filter(|p| p.class >= LinkClass::Node) {
                let nic = by_id.get(p.id.as_str()).map(|d| d.os_name());
                warn(
                    &mut out,
                    warning_ids::NIC_FAR,
                    format!(
                        "{}'s nearest NIC is {} ({}) at {}: GPUDirect RDMA traffic crosses {}",
                        n.gpu,
                        p.id,
                        nic.unwrap_or_default(),
                        p.class,
                        if p.class == LinkClass::Sys {
                            "the interconnect between CPU sockets"
                        } else if p.class == LinkClass::Node {
                            "the interconnect between PCIe host bridges"
                        } else {
                            "a path the source does not describe"
                        }
                    ),
                );
            }
        }
        self.acs_warnings(&mut out);
        if self.numa_nodes.len() > 1 {
            for d in self.matrix_devices() {
                if d.numa.is_none() {
                    let inferred = match self.numa_of(d) {
                        Some(n) => format!("node {n} inferred from its local CPUs"),
                        None => "treated as the same node as any peer (nvidia-smi's convention)"
                            .to_owned(),
                    };
                    warn(
                        &mut out,
                        warning_ids::NUMA_UNKNOWN,
                        format!(
                            "{} ({}): NUMA node unknown (numa_node -1 or absent); {inferred}",
                            d.id, d.pci
                        ),
                    );
                }
            }
        }
        out
    }

    /// GPUs, NICs, NVMe and the bridges above them, each once, in PCI order.
    /// Two functions at one address (an hwloc export that lost the PCI domain) are both kept:
    /// each device once by identity, so that this list and the matrix agree.
    pub fn link_checked_devices(&self) -> Vec<&Device> {
        let mut seen: std::collections::HashSet<*const Device> = Default::default();
        let mut v: Vec<&Device> = self
            .matrix_devices()
            .into_iter()
            .flat_map(|d| std::iter::once(d).chain(self.ancestors(d)))
            .filter(|d| seen.insert(*d as *const Device))
            .collect();
        v.sort_by(|a, b| (a.pci, &a.id).cmp(&(b.pci, &b.id)));
        v
    }

    fn acs_warnings(&self, out: &mut Vec<Warning>) {
        // Most machines have no bridge that redirects: no pair needs looking at.
        if !self
            .devices
            .iter()
            .any(|d| d.acs.is_some_and(|a| a.redirects_p2p()))
        {
            return;
        }
        let gpus: Vec<Place> = self.gpus().map(|d| self.place(d)).collect();
        let nics: Vec<Place> = self.nics().map(|d| self.place(d)).collect();
        // bridge pci -> (pairs named, pairs in all) whose path crosses it with redirect enabled
        let mut hits: BTreeMap<PciAddr, (Vec<String>, u64)> = BTreeMap::new();
        let mut hit = |a: &Place, b: &Place, pairs: u64| {
            for br in bridges_at(a, b) {
                if br.acs.is_some_and(|x| x.redirects_p2p()) {
                    let (named, all) = hits.entry(br.pci).or_default();
                    if named.len() < ACS_PAIRS_NAMED {
                        named.push(format!("{}↔{}", a.dev.id, b.dev.id));
                    }
                    *all += pairs;
                }
            }
        };
        match self.place_groups(&gpus).zip(self.place_groups(&nics)) {
            // Many devices: one pair per pair of groups that share their bridges (TreeKey).
            Some((gg, ng)) if gpus.len() + nics.len() > crate::input::MAX_LISTED_PAIR_DEVICES => {
                for (p, a) in gg.iter().enumerate() {
                    if a.len() >= 2 {
                        let n = a.len() as u64;
                        hit(&gpus[a[0]], &gpus[a[1]], n * (n - 1) / 2);
                    }
                    for b in &gg[p + 1..] {
                        hit(&gpus[a[0]], &gpus[b[0]], (a.len() * b.len()) as u64);
                    }
                    for b in &ng {
                        hit(&gpus[a[0]], &nics[b[0]], (a.len() * b.len()) as u64);
                    }
                }
            }
            _ => {
                for (i, g) in gpus.iter().enumerate() {
                    for p in gpus[i + 1..].iter().chain(&nics) {
                        hit(g, p, 1);
                    }
                }
            }
        }
        for (bridge, (named, all)) in hits {
            let more = all.saturating_sub(named.len() as u64);
            warn(
                out,
                warning_ids::ACS_REDIRECT,
                format!(
                    "ACS P2P redirect (RR/CR) is enabled on bridge {bridge}, on the path of {}{}: \
                     P2P and GPUDirect RDMA traffic is sent up to the root complex",
                    named.join(", "),
                    if more > 0 {
                        format!(" and {more} more pairs")
                    } else {
                        String::new()
                    }
                ),
            );
        }
    }

    /// `places` grouped by [`crate::TreeKey`] (indices, in order, the groups by first member);
    /// `None` when the machine states its classes per pair and no two are interchangeable.
    fn place_groups(&self, places: &[Place]) -> Option<Vec<Vec<usize>>> {
        let mut groups: Vec<Vec<usize>> = Vec::new();
        let mut at: HashMap<crate::TreeKey, usize> = HashMap::new();
        for (i, p) in places.iter().enumerate() {
            let k = self.tree_key(p)?;
            let g = *at.entry(k).or_insert_with(|| {
                groups.push(Vec::new());
                groups.len() - 1
            });
            groups[g].push(i);
        }
        Some(groups)
    }
}

fn degraded_message(d: &Device) -> String {
    let l = &d.link;
    let bw = match (l.limit_gbps(), l.max_limit_gbps()) {
        (Some(c), Some(m)) => format!(" ({c:.2} of {m:.2} GB/s per direction)"),
        _ => String::new(),
    };
    let idle = if d.kind == DeviceKind::Gpu && l.speed_degraded() && !l.width_degraded() {
        "; GPUs lower their link speed when idle, so check again under load"
    } else {
        ""
    };
    format!(
        "{} ({}, {}): link trained at {}, capable of {}{bw}{idle}",
        d.id,
        d.pci,
        d.display_name(),
        l.cur_text(),
        l.max_text(),
    )
}
