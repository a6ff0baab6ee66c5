//! The machine: devices, NUMA nodes, NVLink, IOMMU; pair classification, the matrix, nearest
//! devices and warnings.

use crate::class::LinkClass;
use crate::cpus::CpuSet;
use crate::device::{Device, DeviceKind};
use crate::facts::DriverFacts;
use crate::iommu::IommuState;
use crate::pci::PciAddr;
use serde::ser::SerializeMap;
use serde::{Deserialize, Serialize, Serializer};
use std::collections::BTreeMap;

/// Schema id of `gdpath topo --json`.
pub const TOPO_SCHEMA: &str = "gdpath.topo/1";

/// Deepest bridge chain followed (PCIe allows far fewer levels; this stops malformed trees).
const MAX_DEPTH: usize = 64;

/// A NUMA node and its CPUs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NumaNode {
    pub id: u32,
    /// cpulist (`0-31`); empty for memory-only nodes (e.g. GPU memory exposed as a node).
    pub cpus: String,
}

/// An NVLink connection between two GPUs: `links` bonded links, directly or through NVSwitches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct NvLinkBond {
    /// The lower PCI address of the two.
    pub a: PciAddr,
    pub b: PciAddr,
    pub links: u32,
}

/// A topology warning with a stable id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Warning {
    /// Stable id, one of [`warning_ids`].
    pub id: String,
    pub message: String,
}

/// The stable ids of [`Machine::warnings`].
pub mod warning_ids {
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

/// A device's nearest peer of some kind.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Peer {
    pub id: String,
    pub class: LinkClass,
}

/// A GPU's nearest NIC and NVMe.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Nearest {
    pub gpu: String,
    pub nic: Option<Peer>,
    pub nvme: Option<Peer>,
}

/// The pair matrix over GPUs, then NICs, then NVMe, each in PCI bus order. Serialized as
/// `{row_id: {col_id: class}}` in that order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Matrix {
    pub ids: Vec<String>,
    /// `cells[i][j]` classifies `ids[i]` against `ids[j]`.
    pub cells: Vec<Vec<LinkClass>>,
}

impl Matrix {
    /// The class of the pair (row, col) by id.
    pub fn get(&self, row: &str, col: &str) -> Option<LinkClass> {
        let i = self.ids.iter().position(|x| x == row)?;
        let j = self.ids.iter().position(|x| x == col)?;
        Some(self.cells[i][j])
    }
}

impl Serialize for Matrix {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        struct Row<'a>(&'a [String], &'a [LinkClass]);
        impl Serialize for Row<'_> {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                let mut m = s.serialize_map(Some(self.0.len()))?;
                for (id, c) in self.0.iter().zip(self.1) {
                    m.serialize_entry(id, c)?;
                }
                m.end()
            }
        }
        let mut m = s.serialize_map(Some(self.ids.len()))?;
        for (id, row) in self.ids.iter().zip(&self.cells) {
            m.serialize_entry(id, &Row(&self.ids, row))?;
        }
        m.end()
    }
}

/// Everything `gdpath topo --json` prints (schema [`TOPO_SCHEMA`]).
#[derive(Debug, Clone, Serialize)]
pub struct TopoReport<'a> {
    pub schema: &'static str,
    /// Where the machine was read from: `live`, `sysfs-root`, `hwloc-xml`, `nccl-xml` (a replayed
    /// snapshot reports the source it was captured from).
    pub source: &'a str,
    pub tree_known: bool,
    pub devices: &'a [Device],
    pub numa_nodes: &'a [NumaNode],
    pub iommu: &'a IommuState,
    pub nvlinks: &'a [NvLinkBond],
    pub matrix: Matrix,
    pub nearest: Vec<Nearest>,
    pub warnings: Vec<Warning>,
    /// What the reader could not place or found inconsistent in the source.
    pub notes: &'a [String],
}

/// A machine as gdpath sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Machine {
    /// All PCI functions, in PCI bus order.
    pub devices: Vec<Device>,
    pub numa_nodes: Vec<NumaNode>,
    /// Driver facts (NVML/CUDA) when known: from a snapshot's `driver.json`, or attached by the
    /// engine from the live driver.
    pub driver: Option<DriverFacts>,
    /// NVLink connections between GPUs, from driver facts or from the source (hwloc XML
    /// `NVLinkBandwidth`, NCCL XML `<nvlink>`).
    pub nvlinks: Vec<NvLinkBond>,
    pub iommu: IommuState,
    /// False when the source has no PCI tree (parents and host bridges unknown).
    pub tree_known: bool,
    /// `live`, `sysfs-root`, `hwloc-xml` or `nccl-xml`.
    pub source: String,
    /// Things the reader could not place or found inconsistent.
    pub notes: Vec<String>,
}

impl Machine {
    /// Builds a machine from a reader's devices: sorts them in PCI bus order, decides short ids
    /// (`GPU0`, `NIC0`, `NVME0`, else the PCI address) and fills missing names.
    pub fn assemble(
        mut devices: Vec<Device>,
        numa_nodes: Vec<NumaNode>,
        iommu: IommuState,
        tree_known: bool,
        source: &str,
    ) -> Machine {
        devices.sort_by_key(|d| d.pci);
        let mut counters: BTreeMap<&'static str, usize> = BTreeMap::new();
        for d in &mut devices {
            d.id = match d.kind.id_prefix() {
                Some(p) => {
                    let n = counters.entry(p).or_insert(0);
                    *n += 1;
                    format!("{p}{}", *n - 1)
                }
                None => d.pci.to_string(),
            };
            if d.name.is_none() {
                d.name = Some(d.display_name());
            }
        }
        Machine {
            devices,
            numa_nodes,
            driver: None,
            nvlinks: Vec::new(),
            iommu,
            tree_known,
            source: source.to_owned(),
            notes: Vec::new(),
        }
    }

    /// Attaches driver facts and takes NVLink connections from them
    /// ([`DriverFacts::nvlink_count`], GPUs matched by PCI address).
    pub fn set_driver(&mut self, facts: DriverFacts) {
        let gpus: Vec<PciAddr> = self.gpus().map(|g| g.pci).collect();
        for (i, a) in gpus.iter().enumerate() {
            for b in &gpus[i + 1..] {
                let ord = |p: &PciAddr| facts.gpu_by_pci(&p.to_string()).map(|g| g.ordinal);
                if let (Some(oa), Some(ob)) = (ord(a), ord(b)) {
                    let n = facts.nvlink_count(oa, ob).max(facts.nvlink_count(ob, oa));
                    self.set_nvlink(*a, *b, n);
                }
            }
        }
        self.driver = Some(facts);
    }

    /// Records `links` NVLinks between two GPUs (0 removes the connection).
    pub fn set_nvlink(&mut self, a: PciAddr, b: PciAddr, links: u32) {
        let (a, b) = if a <= b { (a, b) } else { (b, a) };
        self.nvlinks.retain(|l| !(l.a == a && l.b == b));
        if links > 0 && a != b {
            self.nvlinks.push(NvLinkBond { a, b, links });
            self.nvlinks.sort_by_key(|l| (l.a, l.b));
        }
    }

    /// Number of NVLinks between two devices (0 when none is known).
    pub fn nvlink_count(&self, a: &PciAddr, b: &PciAddr) -> u32 {
        let (a, b) = if a <= b { (a, b) } else { (b, a) };
        self.nvlinks
            .iter()
            .find(|l| &l.a == a && &l.b == b)
            .map_or(0, |l| l.links)
    }

    /// GPUs in PCI bus order.
    pub fn gpus(&self) -> impl Iterator<Item = &Device> {
        self.of_kind(DeviceKind::Gpu)
    }

    /// NICs in PCI bus order.
    pub fn nics(&self) -> impl Iterator<Item = &Device> {
        self.of_kind(DeviceKind::Nic)
    }

    /// NVMe controllers in PCI bus order.
    pub fn nvmes(&self) -> impl Iterator<Item = &Device> {
        self.of_kind(DeviceKind::Nvme)
    }

    fn of_kind(&self, kind: DeviceKind) -> impl Iterator<Item = &Device> {
        self.devices.iter().filter(move |d| d.kind == kind)
    }

    /// The device at a PCI address (the first, should a malformed source repeat an address).
    pub fn device(&self, pci: &PciAddr) -> Option<&Device> {
        self.devices.iter().find(|d| &d.pci == pci)
    }

    /// The device with this id (`GPU0`, `NIC1`, `0000:00:01.0`).
    pub fn by_id(&self, id: &str) -> Option<&Device> {
        self.devices.iter().find(|d| d.id == id)
    }

    /// The bridges above a device, nearest first, up to its root bus.
    pub fn ancestors(&self, dev: &Device) -> Vec<&Device> {
        let mut out: Vec<&Device> = Vec::new();
        let mut cur = dev.parent;
        while let Some(p) = cur {
            // Prefer the bridge when a malformed source repeats an address.
            let Some(d) = self
                .devices
                .iter()
                .find(|d| d.pci == p && d.kind == DeviceKind::Bridge)
                .or_else(|| self.device(&p))
            else {
                break;
            };
            if out.len() >= MAX_DEPTH || out.iter().any(|o| o.pci == d.pci) {
                break;
            }
            out.push(d);
            cur = d.parent;
        }
        out
    }

    /// The NUMA node a device is local to: the source's value, else — when the source says
    /// unknown (sysfs -1) — the one node whose CPUs include all of the device's local CPUs, or
    /// the only node of a single-node machine. This is how `nvidia-smi topo -m` fills its
    /// `NUMA Affinity` column (it prints 0 for the H200 VM whose GPUs report -1). `None` when
    /// neither settles it.
    pub fn numa_of(&self, dev: &Device) -> Option<u32> {
        if dev.numa.is_some() {
            return dev.numa;
        }
        let with_cpus: Vec<&NumaNode> = self
            .numa_nodes
            .iter()
            .filter(|n| !n.cpus.is_empty())
            .collect();
        if with_cpus.len() == 1 {
            return Some(with_cpus[0].id);
        }
        let cpus = CpuSet::parse_list(dev.cpus.as_deref()?)?;
        if cpus.is_empty() {
            return None;
        }
        let mut hits = with_cpus
            .iter()
            .filter(|n| CpuSet::parse_list(&n.cpus).is_some_and(|node| cpus.is_subset(&node)));
        match (hits.next(), hits.next()) {
            (Some(n), None) => Some(n.id),
            _ => None,
        }
    }

    /// Where the paths of `a` and `b` up the PCI tree meet: the lowest common bridge and how
    /// many bridges lie strictly below it on each side, or `None` when they share no bridge.
    fn meeting_point<'a>(
        &'a self,
        up_a: &[&'a Device],
        up_b: &[&'a Device],
    ) -> Option<(usize, usize)> {
        up_a.iter()
            .enumerate()
            .find_map(|(i, x)| up_b.iter().position(|y| y.pci == x.pci).map(|j| (i, j)))
    }

    /// The PCIe class of a pair, per the `nvidia-smi topo -m` legend (see [`LinkClass`]):
    ///
    /// - `X`: the same device.
    /// - Different host bridges (sysfs root buses `pciDDDD:BB`): `SYS` when the two devices'
    ///   NUMA nodes ([`Machine::numa_of`]) are both known and differ ("crosses the SMP
    ///   interconnect between NUMA nodes"); otherwise `NODE` ("between PCIe host bridges within a
    ///   NUMA node"). A node that is unknown on either side counts as the same node, as
    ///   nvidia-smi does.
    /// - Same host bridge, no bridge in common: `PHB` ("traversing a PCIe host bridge"). Devices
    ///   directly on the root bus (the H200 VM's GPUs at 00:06.0 and 00:07.0) are `PHB`.
    /// - Same host bridge, meeting at a common bridge: `PIX` ("at most a single PCIe bridge")
    ///   when each device is at most one bridge below the meeting bridge — that is, both hang off
    ///   the same PCIe switch (its upstream port and one downstream port each), or both sit
    ///   directly under one bridge; otherwise `PXB` ("multiple PCIe bridges without the host
    ///   bridge"), e.g. a switch below another switch.
    /// - No PCI tree in the source: `SYS` when the NUMA nodes are known and differ, else
    ///   [`LinkClass::Unknown`] (printed `N/A`): gdpath does not invent a tree.
    pub fn pcie_class(&self, a: &Device, b: &Device) -> LinkClass {
        if std::ptr::eq(a, b) || (a.pci == b.pci && a.id == b.id) {
            return LinkClass::X;
        }
        let numa_differs = || match (self.numa_of(a), self.numa_of(b)) {
            (Some(x), Some(y)) => x != y,
            _ => false,
        };
        let (Some(ha), Some(hb)) = (&a.host_bridge, &b.host_bridge) else {
            return if numa_differs() {
                LinkClass::Sys
            } else {
                LinkClass::Unknown
            };
        };
        if ha != hb {
            return if numa_differs() {
                LinkClass::Sys
            } else {
                LinkClass::Node
            };
        }
        let (up_a, up_b) = (self.ancestors(a), self.ancestors(b));
        match self.meeting_point(&up_a, &up_b) {
            None => LinkClass::Phb,
            Some((i, j)) if i <= 1 && j <= 1 => LinkClass::Pix,
            Some(_) => LinkClass::Pxb,
        }
    }

    /// The class of a pair as `nvidia-smi topo -m` prints it: `X` for the device itself, `NV#`
    /// for GPUs joined by # NVLinks ("a bonded set of # NVLinks", directly or through
    /// NVSwitches), else [`Machine::pcie_class`].
    pub fn classify(&self, a: &Device, b: &Device) -> LinkClass {
        let pcie = self.pcie_class(a, b);
        if pcie == LinkClass::X {
            return pcie;
        }
        match self.nvlink_count(&a.pci, &b.pci) {
            0 => pcie,
            n => LinkClass::Nv(n),
        }
    }

    /// The bridges a P2P transfer between `a` and `b` crosses: from each device up to the bridge
    /// where their paths meet (included), or, when they meet only at the host bridge or above,
    /// every bridge on both paths (root ports included). Nearest to `a` first. These are the
    /// bridges whose ACS settings matter for the pair.
    pub fn bridges_between(&self, a: &Device, b: &Device) -> Vec<&Device> {
        let (up_a, up_b) = (self.ancestors(a), self.ancestors(b));
        let mut out: Vec<&Device> = match self.meeting_point(&up_a, &up_b) {
            Some((i, j)) => up_a[..=i]
                .iter()
                .chain(up_b[..j].iter().rev())
                .copied()
                .collect(),
            None => up_a.iter().chain(up_b.iter().rev()).copied().collect(),
        };
        out.dedup_by_key(|d| d.pci);
        out
    }

    /// The devices of the matrix: GPUs, then NICs, then NVMe, each in PCI bus order.
    pub fn matrix_devices(&self) -> Vec<&Device> {
        self.gpus().chain(self.nics()).chain(self.nvmes()).collect()
    }

    /// Every pair among GPUs, NICs and NVMe, classified ([`Machine::classify`]).
    pub fn matrix(&self) -> Matrix {
        let devs = self.matrix_devices();
        Matrix {
            ids: devs.iter().map(|d| d.id.clone()).collect(),
            cells: devs
                .iter()
                .map(|a| devs.iter().map(|b| self.classify(a, b)).collect())
                .collect(),
        }
    }

    fn nearest_of<'a>(
        &self,
        gpu: &Device,
        candidates: impl Iterator<Item = &'a Device>,
    ) -> Option<Peer> {
        // Nearest PCIe class first; among equals, a NIC with an RDMA device, then PCI order.
        candidates
            .map(|d| (self.pcie_class(gpu, d), d.rdma.is_empty(), d))
            .min_by_key(|(c, no_rdma, d)| (*c, *no_rdma, d.pci))
            .map(|(class, _, d)| Peer {
                id: d.id.clone(),
                class,
            })
    }

    /// For each GPU, its nearest NIC and NVMe by PCIe class (PIX < PXB < PHB < NODE < SYS);
    /// among NICs of the same class one with an RDMA device wins, then PCI order.
    pub fn nearest(&self) -> Vec<Nearest> {
        self.gpus()
            .map(|g| Nearest {
                gpu: g.id.clone(),
                nic: self.nearest_of(g, self.nics()),
                nvme: self.nearest_of(g, self.nvmes()),
            })
            .collect()
    }

    /// Warnings with stable ids ([`warning_ids`]), in a fixed order.
    pub fn warnings(&self) -> Vec<Warning> {
        let mut out = Vec::new();
        let warn = |out: &mut Vec<Warning>, id: &str, message: String| {
            out.push(Warning {
                id: id.to_owned(),
                message,
            })
        };
        if !self.tree_known && !self.devices.is_empty() {
            warn(
                &mut out,
                warning_ids::TREE_UNKNOWN,
                "the source has no PCI tree (no /sys/devices/pci* paths): PIX, PXB, PHB and \
                 NODE cannot be told apart, so pairs read N/A unless their NUMA nodes differ \
                 (SYS)"
                    .to_owned(),
            );
        }
        for d in self.link_checked_devices() {
            if d.link.is_degraded() {
                warn(&mut out, warning_ids::LINK_DEGRADED, degraded_message(d));
            }
        }
        for n in self.nearest() {
            if let Some(p) = n.nic.as_ref().filter(|p| p.class >= LinkClass::Node) {
                let nic = self.by_id(&p.id).map(Device::os_name).unwrap_or_default();
                warn(
                    &mut out,
                    warning_ids::NIC_FAR,
                    format!(
                        "{}'s nearest NIC is {} ({nic}) at {}: GPUDirect RDMA traffic crosses {}",
                        n.gpu,
                        p.id,
                        p.class,
                        if p.class == LinkClass::Sys {
                            "the interconnect between CPU sockets"
                        } else {
                            "the interconnect between PCIe host bridges"
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
    fn link_checked_devices(&self) -> Vec<&Device> {
        let mut v: Vec<&Device> = self
            .matrix_devices()
            .into_iter()
            .flat_map(|d| std::iter::once(d).chain(self.ancestors(d)))
            .collect();
        v.sort_by_key(|d| (d.pci, d.id.clone()));
        v.dedup_by(|x, y| std::ptr::eq(*x, *y));
        v
    }

    fn acs_warnings(&self, out: &mut Vec<Warning>) {
        let gpus: Vec<&Device> = self.gpus().collect();
        // bridge pci -> pairs whose path crosses it with redirect enabled
        let mut hits: BTreeMap<PciAddr, Vec<String>> = BTreeMap::new();
        for (i, g) in gpus.iter().enumerate() {
            for p in gpus[i + 1..].iter().copied().chain(self.nics()) {
                for b in self.bridges_between(g, p) {
                    if b.acs.is_some_and(|a| a.redirects_p2p()) {
                        hits.entry(b.pci)
                            .or_default()
                            .push(format!("{}↔{}", g.id, p.id));
                    }
                }
            }
        }
        for (bridge, pairs) in hits {
            out.push(Warning {
                id: warning_ids::ACS_REDIRECT.to_owned(),
                message: format!(
                    "ACS P2P redirect (RR/CR) is enabled on bridge {bridge}, on the path of {}: \
                     P2P and GPUDirect RDMA traffic is sent up to the root complex",
                    pairs.join(", ")
                ),
            });
        }
    }

    /// The `--json` document ([`TOPO_SCHEMA`]).
    pub fn report(&self) -> TopoReport<'_> {
        TopoReport {
            schema: TOPO_SCHEMA,
            source: &self.source,
            tree_known: self.tree_known,
            devices: &self.devices,
            numa_nodes: &self.numa_nodes,
            iommu: &self.iommu,
            nvlinks: &self.nvlinks,
            matrix: self.matrix(),
            nearest: self.nearest(),
            warnings: self.warnings(),
            notes: &self.notes,
        }
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
