//! Reads the machine from a sysfs tree (live, copied or snapshot) through a [`SysView`].
//!
//! Files read, per PCI function `D` (all optional; an unreadable file is an unknown field):
//! `/sys/bus/pci/devices/D` (the link gives the PCI tree: `/sys/devices/pciDDDD:BB/.../D`),
//! `class`, `vendor`, `device`, `numa_node`, `local_cpulist` (else `local_cpus`),
//! `current_link_speed`, `current_link_width`, `max_link_speed`, `max_link_width`, the
//! `iommu_group` link, and `config` for bridges (ACS). Machine-wide: `/sys/class/infiniband`,
//! `/sys/class/net`, `/sys/class/block` (links to their PCI functions),
//! `/sys/devices/system/node/node*/cpulist`, `/sys/class/iommu`, `/sys/kernel/iommu_groups`,
//! `/proc/driver/nvidia/gpus/*` (GPUs the NVIDIA driver bound, with `numa_status`), and whether
//! `/proc/modules` is readable (for [`Coverage::drivers`]).
//!
//! Coverage ([`Coverage`]): the PCI tree, NUMA, link state, ACS, IOMMU, RDMA devices and kernel
//! modules as far as the tree holds them (each checked: a dump with 64-byte `config` files has
//! no ACS, one without `/sys/class/iommu` no IOMMU state); NVLink is never in sysfs — it comes
//! from the driver facts ([`Machine::set_driver`]).

use crate::acs::parse_acs;
use crate::coverage::{by_count, Coverage, Facet};
use crate::cpus::CpuSet;
use crate::device::{Device, DeviceKind};
use crate::iommu::IommuState;
use crate::link::{parse_speed, parse_width, PcieLink};
use crate::machine::{Machine, NumaNode};
use crate::names::{UNKNOWN_CLASS, UNKNOWN_ID};
use crate::pci::PciAddr;
use crate::view::SysView;
use crate::TopoError;
use std::collections::{BTreeMap, BTreeSet};

const PCI_DEVICES: &str = "/sys/bus/pci/devices";

/// Reads every PCI function, the class-device links, NUMA nodes and IOMMU state, and what the
/// tree covers ([`Machine::coverage`]). `source` is recorded as [`Machine::source`]. Errors:
/// [`TopoError::NotSysfs`] when `/sys/bus/pci/devices` cannot be listed (not a sysfs tree),
/// [`TopoError::TooManyDevices`] past the limits of [`crate::input`]; every other unreadable file
/// leaves its field unknown.
pub fn read_machine(view: &dyn SysView, source: &str) -> Result<Machine, TopoError> {
    let names = view
        .read_dir(PCI_DEVICES)
        .map_err(|e| TopoError::NotSysfs {
            what: format!("{PCI_DEVICES} cannot be listed: {e}"),
        })?;
    if names.len() > crate::input::MAX_PCI_FUNCTIONS {
        return Err(TopoError::TooManyDevices {
            source_name: format!("{source} {PCI_DEVICES}"),
            what: "PCI functions",
            count: names.len(),
            limit: crate::input::MAX_PCI_FUNCTIONS,
        });
    }
    let mut notes = Vec::new();
    let nvidia = nvidia_driver_gpus(view);
    let class_devs = ClassDevices::read(view);

    let mut devices = Vec::new();
    let mut entries: Vec<&str> = Vec::new();
    for name in &names {
        let Ok(pci) = name.parse::<PciAddr>() else {
            notes.push(format!("{PCI_DEVICES}/{name}: not a PCI address, skipped"));
            continue;
        };
        devices.push(read_device(view, name, pci, &nvidia, &class_devs));
        entries.push(name);
    }
    let what = format!("{source} {PCI_DEVICES}");
    crate::input::check_device_counts(&devices, &what)?;
    // Two entries for one address: a copied tree or a snapshot's listing that was edited (the
    // kernel names each function once, but `0000:00:06.0` and `0000:00:6.0` parse alike).
    let found: Vec<(PciAddr, ())> = devices.iter().map(|d| (d.pci, ())).collect();
    crate::input::check_unique_pci(&found, &what, |i| format!("entry {:?}", entries[i]))?;
    let tree_known = !devices.is_empty() && devices.iter().all(|d| d.host_bridge.is_some());
    let mut m = Machine::assemble(
        devices,
        read_numa_nodes(view),
        IommuState::read(view),
        tree_known,
        source,
    );
    m.notes = notes;
    m.coverage = coverage(view, &m, class_devs.infiniband_listed);
    Ok(m)
}

/// What a sysfs tree covers, checked against what was read.
fn coverage(view: &dyn SysView, m: &Machine, infiniband_listed: bool) -> Coverage {
    let placed = m.devices.iter().filter(|d| d.host_bridge.is_some()).count();
    let pci_tree = if m.devices.is_empty() {
        Facet::unknown("the source lists no PCI function")
    } else {
        by_count(
            placed,
            m.devices.len(),
            "the /sys/bus/pci/devices links into /sys/devices/pci* (root buses and bridges)",
            "PCI functions",
            "no /sys/devices/pci* tree behind /sys/bus/pci/devices (the dump holds only the \
             device entries)",
            "are not under a /sys/devices/pci* root bus",
        )
    };
    let numa = if m.numa_nodes.is_empty() {
        Facet::unknown("no /sys/devices/system/node in the source")
    } else {
        Facet::described(
            "numa_node and local_cpulist of each function, /sys/devices/system/node/node*/cpulist",
        )
    };
    let checked = m.link_checked_devices();
    let parts = |d: &crate::Device| {
        let l = d.link;
        [
            l.cur_gts.is_some(),
            l.cur_width.is_some(),
            l.max_gts.is_some(),
            l.max_width.is_some(),
        ]
    };
    let full = checked
        .iter()
        .filter(|d| parts(d).iter().all(|p| *p))
        .count();
    let any = checked
        .iter()
        .filter(|d| parts(d).iter().any(|p| *p))
        .count();
    let from = "current_link_speed/width and max_link_speed/width";
    let link_state = if full == checked.len() {
        Facet::described(from)
    } else if any == 0 {
        Facet::unknown(
            "no GPU, NIC, NVMe or bridge above them has readable link speed or width files \
             (virtual devices, old kernels)",
        )
    } else {
        Facet::partial(
            from,
            format!(
                "{} of {} GPUs, NICs, NVMe and bridges above them lack some of the current and \
                 maximum speed and width (virtual devices, old kernels)",
                checked.len() - full,
                checked.len()
            ),
        )
    };
    let bridges: Vec<_> = checked
        .iter()
        .filter(|d| d.kind == crate::DeviceKind::Bridge)
        .collect();
    let acs = if !m.tree_known {
        Facet::unknown("the source has no PCI tree: the bridges between devices are unknown")
    } else if bridges.is_empty() {
        Facet::described("no PCI bridge above the GPUs, NICs and NVMe: nothing to redirect")
    } else {
        by_count(
            bridges.iter().filter(|d| d.acs.is_some()).count(),
            bridges.len(),
            "the ACS extended capability in each bridge's config",
            "bridges above GPUs, NICs and NVMe",
            "the bridges' config files hold no extended configuration space (past 256 bytes, \
             readable only as root)",
            "have config files without extended configuration space (readable only as root)",
        )
    };
    let iommu = if m.iommu.readable {
        Facet::described("/sys/class/iommu and /sys/kernel/iommu_groups/*/type")
    } else {
        Facet::unknown("no /sys/class/iommu in the source")
    };
    let rdma = if infiniband_listed {
        Facet::described("/sys/class/infiniband")
    } else {
        Facet::unknown(
            "no /sys/class/infiniband in the source (no RDMA driver registered a device, or the \
             dump lacks it): RDMA capability is known only from the NICs' PCI identity",
        )
    };
    let drivers = if view.read("/proc/modules").is_ok() {
        Facet::described("/proc/modules")
    } else {
        Facet::unknown("no /proc/modules in the source")
    };
    Coverage {
        pci_tree,
        numa,
        nvlink: Facet::unknown(
            "sysfs does not describe NVLink: it comes from the NVIDIA driver (NVML), and no \
             driver facts are attached",
        ),
        link_state,
        acs,
        iommu,
        rdma,
        drivers,
    }
}

fn read_device(
    view: &dyn SysView,
    name: &str,
    pci: PciAddr,
    nvidia: &BTreeMap<PciAddr, Option<u32>>,
    class_devs: &ClassDevices,
) -> Device {
    let mut d = Device::new(pci);
    let dir = view
        .resolve(&format!("{PCI_DEVICES}/{name}"))
        .unwrap_or_else(|_| format!("{PCI_DEVICES}/{name}"));
    let (host_bridge, parent) = tree_position(&dir, pci);
    d.host_bridge = host_bridge;
    d.parent = parent;

    let text = |file: &str| view.read_text(&format!("{dir}/{file}"));
    d.class = text("class")
        .and_then(|t| parse_hex(&t))
        .filter(|&c| c <= 0xff_ffff)
        .unwrap_or(UNKNOWN_CLASS);
    let id16 = |file: &str| {
        text(file)
            .and_then(|t| parse_hex(&t))
            .and_then(|v| u16::try_from(v).ok())
            .unwrap_or(UNKNOWN_ID)
    };
    d.vendor = id16("vendor");
    d.device = id16("device");
    d.numa = text("numa_node")
        .and_then(|t| t.parse::<i64>().ok())
        .and_then(|n| u32::try_from(n).ok());
    d.cpus = text("local_cpulist")
        .and_then(|t| CpuSet::parse_list(&t))
        .or_else(|| text("local_cpus").and_then(|t| CpuSet::parse_mask(&t)))
        .filter(|s| !s.is_empty())
        .map(|s| s.to_list());
    d.link = PcieLink {
        cur_gts: text("current_link_speed").and_then(|t| parse_speed(&t)),
        cur_width: text("current_link_width").and_then(|t| parse_width(&t)),
        max_gts: text("max_link_speed").and_then(|t| parse_speed(&t)),
        max_width: text("max_link_width").and_then(|t| parse_width(&t)),
        stated_gbps: None,
    };
    d.iommu_group = view
        .read_link(&format!("{dir}/iommu_group"))
        .ok()
        .and_then(|t| t.rsplit('/').next().and_then(|g| g.parse().ok()));

    if let Some(c) = class_devs.by_pci.get(&pci) {
        d.rdma = c.rdma.clone();
        d.netdevs = c.net.clone();
        d.block = c.block.clone();
    }
    let driver_listed = nvidia.get(&pci);
    d.gpu_numa_id = driver_listed.copied().flatten();
    d.kind = DeviceKind::decide(
        d.class,
        d.vendor,
        !d.rdma.is_empty(),
        driver_listed.is_some(),
    );
    if d.kind == DeviceKind::Bridge {
        d.acs = view
            .read(&format!("{dir}/config"))
            .ok()
            .and_then(|c| parse_acs(&c));
    }
    if d.kind == DeviceKind::Gpu && d.vendor == UNKNOWN_ID {
        d.name = Some("NVIDIA GPU (listed by the NVIDIA driver; vendor id unreadable)".into());
    }
    d
}

/// Host bridge (`pci0000:00`) and parent bridge of the function at canonical sysfs path `dir`.
/// Both `None` when the path is not under a `pciDDDD:BB` root bus (no tree in the source).
fn tree_position(dir: &str, pci: PciAddr) -> (Option<String>, Option<PciAddr>) {
    let comps: Vec<&str> = dir.split('/').filter(|c| !c.is_empty()).collect();
    let Some(root) = comps.iter().rposition(|c| is_root_bus(c)) else {
        return (None, None);
    };
    let chain: Vec<PciAddr> = comps[root + 1..]
        .iter()
        .filter_map(|c| c.parse::<PciAddr>().ok())
        .collect();
    if chain.last() != Some(&pci) {
        return (None, None);
    }
    let parent = chain.len().checked_sub(2).map(|i| chain[i]);
    (Some(comps[root].to_owned()), parent)
}

/// `pciDDDD:BB`, the name sysfs gives a PCI root bus (one per host bridge).
fn is_root_bus(c: &str) -> bool {
    c.strip_prefix("pci")
        .and_then(|r| r.split_once(':'))
        .is_some_and(|(dom, bus)| {
            !dom.is_empty()
                && dom.len() <= 8
                && bus.len() == 2
                && dom
                    .bytes()
                    .chain(bus.bytes())
                    .all(|b| b.is_ascii_hexdigit())
        })
}

/// Parses a hex number with or without `0x` (`0x030200`, `10de`).
pub(crate) fn parse_hex(t: &str) -> Option<u32> {
    let t = t.trim();
    let t = t
        .strip_prefix("0x")
        .or_else(|| t.strip_prefix("0X"))
        .unwrap_or(t);
    u32::from_str_radix(t, 16).ok()
}

/// The PCI function a class device (`/sys/class/net/eth0`, ...) belongs to: the last PCI
/// address in its canonical path (`.../0000:00:03.0/virtio0/net/eth0` → `0000:00:03.0`).
fn owning_function(canonical: &str) -> Option<PciAddr> {
    canonical
        .split('/')
        .filter_map(|c| c.parse::<PciAddr>().ok())
        .next_back()
}

#[derive(Default)]
struct ClassNames {
    rdma: Vec<String>,
    net: Vec<String>,
    block: Vec<String>,
}

/// RDMA, network and block devices by the PCI function they sit on.
struct ClassDevices {
    by_pci: BTreeMap<PciAddr, ClassNames>,
    /// Whether `/sys/class/infiniband` could be listed.
    infiniband_listed: bool,
}

impl ClassDevices {
    fn read(view: &dyn SysView) -> ClassDevices {
        let mut by_pci: BTreeMap<PciAddr, ClassNames> = BTreeMap::new();
        let mut infiniband_listed = false;
        for (class, pick) in [("infiniband", 0usize), ("net", 1), ("block", 2)] {
            let dir = format!("/sys/class/{class}");
            let listed = view.read_dir(&dir);
            if class == "infiniband" {
                infiniband_listed = listed.is_ok();
            }
            let names = listed.unwrap_or_default();
            let all: BTreeSet<&str> = names.iter().map(String::as_str).collect();
            for name in &names {
                let Ok(path) = view.resolve(&format!("{dir}/{name}")) else {
                    continue;
                };
                // A partition sits inside its disk's directory (`.../nvme0n1/nvme0n1p1`).
                let parent_name = path.rsplit('/').nth(1).unwrap_or("");
                if class == "block" && all.contains(parent_name) {
                    continue;
                }
                if let Some(pci) = owning_function(&path) {
                    let e = by_pci.entry(pci).or_default();
                    [&mut e.rdma, &mut e.net, &mut e.block][pick].push(name.clone());
                }
            }
        }
        ClassDevices {
            by_pci,
            infiniband_listed,
        }
    }
}

/// GPUs the NVIDIA driver lists in `/proc/driver/nvidia/gpus`, with the NUMA node of their
/// memory from `numa_status` (`Node: 255`) when it is one.
fn nvidia_driver_gpus(view: &dyn SysView) -> BTreeMap<PciAddr, Option<u32>> {
    let base = "/proc/driver/nvidia/gpus";
    view.read_dir(base)
        .unwrap_or_default()
        .iter()
        .filter_map(|n| {
            let pci = n.parse::<PciAddr>().ok()?;
            let node = view
                .read_text(&format!("{base}/{n}/numa_status"))
                .and_then(|t| {
                    t.lines()
                        .find_map(|l| l.strip_prefix("Node:"))
                        .and_then(|v| v.trim().parse::<i64>().ok())
                })
                .and_then(|v| u32::try_from(v).ok());
            Some((pci, node))
        })
        .collect()
}

fn read_numa_nodes(view: &dyn SysView) -> Vec<NumaNode> {
    let base = "/sys/devices/system/node";
    let mut nodes: Vec<NumaNode> = view
        .read_dir(base)
        .unwrap_or_default()
        .iter()
        .filter_map(|n| n.strip_prefix("node")?.parse::<u32>().ok())
        .map(|id| NumaNode {
            id,
            cpus: view
                .read_text(&format!("{base}/node{id}/cpulist"))
                .and_then(|t| CpuSet::parse_list(&t))
                .map(|s| s.to_list())
                .unwrap_or_default(),
        })
        .collect();
    nodes.sort_by_key(|n| n.id);
    nodes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tree_positions() {
        let p = |s: &str| s.parse::<PciAddr>().unwrap();
        assert_eq!(
            tree_position("/sys/devices/pci0000:00/0000:00:06.0", p("0000:00:06.0")),
            (Some("pci0000:00".into()), None)
        );
        assert_eq!(
            tree_position(
                "/sys/devices/pci0000:80/0000:80:02.2/0000:82:00.0",
                p("0000:82:00.0")
            ),
            (Some("pci0000:80".into()), Some(p("0000:80:02.2")))
        );
        assert_eq!(
            tree_position("/sys/bus/pci/devices/0004:05:00.0", p("0004:05:00.0")),
            (None, None)
        );
        assert!(is_root_bus("pci10000:00"));
        assert!(!is_root_bus("pci_bus"));
        assert_eq!(
            owning_function("/sys/devices/pci0000:00/0000:00:03.0/virtio0/net/eth0"),
            Some(p("0000:00:03.0"))
        );
        assert_eq!(owning_function("/sys/devices/virtual/net/lo"), None);
    }
}
