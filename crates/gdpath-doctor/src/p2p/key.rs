//! What the P2P verdicts of a GPU pair depend on ([`PairKey`]), and the plan that works them out
//! once per distinct key instead of once per pair ([`Plan`]).
//!
//! A pair's verdicts depend on its class (PCIe class and NVLink), the ACS state of the bridges
//! between the two GPUs, the two GPUs' IOMMU group types, whether `CUDA_VISIBLE_DEVICES` hides
//! them, and the driver's facts for the pair. GPUs with the same [`TreeKey`] (parent bridge,
//! host bridge, NUMA node), IOMMU group type and visibility are interchangeable for all but the
//! last two, so the plan classifies one pair per pair of such GPU groups; only the pairs the
//! machine lists NVLink for, or the driver has facts for, are keyed one by one. The work is
//! O(GPUs + groups² + NVLink bonds + driver pairs), not O(GPUs²), whatever the machine's size.

use crate::subjects::PairBlock;
use crate::DoctorInput;
use gdpath_topo::facts::{DriverFacts, GpuFacts, GpuPairFacts, P2pCap};
use gdpath_topo::{bridges_at, AcsState, Device, Machine, NvLinkState, PairClass, PciAddr};
use gdpath_topo::{Place, TreeKey};
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// A GPU's IOMMU group as the P2P check sees it (when the IOMMU is on).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum IommuOf {
    /// Not in an IOMMU group (or the IOMMU is off or unknown: the rule looks at the machine).
    NoGroup,
    /// In a group of this default domain type (`identity`, `DMA`, `DMA-FQ`), `None` unreadable.
    Typed(Option<String>),
}

impl IommuOf {
    /// The type in words: `DMA`, `unknown type`, `no IOMMU group`.
    pub(crate) fn text(&self) -> &str {
        match self {
            IommuOf::NoGroup => "no IOMMU group",
            IommuOf::Typed(Some(t)) => t,
            IommuOf::Typed(None) => "unknown type",
        }
    }

    /// True for the translated domain types `DMA` and `DMA-FQ`.
    pub(crate) fn translated(&self) -> bool {
        matches!(self, IommuOf::Typed(Some(t)) if t.starts_with("DMA"))
    }
}

/// Bridges of one kind on a path: their addresses where listed (machines small enough to keep
/// each pair's own evidence), else only whether there are any.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub(crate) struct Bridges {
    pub(crate) any: bool,
    pub(crate) listed: Vec<PciAddr>,
}

impl Bridges {
    fn add(&mut self, pci: PciAddr, list: bool) {
        self.any = true;
        if list {
            self.listed.push(pci);
        }
    }

    /// The addresses, each through `each`, or "the bridges between each pair" when not listed.
    pub(crate) fn text(&self, each: impl Fn(&PciAddr) -> String) -> String {
        if self.listed.is_empty() {
            "the bridges between each pair".to_owned()
        } else {
            self.listed.iter().map(each).collect::<Vec<_>>().join(", ")
        }
    }
}

/// The ACS state between two devices, as the `p2p.acs-enabled` rule reads it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Acs {
    /// Joined by NVLink: P2P crosses no PCIe bridge.
    NvLink,
    /// The source has no PCI tree.
    TreeUnknown,
    /// No bridge between the two (both on this root bus).
    NoBridge(Option<String>),
    /// The source does not describe ACS at all ([`gdpath_topo::Coverage::acs`] unknown): the
    /// bridges between the two.
    NotInSource(Bridges),
    /// The bridges between the two, by what their ACS says.
    Bridges {
        redirect: Bridges,
        unknown: Bridges,
        clean: Bridges,
    },
}

/// The ACS state on the path between two placed devices; `nvlink` when they are joined by
/// NVLink (P2P then crosses no bridge); `list` to name the bridges (else only their kinds are
/// kept, so that many pairs share one state).
pub(crate) fn acs_of(m: &Machine, a: &Place, b: &Place, nvlink: bool, list: bool) -> Acs {
    if nvlink {
        return Acs::NvLink;
    }
    if !m.tree_known {
        return Acs::TreeUnknown;
    }
    let bridges = bridges_at(a, b);
    if bridges.is_empty() {
        return Acs::NoBridge(a.device().host_bridge.clone());
    }
    if m.coverage.acs.is_unknown() {
        let mut all = Bridges::default();
        for br in bridges {
            all.add(br.pci, list);
        }
        return Acs::NotInSource(all);
    }
    let (mut redirect, mut unknown, mut clean) =
        (Bridges::default(), Bridges::default(), Bridges::default());
    for br in bridges {
        match br.acs {
            Some(st) if st.redirects_p2p() => redirect.add(br.pci, list),
            Some(_) => clean.add(br.pci, list),
            None => unknown.add(br.pci, list),
        }
    }
    Acs::Bridges {
        redirect,
        unknown,
        clean,
    }
}

/// The ACS control bits of a bridge in words (`RR CR`), for the evidence.
pub(crate) fn acs_control(m: &Machine, pci: &PciAddr) -> String {
    match m.device(pci).and_then(|d| d.acs) {
        Some(AcsState::Present { control, .. }) => control.names().join(" "),
        _ => "?".to_owned(),
    }
}

/// What the driver says about one direction of a pair: NVML's P2P status (read, write,
/// nvlink, atomics, pci) and CUDA's peer attributes (access, native atomics, performance rank).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Direction {
    pub(crate) nvml: Option<[P2pCap; 5]>,
    pub(crate) cuda: Option<(bool, bool, i32)>,
}

impl Direction {
    fn of(p: &GpuPairFacts) -> Direction {
        Direction {
            nvml: p
                .nvml
                .map(|n| [n.read, n.write, n.nvlink, n.atomics, n.pci]),
            cuda: p
                .cuda
                .map(|c| (c.access_supported, c.native_atomics, c.performance_rank)),
        }
    }
}

/// Everything the P2P verdicts of a GPU pair depend on. Pairs with equal keys get the same
/// findings, but for their subject.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct PairKey {
    pub(crate) class: PairClass,
    pub(crate) acs: Acs,
    /// The two GPUs' IOMMU groups, in order.
    pub(crate) iommu: [IommuOf; 2],
    /// How many of the two GPUs `CUDA_VISIBLE_DEVICES` hides (0–2).
    pub(crate) hidden: u8,
    /// The driver's facts for the pair: the direction from the lower GPU first, then the other,
    /// each where known; empty without driver facts.
    pub(crate) driver: Vec<Direction>,
}

/// One GPU as the plan sees it.
struct Gpu<'m> {
    dev: &'m Device,
    place: Place<'m>,
    iommu: IommuOf,
    hidden: bool,
}

/// The GPUs' ordinals as CUDA numbers them: the driver's where known, else PCI order (what
/// `CUDA_DEVICE_ORDER=PCI_BUS_ID` gives).
pub(crate) fn ordinals(gpus: &[&Device], facts: Option<&DriverFacts>) -> Vec<u32> {
    let by_pci: HashMap<String, u32> = facts
        .map(|f| {
            f.gpus
                .iter()
                .map(|g| (g.pci.to_ascii_lowercase(), g.ordinal))
                .collect()
        })
        .unwrap_or_default();
    gpus.iter()
        .enumerate()
        .map(|(i, g)| by_pci.get(&g.pci.to_string()).copied().unwrap_or(i as u32))
        .collect()
}

/// The driver facts of a machine GPU, matched by PCI address.
pub(crate) fn gpu_facts<'f>(facts: Option<&'f DriverFacts>, d: &Device) -> Option<&'f GpuFacts> {
    facts?.gpu_by_pci(&d.pci.to_string())
}

/// The keys of every GPU pair, each key once, and which pairs have which key.
pub(crate) struct Plan {
    /// The distinct keys, in the order of their first pair.
    pub(crate) keys: Vec<PairKey>,
    /// Per key, its pairs as blocks (for machines too large to list them).
    pub(crate) blocks: Vec<Vec<PairBlock>>,
    /// Per key, how many pairs of its blocks have another key (listed apart).
    pub(crate) apart: Vec<usize>,
    /// The groups of interchangeable GPUs (indices in PCI order), by first member.
    pub(crate) members: Vec<Vec<usize>>,
    /// Each GPU's group.
    group_of: Vec<usize>,
    /// Per pair of groups (p ≤ q, at [`Plan::slot`]), its key.
    base: Vec<u32>,
    /// Pairs keyed one by one (NVLink listed, driver facts): (lower GPU, higher) → key.
    single: BTreeMap<(usize, usize), usize>,
}

impl Plan {
    /// Keys every pair of `gpus` (the machine's GPUs in PCI order); `hidden` says which
    /// `CUDA_VISIBLE_DEVICES` hides; `list` keeps each pair's bridges in its key (for
    /// machines whose pairs are reported one by one).
    pub(crate) fn new(input: &DoctorInput, gpus: &[&Device], hidden: &[bool], list: bool) -> Plan {
        let m = input.machine;
        let facts = input.driver.got();
        let iommu_on = m.iommu.enabled() == Some(true);
        let all: Vec<Gpu> = gpus
            .iter()
            .zip(hidden)
            .map(|(d, &hidden)| Gpu {
                dev: d,
                place: m.place(d),
                iommu: match d.iommu_group {
                    Some(g) if iommu_on => IommuOf::Typed(m.iommu.group_type(g).map(str::to_owned)),
                    _ => IommuOf::NoGroup,
                },
                hidden,
            })
            .collect();
        // Groups of interchangeable GPUs; without a tree key (stated classes) each GPU alone.
        // A product without NVLink is grouped apart: its pairs' NVLink is known (none).
        type Group = (Option<TreeKey>, usize, IommuOf, bool, bool);
        let mut groups: HashMap<Group, usize> = HashMap::new();
        let mut members: Vec<Vec<usize>> = Vec::new();
        let mut group_of = Vec::with_capacity(all.len());
        for (i, g) in all.iter().enumerate() {
            let tree = m.tree_key(&g.place);
            let alone = if tree.is_some() { 0 } else { i };
            let k = (
                tree,
                alone,
                g.iommu.clone(),
                g.hidden,
                g.dev.pcie_only().is_some(),
            );
            let next = members.len();
            let gi = *groups.entry(k).or_insert(next);
            if gi == next {
                members.push(Vec::new());
            }
            members[gi].push(i);
            group_of.push(gi);
        }
        let k = members.len();
        let mut plan = Plan {
            keys: Vec::new(),
            blocks: Vec::new(),
            apart: Vec::new(),
            members,
            group_of,
            base: vec![0; k * (k + 1) / 2],
            single: BTreeMap::new(),
        };
        let mut index: HashMap<PairKey, usize> = HashMap::new();
        let mut intern = |plan: &mut Plan, key: PairKey| -> usize {
            *index.entry(key).or_insert_with_key(|k| {
                plan.keys.push(k.clone());
                plan.blocks.push(Vec::new());
                plan.apart.push(0);
                plan.keys.len() - 1
            })
        };
        for p in 0..k {
            for q in p..k {
                let (a, b, block) = if p == q {
                    if plan.members[p].len() < 2 {
                        continue;
                    }
                    (plan.members[p][0], plan.members[p][1], PairBlock::Within(p))
                } else {
                    (
                        plan.members[p][0],
                        plan.members[q][0],
                        PairBlock::Between(p, q),
                    )
                };
                let unlisted = m.unlisted_nvlink(all[a].dev, all[b].dev);
                let key = pair_key(m, &all[a], &all[b], unlisted, Vec::new(), list);
                let i = intern(&mut plan, key);
                let slot = plan.slot(p, q);
                plan.base[slot] = i as u32;
                plan.blocks[i].push(block);
            }
        }
        // Pairs with NVLink listed or driver facts of their own.
        let by_pci: HashMap<PciAddr, usize> =
            gpus.iter().enumerate().map(|(i, d)| (d.pci, i)).collect();
        let mut singles: BTreeSet<(usize, usize)> = BTreeSet::new();
        let ordered = |x: usize, y: usize| if x < y { (x, y) } else { (y, x) };
        for bond in &m.nvlinks {
            if let (Some(&x), Some(&y)) = (by_pci.get(&bond.a), by_pci.get(&bond.b)) {
                if x != y {
                    singles.insert(ordered(x, y));
                }
            }
        }
        let mut pair_facts: HashMap<(usize, usize), Vec<&GpuPairFacts>> = HashMap::new();
        if let Some(f) = facts {
            let by_ordinal: HashMap<u32, usize> = f
                .gpus
                .iter()
                .filter_map(|g| {
                    let pci: PciAddr = g.pci.parse().ok()?;
                    Some((g.ordinal, *by_pci.get(&pci)?))
                })
                .collect();
            for p in &f.pairs {
                if let (Some(&x), Some(&y)) = (by_ordinal.get(&p.a), by_ordinal.get(&p.b)) {
                    if x != y {
                        singles.insert(ordered(x, y));
                        pair_facts.entry((x, y)).or_default().push(p);
                    }
                }
            }
        }
        for (x, y) in singles {
            let nv = m.nvlink_state(all[x].dev, all[y].dev);
            let driver: Vec<Direction> = [(x, y), (y, x)]
                .iter()
                .filter_map(|k| pair_facts.get(k))
                .flat_map(|v| v.iter().map(|p| Direction::of(p)))
                .collect();
            let key = pair_key(m, &all[x], &all[y], nv, driver, list);
            let k = intern(&mut plan, key);
            let base = plan.base_key(x, y);
            if base != k {
                plan.apart[base] += 1;
                plan.blocks[k].push(PairBlock::Pair(x, y));
                plan.single.insert((x, y), k);
            }
        }
        plan
    }

    /// Where the key of groups `p` ≤ `q` is kept in `base`: row-major upper triangle.
    fn slot(&self, p: usize, q: usize) -> usize {
        let k = self.members.len();
        p * k - p * p.saturating_sub(1) / 2 + (q - p)
    }

    /// The key of the pair of groups of GPUs `x` and `y`.
    fn base_key(&self, x: usize, y: usize) -> usize {
        let (p, q) = (self.group_of[x], self.group_of[y]);
        let (p, q) = if p <= q { (p, q) } else { (q, p) };
        self.base[self.slot(p, q)] as usize
    }

    /// The key of the pair of GPUs `x` < `y` (indices in PCI order).
    pub(crate) fn key_of(&self, x: usize, y: usize) -> usize {
        self.single
            .get(&(x, y))
            .copied()
            .unwrap_or_else(|| self.base_key(x, y))
    }
}

fn pair_key(
    m: &Machine,
    a: &Gpu,
    b: &Gpu,
    nvlink: NvLinkState,
    driver: Vec<Direction>,
    list: bool,
) -> PairKey {
    let pcie = m.pair_at(&a.place, &b.place).pcie;
    let class = PairClass { pcie, nvlink };
    let linked = matches!(nvlink, NvLinkState::Links(_));
    let mut iommu = [a.iommu.clone(), b.iommu.clone()];
    iommu.sort();
    PairKey {
        class,
        acs: acs_of(m, &a.place, &b.place, linked, list),
        iommu,
        hidden: u8::from(a.hidden) + u8::from(b.hidden),
        driver,
    }
}
