//! The machine: devices, NUMA nodes, NVLink, IOMMU, the source's coverage; lookups. Pair
//! classification is in [`crate::pairs`], warnings in [`crate::warnings`], the `--json` report
//! in [`crate::report`].

use crate::class::LinkClass;
use crate::coverage::{Coverage, Facet};
use crate::cpus::CpuSet;
use crate::device::{Device, DeviceKind};
use crate::facts::{DriverFacts, FactSource};
use crate::iommu::IommuState;
use crate::pci::PciAddr;
use serde::ser::SerializeMap;
use serde::{Deserialize, Serialize, Serializer};
use std::collections::BTreeMap;

/// Deepest bridge chain followed (PCIe allows far fewer levels; this stops malformed trees).
const MAX_DEPTH: usize = 64;

/// The pair key of [`Machine::stated_pcie`]: the lower address first.
pub fn pair_key(a: PciAddr, b: PciAddr) -> (PciAddr, PciAddr) {
    if a <= b {
        (a, b)
    } else {
        (b, a)
    }
}

/// A NUMA node and its CPUs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NumaNode {
    /// The node's number (sysfs `node<N>`).
    pub id: u32,
    /// cpulist (`0-31`); empty for memory-only nodes (e.g. GPU memory exposed as a node).
    pub cpus: String,
}

/// An NVLink connection between two GPUs: `links` bonded links, directly or through NVSwitches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct NvLinkBond {
    /// The lower PCI address of the two.
    pub a: PciAddr,
    /// The higher PCI address of the two.
    pub b: PciAddr,
    /// Bonded NVLinks between the two (the `NV#` of the pair's class).
    pub links: u32,
}

/// A device's nearest peer of some kind.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Peer {
    /// The peer's device id (`NIC0`, `NVME1`).
    pub id: String,
    /// The pair's class, GPU to peer.
    pub class: LinkClass,
}

/// A GPU's nearest NIC and NVMe.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Nearest {
    /// The GPU's device id (`GPU0`).
    pub gpu: String,
    /// The nearest NIC and its class; `None` when the machine has no NIC.
    pub nic: Option<Peer>,
    /// The nearest NVMe controller and its class; `None` when the machine has none.
    pub nvme: Option<Peer>,
}

/// The pair matrix over GPUs, then NICs, then NVMe, each in PCI bus order. Serialized as
/// `{row_id: {col_id: class}}` in that order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Matrix {
    /// Device ids of the rows and the columns, in the same order.
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

/// A machine as gdpath sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Machine {
    /// All PCI functions, in PCI bus order.
    pub devices: Vec<Device>,
    /// NUMA nodes and their CPUs.
    pub numa_nodes: Vec<NumaNode>,
    /// Driver facts (NVML/CUDA) when known: from a snapshot's `driver.json`, or attached by the
    /// engine from the live driver.
    pub driver: Option<DriverFacts>,
    /// NVLink connections between GPUs, from driver facts or from the source (hwloc XML
    /// `NVLinkBandwidth`, NCCL XML `<nvlink>`).
    pub nvlinks: Vec<NvLinkBond>,
    /// IOMMU units and groups, and whether translation is on.
    pub iommu: IommuState,
    /// False when the source has no PCI tree (parents and host bridges unknown).
    pub tree_known: bool,
    /// The source read: `live`, `sysfs-root`, `snapshot`, `hwloc-xml`, `nccl-xml` or
    /// `smi-topo` ([`crate::Source::kind`]). A replay names the replayed source, never the
    /// machine it runs on.
    pub source: String,
    /// For a snapshot, the source it was captured from (its manifest's `source`: `live` or
    /// `sysfs-root`).
    pub captured_from: Option<String>,
    /// What the source describes and what it cannot, with the reasons ([`Coverage`]).
    pub coverage: Coverage,
    /// The PCIe classes the source states, by pair ([`pair_key`]): set for
    /// `nvidia-smi topo -m` text, whose matrix is the whole of what it says. When set,
    /// [`Machine::pcie_class`] answers from it alone (`N/A` for pairs it does not state, and for
    /// pairs it states only as NV#, whose PCIe path nvidia-smi does not print).
    pub stated_pcie: Option<BTreeMap<(PciAddr, PciAddr), LinkClass>>,
    /// Things the reader could not place or found inconsistent.
    pub notes: Vec<String>,
}

impl Machine {
    /// Builds a machine from a reader's devices: sorts them in PCI bus order, decides short ids
    /// (`GPU0`, `NIC0`, `NVME0`, else the PCI address) and fills missing names. The coverage
    /// starts all unknown ("the source does not say"): readers set what their source describes.
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
            captured_from: None,
            coverage: Coverage::unknown(&format!("the source ({source}) does not say")),
            stated_pcie: None,
            notes: Vec::new(),
        }
    }

    /// Attaches driver facts and takes NVLink connections from them (GPUs matched by PCI
    /// address; the count of [`DriverFacts::nvlink_count`], the larger of the two directions).
    /// NVLink becomes described ([`Coverage::nvlink`]) unless NVML could not be read at all, in
    /// which case it is unknown with NVML's error, or more GPUs than
    /// [`crate::input::MAX_NVSWITCH_GPUS`] have links up to NVSwitches, in which case their pairs
    /// (each a bond of its own) are not recorded and NVLink is unknown with that reason. The work
    /// is O(GPUs + links + bonds recorded).
    pub fn set_driver(&mut self, facts: DriverFacts) {
        // Per GPU: links to each remote address, and links to NVSwitches.
        let mut links: BTreeMap<String, (BTreeMap<String, u32>, u32)> = BTreeMap::new();
        for g in &facts.gpus {
            let entry = links.entry(g.pci.to_ascii_lowercase());
            if let std::collections::btree_map::Entry::Vacant(v) = entry {
                let (mut direct, mut switch) = (BTreeMap::new(), 0u32);
                for l in &g.nvlinks {
                    if l.remote_is_switch {
                        switch = switch.saturating_add(1);
                    } else {
                        let n: &mut u32 =
                            direct.entry(l.remote_pci.to_ascii_lowercase()).or_default();
                        *n = n.saturating_add(1);
                    }
                }
                v.insert((direct, switch));
            }
        }
        // The machine's GPUs the facts cover, by address text.
        let gpus: BTreeMap<String, PciAddr> = self
            .gpus()
            .map(|g| (g.pci.to_string(), g.pci))
            .filter(|(s, _)| links.contains_key(s))
            .collect();
        let count = |a: &str, b: &str| -> u32 {
            let (da, sa) = &links[a];
            let (_, sb) = &links[b];
            match da.get(b) {
                Some(&n) => n,
                None if *sa > 0 && *sb > 0 => (*sa).min(*sb),
                None => 0,
            }
        };
        // The pairs that may be joined: those with a direct link either way, and every pair
        // of GPUs with links to NVSwitches (unless there are too many to list).
        let mut pairs: std::collections::BTreeSet<(&str, &str)> = Default::default();
        for a in gpus.keys() {
            for b in links[a.as_str()].0.keys() {
                if let Some((b, _)) = gpus.get_key_value(b).filter(|(b, _)| *b != a) {
                    pairs.insert(if a < b { (a, b) } else { (b, a) });
                }
            }
        }
        let switched: Vec<&str> = gpus
            .keys()
            .map(String::as_str)
            .filter(|g| links[*g].1 > 0)
            .collect();
        let too_many = switched.len() > crate::input::MAX_NVSWITCH_GPUS;
        if !too_many {
            for (i, a) in switched.iter().enumerate() {
                for b in &switched[i + 1..] {
                    pairs.insert((a, b));
                }
            }
        }
        // Pairs the facts cover are replaced whole, as they were one by one before.
        let covered: std::collections::BTreeSet<PciAddr> = gpus.values().copied().collect();
        self.nvlinks
            .retain(|l| !(covered.contains(&l.a) && covered.contains(&l.b)));
        let bonds: Vec<(PciAddr, PciAddr, u32)> = pairs
            .into_iter()
            .map(|(a, b)| (gpus[a], gpus[b], count(a, b).max(count(b, a))))
            .filter(|&(_, _, n)| n > 0)
            .collect();
        self.set_nvlinks(bonds);
        let nvml_missing = facts
            .gaps
            .iter()
            .find(|g| g.source == FactSource::Nvml && g.what == "all NVML facts");
        self.coverage.nvlink = match nvml_missing {
            Some(g) => Facet::unknown(format!(
                "NVML could not be read ({}), and NVLink comes from NVML",
                g.reason
            )),
            None if too_many => {
                let why = format!(
                    "{} GPUs have NVLinks up to NVSwitches, more than the {} whose pairs gdpath \
                     records one by one (input::MAX_NVSWITCH_GPUS)",
                    switched.len(),
                    crate::input::MAX_NVSWITCH_GPUS
                );
                self.notes.push(format!("NVLink left unknown: {why}"));
                Facet::unknown(why)
            }
            None => Facet::described("the NVIDIA driver (NVML: NVLink state and remote ends)"),
        };
        self.driver = Some(facts);
    }

    /// Records `links` NVLinks between two GPUs (0 removes the connection).
    pub fn set_nvlink(&mut self, a: PciAddr, b: PciAddr, links: u32) {
        self.set_nvlinks([(a, b, links)]);
    }

    /// Records many NVLink counts at once, as [`Machine::set_nvlink`] does for one (later
    /// entries win; 0 removes a connection), in one sort.
    pub fn set_nvlinks(&mut self, bonds: impl IntoIterator<Item = (PciAddr, PciAddr, u32)>) {
        let mut all: BTreeMap<(PciAddr, PciAddr), u32> =
            self.nvlinks.iter().map(|l| ((l.a, l.b), l.links)).collect();
        for (a, b, links) in bonds {
            if a != b {
                all.insert(pair_key(a, b), links);
            }
        }
        self.nvlinks = all
            .into_iter()
            .filter(|&(_, links)| links > 0)
            .map(|((a, b), links)| NvLinkBond { a, b, links })
            .collect();
    }

    /// Number of NVLinks between two devices (0 when none is known).
    pub fn nvlink_count(&self, a: &PciAddr, b: &PciAddr) -> u32 {
        let key = pair_key(*a, *b);
        match self.nvlinks.binary_search_by(|l| (l.a, l.b).cmp(&key)) {
            Ok(i) => self.nvlinks[i].links,
            // Not sorted (changed by hand): look at every bond.
            Err(_) => self
                .nvlinks
                .iter()
                .find(|l| (l.a, l.b) == key)
                .map_or(0, |l| l.links),
        }
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
        self.at(pci).first()
    }

    /// Every device at a PCI address (more than one only in a malformed source). `devices` is in
    /// PCI order after [`Machine::assemble`], so this is a binary search; a list changed out of
    /// order by hand is searched in full.
    fn at(&self, pci: &PciAddr) -> &[Device] {
        let lo = self.devices.partition_point(|d| d.pci < *pci);
        let hi = lo
            + self.devices[lo..]
                .iter()
                .take_while(|d| d.pci == *pci)
                .count();
        if hi > lo {
            return &self.devices[lo..hi];
        }
        match self.devices.iter().position(|d| d.pci == *pci) {
            Some(i) => &self.devices[i..=i],
            None => &[],
        }
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
            let here = self.at(&p);
            let Some(d) = here
                .iter()
                .find(|d| d.kind == DeviceKind::Bridge)
                .or(here.first())
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

    /// The NUMA nodes the source names: its node list ([`Machine::numa_nodes`]) and the nodes
    /// its devices are placed on ([`Device::numa`]), since some sources name nodes only through
    /// their devices (`nvidia-smi topo -m` text, through the GPUs' NUMA Affinity column).
    pub fn numa_node_ids(&self) -> std::collections::BTreeSet<u32> {
        self.numa_nodes
            .iter()
            .map(|n| n.id)
            .chain(self.devices.iter().filter_map(|d| d.numa))
            .collect()
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
}
