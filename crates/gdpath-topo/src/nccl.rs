//! Reads an NCCL topology file (`NCCL_TOPO_DUMP_FILE` output, or the `NCCL_TOPO_FILE`s cloud
//! providers publish) into a [`Machine`].
//!
//! The format: `<system>` → `<cpu numaid affinity …>` → nested `<pci busid class vendor device
//! link_speed link_width>` → `<gpu dev …>` (with `<nvlink target count tclass>`) or
//! `<nic>` → `<net name …>`. How it maps:
//! - each `<cpu>` is a NUMA node (`numaid`, CPUs from `affinity`) with one host bridge of its
//!   own, named `cpu<numaid>`: NCCL has no NODE class, so devices that meet only at their CPU
//!   are PHB, as NCCL says, and SYS across CPUs;
//! - each `<pci>` is a PCI function nested as in the file. Bus ids `ffff:ff:xx.x` are NCCL's
//!   virtual switches and are marked synthetic. Missing attributes are unknown fields;
//! - `link_speed`/`link_width` are the link's capable speed and width (NCCL writes the lower of
//!   the device's and its port's `max_link_*`), so they fill `max_gts`/`max_width`;
//! - a `<pci>` with a `<gpu>` child is a GPU even without class or vendor (NCCL only lists
//!   NVIDIA GPUs); one with a `<nic>` child is a NIC;
//! - `<net name>` names go to `rdma` when they look like RDMA devices (`mlx5_0`, `efa_0`, …),
//!   else to `netdevs`; their `gdr` attribute to `nccl_gdr`. A `<nic>` directly under `<cpu>`
//!   has no PCI address: it gets a synthetic one (`ffff:fe:NN.0`) and a note;
//! - `<nvlink target count tclass>`: a GPU target gives NV`count` for the pair; an NVSwitch
//!   target (`tclass` 0x068000) joins every pair of GPUs with switch links, at the smaller of
//!   their counts; a link whose target is the GPU itself is ignored with a note.
//!
//! Coverage ([`Coverage`]): the PCI tree (NCCL's nesting, bridges possibly synthetic), NUMA
//! (`<cpu numaid>`), the capable link speed and width (partial: not the trained state), RDMA
//! device names when `<net>` entries name them; NVLink only when the file has `<nvlink>` entries
//! to other devices — a file without them (the cloud providers' hint files) says nothing about
//! NVLink, since NCCL reads it from NVML at run time; ACS, IOMMU and kernel drivers never.

use crate::coverage::{Coverage, Facet};
use crate::cpus::CpuSet;
use crate::device::{Device, DeviceKind};
use crate::iommu::IommuState;
use crate::link::{parse_speed, parse_width};
use crate::machine::{Machine, NumaNode};
use crate::names;
use crate::pci::PciAddr;
use crate::{input, xml, TopoError};
use roxmltree::{Document, Node};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// RDMA device name prefixes (kernel RDMA drivers) used to tell `<net>` names apart; `rdmap`
/// is how newer kernels name EFA devices (`rdmap16s27`).
const RDMA_PREFIXES: [&str; 11] = [
    "mlx4_", "mlx5_", "efa", "rdmap", "irdma", "bnxt_re", "qib", "hfi1_", "rxe", "erdma", "ionic",
];

/// Reads an NCCL topology XML file (at most [`input::MAX_TOPOLOGY_FILE_BYTES`]).
pub fn read_file(path: &Path) -> Result<Machine, TopoError> {
    parse(&input::read_topology_text(path)?, path)
}

struct Reader<'a, 'b> {
    doc: &'b Document<'a>,
    path: &'b Path,
    devices: Vec<Device>,
    /// The line of each device's element, in the order of `devices` (for repeated bus ids).
    lines_of: Vec<u32>,
    nodes: Vec<NumaNode>,
    notes: Vec<String>,
    /// (gpu, target, count, target is an NVSwitch)
    nvlinks: Vec<(PciAddr, PciAddr, u32, bool)>,
    lines: xml::LineIndex,
    /// `<nvlink>` entries ignored because they target the GPU itself.
    self_nvlinks: usize,
    /// Whether any `<net>` entry names a device.
    named_nets: bool,
    synthetic_nics: u32,
}

/// Parses NCCL topology XML text; `path` names the file in errors. Errors: malformed XML, a bad
/// bus id, and the limits of [`crate::input`] (depth, nodes, device counts), each a
/// [`TopoError`] naming the file.
pub fn parse(text: &str, path: &Path) -> Result<Machine, TopoError> {
    let doc = xml::parse(text, path)?;
    let root = doc.root_element();
    if root.tag_name().name() != "system" {
        return Err(xml::error(
            &doc,
            root,
            path,
            format!(
                "root element is <{}>, not NCCL's <system>",
                root.tag_name().name()
            ),
        ));
    }
    let mut r = Reader {
        doc: &doc,
        path,
        devices: Vec::new(),
        lines_of: Vec::new(),
        nodes: Vec::new(),
        notes: Vec::new(),
        nvlinks: Vec::new(),
        lines: xml::LineIndex::new(text),
        self_nvlinks: 0,
        named_nets: false,
        synthetic_nics: 0,
    };
    for cpu in root.children().filter(|c| c.has_tag_name("cpu")) {
        r.cpu(cpu)?;
    }
    input::check_device_counts(&r.devices, &crate::text::escape(path))?;
    let found: Vec<(PciAddr, ())> = r.devices.iter().map(|d| (d.pci, ())).collect();
    input::check_unique_pci(&found, &crate::text::escape(path), |i| {
        format!("line {}", r.lines_of[i])
    })?;
    let tree_known = !r.devices.is_empty();
    let mut nodes = std::mem::take(&mut r.nodes);
    nodes.sort_by_key(|n| n.id);
    nodes.dedup_by_key(|n| n.id);
    let coverage = r.coverage(tree_known, !nodes.is_empty());
    let mut m = Machine::assemble(
        std::mem::take(&mut r.devices),
        nodes,
        IommuState::default(),
        tree_known,
        "nccl-xml",
    );
    m.coverage = coverage;
    m.notes = r.notes;
    match nvlink_bonds(&r.nvlinks) {
        Ok(bonds) => m.set_nvlinks(bonds),
        Err(switched) => {
            let why = format!(
                "{switched} GPUs have <nvlink> entries to NVSwitches, more than the {} whose \
                 pairs gdpath records one by one (input::MAX_NVSWITCH_GPUS)",
                input::MAX_NVSWITCH_GPUS
            );
            m.notes.push(format!("NVLink left unknown: {why}"));
            m.coverage.nvlink = Facet::unknown(why);
        }
    }
    Ok(m)
}

/// NV# per GPU pair from the per-GPU `<nvlink>` entries. Err: how many GPUs link to NVSwitches,
/// when more than [`input::MAX_NVSWITCH_GPUS`] (each such pair would be a bond of its own).
fn nvlink_bonds(
    entries: &[(PciAddr, PciAddr, u32, bool)],
) -> Result<Vec<(PciAddr, PciAddr, u32)>, usize> {
    let mut direct: BTreeMap<(PciAddr, PciAddr), u32> = BTreeMap::new();
    let mut to_switch: BTreeMap<PciAddr, u32> = BTreeMap::new();
    for &(gpu, target, count, switch) in entries {
        if switch {
            *to_switch.entry(gpu).or_insert(0) += count;
        } else {
            let key = if gpu < target {
                (gpu, target)
            } else {
                (target, gpu)
            };
            let e = direct.entry(key).or_insert(0);
            *e = (*e).max(count);
        }
    }
    if to_switch.len() > input::MAX_NVSWITCH_GPUS {
        return Err(to_switch.len());
    }
    let joined: BTreeSet<(PciAddr, PciAddr)> = direct.keys().copied().collect();
    let mut out: Vec<(PciAddr, PciAddr, u32)> =
        direct.into_iter().map(|((a, b), n)| (a, b, n)).collect();
    let sw: Vec<(PciAddr, u32)> = to_switch.into_iter().collect();
    for (i, &(a, na)) in sw.iter().enumerate() {
        for &(b, nb) in &sw[i + 1..] {
            if !joined.contains(&(a, b)) {
                out.push((a, b, na.min(nb)));
            }
        }
    }
    Ok(out)
}

impl<'a, 'b> Reader<'a, 'b> {
    fn line(&self, node: Node) -> u32 {
        self.lines.line(node)
    }

    fn coverage(&self, tree_known: bool, numa: bool) -> Coverage {
        let no = |what: &str| Facet::unknown(format!("NCCL topology files hold no {what}"));
        let with_link = self
            .devices
            .iter()
            .filter(|d| d.link.max_gts.is_some() || d.link.max_width.is_some())
            .count();
        let nvlink = if !self.nvlinks.is_empty() {
            Facet::described("the GPUs' <nvlink> entries (NCCL's dump of what NVML reported)")
        } else if self.self_nvlinks > 0 {
            Facet::unknown(format!(
                "its {} <nvlink> entries all target the GPU itself, so they join no pair",
                self.self_nvlinks
            ))
        } else {
            Facet::unknown(
                "the file has no <nvlink> entries: NCCL learns NVLink from NVML at run time, and \
                 topology files written as hints (the cloud providers' NCCL_TOPO_FILEs) leave it \
                 out",
            )
        };
        Coverage {
            pci_tree: if tree_known {
                Facet::described(
                    "nested <pci> elements; each <cpu> is one host bridge (NCCL has no NODE), \
                     and bus ids ffff:ff:* are NCCL's virtual switches",
                )
            } else {
                Facet::unknown("the file has no <pci> element")
            },
            numa: if numa {
                Facet::described("<cpu numaid affinity>")
            } else {
                Facet::unknown("no <cpu> element has a numaid")
            },
            nvlink,
            link_state: if with_link == 0 {
                Facet::unknown("no <pci> element has link_speed or link_width")
            } else {
                Facet::partial(
                    "link_speed and link_width of <pci> elements (the capable speed and width)",
                    "the trained (current) link state, which NCCL does not record",
                )
            },
            acs: no("PCI configuration space (ACS)"),
            iommu: no("IOMMU state"),
            rdma: if self.named_nets {
                Facet::described("<nic><net name> entries")
            } else {
                Facet::unknown(
                    "no <net> entry names a device: RDMA capability is known only from the NICs' \
                     PCI identity",
                )
            },
            drivers: no("kernel drivers or modules"),
        }
    }

    fn cpu(&mut self, cpu: Node<'a, 'b>) -> Result<(), TopoError> {
        let numa: Option<u32> = cpu
            .attribute("numaid")
            .and_then(|v| v.parse::<i64>().ok())
            .and_then(|v| u32::try_from(v).ok());
        let cpus = cpu
            .attribute("affinity")
            .and_then(CpuSet::parse_mask)
            .filter(|s| !s.is_empty())
            .map(|s| s.to_list());
        let host = match numa {
            Some(n) => format!("cpu{n}"),
            None => format!("cpu@line{}", self.line(cpu)),
        };
        if let Some(id) = numa {
            self.nodes.push(NumaNode {
                id,
                cpus: cpus.clone().unwrap_or_default(),
            });
        }
        let ctx = (numa, cpus, host);
        for child in cpu.children().filter(|c| c.is_element()) {
            match child.tag_name().name() {
                "pci" => self.pci(child, &ctx, None)?,
                "nic" => self.bare_nic(child, &ctx)?,
                _ => {}
            }
        }
        Ok(())
    }

    fn place(
        &self,
        d: &mut Device,
        ctx: &(Option<u32>, Option<String>, String),
        parent: Option<PciAddr>,
    ) {
        d.numa = ctx.0;
        d.cpus = ctx.1.clone();
        d.host_bridge = Some(ctx.2.clone());
        d.parent = parent;
    }

    fn pci(
        &mut self,
        node: Node<'a, 'b>,
        ctx: &(Option<u32>, Option<String>, String),
        parent: Option<PciAddr>,
    ) -> Result<(), TopoError> {
        input::check_one_more_function(self.devices.len(), self.path)?;
        let line = self.line(node);
        let Some(busid) = node.attribute("busid") else {
            self.notes
                .push(format!("line {line}: <pci> without busid, skipped"));
            return Ok(());
        };
        let pci: PciAddr = busid
            .parse()
            .map_err(|e| xml::error(self.doc, node, self.path, format!("{e}")))?;
        let mut d = Device::new(pci);
        self.place(&mut d, ctx, parent);
        d.synthetic = pci.domain == 0xffff && pci.bus == 0xff;
        let hex = |name: &str| node.attribute(name).and_then(crate::sysfs::parse_hex);
        d.class = hex("class")
            .filter(|&c| c <= 0xff_ffff)
            .unwrap_or(names::UNKNOWN_CLASS);
        let id16 = |v: Option<u32>| {
            v.and_then(|v| u16::try_from(v).ok())
                .unwrap_or(names::UNKNOWN_ID)
        };
        d.vendor = id16(hex("vendor"));
        d.device = id16(hex("device"));
        d.link.max_gts = node.attribute("link_speed").and_then(parse_speed);
        d.link.max_width = node.attribute("link_width").and_then(parse_width);
        let mut gpu = false;
        for child in node.children().filter(|c| c.is_element()) {
            match child.tag_name().name() {
                "gpu" => {
                    gpu = true;
                    self.gpu_links(child, pci);
                }
                "nic" => self.nets(child, &mut d),
                _ => {}
            }
        }
        let has_rdma = !d.rdma.is_empty();
        d.kind = DeviceKind::decide(d.class, d.vendor, has_rdma, gpu || (d.class >> 8) == 0x0302);
        if d.kind == DeviceKind::Other && node.children().any(|c| c.has_tag_name("nic")) {
            d.kind = DeviceKind::Nic;
        }
        if d.synthetic {
            d.name = Some("NCCL virtual PCIe switch".into());
        }
        self.devices.push(d);
        self.lines_of.push(line);
        for child in node.children().filter(|c| c.has_tag_name("pci")) {
            self.pci(child, ctx, Some(pci))?;
        }
        Ok(())
    }

    fn gpu_links(&mut self, gpu: Node, pci: PciAddr) {
        for l in gpu.children().filter(|c| c.has_tag_name("nvlink")) {
            let line = self.line(l);
            let target = l
                .attribute("target")
                .and_then(|t| t.parse::<PciAddr>().ok());
            let count = l.attribute("count").and_then(|c| c.parse::<u32>().ok());
            let (Some(target), Some(count)) = (target, count) else {
                self.notes.push(format!(
                    "line {line}: <nvlink> without a valid target and count, ignored"
                ));
                continue;
            };
            if target == pci {
                self.self_nvlinks += 1;
                self.notes.push(format!(
                    "line {line}: <nvlink> of GPU {pci} targets the GPU itself, ignored"
                ));
                continue;
            }
            let switch = l
                .attribute("tclass")
                .is_some_and(|c| c.trim_start_matches("0x").starts_with("0680"));
            self.nvlinks.push((pci, target, count, switch));
        }
    }

    fn nets(&mut self, nic: Node, d: &mut Device) {
        for net in nic.children().filter(|c| c.has_tag_name("net")) {
            match net.attribute("gdr").map(str::trim) {
                Some("1") => d.nccl_gdr = Some(true),
                Some("0") => d.nccl_gdr = Some(d.nccl_gdr == Some(true)),
                _ => {}
            }
            if let Some(name) = net.attribute("name") {
                self.named_nets = true;
                if RDMA_PREFIXES.iter().any(|p| name.starts_with(p)) {
                    d.rdma.push(name.to_owned());
                } else {
                    d.netdevs.push(name.to_owned());
                }
            }
        }
    }

    fn bare_nic(
        &mut self,
        nic: Node<'a, 'b>,
        ctx: &(Option<u32>, Option<String>, String),
    ) -> Result<(), TopoError> {
        input::check_one_more_function(self.devices.len(), self.path)?;
        // 256 addresses a bus, on buses fe, fd, ... down; the matrix device limit comes first.
        let n = self.synthetic_nics;
        if n as usize >= input::MAX_MATRIX_DEVICES {
            return Err(TopoError::TooManyDevices {
                source_name: self.path.display().to_string(),
                what: "NICs without a PCI address",
                count: n as usize + 1,
                limit: input::MAX_MATRIX_DEVICES,
            });
        }
        self.synthetic_nics += 1;
        let pci = PciAddr {
            domain: 0xffff,
            bus: 0xfe - (n / 256) as u8,
            device: (n % 32) as u8,
            function: ((n / 32) % 8) as u8,
        };
        let mut d = Device::new(pci);
        self.place(&mut d, ctx, None);
        d.synthetic = true;
        d.kind = DeviceKind::Nic;
        self.nets(nic, &mut d);
        let names = d.interface_names().join(", ");
        d.name = Some(format!("NIC {names} (no PCI address in the file)"));
        self.notes.push(format!(
            "line {}: NIC {names} has no PCI address; placed under CPU {} as {pci}",
            self.line(nic),
            ctx.0.map_or_else(|| "?".to_owned(), |n| n.to_string())
        ));
        self.devices.push(d);
        self.lines_of.push(self.line(nic));
        Ok(())
    }
}
