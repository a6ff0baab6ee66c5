//! Pair classification: the PCIe class of two devices, what is known of NVLink between them,
//! and what is built from pairs (the matrix, nearest devices, the bridges between two devices).
//!
//! The pairwise work grows with the square of the device count, which the readers bound
//! ([`crate::input::MAX_MATRIX_DEVICES`]); each device's place in the tree (its bridges, host
//! bridge and NUMA node) is worked out once per call, not once per pair.

use crate::class::LinkClass;
use crate::device::{Device, DeviceKind};
use crate::machine::{pair_key, Machine, Matrix, Nearest, Peer};
use crate::pci::PciAddr;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// What a source says about NVLink between two devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NvLinkState {
    /// Joined by this many bonded NVLinks, directly or through NVSwitches.
    Links(u32),
    /// Known not to be joined by NVLink: the source describes NVLink and lists none for the pair,
    /// or the pair is not two GPUs.
    None,
    /// The source does not describe NVLink ([`crate::Coverage::nvlink`]): the pair may be joined
    /// by NVLink or not.
    Unknown,
}

/// The class of a pair, in its two parts: the PCIe path and NVLink. A source without NVLink
/// (most NCCL topology files and hwloc exports) gives "PCIe class known, NVLink unknown":
/// `pcie: PHB, nvlink: Unknown`, which [`PairClass::class`] prints as `PHB` and which a verdict
/// must not read as "P2P goes over PCIe".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PairClass {
    /// The PCIe class ([`Machine::pcie_class`]): `X` for the device itself, `N/A` when unknown.
    pub pcie: LinkClass,
    /// Whether NVLink joins the pair, and by how many links, or unknown.
    pub nvlink: NvLinkState,
}

impl PairClass {
    /// The class `nvidia-smi topo -m` prints: `NV#` when joined by NVLink, else the PCIe class.
    pub fn class(&self) -> LinkClass {
        match self.nvlink {
            NvLinkState::Links(n) if self.pcie != LinkClass::X => LinkClass::Nv(n),
            _ => self.pcie,
        }
    }

    /// True when NVLink between the pair is unknown, so the PCIe class alone does not say how
    /// P2P data moves.
    pub fn nvlink_unknown(&self) -> bool {
        self.nvlink == NvLinkState::Unknown
    }
}

/// A device's place in the tree (its bridges, host bridge and NUMA node), worked out once for
/// many pairs ([`Machine::place`], [`Machine::pair_at`], [`bridges_at`]).
#[derive(Debug, Clone)]
pub struct Place<'m> {
    pub(crate) dev: &'m Device,
    /// Bridges above the device, nearest first.
    pub(crate) up: Vec<&'m Device>,
    pub(crate) numa: Option<u32>,
}

impl<'m> Place<'m> {
    /// The device placed.
    pub fn device(&self) -> &'m Device {
        self.dev
    }
}

/// What a device's PCIe classes and bridges to every other device depend on: its parent bridge
/// (which fixes the bridges above it), its host bridge and its NUMA node. Two devices with the
/// same key have the same PCIe class and the same [`bridges_at`] to any third device, and a
/// pair of them is classified alike ([`Machine::tree_key`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TreeKey {
    parent: Option<PciAddr>,
    host_bridge: Option<String>,
    numa: Option<u32>,
}

/// Where the paths up of `a` and `b` meet: the index of the lowest common bridge on each side.
fn meeting_point(up_a: &[&Device], up_b: &[&Device]) -> Option<(usize, usize)> {
    up_a.iter()
        .enumerate()
        .find_map(|(i, x)| up_b.iter().position(|y| y.pci == x.pci).map(|j| (i, j)))
}

fn same_device(a: &Device, b: &Device) -> bool {
    std::ptr::eq(a, b) || (a.pci == b.pci && a.id == b.id)
}

impl Machine {
    /// The place of `dev` in the tree, for many pair questions about it
    /// ([`Machine::pair_at`], [`bridges_at`]).
    pub fn place<'m>(&'m self, dev: &'m Device) -> Place<'m> {
        Place {
            dev,
            up: self.ancestors(dev),
            numa: self.numa_of(dev),
        }
    }

    fn pcie_of(&self, a: &Place, b: &Place) -> LinkClass {
        if same_device(a.dev, b.dev) {
            return LinkClass::X;
        }
        if let Some(stated) = &self.stated_pcie {
            return stated
                .get(&pair_key(a.dev.pci, b.dev.pci))
                .copied()
                .unwrap_or(LinkClass::Unknown);
        }
        let numa_differs = matches!((a.numa, b.numa), (Some(x), Some(y)) if x != y);
        let (Some(ha), Some(hb)) = (&a.dev.host_bridge, &b.dev.host_bridge) else {
            return if numa_differs {
                LinkClass::Sys
            } else {
                LinkClass::Unknown
            };
        };
        if ha != hb {
            return if numa_differs {
                LinkClass::Sys
            } else {
                LinkClass::Node
            };
        }
        match meeting_point(&a.up, &b.up) {
            None => LinkClass::Phb,
            Some((i, j)) if i <= 1 && j <= 1 => LinkClass::Pix,
            Some(_) => LinkClass::Pxb,
        }
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
    /// - A source that states the classes ([`Machine::stated_pcie`], `nvidia-smi topo -m` text):
    ///   the stated class, `N/A` for pairs it does not state or states only as `NV#`.
    pub fn pcie_class(&self, a: &Device, b: &Device) -> LinkClass {
        self.pcie_of(&self.place(a), &self.place(b))
    }

    /// What is known of NVLink between `a` and `b`: [`NvLinkState::Links`] when the machine
    /// lists NVLinks between them; otherwise [`NvLinkState::None`] when the pair is not two GPUs,
    /// one of them is a product without NVLink ([`Device::pcie_only`]) or the source describes
    /// NVLink ([`crate::Coverage::nvlink`] described), else [`NvLinkState::Unknown`].
    pub fn nvlink_state(&self, a: &Device, b: &Device) -> NvLinkState {
        if a.kind != DeviceKind::Gpu || b.kind != DeviceKind::Gpu || same_device(a, b) {
            return NvLinkState::None;
        }
        match self.nvlink_count(&a.pci, &b.pci) {
            0 => self.unlisted_nvlink(a, b),
            n => NvLinkState::Links(n),
        }
    }

    /// What [`Machine::nvlink_state`] says of two distinct GPUs the machine lists no NVLink
    /// between: [`NvLinkState::None`] when the source describes NVLink or either GPU is a
    /// product without NVLink (a PCIe-only SKU, [`crate::device::PCIE_ONLY_GPUS`]: NVLink needs
    /// both ends), else [`NvLinkState::Unknown`].
    pub fn unlisted_nvlink(&self, a: &Device, b: &Device) -> NvLinkState {
        if self.coverage.nvlink.is_described() || a.pcie_only().is_some() || b.pcie_only().is_some()
        {
            NvLinkState::None
        } else {
            NvLinkState::Unknown
        }
    }

    /// The class of a pair in its two parts ([`PairClass`]): the PCIe class and NVLink.
    pub fn pair(&self, a: &Device, b: &Device) -> PairClass {
        self.pair_at(&self.place(a), &self.place(b))
    }

    /// [`Machine::pair`] for places worked out once ([`Machine::place`]).
    pub fn pair_at(&self, a: &Place, b: &Place) -> PairClass {
        PairClass {
            pcie: self.pcie_of(a, b),
            nvlink: self.nvlink_state(a.dev, b.dev),
        }
    }

    /// The [`TreeKey`] of a place: devices with equal keys are interchangeable for their PCIe
    /// classes and bridges to other devices. `None` when the machine states its classes per pair
    /// ([`Machine::stated_pcie`]), where no two devices are interchangeable.
    pub fn tree_key(&self, p: &Place) -> Option<TreeKey> {
        if self.stated_pcie.is_some() {
            return None;
        }
        Some(TreeKey {
            parent: p.dev.parent,
            host_bridge: p.dev.host_bridge.clone(),
            numa: p.numa,
        })
    }

    /// The class of a pair as `nvidia-smi topo -m` prints it: `X` for the device itself, `NV#`
    /// for GPUs joined by # NVLinks ("a bonded set of # NVLinks", directly or through
    /// NVSwitches), else [`Machine::pcie_class`]. [`Machine::pair`] says whether NVLink is known.
    pub fn classify(&self, a: &Device, b: &Device) -> LinkClass {
        self.pair(a, b).class()
    }

    /// The bridges a P2P transfer between `a` and `b` crosses: from each device up to the bridge
    /// where their paths meet (included), or, when they meet only at the host bridge or above,
    /// every bridge on both paths (root ports included). Nearest to `a` first. These are the
    /// bridges whose ACS settings matter for the pair.
    pub fn bridges_between<'m>(&'m self, a: &'m Device, b: &'m Device) -> Vec<&'m Device> {
        bridges_at(&self.place(a), &self.place(b))
    }

    /// The devices of the matrix: GPUs, then NICs, then NVMe, each in PCI bus order.
    pub fn matrix_devices(&self) -> Vec<&Device> {
        self.gpus().chain(self.nics()).chain(self.nvmes()).collect()
    }

    /// Every pair among GPUs, NICs and NVMe, classified ([`Machine::classify`]). Its size is the
    /// square of their count: past [`crate::input::MAX_LISTED_PAIR_DEVICES`] the documents count
    /// the pairs per class instead ([`Machine::pair_counts`]).
    pub fn matrix(&self) -> Matrix {
        let places: Vec<Place> = self
            .matrix_devices()
            .into_iter()
            .map(|d| self.place(d))
            .collect();
        let cells = places
            .iter()
            .map(|a| places.iter().map(|b| self.pair_at(a, b).class()).collect())
            .collect();
        Matrix {
            ids: places.iter().map(|p| p.dev.id.clone()).collect(),
            cells,
        }
    }

    /// The pairs of distinct `devices` (of this machine) counted per class, as
    /// [`Machine::classify`] and the matrix give them, without listing them: the devices are
    /// grouped by [`TreeKey`] (one pair classified per pair of groups) and the NVLink bonds
    /// moved from their PCIe class to NV#, so the work is O(devices + groups² + bonds), not
    /// O(devices²). A source that states its classes per pair (`nvidia-smi topo -m` text) is
    /// counted from what it states (its text holds every pair); a device list with a repeated
    /// address, pair by pair.
    pub fn pair_counts(&self, devices: &[&Device]) -> PairCounts {
        let n = devices.len() as u64;
        let mut counts = PairCounts {
            devices: devices.len(),
            pairs: n * n.saturating_sub(1) / 2,
            classes: BTreeMap::new(),
        };
        let places: Vec<Place> = devices.iter().map(|d| self.place(d)).collect();
        let mut addrs: Vec<PciAddr> = devices.iter().map(|d| d.pci).collect();
        addrs.sort_unstable();
        if addrs.windows(2).any(|w| w[0] == w[1]) {
            for (i, a) in places.iter().enumerate() {
                for b in &places[i + 1..] {
                    counts.add(self.pair_at(a, b).class(), 1);
                }
            }
            return counts;
        }
        match &self.stated_pcie {
            Some(stated) => {
                // The stated classes of the pairs among `devices`; a pair not stated is N/A.
                let mut listed = 0;
                let ours = |a: &PciAddr| addrs.binary_search(a).is_ok();
                for (&(a, b), &class) in stated {
                    if a != b && ours(&a) && ours(&b) {
                        counts.add(class, 1);
                        listed += 1;
                    }
                }
                counts.add(LinkClass::Unknown, counts.pairs.saturating_sub(listed));
            }
            None => self.count_by_tree_key(&places, &mut counts),
        }
        // NVLink: a bonded pair of GPUs is NV#, not its PCIe class.
        let gpus: HashMap<PciAddr, usize> = devices
            .iter()
            .enumerate()
            .filter(|(_, d)| d.kind == DeviceKind::Gpu)
            .map(|(i, d)| (d.pci, i))
            .collect();
        let bonded: BTreeSet<(PciAddr, PciAddr)> = self
            .nvlinks
            .iter()
            .filter(|l| l.a != l.b && gpus.contains_key(&l.a) && gpus.contains_key(&l.b))
            .map(|l| pair_key(l.a, l.b))
            .collect();
        for (a, b) in bonded {
            let (i, j) = (gpus[&a], gpus[&b]);
            let class = self.pair_at(&places[i], &places[j]).class();
            let pcie = self.pcie_of(&places[i], &places[j]);
            if class != pcie {
                counts.moved(pcie, class);
            }
        }
        counts.classes.retain(|_, n| *n > 0);
        counts
    }

    /// The PCIe classes of every pair of `places` (a machine without stated classes) counted
    /// into `counts`: one pair classified per pair of [`TreeKey`] groups.
    fn count_by_tree_key(&self, places: &[Place], counts: &mut PairCounts) {
        // Per key: two members (to classify a pair within the group) and the count.
        let mut groups: BTreeMap<TreeKey, (usize, Option<usize>, u64)> = BTreeMap::new();
        for (i, p) in places.iter().enumerate() {
            let Some(k) = self.tree_key(p) else { continue };
            let g = groups.entry(k).or_insert((i, None, 0));
            if g.2 == 1 {
                g.1 = Some(i);
            }
            g.2 += 1;
        }
        let groups: Vec<(usize, Option<usize>, u64)> = groups.into_values().collect();
        for (p, &(rep, second, size)) in groups.iter().enumerate() {
            if let Some(second) = second {
                let class = self.pcie_of(&places[rep], &places[second]);
                counts.add(class, size * (size - 1) / 2);
            }
            for &(other, _, other_size) in &groups[p + 1..] {
                counts.add(
                    self.pcie_of(&places[rep], &places[other]),
                    size * other_size,
                );
            }
        }
    }

    fn nearest_of(&self, gpu: &Place, candidates: &[Place]) -> Option<Peer> {
        // Nearest PCIe class first; among equals, a NIC able to do RDMA, then PCI order.
        candidates
            .iter()
            .map(|d| (self.pcie_of(gpu, d), d.dev.rdma_capable().is_none(), d.dev))
            .min_by_key(|(c, no_rdma, d)| (*c, *no_rdma, d.pci))
            .map(|(class, _, d)| Peer {
                id: d.id.clone(),
                class,
            })
    }

    /// For each GPU, its nearest NIC and NVMe by PCIe class (PIX < PXB < PHB < NODE < SYS);
    /// among NICs of the same class one able to do RDMA ([`Device::rdma_capable`]) wins, then
    /// PCI order.
    pub fn nearest(&self) -> Vec<Nearest> {
        let nics: Vec<Place> = self.nics().map(|d| self.place(d)).collect();
        let nvmes: Vec<Place> = self.nvmes().map(|d| self.place(d)).collect();
        // GPUs with one TreeKey have the same classes to every NIC and NVMe: one search each.
        let mut found: HashMap<TreeKey, (Option<Peer>, Option<Peer>)> = HashMap::new();
        self.gpus()
            .map(|g| {
                let g = self.place(g);
                let search = || (self.nearest_of(&g, &nics), self.nearest_of(&g, &nvmes));
                let (nic, nvme) = match self.tree_key(&g) {
                    Some(k) => found.entry(k).or_insert_with(search).clone(),
                    None => search(),
                };
                Nearest {
                    gpu: g.dev.id.clone(),
                    nic,
                    nvme,
                }
            })
            .collect()
    }

    /// The pair matrix in counts ([`Machine::pair_counts`] of the matrix devices) when there are
    /// more GPUs, NICs and NVMe than [`crate::input::MAX_LISTED_PAIR_DEVICES`]; `None` when the
    /// matrix is listed in full.
    pub fn pair_summary(&self) -> Option<PairSummary> {
        let devices = self.matrix_devices();
        let limit = crate::input::MAX_LISTED_PAIR_DEVICES;
        (devices.len() > limit).then(|| PairSummary {
            reason: format!(
                "{} GPUs, NICs and NVMe, more than the {limit} whose pairs are listed one by one",
                devices.len()
            ),
            limit,
            counts: self.pair_counts(&devices),
        })
    }
}

/// The pair matrix of a machine too large to list it: why, the limit, and the pairs per class
/// (`pair_classes` of `gdpath topo --json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PairSummary {
    /// Why the pairs are counted rather than listed, in words.
    pub reason: String,
    /// The most devices whose pairs are listed ([`crate::input::MAX_LISTED_PAIR_DEVICES`]).
    pub limit: usize,
    /// The pairs per class.
    #[serde(flatten)]
    pub counts: crate::pairs::PairCounts,
}

/// Pairs of devices counted per class ([`Machine::pair_counts`]): what the pair matrix says,
/// in a size that does not grow with the square of the devices.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PairCounts {
    /// How many devices were paired.
    pub devices: usize,
    /// Pairs of distinct devices, each once: devices × (devices − 1) / 2.
    pub pairs: u64,
    /// Pairs per class ([`Machine::classify`]), nearest class first; classes no pair has are
    /// left out.
    pub classes: BTreeMap<LinkClass, u64>,
}

impl PairCounts {
    /// The classes and their pairs in words, nearest first: `NV12 28, PHB 7970`.
    pub fn classes_text(&self) -> String {
        let parts: Vec<String> = self
            .classes
            .iter()
            .map(|(c, n)| format!("{c} {n}"))
            .collect();
        parts.join(", ")
    }

    /// Adds `n` pairs of `class`.
    fn add(&mut self, class: LinkClass, n: u64) {
        *self.classes.entry(class).or_insert(0) += n;
    }

    /// One pair counted as `from` is `to` (a bonded pair's PCIe class is NV#).
    fn moved(&mut self, from: LinkClass, to: LinkClass) {
        if let Some(c) = self.classes.get_mut(&from) {
            *c = c.saturating_sub(1);
        }
        self.add(to, 1);
    }
}

/// [`Machine::bridges_between`] for places worked out once ([`Machine::place`]).
pub fn bridges_at<'m>(a: &Place<'m>, b: &Place<'m>) -> Vec<&'m Device> {
    let mut out: Vec<&Device> = match meeting_point(&a.up, &b.up) {
        Some((i, j)) => a.up[..=i]
            .iter()
            .chain(b.up[..j].iter().rev())
            .copied()
            .collect(),
        None => a.up.iter().chain(b.up.iter().rev()).copied().collect(),
    };
    out.dedup_by_key(|d| d.pci);
    out
}
