//! Reads an hwloc XML export (hwloc 2.x, `<topology version="2.0">`, and 3.x) into a
//! [`Machine`].
//!
//! What is used:
//! - `Bridge` objects with `bridge_type="0-1"` are host bridges (named `pciDDDD:BB` from their
//!   `bridge_pci` range, as sysfs names root buses); other `Bridge` objects and `PCIDev` objects
//!   are PCI functions (`pci_busid`, `pci_type` = class, `[vendor:device]`), nested as in the PCI
//!   tree;
//! - the NUMA node of a host bridge is that of the nearest enclosing object whose `nodeset`
//!   holds exactly one node, its local CPUs that object's `cpuset`;
//! - `OSDev` children name network interfaces, RDMA devices and block devices (`osdev_type`:
//!   hwloc 2 numbers 0 block, 2 network, 3 OpenFabrics; hwloc 3 bit flags 1 storage,
//!   16 network, 32 OpenFabrics);
//! - the `NVLinkBandwidth` distance matrix (written by hwloc's NVML backend, in MB/s) gives NV#:
//!   hwloc adds 20000 MB/s per NVLink 1 link (P100) and 25000 MB/s per link of NVLink 2 to 4, so
//!   a GPU pair's link count is its bandwidth divided by that; GPUs joined through NVSwitches
//!   (non-GPU PCI peers in the matrix) get the smaller of their two link totals to switches.
//!
//! `pci_link_speed` (GB/s, the product of speed and width) cannot be split into GT/s and lanes,
//! so links read as unknown. hwloc's class ids are 16 bits: the programming interface byte is
//! taken from `pci_type` when present, else 0.

use crate::cpus::CpuSet;
use crate::device::{Device, DeviceKind};
use crate::iommu::IommuState;
use crate::machine::{Machine, NumaNode};
use crate::names;
use crate::pci::PciAddr;
use crate::{parse_xml, read_to_string, xml_error, TopoError};
use roxmltree::{Document, Node};
use std::collections::BTreeMap;
use std::path::Path;

/// Reads an hwloc XML file.
pub fn read_file(path: &Path) -> Result<Machine, TopoError> {
    parse(&read_to_string(path)?, path)
}

#[derive(Clone, Default)]
struct Ctx {
    numa: Option<u32>,
    cpus: Option<String>,
    host_bridge: Option<String>,
    parent: Option<PciAddr>,
}

/// What a matrix index of the NVLink distances refers to.
#[derive(Clone, Copy)]
enum Peer {
    Pci(PciAddr),
    Cpu,
}

struct Reader<'a, 'b> {
    doc: &'b Document<'a>,
    path: &'b Path,
    bitflag_osdev: bool,
    devices: Vec<Device>,
    numa_nodes: BTreeMap<u32, String>,
    /// gp_index → what it is (PCI functions, their OS devices, packages).
    peers: BTreeMap<String, Peer>,
    notes: Vec<String>,
}

/// Parses hwloc XML text; `path` names the file in errors.
pub fn parse(text: &str, path: &Path) -> Result<Machine, TopoError> {
    let doc = parse_xml(text, path)?;
    let root = doc.root_element();
    if root.tag_name().name() != "topology" {
        return Err(xml_error(
            &doc,
            root,
            path,
            format!(
                "root element is <{}>, not hwloc's <topology>",
                root.tag_name().name()
            ),
        ));
    }
    let version = root.attribute("version").unwrap_or("2.0");
    let mut r = Reader {
        doc: &doc,
        path,
        bitflag_osdev: !version.starts_with('1') && !version.starts_with('2'),
        devices: Vec::new(),
        numa_nodes: BTreeMap::new(),
        peers: BTreeMap::new(),
        notes: Vec::new(),
    };
    for child in root.children().filter(|c| c.has_tag_name("object")) {
        r.walk(child, &Ctx::default())?;
    }
    let mut seen = BTreeMap::new();
    for d in &r.devices {
        *seen.entry(d.pci).or_insert(0) += 1;
    }
    for (pci, n) in seen.iter().filter(|(_, n)| **n > 1) {
        r.notes.push(format!(
            "{pci} appears {n} times in the file (an edited or merged export); lookups by address \
             see the first"
        ));
    }
    let tree_known = !r.devices.is_empty() && r.devices.iter().all(|d| d.host_bridge.is_some());
    let numa_nodes = r
        .numa_nodes
        .iter()
        .map(|(&id, cpus)| NumaNode {
            id,
            cpus: cpus.clone(),
        })
        .collect();
    let bonds = r.nvlinks(root)?;
    let notes = std::mem::take(&mut r.notes);
    let mut m = Machine::assemble(
        std::mem::take(&mut r.devices),
        numa_nodes,
        IommuState::default(),
        tree_known,
        "hwloc-xml",
    );
    for (a, b, n) in bonds {
        m.set_nvlink(a, b, n);
    }
    m.notes = notes;
    Ok(m)
}

impl<'a, 'b> Reader<'a, 'b> {
    fn err(&self, node: Node, message: String) -> TopoError {
        xml_error(self.doc, node, self.path, message)
    }

    fn walk(&mut self, node: Node<'a, 'b>, ctx: &Ctx) -> Result<(), TopoError> {
        let ty = node.attribute("type").unwrap_or("");
        let mut ctx = ctx.clone();
        match ty {
            "Bridge"
                if node
                    .attribute("bridge_type")
                    .is_some_and(|t| t.starts_with("0-")) =>
            {
                let gp = node.attribute("gp_index").unwrap_or("?");
                ctx.host_bridge = Some(
                    host_bridge_name(node.attribute("bridge_pci"))
                        .unwrap_or_else(|| format!("host-bridge-{gp}")),
                );
                ctx.parent = None;
            }
            "Bridge" | "PCIDev" => {
                let pci = self.add_pci(node, &ctx)?;
                ctx.parent = Some(pci);
            }
            "OSDev" => return Ok(()),
            _ => {
                if let Some(ns) = node.attribute("nodeset").and_then(CpuSet::parse_mask) {
                    let mut ids = ns.0.iter();
                    ctx.numa = match (ids.next(), ids.next()) {
                        (Some(&n), None) => Some(n),
                        _ => None,
                    };
                }
                if let Some(cs) = node.attribute("cpuset").and_then(CpuSet::parse_mask) {
                    ctx.cpus = Some(cs.to_list()).filter(|s| !s.is_empty());
                }
                if ty == "NUMANode" {
                    if let Some(id) = node.attribute("os_index").and_then(|v| v.parse().ok()) {
                        self.numa_nodes
                            .insert(id, ctx.cpus.clone().unwrap_or_default());
                    }
                }
                if ty == "Package" {
                    if let Some(gp) = node.attribute("gp_index") {
                        self.peers.insert(format!("Package:{gp}"), Peer::Cpu);
                    }
                }
            }
        }
        for child in node.children().filter(|c| c.has_tag_name("object")) {
            self.walk(child, &ctx)?;
        }
        Ok(())
    }

    fn add_pci(&mut self, node: Node<'a, 'b>, ctx: &Ctx) -> Result<PciAddr, TopoError> {
        let busid = node
            .attribute("pci_busid")
            .ok_or_else(|| self.err(node, "PCI object without pci_busid".into()))?;
        let pci: PciAddr = busid.parse().map_err(|e| self.err(node, format!("{e}")))?;
        let mut d = Device::new(pci);
        let ty = node.attribute("pci_type").unwrap_or("");
        let toks: Vec<&str> = ty.split_whitespace().collect();
        if let Some(class16) = toks.first().and_then(|t| u32::from_str_radix(t, 16).ok()) {
            let prog_if = toks
                .get(5)
                .and_then(|t| u32::from_str_radix(t, 16).ok())
                .unwrap_or(0);
            d.class = (class16 << 8) | (prog_if & 0xff);
        }
        if let Some((v, dv)) = toks
            .get(1)
            .and_then(|t| t.trim_matches(['[', ']']).split_once(':'))
        {
            d.vendor = u16::from_str_radix(v, 16).unwrap_or(names::UNKNOWN_ID);
            d.device = u16::from_str_radix(dv, 16).unwrap_or(names::UNKNOWN_ID);
        }
        d.numa = ctx.numa;
        d.cpus = ctx.cpus.clone();
        d.host_bridge = ctx.host_bridge.clone();
        d.parent = ctx.parent;
        let info = |name: &str| {
            node.children()
                .find(|c| c.has_tag_name("info") && c.attribute("name") == Some(name))
                .and_then(|c| c.attribute("value"))
        };
        let source_name = [info("PCIVendor"), info("PCIDevice")]
            .into_iter()
            .flatten()
            .collect::<Vec<_>>()
            .join(" ");
        for os in node
            .children()
            .filter(|c| c.has_tag_name("object") && c.attribute("type") == Some("OSDev"))
        {
            let Some(name) = os.attribute("name") else {
                continue;
            };
            let t: u32 = os
                .attribute("osdev_type")
                .and_then(|v| v.parse().ok())
                .unwrap_or(u32::MAX);
            let (block, net, rdma) = if self.bitflag_osdev {
                (t & 1 != 0, t == 16, t & 32 != 0)
            } else {
                (t == 0, t == 2, t == 3)
            };
            if rdma {
                d.rdma.push(name.to_owned());
            } else if net {
                d.netdevs.push(name.to_owned());
            } else if block {
                d.block.push(name.to_owned());
            }
            if let Some(gp) = os.attribute("gp_index") {
                self.peers.insert(format!("OSDev:{gp}"), Peer::Pci(pci));
            }
        }
        if let Some(gp) = node.attribute("gp_index") {
            self.peers.insert(format!("PCIDev:{gp}"), Peer::Pci(pci));
        }
        d.kind = DeviceKind::decide(d.class, d.vendor, !d.rdma.is_empty(), false);
        d.name = Some(names::display_name(
            d.vendor,
            d.device,
            d.class,
            Some(source_name.as_str()),
        ));
        self.devices.push(d);
        Ok(pci)
    }

    /// NV# per GPU pair from the `NVLinkBandwidth` matrix (see the module docs).
    fn nvlinks(&self, root: Node) -> Result<Vec<(PciAddr, PciAddr, u32)>, TopoError> {
        let Some(dist) = root.children().find(|c| {
            (c.has_tag_name("distances2hetero") || c.has_tag_name("distances2"))
                && c.attribute("name") == Some("NVLinkBandwidth")
        }) else {
            return Ok(Vec::new());
        };
        let n: usize = dist
            .attribute("nbobjs")
            .and_then(|v| v.parse().ok())
            .filter(|&n| n > 0 && n <= 4096)
            .ok_or_else(|| self.err(dist, "NVLinkBandwidth without a valid nbobjs".into()))?;
        let text_of = |tag: &str| -> String {
            dist.children()
                .filter(|c| c.has_tag_name(tag))
                .filter_map(|c| c.text())
                .collect::<Vec<_>>()
                .join(" ")
        };
        let homogeneous_type = dist.attribute("type").unwrap_or("OSDev");
        let indexes: Vec<String> = text_of("indexes")
            .split_whitespace()
            .map(|t| {
                if t.contains(':') {
                    t.to_owned()
                } else {
                    format!("{homogeneous_type}:{t}")
                }
            })
            .collect();
        let values: Vec<u64> = text_of("u64values")
            .split_whitespace()
            .map(|t| t.parse::<u64>())
            .collect::<Result<_, _>>()
            .map_err(|e| self.err(dist, format!("NVLinkBandwidth value: {e}")))?;
        if indexes.len() != n || values.len() != n * n {
            return Err(self.err(
                dist,
                format!(
                    "NVLinkBandwidth has {} indexes and {} values for {n} objects",
                    indexes.len(),
                    values.len()
                ),
            ));
        }
        let pci_of = |i: usize| match self.peers.get(&indexes[i]) {
            Some(Peer::Pci(p)) => Some(*p),
            _ => None,
        };
        let dev = |p: PciAddr| self.devices.iter().find(|d| d.pci == p);
        let is_gpu = |i: usize| {
            pci_of(i)
                .and_then(dev)
                .is_some_and(|d| d.kind == DeviceKind::Gpu)
        };
        let is_switch = |i: usize| pci_of(i).is_some() && !is_gpu(i);
        let per_link = |i: usize| match pci_of(i).and_then(dev) {
            Some(d) if (0x15f7..=0x15f9).contains(&d.device) => 20_000,
            _ => 25_000,
        };
        let bw = |i: usize, j: usize| values[i * n + j].max(values[j * n + i]);
        let links = |total: u64, unit: u64| ((total + unit / 2) / unit) as u32;
        let to_switches =
            |i: usize| -> u64 { (0..n).filter(|&k| is_switch(k)).map(|k| bw(i, k)).sum() };
        let mut out = Vec::new();
        for i in (0..n).filter(|&i| is_gpu(i)) {
            for j in (i + 1..n).filter(|&j| is_gpu(j)) {
                let unit = per_link(i);
                let direct = bw(i, j);
                let count = if direct > 0 {
                    links(direct, unit)
                } else {
                    links(to_switches(i).min(to_switches(j)), unit)
                };
                if let (Some(a), Some(b), true) = (pci_of(i), pci_of(j), count > 0) {
                    out.push((a, b, count));
                }
            }
        }
        Ok(out)
    }
}

/// `pciDDDD:BB` for a host bridge whose `bridge_pci` is `DDDD:[BB-EE]`.
fn host_bridge_name(bridge_pci: Option<&str>) -> Option<String> {
    let (dom, rest) = bridge_pci?.split_once(':')?;
    let bus = rest.trim_start_matches('[').get(..2)?;
    Some(format!("pci{dom}:{bus}"))
}
