//! The machine as the drawing shows it: NUMA nodes, their PCIe host bridges, the PCIe switches
//! where device paths branch, and the GPUs, NICs and NVMe controllers at the leaves.
//!
//! Only what leads to a GPU, NIC or NVMe is kept. A bridge is drawn as a switch when two or
//! more physical devices hang below it (a PCIe switch's upstream port, whose downstream ports
//! each lead somewhere, or NCCL's virtual switches); every other bridge (a root port, a
//! downstream port with one device, the functions of one card) is folded into the link of the
//! box below it and kept in that box's `chain`, so its address and link state still show.
//!
//! A device is drawn under its NUMA node ([`placement`]); every NUMA node with CPUs is drawn,
//! with devices or without (a source may list nodes whose devices are not GPUs, NICs or NVMe).

use gdpath_topo::{Device, DeviceKind, LinkClass, Machine, PciAddr};
use std::collections::BTreeMap;

/// A GPU, NIC or NVMe controller and the bridges folded into its link (nearest first).
#[derive(Debug, Clone)]
pub struct Leaf<'m> {
    /// The GPU, NIC or NVMe controller.
    pub dev: &'m Device,
    /// The bridges between it and its hub, folded into its link, nearest first.
    pub chain: Vec<&'m Device>,
}

impl<'m> Leaf<'m> {
    fn bare(dev: &'m Device) -> Leaf<'m> {
        Leaf {
            dev,
            chain: Vec::new(),
        }
    }
}

/// What a branching point is.
#[derive(Debug, Clone)]
pub enum HubKind<'m> {
    /// A PCIe host bridge (root complex), by the name the source gives it (`pci0000:00`, or
    /// NCCL's `cpu0`).
    HostBridge(String),
    /// A bridge below which several physical devices hang.
    Switch(&'m Device),
    /// Devices of a source without a PCI tree: where they attach is not known.
    NoTree,
}

/// A branching point and what hangs below it, each list in PCI order.
#[derive(Debug, Clone)]
pub struct Hub<'m> {
    /// What the hub is.
    pub kind: HubKind<'m>,
    /// Bridges folded into the link above this hub (nearest first).
    pub chain: Vec<&'m Device>,
    /// The hubs below this one, in PCI order.
    pub hubs: Vec<Hub<'m>>,
    /// The devices below this one, in PCI order.
    pub leaves: Vec<Leaf<'m>>,
}

impl Hub<'_> {
    /// The lowest PCI address below the hub (for ordering).
    fn first(&self) -> Option<PciAddr> {
        let own = self.leaves.iter().map(|l| l.dev.pci);
        own.chain(self.hubs.iter().filter_map(Hub::first)).min()
    }

    /// Every leaf below the hub, depth first.
    pub fn all_leaves(&self) -> Vec<&Leaf<'_>> {
        let mut v: Vec<&Leaf> = self.leaves.iter().collect();
        for h in &self.hubs {
            v.extend(h.all_leaves());
        }
        v
    }
}

/// A NUMA node (or the devices whose node is unknown) and its host bridges.
#[derive(Debug, Clone)]
pub struct Group<'m> {
    /// `None`: the source does not say, and the CPUs do not settle it.
    pub numa: Option<u32>,
    /// The node's cpulist, when known.
    pub cpus: Option<String>,
    /// The node's PCIe host bridges (or the no-tree hub), in PCI order.
    pub bridges: Vec<Hub<'m>>,
}

/// The drawn machine.
#[derive(Debug, Clone)]
pub struct Tree<'m> {
    /// The NUMA nodes, and a group for devices whose node is unknown.
    pub groups: Vec<Group<'m>>,
    /// PCI functions not drawn: neither GPU, NIC nor NVMe nor a bridge above one.
    pub undrawn: usize,
    /// Bridges above a drawn device (shown as switches or folded into a link).
    pub bridges: usize,
}

/// A trie node while building: a bridge (or a host bridge root) and what hangs below it.
#[derive(Default)]
struct Node<'m> {
    dev: Option<&'m Device>,
    children: BTreeMap<PciAddr, Node<'m>>,
    leaves: Vec<&'m Device>,
}

/// One thing below a bridge after folding: a hub, or a leaf.
enum Item<'m> {
    Hub(Hub<'m>),
    Leaf(Leaf<'m>),
}

impl Item<'_> {
    fn push_chain<'a>(items: &mut [Item<'a>], bridge: &'a Device) {
        for it in items {
            match it {
                Item::Hub(h) => h.chain.push(bridge),
                Item::Leaf(l) => l.chain.push(bridge),
            }
        }
    }
}

impl<'m> Node<'m> {
    fn insert(&mut self, path: &[&'m Device], leaf: &'m Device) {
        match path.split_first() {
            None => self.leaves.push(leaf),
            Some((b, rest)) => self
                .children
                .entry(b.pci)
                .or_insert_with(|| Node {
                    dev: Some(b),
                    ..Node::default()
                })
                .insert(rest, leaf),
        }
    }

    /// Physical devices directly below: each child bridge is one, leaves count once per
    /// (domain, bus, device) — the functions of one card are one device.
    fn branches(&self) -> usize {
        let mut cards: Vec<(u32, u8, u8)> = self
            .leaves
            .iter()
            .map(|d| (d.pci.domain, d.pci.bus, d.pci.device))
            .collect();
        cards.sort_unstable();
        cards.dedup();
        self.children.len() + cards.len()
    }

    fn items(self) -> Vec<Item<'m>> {
        let branches = self.branches();
        let mut items: Vec<Item<'m>> = self
            .leaves
            .into_iter()
            .map(|dev| Item::Leaf(Leaf::bare(dev)))
            .collect();
        for child in self.children.into_values() {
            items.extend(child.items());
        }
        match self.dev {
            Some(bridge) if branches >= 2 => vec![Item::Hub(hub(HubKind::Switch(bridge), items))],
            Some(bridge) => {
                Item::push_chain(&mut items, bridge);
                items
            }
            None => items,
        }
    }
}

fn hub<'m>(kind: HubKind<'m>, items: Vec<Item<'m>>) -> Hub<'m> {
    let mut h = Hub {
        kind,
        chain: Vec::new(),
        hubs: Vec::new(),
        leaves: Vec::new(),
    };
    for it in items {
        match it {
            Item::Hub(x) => h.hubs.push(x),
            Item::Leaf(l) => h.leaves.push(l),
        }
    }
    h.leaves.sort_by_key(|l| l.dev.pci);
    h.hubs.sort_by_key(Hub::first);
    h
}

/// True for the devices the drawing shows as boxes.
pub fn drawn(d: &Device) -> bool {
    matches!(d.kind, DeviceKind::Gpu | DeviceKind::Nic | DeviceKind::Nvme)
}

impl<'m> Tree<'m> {
    /// The drawn tree of `m` (see the module docs).
    pub fn of(m: &'m Machine) -> Tree<'m> {
        // Host bridge name (None: no tree) -> trie.
        let mut roots: BTreeMap<Option<&str>, Node<'m>> = BTreeMap::new();
        let mut above: Vec<PciAddr> = Vec::new();
        let mut no_tree: BTreeMap<Option<u32>, Vec<&'m Device>> = BTreeMap::new();
        for d in m.devices.iter().filter(|d| drawn(d)) {
            match d.host_bridge.as_deref().filter(|_| m.tree_known) {
                Some(hb) => {
                    let mut up = m.ancestors(d);
                    above.extend(up.iter().map(|b| b.pci));
                    up.reverse();
                    roots.entry(Some(hb)).or_default().insert(&up, d);
                }
                None => no_tree
                    .entry(placement(m, d).map(|p| p.numa))
                    .or_default()
                    .push(d),
            }
        }
        above.sort_unstable();
        above.dedup();
        let mut groups: BTreeMap<Option<u32>, Vec<Hub<'m>>> = BTreeMap::new();
        for (name, node) in roots {
            let h = hub(
                HubKind::HostBridge(name.unwrap_or("?").to_owned()),
                node.items(),
            );
            groups.entry(group_numa(m, &h)).or_default().push(h);
        }
        for (numa, devs) in no_tree {
            let items = devs
                .into_iter()
                .map(|dev| Item::Leaf(Leaf::bare(dev)))
                .collect();
            groups
                .entry(numa)
                .or_default()
                .push(hub(HubKind::NoTree, items));
        }
        for n in drawn_nodes(m) {
            groups.entry(Some(n)).or_default();
        }
        // Known nodes in order, the unknown node last.
        let mut ordered: Vec<(Option<u32>, Vec<Hub<'m>>)> = groups.into_iter().collect();
        ordered.sort_by_key(|(n, _)| (n.is_none(), *n));
        let groups = ordered
            .into_iter()
            .map(|(numa, mut bridges)| {
                bridges.sort_by_key(Hub::first);
                Group {
                    numa,
                    cpus: numa.and_then(|n| {
                        m.numa_nodes
                            .iter()
                            .find(|x| x.id == n)
                            .map(|x| x.cpus.clone())
                            .filter(|c| !c.is_empty())
                    }),
                    bridges,
                }
            })
            .collect();
        let shown = m.devices.iter().filter(|d| drawn(d)).count();
        Tree {
            groups,
            undrawn: m.devices.len().saturating_sub(shown + above.len()),
            bridges: above.len(),
        }
    }
}

/// The NUMA nodes drawn even without devices: those with CPUs, or every node the source lists
/// when it gives no node's CPUs (NCCL's `<cpu numaid>` without `affinity`); memory-only nodes
/// (GPU memory exposed as a node) are left out.
fn drawn_nodes(m: &Machine) -> Vec<u32> {
    let with_cpus: Vec<u32> = m
        .numa_nodes
        .iter()
        .filter(|n| !n.cpus.is_empty())
        .map(|n| n.id)
        .collect();
    if with_cpus.is_empty() {
        m.numa_nodes.iter().map(|n| n.id).collect()
    } else {
        with_cpus
    }
}

/// Where a device is drawn: its NUMA node, and the GPU it was placed by when the source does
/// not give the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// The NUMA node the device is drawn in.
    pub numa: u32,
    /// The GPU whose node it shares and their stated class (`GPU0`, PIX), when placed by it.
    pub by: Option<(String, LinkClass)>,
}

/// The NUMA node of `d`: [`Machine::numa_of`], else — for a NIC or NVMe of a source that states
/// the pair classes (`nvidia-smi topo -m` gives only the GPUs' NUMA affinity) — the node of the
/// GPU it is closest to, when that class says they share a node (PIX, PXB, PHB or NODE; the
/// first such GPU in PCI order on a tie). `None` when neither settles it.
pub fn placement(m: &Machine, d: &Device) -> Option<Placement> {
    if let Some(numa) = m.numa_of(d) {
        return Some(Placement { numa, by: None });
    }
    if d.kind == DeviceKind::Gpu || m.stated_pcie.is_none() {
        return None;
    }
    let (class, gpu, numa) = m
        .gpus()
        .filter_map(|g| Some((m.pcie_class(d, g), g, m.numa_of(g)?)))
        .filter(|(c, _, _)| {
            matches!(
                c,
                LinkClass::Pix | LinkClass::Pxb | LinkClass::Phb | LinkClass::Node
            )
        })
        .min_by_key(|(c, g, _)| (*c, g.pci))?;
    Some(Placement {
        numa,
        by: Some((gpu.id.clone(), class)),
    })
}

/// The NUMA node a host bridge is drawn under: the most common node of its devices
/// ([`placement`]), the lower on a tie; `None` when no device's node is known.
fn group_numa(m: &Machine, h: &Hub) -> Option<u32> {
    let mut count: BTreeMap<u32, usize> = BTreeMap::new();
    for l in h.all_leaves() {
        if let Some(n) = placement(m, l.dev).map(|p| p.numa) {
            *count.entry(n).or_default() += 1;
        }
    }
    let best = count.values().copied().max()?;
    count.into_iter().find(|(_, c)| *c == best).map(|(n, _)| n)
}
