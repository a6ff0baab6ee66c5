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
//!   16 network, 32 OpenFabrics), each name once per function;
//! - the `GPUModel` info attribute of a function's OS devices (hwloc's CUDA, NVML and OpenCL
//!   backends write the name the driver reports, e.g. `Tesla P100-SXM2-16GB`) names the device
//!   when gdpath's own table does not know its PCI id (a disagreement is noted);
//! - `pci_link_speed`, in GB/s: hwloc computes it from the link status register (the current
//!   link) as lanes × the lane rate of the generation after encoding, so it is the link's
//!   bandwidth ([`crate::PcieLink::stated_gbps`]); generation and width are taken from it only
//!   where exactly one pair gives that value under every hwloc version's formula (older ones
//!   use the Gen3 lane rate for Gen3 and later). For a GPU with an NVML OS device, hwloc's NVML
//!   backend overwrites the value with the *maximum* width at the Gen3 rate whatever the
//!   generation (hwloc `topology-nvml.c`), so only the maximum width is taken from it;
//! - the `NVLinkBandwidth` distance matrix (written by hwloc's NVML backend, in MB/s) gives NV#:
//!   hwloc adds 20000 MB/s per NVLink 1 link, 25000 per NVLink 2 link and 50000 per NVLink 3 or
//!   4 link (`topology-nvml.c`), so a GPU pair's link count is its bandwidth divided by the unit
//!   of the GPU's NVLink version, known from its PCI device id (P100, V100, A100, H100/H200);
//!   GPUs joined through NVSwitches (non-GPU PCI peers in the matrix) get the smaller of their
//!   two link totals to switches.
//!
//! Coverage ([`Coverage`]): the PCI tree and NUMA as in the file; NVLink only with an
//! `NVLinkBandwidth` matrix (hwloc writes none when its NVML backend did not run, or found no
//! active link, or was built without NVLink support, so its absence leaves NVLink unknown); link
//! state partial (bandwidth, not speed and width); ACS, IOMMU and kernel drivers unknown (not in
//! hwloc XML); RDMA devices from the OpenFabrics OS devices when the export lists I/O OS devices
//! at all. hwloc's class ids are 16 bits: the programming interface byte is taken from `pci_type`
//! when present, else 0.

use crate::coverage::{Coverage, Facet};
use crate::cpus::CpuSet;
use crate::device::{Device, DeviceKind};
use crate::iommu::IommuState;
use crate::link::{gen_gts, WIDTHS};
use crate::machine::{Machine, NumaNode};
use crate::names;
use crate::pci::PciAddr;
use crate::{input, xml, TopoError};
use roxmltree::{Document, Node};
use std::collections::BTreeMap;
use std::path::Path;

/// Reads an hwloc XML file (at most [`input::MAX_TOPOLOGY_FILE_BYTES`]).
pub fn read_file(path: &Path) -> Result<Machine, TopoError> {
    parse(&input::read_topology_text(path)?, path)
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
    /// Where each device's object starts in the text (byte offset), in the order of `devices`.
    starts: Vec<usize>,
    numa_nodes: BTreeMap<u32, String>,
    /// gp_index → what it is (PCI functions, their OS devices, packages).
    peers: BTreeMap<String, Peer>,
    /// Whether any network, storage or OpenFabrics OS device was seen: hwloc's Linux I/O
    /// discovery, which lists RDMA devices, ran (GPU OS devices come from other backends).
    io_osdevs: bool,
    notes: Vec<String>,
}

/// Parses hwloc XML text; `path` names the file in errors. Errors: malformed XML and the limits
/// of [`crate::input`] (depth, nodes, device counts), each a [`TopoError`] naming the file.
pub fn parse(text: &str, path: &Path) -> Result<Machine, TopoError> {
    let doc = xml::parse(text, path)?;
    let root = doc.root_element();
    if root.tag_name().name() != "topology" {
        return Err(xml::error(
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
        starts: Vec::new(),
        numa_nodes: BTreeMap::new(),
        peers: BTreeMap::new(),
        io_osdevs: false,
        notes: Vec::new(),
    };
    for child in root.children().filter(|c| c.has_tag_name("object")) {
        r.walk(child, &Ctx::default())?;
    }
    input::check_device_counts(&r.devices, &crate::text::escape(path))?;
    // One address twice under one host bridge is refused; under two host bridges (an export
    // merged from two machines, or one that lost the PCI domain: one of hwloc's own test
    // exports) both functions are kept, with a note.
    let found: Vec<(PciAddr, Option<&str>)> = r
        .devices
        .iter()
        .map(|d| (d.pci, d.host_bridge.as_deref()))
        .collect();
    input::check_unique_pci(&found, &crate::text::escape(path), |i| {
        format!("line {}", doc.text_pos_at(r.starts[i]).row)
    })?;
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
    let nvlink_matrix = find_nvlink_matrix(root);
    let bonds = match nvlink_matrix {
        Some(dist) => r.nvlinks(dist)?,
        None => Vec::new(),
    };
    let coverage = r.coverage(tree_known, nvlink_matrix.is_some());
    let notes = std::mem::take(&mut r.notes);
    let mut m = Machine::assemble(
        std::mem::take(&mut r.devices),
        numa_nodes,
        IommuState::default(),
        tree_known,
        "hwloc-xml",
    );
    m.set_nvlinks(bonds);
    m.coverage = coverage;
    m.notes = notes;
    Ok(m)
}

fn find_nvlink_matrix<'a, 'b>(root: Node<'a, 'b>) -> Option<Node<'a, 'b>> {
    root.children().find(|c| {
        (c.has_tag_name("distances2hetero") || c.has_tag_name("distances2"))
            && c.attribute("name") == Some("NVLinkBandwidth")
    })
}

/// The value of the `<info name=NAME value=...>` child of `node`.
fn info<'a>(node: Node<'a, '_>, name: &str) -> Option<&'a str> {
    node.children()
        .find(|c| c.has_tag_name("info") && c.attribute("name") == Some(name))
        .and_then(|c| c.attribute("value"))
}

impl<'a, 'b> Reader<'a, 'b> {
    fn err(&self, node: Node, message: String) -> TopoError {
        xml::error(self.doc, node, self.path, message)
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
        input::check_one_more_function(self.devices.len(), self.path)?;
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
        let pci_strings = [info(node, "PCIVendor"), info(node, "PCIDevice")]
            .into_iter()
            .flatten()
            .collect::<Vec<_>>()
            .join(" ");
        let mut model: Option<&str> = None;
        let mut nvml = false;
        for os in node
            .children()
            .filter(|c| c.has_tag_name("object") && c.attribute("type") == Some("OSDev"))
        {
            if let Some(gp) = os.attribute("gp_index") {
                self.peers.insert(format!("OSDev:{gp}"), Peer::Pci(pci));
            }
            nvml |= os.attribute("subtype") == Some("NVML") || info(os, "Backend") == Some("NVML");
            if model.is_none() {
                model = info(os, "GPUModel").filter(|m| !m.trim().is_empty());
            }
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
            // One name once: hwloc may list an InfiniBand port both as a network and as an
            // OpenFabrics device, or twice after a merge.
            if d.rdma
                .iter()
                .chain(&d.netdevs)
                .chain(&d.block)
                .any(|n| n == name)
            {
                continue;
            }
            self.io_osdevs |= rdma || net || block;
            if rdma {
                d.rdma.push(name.to_owned());
            } else if net {
                d.netdevs.push(name.to_owned());
            } else if block {
                d.block.push(name.to_owned());
            }
        }
        if let Some(gp) = node.attribute("gp_index") {
            self.peers.insert(format!("PCIDev:{gp}"), Peer::Pci(pci));
        }
        self.read_link_speed(node, &mut d, nvml);
        self.starts.push(node.range().start);
        d.kind = DeviceKind::decide(d.class, d.vendor, !d.rdma.is_empty(), false);
        let model_name = model.map(|m| with_vendor(d.vendor, m.trim()));
        if let (Some(m), Some(table)) = (&model_name, names::device_name(d.vendor, d.device)) {
            if model_token(m)
                .zip(model_token(table))
                .is_some_and(|(a, b)| a != b)
            {
                self.notes.push(format!(
                    "{pci}: hwloc's GPUModel says {m:?}, but its PCI id {:04x}:{:04x} is {table}; \
                     named by the PCI id",
                    d.vendor, d.device
                ));
            }
        }
        let source_name = model_name.unwrap_or(pci_strings);
        d.name = Some(names::display_name(
            d.vendor,
            d.device,
            d.class,
            Some(source_name.as_str()),
        ));
        self.devices.push(d);
        Ok(pci)
    }

    /// `pci_link_speed` (see the module docs for what it means and what is derived).
    fn read_link_speed(&mut self, node: Node, d: &mut Device, nvml: bool) {
        let Some(gbps) = node
            .attribute("pci_link_speed")
            .and_then(|v| v.trim().parse::<f64>().ok())
            .filter(|v| v.is_finite() && *v > 0.0)
        else {
            return;
        };
        if nvml {
            // hwloc's NVML backend: maximum width × (Gen1/Gen2 lane rate, or the Gen3 lane rate
            // for any later generation).
            let (gen, width) = unique(nvml_candidates(gbps));
            d.link.max_width = width;
            d.link.max_gts = gen.filter(|g| *g <= 2).and_then(gen_gts);
        } else {
            let (gen, width) = unique(pci_candidates(gbps));
            d.link.cur_width = width;
            d.link.cur_gts = gen.and_then(gen_gts);
            d.link.stated_gbps = Some(gbps);
        }
    }

    fn coverage(&self, tree_known: bool, nvlink_matrix: bool) -> Coverage {
        let stated = self
            .devices
            .iter()
            .filter(|d| d.link.stated_gbps.is_some() || d.link.max_width.is_some())
            .count();
        let no = |what: &str| Facet::unknown(format!("hwloc XML does not record {what}"));
        Coverage {
            pci_tree: if tree_known {
                Facet::described("Bridge and PCIDev nesting under host bridges (bridge_type 0-1)")
            } else if self.devices.is_empty() {
                Facet::unknown("the export has no PCI objects (made without I/O discovery)")
            } else {
                Facet::partial(
                    "Bridge and PCIDev nesting",
                    "some PCI objects are not under a host bridge",
                )
            },
            numa: if self.numa_nodes.is_empty() {
                Facet::unknown("the export has no NUMANode objects")
            } else {
                Facet::described("the nodeset of the objects enclosing each host bridge")
            },
            nvlink: if nvlink_matrix {
                Facet::described("the NVLinkBandwidth distance matrix (hwloc's NVML backend)")
            } else {
                Facet::unknown(
                    "hwloc records NVLink only as an NVLinkBandwidth distance matrix from its \
                     NVML backend, and this export has none (NVML not used, no active NVLink, \
                     or an hwloc built without NVLink support)",
                )
            },
            link_state: if stated == 0 {
                Facet::unknown("pci_link_speed is absent or 0 for every PCI object")
            } else {
                Facet::partial(
                    "pci_link_speed (GB/s of the current link; the maximum width for GPUs with an \
                     NVML OS device)",
                    "PCIe generation and width separately: hwloc records only their product, \
                     split where unambiguous",
                )
            },
            acs: no("PCI configuration space (ACS)"),
            iommu: no("IOMMU state"),
            rdma: if self.io_osdevs {
                Facet::described("OpenFabrics OS devices")
            } else {
                Facet::unknown(
                    "the export has no network, storage or OpenFabrics OS devices (made without \
                     hwloc's I/O device discovery): RDMA capability is known only from the NICs' \
                     PCI identity",
                )
            },
            drivers: no("kernel drivers or modules"),
        }
    }

    /// NV# per GPU pair from the `NVLinkBandwidth` matrix (see the module docs).
    fn nvlinks(&mut self, dist: Node) -> Result<Vec<(PciAddr, PciAddr, u32)>, TopoError> {
        let n: usize = dist
            .attribute("nbobjs")
            .and_then(|v| v.parse().ok())
            .filter(|&n| n > 0 && n <= input::MAX_MATRIX_DEVICES)
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
        let by_pci: BTreeMap<PciAddr, &Device> = self.devices.iter().map(|d| (d.pci, d)).collect();
        // Per index: the PCI function, and the GPU there when it is one.
        let pci: Vec<Option<PciAddr>> = indexes
            .iter()
            .map(|i| match self.peers.get(i) {
                Some(Peer::Pci(p)) => Some(*p),
                _ => None,
            })
            .collect();
        let gpu: Vec<Option<&Device>> = pci
            .iter()
            .map(|p| {
                p.and_then(|p| by_pci.get(&p).copied())
                    .filter(|d| d.kind == DeviceKind::Gpu)
            })
            .collect();
        let switch: Vec<bool> = (0..n)
            .map(|i| pci[i].is_some() && gpu[i].is_none())
            .collect();
        let bw = |i: usize, j: usize| values[i * n + j].max(values[j * n + i]);
        let to_switches: Vec<u64> = (0..n)
            .map(|i| {
                (0..n)
                    .filter(|&k| switch[k])
                    .map(|k| bw(i, k))
                    .fold(0u64, u64::saturating_add)
            })
            .collect();
        let mut guessed = Vec::new();
        let mut out = Vec::new();
        for i in 0..n {
            let Some(ga) = gpu[i] else { continue };
            let unit = match nvlink_unit(ga.device) {
                Some(u) => u,
                None => {
                    guessed.push(ga.pci);
                    25_000
                }
            };
            let links = |total: u64| u32::try_from((total + unit / 2) / unit).unwrap_or(u32::MAX);
            for j in i + 1..n {
                let Some(gb) = gpu[j] else { continue };
                let direct = bw(i, j);
                let count = if direct > 0 {
                    links(direct)
                } else {
                    links(to_switches[i].min(to_switches[j]))
                };
                if count > 0 {
                    out.push((ga.pci, gb.pci, count));
                }
            }
        }
        if !guessed.is_empty() {
            let list: Vec<String> = guessed.iter().map(ToString::to_string).collect();
            self.notes.push(format!(
                "NVLink version of {} unknown to gdpath (device id not in its table): NV# counts \
                 assume hwloc's 25000 MB/s per link (NVLink 2); NVLink 3 and 4 links count 50000",
                list.join(", ")
            ));
        }
        Ok(out)
    }
}

/// MB/s that hwloc's NVML backend adds per NVLink for a GPU, by NVIDIA device id (NVLink 1:
/// GP100 20000; NVLink 2: GV100 25000; NVLink 3 and 4: GA100, GH100 50000). `None` for devices
/// gdpath does not know.
fn nvlink_unit(device: u16) -> Option<u64> {
    match device {
        0x15f0..=0x15ff => Some(20_000),
        0x1db0..=0x1dbf | 0x1df0..=0x1dff => Some(25_000),
        0x20b0..=0x20bf | 0x20f0..=0x20ff | 0x2320..=0x234f => Some(50_000),
        _ => None,
    }
}

/// The generation and width a set of candidates agree on (each `None` where they differ or there
/// are none).
fn unique(cands: Vec<(Option<u32>, u32)>) -> (Option<u32>, Option<u32>) {
    let Some(&(g0, w0)) = cands.first() else {
        return (None, None);
    };
    let gen = g0.filter(|_| cands.iter().all(|&(g, _)| g == g0));
    let width = cands.iter().all(|&(_, w)| w == w0).then_some(w0);
    (gen, width)
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-4 * b.max(1e-9)
}

/// (generation, width) pairs whose bandwidth is `gbps` under the formulas hwloc has used for the
/// current link: lanes × 0.25 / 0.5 GB/s (Gen1/Gen2, 8b/10b); lanes × 8 GT/s × 2^(gen-3) ×
/// 128/130 / 8 (Gen3–5) or × 242/256 (Gen6–7, FLIT) in newer releases; lanes × the Gen3 rate for
/// any generation from 3 on in older ones (generation then unknown: `None`).
fn pci_candidates(gbps: f64) -> Vec<(Option<u32>, u32)> {
    let mut out = Vec::new();
    for w in WIDTHS {
        let lanes = f64::from(w);
        for gen in 1..=7u32 {
            let lane = match gen {
                1 | 2 => 0.25 * f64::from(gen),
                3..=5 => f64::from(1u32 << (gen - 3)) * 128.0 / 130.0,
                _ => f64::from(1u32 << (gen - 3)) * 242.0 / 256.0,
            };
            if close(lane * lanes, gbps) {
                out.push((Some(gen), w));
            }
        }
        if close(128.0 / 130.0 * lanes, gbps) {
            out.push((None, w));
        }
    }
    out
}

/// As [`pci_candidates`], for the value hwloc's NVML backend writes: maximum width × 0.25 or
/// 0.5 GB/s (Gen1/Gen2) or × the Gen3 rate (any later generation: `None`).
fn nvml_candidates(gbps: f64) -> Vec<(Option<u32>, u32)> {
    let mut out = Vec::new();
    for w in WIDTHS {
        let lanes = f64::from(w);
        for (gen, lane) in [(Some(1), 0.25), (Some(2), 0.5), (None, 128.0 / 130.0)] {
            if close(lane * lanes, gbps) {
                out.push((gen, w));
            }
        }
    }
    out
}

/// `NVIDIA Tesla P100-SXM2-16GB` for an NVIDIA model name without the vendor in front.
fn with_vendor(vendor: u16, model: &str) -> String {
    match names::vendor_name(vendor) {
        Some(v)
            if !model
                .to_ascii_lowercase()
                .starts_with(&v.to_ascii_lowercase()) =>
        {
            format!("{v} {model}")
        }
        _ => model.to_owned(),
    }
}

/// The model number in a GPU name (`P100`, `K40M`, `M2075`): the first word with both letters
/// and digits, upper case. Used only to notice a source whose model name contradicts the PCI id.
fn model_token(name: &str) -> Option<String> {
    name.split(|c: char| c.is_whitespace() || c == '-' || c == '/')
        .find(|w| {
            w.chars().any(|c| c.is_ascii_digit()) && w.chars().any(|c| c.is_ascii_alphabetic())
        })
        .map(str::to_ascii_uppercase)
}

/// `pciDDDD:BB` for a host bridge whose `bridge_pci` is `DDDD:[BB-EE]`.
fn host_bridge_name(bridge_pci: Option<&str>) -> Option<String> {
    let (dom, rest) = bridge_pci?.split_once(':')?;
    let bus = rest.trim_start_matches('[').get(..2)?;
    Some(format!("pci{dom}:{bus}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_speed_candidates() {
        // Gen1 x1 is the only pair giving 0.25 GB/s.
        assert_eq!(unique(pci_candidates(0.25)), (Some(1), Some(1)));
        // 15.75 GB/s is Gen3 x16, Gen4 x8 or Gen5 x4: nothing derived.
        assert_eq!(unique(pci_candidates(15.753846)), (None, None));
        // 0.98 GB/s is one lane at Gen3 (or later, in older hwloc): the width only.
        assert_eq!(unique(pci_candidates(0.984615)), (None, Some(1)));
        // Values no PCIe link gives.
        assert!(pci_candidates(0.2).is_empty());
        // NVML's maximum at the Gen3 rate: x16, generation 3 or later.
        assert_eq!(unique(nvml_candidates(15.753846)), (None, Some(16)));
        assert_eq!(unique(nvml_candidates(4.0)), (None, None));
    }

    #[test]
    fn model_tokens() {
        assert_eq!(model_token("Tesla K40m").as_deref(), Some("K40M"));
        assert_eq!(model_token("Tesla M2075").as_deref(), Some("M2075"));
        assert_eq!(
            model_token("NVIDIA Tesla P100-SXM2-16GB"),
            model_token("Tesla P100 SXM2 16GB")
        );
        assert_eq!(
            with_vendor(0x10de, "Tesla P100-SXM2-16GB"),
            "NVIDIA Tesla P100-SXM2-16GB"
        );
        assert_eq!(
            with_vendor(0x10de, "NVIDIA H100 80GB HBM3"),
            "NVIDIA H100 80GB HBM3"
        );
    }
}
